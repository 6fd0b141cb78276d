"""The native CPU kernels (engine/kernels/cpu.c) against gguf and the MLX reference kernels.

Dequantisation must be bit-exact with gguf.quants.dequantize; products agree with float64
products of the same dequantised weights to float32 rounding; the fused expert FFN and the
attention agree with the reference implementations; and a whole model run on either kernel
set gives the same logits (to 1e-4) and the same greedy tokens.
"""

from __future__ import annotations

import os
import platform

import mlx.core as mx
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize as oracle
from helpers import elements
from helpers import quantize_act_np as _quantize_np
from helpers import random_blocks as _blocks
from helpers import same_bits as _same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.kernels import cpu
from ds4agent.engine.kernels.reference import ReferenceKernels, attend_mx
from ds4agent.modelfile.gguf import GGUFFile

QUANT = [Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS]
FLOAT_ONLY = [Q.MXFP4]  # no integer path: the products take float activations


@pytest.mark.parametrize("qtype", QUANT + FLOAT_ONLY)
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), blocks=st.integers(1, 4), seed=st.integers(0, 2**32 - 1), finite=st.booleans())
def test_dequant_bit_exact_random_blocks(qtype: Q, rows: int, blocks: int, seed: int, finite: bool) -> None:
    """Random bytes, including NaN/inf/subnormal f16 scales half of the time."""
    raw = _blocks(qtype, rows, blocks, seed, finite)
    with np.errstate(all="ignore"):
        ref = oracle(raw, qtype)
    assert _same_bits(cpu.dequant(raw, qtype, blocks * elements(qtype)), ref)


def test_dequant_plain_types_and_every_half() -> None:
    every = np.arange(65536, dtype=np.uint16).view(np.float16)  # subnormals, inf, NaN payloads
    got = cpu.dequant(every.view(np.uint8).reshape(1, -1), Q.F16, 65536)[0]
    with np.errstate(all="ignore"):
        ref = every.astype(np.float32)
    finite = np.isfinite(ref)
    assert _same_bits(got[finite], ref[finite])
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    x = np.random.default_rng(1).normal(size=(3, 40)).astype(np.float32)
    assert _same_bits(cpu.dequant(x.view(np.uint8), Q.F32, 40), x)
    with pytest.raises(ValueError, match="type 6"):
        cpu.dequant(np.zeros((1, 22), np.uint8), 6, 32)


@pytest.mark.parametrize("qtype", QUANT + FLOAT_ONLY + [Q.F16, Q.F32])
@pytest.mark.parametrize("T", [1, 2, 5, 19])
def test_matmul_matches_float64(qtype: Q, T: int) -> None:
    """Row counts that are not a multiple of the row block; one token and batches."""
    rng = np.random.default_rng(T)
    n = 512 if qtype not in (Q.F16, Q.F32) else 72
    out = 37
    if qtype == Q.F16:
        raw = rng.normal(size=(out, n)).astype(np.float16).view(np.uint8)
    elif qtype == Q.F32:
        raw = rng.normal(size=(out, n)).astype(np.float32).view(np.uint8)
    else:
        raw = _blocks(qtype, out, n // elements(qtype), T)
    w = oracle(raw, qtype).astype(np.float64).reshape(out, n)
    x = rng.normal(size=(T, n)).astype(np.float32)
    y = cpu.matmul_raw(raw, qtype, n, x, int8=False)  # the float path (the integer path: below)
    ref = x.astype(np.float64) @ w.T
    assert y.shape == (T, out) and y.dtype == np.float32
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(x).max() * np.abs(w).sum(axis=1).max()


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 4), nb=st.integers(1, 8), seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 300.0]))
def test_activation_quantisation(T: int, nb: int, seed: int, scale: float) -> None:
    x = (np.random.default_rng(seed).normal(size=(T, 32 * nb)) * scale).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block has scale 0
    got = cpu.quantize_act(x)
    d, q = _quantize_np(x)
    assert _same_bits(got["d"], d) and np.array_equal(got["q"], q)
    assert np.array_equal(got["s"][..., 0], q[..., :16].sum(-1, dtype=np.int32))
    assert np.array_equal(got["s"][..., 1], q[..., 16:].sum(-1, dtype=np.int32))
    sums = np.stack([q[..., :16].sum(-1), q[..., 16:].sum(-1)], -1).astype(np.float32) * d[..., None]
    assert _same_bits(got["ds"], np.repeat(sums, 4, axis=-1))


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 3), nb=st.integers(1, 3), seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 300.0]))
def test_activation_quantisation_per_256(T: int, nb: int, seed: int, scale: float) -> None:
    x = (np.random.default_rng(seed).normal(size=(T, 256 * nb)) * scale).astype(np.float32)
    x[0, :256] = 0.0
    got = cpu.quantize_k(x)
    d, q = _quantize_np(x, 256)
    assert _same_bits(got["d"], d) and np.array_equal(got["q"], q)
    assert np.array_equal(got["bsum"], q.reshape(T, nb, 16, 16).sum(-1, dtype=np.int32))


