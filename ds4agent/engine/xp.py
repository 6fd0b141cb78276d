"""The array library of a forward pass: MLX, or numpy where the CPU kernels run.

Why two: on MLX's CPU backend every eager op is scheduled on MLX's stream thread and waited
for at the next evaluation, about 15 µs each here against about 1 µs for the same numpy op,
and a decode step runs a few hundred small ops per layer between the heavy products (norms,
RoPE, FP8 simulation, compressors, routing). The CPU kernels read and write numpy arrays
anyway, so with them the whole pass stays in numpy; the reference and GPU kernels keep it in
MLX. One source serves both: the model's helpers take the namespace of their input
(``of(x)``), and ``NP`` answers to the MLX names the model uses.

Float32 semantics are the same IEEE operations in both (numpy >= 2 keeps a float32 array
float32 against a Python scalar), so the bit-level FP8/FP4 simulation is exact in both
(tests/test_qat.py runs it both ways); transcendental functions and reductions may differ in
the last bit, which the model tests bound.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np


class _Numpy:
    """numpy under MLX's names: everything not defined here is numpy's own function."""

    inf = np.inf

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        setattr(self, name, value)  # found in the instance from now on: no second lookup
        return value

    @staticmethod
    def array(x: Any, dtype: Any = None) -> np.ndarray:
        return np.asarray(x, dtype=dtype)

    @staticmethod
    def eval(*arrays: Any) -> None:
        """numpy is eager: nothing to evaluate."""

    @staticmethod
    def mean(x: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
        # np.mean's own Python wrapper costs more than the sum on decode-sized rows; this is
        # the same float32 sum divided by the count.
        return np.add.reduce(x, axis=axis, keepdims=keepdims) / np.float32(x.shape[axis])

    @staticmethod
    def rsqrt(x: np.ndarray) -> np.ndarray:
        return np.float32(1.0) / np.sqrt(x)

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        # exp(-x) overflows to inf for x < -88 and 1/(1+inf) is the right 0: not an error.
        with np.errstate(over="ignore"):
            return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))

    @staticmethod
    def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


NP = _Numpy()


def of(x: Any) -> Any:
    """The namespace an array belongs to: ``mx`` for an MLX array, ``NP`` otherwise."""
    return mx if isinstance(x, mx.array) else NP


def to(xp: Any, a: Any) -> Any:
    """``a`` as an array of namespace ``xp`` (no copy when it already is one)."""
    if xp is mx:
        return a if isinstance(a, mx.array) else mx.array(a)
    if isinstance(a, mx.array):
        mx.eval(a)  # converting a pending graph is several times slower than evaluating first
    return np.asarray(a)
