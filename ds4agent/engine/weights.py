"""Lazy weight access over the GGUF mmap.

Nothing is read at open. A dense matrix is dequantised into an MLX array the first time the
forward pass asks for it and kept. Three tensors are never materialised whole, because on the
real model they are huge and each token touches a sliver of them:

* the embedding (0.99 GiB): rows are gathered per token from the mmap;
* the hash-routing tables: rows are gathered per token;
* routed experts (1.7–3.4 GiB per layer): only the selected experts' packed rows are copied
  out of the mmap and dequantised (docs/model.md §9 trap 25).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf.constants import GGMLQuantizationType

from ..modelfile.config import ModelConfig
from ..modelfile.gguf import GGUFFile
from .expertpool import ExpertPool
from .quants import dequantize


class Weights:
    def __init__(self, f: GGUFFile, cfg: ModelConfig, pool: ExpertPool | None = None) -> None:
        self.file = f
        self.cfg = cfg
        # Where the CPU kernels find routed experts when they are streamed (engine/expertpool.py);
        # None: in the mapped file.
        self.pool = pool
        self._cache: dict[str, mx.array] = {}

    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def get(self, name: str) -> "mx.array | QMatrix":
        """A tensor in logical (numpy) shape, materialised once and cached: F32 as float32, F16
        kept as float16 (promoted exactly inside matmuls), Q8_0 repacked into MLX's 8-bit
        affine format, anything else dequantised to float32."""
        w = self._cache.get(name)
        if w is None:
            t = self.file.tensors[name]
            view = self.file.array(name)
            if t.type == 0:
                w = mx.array(np.asarray(view, dtype=np.float32))
            elif t.type == 1:
                w = mx.array(np.asarray(view, dtype=np.float16))
            elif t.type == GGMLQuantizationType.Q8_0 and len(t.shape) == 2:
                w = QMatrix.from_q8_0(view, t.shape)
            else:
                w = dequantize(view, t.type).reshape(t.shape)
            mx.eval(w.arrays() if isinstance(w, QMatrix) else w)
            self._cache[name] = w
        return w

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """The embedding rows of ``ids`` as float32 (T, n_embd), gathered from the mmap."""
        return self.file.array("token_embd.weight")[ids].astype(np.float32)

    def hash_experts(self, layer: int, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.file.array(f"blk.{layer}.ffn_gate_tid2eid.weight")[ids], dtype=np.int64)

    def expert(self, layer: int, kind: str, e: int) -> mx.array:
        """One expert's matrix (out, in) of ``kind`` gate/up/down, dequantised from its packed
        rows only."""
        name = f"blk.{layer}.ffn_{kind}_exps.weight"
        t = self.file.tensors[name]
        packed = self.file.array(name)[e]  # (out, row_bytes) view into the mmap
        return dequantize(packed, t.type)

    def materialised_bytes(self) -> int:
        return sum(sum(a.nbytes for a in w.arrays()) if isinstance(w, QMatrix) else w.nbytes
                   for w in self._cache.values())


@dataclass
class QMatrix:
    """A Q8_0 matrix in MLX's 8-bit affine layout (groups of 32): q = qs + 128 as uint8 packed
    four to a uint32, scale = d, bias = −128·d. scale·q + bias equals d·qs exactly in float32
    (d has 11 significant bits, q 8), so this is a lossless repack that MLX's quantised matmul
    reads directly, at 1.25 bytes per weight instead of 4 for float32."""

    wq: mx.array  # (out, in/4) uint32
    scales: mx.array  # (out, in/32) float32
    biases: mx.array
    shape: tuple[int, int]

    GROUP = 32
    BITS = 8

    @classmethod
    def from_q8_0(cls, packed: np.ndarray, shape: tuple[int, ...]) -> "QMatrix":
        out, inn = shape
        blocks = np.ascontiguousarray(packed).reshape(out, inn // 32, 34)
        d = blocks[:, :, :2].copy().view("<f2")[..., 0].astype(np.float32)
        q = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        wq = np.ascontiguousarray(q.reshape(out, inn)).view("<u4")
        return cls(mx.array(wq), mx.array(d), mx.array(-128.0 * d), (out, inn))

    def rows(self, start: int, stop: int) -> "QMatrix":
        return QMatrix(self.wq[start:stop], self.scales[start:stop], self.biases[start:stop],
                       (stop - start, self.shape[1]))

    def cols(self, start: int, stop: int) -> "QMatrix":
        """Input columns start..stop (whole groups of 32)."""
        if start % self.GROUP or stop % self.GROUP:
            raise ValueError(f"columns {start}..{stop} are not whole groups of {self.GROUP}")
        g0, g1 = start // self.GROUP, stop // self.GROUP
        return QMatrix(self.wq[:, start // 4 : stop // 4], self.scales[:, g0:g1], self.biases[:, g0:g1],
                       (self.shape[0], stop - start))

    def arrays(self) -> list[mx.array]:
        return [self.wq, self.scales, self.biases]

    def matmul_t(self, x: mx.array) -> mx.array:
        """x @ Wᵀ."""
        return mx.quantized_matmul(x, self.wq, self.scales, self.biases, transpose=True,
                                   group_size=self.GROUP, bits=self.BITS)

    def dequantized(self) -> mx.array:
        return mx.dequantize(self.wq, self.scales, self.biases, group_size=self.GROUP, bits=self.BITS)
