"""The model's small ops give the same numbers in numpy (the CPU kernels path) as in MLX (the
reference and GPU path): engine/xp.py. Elementwise float32 arithmetic is the same IEEE
operation in both, so most agree to the bit; exp/log/sqrt and reductions may differ in the
last place, so those compare to a few ulps."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import model, ops
from ds4agent.engine.ops import swiglu
from ds4agent.engine.state import NEG_INF, Frontier
from ds4agent.engine.xp import NP, of, to

RNG = np.random.default_rng(7)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.normal(size=shape) * scale).astype(np.float32)


def _both(fn, *arrays, **kw):
    """fn on numpy inputs and on MLX inputs; both results as numpy, numpy's checked to be
    numpy all the way (nothing silently went through MLX)."""
    a = fn(*arrays, **kw)
    b = fn(*[mx.array(x) if isinstance(x, np.ndarray) else x for x in arrays], **kw)
    flat_a = a if isinstance(a, tuple) else (a,)
    flat_b = b if isinstance(b, tuple) else (b,)
    assert all(type(x) is np.ndarray and x.dtype == np.float32 for x in flat_a)
    return [np.asarray(x) for x in flat_a], [np.array(x) for x in flat_b]


def _close(a: list[np.ndarray], b: list[np.ndarray], rtol: float = 2e-6) -> None:
    for x, y in zip(a, b):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * float(np.abs(y).max(initial=0.0) or 1.0))


def test_namespace_dispatch() -> None:
    assert of(np.zeros(2)) is NP and of(mx.zeros(2)) is mx
    m = mx.arange(3) * 2  # a pending graph converts after evaluation
    assert type(to(NP, m)) is np.ndarray and to(NP, m).tolist() == [0, 2, 4]
    assert isinstance(to(mx, np.ones(2)), mx.array)
    x = np.ones(3, np.float32)
    assert to(NP, x) is x


def test_numpy_extras_match_mlx() -> None:
    x = np.concatenate([_f32(4000, scale=30), np.float32([-200, -89, 0, 89, 200])])
    _close([NP.sigmoid(x)], [np.array(mx.sigmoid(mx.array(x)))])
    m = _f32(5, 256, scale=3)
    assert np.array_equal(NP.mean(m, axis=-1, keepdims=True), np.mean(m, axis=-1, keepdims=True))
    pos = np.abs(x) + 1e-3
    _close([NP.rsqrt(pos)], [np.array(mx.rsqrt(mx.array(pos)))])
    s = _f32(6, 50, scale=5)
    for axis in (-1, 0):
        _close([NP.softmax(s, axis=axis)], [np.array(mx.softmax(mx.array(s), axis=axis))])
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no warning from the tails
        NP.sigmoid(np.float32([-1000, 1000]))


def test_norm_rope_query() -> None:
    x, w = _f32(5, 256, scale=3), _f32(256)
    _close(*_both(ops.rms_norm, x, w, 1e-6))
    cos, sin = (np.float32(v) for v in (np.cos(_f32(5, 32)), np.sin(_f32(5, 32))))
    for inverse in (False, True):
        _close(*_both(ops.Rope.apply, x, cos, sin, 64, inverse=inverse))
    q = _f32(5, 4 * 128)
    c, s = cos[:, :32], sin[:, :32]
    _close(*_both(ops.queries, q, c, s, 4, 128, 64, 1e-6))


@pytest.mark.parametrize("ratio, n0, T", [(4, 0, 1), (4, 6, 13), (4, 3, 1), (128, 0, 300), (128, 250, 7)])
def test_compressor_step(ratio: int, n0: int, T: int) -> None:
    W = 2 * 64 if ratio == 4 else 64
    S = 8 if ratio == 4 else ratio
    kv0, sc0 = _f32(S, W), _f32(S, W)
    sc0[ratio // 2 :] = NEG_INF  # a partly filled frontier, as the state keeps it
    kv, sc = _f32(T, W), _f32(T, W, scale=2)

    def step(kv0, sc0, kv, sc):
        pooled, fr, start = model.compressor_step(Frontier(kv0, sc0), ratio, n0, kv, sc)
        return pooled, fr.kv, fr.score

    a, b = _both(step, kv0, sc0, kv, sc)
    _close(a, b)


def test_hyper_connections_and_ffn_helpers() -> None:
    hc, T, E = 4, 3, 64
    X, mix = _f32(T, hc, E), _f32(T, (2 + hc) * hc)
    scale, base = _f32(3), _f32((2 + hc) * hc)
    _close(*_both(ops._hc_weights, mix, scale, base, hc, 1e-6, 20), rtol=1e-5)
    _close(*_both(ops._hc_mixed, X, mix, scale, base, hc, 1e-6, 20), rtol=1e-5)
    y, post, M = _f32(T, E), _f32(T, hc), np.abs(_f32(T, hc, hc))
    _close(*_both(ops.hc_post, y, X, post, M))
    g, u = _f32(T, 128, scale=8), _f32(T, 128, scale=8)
    _close(*_both(swiglu, g, u, 7.0))
