"""GGUF block formats dequantised with torch ops, on whatever device the packed bytes live
(docs/model.md §5): the Ascend module keeps every quantised tensor as its raw GGUF bytes on
the device and expands only what a product is about to use.

The arithmetic repeats the MLX reference dequantisers (engine/quants.py), which repeat the
`gguf` package's operation for operation in float32, so the results agree bit for bit with
`gguf.quants.dequantize` (tests/test_ascend.py). The IQ2_XXS tables come from the `gguf`
package through engine/quants.iq2xxs_tables(), never from our source (docs/model.md §5.5).

Every function takes a uint8 tensor whose last axis is a whole number of blocks and returns
float32 with that axis expanded. f16 fields are read by reinterpreting two bytes in place
(``view(torch.float16)``), which needs a little-endian device: every Ascend host and card is.
"""

from __future__ import annotations

import torch
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from ..quants import iq2xxs_tables

_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _iq2_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The IQ2_XXS grid (256, 8) and ±1 sign patterns (128, 8), float32, on ``device``."""
    t = _TABLES.get(device)
    if t is None:
        grid, signs = iq2xxs_tables()
        t = _TABLES[device] = (torch.from_numpy(grid).to(device), torch.from_numpy(signs).to(device))
    return t


def _blocks(raw: torch.Tensor, block_bytes: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    if raw.dtype != torch.uint8:
        raise TypeError(f"packed blocks must be uint8, got {raw.dtype}")
    lead = tuple(raw.shape[:-1])
    if raw.shape[-1] % block_bytes:
        raise ValueError(f"last axis {raw.shape[-1]} is not a whole number of {block_bytes}-byte blocks")
    return raw.reshape(-1, block_bytes), lead


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian f16 at byte ``at`` of each block row, as float32 (n, 1)."""
    return b[:, at : at + 2].contiguous().view(torch.float16).to(torch.float32)


def dequant_q8_0(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 34)
    d = _f16(b, 0)
    x = b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return (x * d).reshape(*lead, -1)


def dequant_q2_k(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 84)
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d = _f16(b, 80)[:, :, None]
    dmin = _f16(b, 82)[:, :, None]
    dl = d * (scales & 0xF).to(torch.float32).reshape(n, 16, 1)
    ml = dmin * (scales >> 4).to(torch.float32).reshape(n, 16, 1)
    # Element 128h + 32j + l takes bits 2j of qs[32h + l] (docs/model.md §5.2).
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device).reshape(1, 1, 4, 1)
    q = (qs.reshape(n, 2, 1, 32) >> shifts) & 3
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(*lead, -1)


def dequant_q4_k(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 144)
    n = b.shape[0]
    d = _f16(b, 0)
    dmin = _f16(b, 2)
    s = b[:, 4:16].reshape(n, 3, 4)
    lo, mi, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mi & 0x3F, (hi >> 4) | ((mi >> 2) & 0x30)], dim=-1)
    dl = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (dmin * mn.to(torch.float32)).reshape(n, 8, 1)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device).reshape(1, 1, 2, 1)
    q = (b[:, 16:].reshape(n, 4, 1, 32) >> shifts) & 0x0F
    q = q.reshape(n, 8, 32).to(torch.float32)
    return (dl * q - ml).reshape(*lead, -1)


def dequant_iq2_xxs(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 66)
    n = b.shape[0]
    grid_t, signs_t = _iq2_tables(raw.device)
    d = _f16(b, 0).reshape(n, 1, 1, 1)
    g = b[:, 2:].reshape(n, 8, 8)  # 8 groups of (4 grid bytes, a little-endian u32 of signs + scale)
    # int32 is enough: every field is masked after the (arithmetic) shift.
    a1 = g[..., 4:8].contiguous().view(torch.int32).reshape(n, 8)
    ls = ((a1 >> 28) & 0xF).to(torch.float32).reshape(n, 8, 1, 1)
    db = d * (0.5 + ls) * 0.25
    shifts = torch.tensor([0, 7, 14, 21], dtype=torch.int32, device=raw.device)
    sign_idx = (a1[..., None] >> shifts) & 0x7F  # (n, 8, 4)
    signs = signs_t[sign_idx.long()]  # (n, 8, 4, 8)
    grid = grid_t[g[..., :4].long()]  # (n, 8, 4, 8)
    return (db * grid * signs).reshape(*lead, -1)


def dequant_f16(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 2)
    return b.reshape(*lead, -1).contiguous().view(torch.float16).to(torch.float32)


def dequant_f32(raw: torch.Tensor) -> torch.Tensor:
    b, lead = _blocks(raw, 4)
    return b.reshape(*lead, -1).contiguous().view(torch.float32)


DEQUANT = {
    int(Q.Q8_0): dequant_q8_0,
    int(Q.Q2_K): dequant_q2_k,
    int(Q.Q4_K): dequant_q4_k,
    int(Q.IQ2_XXS): dequant_iq2_xxs,
    int(Q.F16): dequant_f16,
    int(Q.F32): dequant_f32,
}


def dequantize(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    """Packed rows (uint8, last axis = whole blocks) of a supported GGML type -> float32."""
    fn = DEQUANT.get(int(qtype))
    if fn is None:
        raise ValueError(f"no dequantiser for GGML type {qtype}")
    return fn(raw)


def block_elements(qtype: int) -> int:
    return GGML_QUANT_SIZES[Q(qtype)][0]


def block_bytes(qtype: int) -> int:
    return GGML_QUANT_SIZES[Q(qtype)][1]
