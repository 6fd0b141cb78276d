"""The MLX forward pass against transformers' independent DeepSeek V4, and prefill == decode.

The oracle has no FP8/FP4 KV simulation, so these comparisons run with qat_sim=False; the
simulation functions themselves are checked bit for bit in test_qat.py.

Findings from settling oracle vs docs/model.md (both agree with the official definition here):
* router weights: HF divides by (Σ + 1e-20), ds4/the spec by max(Σ, 2^-14); identical unless the
  selected scores sum below 6e-5, which sqrt(softplus) of these weights never does;
* indexer ties: HF keeps torch.topk's order, the spec breaks ties toward the lower row; scores
  from 16 heads of random weights never tie, so the choice is not observable here.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch  # the test extra's oracles: a missing one fails the suite, never skips it
import transformers  # noqa: F401
from helpers import rel_err as _rel  # noqa: E402
from hf_oracle import load_hf  # noqa: E402

from ds4agent.engine import Engine, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def oracle(demo_path):
    model, cfg = load_hf(demo_path)
    return model


@pytest.fixture(scope="module", params=["reference", "cpu-exact"])
def engine(demo_path, request):
    """Both float implementations of the heavy products face the oracle: the MLX reference and
    the native CPU kernels with float activations (engine/kernels; the default ``cpu`` kernels'
    8-bit activations are checked against these in test_kernels.py)."""
    e = Engine.open(demo_path, backend="cpu", ctx=4096, qat_sim=False, kernels=request.param)
    assert e.info.kernels == request.param
    yield e
    e.close()


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128000, n).tolist()


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()


@pytest.mark.parametrize("n", [20, 150, 420])
def test_last_position_matches_oracle(engine, oracle, n: int) -> None:
    """20 tokens: windows only; 150: ratio-128 rows and ratio-4 rows beyond the indexer's top-k;
    420: several ratio-128 rows and ~100 ratio-4 rows competing for 8 slots."""
    ids = _prompt(n, n)
    s = engine.session()
    s.sync(ids)
    ref = _hf_logits(oracle, ids)
    assert _rel(s.logits, ref[-1]) <= 1e-4
    assert int(np.argmax(s.logits)) == int(np.argmax(ref[-1]))


def test_decode_argmax_every_position(engine, oracle) -> None:
    ids = _prompt(420, 7)
    ref = _hf_logits(oracle, ids)
    s = engine.session()
    worst = 0.0
    for p, tok in enumerate(ids):
        s.eval(tok)
        assert int(np.argmax(s.logits)) == int(np.argmax(ref[p])), f"position {p}"
        worst = max(worst, _rel(s.logits, ref[p]))
    assert worst <= 1e-4


def test_greedy_continuation_matches_oracle(engine, oracle) -> None:
    from transformers import DynamicCache

    prompt = _prompt(140, 3)
    s = engine.session()
    s.sync(prompt)
    ours = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=32, stop_at_eos=False)]
    cache = DynamicCache(config=oracle.config)
    theirs: list[int] = []
    with torch.no_grad():
        out = oracle(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        for _ in range(32):
            nxt = int(out.logits[0, -1].argmax())
            theirs.append(nxt)
            out = oracle(input_ids=torch.tensor([[nxt]]), cache=out.cache, use_cache=True)
    assert ours == theirs


def test_q4_preset_matches_oracle(demo_q4_path) -> None:
    model, _ = load_hf(demo_q4_path)
    ids = _prompt(160, 11)
    with Engine.open(demo_q4_path, backend="cpu", ctx=1024, qat_sim=False, kernels="cpu-exact") as e:
        s = e.session()
        s.sync(ids)
        assert _rel(s.logits, _hf_logits(model, ids)[-1]) <= 1e-4


@pytest.mark.parametrize("qat_sim", [False, True])
def test_prefill_equals_decode(demo_path, qat_sim: bool) -> None:
    """One batch, chunks of 64, and token by token leave the same logits and the same state.

    Which kernels: with the FP8 KV simulation on, a one-ulp difference in any sum can move a
    cached value across an FP8 step (1/8 of its size), and this random model cascades that
    into visibly different later rows. The MLX reference sums a token's products in the same
    order whatever the batch, so it is the one to hold to this with qat on; the native kernels
    are held to it with float activations and qat off. (With 8-bit activations the same
    cascade starts from an activation's rounding; test_kernels.py bounds that path.)"""
    ids = _prompt(300, 5)
    kernels = "reference" if qat_sim else "cpu-exact"
    with Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=qat_sim, kernels=kernels) as e:
        runs = []
        for chunk in (512, 64, 1):
            s = e.session()
            s.prefill_chunk = chunk
            s.sync(ids)
            runs.append(s)
        for other in runs[1:]:
            assert _rel(other.logits, runs[0].logits) <= 1e-4
            a, b = runs[0]._live.state, other._live.state
            assert a.n_tokens == b.n_tokens == 300
            for la, lb in zip(a.layers, b.layers):
                for xa, xb in zip([la.raw, la.comp, la.idx_comp], [lb.raw, lb.comp, lb.idx_comp]):
                    if xa is not None:
                        assert xa.shape == xb.shape
                        assert np.allclose(np.array(xa), np.array(xb), rtol=1e-3, atol=1e-4)
                for fa, fb in zip([la.comp_frontier, la.idx_frontier], [lb.comp_frontier, lb.idx_frontier]):
                    if fa is not None:
                        assert np.allclose(np.array(fa.kv), np.array(fb.kv), rtol=1e-3, atol=1e-4)
                        assert np.array_equal(np.array(fa.score) <= -1e29, np.array(fb.score) <= -1e29)


