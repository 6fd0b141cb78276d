"""The Metal/CUDA kernels (engine/kernels/gpu.py), tested without a GPU.

What runs here: each kernel body, compiled by the host C compiler and run over its whole grid
(tests/gpu_harness.py), against the MLX reference kernels on the demo model's real tensors;
the launch plans (grid, threadgroup, output shapes, template constants) and their argument
checks; the generated Metal and CUDA sources. What needs hardware: the launch itself
(see README, "What was verified where").
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize as oracle
from gpu_harness import c_source, run
from helpers import elements, flash_experts_case, random_blocks
from helpers import rel_err as _rel

from ds4agent.engine import Engine
from ds4agent.engine.kernels import gpu
from ds4agent.engine.kernels.reference import ReferenceKernels, attend_mx
from ds4agent.engine.quants import iq2xxs_tables
from ds4agent.modelfile.gguf import GGUFFile

GRID, SIGNS = (t.reshape(-1) for t in iq2xxs_tables())


@pytest.mark.parametrize("name", ["output.weight", "blk.0.attn_q_b.weight", "blk.1.attn_output_a.weight"])
@pytest.mark.parametrize("T", [1, 3])
def test_matvec_q8_0_on_demo_tensors(demo_path, name: str, T: int) -> None:
    with GGUFFile(demo_path) as f:
        t = f.tensors[name]
        raw = np.asarray(f.array(name)).reshape(-1)
        x = np.random.default_rng(T).normal(size=(T, t.shape[1])).astype(np.float32)
        w = oracle(np.asarray(f.array(name)), t.type).reshape(t.shape).astype(np.float64)
        y = run(gpu.plan_matvec(t.type, t.shape[0], t.shape[1], T), [raw, x, GRID, SIGNS])
        assert _rel(y, x @ w.T) <= 1e-5


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.Q8_0])
def test_matvec_every_type_with_a_row_range(qtype: Q) -> None:
    """Random blocks (finite scales), a row range starting past row 0, as the grouped output
    projection asks for."""
    n, out = 512, 20
    raw = random_blocks(qtype, out, n // elements(qtype), 7)
    w = oracle(raw, qtype).astype(np.float64)
    x = np.random.default_rng(1).normal(size=(2, n)).astype(np.float32)
    y = run(gpu.plan_matvec(qtype, 8, n, 2, r0=5), [raw.reshape(-1), x, GRID, SIGNS])
    assert y.shape == (2, 8)
    assert _rel(y, x @ w[5:13].T) <= 1e-5


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("layer", [0, 3])
def test_fused_experts_on_demo(demo_path, layer: int, T: int) -> None:
    """gate_up then down (gather, dequantise, clamped SwiGLU, routing weight, sum over the
    token's slots) equals the reference expert FFN."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        f, w = e._file, e._model.w
        p = f"blk.{layer}.ffn_"
        tg, td = f.tensors[p + "gate_exps.weight"], f.tensors[p + "down_exps.weight"]
        E, F, k = tg.shape[2], tg.shape[1], 2
        rng = np.random.default_rng(layer + T)
        x = (rng.normal(size=(T, E)) * 2).astype(np.float32)
        sel = np.stack([rng.choice(16, size=k, replace=False) for _ in range(T)]).astype(np.int32)
        route = rng.uniform(0.2, 1.0, size=(T, k)).astype(np.float32)
        clamp = np.array([0.8], np.float32)  # small enough that clamping happens
        raw = {kind: np.asarray(f.array(p + kind + "_exps.weight")).reshape(-1) for kind in ("gate", "up", "down")}
        mid = run(gpu.plan_gate_up(tg.type, T, k, F, E),
                  [raw["gate"], raw["up"], x, sel.reshape(-1), route.reshape(-1), clamp, GRID, SIGNS])
        y = run(gpu.plan_down(td.type, T, k, F, E), [raw["down"], mid, sel.reshape(-1), GRID, SIGNS])
        ref = np.array(ReferenceKernels(w).experts(layer, mx.array(x), sel, mx.array(route), float(clamp[0])))
        assert _rel(y, ref) <= 1e-5


def test_decode_attention_over_visible_rows() -> None:
    """scores over the visible rows only, the sink softmax, then the weighted rows: equals the
    reference attention with the full mask."""
    rng = np.random.default_rng(0)
    H, N, D = 4, 70, 64
    q = rng.normal(size=(H, 1, D)).astype(np.float32)
    keys = rng.normal(size=(N, D)).astype(np.float32)
    mask = rng.random((1, N)) < 0.4
    sinks = rng.normal(size=H).astype(np.float32)
    idx = np.flatnonzero(mask[0]).astype(np.int32)
    V = len(idx)
    s = run(gpu.plan_scores(H, V, D), [q.reshape(H, D), keys, idx]) / np.sqrt(D)
    m = np.maximum(s.max(-1, keepdims=True), sinks[:, None])
    ex = np.exp(s - m)
    den = np.exp(sinks[:, None] - m) + ex.sum(-1, keepdims=True)
    out = run(gpu.plan_mix(H, V, D), [ex.astype(np.float32), keys, idx]) / den
    ref = np.array(attend_mx(mx.array(q), mx.array(keys), mask, mx.array(sinks)))[:, 0]
    assert _rel(out, ref) <= 1e-5


def test_launch_plans_and_argument_checks() -> None:
    p = gpu.plan_matvec(int(Q.Q8_0), 129280, 4096, 1)
    assert p.grid == (129280, 1, 1) and p.threadgroup == (256, 1, 1) and p.output_shapes == [(1, 129280)]
    assert dict(p.template)["RB"] == 4096 // 32 * 34
    p = gpu.plan_gate_up(int(Q.IQ2_XXS), 1, 6, 2048, 4096)
    assert p.grid == (6 * 2048, 1, 1) and dict(p.template)["RB"] == 16 * 66
    p = gpu.plan_down(int(Q.Q2_K), 2, 6, 2048, 4096)
    assert p.grid == (2 * 4096, 1, 1) and p.output_shapes == [(2, 4096)] and dict(p.template)["RBD"] == 8 * 84
    assert gpu.plan_scores(64, 3, 512).threadgroup == (192, 1, 1)  # never more threads than outputs
    with pytest.raises(ValueError, match="no GPU kernel"):
        gpu.plan_matvec(int(Q.F16), 10, 64, 1)
    with pytest.raises(ValueError, match="whole number"):
        gpu.plan_matvec(int(Q.Q2_K), 10, 300, 1)
    with pytest.raises(ValueError, match="1..8 tokens"):
        gpu.plan_matvec(int(Q.Q8_0), 10, 64, 9)
    with pytest.raises(ValueError, match="32-bit grid"):
        gpu.plan_scores(64, 2**27, 512)
    with pytest.raises(ValueError, match="takes 4 inputs"):
        c_source(gpu.plan_matvec(int(Q.Q8_0), 1, 32, 1), [np.zeros(1, np.float32)])


@pytest.mark.parametrize("backend", ["metal", "cuda"])
@pytest.mark.parametrize("kind", sorted(gpu.BODIES))
def test_generated_sources(backend: str, kind: str) -> None:
    ins, outs, body = gpu.source(kind, backend)
    assert "GID" not in body and gpu.GID[backend] in body
    assert body.count("{") == body.count("}")
    names = set(re.findall(r"\b\w+\b", body))
    for n in ins + outs:
        assert n in names, f"{kind}: {n} unused"
    consts = set(re.findall(r"\b[A-Z][A-Z0-9]*\b", body)) - {"GLOBAL", "EXPF"} - set(ins)
    plans = {"matvec": gpu.plan_matvec(8, 4, 32, 1), "gate_up": gpu.plan_gate_up(16, 1, 2, 256, 256),
             "down": gpu.plan_down(10, 1, 2, 256, 256), "scores": gpu.plan_scores(2, 3, 4), "mix": gpu.plan_mix(2, 3, 4)}
    assert consts <= {k for k, _ in plans[kind].template}, consts
    # The shared header selects per target; each target defines what the bodies use.
    for macro in ("GLOBAL", "FN", "EXPF"):
        assert gpu.HEADER.count(f"#define {macro}") == 3


def test_gpu_kernels_refuse_cpu_only_mlx(demo_path) -> None:
    """On this machine (MLX without CUDA) asking for the CUDA kernels is a clear refusal."""
    from ds4agent.engine import EngineError

    with pytest.raises(EngineError, match="cuda kernels need the cuda backend"):
        Engine.open(demo_path, backend="cpu", kernels="cuda")
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
            # Construction compiles the first kernel, so a missing toolchain fails at open.
            with pytest.raises((RuntimeError, ValueError), match="CUDA"):
                gpu.GpuKernels(e._model.w, "cuda")
        with pytest.raises(ValueError, match="no GPU kernels for backend 'tpu'"):
            gpu.GpuKernels(e._model.w, "tpu")


def test_fused_experts_at_flash_dimensions() -> None:
    """The expert kernels at the real shape, on random blocks for 8 experts, against float64
    on gguf's dequantisation."""
    c = flash_experts_case()
    E, F, k = c["E"], c["F"], c["k"]
    mid = run(gpu.plan_gate_up(int(Q.IQ2_XXS), 1, k, F, E),
              [c["gate"].reshape(-1), c["up"].reshape(-1), c["x"], c["sel"].reshape(-1), c["route"].reshape(-1),
               np.array([c["clamp"]], np.float32), GRID, SIGNS])
    y = run(gpu.plan_down(int(Q.Q2_K), 1, k, F, E), [c["down"].reshape(-1), mid, c["sel"].reshape(-1), GRID, SIGNS])
    assert _rel(y[0], c["want"]) <= 1e-4
