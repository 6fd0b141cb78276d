"""The DeepSeek V4 Flash forward pass in MLX ops (docs/model.md §3–§4).

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
from .kernels import Kernels
from .kernels.reference import ReferenceKernels
from .ops import Rope, fused, norm, rms_norm, swiglu
from .state import NEG_INF, Frontier, LayerState, ModelState
from .weights import Weights
from .xp import NP, of, to

ROUTE_WEIGHT_FLOOR = 6.103515625e-5  # 2^-14: floor of the sum of selected router scores


@dataclass(frozen=True)
class Options:
    qat_sim: bool = True  # FP8/FP4 KV simulation and f16 cache rounding (the model's own numerics)


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
        rmsn = fused(norm, cfg.rms_eps)
        a = rmsn(x, w(p + "attn_norm.weight"))
        # Every product of the normalised input ``a`` in one kernel call; the indexer's only
        # once some query has more compressed rows than it may attend (see _indexer).
        index = ratio == 4 and (int(pos[-1]) + 1) // 4 > cfg.indexer_top_k
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if ratio else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if ratio == 4 else []
        names += ["indexer.proj"] if index else []
        pa = dict(zip(names, self.k.linears(a, tuple(p + n + ".weight" for n in names))))
        qr = rmsn(pa["attn_q_a"], w(p + "attn_q_a_norm.weight"))
        pq = self.k.linears(qr, (p + "attn_q_b.weight",) + ((p + "indexer.attn_q_b.weight",) if index else ()))
        q = self.k.queries(pq[0], cos, sin)  # (H, T, D)
        kv = rmsn(pa["attn_kv"], w(p + "attn_kv_a_norm.weight"))
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
        """KV cache rounding: FP8 on the non-RoPE dims, then f16 (docs/model.md §3.4c)."""
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
        return fused(norm, self.cfg.rms_eps)(pooled, w(p + f"{prefix}_norm.weight")), fr, start

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
        f = fused(norm, cfg.rms_eps)(x, w(p + "ffn_norm.weight"))
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
