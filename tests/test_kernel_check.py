"""The kernels' self-check (engine/kernels/check.py) and the fallback it drives.

The check is generic over the Kernels interface, so it runs here for real: on the CPU kernels
(every operation is theirs), and on the GPU kernels themselves (GpuKernels, its launch plans and
argument marshalling) with their bodies run by the host C compiler instead of a GPU
(gpu_harness.harness_make). Planted bugs of each kind a GPU would show (a body that does not
compile, a wrong result, a launch that raises, NaNs) are refused, the engine prints one line
and runs the reference for that operation, and the answer is then the reference's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_harness import harness_make
from helpers import rel_err

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.engine import mlx_parts
from ds4agent.engine.kernels import check, gpu, select
from ds4agent.engine.kernels.cpu import CpuKernels
from ds4agent.engine.kernels.reference import ReferenceKernels
from ds4agent.engine.weights import Weights
from ds4agent.modelfile.config import config_from_gguf
from ds4agent.modelfile.gguf import GGUFFile
from ds4agent.modelfile.tokenizer import Tokenizer


class HarnessGpu(gpu.GpuKernels):
    """GpuKernels whose kernels run on the CPU (what select() builds, once patched in)."""

    def __init__(self, weights, backend, make=None) -> None:
        super().__init__(weights, backend, make or harness_make(backend))


@pytest.fixture
def weights(demo_path):
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        yield e.model.w


def _engine(path, kernels: str, qat_sim: bool = False) -> Engine:
    """An Engine as Engine.open builds it, on the backend ``kernels`` names (the arrays stay on
    MLX's CPU device: only the kernels differ)."""
    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    backend = "cpu" if kernels in ("reference", "cpu", "cpu-exact") else kernels
    return Engine(mlx_parts(f, cfg, Tokenizer.from_gguf(f), backend, 4096, qat_sim, False, kernels))


def _run(engine: Engine) -> tuple[np.ndarray, list[int]]:
    s = engine.session()
    s.sync(np.random.default_rng(5).integers(1000, 120000, 40).tolist())
    first = s.logits.copy()
    toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=8, stop_at_eos=False)]
    return np.concatenate([first, s.logits]), toks


def test_probes_cover_the_interface(weights, flash_header_path) -> None:
    """Every operation of the Kernels interface has probe cases, on the demo model and on the
    real Flash layout (an operation added to the interface without a probe fails here)."""
    assert set(check.ARRAYS) == set(check.operations())
    with GGUFFile(flash_header_path) as f:
        flash = Weights(f, config_from_gguf(f))
        for w in (weights, flash):
            cases = check._probe_cases(w)
            assert all(cases[op] for op in check.operations()), {op for op in cases if not cases[op]}
        labels = [c for c, _ in check._probe_cases(flash)["linear"]]
        assert any(lb.startswith("Q8_0 x4096") for lb in labels) and any(lb.startswith("Q8_0 x8192") for lb in labels)


def test_cpu_kernels_pass_every_operation(weights) -> None:
    for exact, bound in ((True, 1e-5), (False, 4e-2)):
        k = CpuKernels(weights, exact=exact)
        r = check.self_check(k, ReferenceKernels(weights), weights)
        assert r.inherited == [] and r.refused == {} and r.note is None
        assert {c.op for c in r.results} == set(check.operations())
        assert max(c.err for c in r.results) <= bound


def test_gpu_kernels_pass_on_the_cpu_harness(weights) -> None:
    """linear, linears, grouped, experts, attend and hc_pre are GpuKernels' own (checked,
    through the kernel bodies); everything else is the reference's own and not run twice."""
    r = check.self_check(HarnessGpu(weights, "cuda"), ReferenceKernels(weights), weights)
    assert r.refused == {}
    own = {"linear", "linears", "grouped", "experts", "attend", "hc_pre"}
    assert {c.op for c in r.results} == own
    assert set(r.inherited) == set(check.operations()) - own
    assert max(c.err for c in r.results) <= 1e-5
    assert r.seconds < 5


