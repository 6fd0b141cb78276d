"""The DeepSeek V4 Flash forward pass in MLX ops (spec/model.md §3–§4).

One function runs a batch of T consecutive tokens through every layer and advances the
streaming state. Decode is the same call with T = 1, so prefill and decode share every line:
a batch computes all its projections at once, then reproduces the token-by-token semantics
with masks (the raw window, compressed rows emitted so far, indexer choices), never by
peeking at later tokens. Dimensions come from ModelConfig; nothing is specialised to 43 layers.

Arrays are MLX arrays, or numpy arrays when the CPU kernels run (engine/xp.py says why): the
helpers below take the namespace of their input, the Model that of its kernels.

Shapes: T tokens, E hidden, hc streams, H heads of D dims (the last n_rot rotate), G output
groups, r compression ratio, W compressor width (2·D on ratio 4, D on ratio 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from . import qat
from .config import ModelConfig
from .kernels import Kernels
from .kernels.reference import ReferenceKernels, swiglu
from .state import NEG_INF, Frontier, LayerState, ModelState
from .weights import Weights
from .xp import NP, of, to

ROUTE_WEIGHT_FLOOR = 6.103515625e-5  # 2^-14: floor of the sum of selected router scores


@dataclass(frozen=True)
class Options:
    qat_sim: bool = True  # FP8/FP4 KV simulation and f16 cache rounding (the model's own numerics)


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


def _norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    return rms_norm(x, w, eps)


# -- RoPE ---------------------------------------------------------------------------------------

class Rope:
    """Tail RoPE with adjacent pairs (x[2k], x[2k+1]) on the last n_rot dims (spec §3.4b).

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


def _hc_flat(X: mx.array, eps: float) -> mx.array:
    T, hc, E = X.shape
    return rms_norm(X.reshape(T, hc * E), None, eps)


def _hc_mixed(X: mx.array, mix: mx.array, scale: mx.array, base: mx.array, hc: int, eps: float, iters: int):
    pre, post, M = _hc_weights(mix, scale, base, hc, eps, iters)
    return of(X).sum(pre[:, :, None] * X, axis=1), post, M


def hc_pre(X: mx.array, project, scale: mx.array, base: mx.array, cfg: ModelConfig):
    """X (T, hc, E) -> sublayer input (T, E), post (T, hc), comb (T, hc, hc); ``project`` is
    the mixing matrix as a function of the normalised flat streams."""
    mix = project(fused(_hc_flat, cfg.rms_eps)(X))  # (T, (2+hc)·hc)
    return fused(_hc_mixed, cfg.hc_count, cfg.hc_eps, cfg.hc_sinkhorn_iters)(X, mix, scale, base)


def hc_post(y: mx.array, X: mx.array, post: mx.array, M: mx.array) -> mx.array:
    """X_new[t, j] = post[t, j]·y[t] + Σ_i M[t, i, j]·X[t, i]  (Mᵀ, not M)."""
    return post[:, :, None] * y[:, None, :] + of(M).swapaxes(M, 1, 2) @ X


# -- compressor ---------------------------------------------------------------------------------

def _pool(kv: mx.array, score: mx.array) -> mx.array:
    """Softmax over the window rows independently per channel, then the weighted sum."""
    xp = of(kv)
    return xp.sum(xp.softmax(score, axis=-2) * kv, axis=-2)


