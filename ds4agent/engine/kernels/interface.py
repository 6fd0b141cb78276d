"""The interface every kernel implementation provides (reference, cpu, metal/cuda); the
package's docstring says what each operation is for. Apart from select() so that the self-check
(check.py) can list the operations without importing the selector."""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx
import numpy as np


class Kernels(Protocol):
    name: str
    xp: object  # the array namespace taken and returned: mx, or xp.NP for the CPU kernels

    # ``alone``: the rows of x are tokens of different sessions decoding together (a batch,
    # engine/batch.py): each row's result must be the bits that row gets as a product alone.

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, alone: bool = False) -> mx.array: ...

    def linears(self, x: mx.array, names: tuple[str, ...], alone: bool = False) -> list[mx.array]: ...

    def grouped(self, x: mx.array, name: str, alone: bool = False) -> mx.array: ...

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float,
                alone: bool = False) -> mx.array: ...

    def attend(self, q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array: ...

    def matmul(self, a: mx.array, b: mx.array) -> mx.array: ...

    def queries(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array: ...

    def unrotate(self, o: mx.array, cos: mx.array, sin: mx.array) -> mx.array: ...

    def kv_round(self, rows: mx.array, n_rot: int) -> mx.array: ...

    def indexer_round(self, rows: mx.array) -> mx.array: ...

    def hc_pre(self, X: mx.array, fn: str, scale: mx.array, base: mx.array,
               alone: bool = False) -> tuple[mx.array, mx.array, mx.array]: ...

    def hc_post(self, y: mx.array, X: mx.array, post: mx.array, M: mx.array) -> mx.array: ...