DENSE = ("linear", "linears", "grouped", "hc_pre")  # every product of a dense matrix runs the matmul kernel
BUGS = {  # kernel body -> (a plausible mistake, the operations it breaks, the reason the check gives)
    "compile": ("moe_glu", lambda b: b.replace("* route[order", "* routes[order"), ("experts",), "error: CompileError"),
    "wrong": ("moe_glu", lambda b: b.replace(" * u * route[order[gid / F]]", " * u"), ("experts",),
              "mismatch: relative error"),
    "nan": ("matmul", lambda b: b.replace("+ s] = acc[p];", "+ s] = (r == 3 ? 0.0f / 0.0f : 1.0f) * acc[p];"),
            DENSE, "non-finite"),
    "row-offset": ("matmul", lambda b: b.replace("(k == 0 ? (uint32_t)dims[2] : 0u)", "0u"), ("linear",), "mismatch"),
    # Rows past the first matrix read the first matrix (only products of several at once).
    "matrix": ("matmul", lambda b: b.replace("k == 0 ? W0 : k == 1 ? W1", "k == 0 ? W0 : k == 1 ? W0"), ("linears",),
               "mismatch"),
    # Every token of a tile reads the first one's activations (only products of 2+ tokens).
    "tile": ("matmul", lambda b: b.replace("tok[p] = t0 + p < n_tok ? t0 + p : n_tok - 1;", "tok[p] = t0;"), DENSE,
             "mismatch"),
    # The last split of the input is left out of the sum (only products split along the input).
    "split": ("reduce", lambda b: b.replace("s < n_split", "s + 1 < n_split"), DENSE, "mismatch"),
    # An expert's tile reads the first sorted slot's token for all its slots (prefill only).
    "expert-tile": ("moe_gate_up", lambda b: b.replace("order[start + (p < n ? p : n - 1)]", "order[start]"),
                    ("experts",), "mismatch"),
    # The post weights of the hyper-connection mix not doubled.
    "hc-post": ("hc_weights", lambda b: b.replace("w[at + HC + j] = 2.0f * (", "w[at + HC + j] = ("), ("hc_pre",),
                "mismatch"),
    "visible-rows": ("mix", lambda b: b.replace("v < n_vis", "v + 1 < n_vis"), ("attend",), "mismatch"),
}


def _plant(monkeypatch, bug: str) -> tuple[tuple[str, ...], str]:
    kind, change, ops, why = BUGS[bug]
    ins, outs, body = gpu.BODIES[kind]
    assert change(body) != body
    monkeypatch.setitem(gpu.BODIES, kind, (ins, outs, change(body)))
    return ops, why


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_kernel_bug_is_refused(weights, monkeypatch, bug: str) -> None:
    ops, why = _plant(monkeypatch, bug)
    k = HarnessGpu(weights, "cuda")
    ref = ReferenceKernels(weights)
    r = check.self_check(k, ref, weights)
    assert set(r.refused) == set(ops), r.refused
    assert all(r.refused[op].startswith(why) for op in ops), r.refused
    note = r.note
    assert "\n" not in note and note.startswith(f"cuda kernels refused by the self-check, {ops[0]}: {why}")
    had = k.resident.names()
    check.refuse(k, ref, r)
    assert all(getattr(k, op) == getattr(ref, op) for op in ops) and k.check is r
    # What only the refused kernels used is no longer held on the device: the expert tensors
    # when experts is refused, the dense matrices when every dense product is.
    assert any("_exps." in n for n in had) and any("_exps." not in n for n in had)
    kept = {n for n in had if not (("_exps." in n and "experts" in ops) or ("_exps." not in n and set(DENSE) <= set(ops)))}
    assert k.resident.names() == kept


def test_a_launch_error_is_refused(weights) -> None:
    """A kernel that raises when launched (Metal refusing a threadgroup size, a missing
    symbol, a driver error) is refused; the others stay."""
    real = harness_make("metal")

    def make(name, **kw):
        kernel = real(name, **kw)
        if name != "ds4_scores":
            return kernel

        def refuse_launch(**_):
            raise RuntimeError("[metal::Device] Unable to load kernel custom_kernel_ds4_scores\nmore detail")

        return refuse_launch

    r = check.self_check(gpu.GpuKernels(weights, "metal", make=make), ReferenceKernels(weights), weights)
    assert set(r.refused) == {"attend"}
    assert r.refused["attend"].startswith("error: RuntimeError: [metal::Device] Unable to load kernel")


def test_a_check_that_raises_everywhere_never_propagates(weights) -> None:
    class Broken(ReferenceKernels):
        name = "broken"

    for op in check.operations():
        def fail(*a, op=op):
            raise MemoryError(f"{op} exploded")
        setattr(Broken, op, fail)
    r = check.self_check(Broken(weights), ReferenceKernels(weights), weights)
    assert set(r.refused) == set(check.operations())
    assert all(why.startswith("error: MemoryError") for why in r.refused.values())


def test_engine_falls_back_says_so_and_answers_right(demo_path, monkeypatch, capsys) -> None:
    """Through select() and the Engine: a wrong expert kernel is refused at open with one line
    (the CLI prints engine.info.kernel_note), the other kernels stay, and the model's logits
    and greedy tokens are the reference's. With DS4_KERNEL_CHECK=0 the same kernel runs and
    the answer is wrong: the check is what keeps it right."""
    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    _plant(monkeypatch, "wrong")
    with _engine(demo_path, "reference") as ref:
        want, want_toks = _run(ref)
    with _engine(demo_path, "cuda") as e:
        assert e.info.kernels == "cuda"
        note = e.info.kernel_note
        assert note and "\n" not in note and note.startswith("cuda kernels refused by the self-check, experts: mismatch")
        assert set(e.info.kernel_check.refused) == {"experts"}
        got, toks = _run(e)
    assert toks == want_toks and rel_err(got, want) <= 1e-4
    monkeypatch.setenv("DS4_KERNEL_CHECK", "0")
    with _engine(demo_path, "cuda") as e:
        assert e.info.kernel_note is None and e.info.kernel_check is None
        bad, _ = _run(e)
    assert rel_err(bad, want) > 1e-2


