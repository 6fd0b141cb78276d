"""Directional steering (engine/steering.py, the model's projection, Session.steering): the
engine's steered outputs equal the formula computed with NumPy on the captured sublayer
outputs, for attn, ffn and both, positive and negative scales, in prefill and in decode; no
steering and zero scales give today's bits; ds4's raw float32 files load and bad ones are one
line; sessions steered differently decode together with each one's own bits."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.steering import Steering, SteeringError, load_steering

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        yield e


def _directions(engine, seed: int = 0) -> np.ndarray:
    c = engine.info.config
    v = np.random.default_rng(seed).standard_normal((c.n_layer, c.n_embd)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("attn,ffn", [(0.0, 1.0), (0.7, 0.0), (1.0, -2.0), (-0.5, 0.5)])
@pytest.mark.parametrize("chunk", [64, 1])  # one prefill pass; token by token (decode steps)
def test_the_projection_is_the_formula(engine, attn: float, ffn: float, chunk: int) -> None:
    V = _directions(engine)
    s = engine.session()
    s.drafter = None
    s.prefill_chunk = chunk
    s.set_steering(Steering(V, attn=attn, ffn=ffn, name="test"))
    got = s.activations(list(range(4000, 4030)))
    for which, scale in (("attn", attn), ("ffn", ffn)):
        if scale == 0.0:
            assert which + "_raw" not in got  # not steered: nothing was projected
            continue
        raw, out = got[which + "_raw"].astype(np.float64), got[which].astype(np.float64)
        for layer in range(V.shape[0]):
            v = V[layer].astype(np.float64)
            want = raw[layer] - scale * np.outer(raw[layer] @ v, v)
            assert np.abs(out[layer] - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), (which, layer)
        assert np.abs(out - raw).max() > 1e-3  # it did something


def test_no_steering_and_zero_scales_change_no_bit(engine) -> None:
    ids = list(range(5000, 5040))
    outs = []
    for steering in (None, Steering(_directions(engine), attn=0.0, ffn=0.0)):
        s = engine.session()
        s.drafter = None
        s.set_steering(steering)
        s.sync(ids)
        outs.append((s.logits.copy(), [st.token for st in s.generate(GREEDY, max_tokens=6, stop_at_eos=False)],
                     s.snapshot()))
    assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][1:] == outs[1][1:]
    s = engine.session()
    s.drafter = None
    s.set_steering(Steering(_directions(engine), ffn=1.0))
    s.sync(ids)
    assert not np.array_equal(s.logits, outs[0][0])  # a scale in force changes the logits


def test_ds4_files_load_and_bad_ones_are_one_line(engine, tmp_path) -> None:
    c = engine.info.config
    V = _directions(engine, 3)
    path = tmp_path / "verbosity.f32"
    V.astype("<f4").tofile(path)  # ds4's format: raw little-endian float32, no header
    st = load_steering(path, c.n_layer, c.n_embd)
    assert np.array_equal(st.directions, V) and st.ffn == 1.0 and st.attn == 0.0 and st.name == "verbosity"
    (tmp_path / "verbosity.f32.json").write_text('{"name": "concise", "good": "short answers"}')
    assert load_steering(path, c.n_layer, c.n_embd, attn=0.5).describe() == "concise ffn 1 attn 0.5"
    with pytest.raises(SteeringError, match=r"6144 bytes, but this model needs 7 layers x 256 float32"):
        load_steering(path, c.n_layer + 1, c.n_embd)
    bad = V.copy()
    bad[2, 7] = np.nan
    bad.astype("<f4").tofile(tmp_path / "nan.f32")
    with pytest.raises(SteeringError, match="layer 2 holds a NaN"):
        load_steering(tmp_path / "nan.f32", c.n_layer, c.n_embd)
    with pytest.raises(SteeringError, match="no such|No such"):
        load_steering(tmp_path / "absent.f32", c.n_layer, c.n_embd)
    with pytest.raises(SteeringError, match="must be a number"):
        st.scaled(ffn=float("inf"))


def test_sessions_steered_differently_decode_together_with_their_own_bits(engine) -> None:
    from ds4agent.engine import Session

    prompts = [list(range(6000, 6020)), list(range(7000, 7025)), list(range(8000, 8015))]
    steers = [Steering(_directions(engine, 1), ffn=1.0), None, Steering(_directions(engine, 2), attn=0.5, ffn=-1)]

    def fresh():
        out = []
        for p, st in zip(prompts, steers):
            s = engine.session()
            s.drafter = None
            s.set_steering(st)
            s.sync(p)
            out.append(s)
        return out

    alone = fresh()
    for s in alone:
        for t in (11, 12, 13):
            s.eval(t)
    together = fresh()
    for t in (11, 12, 13):
        Session.advance_together(together, [t, t, t])
    for a, b in zip(alone, together):
        assert np.array_equal(a.logits, b.logits) and a.snapshot() == b.snapshot()


def test_steer_build_points_along_the_mean_difference(demo_path, tmp_path, capsys) -> None:
    """ds4 steer build on the demo model: unit vectors per layer along mean(bad) - mean(good) of
    the captured last-row outputs, computed here again from the same prompts; the file loads
    back as a steering file, its sidecar names it."""
    from ds4agent.cli import main
    from ds4agent.protocol import render

    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("# short\nAnswer briefly: what is two plus two?\nOne word: the colour of snow.\n")
    bad.write_text("Explain at great length what two plus two is.\n\nDescribe in depth the colour of snow.\n")
    out = tmp_path / "verbosity.f32"
    assert main(["steer", "build", "-m", str(demo_path), "--good", str(good), "--bad", str(bad), "--out", str(out),
                 "--kernels", "cpu-exact"]) == 0
    assert "wrote" in capsys.readouterr().out
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        c = e.info.config
        st = load_steering(out, c.n_layer, c.n_embd)
        assert st.name == "verbosity" and np.allclose(np.linalg.norm(st.directions, axis=1), 1.0, atol=1e-5)
        s = e.session()

        def last(lines: list[str]) -> np.ndarray:
            ids = [e.tokenizer.encode_rendered(render([{"role": "user", "content": t}], thinking_mode="chat"))
                   for t in lines]
            return np.mean([s.activations(x)["ffn"][:, -1, :].astype(np.float64) for x in ids], axis=0)

        d = last(["Explain at great length what two plus two is.", "Describe in depth the colour of snow."]) - \
            last(["Answer briefly: what is two plus two?", "One word: the colour of snow."])
        want = d / np.linalg.norm(d, axis=1, keepdims=True)
        assert np.abs(st.directions - want).max() < 1e-4
    meta = __import__("json").loads((tmp_path / "verbosity.f32.json").read_text())
    assert meta["component"] == "ffn" and meta["prompts"] == {"good": 2, "bad": 2} and meta["layers"] == c.n_layer


def test_steer_in_the_chat_changes_the_next_answer_and_the_status_line(demo_path, tmp_path) -> None:
    import io

    from ds4agent.conversation.turns import Conversation
    from ds4agent.sessions import SessionStore
    from ds4agent.ui.chat import run_pipe, status_text

    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        _directions(e, 4).astype("<f4").tofile(tmp_path / "dir.f32")
        plain = Conversation(e, mode="chat", sampling=GREEDY, max_tokens=8)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(plain, SessionStore(tmp_path / "s"), io.StringIO("/steer 1\nHello there\n"), out, err)
        assert "no steering directions: start with --dir-steering-file" in err.getvalue()
        first = plain.messages[-1]["content"]
        e.set_steering(tmp_path / "dir.f32", ffn=0.0)  # loaded, off: as the flags with --dir-steering-ffn 0
        conv = Conversation(e, mode="chat", sampling=GREEDY, max_tokens=8)
        assert "steer" not in status_text(conv)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(conv, SessionStore(tmp_path / "s"), io.StringIO("Hello there\n/steer 3\n/steer attn -1\n"), out, err)
        assert conv.messages[-1]["content"] == first  # scale 0: today's answer
        assert "steering: dir ffn 3 attn -1" in err.getvalue() + out.getvalue()
        assert "steer dir ffn 3 attn -1" in status_text(conv)
        conv.reset()
        run_pipe(conv, SessionStore(tmp_path / "s"), io.StringIO("Hello there\n/steer off\n/steer x y z\n"), out, err)
        assert conv.messages[-1]["content"] != first  # steered: another answer
        assert "usage: /steer S" in err.getvalue() and "steer" not in status_text(conv)


def test_the_flags(demo_path, tmp_path, capsys) -> None:
    from ds4agent.cli import main

    base = ["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0"]
    assert main(base + ["--dir-steering-ffn", "2"]) == 2
    assert "scale a --dir-steering-file" in capsys.readouterr().err
    (tmp_path / "short.f32").write_bytes(b"\0" * 12)
    assert main(base + ["--dir-steering-file", str(tmp_path / "short.f32")]) == 2
    assert "12 bytes, but this model needs" in capsys.readouterr().err
    with Engine.open(demo_path, backend="cpu", ctx=64) as e:
        _directions(e).astype("<f4").tofile(tmp_path / "ok.f32")
    assert main(base + ["--dir-steering-file", str(tmp_path / "ok.f32"), "--dir-steering-attn", "0.5"]) == 0
    assert main(base + ["--dump-activations", str(tmp_path / "a.npz")]) == 0
    with np.load(tmp_path / "a.npz") as d:
        assert d["attn"].shape[:2] == (6, len(d["tokens"])) and d["hidden"].shape[2] == 4


def test_the_server_steers_per_request(demo_path, tmp_path) -> None:
    """The server's own steering (the start flags) for requests that say nothing; a request's
    dir_steering scales (or "off") for that request only, with the KV cache kept apart; scales
    asked of a server without a steering file are a 400."""
    import openai

    from ds4agent.server import ServerOptions
    from ds4agent.server.requests import Defaults
    from ds4agent.server.run import ServerThread
    from ds4agent.sessions import SessionStore

    # (a system text: the server caches a request's start up to its first user turn, and a
    # request under other steering must not start from that KV)
    msgs = [{"role": "system", "content": "You are a patient guide to oceans, rivers and lakes. " * 6},
            {"role": "user", "content": "Tell me about the sea."}]

    def ask(st, extra=None) -> str:
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=120)
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0, extra_body=extra)
        return (r.choices[0].message.reasoning_content or "") + r.choices[0].message.content

    opts = ServerOptions(Defaults(max_tokens=12), store=SessionStore(tmp_path / "kv"), min_save_tokens=1)
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        with ServerThread(e, opts) as st:
            plain = ask(st)
            with pytest.raises(openai.BadRequestError, match="without a steering file"):
                ask(st, {"dir_steering": {"ffn": 1}})
        _directions(e, 5).astype("<f4").tofile(tmp_path / "d.f32")
        e.set_steering(tmp_path / "d.f32", ffn=2.0)
        with ServerThread(e, opts) as st:
            assert st.worker.store.dir.name == f"steered-{e.steering.digest}-ffn2-attn0"  # not the unsteered cache
            steered = ask(st)
            assert steered != plain
            assert ask(st, {"dir_steering": {"ffn": 0}}) == plain  # its own KV: not the steered cache's
            assert ask(st, {"dir_steering": "off"}) == plain
            assert ask(st) == steered  # and back: the server's steering, its cache intact
            with pytest.raises(openai.BadRequestError, match="dir_steering must be"):
                ask(st, {"dir_steering": {"mlp": 1}})


def test_saved_sessions_record_their_steering(demo_path, tmp_path) -> None:
    """The steering in force is kept with a saved session: /list shows it, and resuming it under
    other steering says so (the KV keeps what it was computed with)."""
    import io

    from ds4agent.conversation.turns import Conversation
    from ds4agent.sessions import SessionStore
    from ds4agent.ui.chat import run_pipe

    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        _directions(e, 6).astype("<f4").tofile(tmp_path / "calm.f32")
        e.set_steering(tmp_path / "calm.f32", ffn=1.5)
        store = SessionStore(tmp_path / "s")
        conv = Conversation(e, mode="chat", sampling=GREEDY, max_tokens=4)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(conv, store, io.StringIO("Hello\n/save\n/list\n"), out, err)
        assert "[steered: calm ffn 1.5 attn 0]" in out.getvalue()
        (info,) = store.list()
        assert info.steering == {"name": "calm", "digest": e.steering.digest, "ffn": 1.5, "attn": 0.0}
        other = Conversation(e, mode="chat", sampling=GREEDY, max_tokens=4)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(other, store, io.StringIO(f"/switch {info.sha[:8]}\n/steer 0.5\n"), out, err)
        assert "this session was saved under" not in err.getvalue() + out.getvalue()  # the same steering
        run_pipe(other, store, io.StringIO("/save\n"), out, err)
        fresh = Conversation(e, mode="chat", sampling=GREEDY, max_tokens=4)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(fresh, store, io.StringIO(f"/switch {info.sha[:8]}\n"), out, err)
        said = err.getvalue() + out.getvalue()
        assert "this session was saved under calm ffn 0.5 attn 0; it goes on under calm ffn 1.5 attn 0" in said
