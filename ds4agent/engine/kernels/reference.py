"""The reference kernels: plain MLX ops, runnable on every MLX device.

This is the definition the fast paths are tested against (tests/test_kernels.py). Dense weights
are materialised once by Weights.get (Q8_0 repacked losslessly for mx.quantized_matmul); routed
experts are dequantised per chosen expert, never whole.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .. import qat
from ..ops import Rope, fused, hc_post, hc_pre, queries, swiglu
from ..weights import QMatrix, Weights


def sink_softmax(scores: mx.array, sink: mx.array) -> tuple[mx.array, mx.array]:
    """Softmax over the last axis with one extra learned logit (the sink, broadcast against
    ``scores`` with a trailing axis of 1) that takes probability but contributes no value:
    returns the unnormalised weights and their denominator."""
    m = mx.maximum(mx.max(scores, axis=-1, keepdims=True), sink)
    ex = mx.exp(scores - m)
    return ex, mx.exp(sink - m) + mx.sum(ex, axis=-1, keepdims=True)


def attend_mx(q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array:
    """Softmax attention with one learned sink logit per head; keys are also the values.

    q (H, T, D), keys (N, D), mask (T, N) bool, sinks (H,) -> (H, T, D)."""
    H, D = q.shape[0], q.shape[-1]
    scores = (q @ keys.T) * (1.0 / math.sqrt(D))  # (H, T, N)
    scores = mx.where(mx.array(mask)[None], scores, -mx.inf)
    ex, den = sink_softmax(scores, sinks.reshape(H, 1, 1))
    return (ex @ keys) / den


ATTEND_BLOCK_BYTES = 1 << 28  # the largest score array (float32) ReferenceKernels.attend makes


def one_at_a_time(product, x: mx.array, *args) -> mx.array:
    """``product`` of each row of x alone, stacked: what a batch of sessions gets from kernels
    whose arithmetic for a row depends on the other rows (MLX's matmul picks its method by
    shape); the weights are then read once per row, the price of the same bits."""
    return mx.concatenate([product(x[t : t + 1], *args) for t in range(x.shape[0])])


class ReferenceKernels:
    name = "reference"
    xp = mx

    def __init__(self, weights: Weights) -> None:
        self.w = weights

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, alone: bool = False) -> mx.array:
        """x (T, in) @ W[rows]ᵀ for the GGUF matrix ``name`` (out, in); with ``cols``, x holds
        only those input columns and W is read there alone (a partial product: an expert
        split's processes each take some columns, engine/model.py Part)."""
        if alone and x.shape[0] > 1:
            return one_at_a_time(self.linear, x, name, rows, cols)
        w = self.w.get(name)
        if rows is not None:
            w = w.rows(*rows) if isinstance(w, QMatrix) else w[rows[0] : rows[1]]
        if cols is not None:
            w = w.cols(*cols) if isinstance(w, QMatrix) else w[:, cols[0] : cols[1]]
        if isinstance(w, QMatrix):
            return w.matmul_t(x)
        return x @ w.T

    def linears(self, x: mx.array, names: tuple[str, ...], alone: bool = False) -> list[mx.array]:
        """``linear(x, n)`` for each of several matrices sharing the input x."""
        return [self.linear(x, n, alone=alone) for n in names]

    def grouped(self, x: mx.array, name: str, alone: bool = False) -> mx.array:
        """Grouped projection: x (T, G, n); group g goes through rows g·R .. (g+1)·R of the
        matrix (R = rows / G), outputs side by side (T, G·R). Not one product over all groups."""
        G = x.shape[1]
        R = self.w.file.tensors[name].shape[0] // G
        return mx.concatenate([self.linear(x[:, g], name, (g * R, (g + 1) * R), alone=alone) for g in range(G)],
                              axis=-1)

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float,
                alone: bool = False) -> mx.array:
        """Σ_slots weight · down(swiglu(gate·x, up·x)) over each token's chosen experts.

        x (T, E), sel (T, k) expert ids, weights (T, k) -> (T, E)."""
        if alone and x.shape[0] > 1:
            return mx.concatenate([self.experts(layer, x[t : t + 1], sel[t : t + 1], weights[t : t + 1], clamp)
                                   for t in range(x.shape[0])])
        routed = mx.zeros_like(x)
        for e in np.unique(sel):
            t_idx, slot = np.nonzero(sel == e)
            xe = x[mx.array(t_idx)]
            g = xe @ self.w.expert(layer, "gate", int(e)).T
            u = xe @ self.w.expert(layer, "up", int(e)).T
            mid = swiglu(g, u, clamp) * weights[mx.array(t_idx), mx.array(slot)][:, None]
            routed = routed.at[mx.array(t_idx)].add(mid @ self.w.expert(layer, "down", int(e)).T)
            # Evaluate expert by expert: a lazy graph over all experts of a prefill batch would
            # hold every dequantised expert at once (256 x 96 MiB per layer on the real model).
            mx.eval(routed)
        return routed

    def attend(self, q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array:
        """attend_mx, over blocks of queries when one (H, T, N) score array would pass
        ATTEND_BLOCK_BYTES: a 256-token prefill chunk at 1M tokens of context would otherwise
        hold three 16 GiB arrays (every compressed row is scored, then masked)."""
        H, T, _ = q.shape
        step = max(1, ATTEND_BLOCK_BYTES // (4 * H * max(1, keys.shape[0])))
        if T <= step:
            return attend_mx(q, keys, mask, sinks)
        out = []
        for t in range(0, T, step):
            out.append(attend_mx(q[:, t : t + step], keys, mask[t : t + step], sinks))
            mx.eval(out[-1])  # one block's scores at a time
        return mx.concatenate(out, axis=1)

    def queries(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        """attn_q_b's output (T, H·D) -> each head RMS-normalised and rotated, (H, T, D). H is
        what x holds: all heads, or an expert split's share of them."""

        c = self.w.cfg
        return fused(queries, x.shape[1] // c.head_dim, c.head_dim, c.n_rot, c.rms_eps)(x, cos, sin)

    def unrotate(self, o: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        """Attention output (H, T, D) -> each head rotated back, grouped for attn_output_a:
        (T, G, H/G·D), group g = heads g·H/G .. (g+1)·H/G side by side."""

        c = self.w.cfg
        per_group = c.n_head // c.n_out_group  # o may hold whole groups only (an expert split's)
        o = fused(Rope.apply, c.n_rot, True)(o, cos, sin)
        return mx.swapaxes(o, 0, 1).reshape(o.shape[1], o.shape[0] // per_group, -1)

    def kv_round(self, rows: mx.array, n_rot: int) -> mx.array:
        """The KV cache's rounding (qat.kv_round), as one compiled graph (ops.fused)."""

        return fused(qat.kv_round, n_rot)(rows)

    def indexer_round(self, rows: mx.array) -> mx.array:
        """The indexer's rounding of keys and queries: Hadamard rotation, then FP4 (one
        compiled graph)."""
        return fused(qat.indexer_round)(rows)

    def matmul(self, a: mx.array, b: mx.array) -> mx.array:
        """A dense product of activations (a @ b), e.g. indexer queries against its rows."""
        return a @ b

    def hc_pre(self, X: mx.array, fn: str, scale: mx.array, base: mx.array, alone: bool = False):
        """Hyper-connection mix before a sublayer (ops.hc_pre): X (T, hc, E) -> the sublayer
        input (T, E), post (T, hc) and the comb (T, hc, hc), with mixing matrix ``fn``."""

        return hc_pre(X, lambda flat: self.linear(flat, fn, alone=alone), scale, base, self.w.cfg)

    def hc_post(self, y: mx.array, X: mx.array, post: mx.array, M: mx.array) -> mx.array:
        """Spread a sublayer's output back over the hc streams (ops.hc_post)."""

        return fused(hc_post)(y, X, post, M)