def test_long_run_stays_finite(demo_path) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        s = e.session()
        s.sync(_prompt(2000, 2))
        assert np.isfinite(s.logits).all()
        st = s._live.state.layers
        assert st[3].comp.shape[0] == 2000 // 128 and st[2].comp.shape[0] == 500
        assert st[0].raw.shape[0] == e.info.config.sliding_window


def test_qat_changes_logits_a_little(demo_path) -> None:
    """The simulation is on by default and moves logits, but not wildly."""
    ids = _prompt(200, 9)
    out = []
    for qat_sim in (True, False):
        with Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=qat_sim) as e:
            assert e.info.qat_sim is qat_sim
            s = e.session()
            s.sync(ids)
            out.append(s.logits)
    assert 1e-6 < _rel(out[0], out[1]) < 0.2


def test_compiled_graph_equals_eager(demo_path, monkeypatch) -> None:
    """The mx.compile'd runs of small ops (ops.fused) compute exactly what the plain ops do:
    prefill and decode logits and the cached rows, FP8 simulation on, bit for bit. (On the MLX
    path: the reference kernels. The CPU kernels run the small ops in numpy, uncompiled.)"""
    from ds4agent.engine import model, ops
    from ds4agent.engine.kernels import reference

    def run() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        with Engine.open(demo_path, backend="cpu", ctx=1024, kernels="reference") as e:
            assert e.model.xp is mx
            s = e.session()
            s.prefill_chunk = 96
            s.sync(_prompt(300, 12))
            first = np.array(s.logits)
            for tok in (5, 6, 7):
                s.eval(tok)
            rows = [np.array(x) for la in s._live.state.layers for x in (la.raw, la.comp, la.idx_comp) if x is not None]
            return first, np.array(s.logits), rows

    compiled = run()
    eager_fused = lambda fn, *static: lambda *arrays: fn(*arrays, *static)  # noqa: E731
    for module in (ops, model, reference):  # each imported the name
        monkeypatch.setattr(module, "fused", eager_fused)
    eager = run()
    assert np.array_equal(compiled[0], eager[0]) and np.array_equal(compiled[1], eager[1])
    assert all(np.array_equal(a, b) for a, b in zip(compiled[2], eager[2]))