def test_all_refused_is_the_reference_bit_for_bit(demo_path, monkeypatch) -> None:
    """Every GPU operation broken: each refused, and the logits are the reference path's, bit
    for bit (FP8 cache simulation on)."""
    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    for bug in ("compile", "nan", "hc-post", "visible-rows"):
        _plant(monkeypatch, bug)
    with _engine(demo_path, "reference", qat_sim=True) as ref:
        want, want_toks = _run(ref)
    with _engine(demo_path, "cuda", qat_sim=True) as e:
        assert set(e.info.kernel_check.refused) == {"experts", "attend", *DENSE}
        assert e.info.kernel_note.count("refused") == 1 and e.info.kernel_note.endswith("the MLX reference path runs them")
        got, toks = _run(e)
    assert toks == want_toks and np.array_equal(got, want)


def test_a_refused_operation_of_numpy_kernels_is_bridged(demo_path, weights) -> None:
    """The CPU kernels run the model in numpy: a refused operation's reference (MLX) gets its
    arrays converted both ways, and the whole model then matches the reference."""
    class Wrong(CpuKernels):
        def hc_post(self, y, X, post, M):  # forgets the sublayer's output
            return super().hc_post(y * 0, X, post, M)

    with Engine.open(demo_path, backend="cpu", kernels="reference", qat_sim=False) as ref, \
            Engine.open(demo_path, backend="cpu", kernels="cpu-exact", qat_sim=False) as e:
        want, want_toks = _run(ref)
        k = Wrong(e.model.w, exact=True)
        r = check.self_check(k, ReferenceKernels(e.model.w), e.model.w)
        assert set(r.refused) == {"hc_post"}
        check.refuse(k, ReferenceKernels(e.model.w), r)
        e.model.k = k
        got, toks = _run(e)
    assert toks == want_toks and rel_err(got, want) <= 1e-4


def test_select_checks_gpu_kernels_only_when_enabled(weights, monkeypatch) -> None:
    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    k, note = select("cuda", weights, "cuda")
    assert note is None and k.check.refused == {} and len(k.check.results) >= 10
    monkeypatch.setenv("DS4_KERNEL_CHECK", "0")
    k, note = select("cuda", weights, "cuda")
    assert note is None and not hasattr(k, "check")
    k, _ = select("cpu", weights, "cpu-exact")  # the CPU kernels are tested in CI; not checked at open
    assert not hasattr(k, "check")


def test_inspect_kernels_prints_the_check(demo_path, capsys, monkeypatch) -> None:
    from ds4agent.cli import main

    assert main(["inspect", str(demo_path), "--kernels", "cpu-exact"]) == 0
    out = capsys.readouterr().out
    assert "kernels       cpu-exact on cpu: self-check now against the MLX reference on the same device" in out
    assert "nothing refused" in out
    for op in check.operations():
        assert f"\n              {op} " in out
    assert main(["inspect", str(demo_path), "--kernels", "reference"]) == 0
    assert "nothing to check" in capsys.readouterr().out
    # GPU kernels (bodies on the CPU): the report of the check made at open, refusals included.
    # Engine.open cannot pick a GPU backend here, so it builds the engine as _engine does.
    from ds4agent.engine import engine as engine_mod
    from ds4agent.engine.reports import check as report

    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    _plant(monkeypatch, "wrong")
    monkeypatch.setattr(engine_mod.Engine, "open", classmethod(lambda cls, p, backend="auto", ctx=32768, qat_sim=True,
                                                                     kernels=None: _engine(p, kernels)))
    lines = report.kernel_report(demo_path, "cuda", "cuda")
    assert "self-check at open" in lines[0] and "1 operations refused (the reference runs them)" in lines[0]
    assert any("REFUSED" in ln for ln in lines) and any("mismatch: relative error" in ln for ln in lines)
    assert lines[1].startswith("              note: cuda kernels refused by the self-check, experts:")


@pytest.mark.parametrize("model", ["demo_path", "demo_q4_path", "flash_header_path"])
def test_the_probes_launch_every_instantiation_the_engine_can(request, model: str) -> None:
    """So the check at open compiles and runs every kernel the engine will later use: the
    probes' launches cover the compile tests' enumeration (gpu_harness.launches_of), Metal's
    constant/device variants included. On the Flash layout nothing runs (launches recorded)."""
    import mlx.core as mx
    from gpu_harness import Recording, launches_of
    from mlx_sources import instance_key

    path = request.getfixturevalue(model)
    calls: list = []
    with Engine.open(path, backend="cpu", kernels="reference") as e:
        k = Recording(e.model.w, "metal", calls)
        for op in ("linear", "linears", "grouped", "experts", "attend", "hc_pre"):
            for _, args in check._probe_cases(e.model.w)[op]:
                getattr(k, op)(*check._in(mx, op, args))
    assert {instance_key(c) for c in calls} == {instance_key(c) for c in launches_of(path, "metal")}
