"""FP8/FP4 KV simulation of DeepSeek V4 (docs/model.md §3.4c–e), in float32 ops of MLX or
numpy (whichever the input is; see xp.py).

The official model was trained with its KV cache rounded to FP8 (E4M3) on the non-RoPE dims
and its indexer keys/queries to FP4 (E2M1) after a Hadamard rotation, so inference applies the
same rounding. Everything here is bit-exact with ds4's CPU reference functions (IEEE float32
semantics; tests/test_qat.py checks tests/data/qat_vectors.npz):

* element rounders work on the float32 bit pattern (exponent field -> grid step), then round
  half-to-even with the 1.5·2^23 trick, so no transcendental function is involved;
* the block scale 2^ceil(log2f(amax/qmax)) is computed from the exponent and mantissa bits of
  amax/qmax. float32 log2f rounds to nearest, so for r = 2^e·(1+m·2^-23) just above a power of
  two, log2f(r) can round down to the integer e and the ceiling stays e. A per-exponent table
  of the smallest mantissa that escapes that rounding reproduces it exactly.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .xp import of

Array = mx.array | np.ndarray

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_BLOCK = 64
FP4_BLOCK = 32
FP8_AMAX_FLOOR = 1e-4
FP4_AMAX_FLOOR = 6.0 * 2.0**-126  # ≈ 7.052966e-38: keeps amax/6 a normal float32
_ROUND_MAGIC = 12582912.0  # 1.5·2^23: x + M - M rounds x (|x| < 2^22) half-to-even in float32


def _ceil_log2_table() -> np.ndarray:
    """For each biased exponent E (e = E-127): smallest 23-bit mantissa m > 0 for which
    float32(log2(2^e·(1+m·2^-23))) > e. Below it log2f rounds down to exactly e."""
    table = np.zeros(256, dtype=np.int32)
    for E in range(1, 255):
        e = E - 127
        if e == 0:
            table[E] = 1  # log2 of anything in (1, 2) is a small representable positive number
            continue
        a = abs(e)
        j = a.bit_length() - 1  # 2^j <= |e| < 2^(j+1)
        if e < 0 and a == 1 << j:
            half_gap = 2.0 ** (j - 1 - 24)  # e + φ lies in the binade below |e|
        else:
            half_gap = 2.0 ** (j - 24)
        # log2(1+f) < half_gap  <=>  f < 2^half_gap - 1
        limit = math.expm1(half_gap * math.log(2.0)) * 2.0**23
        m = int(math.floor(limit)) + 1
        # Guard against the float64 estimate landing exactly on an integer boundary.
        while m > 1 and math.log2(1 + (m - 1) * 2.0**-23) >= half_gap:
            m -= 1
        while math.log2(1 + m * 2.0**-23) < half_gap:
            m += 1
        table[E] = m
    return table


_MIN_MANTISSA_NP = _ceil_log2_table()
_MIN_MANTISSA_MX = mx.array(_MIN_MANTISSA_NP)


def ceil_log2_table() -> np.ndarray:
    """The per-exponent mantissa thresholds pow2_ceil_log2 uses (256 int32), for cpu.c."""
    return _MIN_MANTISSA_NP.copy()


def pow2_ceil_log2(r: Array) -> Array:
    """2^ceil(log2f(r)) for positive normal float32 r, bit-exact with C's ceilf(log2f(r))."""
    xp = of(r)
    bits = r.view(xp.int32)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    table = _MIN_MANTISSA_MX if xp is mx else _MIN_MANTISSA_NP
    bump = (mant >= table[biased]) & (mant != 0)
    exp = biased + bump.astype(xp.int32)
    return (exp << 23).view(xp.float32)


def _round_half_even(x: Array) -> Array:
    return (x + _ROUND_MAGIC) - _ROUND_MAGIC


def _grid_round(v: Array, mantissa_bits: int, min_normal_exp: int) -> Array:
    """Round to the nearest value of a float format with ``mantissa_bits`` and smallest normal
    exponent ``min_normal_exp`` (ties to even code); |v| must already be within range."""
    xp = of(v)
    a = xp.abs(v)
    biased = (a.view(xp.int32) >> 23) & 0xFF
    e = xp.maximum(biased - 127, min_normal_exp)  # subnormals share the smallest step
    step = ((e - mantissa_bits + 127) << 23).view(xp.float32)
    q = _round_half_even(a / step) * step
    return xp.where(v < 0, -q, q)


def e4m3_round(x: Array) -> Array:
    """Nearest float8 E4M3FN value (saturating at ±448), as float32."""
    return _grid_round(of(x).clip(x, -E4M3_MAX, E4M3_MAX), 3, -6)


def e2m1_round(x: Array) -> Array:
    """Nearest float4 E2M1 value (saturating at ±6), as float32."""
    return _grid_round(of(x).clip(x, -E2M1_MAX, E2M1_MAX), 1, 0)


def _block_round(x: Array, block: int, qmax: float, floor: float, rounder) -> Array:
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // block, block)
    xp = of(x)
    amax = xp.maximum(xp.max(xp.abs(b), axis=-1, keepdims=True), floor)
    scale = pow2_ceil_log2(amax / qmax)
    y = rounder(xp.clip(b / scale, -qmax, qmax)) * scale
    return y.reshape(shape)


def fp8_kv_round(x: Array, n_rot: int) -> Array:
    """FP8 E4M3 round trip of the non-RoPE dims of KV rows, in 64-wide blocks; the last
    ``n_rot`` (RoPE) dims pass through unchanged."""
    d = x.shape[-1] - n_rot
    xp = of(x)
    head = _block_round(x[..., :d], FP8_BLOCK, E4M3_MAX, FP8_AMAX_FLOOR, e4m3_round)
    return xp.concatenate([head, x[..., d:]], axis=-1)


def fp4_round(x: Array) -> Array:
    """FP4 E2M1 round trip in 32-wide blocks (indexer activations)."""
    return _block_round(x, FP4_BLOCK, E2M1_MAX, FP4_AMAX_FLOOR, e2m1_round)


def hadamard(x: Array) -> Array:
    """Unnormalised Walsh–Hadamard butterfly over the last axis (strides 1, 2, 4, ...), then
    scaled by 1/sqrt(n). The float32 butterfly order is ds4's, so rounding matches."""
    xp = of(x)
    n = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        x = xp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
        h *= 2
    return x * np.float32(1.0 / math.sqrt(n))


def indexer_round(x: Array) -> Array:
    """Indexer keys and queries: Hadamard rotation, then FP4."""
    return fp4_round(hadamard(x))


def kv_round(x: Array, n_rot: int) -> Array:
    """What the KV cache holds of a row (docs/model.md §3.4c): FP8 on the non-RoPE dims, then f16."""
    return f16_round(fp8_kv_round(x, n_rot))


def f16_round(x: Array) -> Array:
    if isinstance(x, mx.array):
        return x.astype(mx.float16).astype(mx.float32)
    with np.errstate(over="ignore"):  # beyond f16 range is inf, as in the cache ds4 writes
        return x.astype(np.float16).astype(np.float32)