def _activation_block(qtype: Q, T: int) -> int:
    """The rounding grain the integer path applies: per 256 for the expert formats below 16
    tokens (see cpu.c), per 32 otherwise."""
    return 256 if qtype in (Q.IQ2_XXS, Q.Q2_K) and T < 16 else 32


@pytest.mark.skipif(not cpu.int8_available(), reason="no integer path on this CPU (needs AVX2)")
@pytest.mark.parametrize("qtype", QUANT)
@pytest.mark.parametrize("T", [1, 2, 3, 4, 8, 9, 15, 16, 17])
def test_integer_path_is_the_product_with_rounded_activations(qtype: Q, T: int) -> None:
    """The integer kernels compute exactly Σ w·x̂ (x̂ = the quantised activations): checked
    against float64 to float32 accumulation error, which is far below the rounding of x."""
    rng = np.random.default_rng(T + 10 * int(qtype))
    n, out = 1024, 45
    raw = _blocks(qtype, out, n // elements(qtype), T)
    w = oracle(raw, qtype).astype(np.float64).reshape(out, n)
    x = (rng.normal(size=(T, n)) * rng.uniform(0.1, 10, size=(T, 1))).astype(np.float32)
    d, q = _quantize_np(x, _activation_block(qtype, T))
    xhat = (d[..., None].astype(np.float64) * q).reshape(T, n)
    y = cpu.matmul_raw(raw, qtype, n, x, int8=True)
    scale = (np.abs(xhat) @ np.abs(w).T).max()
    assert np.abs(y - xhat @ w.T).max() <= 2e-6 * scale
    # and it is a different (rounded) product from the float path, close to it
    exact = cpu.matmul_raw(raw, qtype, n, x, int8=False)
    assert np.abs(y - exact).max() <= 2e-2 * scale


def _q8_0_batch(T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q8_0 product of T tokens with 37 rows (a partial row tile; 33 tokens: a partial token
    tile): (raw rows, activations, the float64 product with the rounded activations)."""
    n, out = 2048, 37
    raw = _blocks(Q.Q8_0, out, n // 32, T)
    w = oracle(raw, Q.Q8_0).astype(np.float64).reshape(out, n)
    x = np.random.default_rng(T).normal(size=(T, n)).astype(np.float32)
    d, q = _quantize_np(x)
    return raw, x, (d[..., None].astype(np.float64) * q).reshape(T, n) @ w.T


@pytest.mark.parametrize("T", [16, 33])
def test_q8_0_on_avx512_vnni_and_on_decoded_rows(T: int) -> None:
    """Where the build has AVX-512 VNNI, Q8_0 products of 16 tokens and more multiply token
    tiles by weights broadcast from the file; both it and the decoded-row kernels compute
    Σ w·x̂."""
    if not cpu.int8_available() or not cpu.set_vnni512(True):
        pytest.skip("no AVX-512 VNNI in this build")
    raw, x, want = _q8_0_batch(T)
    amx = cpu.set_amx(False)
    try:
        wide = cpu.matmul_raw(raw, Q.Q8_0, 2048, x)
        cpu.set_vnni512(False)
        rows = cpu.matmul_raw(raw, Q.Q8_0, 2048, x)
    finally:
        cpu.set_vnni512(True)
        cpu.set_amx(amx)
    scale = np.abs(want).max()
    for y in (wide, rows):
        assert np.abs(y - want).max() <= 2e-6 * scale
    assert not np.array_equal(wide, rows)  # two different summation orders: both really ran


@pytest.mark.parametrize("T", [16, 33])
def test_q8_0_on_amx_tiles_and_on_vectors(T: int) -> None:
    """Where the CPU has AMX (and Linux grants it), Q8_0 products of 16 tokens and more run on
    tiles. They compute Σ w·x̂ with the same int32 block sums, scaled in the same order, as
    the AVX-512 VNNI kernel: the same bits; the decoded-row kernels differ in order."""
    if not cpu.int8_available() or not cpu.set_amx(True):
        pytest.skip("no AMX tiles on this machine")
    raw, x, want = _q8_0_batch(T)
    try:
        tiles = cpu.matmul_raw(raw, Q.Q8_0, 2048, x)
        cpu.set_amx(False)
        vnni = cpu.set_vnni512(True)
        vectors = cpu.matmul_raw(raw, Q.Q8_0, 2048, x)
        cpu.set_vnni512(False)
        rows = cpu.matmul_raw(raw, Q.Q8_0, 2048, x)
    finally:
        cpu.set_vnni512(True)
        cpu.set_amx(True)
    scale = np.abs(want).max()
    for y in (tiles, vectors, rows):
        assert np.abs(y - want).max() <= 2e-6 * scale
    if vnni:
        assert _same_bits(tiles, vectors)
    assert not np.array_equal(tiles, rows)


@pytest.mark.skipif(not cpu.int8_available(), reason="no integer path on this CPU (needs AVX2)")
@pytest.mark.parametrize("qtype", [Q.IQ2_XXS, Q.Q2_K])
def test_expert_formats_few_tokens_do_not_depend_on_the_batch(qtype: Q) -> None:
    """Below 16 tokens IQ2_XXS and Q2_K rows are decoded in registers for up to eight tokens
    at a time, each token's sum formed by the one-token kernel's code: a token's products are
    the same bits whether it comes alone or with up to 15 others (an expert's share of a
    prefill chunk varies)."""
    n, out = 1024, 37
    raw = _blocks(qtype, out, n // 256, 5)
    x = np.random.default_rng(5).normal(size=(15, n)).astype(np.float32)
    alone = np.concatenate([cpu.matmul_raw(raw, qtype, n, x[t : t + 1]) for t in range(15)])
    for T in (2, 3, 4, 5, 6, 7, 8, 9, 12, 15):
        assert np.array_equal(cpu.matmul_raw(raw, qtype, n, x[:T]), alone[:T]), T


def test_demo_tensors_through_matmul(demo_path) -> None:
    """Every weight matrix type of the demo through the kernel equals the MLX reference's product."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        ref = ReferenceKernels(e.model.w)
        ours = cpu.CpuKernels(e.model.w, exact=True)  # float activations: equal to rounding
        x = mx.array(np.random.default_rng(0).normal(size=(3, 256)).astype(np.float32))
        for name in ("blk.0.attn_q_a.weight", "blk.2.attn_kv.weight", "blk.2.attn_compressor_kv.weight",
                     "blk.2.indexer.proj.weight", "blk.3.ffn_gate_inp.weight", "output.weight"):
            a, b = np.array(ours.linear(x, name)), np.array(ref.linear(x, name))
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), name
        # a row range, and the grouped output projection built on it
        xo = mx.array(np.random.default_rng(1).normal(size=(2, 512)).astype(np.float32))
        a = np.array(ours.linear(xo, "blk.1.attn_output_a.weight", (128, 256)))
        b = np.array(ref.linear(xo, "blk.1.attn_output_a.weight", (128, 256)))
        assert a.shape == (2, 128) and np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
        cfg = e.info.config
        for T in (1, 5):
            xg = mx.array(np.random.default_rng(T).normal(size=(T, cfg.n_out_group, 512)).astype(np.float32))
            a = np.array(ours.grouped(xg, "blk.1.attn_output_a.weight"))
            b = np.array(ref.grouped(xg, "blk.1.attn_output_a.weight"))
            assert a.shape == (T, cfg.n_out_group * cfg.o_lora_rank)
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
            c = np.array(cpu.CpuKernels(e.model.w).grouped(xg, "blk.1.attn_output_a.weight"))  # 8-bit path
            assert np.abs(c - b).max() <= 2e-2 * np.abs(b).max()


@pytest.mark.parametrize("T", [1, 5])
def test_linears_equal_separate_products(demo_path, T: int) -> None:
    """One call for several matrices of one input (mixed Q8_0, F16 and F32, with and without
    the 8-bit path) gives each product exactly as its own call would."""
    names = ("blk.2.attn_q_a.weight", "blk.2.attn_kv.weight", "blk.2.attn_compressor_kv.weight",
             "blk.2.indexer.proj.weight", "blk.2.ffn_gate_inp.weight")
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        types = {e.model.w.file.tensors[n].type for n in names}
        assert {Q.Q8_0, Q.F16} <= types
        x = np.random.default_rng(T).normal(size=(T, 256)).astype(np.float32)
        for exact in (True, False):
            k = cpu.CpuKernels(e.model.w, exact=exact)
            many = k.linears(x, names)
            for name, y in zip(names, many):
                assert y.shape == (T, e.model.w.file.tensors[name].shape[0])
                assert np.array_equal(y, k.linear(x, name)), name
            assert [np.array(a).tolist() for a in ReferenceKernels(e.model.w).linears(mx.array(x), names[:2])] == \
                   [np.array(ReferenceKernels(e.model.w).linear(mx.array(x), n)).tolist() for n in names[:2]]
        with pytest.raises(ValueError, match="different input widths"):
            k.linears(x, ("blk.2.attn_q_a.weight", "blk.2.attn_q_b.weight"))


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("T", [1, 7, 64])
def test_fused_experts_match_reference(demo_path, T: int, exact: bool) -> None:
    """Gather, dequantise, gate/up, clamped SwiGLU with routing weights, down, sum: one call
    equals the reference's expert-by-expert MLX ops; tokens may share experts. With 8-bit
    activations (the default cpu kernels) the bound is the activation rounding's: below 16
    tokens per expert one scale covers 256 values (a step of max|x|/254 over the whole row
    here), which measured up to 2.8% of the largest output over 24 draws (per-32 scales: 1.9%)."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        w = e.model.w
        rng = np.random.default_rng(T)
        x = mx.array(rng.normal(size=(T, 256)).astype(np.float32) * 3)
        sel = np.stack([rng.choice(16, size=2, replace=False) for _ in range(T)]).astype(np.int64)
        weights = mx.array(rng.uniform(0.1, 1.0, size=(T, 2)).astype(np.float32))
        for layer in (0, 3):
            a = np.array(cpu.CpuKernels(w, exact=exact).experts(layer, x, sel, weights, 10.0))
            b = np.array(ReferenceKernels(w).experts(layer, x, sel, weights, 10.0))
            err = np.abs(a - b).max() / np.abs(b).max()
            assert err <= (1e-5 if exact or not cpu.int8_available() else 4e-2), err
            if not exact and cpu.int8_available():
                assert err > 1e-6  # the integer path really ran


def test_fused_experts_clamp_is_applied(demo_path) -> None:
    """A small clamp changes the result exactly as the reference's clamped SwiGLU does."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        w = e.model.w
        x = mx.array(np.random.default_rng(2).normal(size=(4, 256)).astype(np.float32) * 50)
        sel = np.array([[0, 1], [2, 3], [0, 5], [7, 1]])
        weights = mx.ones((4, 2))
        loose, tight = (np.array(cpu.CpuKernels(w, exact=True).experts(1, x, sel, weights, c)) for c in (1e4, 0.05))
        ref = np.array(ReferenceKernels(w).experts(1, x, sel, weights, 0.05))
        assert not np.allclose(loose, tight)
        assert np.abs(tight - ref).max() <= 1e-5 * np.abs(ref).max()


def test_experts_bad_ids_are_refused(demo_path) -> None:
    with GGUFFile(demo_path) as f:
        gate, up, down = (f.array(f"blk.0.ffn_{k}_exps.weight") for k in ("gate", "up", "down"))
        x = np.zeros((1, 256), np.float32)
        with pytest.raises(ValueError, match="out of range"):
            cpu.moe_raw(x, np.array([[0, 16]]), np.ones((1, 2)), gate, up, Q.IQ2_XXS, down, Q.Q2_K, 10.0)


@pytest.mark.parametrize("H,D,T,N,banded", [(4, 64, 1, 40, False), (4, 64, 9, 80, False), (4, 64, 64, 300, False),
                                            (6, 64, 150, 300, False), (4, 64, 200, 260, True), (64, 512, 1, 700, False),
                                            (7, 96, 3, 5, False)])
def test_attention_matches_reference(H: int, D: int, T: int, N: int, banded: bool) -> None:
    """Random masks, and a prefill-like one (a sliding window of 32 over earlier rows and the
    batch, plus 20 compressed rows visible from some point on); Flash's decode shape (64 heads
    of 512 over 700 rows); head counts that are not a multiple of four; a query that sees
    nothing but its sink (all-zero output, as the reference gives)."""
    rng = np.random.default_rng(N)
    q = (rng.normal(size=(H, T, D)) * 3).astype(np.float32)
    keys = rng.normal(size=(N, D)).astype(np.float32)
    if banded:
        raw = N - T - 20
        kpos = np.arange(-raw, T)
        qpos = np.arange(T)
        mask = np.concatenate([(kpos[None] <= qpos[:, None]) & (kpos[None] > qpos[:, None] - 32),
                               np.arange(20)[None] < (qpos[:, None] // 10)], axis=1)
    else:
        mask = rng.random((T, N)) < 0.5
    mask[:, 0] = True
    if T > 2:
        mask[1] = False
    sinks = rng.normal(size=H).astype(np.float32)
    a = cpu.attend(q, keys, mask, sinks)
    b = np.array(attend_mx(mx.array(q), mx.array(keys), mask, mx.array(sinks)))
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    if T > 2:
        assert not a[:, 1].any() and not b[:, 1].any()


def test_attention_exp_accuracy() -> None:
    """ds4_attend's vectorised exp, over score gaps from 0 to -80 and at the underflow edge.

    Identity keys make output d the softmax weight of row d, so output d over output 0 is
    e^(s_d - s_0) with s the float32 scores the kernel forms: within 4 ulp of float64's exp.
    Gaps beyond -87 come out exactly 0 (float32's e^x is subnormal or 0 there anyway)."""
    gaps = -np.concatenate([np.linspace(0, 80, 3001), [87.5, 88.0, 103.0]]).astype(np.float32)
    N = gaps.size
    keys = np.eye(N, dtype=np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(N))
    q = (gaps / scale).astype(np.float32).reshape(1, 1, N)
    got = cpu.attend(q, keys, np.ones((1, N), bool), np.array([-1e4], np.float32))[0, 0]
    s = q[0, 0] * scale  # the kernel's float32 scores
    ratio = got[:-3].astype(np.float64) / np.float64(got[0])
    want = np.exp((s[:-3] - s[0]).astype(np.float64))
    assert np.all(np.abs(ratio - want) <= 4 * 2.0**-23 * want)
    assert not got[-3:].any()


def test_model_cpu_exact_kernels_equal_reference(demo_path) -> None:
    """Float activations throughout (``cpu-exact``). Prefill (chunks of 64 over ratio-4, ratio-128 and indexer selection), then greedy decode:
    same logits to 1e-4 of their range, same tokens.

    Run with the FP8 KV simulation off: the kernels never touch it (it is the same MLX code on
    both sides), and with it on a one-ulp difference in summation order can move a cached value
    across an FP8 step (1/16 of its magnitude), after which this random model's greedy text
    diverges; that says nothing about the kernels."""
    ids = np.random.default_rng(4).integers(0, 128000, 300).tolist()
    runs = {}
    for k in ("reference", "cpu-exact"):
        with Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=False, kernels=k) as e:
            s = e.session()
            s.prefill_chunk = 64
            s.sync(ids)
            first = np.array(s.logits)
            toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=12, stop_at_eos=False)]
            runs[k] = (first, toks, np.array(s.logits))
    (ra, ta, la), (rb, tb, lb) = runs["reference"], runs["cpu-exact"]
    assert np.abs(ra - rb).max() <= 1e-4 * np.abs(ra).max()
    assert ta == tb
    assert np.abs(la - lb).max() <= 1e-4 * np.abs(la).max()


@pytest.mark.skipif(not cpu.int8_available(), reason="no integer path on this CPU (needs AVX2)")
def test_integer_path_error_in_a_real_decode(demo_path) -> None:
    """Every decode product of the default ``cpu`` kernels, fed the activations a real decode
    produces, stays within 2% of the float product of the same input (8-bit rounding of a
    256-wide row; on Flash's 4096-wide rows it is smaller still).

    Model-level logits are not compared here: this random demo model amplifies any
    perturbation about thirty-fold per forward pass (float32 reordering alone moves its
    logits by 3e-6), so they would measure the model, not the kernels."""
    with Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=False, kernels="cpu") as e:
        k = e.model.k
        assert k.int8
        exact = cpu.CpuKernels(e.model.w, exact=True)
        seen: dict[str, float] = {}
        inner, inner_many = k.linear, k.linears

        def note(name, fast, ref):
            seen[name] = max(seen.get(name, 0.0), float(np.abs(fast - ref).max() / np.abs(ref).max()))

        def both(x, name, rows=None):
            fast = inner(x, name, rows)
            note(name, fast, exact.linear(x, name, rows))
            return fast

        def both_many(x, names):
            fast = inner_many(x, names)
            for name, f in zip(names, fast):
                note(name, f, exact.linear(x, name))
            return fast

        k.linear, k.linears = both, both_many
        s = e.session()
        s.sync([5, 6, 7])
        for tok in np.random.default_rng(3).integers(0, 128000, 40).tolist():
            s.eval(tok)
        quantised = {n for n in seen if e.model.w.file.tensors[n].type not in (Q.F16, Q.F32)}
        assert {"output.weight", "blk.0.attn_q_b.weight", "blk.5.ffn_down_shexp.weight"} <= quantised
        assert max(seen[n] for n in quantised) <= 2e-2
        assert min(seen[n] for n in quantised) > 0  # the rounding is real, so the path ran


