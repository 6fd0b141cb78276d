"""Operations of the DeepSeek V4 forward pass shared by the model and its kernels
(docs/model.md §3): RMS norm, tail RoPE, the hyper-connection mix, the per-head query
preparation, the clamped SwiGLU, and ``fused`` (a compiled graph of small ops).

They sit below both the model (engine/model.py) and the kernels (engine/kernels/), which use
them, so neither imports the other's internals. Each takes the array namespace of its input
(MLX, or numpy on the CPU kernels path; engine/xp.py).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ..modelfile.config import ModelConfig
from .xp import of


def rms_norm(x: mx.array, w: mx.array | None, eps: float) -> mx.array:
    xp = of(x)
    y = x * xp.rsqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


_FUSED: dict = {}


def fused(fn, *static):
    """``fn(*arrays, *static)`` compiled by mx.compile, once per function and static arguments.

    Decode runs a few hundred tiny MLX ops per layer between the kernels, and eagerly each is
    its own dispatch (on a GPU, its own kernel launch). Compiled, runs of elementwise ops become
    a few fused kernels with the same float operations: the tests run the model both ways and
    the logits and the FP8-rounded cache agree bit for bit. On the CPU it measured no
    end-to-end gain (the Sinkhorn comb alone: 0.52 ms eager, 0.28 ms compiled per call).
    numpy arrays (the CPU kernels path) run ``fn`` directly."""
    key = (fn, static)
    f = _FUSED.get(key)
    if f is None:
        compiled = mx.compile(lambda *arrays: fn(*arrays, *static))
        f = _FUSED[key] = lambda *arrays: compiled(*arrays) if isinstance(arrays[0], mx.array) else fn(*arrays, *static)
    return f


def norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """rms_norm with a weight, as a plain function of its arrays (what ``fused`` compiles)."""
    return rms_norm(x, w, eps)


# -- RoPE ---------------------------------------------------------------------------------------

class Rope:
    """Tail RoPE with adjacent pairs (x[2k], x[2k+1]) on the last n_rot dims (docs/model.md §3.4b).

    Window-only layers use rope_base plainly; compressed layers use compress_rope_base with
    YaRN frequency blending and no magnitude scaling. Angles are computed in float64 and
    rounded once, so cache writes and queries agree at every position.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        half = cfg.n_rot // 2
        k = np.arange(half, dtype=np.float64)
        self.plain = cfg.rope_base ** (-2.0 * k / cfg.n_rot)
        base = cfg.compress_rope_base
        ext = base ** (-2.0 * k / cfg.n_rot)

        def corr(beta: float) -> float:
            return cfg.n_rot * math.log(cfg.rope_orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr(cfg.yarn_beta_fast)))
        high = min(half - 1.0, math.ceil(corr(cfg.yarn_beta_slow)))
        ramp = 1.0 - np.clip((k - low) / max(0.001, high - low), 0.0, 1.0)
        self.yarn = ext * (ramp + (1.0 - ramp) / cfg.rope_scaling_factor)

    def tables(self, positions: np.ndarray, compressed: bool, xp=mx) -> tuple[mx.array, mx.array]:
        theta = np.asarray(positions, dtype=np.float64)[:, None] * (self.yarn if compressed else self.plain)[None, :]
        return xp.array(np.cos(theta).astype(np.float32)), xp.array(np.sin(theta).astype(np.float32))

    @staticmethod
    def apply(x: mx.array, cos: mx.array, sin: mx.array, n_rot: int, inverse: bool = False) -> mx.array:
        """Rotate the last n_rot dims of x (..., T, [heads,] D); cos/sin are (T, n_rot/2) and
        broadcast over any head axis placed between T and D by the caller."""
        d = x.shape[-1] - n_rot
        s = -sin if inverse else sin
        a, b = x[..., d::2], x[..., d + 1 :: 2]
        if isinstance(x, np.ndarray):  # the same arithmetic, written in place of a copy
            out = x.copy()
            out[..., d::2] = a * cos - b * s
            out[..., d + 1 :: 2] = a * s + b * cos
            return out
        rot = mx.stack([a * cos - b * s, a * s + b * cos], axis=-1).reshape(*x.shape[:-1], n_rot)
        return mx.concatenate([x[..., :d], rot], axis=-1)


# -- hyper-connections --------------------------------------------------------------------------

def _hc_weights(mix: mx.array, scale: mx.array, base: mx.array, hc: int, eps: float, iters: int):
    """The hyper-connection weights from the mixing projection: pre (T, hc), post (T, hc) and
    the Sinkhorn-balanced comb (T, hc, hc)."""
    xp = of(mix)
    pre = xp.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * xp.sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    M = (mix[:, 2 * hc :] * scale[2] + base[2 * hc :]).reshape(-1, hc, hc)  # M[t, src, dst]
    M = xp.softmax(M, axis=-1) + eps
    M = M / (xp.sum(M, axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        M = M / (xp.sum(M, axis=-1, keepdims=True) + eps)
        M = M / (xp.sum(M, axis=-2, keepdims=True) + eps)
    return pre, post, M


def hc_flat(X: mx.array, eps: float) -> mx.array:
    """The streams X (T, hc, E) side by side and RMS-normalised: the mixing projection's input."""
    T, hc, E = X.shape
    return rms_norm(X.reshape(T, hc * E), None, eps)


def _hc_mixed(X: mx.array, mix: mx.array, scale: mx.array, base: mx.array, hc: int, eps: float, iters: int):
    pre, post, M = _hc_weights(mix, scale, base, hc, eps, iters)
    return of(X).sum(pre[:, :, None] * X, axis=1), post, M


def hc_pre(X: mx.array, project, scale: mx.array, base: mx.array, cfg: ModelConfig):
    """X (T, hc, E) -> sublayer input (T, E), post (T, hc), comb (T, hc, hc); ``project`` is
    the mixing matrix as a function of the normalised flat streams."""
    mix = project(fused(hc_flat, cfg.rms_eps)(X))  # (T, (2+hc)·hc)
    return fused(_hc_mixed, cfg.hc_count, cfg.hc_eps, cfg.hc_sinkhorn_iters)(X, mix, scale, base)


def hc_post(y: mx.array, X: mx.array, post: mx.array, M: mx.array) -> mx.array:
    """X_new[t, j] = post[t, j]·y[t] + Σ_i M[t, i, j]·X[t, i]  (Mᵀ, not M)."""
    return post[:, :, None] * y[:, None, :] + of(M).swapaxes(M, 1, 2) @ X


def queries(q: mx.array, cos: mx.array, sin: mx.array, H: int, D: int, R: int, eps: float) -> mx.array:
    """q_b output (T, H·D) -> per-head RMS-normalised, rotated queries (H, T, D)."""
    q = rms_norm(q.reshape(q.shape[0], H, D), None, eps)
    return Rope.apply(of(q).swapaxes(q, 0, 1), cos, sin, R)


def swiglu(g: mx.array, u: mx.array, clamp: float) -> mx.array:
    """DeepSeek V4's clamped SwiGLU: the gate is clamped from above only, up on both sides."""
    xp = of(g)
    g = xp.minimum(g, clamp)
    u = xp.clip(u, -clamp, clamp)
    return g * xp.sigmoid(g) * u