def compressor_step(fr: Frontier, ratio: int, n0: int, kv: mx.array, score: mx.array) -> tuple[mx.array, Frontier, int]:
    """Feed T new projected rows (kv, score: (T, W)) after n0 tokens.

    Returns the pooled rows of every window completed in this batch ((n_emit, d) where d = W
    for ratio 128 and W/2 for ratio 4), the new frontier, and the position of the first
    token of the first emitted window (each later window starts ``ratio`` further on).
    """
    xp = of(kv)
    pending = n0 % ratio
    cur_off = 4 if ratio == 4 else 0  # ratio 4 keeps the previous window in rows 0..3
    seq_kv = xp.concatenate([fr.kv[cur_off : cur_off + pending], kv], axis=0)
    seq_sc = xp.concatenate([fr.score[cur_off : cur_off + pending], score], axis=0)
    L, W = seq_kv.shape
    n_emit = L // ratio
    rem = L - n_emit * ratio
    win_kv = seq_kv[: n_emit * ratio].reshape(n_emit, ratio, W)
    win_sc = seq_sc[: n_emit * ratio].reshape(n_emit, ratio, W)
    if ratio == 4:
        d = W // 2
        prev_kv = xp.concatenate([fr.kv[None, 0:4], win_kv[:-1]], axis=0)
        prev_sc = xp.concatenate([fr.score[None, 0:4], win_sc[:-1]], axis=0)
        # Lane A: channels [0, d) of the previous window; lane B: [d, 2d) of this one.
        pooled = _pool(xp.concatenate([prev_kv[..., :d], win_kv[..., d:]], axis=1),
                       xp.concatenate([prev_sc[..., :d], win_sc[..., d:]], axis=1)) if n_emit else xp.zeros((0, d), xp.float32)
        last_kv = win_kv[-1] if n_emit else fr.kv[0:4]
        last_sc = win_sc[-1] if n_emit else fr.score[0:4]
        tail_kv, tail_sc = seq_kv[n_emit * 4 :], seq_sc[n_emit * 4 :]
        new = Frontier(
            xp.concatenate([last_kv, tail_kv, xp.zeros((4 - rem, W), xp.float32)], axis=0),
            xp.concatenate([last_sc, tail_sc, xp.full((4 - rem, W), NEG_INF, xp.float32)], axis=0),
        )
    else:
        pooled = _pool(win_kv, win_sc) if n_emit else xp.zeros((0, W), xp.float32)
        new = Frontier(
            xp.concatenate([seq_kv[n_emit * ratio :], xp.zeros((ratio - rem, W), xp.float32)], axis=0),
            xp.concatenate([seq_sc[n_emit * ratio :], xp.full((ratio - rem, W), NEG_INF, xp.float32)], axis=0),
        )
    return pooled, new, n0 - pending


def _query(q: mx.array, cos: mx.array, sin: mx.array, H: int, D: int, R: int, eps: float) -> mx.array:
    """q_b output (T, H·D) -> per-head RMS-normalised, rotated queries (H, T, D)."""
    q = rms_norm(q.reshape(q.shape[0], H, D), None, eps)
    return Rope.apply(of(q).swapaxes(q, 0, 1), cos, sin, R)


# -- the model ----------------------------------------------------------------------------------