def test_kernel_selection(demo_path, monkeypatch) -> None:
    from ds4agent.engine import EngineError
    from ds4agent.engine.kernels import cpu_build

    with Engine.open(demo_path, backend="cpu") as e:
        assert e.info.kernels == "cpu" and e.info.kernel_note is None
    monkeypatch.setenv("DS4_KERNELS", "reference")
    with Engine.open(demo_path, backend="cpu") as e:
        assert e.info.kernels == "reference"
    monkeypatch.delenv("DS4_KERNELS")
    with pytest.raises(EngineError, match="unknown kernels 'fast'"):
        Engine.open(demo_path, backend="cpu", kernels="fast")
    with pytest.raises(EngineError, match="metal kernels need the metal backend"):
        Engine.open(demo_path, backend="cpu", kernels="metal")
    # No compiler: auto falls back to the reference with a note; asking for cpu is an error.
    monkeypatch.setattr(cpu, "_lib", None)
    monkeypatch.setattr(cpu_build, "compiler", lambda: None)
    with Engine.open(demo_path, backend="cpu") as e:
        assert e.info.kernels == "reference" and "no C compiler" in e.info.kernel_note
    with pytest.raises(EngineError, match="cpu kernels unavailable: no C compiler"):
        Engine.open(demo_path, backend="cpu", kernels="cpu")


