"""The model's tensors on the Ascend module's devices, loaded once at open and never read
from the model file again: no weight makes a host round trip while the model runs.

Everything stays in its GGUF form on the device and is expanded inside the product that uses
it (docs/model.md §5):

* Q8_0 matrices (attention, shared experts, output head) as their int8 codes and f16 block
  scales (``Q8Matrix``); the plain product dequantises 64 MiB row tiles, the fused one hands
  the codes and scales to the NPU's weight-quantised matmul;
* with W8A8 on, the same matrices requantised once per output channel (``W8A8Matrix``);
* routed experts (IQ2_XXS, Q2_K or Q4_K) as their packed bytes (``Packed``), of which a
  product dequantises only the selected experts;
* F16 matrices kept F16 (promoted exactly in products), the embedding F16 (rows gathered on
  the device), small vectors float32, the hash tables int32.

Loading reads the mmap: on the host (``cpu`` devices) the tensors are views of its pages, no
copy at all; on an NPU each tensor is copied in slices of at most 64 MiB, so the host never
holds more than one slice of the 81 GiB file beyond the page cache.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as Q

from ...modelfile.config import ModelConfig
from ...modelfile.gguf import GGUFFile
from .devices import Stage
from .quants import dequantize

MiB = 1024**2
COPY_CHUNK_BYTES = 64 * MiB  # host slice per copy to a device
ROW_TILE_BYTES = 64 * MiB  # float32 rows a product dequantises at a time
EXPERT_KINDS = ("gate", "up", "down")


def _host_tensor(view: np.ndarray) -> torch.Tensor:
    """A torch view of read-only mmap pages (never written: every op here makes new tensors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(view)


def to_device(view: np.ndarray, device: torch.device, chunk_bytes: int = COPY_CHUNK_BYTES) -> torch.Tensor:
    """``view`` (a numpy view of the mmap) as a tensor on ``device``: the view itself on the
    host, else a device tensor filled slice by slice along the first axis."""
    if device.type == "cpu":
        return _host_tensor(view)
    out = torch.empty(view.shape, dtype=_host_tensor(view[:0]).dtype, device=device)
    rows = max(1, chunk_bytes // max(1, view[:1].nbytes)) if view.ndim else 1
    if view.ndim == 0:
        out.copy_(_host_tensor(np.ascontiguousarray(view)))
        return out
    for a in range(0, view.shape[0], rows):
        out[a : a + rows].copy_(_host_tensor(view[a : a + rows]))
    return out


@dataclass
class Q8Matrix:
    """A Q8_0 matrix (out, in): int8 codes (out, in/32, 32) and f16 block scales (out, in/32);
    value = code · scale exactly. Views of the file's blocks on the host; compact copies on
    an NPU (which the fused matmul needs)."""

    codes: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def from_blocks(cls, raw: torch.Tensor, shape: tuple[int, int]) -> "Q8Matrix":
        out, inn = shape
        b = raw.reshape(out, inn // 32, 34)
        return cls(b[..., 2:].view(torch.int8), b[..., :2].view(torch.float16)[..., 0], shape)

    def rows(self, a: int, b: int) -> "Q8Matrix":
        return Q8Matrix(self.codes[a:b], self.scales[a:b], (b - a, self.shape[1]))

    def dequantized(self) -> torch.Tensor:
        """float32 (rows, in): the same products as gguf's Q8_0 dequantiser."""
        w = self.codes.to(torch.float32) * self.scales.to(torch.float32)[..., None]
        return w.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 2 * self.scales.numel()


@dataclass
class W8A8Matrix:
    """A Q8_0 matrix requantised once at load to one int8 scale per output channel:
    scale = max|row| / 127 (1 for an all-zero row), code = round-half-even(value / scale)."""

    q: torch.Tensor  # (out, in) int8
    scale: torch.Tensor  # (out,) float32
    shape: tuple[int, int]

    @classmethod
    def from_q8(cls, m: Q8Matrix) -> "W8A8Matrix":
        out, inn = m.shape
        q = torch.empty((out, inn), dtype=torch.int8, device=m.codes.device)
        scale = torch.empty((out,), dtype=torch.float32, device=m.codes.device)
        step = max(1, ROW_TILE_BYTES // (4 * inn))
        for a in range(0, out, step):
            w = m.rows(a, min(out, a + step)).dequantized()
            amax = w.abs().amax(dim=1)
            s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
            q[a : a + step] = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
            scale[a : a + step] = s
        return cls(q, scale, m.shape)

    def rows(self, a: int, b: int) -> "W8A8Matrix":
        return W8A8Matrix(self.q[a:b], self.scale[a:b], (b - a, self.shape[1]))

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()


@dataclass
class Packed:
    """One layer's routed experts of one kind: raw GGUF rows (n_expert, out, row_bytes)."""

    raw: torch.Tensor
    qtype: int
    shape: tuple[int, int, int]  # (n_expert, out, in)

    def experts(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 (len(ids), out, in) of just these experts, dequantised on the device."""
        return dequantize(self.raw.index_select(0, ids), self.qtype)

    @property
    def expert_bytes(self) -> int:
        return self.raw[0].numel()


Matrix = Q8Matrix | W8A8Matrix | torch.Tensor


def _stage_of(name: str, cfg: ModelConfig, layer_stage: list[int], n_stages: int) -> int:
    if name.startswith("blk."):
        return layer_stage[int(name.split(".")[1])]
    return 0 if name == "token_embd.weight" else n_stages - 1


def tensor_bytes(f: GGUFFile, cfg: ModelConfig) -> tuple[list[int], int, int]:
    """(bytes of each layer, the embedding, the output head) as they will sit on devices."""
    layers = [0] * cfg.n_layer
    embed = head = 0
    for t in f.tensors.values():
        if t.name.startswith("blk."):
            layers[int(t.name.split(".")[1])] += t.nbytes
        elif t.name == "token_embd.weight":
            embed += t.nbytes
        else:
            head += t.nbytes
    return layers, embed, head


class DeviceWeights:
    def __init__(self, f: GGUFFile, cfg: ModelConfig, stages: list[Stage], w8a8: bool, fused_q8: bool) -> None:
        """Loads every tensor onto its stage's device. ``w8a8`` requantises the Q8_0 matrices;
        ``fused_q8`` keeps compact codes (what the NPU's fused matmul takes)."""
        self.cfg = cfg
        self.stages = stages
        self.layer_stage = [0] * cfg.n_layer
        for s in stages:
            for i in s.layers:
                self.layer_stage[i] = s.index
        self.devices = [torch.device(s.device) for s in stages]
        self.w8a8 = w8a8
        self._t: dict[str, object] = {}
        self.stage_bytes = [0] * len(stages)
        for t in f.tensors.values():
            s = _stage_of(t.name, cfg, self.layer_stage, len(stages))
            obj = self._load(f, t, self.devices[s], fused_q8)
            self._t[t.name] = obj
            self.stage_bytes[s] += _nbytes(obj)
        self.qtypes = {t.name: t.type for t in f.tensors.values()}

    def _load(self, f: GGUFFile, t, device: torch.device, fused_q8: bool):
        view = f.array(t.name)
        if "_exps." in t.name:
            return Packed(to_device(view, device), t.type, t.shape)
        if t.type == Q.Q8_0 and len(t.shape) == 2:
            out, inn = t.shape
            if device.type == "cpu" and not fused_q8:
                m = Q8Matrix.from_blocks(_host_tensor(view), (out, inn))
            else:  # compact codes and scales, built slice by slice on the device
                codes = torch.empty((out, inn // 32, 32), dtype=torch.int8, device=device)
                scales = torch.empty((out, inn // 32), dtype=torch.float16, device=device)
                step = max(1, COPY_CHUNK_BYTES // view[:1].nbytes)
                for a in range(0, out, step):
                    part = Q8Matrix.from_blocks(to_device(view[a : a + step], device), (min(out, a + step) - a, inn))
                    codes[a : a + step] = part.codes
                    scales[a : a + step] = part.scales
                m = Q8Matrix(codes, scales, (out, inn))
            return W8A8Matrix.from_q8(m) if self.w8a8 else m
        if t.type in (Q.F32, Q.F16, Q.I32):
            return to_device(view, device)
        raise ValueError(f"{t.name}: GGML type {t.type_name} is not used by DeepSeek V4 Flash")

    # -- access ------------------------------------------------------------------------------
    def matrix(self, name: str) -> Matrix:
        return self._t[name]  # type: ignore[return-value]

    def param(self, name: str) -> torch.Tensor:
        """A small tensor (norm weights, biases, HC scales, sinks, APE) as float32; F16 ones
        converted once."""
        a = self._t[name]
        assert isinstance(a, torch.Tensor)
        if a.dtype != torch.float32:
            a = self._t[name] = a.to(torch.float32)
        return a

    def has(self, name: str) -> bool:
        return name in self._t

    def packed(self, layer: int, kind: str) -> Packed:
        return self._t[f"blk.{layer}.ffn_{kind}_exps.weight"]  # type: ignore[return-value]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows (T, E) float32, gathered on the first stage's device."""
        return self._t["token_embd.weight"].index_select(0, ids).to(torch.float32)  # type: ignore[union-attr]

    def hash_table(self, layer: int) -> torch.Tensor:
        return self._t[f"blk.{layer}.ffn_gate_tid2eid.weight"]  # type: ignore[return-value]

    def tensors(self):
        """(name, every torch tensor it is made of), for checks of where they live."""
        for name, obj in self._t.items():
            yield name, _parts(obj)


def _parts(obj) -> list[torch.Tensor]:
    if isinstance(obj, Q8Matrix):
        return [obj.codes, obj.scales]
    if isinstance(obj, W8A8Matrix):
        return [obj.q, obj.scale]
    if isinstance(obj, Packed):
        return [obj.raw]
    return [obj]


def _nbytes(obj) -> int:
    return sum(p.numel() * p.element_size() for p in _parts(obj))
