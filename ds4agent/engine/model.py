"""The DeepSeek V4 Flash forward pass in MLX ops (docs/model.md §3–§4).

One function runs a batch of T consecutive tokens through every layer and advances the
streaming state. Decode is the same call with T = 1, so prefill and decode share every line:
a batch computes all its projections at once, then reproduces the token-by-token semantics
with masks (the raw window, compressed rows emitted so far, indexer choices), never by
peeking at later tokens. Dimensions come from ModelConfig; nothing is specialised to 43 layers.

Several sessions decoding together run as one pass too (``forward_batch``, docs/batching.md):
their tokens are the rows of every product, and each session's attention, compressor and
indexer run over its own state (a ``Rows`` per session). The products are then asked for each
row's bits as alone (the kernels' ``alone``), so a session's logits do not depend on the batch.

Arrays are MLX arrays, or numpy arrays when the CPU kernels run (engine/xp.py says why): the
helpers below take the namespace of their input, the Model that of its kernels.

Shapes: T tokens, E hidden, hc streams, H heads of D dims (the last n_rot rotate), G output
groups, r compression ratio, W compressor width (2·D on ratio 4, D on ratio 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from . import qat
from .kernels import Kernels
from .kernels.reference import ReferenceKernels
from .ops import Rope, fused, norm, rms_norm, swiglu
from .state import NEG_INF, Frontier, LayerState, ModelState
from .steering import Steering, project
from .weights import Weights
from .xp import NP, of, to

ROUTE_WEIGHT_FLOOR = 6.103515625e-5  # 2^-14: floor of the sum of selected router scores


@dataclass(frozen=True)
class Options:
    qat_sim: bool = True  # FP8/FP4 KV simulation and f16 cache rounding (the model's own numerics)


@dataclass(frozen=True)
class Part:
    """The share of every layer one process of an expert split computes (docs/distributed.md;
    engine/group/split.py chooses it). Everything else (norms, hyper-connections, the KV projection,
    compressors, indexer, router) is computed in full by every process, so their KV states are
    equal and every discrete choice (experts, indexer rows) is made alike."""

    groups: tuple[int, int]  # attention output groups [g0, g1), with their heads
    shared: tuple[int, int]  # columns of the shared expert's intermediate (its gate/up rows)
    experts: tuple[int, int]  # routed experts [e0, e1)
    vocab: tuple[int, int]  # rows of the output head
    reduce: Callable[[Any], Any]  # the sum over all processes of their partial outputs
    gather: Callable[[Any], Any]  # logit columns of every process, side by side, in rank order


@dataclass(frozen=True)
class Rows:
    """One session's rows lo .. hi of a forward pass, its state and its first position;
    ``trail``: where the pass leaves what ``Model.cut`` needs (None: nothing kept)."""

    state: ModelState
    p0: int
    lo: int
    hi: int
    trail: list | None = None
    steer: "Steering | None" = None  # the session's directional steering (engine/steering.py)


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
        if n_emit:
            pooled = _pool(xp.concatenate([prev_kv[..., :d], win_kv[..., d:]], axis=1),
                           xp.concatenate([prev_sc[..., :d], win_sc[..., d:]], axis=1))
        else:
            pooled = xp.zeros((0, d), xp.float32)
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


def _router_scores(logits: mx.array) -> mx.array:
    """sqrt(softplus(logits)), ds4's piecewise form; exp of at most 20 (never overflows in numpy)."""
    xp = of(logits)
    ex = xp.exp(xp.minimum(logits, 20.0))
    return xp.sqrt(xp.where(logits > 20, logits, xp.where(logits < -20, ex, xp.log1p(ex))))


def _route_weights(prob: mx.array, sel: mx.array, normalise: bool, scale: float) -> mx.array:
    """The chosen experts' weights: their unbiased scores, normalised to sum 1 (floored), scaled."""
    xp = of(prob)
    chosen = xp.take_along_axis(prob, sel, axis=1)
    if normalise:
        chosen = chosen / xp.maximum(xp.sum(chosen, axis=1, keepdims=True), ROUTE_WEIGHT_FLOOR)
    return chosen * scale