def test_build_is_cached_per_machine(tmp_path, monkeypatch) -> None:
    """The library is compiled once into the ds4agent home and reused; a corrupt cache entry
    (another machine's build) is keyed differently because the CPU identity is in the key."""
    from ds4agent.engine.kernels import cpu_build

    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    lib = cpu_build.build()
    built = list((tmp_path / "kernels").glob("cpu-*.so"))
    assert len(built) == 1 and lib is not None
    stamp = built[0].stat().st_mtime_ns
    cpu_build.build()
    assert built[0].stat().st_mtime_ns == stamp
    monkeypatch.setattr(cpu_build, "cpu_identity", lambda: "another cpu")
    cpu_build.build()
    assert len(list((tmp_path / "kernels").glob("cpu-*.so"))) == 2


def test_cli_kernel_choices_match_the_engine() -> None:
    """--kernels (of every command that opens an engine, and of inspect) offers exactly what the
    engine's kernel selection takes (engine/choices.py, read by the CLI without MLX)."""
    from ds4agent import cli
    from ds4agent.engine.kernels import CHOICES

    subs = cli.build_parser()._subparsers._group_actions[0].choices
    for name in ("chat", "agent", "bench", "serve", "inspect"):
        flag = next(a for a in subs[name]._actions if "--kernels" in a.option_strings)
        assert tuple(flag.choices) == CHOICES, name


