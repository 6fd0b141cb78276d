"""MTP drafting (modelfile/mtpfile.py, engine/mtp.py, engine/drafts.py MtpDrafter): the MTP
file's layout is checked against the target; the block runs a batch of pairs as it runs them
one by one; the drafter's incremental KV (pairs run as the session commits, drafts chained on
a copy, streams past the window dropped, a restart when the session's tokens change) proposes
what a block started afresh on the same window proposes; and with the block drafting, the
output and the saved session are plain decoding's, across prefill chunks, a window, an
interruption and a restore."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import Engine, EngineError, SamplingParams
from ds4agent.engine.drafts import MtpDrafter, Pace, drafter
from ds4agent.engine.mtp import MtpBlock
from ds4agent.modelfile import demo
from ds4agent.modelfile.gguf import GGUFFile
from ds4agent.modelfile.mtpfile import PREFIX, check_mtp, mtp_tensors

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / "demo-mtp.gguf"
    return demo.write_mtp(path, demo.tiny_config())


@pytest.fixture(scope="module")
def engine(demo_path, mtp_path):
    with Engine.open(demo_path, backend="cpu", ctx=1024, kernels="cpu-exact") as e:
        e.set_speculation("mtp", mtp=mtp_path)
        yield e


def _plain(engine, prompt: list[int], n: int, params: SamplingParams = GREEDY, chunk: int = 256,
           ) -> tuple[list[int], bytes]:
    s = engine.session()
    s.drafter = None
    s.prefill_chunk = chunk  # (chunks of another width give other bits with the 8-bit kernels)
    s.sync(prompt)
    toks = [st.token for st in s.generate(params, max_tokens=n, stop_at_eos=False)]
    return toks, s.snapshot()


def test_the_mtp_file_is_checked_against_the_model(demo_path, mtp_path, tmp_path) -> None:
    c = demo.tiny_config()
    with GGUFFile(mtp_path) as f:
        assert check_mtp(f, c) == []
        assert set(f.tensors) == set(mtp_tensors(c))
        assert f.tensors[PREFIX + "ffn_gate_exps.weight"].type_name == "Q4_K"  # the published file's experts
    # An MTP file for another model: every shape differs, said with the file's name.
    other = demo.write_mtp(tmp_path / "wide.gguf", demo.shape_config(1, n_expert=8))
    with Engine.open(demo_path, backend="cpu", ctx=64) as e:
        with pytest.raises(EngineError, match=r"wide.gguf: not an MTP block for this model: .*dims"):
            e.set_speculation("mtp", mtp=other)
        with pytest.raises(EngineError, match="missing tensor mtp.0"):
            e.set_speculation("mtp", mtp=demo_path)  # the target itself is not an MTP file
        with pytest.raises(EngineError, match="no such file"):
            e.set_speculation("mtp", mtp=tmp_path / "absent.gguf")
        with pytest.raises(EngineError, match="--mtp FILE"):
            e.set_speculation("mtp")
        assert e.session().drafter is None  # a refused choice changes nothing
        e.set_speculation("mtp", mtp=mtp_path)
        assert isinstance(e.session().drafter, MtpDrafter)
    with pytest.raises(ValueError, match="DSpark"):
        drafter("dspark")


def test_a_batch_of_pairs_is_the_pairs_one_by_one(engine) -> None:
    block = engine.session().drafter.block
    rng = np.random.default_rng(1)
    cfg = block.cfg
    ids = rng.integers(1000, 100000, 7)
    hidden = rng.standard_normal((7, cfg.hc_count, cfg.n_embd), dtype=np.float32)
    logits, X = block.run(ids, hidden, block.empty_state())
    state = block.empty_state()
    for t in range(7):
        one, Xt = block.run(ids[t : t + 1], hidden[t : t + 1], state)
        np.testing.assert_allclose(Xt[0], X[t], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(one, logits, rtol=1e-4, atol=1e-4)
    assert state.n_tokens == 7


def test_the_block_input_is_the_token_and_the_streams_projected(engine, mtp_path) -> None:
    """run() against the draft step written out with gguf's dequantiser (docs/model.md §7.1):
    e = e_proj @ rmsnorm(embedding, enorm), h = h_proj @ rmsnorm(stream, hnorm) per stream, the
    block's layer over e + h, then its head (its own collapse and norm, the target's matrix)."""
    from gguf.quants import dequantize

    block = engine.session().drafter.block
    cfg = block.cfg
    rng = np.random.default_rng(3)
    ids = rng.integers(1000, 100000, 3)
    hidden = rng.standard_normal((3, cfg.hc_count, cfg.n_embd), dtype=np.float32)
    with GGUFFile(mtp_path) as f:
        def mat(name):
            t = f.tensors[PREFIX + name]
            return dequantize(np.asarray(f.array(PREFIX + name)), t.type).reshape(t.shape).astype(np.float64)

        def rms(x, w):
            return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps) * w

        emb = engine.file.array("token_embd.weight")[ids].astype(np.float64)
        e = rms(emb, mat("enorm.weight")) @ mat("e_proj.weight").T
        h = rms(hidden.astype(np.float64), mat("hnorm.weight")) @ mat("h_proj.weight").T
    X_in = (e[:, None, :] + h).astype(np.float32)
    state = block.empty_state()
    X = block.model.layers(X_in, ids, state, range(1))
    want = np.asarray(block.model.head(X), dtype=np.float32)
    got, _ = block.run(ids, hidden, block.empty_state())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


class Checked(MtpDrafter):
    """The MTP drafter, each first draft's logits recorded with the session position it was
    made at; proposes the true continuation (from a plain run) in its place, as long as the
    drafter asked for, wrong every fourth time, so that drafts are kept and chained."""

    def __init__(self, block: MtpBlock, truth: list[int], start: int) -> None:
        super().__init__(block)
        self.truth, self.start, self.calls, self.firsts = truth, start, 0, []
        self.streams: dict[int, np.ndarray] = {}  # the target's streams the session handed over
        run = block.run

        def recording(ids, hidden, state, logits=True):
            out = run(ids, hidden, state, logits)
            if state is self._state:
                self.firsts.append((self._at, out[0]))
            return out

        self.block = type("Recorded", (), {"run": staticmethod(recording), "window": block.window,
                                           "model": block.model, "empty_state": block.empty_state})()

    def seen(self, start: int, hidden) -> None:
        self.streams.update({start + i: np.array(row) for i, row in enumerate(hidden)})
        super().seen(start, hidden)

    def propose(self, history, n: int, token: int, most: int) -> list[int]:
        self._at = n
        drafts = super().propose(history, n, token, most)
        at = n + 1 - self.start
        out = list(self.truth[at : at + len(drafts)])
        self.calls += 1
        if out and self.calls % 4 == 0:
            out[-1] = (out[-1] + 1) % 1000 + 5
        return out


def test_drafts_are_those_of_a_block_started_afresh(engine) -> None:
    """Each proposal's first draft equals the block run from an empty state over the pairs its
    window sees (target streams of j-1 with token j for the last ``window`` positions): the
    incremental KV across kept and rejected drafts, pauses, dropped streams is right."""
    prompt = np.random.default_rng(5).integers(1000, 100000, 45).tolist()  # longer than the window (32)
    n = 60
    truth, blob = _plain(engine, prompt, n, chunk=16)
    s = engine.session()
    block = s.drafter.block
    s.drafter, s.pace = (d := Checked(block, truth, len(prompt))), Pace(margin=float("inf"), warmup=0)
    s.prefill_chunk = 16
    s.sync(prompt)
    got = [st.token for st in s.generate(GREEDY, max_tokens=n, stop_at_eos=False)]
    assert got == truth and s.snapshot() == blob
    assert d.kept > 10 and d.k > 1 and len(d.firsts) > 5  # drafts were kept and chained
    seq = np.asarray(prompt + truth)
    W = block.window
    for at, logits in d.firsts:
        j = np.arange(max(1, at - W + 1), at + 1)
        streams = np.stack([d.streams[int(p)] for p in j - 1])
        fresh, _ = block.run(seq[j], streams, block.empty_state())
        np.testing.assert_allclose(logits, fresh, rtol=1e-3, atol=1e-3)  # (batch widths differ: float order)


@pytest.mark.parametrize("kernels", ["cpu", "reference", "gpu-host"])
def test_greedy_with_mtp_drafts_is_plain_decoding(demo_path, mtp_path, kernels: str) -> None:
    """The block's own drafts (random weights: rarely right), prompts across prefill chunks and
    the window; an interrupted generation rolled back and run again; a restored session
    continued."""
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels=kernels) as e:
        e.set_speculation("mtp", mtp=mtp_path)
        prompt = np.random.default_rng(9).integers(1000, 100000, 70).tolist()
        n = 50 if kernels == "cpu" else 24
        truth, blob = _plain(e, prompt, n, chunk=32)
        s = e.session()
        s.prefill_chunk = 32
        s.sync(prompt)
        cp = s.checkpoint()
        for i, _ in enumerate(s.generate(GREEDY, max_tokens=n, stop_at_eos=False)):
            if i == 12:
                break  # interrupted: the session holds more than the prompt, undone below
        s.rollback(cp)
        assert [st.token for st in s.generate(GREEDY, max_tokens=n, stop_at_eos=False)] == truth
        assert s.snapshot() == blob and s.drafter.restarts >= 1
        # A session saved midway by plain decoding, restored and continued with drafts.
        mid = e.session()
        mid.drafter = None
        mid.prefill_chunk = 32
        mid.sync(prompt)
        assert [st.token for st in mid.generate(GREEDY, max_tokens=11, stop_at_eos=False)] == truth[:11]
        restored = e.session()
        restored.restore(mid.snapshot())
        assert [st.token for st in restored.generate(GREEDY, max_tokens=n - 10, stop_at_eos=False)] == truth[10:]
        assert restored.snapshot() == blob
        assert restored.drafter.proposals > 0 and s.drafter.proposals > 0


def test_sampling_with_mtp_drafts_runs_to_its_end(engine) -> None:
    prompt = list(range(700, 740))
    s = engine.session()
    s.sync(prompt)
    steps = list(s.generate(SamplingParams(temperature=0.9, top_p=0.95, seed=4), max_tokens=30, stop_at_eos=False))
    assert [st.index for st in steps] == list(range(30)) and steps[-1].finish == "length"
    assert s.tokens == prompt + [st.token for st in steps[:-1]]
    assert s.drafter.proposals > 0


def test_the_flags(demo_path, mtp_path, monkeypatch, capsys, tmp_path) -> None:
    from ds4agent.cli import main

    monkeypatch.delenv("DS4_SPECULATE", raising=False)
    monkeypatch.delenv("DS4_MTP", raising=False)
    base = ["-m", str(demo_path), "-p", "hi", "-n", "3", "--temp", "0"]
    assert main(base + ["--mtp", str(mtp_path)]) == 0  # --mtp alone: speculate with it
    assert main(base + ["--speculate", "mtp"]) == 2
    assert "--speculate mtp needs the MTP file: --mtp FILE" in capsys.readouterr().err
    assert main(base + ["--mtp", str(demo_path)]) == 2
    assert "not an MTP block for this model" in capsys.readouterr().err
    assert main(base + ["--dspark", str(mtp_path)]) == 2
    assert "does not run DSpark" in capsys.readouterr().err
    monkeypatch.setenv("DS4_MTP", str(mtp_path))
    assert main(base + ["--speculate", "mtp"]) == 0
    # ds4 demo writes one for a model: the demo's here, the same bytes as the fixture's.
    out = tmp_path / "made.gguf"
    assert main(["demo", "--preset", "mtp", "-m", str(demo_path), "--out", str(out)]) == 0
    assert out.read_bytes() == mtp_path.read_bytes()
    assert main(["demo", "--preset", "mtp", "-m", str(demo_path)]) == 2
    assert "needs --out PATH" in capsys.readouterr().err
    assert main(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert "an MTP support file" in said and "32 tensors" in said and "routed experts: 16" in said


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_server_answers_the_same_with_mtp_drafts(engine, mtp_path, parallel: int) -> None:
    """A real server on loopback (one slot, and two slots behind the batcher): greedy answers
    equal to the server without drafts, the slot's drafter proposed."""
    import openai

    from ds4agent.server import ServerOptions
    from ds4agent.server.requests import Defaults
    from ds4agent.server.run import ServerThread

    msgs = [{"role": "user", "content": "Write a short poem about the sea, please."}]

    def answer() -> tuple[str, list]:
        with ServerThread(engine, ServerOptions(Defaults(max_tokens=40), parallel=parallel)) as st:
            c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=120)
            r = c.chat.completions.create(model="m", messages=msgs, max_tokens=40, temperature=0)
            stats = [s.session.drafter.stats() for s in st.worker.slots if s.session.drafter is not None]
            return (r.choices[0].message.reasoning_content or "") + r.choices[0].message.content, stats

    engine.set_speculation("off")
    try:
        plain, none = answer()
    finally:
        engine.set_speculation("mtp", mtp=mtp_path)
    drafted, stats = answer()
    assert none == [] and drafted == plain
    assert sum(s["proposals"] for s in stats) > 0