def _index_queries(qi: mx.array, cos: mx.array, sin: mx.array, n_rot: int) -> mx.array:
    """Indexer queries (T, Hi, Di): each head rotated at its token's position."""
    xp = of(qi)
    return xp.swapaxes(Rope.apply(xp.swapaxes(qi, 0, 1), cos, sin, n_rot), 0, 1)


def _index_scores(dots: mx.array, wi: mx.array, scale: float) -> mx.array:
    """Per compressed row, the heads' relu'd dot products weighted by the token's head weights."""
    xp = of(dots)
    return xp.sum(xp.maximum(dots, 0.0) * (wi * scale)[:, :, None], axis=1)


# -- the model ----------------------------------------------------------------------------------

class Model:
    def __init__(self, weights: Weights, options: Options = Options(), kernels: Kernels | None = None,
                 part: Part | None = None, output: Kernels | None = None) -> None:
        """``output``: the kernels that multiply by ``output.weight`` (default ``kernels``): an
        MTP block (engine/mtp.py) shares the target's output matrix, and its kernels, so that
        the matrix is not held twice."""
        self.w = weights
        self.part = part
        self.cfg = weights.cfg
        self.opt = options
        self.rope = Rope(self.cfg)
        self.k = kernels or ReferenceKernels(weights)
        self._output = output
        self.xp = getattr(self.k, "xp", mx)  # the array namespace the kernels take and return
        self._params: dict[str, np.ndarray] = {}

    @property
    def output(self) -> Kernels:
        """The kernels of the output matrix (``output`` at construction, else the model's)."""
        return self._output or self.k

    def param(self, name: str):
        """A small dense tensor (norm weights, biases, hyper-connection scales, sinks) in the
        model's namespace; the numpy copies are made once."""
        if self.xp is mx:
            return self.w.get(name)
        a = self._params.get(name)
        if a is None:
            a = self._params[name] = np.array(to(NP, self.w.get(name)), dtype=np.float32)
        return a

    # The state's layout: one process, host arrays (what Session asks of every model) ------------
    def empty_state(self) -> ModelState:
        return ModelState.empty(self.cfg)

    def for_snapshot(self, state: ModelState) -> ModelState:
        """The whole state as a payload holds it: here, the state itself."""
        return state

    def from_snapshot(self, state: ModelState) -> ModelState:
        """A loaded whole state in this model's layout: here, as it is."""
        return state

    # The forward pass ------------------------------------------------------------------------
    def forward(self, ids: np.ndarray, state: ModelState, all_logits: bool = False, alone: bool = False,
                hidden: bool = False, trail: list | None = None, steer: Steering | None = None,
                capture: dict | None = None):
        """Run tokens ``ids`` (positions state.n_tokens ...) and return logits for the last
        token (V,) or for every token (T, V); ``state`` advances in place. ``alone``: every
        position computed to the bits of a step of that token alone (the products as in a
        batch, docs/batching.md; attention, compressors and indexer give those bits anyway):
        the verification of proposed tokens (docs/speculation.md). ``hidden``: return (logits,
        the last layer's streams (T, hc, E)), what an MTP block drafts from (engine/mtp.py).
        ``trail``: a list the pass fills with each layer's new KV and compressor rows, from
        which ``cut`` makes the state after only the first tokens. ``steer``: directional steering
        of these tokens' sublayer outputs. ``capture``: a dict the pass fills with each layer's
        attention and FFN outputs (as steered; with steering, "attn_raw"/"ffn_raw" before it)
        and hidden streams, lists of arrays in layer order."""
        ids = np.asarray(ids, dtype=np.int64)
        p0 = state.n_tokens
        rows = [Rows(state, p0, 0, len(ids), trail, steer)]
        alone = alone and len(ids) > 1
        X = self._pass(self.embed(ids), ids, np.arange(p0, p0 + len(ids)), rows, range(self.cfg.n_layer), alone,
                       capture)
        self.advance(state, len(ids))
        logits = self._head(X, alone) if all_logits else self._head(X[-1:])[0]
        return (logits, X) if hidden else logits

    def forward_batch(self, ids: np.ndarray, states: list[ModelState],
                      steers: list[Steering | None] | None = None) -> mx.array:
        """One token of each of several sessions (``ids[b]`` at position states[b].n_tokens) in
        one pass: the logits (B, V), each row the bits that session gets from ``forward`` alone
        (with its own steering, ``steers[b]``); every state advances by one token."""
        if self.part is not None:
            raise ValueError("a distributed group runs one session at a time")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (len(states),) or len({id(st) for st in states}) != len(states):
            raise ValueError(f"a batch takes one token for each of distinct sessions ({ids.shape} for {len(states)})")
        steers = steers or [None] * len(states)
        rows = [Rows(st, st.n_tokens, b, b + 1, steer=steers[b]) for b, st in enumerate(states)]
        pos = np.array([st.n_tokens for st in states], dtype=np.int64)
        X = self._pass(self.embed(ids), ids, pos, rows, range(self.cfg.n_layer), alone=len(states) > 1)
        for st in states:
            self.advance(st, 1)
        return self._head(X, alone=len(states) > 1)

    # A pipeline stage (engine/group/distributed.py) runs the same pieces: embed on the first stage,
    # ``layers`` over its own range, ``head`` on the last; ``advance`` on every stage.
    def embed(self, ids: np.ndarray):
        """The hidden streams (T, hc, E) of tokens ``ids``: each token's embedding row, hc times."""
        cfg, xp = self.cfg, self.xp
        e = xp.array(self.w.embed(np.asarray(ids, dtype=np.int64)))
        return xp.broadcast_to(e[:, None, :], (len(ids), cfg.hc_count, cfg.n_embd))

    def layers(self, X, ids: np.ndarray, state: ModelState, layers: range):
        """Streams X of tokens ``ids`` (positions state.n_tokens ...) through ``layers``,
        advancing their states; state.n_tokens is left to ``advance``."""
        p0 = state.n_tokens
        return self._pass(X, ids, np.arange(p0, p0 + len(ids)), [Rows(state, p0, 0, len(ids))], layers)

    def _pass(self, X, ids: np.ndarray, pos: np.ndarray, rows: list[Rows], layers: range, alone: bool = False,
              capture: dict | None = None):
        """Streams X of tokens ``ids`` at positions ``pos`` through ``layers``, each session's
        rows over its own state (``rows``); ``alone``: the rows are different sessions'."""
        xp = self.xp
        for r in rows:
            r.state.use(xp)
        tables = {c: self.rope.tables(pos, c, xp) for c in (False, True)}
        if len(layers):
            self._prefetch(layers[0], None, ids)
        for i in layers:
            X = self._layer(i, X, ids, pos, tables, rows, alone, capture)
            xp.eval(X)  # one layer's graph at a time keeps peak memory to a layer's temporaries
            if capture is not None:
                capture.setdefault("hidden", []).append(X)
        return X

    def cut(self, before: ModelState, trail: list, m: int) -> ModelState:
        """The state after only the first ``m`` tokens of a pass that started from ``before``
        and left ``trail``: each layer's window and compressor rows advanced by those tokens'
        rows alone, as a pass of those tokens would advance them (the rows of a position do
        not depend on the positions after it), without running the layers again. What a
        rejected proposal leaves behind (docs/speculation.md)."""
        state = before.fork()
        state.use(self.xp)
        for i, pa, kv, pos, p0 in trail:
            self._visible(i, {k: v[:m] for k, v in pa.items()}, None, kv[:m], pos[:m], None, state.layers[i], p0)
        self.advance(state, m)
        return state

    def advance(self, state: ModelState, T: int) -> None:
        state.n_tokens += T
        self.xp.eval(*state.arrays())

    def head(self, X, all_logits: bool = False):
        """Logits of the last token (V,), or of every token (T, V)."""
        return self._head(X) if all_logits else self._head(X[-1:])[0]

    def _layer(self, i: int, X, ids, pos, tables, rows: list[Rows], alone: bool, capture: dict | None = None):
        w = self.param
        p = f"blk.{i}."
        # (a keyword only in a batch: kernels that never batch keep their signatures)
        one = {"alone": True} if alone else {}
        x, post, M = self.k.hc_pre(X, p + "hc_attn_fn.weight", w(p + "hc_attn_scale.weight"),
                                   w(p + "hc_attn_base.weight"), **one)
        y = self._steered(self._attention(i, x, pos, tables, rows, one), i, "attn", rows, capture)
        X = self.k.hc_post(y, X, post, M)
        x, post, M = self.k.hc_pre(X, p + "hc_ffn_fn.weight", w(p + "hc_ffn_scale.weight"),
                                   w(p + "hc_ffn_base.weight"), **one)
        y = self._steered(self._ffn(i, x, ids, one), i, "ffn", rows, capture)
        return self.k.hc_post(y, X, post, M)

    def _steered(self, y, i: int, which: str, rows: list[Rows], capture: dict | None):
        """Sublayer output ``y`` (T, E) of layer ``i`` with each session's steering applied to
        its rows (engine/steering.py); untouched, not recomputed, where no scale is set."""
        xp = self.xp
        raw = y
        for r in rows:
            s = getattr(r.steer, which, 0.0) if r.steer is not None else 0.0
            if s == 0.0:
                continue
            v = r.steer.vector(i, xp)
            if len(rows) == 1:
                y = project(y, v, s, xp)
            else:  # (a batch of one-row sessions: this session's row, the others as they were)
                y = xp.concatenate([y[: r.lo], project(y[r.lo : r.hi], v, s, xp), y[r.hi :]], axis=0)
        if capture is not None:
            capture.setdefault(which, []).append(y)
            if y is not raw:  # steered: what the sublayer gave before (the projection's input)
                capture.setdefault(which + "_raw", []).append(raw)
        return y

    # Attention -------------------------------------------------------------------------------
    def _attention(self, i: int, x: mx.array, pos: np.ndarray, tables, rows: list[Rows], one: dict) -> mx.array:
        cfg, w, lin, p, xp = self.cfg, self.param, self.k.linear, f"blk.{i}.", self.xp
        T, R = x.shape[0], cfg.n_rot
        ratio = cfg.ratio(i)
        cos, sin = tables[ratio != 0]
        rmsn = fused(norm, cfg.rms_eps)
        a = rmsn(x, w(p + "attn_norm.weight"))
        # Every product of the normalised input ``a`` in one kernel call; the indexer's only
        # once some query has more compressed rows than it may attend (see _indexer): in a
        # batch, for all rows when any session needs it (the others ignore theirs).
        indexed = [ratio == 4 and (int(pos[r.hi - 1]) + 1) // 4 > cfg.indexer_top_k for r in rows]
        index = any(indexed)
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if ratio else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if ratio == 4 else []
        names += ["indexer.proj"] if index else []
        pa = dict(zip(names, self.k.linears(a, tuple(p + n + ".weight" for n in names), **one)))
        qr = rmsn(pa["attn_q_a"], w(p + "attn_q_a_norm.weight"))
        part = self.part
        if part is None:
            pq = self.k.linears(qr, (p + "attn_q_b.weight",) + ((p + "indexer.attn_q_b.weight",) if index else ()),
                                **one)
            h0, h1 = 0, cfg.n_head
        else:  # this process's heads: their rows of attn_q_b; the indexer's query in full
            h0, h1 = (g * (cfg.n_head // cfg.n_out_group) for g in part.groups)
            D = cfg.head_dim
            pq = [self.k.linear(qr, p + "attn_q_b.weight", (h0 * D, h1 * D)) if h1 > h0 else None]
            pq += [self.k.linear(qr, p + "indexer.attn_q_b.weight")] if index else []
        kv = rmsn(pa["attn_kv"], w(p + "attn_kv_a_norm.weight"))
        kv = self._finish_kv(fused(Rope.apply, R)(kv, cos, sin))

        # Each session over its own state: keys, masks and the updated window and compressed rows.
        views = []
        for r, idx in zip(rows, indexed):
            whole = len(rows) == 1  # (one session: its arrays as they are, no slices)
            mine = pa if whole else {k: v[r.lo : r.hi] for k, v in pa.items()}
            qi = (pq[1] if whole else pq[1][r.lo : r.hi]) if idx else None
            kv_r = kv if whole else kv[r.lo : r.hi]
            if r.trail is not None:  # what the window and the compressors take in (Model.cut)
                r.trail.append((i, {k: v for k, v in mine.items() if "compressor" in k}, kv_r, pos[r.lo : r.hi], r.p0))
            views.append(self._visible(i, mine, qi, kv_r, pos[r.lo : r.hi],
                                       (tables[True][0][r.lo : r.hi], tables[True][1][r.lo : r.hi]) if ratio == 4
                                       else None, r.state.layers[i], r.p0))
        if h1 == h0:  # an expert-split process with no heads (more processes than groups)
            return self.part.reduce(xp.zeros((T, cfg.n_embd), xp.float32))

        q = self.k.queries(pq[0], cos, sin)  # (H, T, D), this process's heads
        sinks = w(p + "attn_sinks.weight")
        sinks = sinks if part is None else sinks[h0:h1]
        if len(rows) == 1:
            out = self.k.attend(q, views[0][0], views[0][1], sinks)  # (H, T, D): K = V
        else:
            out = xp.concatenate([self.k.attend(q[:, r.lo : r.hi], keys, mask, sinks)
                                  for r, (keys, mask) in zip(rows, views)], axis=1)

        # Grouped projection: group g = contiguous heads, through rows g·rank..(g+1)·rank of
        # attn_output_a; not one big matmul over all heads.
        slabs = self.k.unrotate(out, cos, sin)
        if part is None:
            return lin(self.k.grouped(slabs, p + "attn_output_a.weight", **one), p + "attn_output_b.weight", **one)
        # Groups g0..g1: their rows of attn_output_a, then their columns of attn_output_b; the
        # partial outputs of all processes sum to the whole projection.
        g0, g1 = part.groups
        rank = cfg.o_lora_rank
        low = xp.concatenate([lin(slabs[:, g - g0], p + "attn_output_a.weight", (g * rank, (g + 1) * rank))
                              for g in range(g0, g1)], axis=-1)
        return part.reduce(lin(low, p + "attn_output_b.weight", None, (g0 * rank, g1 * rank)))

    def _visible(self, i: int, pa: dict, qi, kv, pos: np.ndarray, table, st: LayerState, p0: int):
        """One session's side of a layer's attention over its rows (products ``pa``, indexer
        query ``qi`` or None, new KV rows ``kv`` at positions ``pos``): the compressed rows its
        batch completes, the indexer's choice, then the keys it attends (N, D) and the mask
        (T, N); its window and compressed rows advance in ``st``."""
        cfg, xp, R = self.cfg, self.xp, self.cfg.n_rot
        ratio = cfg.ratio(i)
        T = kv.shape[0]
        # Compressed rows emitted by this batch, visible from their window's last token on.
        selected = None
        if ratio:
            rows, st.comp_frontier, start = self._compress(i, pa, p0, st.comp_frontier, ratio, "attn_compressor")
            if rows.shape[0]:
                rpos = start + ratio * np.arange(rows.shape[0])
                c, s = self.rope.tables(rpos, True, xp)
                st.comp = xp.concatenate([st.comp, self._finish_kv(fused(Rope.apply, R)(rows, c, s))], axis=0)
            if ratio == 4:
                selected = self._indexer(i, pa, qi, pos, table, st, p0)

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
        return keys, mask

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
            rows = fused(Rope.apply, R)(rows, c, s)
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
        qi = fused(_index_queries, R)(qi, cos, sin)  # (T, Hi, Di)
        if self.opt.qat_sim:
            qi = self.k.indexer_round(qi)
        dots = self.k.matmul(qi, st.idx_comp.T)  # (T, Hi, C); relu before weighting
        scores = np.array(to(NP, fused(_index_scores, 1.0 / math.sqrt(Di * Hi))(dots, pa["indexer.proj"])))  # (T, C)
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
    def _ffn(self, i: int, x: mx.array, ids: np.ndarray, one: dict | None = None) -> mx.array:
        cfg, w, p, xp = self.cfg, self.param, f"blk.{i}.", self.xp
        one = one or {}
        f = fused(norm, cfg.rms_eps)(x, w(p + "ffn_norm.weight"))
        part = self.part
        if part is None:
            names = tuple(p + n + ".weight" for n in ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp"))
            logits, g, u = self.k.linears(f, names, **one)
        else:  # the router in full; this process's rows of the shared expert
            logits = self.k.linear(f, p + "ffn_gate_inp.weight")
            c0, c1 = part.shared
            g, u = (self.k.linear(f, p + n, (c0, c1)) if c1 > c0 else None
                    for n in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"))
        prob = fused(_router_scores)(logits)
        k = cfg.n_expert_used
        if cfg.is_hash_layer(i):
            sel = self.w.hash_experts(i, ids)  # experts of the token being processed
        else:
            biased = prob + w(p + "exp_probs_b.bias") if self.w.has(p + "exp_probs_b.bias") else prob
            sel = np.argsort(-np.array(biased), axis=1, kind="stable")[:, :k]  # ties -> lower index
        weights = fused(_route_weights, cfg.expert_weights_norm, cfg.expert_weights_scale)(
            prob, xp.array(sel.astype(np.int32)))  # (T, k)

        clamp = cfg.swiglu_clamp[i]
        self._prefetch(i + 1, f, ids)  # read while this layer's experts compute
        if part is None:
            routed = self.k.experts(i, f, sel, weights, clamp, **one)
            shared = self.k.linear(swiglu(g, u, clamp), p + "ffn_down_shexp.weight", **one)
            return routed + shared
        out = self._own_experts(i, f, sel, weights, clamp)
        if c1 > c0:
            out = out + self.k.linear(swiglu(g, u, clamp), p + "ffn_down_shexp.weight", None, (c0, c1))
        return part.reduce(out)

    def _prefetch(self, i: int, f, ids: np.ndarray) -> None:
        """With experts streaming (engine/expertpool.py): start reading layer ``i``'s likely
        experts, most wanted first. A hash-routed layer's are known from the token ids; another
        layer's are guessed by its router applied to ``f``, the previous layer's FFN input (the
        residual stream changes little from one layer to the next; None: no guess). Only reads
        ahead: which experts run is decided by the layer itself, as always."""
        pool = self.w.pool
        if pool is None or i >= self.cfg.n_layer:
            return

        def most_wanted(chosen: np.ndarray) -> np.ndarray:
            experts, counts = np.unique(chosen, return_counts=True)
            return experts[np.argsort(-counts, kind="stable")]

        def router_guess() -> np.ndarray:  # run only when the pool will read the guess
            p = f"blk.{i}."
            prob = np.array(to(NP, fused(_router_scores)(self.k.linear(f, p + "ffn_gate_inp.weight"))))
            if self.w.has(p + "exp_probs_b.bias"):
                prob = prob + np.array(to(NP, self.param(p + "exp_probs_b.bias")))
            return most_wanted(np.argsort(-prob, axis=1, kind="stable")[:, : self.cfg.n_expert_used])

        if self.cfg.is_hash_layer(i):
            pool.prefetch(i, most_wanted(self.w.hash_experts(i, ids)))
        elif f is not None:
            pool.prefetch(i, router_guess, guess=True)

    def _own_experts(self, i: int, f, sel: np.ndarray, weights, clamp: float):
        """The routed FFN over only the chosen slots whose expert this process holds: each such
        (token, slot) becomes one row with one expert, so the kernels touch no other expert,
        and the rows are added back to their tokens."""
        xp = self.xp
        e0, e1 = self.part.experts
        tok, slot = np.nonzero((sel >= e0) & (sel < e1))
        out = xp.zeros(f.shape, xp.float32)
        if not len(tok):
            return out
        t_ix, s_ix = xp.array(tok.astype(np.int32)), xp.array(slot.astype(np.int32))
        rows = self.k.experts(i, f[t_ix], sel[tok, slot][:, None], weights[t_ix, s_ix][:, None], clamp)
        if xp is mx:
            return out.at[t_ix].add(rows)
        np.add.at(out, tok, rows)
        return out

    # Output head -----------------------------------------------------------------------------
    def _head(self, X: mx.array, alone: bool = False) -> mx.array:
        cfg, w, xp = self.cfg, self.param, self.xp
        one = {"alone": True} if alone else {}
        T, hc, E = X.shape
        flat = rms_norm(X.reshape(T, hc * E), None, cfg.rms_eps)
        pre = self.k.linear(flat, "output_hc_fn.weight", **one)
        wts = xp.sigmoid(pre * w("output_hc_scale.weight")[0] + w("output_hc_base.weight")) + cfg.hc_eps
        e = xp.sum(wts[:, :, None] * X, axis=1)
        h = rms_norm(e, w("output_norm.weight"), cfg.rms_eps)
        if self.part is None:
            return self.output.linear(h, "output.weight", **one)
        return self.part.gather(self.output.linear(h, "output.weight", self.part.vocab))  # each row as computed alone
