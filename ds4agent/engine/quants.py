"""Block-quantised GGUF formats dequantised with MLX ops: the portable reference path.

Every function takes packed blocks as a uint8 MLX array whose last axis is a whole number of
blocks (one weight row, or a batch of rows) and returns float32 values with the last axis
expanded. The arithmetic repeats the `gguf` package's dequantisers operation for operation
(same products in the same order, float32 throughout), so results agree bit for bit
(tests/test_quants.py). Lookup tables (the IQ2_XXS grid and sign patterns, MXFP4's code values)
are read from the `gguf` package at import, never written into our source.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import IQ2_XXS as _GGUF_IQ2_XXS
from gguf.quants import MXFP4 as _GGUF_MXFP4


def iq2xxs_tables() -> tuple[np.ndarray, np.ndarray]:
    """The IQ2_XXS grid (256, 8) and sign patterns expanded to ±1.0 (128, 8), float32."""
    if _GGUF_IQ2_XXS.grid is None:
        _GGUF_IQ2_XXS.init_grid()
    grid = np.asarray(_GGUF_IQ2_XXS.grid, dtype=np.float32).reshape(256, 8)
    ksigns = np.frombuffer(_GGUF_IQ2_XXS.ksigns, dtype=np.uint8)
    # Expand each 8-bit sign pattern to ±1.0 per lane once, so dequantising is a gather.
    bits = (ksigns[:, None] >> np.arange(8, dtype=np.uint8)[None, :]) & 1
    signs = np.where(bits == 0, np.float32(1), np.float32(-1)).astype(np.float32)
    return np.ascontiguousarray(grid), np.ascontiguousarray(signs)


_IQ2_GRID, _IQ2_SIGNS = (mx.array(t) for t in iq2xxs_tables())


def mxfp4_values() -> np.ndarray:
    """The 16 values of an MXFP4 code (E2M1, doubled: the block's scale is halved to match), float32."""
    return np.asarray(_GGUF_MXFP4.kvalues, dtype=np.float32)


_MXFP4_VALUES = mx.array(mxfp4_values())


def _f16(lo: mx.array, hi: mx.array) -> mx.array:
    """Little-endian f16 from two uint8 arrays, as float32."""
    bits = lo.astype(mx.uint16) | (hi.astype(mx.uint16) << 8)
    return bits.view(mx.float16).astype(mx.float32)


def _blocks(raw: mx.array, block_bytes: int) -> tuple[mx.array, tuple[int, ...]]:
    lead = raw.shape[:-1]
    if raw.shape[-1] % block_bytes:
        raise ValueError(f"last axis {raw.shape[-1]} is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes), lead


def dequant_q8_0(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 34)
    d = _f16(b[:, 0], b[:, 1])[:, None]
    x = b[:, 2:].view(mx.int8).astype(mx.float32)
    return (x * d).reshape(*lead, -1)


def dequant_q2_k(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 84)
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d = _f16(b[:, 80], b[:, 81])[:, None, None]
    dmin = _f16(b[:, 82], b[:, 83])[:, None, None]
    dl = d * (scales & 0xF).astype(mx.float32).reshape(n, 16, 1)
    ml = dmin * (scales >> 4).astype(mx.float32).reshape(n, 16, 1)
    # Element 128h + 32j + l takes bits 2j of qs[32h + l]: shift slots vary fastest after halves.
    shifts = mx.array([0, 2, 4, 6], dtype=mx.uint8).reshape(1, 1, 4, 1)
    q = (qs.reshape(n, 2, 1, 32) >> shifts) & 3
    q = q.reshape(n, 16, 16).astype(mx.float32)
    return (dl * q - ml).reshape(*lead, -1)


def _q4k_scale_min(scales: mx.array) -> tuple[mx.array, mx.array]:
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = mx.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = mx.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def dequant_q4_k(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 144)
    n = b.shape[0]
    d = _f16(b[:, 0], b[:, 1])[:, None]
    dmin = _f16(b[:, 2], b[:, 3])[:, None]
    sc, mn = _q4k_scale_min(b[:, 4:16])
    dl = (d * sc.astype(mx.float32)).reshape(n, 8, 1)
    ml = (dmin * mn.astype(mx.float32)).reshape(n, 8, 1)
    shifts = mx.array([0, 4], dtype=mx.uint8).reshape(1, 1, 2, 1)
    q = (b[:, 16:].reshape(n, 4, 1, 32) >> shifts) & 0x0F
    q = q.reshape(n, 8, 32).astype(mx.float32)
    return (dl * q - ml).reshape(*lead, -1)


def dequant_iq2_xxs(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 66)
    n = b.shape[0]
    d = _f16(b[:, 0], b[:, 1]).reshape(n, 1, 1, 1)
    g = b[:, 2:].reshape(n, 8, 8)  # 8 groups of (a0: 4 grid bytes, a1: signs + scale)
    a1 = (g[..., 4].astype(mx.uint32) | (g[..., 5].astype(mx.uint32) << 8)
          | (g[..., 6].astype(mx.uint32) << 16) | (g[..., 7].astype(mx.uint32) << 24))
    ls = (a1 >> 28).astype(mx.float32).reshape(n, 8, 1, 1)
    db = d * (0.5 + ls) * 0.25
    sign_idx = (a1[..., None] >> mx.array([0, 7, 14, 21], dtype=mx.uint32)) & 0x7F  # (n, 8, 4)
    signs = _IQ2_SIGNS[sign_idx]  # (n, 8, 4, 8)
    grid = _IQ2_GRID[g[..., :4].astype(mx.uint32)]  # (n, 8, 4, 8)
    return (db * grid * signs).reshape(*lead, -1)


def dequant_mxfp4(raw: mx.array) -> mx.array:
    """32 values in 17 bytes: an E8M0 exponent e (the scale 2^(e-127), halved to 2^(e-128) for
    the doubled code values; below e = 2 a subnormal float), then codes: value l in the low
    nibble of byte l, value l + 16 in the high nibble."""
    b, lead = _blocks(raw, 17)
    n = b.shape[0]
    e = b[:, 0].astype(mx.uint32)
    bits = mx.where(e < 2, mx.array(0x00200000, dtype=mx.uint32) << e, (e - 1) << 23)
    d = bits.view(mx.float32).reshape(n, 1, 1)
    q = (b[:, 1:].reshape(n, 1, 16) >> mx.array([0, 4], dtype=mx.uint8).reshape(1, 2, 1)) & 0x0F
    return (d * _MXFP4_VALUES[q.astype(mx.uint32)]).reshape(*lead, -1)


def dequant_f16(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 2)
    return b.reshape(*lead, -1).view(mx.float16).astype(mx.float32)


def dequant_f32(raw: mx.array) -> mx.array:
    b, lead = _blocks(raw, 4)
    return b.reshape(*lead, -1).view(mx.float32)


DEQUANT = {
    int(Q.Q8_0): dequant_q8_0,
    int(Q.Q2_K): dequant_q2_k,
    int(Q.Q4_K): dequant_q4_k,
    int(Q.IQ2_XXS): dequant_iq2_xxs,
    int(Q.MXFP4): dequant_mxfp4,
    int(Q.F16): dequant_f16,
    int(Q.F32): dequant_f32,
}


def dequantize(raw: mx.array | np.ndarray, qtype: int) -> mx.array:
    """Dequantise packed rows (uint8, last axis = whole blocks) of a supported type to float32."""
    fn = DEQUANT.get(int(qtype))
    if fn is None:
        raise ValueError(f"no dequantiser for GGML type {qtype}")
    if isinstance(raw, np.ndarray):
        raw = mx.array(np.ascontiguousarray(raw).view(np.uint8))
    return fn(raw)


def block_bytes(qtype: int) -> int:
    return GGML_QUANT_SIZES[Q(qtype)][1]
