"""The Metal/CUDA kernels (engine/kernels/gpu.py), tested without a GPU.

What runs here: each kernel body, compiled by the host C compiler and run over its whole grid
(engine/kernels/gpu_host.py), against float64 products on gguf's own dequantisation and the MLX
reference kernels on the demo model's real tensors; the launch plans (splits, tiles, the expert
plan, grid and output shapes, template constants) and their argument checks; the generated
Metal and CUDA sources. What needs hardware: the launch itself (see README, "What was verified
where").
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


def _matmul(launches: list[gpu.Launch], raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Run a plan_matmul plan on the host: the matmul, then its reduce if it has one."""
    out = run(launches[0], [raw.reshape(-1)] * gpu.MAX_MATRICES + [x, GRID, SIGNS])
    for launch in launches[1:]:
        out = run(launch, [out])
    return out


def _weights(qtype: int, out: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed rows, their float64 values) of a random matrix of ``qtype``."""
    if qtype in (Q.F16, Q.F32):
        w = np.random.default_rng(seed).normal(size=(out, n)).astype(np.float16 if qtype == Q.F16 else np.float32)
        return w.view(np.uint8), w.astype(np.float64)
    raw = random_blocks(qtype, out, n // elements(qtype), seed)
    return raw, oracle(raw, qtype).astype(np.float64)


@pytest.mark.parametrize("name", ["output.weight", "blk.0.attn_q_b.weight", "blk.1.attn_output_a.weight",
                                  "blk.0.hc_attn_fn.weight", "blk.0.ffn_gate_inp.weight"])
@pytest.mark.parametrize("T", [1, 3, 8, 37])
def test_matmul_on_demo_tensors(demo_path, name: str, T: int) -> None:
    """Q8_0 and F16 matrices of the demo model at one token, a partial tile, a whole tile and
    several tiles with a partial last one."""
    with GGUFFile(demo_path) as f:
        t = f.tensors[name]
        raw = np.asarray(f.array(name)).view(np.uint8)
        x = np.random.default_rng(T).normal(size=(T, t.shape[1])).astype(np.float32)
        w = (oracle(raw, t.type) if t.type not in (0, 1) else np.asarray(f.array(name))).reshape(t.shape)
        y = _matmul(gpu.plan_matmul(t.type, t.shape[0], t.shape[1], T), raw, x)
        assert y.shape == (T, t.shape[0])
        assert _rel(y, x @ w.astype(np.float64).T) <= 1e-5


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.MXFP4, Q.Q8_0, Q.F16, Q.F32])
@pytest.mark.parametrize("T", [2, 11])
def test_matmul_every_type_with_row_and_column_ranges(qtype: Q, T: int) -> None:
    """Random blocks (finite scales): a row range starting past row 0 (the grouped output
    projection, an expert split's heads) and a column range of whole blocks (an expert split's
    share of attn_output_b), read in place from the whole matrix."""
    n, out = 1024, 20
    raw, w = _weights(qtype, out, n, 7)
    x = np.random.default_rng(1).normal(size=(T, n)).astype(np.float32)
    y = _matmul(gpu.plan_matmul(qtype, 8, n, T, r0=5), raw, x)
    assert y.shape == (T, 8) and _rel(y, x @ w[5:13].T) <= 1e-5
    be, bb = gpu.BLOCKS[int(qtype)]
    c0, c1 = be, 3 * be  # blocks 1 and 2 of each row
    y = _matmul(gpu.plan_matmul(qtype, out, c1 - c0, T, 0, c0 // be * bb, raw.shape[1]), raw, x[:, c0:c1].copy())
    assert _rel(y, x[:, c0:c1] @ w[:, c0:c1].T) <= 1e-5


@pytest.mark.parametrize("T", [1, 5])
def test_matmul_several_matrices_and_groups(T: int) -> None:
    """Up to six matrices of one type sharing the input in one launch (their outputs side by
    side), and the grouped projection: rows of group g read the g-th slab of each token."""
    n = 512
    mats = [_weights(Q.Q8_0, rows, n, seed) for seed, rows in enumerate((8, 3, 16, 1, 5, 7))]
    x = np.random.default_rng(2).normal(size=(T, n)).astype(np.float32)
    launches = gpu.plan_matmul(int(Q.Q8_0), [m[0].shape[0] for m in mats], n, T)
    out = run(launches[0], [m[0].reshape(-1) for m in mats] + [x, GRID, SIGNS])
    for launch in launches[1:]:
        out = run(launch, [out])
    want = np.concatenate([x @ w.T for _, w in mats], axis=1)
    assert out.shape == want.shape and _rel(out, want) <= 1e-5
    G, R = 4, 6
    raw, w = _weights(Q.Q4_K, G * R, n, 9)
    xg = np.random.default_rng(3).normal(size=(T, G, n)).astype(np.float32)
    y = _matmul(gpu.plan_matmul(int(Q.Q4_K), G * R, n, T, groups=G), raw, xg)
    want = np.concatenate([xg[:, g] @ w[g * R : (g + 1) * R].T for g in range(G)], axis=1)
    assert _rel(y, want) <= 1e-5


@pytest.mark.parametrize("T", [1, 6])
def test_hyper_connection_mix(demo_path, T: int) -> None:
    """The mix weights (pre, post, Sinkhorn comb) and the collapse of the streams equal ops.hc_pre."""
    from ds4agent.engine import ops

    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        w, cfg = e.model.w, e.info.config
        X = np.random.default_rng(T).normal(size=(T, cfg.hc_count, cfg.n_embd)).astype(np.float32)
        mix = np.random.default_rng(T + 1).normal(size=(T, (2 + cfg.hc_count) * cfg.hc_count)).astype(np.float32)
        scale = np.array(w.get("blk.1.hc_ffn_scale.weight"), np.float32)
        base = np.array(w.get("blk.1.hc_ffn_base.weight"), np.float32)
        weights, collapse = gpu.plan_hc(T, cfg.hc_count, cfg.n_embd, cfg.hc_sinkhorn_iters)
        wts = run(weights, [mix, scale, base, np.array([cfg.hc_eps], np.float32)])
        x = run(collapse, [X, wts])
        want = ops.hc_pre(mx.array(X), lambda flat: mx.array(mix), mx.array(scale), mx.array(base), cfg)
        hc = cfg.hc_count
        for got, ref in zip((x, wts[:, hc : 2 * hc], wts[:, 2 * hc :].reshape(T, hc, hc)), want):
            assert _rel(got, np.array(ref)) <= 1e-5


def test_splits_and_tiles() -> None:
    """Few rows are split along the input until the launch has TARGET_THREADS threads (a
    4096-row decode product would otherwise leave a GPU mostly idle), never into empty
    splits; many tokens need no split. Tiles are 1, 2, 4 or 8 tokens."""
    assert gpu.splits(4096, 128) == (16, 8)  # 4096 x 16 = TARGET_THREADS
    assert gpu.splits(3 * 4096, 16) == (6, 3)
    assert gpu.splits(10, 7) == (7, 1)  # at most one split per block
    assert gpu.splits(gpu.TARGET_THREADS, 128) == (1, 128)
    S, ch = gpu.splits(5000, 100)
    assert (S - 1) * ch < 100 <= S * ch
    assert [gpu.tile_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 300)] == [1, 2, 4, 4, 8, 8, 8, 8]
    [mm, red] = gpu.plan_matmul(int(Q.Q8_0), 4096, 4096, 1)
    assert mm.grid == (4096 * 16, 1, 1) and mm.output_shapes == [(4096 * 16,)]
    assert red.kind == "reduce" and red.output_shapes == [(1, 4096)] and red.dims == (4096, 16)
    [mm] = gpu.plan_matmul(int(Q.Q8_0), 129280, 4096, 64)  # the output head at a prefill chunk
    assert mm.grid == (8 * 129280, 1, 1) and dict(mm.template)["TILE"] == 8 and mm.output_shapes == [(64, 129280)]


def test_expert_plan_covers_every_slot_once() -> None:
    rng = np.random.default_rng(0)
    for T, k, n in ((1, 6, 256), (7, 2, 4), (64, 6, 16), (300, 6, 256)):
        sel = np.stack([rng.choice(n, k, replace=False) for _ in range(T)])
        p = gpu.expert_plan(sel, n)
        flat = sel.reshape(-1)
        assert sorted(p.order.tolist()) == list(range(T * k)) and np.array_equal(p.order[p.inv], np.arange(T * k))
        assert np.all(np.diff(flat[p.order]) >= 0)  # sorted by expert
        covered = np.zeros(T * k, int)
        for e, start, count in p.tiles:
            assert 1 <= count <= p.tile and np.all(flat[p.order[start : start + count]] == e)
            covered[start : start + count] += 1
        assert np.all(covered == 1)
        counts = np.bincount(flat)
        assert p.tile == gpu.tile_for(counts.max()) and len(p.tiles) == sum(-(-c // p.tile) for c in counts if c)
    assert gpu.expert_plan(np.array([[3, 1]]), 4).tile == 1  # a decode step: one tile per expert
    with pytest.raises(ValueError, match="out of range 0..3"):
        gpu.expert_plan(np.array([[1, 4]]), 4)
    with pytest.raises(ValueError, match="out of range"):
        gpu.expert_plan(np.array([[-1, 2]]), 4)


def _experts(gu_type, d_type, gate, up, down, x, sel, route, clamp, F, E) -> np.ndarray:
    """The four expert launches of plan_experts, run on the host; gate/up/down are the packed
    tensors (n_expert, rows, row bytes)."""
    plan = gpu.expert_plan(sel, gate.shape[0])
    gu, glu, dn, total = gpu.plan_experts(gu_type, d_type, plan, F, E)
    tiles = plan.tiles.reshape(-1)
    part = run(gu, [gate.reshape(-1), up.reshape(-1), x, tiles, plan.order, GRID, SIGNS])
    mid = run(glu, [part, plan.order, route.reshape(-1).astype(np.float32), np.array([clamp], np.float32)])
    part = run(dn, [down.reshape(-1), mid, tiles, GRID, SIGNS])
    return run(total, [part, plan.inv])


@pytest.mark.parametrize("T", [1, 4, 40])
@pytest.mark.parametrize("layer", [0, 3])
def test_fused_experts_on_demo(demo_path, layer: int, T: int) -> None:
    """gate/up partials, SwiGLU, down partials, the per-token sum (tiles of 1 to 8 of an
    expert's tokens) equal the reference expert FFN; clamping happens."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        f, w = e.file, e.model.w
        p = f"blk.{layer}.ffn_"
        tg, td = f.tensors[p + "gate_exps.weight"], f.tensors[p + "down_exps.weight"]
        n_exp, F, E, k = tg.shape[0], tg.shape[1], tg.shape[2], 2
        rng = np.random.default_rng(layer + T)
        x = (rng.normal(size=(T, E)) * 2).astype(np.float32)
        sel = np.stack([rng.choice(n_exp, size=k, replace=False) for _ in range(T)]).astype(np.int32)
        route = rng.uniform(0.2, 1.0, size=(T, k)).astype(np.float32)
        raw = {kind: np.asarray(f.array(p + kind + "_exps.weight")) for kind in ("gate", "up", "down")}
        y = _experts(tg.type, td.type, raw["gate"], raw["up"], raw["down"], x, sel, route, 0.8, F, E)
        ref = np.array(ReferenceKernels(w).experts(layer, mx.array(x), sel, mx.array(route), 0.8))
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
    [mm] = gpu.plan_matmul(int(Q.Q8_0), 129280, 4096, 1)
    assert mm.grid == (129280, 1, 1) and mm.threadgroup == (256, 1, 1) and mm.output_shapes == [(1, 129280)]
    assert dict(mm.template) == {"QT": 8, "BB": 34, "BE": 32, "SB": 1, "TILE": 1}
    assert mm.dims == (129280, 1, 0, 0, 1, 128, 4096, 4096 // 32 * 34, 4096, 129280, 0, 129280, 0, 0, 0, 0)
    plan = gpu.expert_plan(np.arange(6)[None], 256)
    gu, glu, dn, total = gpu.plan_experts(int(Q.IQ2_XXS), int(Q.Q2_K), plan, 2048, 4096)
    assert dict(gu.template)["RB"] == 16 * 66 and dict(dn.template)["RB"] == 8 * 84
    assert gu.grid[0] == 6 * 2048 * gu.dims[1] and gu.output_shapes == [(6 * 2048 * 2 * gu.dims[1],)]
    assert glu.output_shapes == [(6, 2048)] and total.output_shapes == [(1, 4096)] and total.dims[1] == dn.dims[1]
    assert gpu.plan_scores(64, 3, 512).threadgroup == (192, 1, 1)  # never more threads than outputs
    with pytest.raises(ValueError, match="no GPU kernel"):
        gpu.plan_matmul(int(Q.BF16), 10, 64, 1)
    with pytest.raises(ValueError, match="whole number"):
        gpu.plan_matmul(int(Q.Q2_K), 10, 300, 1)
    with pytest.raises(ValueError, match="at least one token"):
        gpu.plan_matmul(int(Q.Q8_0), 10, 64, 0)
    with pytest.raises(ValueError, match="32-bit grid"):
        gpu.plan_scores(64, 2**27, 512)
    with pytest.raises(ValueError, match="takes 9 inputs"):
        c_source("matmul", [], [np.float32])
    with pytest.raises(ValueError, match="1..6 matrices"):
        gpu.plan_matmul(int(Q.Q8_0), [4] * 7, 64, 1)
    with pytest.raises(ValueError, match="only for one"):
        gpu.plan_matmul(int(Q.Q8_0), [4, 4], 64, 1, r0=2)
    with pytest.raises(ValueError, match="do not split into 3 groups"):
        gpu.plan_matmul(int(Q.Q8_0), 8, 64, 1, groups=3)


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
    plan = gpu.expert_plan(np.array([[0, 1]]), 2)
    experts = dict(zip(("moe_gate_up", "moe_glu", "moe_down", "moe_sum"), gpu.plan_experts(16, 10, plan, 256, 256)))
    hc = dict(zip(("hc_weights", "hc_collapse"), gpu.plan_hc(2, 4, 256, 20)))
    plans = {"matmul": gpu.plan_matmul(8, 4, 32, 1)[0], "reduce": gpu.plan_matmul(8, 4, 4096, 1)[1],
             "scores": gpu.plan_scores(2, 3, 4), "mix": gpu.plan_mix(2, 3, 4), **experts, **hc}
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
                gpu.GpuKernels(e.model.w, "cuda")
        with pytest.raises(ValueError, match="no GPU kernels for backend 'tpu'"):
            gpu.GpuKernels(e.model.w, "tpu")


@pytest.mark.parametrize("T", [1, 9])
def test_fused_experts_at_flash_dimensions(T: int) -> None:
    """The expert kernels at the real shape (hidden 4096, expert width 2048, IQ2_XXS gate/up,
    Q2_K down) on random blocks for 8 experts, against float64 on gguf's dequantisation: one
    token, and the same token 9 times (tiles of 8 and 1 of each chosen expert)."""
    c = flash_experts_case()
    E, F = c["E"], c["F"]
    x, sel, route = (np.repeat(c[key], T, axis=0) for key in ("x", "sel", "route"))
    y = _experts(int(Q.IQ2_XXS), int(Q.Q2_K), c["gate"].reshape(8, F, -1), c["up"].reshape(8, F, -1),
                 c["down"].reshape(8, E, -1), x, sel, route, c["clamp"], F, E)
    for t in range(T):
        assert _rel(y[t], c["want"]) <= 1e-4
