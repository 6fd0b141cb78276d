"""mlx-kquant as a kernel set (``--kernels kquant``, engine/kernels/kquant.py), on MLX's CPU stream.

mlx-kquant computes with bfloat16 activations, so it is compared with the float32 reference
within tolerances measured here on the demo model and written down (README, "Kernels"):

* one product: about 2.5e-3 relative (L2, as the self-check measures), the routed FFN up to
  5e-3; the self-check allows 1e-2 and 2e-2 (kquant.KquantKernels.check_tolerance), the tests
  below 5e-3 and 1e-2 as the largest difference relative to the largest value;
* the whole model, teacher-forced (both fed the same 150-token prompt and then the same 12
  tokens, one at a time, so an early difference in the argmax cannot make the texts diverge):
  measured over three prompts and four chunk sizes, per position at most 0.20, on average 1.3e-2
  to 4.2e-2, and the reference's most likely token was also kquant's at 92-100% of positions.
  The bounds below (0.3, 6e-2, 80%) leave a margin; a planted error (a routing weight
  forgotten) is far outside them.

The Metal-only operations (the fused decode experts, the segment GEMM, the KV and indexer
rounding) cannot run here; the self-check at open compares them with the reference on a Mac,
and bench/mac_check.sh runs these tests there with the Metal paths live.

Skipped, with the reason, where mlx-kquant is not installed (a fresh clone: README says how).
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest
from helpers import rel_err

from ds4agent.engine import Engine, EngineError
from ds4agent.engine.kernels import check
from ds4agent.engine.kernels.reference import ReferenceKernels

kq = pytest.importorskip("mlx_kquant", reason="mlx-kquant is not installed (README, 'Kernels': the wheel in "
                                              "../shared/wheels, or pip install 'ds4agent[kquant]')")

PROMPT = np.random.default_rng(5).integers(1000, 120000, 150).tolist()
CONT = np.random.default_rng(105).integers(1000, 120000, 12).tolist()


# On a Mac (bench/mac_check.sh) the same tests run on Metal too, where mlx-kquant's Metal-only
# operations (the fused decode experts, the segment GEMM, the KV and indexer rounding) are live.
BACKENDS = ["cpu"] + (["metal"] if mx.metal.is_available() else [])


@pytest.fixture(scope="module", params=BACKENDS)
def engines(demo_path, request):
    with Engine.open(demo_path, backend=request.param, kernels="kquant", qat_sim=False) as ours, \
            Engine.open(demo_path, backend=request.param, kernels="reference", qat_sim=False) as ref:
        assert ours.info.kernels == "kquant" and ours.info.kernel_check.refused == {}, ours.info.kernel_note
        yield ours, ref


@pytest.mark.parametrize("T", [1, 3, 40])
def test_dense_products(engines, T: int) -> None:
    """Every Q8_0 matrix kind of the demo model, whole, a row range and a column range; F16
    matrices go to MLX (the reference's own product)."""
    ours, ref = (e.model.k for e in engines)
    f = engines[0].file
    rng = np.random.default_rng(T)
    for name in ("output.weight", "blk.0.attn_q_b.weight", "blk.1.attn_output_a.weight", "blk.2.ffn_down_shexp.weight",
                 "blk.0.ffn_gate_inp.weight"):
        n = f.tensors[name].shape[1]
        x = mx.array(rng.normal(size=(T, n)).astype(np.float32))
        assert rel_err(np.array(ours.linear(x, name)), np.array(ref.linear(x, name))) <= 5e-3, name
    x = mx.array(rng.normal(size=(T, 64)).astype(np.float32))
    a, b = ours.linear(x, "blk.0.attn_kv.weight", (8, 40), (64, 128)), ref.linear(x, "blk.0.attn_kv.weight", (8, 40), (64, 128))
    assert a.shape == b.shape == (T, 32) and rel_err(np.array(a), np.array(b)) <= 5e-3


@pytest.mark.parametrize("T", [1, 4, 40])
@pytest.mark.parametrize("layer", [0, 3])
def test_routed_experts(engines, layer: int, T: int) -> None:
    ours, ref = (e.model.k for e in engines)
    rng = np.random.default_rng(layer + T)
    x = mx.array((rng.normal(size=(T, 256)) * 2).astype(np.float32))
    sel = np.stack([rng.choice(16, size=2, replace=False) for _ in range(T)])
    route = mx.array(rng.uniform(0.2, 1.0, size=(T, 2)).astype(np.float32))
    a, b = ours.experts(layer, x, sel, route, 0.8), ref.experts(layer, x, sel, route, 0.8)
    assert rel_err(np.array(a), np.array(b)) <= 1e-2
    with pytest.raises(ValueError, match="out of range"):
        ours.experts(layer, x, sel + 16, route, 0.8)


def _teacher_forced(e: Engine, chunk: int) -> np.ndarray:
    s = e.session()
    s.prefill_chunk = chunk
    s.sync(PROMPT)
    out = [s.logits.copy()]
    for i in range(len(CONT)):
        s.sync(PROMPT + CONT[: i + 1])
        out.append(s.logits.copy())
    return np.stack(out)


@pytest.fixture(scope="module")
def reference_logits(engines):
    return _teacher_forced(engines[1], 256)


@pytest.mark.parametrize("chunk", [1, 8, 64, 256])
def test_whole_model_within_the_calibrated_tolerance(engines, reference_logits, chunk: int) -> None:
    got = _teacher_forced(engines[0], chunk)
    errs = [rel_err(g, r) for g, r in zip(got, reference_logits)]
    agree = np.mean(np.argmax(got, axis=1) == np.argmax(reference_logits, axis=1))
    assert max(errs) <= 0.3 and np.mean(errs) <= 6e-2 and agree >= 0.8, (max(errs), np.mean(errs), agree)


def test_a_forgotten_routing_weight_is_outside_the_tolerance(engines, reference_logits, monkeypatch) -> None:
    """The bounds above are not so loose that a real error passes."""
    from ds4agent.engine.kernels import kquant

    k = engines[0].model.k
    real = kquant.KquantKernels.experts
    monkeypatch.setattr(k, "experts", lambda layer, x, sel, w, clamp: real(k, layer, x, sel, mx.ones_like(w), clamp))
    got = _teacher_forced(engines[0], 64)
    errs = [rel_err(g, r) for g, r in zip(got, reference_logits)]
    assert np.mean(errs) > 6e-2


def test_self_check_and_its_tolerance(engines) -> None:
    """Checked at open (engine fixture: nothing refused), with the bfloat16 tolerances; the
    same check with the float32 default tolerance refuses the products (so the tolerances are
    what admits them, and the measured errors are where the docstring says)."""
    k, w = engines[0].model.k, engines[0].model.w
    r = engines[0].info.kernel_check
    errs = {op: max(c.err for c in r.results if c.op == op) for op in ("linear", "experts")}
    assert 5e-4 < errs["linear"] <= 5e-3 and 5e-4 < errs["experts"] <= 1e-2, errs
    strict = check.self_check(k, ReferenceKernels(w), w, ops=("linear",))
    assert strict.refused == {} and max(c.err for c in strict.results) <= k.check_tolerance["linear"]
    k.check_tolerance = {}
    try:
        assert set(check.self_check(k, ReferenceKernels(w), w, ops=("linear", "experts")).refused) == {"linear", "experts"}
    finally:
        del k.check_tolerance


def test_not_installed_is_one_line(demo_path, monkeypatch) -> None:
    """Asked for without mlx-kquant: one line saying so; auto never needs it (on the CPU it is
    not a candidate; on Metal it is passed over in silence)."""
    monkeypatch.setitem(sys.modules, "mlx_kquant", None)
    with pytest.raises(EngineError, match=r"^kquant kernels unavailable: .*mlx_kquant.*README") as e:
        Engine.open(demo_path, backend="cpu", kernels="kquant")
    assert "\n" not in str(e.value)
    with Engine.open(demo_path, backend="cpu") as e:
        assert e.info.kernels in ("cpu", "cpu-exact") and e.info.kernel_note is None
    from ds4agent.engine.kernels import KernelError, select

    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        with pytest.raises(KernelError, match="kquant kernels need the metal or cpu backend"):
            select("cuda", e.model.w, "kquant")


def test_choose_takes_the_correct_and_faster(demo_path, monkeypatch) -> None:
    """check.choose, as auto runs it on Metal between our kernels and mlx-kquant's, here with
    the host kernels and kquant on the CPU: both checked, the faster on the timing cases taken
    and named; a set with a refused operation loses to one without, whatever its speed."""
    from ds4agent.engine.kernels import gpu
    from ds4agent.engine.kernels.gpu_host import HostGpuKernels
    from ds4agent.engine.kernels.kquant import KquantKernels

    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        w = e.model.w
        times = {"gpu-host": 0.5, "kquant": 0.2}
        monkeypatch.setattr(check, "timing", lambda c, _w: times[c.name])
        chosen, note = check.choose([HostGpuKernels(w), KquantKernels(w)], w)
        assert chosen.name == "kquant"
        assert note == "kquant kernels chosen by the self-check (timing cases 200.0 ms; gpu-host 500.0 ms)"
        ins, outs, body = gpu.BODIES["moe_glu"]
        monkeypatch.setitem(gpu.BODIES, "moe_glu", (ins, outs, body.replace(" * u * route[order[gid / F]]", " * u")))
        times["gpu-host"] = 0.1
        chosen, note = check.choose([HostGpuKernels(w), KquantKernels(w)], w)
        assert chosen.name == "kquant" and "gpu-host had more operations refused" in note