def test_cli_flag_and_note(demo_path, capsys, monkeypatch) -> None:
    from ds4agent import cli
    from ds4agent.engine.kernels import cpu_build

    rc = cli.main(["-m", str(demo_path), "-p", "hi", "--nothink", "-n", "2", "--temp", "0", "--kernels", "reference"])
    assert rc == 0 and "note" not in capsys.readouterr().err
    monkeypatch.setattr(cpu, "_lib", None)
    monkeypatch.setattr(cpu_build, "compiler", lambda: None)
    rc = cli.main(["-m", str(demo_path), "-p", "hi", "--nothink", "-n", "2", "--temp", "0"])
    err = capsys.readouterr().err
    assert rc == 0 and "ds4: note: cpu kernels unavailable (no C compiler" in err
    rc = cli.main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--kernels", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0 and "cpu kernels unavailable: no C compiler" in err and "Traceback" not in err


@pytest.mark.parametrize("exact", [True, False])
def test_fused_experts_at_flash_dimensions(exact: bool) -> None:
    """The CPU expert FFN at the real shape (hidden 4096, expert width 2048, 6 of 16 experts,
    IQ2_XXS gate/up, Q2_K down; 3 tokens sharing some experts) against float64 on gguf's
    dequantisation. With 8-bit activations the float64 reference rounds the activations the
    same way (x before gate/up, the SwiGLU output before down; one scale per 256 values, as
    every expert here has fewer than 16 tokens), so the bound stays tight."""
    E, F, n_exp, k, T = 4096, 2048, 16, 6, 3
    gate = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 1).reshape(n_exp, F, -1)
    up = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 2).reshape(n_exp, F, -1)
    down = _blocks(Q.Q2_K, n_exp * E, F // 256, 3).reshape(n_exp, E, -1)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(T, E)).astype(np.float32)
    sel = np.stack([rng.choice(8, size=k, replace=False) for _ in range(T)]).astype(np.int32)
    route = rng.uniform(0.1, 1.0, size=(T, k)).astype(np.float32)
    y = cpu.moe_raw(x, sel, route, gate, up, Q.IQ2_XXS, down, Q.Q2_K, 7.0, int8=not exact)
    rounded = not exact and cpu.int8_available()

    def act(v: np.ndarray) -> np.ndarray:
        if not rounded:
            return v.astype(np.float64)
        d, q = _quantize_np(v.astype(np.float32)[None], 256)
        return (d[..., None].astype(np.float64) * q).reshape(-1)

    ref = np.zeros((T, E))
    deq = {}
    for t in range(T):
        for j, e in enumerate(sel[t]):
            if e not in deq:
                deq[e] = [oracle(m[e], qt).astype(np.float64) for m, qt in ((gate, Q.IQ2_XXS), (up, Q.IQ2_XXS), (down, Q.Q2_K))]
            g, u = deq[e][0] @ act(x[t]), deq[e][1] @ act(x[t])
            g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
            ref[t] += deq[e][2] @ act(g / (1 + np.exp(-g)) * u * route[t, j])
    err = np.abs(y - ref).max() / np.abs(ref).max()
    assert err <= (1e-5 if not rounded else 1e-3), err


@pytest.mark.parametrize("exact", [False, True])
def test_experts_same_bits_for_any_thread_count_and_either_split(exact: bool) -> None:
    """With fewer chosen experts than four per core (decode), every core takes a share of the
    rows of every expert; with more, whole experts. Either way each output adds its experts'
    outputs in ascending expert order: the same bits for any number of cores and for both
    splits. Flash dimensions, IQ2_XXS gate/up and Q2_K down."""
    E, F, n_exp, k = 4096, 2048, 12, 6
    gate = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 11).reshape(n_exp, F, -1)
    up = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 12).reshape(n_exp, F, -1)
    down = _blocks(Q.Q2_K, n_exp * E, F // 256, 13).reshape(n_exp, E, -1)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, E)).astype(np.float32)
    sel = np.stack([rng.permutation(n_exp)[:k] for _ in range(2)]).astype(np.int32)  # 8 to 12 experts chosen
    route = rng.uniform(0.1, 1.0, size=(2, k)).astype(np.float32)
    n_chosen = len(set(sel.ravel().tolist()))
    before = cpu.threads()
    try:
        results = {}
        for threads in (1, 2, 3, 4, 5):
            cpu.set_threads(threads)
            results[threads] = cpu.moe_raw(x, sel, route, gate, up, Q.IQ2_XXS, down, Q.Q2_K, 7.0, int8=not exact)
    finally:
        cpu.set_threads(before)
    by_rows = [t for t in results if n_chosen < 4 * t]
    by_expert = [t for t in results if n_chosen >= 4 * t]
    assert len(by_rows) >= 2 and by_expert
    for t in list(results)[1:]:
        assert _same_bits(results[t], results[1]), t


def test_build_survives_a_damaged_cache_and_remembers_failures(tmp_path, monkeypatch, capsys) -> None:
    from ds4agent.engine.kernels import cpu_build

    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    cpu_build.build()
    assert "building the CPU kernels" in capsys.readouterr().err
    so = next((tmp_path / "kernels").glob("cpu-*.so"))
    # Damage it by replacing the file, never by writing into it: this process has the library
    # mapped, and truncating a mapped file makes its next page fault a SIGBUS.
    bad = so.with_name("damaged.tmp")
    bad.write_bytes(b"not a library")
    os.replace(bad, so)
    # In a fresh process (this one keeps the library it loaded): the damaged file is rebuilt.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "from ds4agent.engine.kernels import cpu; print(cpu.threads())"],
                       capture_output=True, text=True, env={**os.environ, "DS4_HOME": str(tmp_path)})
    assert r.returncode == 0 and "building the CPU kernels" in r.stderr, r.stderr
    assert so.stat().st_size > 1000
    # A flag set the compiler refuses is remembered, and the next set is used.
    monkeypatch.setattr(cpu_build, "BASE_FLAGS", cpu_build.BASE_FLAGS + ["-fno-such-flag-at-all"])
    with pytest.raises(cpu_build.BuildError, match="could not build"):
        cpu_build.build()
    assert len(list((tmp_path / "kernels").glob("*.failed"))) == 2
    calls = []
    monkeypatch.setattr(cpu_build, "compile_shared", lambda *a: calls.append(a))
    with pytest.raises(cpu_build.BuildError):
        cpu_build.build()
    assert calls == []  # remembered: no compiler run


