"""The FP8/FP4 KV rounding the model was trained with (docs/model.md §3.4c–e), in torch ops.

The same float32 bit-level algorithm as engine/qat.py (which runs it on MLX and numpy), with
its constants and ceil(log2) mantissa table, so the three agree bit for bit with ds4's CPU
reference functions (tests/data/qat_vectors.npz; tests/test_ascend.py). Only integer and
IEEE float32 operations are involved, so every torch device gives the same bits; nothing here
uses the devices' own FP8 or FP4 types, whose rounding of the block scale is not ds4's.
"""

from __future__ import annotations

import math

import torch

from ..qat import (
    _ROUND_MAGIC,
    E2M1_MAX,
    E4M3_MAX,
    FP4_AMAX_FLOOR,
    FP4_BLOCK,
    FP8_AMAX_FLOOR,
    FP8_BLOCK,
    ceil_log2_table,
)

_TABLE: dict[torch.device, torch.Tensor] = {}


def _mantissa_table(device: torch.device) -> torch.Tensor:
    t = _TABLE.get(device)
    if t is None:
        t = _TABLE[device] = torch.from_numpy(ceil_log2_table()).to(device)
    return t


def pow2_ceil_log2(r: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2f(r)) for positive normal float32 r, bit-exact with C's ceilf(log2f(r))."""
    bits = r.view(torch.int32)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    bump = (mant >= _mantissa_table(r.device)[biased.long()]) & (mant != 0)
    exp = biased + bump.to(torch.int32)
    return (exp << 23).view(torch.float32)


def _round_half_even(x: torch.Tensor) -> torch.Tensor:
    return (x + _ROUND_MAGIC) - _ROUND_MAGIC


def _grid_round(v: torch.Tensor, mantissa_bits: int, min_normal_exp: int) -> torch.Tensor:
    a = v.abs()
    biased = (a.view(torch.int32) >> 23) & 0xFF
    e = torch.clamp(biased - 127, min=min_normal_exp)  # subnormals share the smallest step
    step = ((e - mantissa_bits + 127) << 23).view(torch.float32)
    q = _round_half_even(a / step) * step
    return torch.where(v < 0, -q, q)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    return _grid_round(x.clamp(-E4M3_MAX, E4M3_MAX), 3, -6)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    return _grid_round(x.clamp(-E2M1_MAX, E2M1_MAX), 1, 0)


def _block_round(x: torch.Tensor, block: int, qmax: float, floor: float, rounder) -> torch.Tensor:
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // block, block)
    amax = torch.clamp(b.abs().amax(dim=-1, keepdim=True), min=floor)
    scale = pow2_ceil_log2(amax / qmax)
    return (rounder((b / scale).clamp(-qmax, qmax)) * scale).reshape(shape)


def fp8_kv_round(x: torch.Tensor, n_rot: int) -> torch.Tensor:
    """FP8 E4M3 round trip of the non-RoPE dims in 64-wide blocks; the last n_rot pass."""
    d = x.shape[-1] - n_rot
    head = _block_round(x[..., :d], FP8_BLOCK, E4M3_MAX, FP8_AMAX_FLOOR, e4m3_round)
    return torch.cat([head, x[..., d:]], dim=-1)


def fp4_round(x: torch.Tensor) -> torch.Tensor:
    return _block_round(x, FP4_BLOCK, E2M1_MAX, FP4_AMAX_FLOOR, e2m1_round)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh–Hadamard butterfly over the last axis (strides 1, 2, 4, ...), then
    1/sqrt(n): ds4's float32 order (docs/model.md §3.4d)."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < n:
        y = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(*lead, n)
        h *= 2
    return x * torch.tensor(1.0 / math.sqrt(n), dtype=torch.float32, device=x.device)


def indexer_round(x: torch.Tensor) -> torch.Tensor:
    return fp4_round(hadamard(x))


def f16_round(x: torch.Tensor) -> torch.Tensor:
    """Through float16 and back: beyond the half range is ±inf, as in ds4's cache."""
    return x.to(torch.float16).to(torch.float32)


def kv_round(x: torch.Tensor, n_rot: int) -> torch.Tensor:
    return f16_round(fp8_kv_round(x, n_rot))