class Model:
    def __init__(self, weights: Weights, options: Options = Options(), kernels: Kernels | None = None) -> None:
        self.w = weights
        self.cfg = weights.cfg
        self.opt = options
        self.rope = Rope(self.cfg)
        self.k = kernels or ReferenceKernels(weights)
        self.xp = getattr(self.k, "xp", mx)  # the array namespace the kernels take and return
        self._params: dict[str, np.ndarray] = {}

    def param(self, name: str):
        """A small dense tensor (norm weights, biases, hyper-connection scales, sinks) in the
        model's namespace; the numpy copies are made once."""
        if self.xp is mx:
            return self.w.get(name)
        a = self._params.get(name)
        if a is None:
            a = self._params[name] = np.array(to(NP, self.w.get(name)), dtype=np.float32)
        return a

    # The forward pass ------------------------------------------------------------------------
    def forward(self, ids: np.ndarray, state: ModelState, all_logits: bool = False) -> mx.array:
        """Run tokens ``ids`` (positions state.n_tokens ...) and return logits for the last
        token (V,) or for every token (T, V); ``state`` advances in place."""
        cfg = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        p0 = state.n_tokens
        pos = np.arange(p0, p0 + T)
        xp = self.xp
        state.use(xp)
        tables = {c: self.rope.tables(pos, c, xp) for c in (False, True)}
        e = xp.array(self.w.embed(ids))
        X = xp.broadcast_to(e[:, None, :], (T, cfg.hc_count, cfg.n_embd))
        for i in range(cfg.n_layer):
            X = self._layer(i, X, ids, pos, tables, state.layers[i], p0)
            xp.eval(X)  # one layer's graph at a time keeps peak memory to a layer's temporaries
        state.n_tokens = p0 + T
        xp.eval(*state.arrays())
        if all_logits:
            return self._head(X)
        return self._head(X[-1:])[0]

    def _layer(self, i: int, X, ids, pos, tables, st: LayerState, p0: int) -> mx.array:
        w = self.param
        p = f"blk.{i}."
        x, post, M = self.k.hc_pre(X, p + "hc_attn_fn.weight", w(p + "hc_attn_scale.weight"), w(p + "hc_attn_base.weight"))
        y = self._attention(i, x, pos, tables, st, p0)
        X = self.k.hc_post(y, X, post, M)
        x, post, M = self.k.hc_pre(X, p + "hc_ffn_fn.weight", w(p + "hc_ffn_scale.weight"), w(p + "hc_ffn_base.weight"))
        y = self._ffn(i, x, ids)
        return self.k.hc_post(y, X, post, M)

    # Attention -------------------------------------------------------------------------------
    def _attention(self, i: int, x: mx.array, pos: np.ndarray, tables, st: LayerState, p0: int) -> mx.array:
        cfg, w, lin, p, xp = self.cfg, self.param, self.k.linear, f"blk.{i}.", self.xp
        T, R = x.shape[0], cfg.n_rot
        ratio = cfg.ratio(i)
        cos, sin = tables[ratio != 0]
        norm = fused(_norm, cfg.rms_eps)
        a = norm(x, w(p + "attn_norm.weight"))
        # Every product of the normalised input ``a`` in one kernel call; the indexer's only
        # once some query has more compressed rows than it may attend (see _indexer).
        index = ratio == 4 and (int(pos[-1]) + 1) // 4 > cfg.indexer_top_k
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if ratio else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if ratio == 4 else []
        names += ["indexer.proj"] if index else []
        pa = dict(zip(names, self.k.linears(a, tuple(p + n + ".weight" for n in names))))
        qr = norm(pa["attn_q_a"], w(p + "attn_q_a_norm.weight"))
        pq = self.k.linears(qr, (p + "attn_q_b.weight",) + ((p + "indexer.attn_q_b.weight",) if index else ()))
        q = self.k.queries(pq[0], cos, sin)  # (H, T, D)
        kv = norm(pa["attn_kv"], w(p + "attn_kv_a_norm.weight"))
        kv = self._finish_kv(fused(Rope.apply, R)(kv, cos, sin))

        # Compressed rows emitted by this batch, visible from their window's last token on.
        selected = None
        if ratio:
            rows, st.comp_frontier, start = self._compress(i, pa, p0, st.comp_frontier, ratio, "attn_compressor")
            if rows.shape[0]:
                rpos = start + ratio * np.arange(rows.shape[0])
                c, s = self.rope.tables(rpos, True, xp)
                st.comp = xp.concatenate([st.comp, self._finish_kv(fused(Rope.apply, R)(rows, c, s))], axis=0)
            if ratio == 4:
                selected = self._indexer(i, pa, pq[1] if index else None, pos, tables[True], st, p0)

        # Raw window: earlier rows (positions p0-n_raw .. p0-1) then this batch.
        keys = xp.concatenate([st.raw, kv], axis=0)
        kpos = np.arange(p0 - st.raw.shape[0], p0 + T)
        visible = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - cfg.sliding_window)
        mask = visible
        if ratio:
            keys = xp.concatenate([keys, st.comp], axis=0)
            n_vis = (pos + 1) // ratio
            cvis = np.arange(st.comp.shape[0])[None, :] < n_vis[:, None]
            if selected is not None:
                cvis &= selected
            mask = np.concatenate([visible, cvis], axis=1)
        st.raw = xp.concatenate([st.raw, kv], axis=0)[-cfg.sliding_window :]

        out = self.k.attend(q, keys, mask, w(p + "attn_sinks.weight"))  # (H, T, D): K = V

        # Grouped projection: group g = contiguous heads, through rows g·rank..(g+1)·rank of
        # attn_output_a; not one big matmul over all heads.
        low = self.k.grouped(self.k.unrotate(out, cos, sin), p + "attn_output_a.weight")
        return lin(low, p + "attn_output_b.weight")

    def _finish_kv(self, rows: mx.array) -> mx.array:
        """KV cache rounding: FP8 on the non-RoPE dims, then f16 (spec §3.4c)."""
        if not self.opt.qat_sim:
            return rows
        return self.k.kv_round(rows, self.cfg.n_rot)

    def _compress(self, i: int, pa: dict, p0: int, fr: Frontier, ratio: int, prefix: str):
        """Pool completed windows of the projected rows pa[prefix_kv] (scores pa[prefix_gate]),
        RMS-normalise. Returns (rows, frontier, start)."""
        w, p = self.param, f"blk.{i}."
        kv = pa[f"{prefix}_kv"]
        T = kv.shape[0]
        ape = w(p + f"{prefix}_ape.weight")  # (ratio, W), indexed by position % ratio
        phase = self.xp.array((np.arange(p0, p0 + T) % ratio).astype(np.int32))
        sc = pa[f"{prefix}_gate"] + ape[phase]
        pooled, fr, start = compressor_step(fr, ratio, p0, kv, sc)
        return fused(_norm, self.cfg.rms_eps)(pooled, w(p + f"{prefix}_norm.weight")), fr, start

    def _indexer(self, i: int, pa: dict, qi, pos: np.ndarray, table, st: LayerState, p0: int) -> np.ndarray | None:
        """Update the indexer rows; return the (T, n_comp) selection mask, or None when every
        query sees at most top_k rows (then all visible rows are attended, and the caller
        computed no indexer query ``qi`` nor pa["indexer.proj"])."""
        cfg, xp = self.cfg, self.xp
        Di, Hi, R = cfg.indexer_head_dim, cfg.indexer_n_head, cfg.n_rot
        rows, st.idx_frontier, start = self._compress(i, pa, p0, st.idx_frontier, 4, "indexer_compressor")
        if rows.shape[0]:
            c, s = self.rope.tables(start + 4 * np.arange(rows.shape[0]), True, xp)
            rows = Rope.apply(rows, c, s, R)
            if self.opt.qat_sim:
                rows = qat.f16_round(self.k.indexer_round(rows))
            st.idx_comp = xp.concatenate([st.idx_comp, rows], axis=0)
        if qi is None:
            return None
        n_vis = (pos + 1) // 4
        k = cfg.indexer_top_k
        cos, sin = table
        T = qi.shape[0]
        qi = qi.reshape(T, Hi, Di)
        qi = xp.swapaxes(Rope.apply(xp.swapaxes(qi, 0, 1), cos, sin, R), 0, 1)  # (T, Hi, Di)
        if self.opt.qat_sim:
            qi = self.k.indexer_round(qi)
        wi = pa["indexer.proj"] * (1.0 / math.sqrt(Di * Hi))  # (T, Hi)
        dots = xp.maximum(self.k.matmul(qi, st.idx_comp.T), 0.0)  # (T, Hi, C): relu before weighting
        scores = np.array(to(NP, xp.sum(dots * wi[:, :, None], axis=1)))  # (T, C)
        C = scores.shape[1]
        cols = np.arange(C)
        scores = np.where(cols[None, :] < n_vis[:, None], scores, -np.inf)
        # Highest scores first; a stable sort breaks ties toward the lower row index.
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        sel = np.zeros((T, C), dtype=bool)
        np.put_along_axis(sel, order, True, axis=1)
        sel |= (n_vis <= k)[:, None]  # queries with few rows see them all
        return sel & (cols[None, :] < n_vis[:, None])

    # Mixture of experts ----------------------------------------------------------------------
    def _ffn(self, i: int, x: mx.array, ids: np.ndarray) -> mx.array:
        cfg, w, p, xp = self.cfg, self.param, f"blk.{i}.", self.xp
        f = fused(_norm, cfg.rms_eps)(x, w(p + "ffn_norm.weight"))
        logits, g, u = self.k.linears(f, tuple(p + n + ".weight" for n in ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp")))
        # sqrt(softplus), ds4's piecewise form; exp of at most 20 (never overflows in numpy).
        ex = xp.exp(xp.minimum(logits, 20.0))
        prob = xp.sqrt(xp.where(logits > 20, logits, xp.where(logits < -20, ex, xp.log1p(ex))))
        k = cfg.n_expert_used
        if cfg.is_hash_layer(i):
            sel = self.w.hash_experts(i, ids)  # experts of the token being processed
        else:
            biased = prob + w(p + "exp_probs_b.bias") if self.w.has(p + "exp_probs_b.bias") else prob
            sel = np.argsort(-np.array(biased), axis=1, kind="stable")[:, :k]  # ties -> lower index
        chosen = xp.take_along_axis(prob, xp.array(sel.astype(np.int32)), axis=1)  # unbiased scores weight the experts
        if cfg.expert_weights_norm:
            chosen = chosen / xp.maximum(xp.sum(chosen, axis=1, keepdims=True), ROUTE_WEIGHT_FLOOR)
        weights = chosen * cfg.expert_weights_scale  # (T, k)

        clamp = cfg.swiglu_clamp[i]
        routed = self.k.experts(i, f, sel, weights, clamp)
        shared = self.k.linear(swiglu(g, u, clamp), p + "ffn_down_shexp.weight")
        return routed + shared

    # Output head -----------------------------------------------------------------------------
    def _head(self, X: mx.array) -> mx.array:
        cfg, w, xp = self.cfg, self.param, self.xp
        T, hc, E = X.shape
        flat = rms_norm(X.reshape(T, hc * E), None, cfg.rms_eps)
        pre = self.k.linear(flat, "output_hc_fn.weight")
        wts = xp.sigmoid(pre * w("output_hc_scale.weight")[0] + w("output_hc_base.weight")) + cfg.hc_eps
        e = xp.sum(wts[:, :, None] * X, axis=1)
        return self.k.linear(rms_norm(e, w("output_norm.weight"), cfg.rms_eps), "output.weight")