def test_the_build_key_covers_every_part_of_the_source() -> None:
    """cpu.c includes its parts (one translation unit): every cpu*.c beside it is one of them, so
    a change to any part makes a new build rather than loading a stale library."""
    from ds4agent.engine.kernels import cpu_build

    assert {p.name for p in cpu_build.sources()} == {p.name for p in cpu_build.SOURCE.parent.glob("cpu*.c")}
    assert len(cpu_build.sources()) > 1


def test_unusable_cache_is_one_clear_error(tmp_path, monkeypatch) -> None:
    """A home whose kernels folder cannot be made (here: a file is in the way, which stops
    root too): one BuildError, so the engine falls back with a note."""
    from ds4agent.engine.kernels import cpu_build

    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "kernels").write_text("a file, not a folder")
    monkeypatch.setenv("DS4_HOME", str(tmp_path / "home"))
    with pytest.raises(cpu_build.BuildError, match="could not build the CPU kernels"):
        cpu_build.build()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction-set variants")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])
def test_other_x86_builds_agree(tmp_path, march: str) -> None:
    """cpu.c has per-instruction-set branches; -march=native runs only one of them here. Build
    it for AVX2 without AVX-512 (x86-64-v3) and for plain SSE2 (x86-64) and check those paths:
    float products against float64, and the AVX2 integer path against this machine's: the
    same bits for the expert formats below 16 tokens, whose AVX-512 kernels form the AVX2
    kernels' exact integer sums (see cpu.c)."""
    import ctypes

    from ds4agent.engine.kernels import cpu_build
    from ds4agent.engine.quants import iq2xxs_tables

    flags = [f"-march={march}" if f == "-march=native" else f for f in cpu_build.BASE_FLAGS] + ["-fopenmp"]
    out = tmp_path / f"cpu-{march}.so"
    cpu_build.compile_shared(cpu_build.compiler(), flags, cpu_build.SOURCE, out)
    lib = ctypes.CDLL(str(out))
    P, I = ctypes.c_void_p, ctypes.c_int64
    lib.ds4_matmul.argtypes = [P, ctypes.c_int, I, I, I, P, I, P, ctypes.c_int, ctypes.c_int]
    lib.ds4_set_iq2_tables.argtypes = [P, P]
    grid, signs = iq2xxs_tables()
    lib.ds4_set_iq2_tables(grid.ctypes.data, signs.ctypes.data)
    assert lib.ds4_int8_available() == (march == "x86-64-v3")
    rng = np.random.default_rng(0)
    for qtype in QUANT + [Q.F16, Q.F32]:
        n, rows = 512, 21
        if qtype in (Q.F16, Q.F32):
            raw = rng.normal(size=(rows, n)).astype(np.float16 if qtype == Q.F16 else np.float32).view(np.uint8)
        else:
            raw = _blocks(qtype, rows, n // elements(qtype), 3)
        w = oracle(raw, qtype).astype(np.float64).reshape(rows, n)
        for T in (1, 5, 9):
            x = rng.normal(size=(T, n)).astype(np.float32)
            for int8 in (0, 1):
                y = np.empty((T, rows), np.float32)
                assert lib.ds4_matmul(raw.ctypes.data, int(qtype), raw.shape[1], rows, n, x.ctypes.data, T,
                                      y.ctypes.data, int8, 0) == 0
                if int8 and march == "x86-64-v3" and qtype in QUANT:
                    mine = cpu.matmul_raw(raw, qtype, n, x, int8=True)  # this machine's integer path
                    assert np.abs(y - mine).max() <= 1e-6 * np.abs(mine).max(), (qtype, T)
                    if qtype in (Q.IQ2_XXS, Q.Q2_K):
                        assert _same_bits(y, mine), (qtype, T)
                else:
                    ref = x.astype(np.float64) @ w.T
                    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max(), (qtype, T, int8)


@pytest.mark.parametrize("T", [1, 37])
def test_query_and_output_layouts_match_reference(demo_path, T: int) -> None:
    """queries (per-head norm + RoPE into (H, T, D)) and unrotate (inverse RoPE, grouped for the
    output projection) in cpu.c against the MLX reference; the grouped product reads the
    result without a copy."""
    with Engine.open(demo_path, backend="cpu", kernels="reference") as e:
        cfg, w = e.info.config, e.model.w
        ref, ours = ReferenceKernels(w), cpu.CpuKernels(w, exact=True)
        rng = np.random.default_rng(T)
        pos = np.arange(100, 100 + T)
        cos, sin = e.model.rope.tables(pos, True, np)
        x = (rng.normal(size=(T, cfg.n_head * cfg.head_dim)) * 4).astype(np.float32)
        a, b = ours.queries(x, cos, sin), np.array(ref.queries(mx.array(x), mx.array(cos), mx.array(sin)))
        assert a.shape == (cfg.n_head, T, cfg.head_dim) and np.abs(a - b).max() <= 1e-6 * np.abs(b).max()
        o = rng.normal(size=(cfg.n_head, T, cfg.head_dim)).astype(np.float32)
        a, b = ours.unrotate(o, cos, sin), np.array(ref.unrotate(mx.array(o), mx.array(cos), mx.array(sin)))
        assert a.shape == b.shape == (T, cfg.n_out_group, cfg.n_head // cfg.n_out_group * cfg.head_dim)
        assert np.array_equal(a, b)  # a permutation and the same products: the same bits
        name = "blk.1.attn_output_a.weight"
        assert np.abs(ours.grouped(a, name) - np.array(ref.grouped(mx.array(b), name))).max() <= 1e-5


@pytest.mark.parametrize("tokens", [1, 40])
def test_experts_in_ascending_runs_add_up_to_one_call(tokens: int) -> None:
    """The expert pool runs a layer's experts in several calls when they do not fit at once:
    each call takes a run of experts (the others' selections -1) and adds into the same
    output. Run after run in ascending order gives the bits of one call, by rows (one token)
    and by whole experts (40 tokens choose every expert). An id below -1 is refused."""
    E, F, n_exp, k = 512, 256, 12, 4
    gate = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 21).reshape(n_exp, F, -1)
    up = _blocks(Q.IQ2_XXS, n_exp * F, E // 256, 22).reshape(n_exp, F, -1)
    down = _blocks(Q.Q2_K, n_exp * E, F // 256, 23).reshape(n_exp, E, -1)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(tokens, E)).astype(np.float32)
    sel = np.stack([rng.permutation(n_exp)[:k] for _ in range(tokens)]).astype(np.int32)
    route = rng.uniform(0.1, 1.0, size=(tokens, k)).astype(np.float32)
    rows = cpu.ExpertRows.over(gate, up, Q.IQ2_XXS, down, Q.Q2_K)
    whole = cpu.moe_rows(x, sel, route, rows, 7.0)
    chosen = np.unique(sel)
    for size in (1, 2, 5):
        y = np.zeros_like(whole)
        for i in range(0, len(chosen), size):
            run = chosen[i : i + size]
            cpu.moe_rows(x, np.where(np.isin(sel, run), sel, -1), route, rows, 7.0, into=y)
        assert _same_bits(y, whole), size
    with pytest.raises(ValueError, match="out of range"):
        cpu.moe_rows(x, np.full_like(sel, -2), route, rows, 7.0)
    assert not cpu.moe_rows(x, np.full_like(sel, -1), route, rows, 7.0).any()
