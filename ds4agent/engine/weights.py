"""Lazy weight access over the GGUF mmap.

Nothing is read at open. A dense matrix is dequantised into an MLX array the first time the
forward pass asks for it and kept. Three tensors are never materialised whole, because on the
real model they are huge and each token touches a sliver of them:

* the embedding (0.99 GiB): rows are gathered per token from the mmap;
* the hash-routing tables: rows are gathered per token;
* routed experts (1.7–3.4 GiB per layer): only the selected experts' packed rows are copied
  out of the mmap and dequantised (spec/model.md §9 trap 25).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .config import ModelConfig
from .gguf import GGUFFile
from .quants import dequantize


class Weights:
    def __init__(self, f: GGUFFile, cfg: ModelConfig) -> None:
        self.file = f
        self.cfg = cfg
        self._cache: dict[str, mx.array] = {}

    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def type_of(self, name: str) -> int:
        return self.file.tensors[name].type

    def get(self, name: str) -> mx.array:
        """Whole tensor as float32 in logical (numpy) shape, dequantised once and cached."""
        w = self._cache.get(name)
        if w is None:
            t = self.file.tensors[name]
            view = self.file.array(name)
            if t.type in (0, 1):  # F32 / F16: copy out of the mmap as float32
                w = mx.array(np.asarray(view, dtype=np.float32))
            else:
                w = dequantize(view, t.type).reshape(t.shape)
            mx.eval(w)
            self._cache[name] = w
        return w

    def embed(self, ids: np.ndarray) -> mx.array:
        rows = self.file.array("token_embd.weight")[ids]
        return mx.array(rows.astype(np.float32))

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
        return sum(a.nbytes for a in self._cache.values())
