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
