"""The DeepSeek V4 Flash forward pass in torch: the Ascend module's second implementation of
engine/model.py (docs/model.md §3–§4), for devices MLX does not run on.

Same structure and the same mathematics line for line: one call runs T consecutive tokens
through every layer and advances the streaming state; decode is T = 1; a batch reproduces the
token-by-token semantics with masks. The difference is where things happen: every mask,
routing choice and indexer selection is made on the device (the MLX path makes them in
numpy), the heavy operations go through the registry (fused NPU op or plain torch), and the
layers may be split across several devices, the hidden state moving once per boundary.

The state is engine/state.py's ModelState with torch tensors in it, each layer's on its own
stage's device, so sessions, snapshots and the payload format are the MLX engine's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..model import Options
from ..ops import Rope
from ..state import NEG_INF, Frontier, LayerState, ModelState
from ..xp import NP
from . import plain, qat
from .registry import Registry
from .weights import DeviceWeights

TORCH = "torch"  # ModelState.xp of a state whose arrays are this module's tensors


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, inverse: bool = False) -> torch.Tensor:
    """Rotate the adjacent pairs of the last n_rot dims (§3.4b); cos/sin (T, n_rot/2)
    broadcast against x's (..., T, D) (a head axis before T, as in (H, T, D), also works)."""
    d = x.shape[-1] - n_rot
    s = -sin if inverse else sin
    a, b = x[..., d::2], x[..., d + 1 :: 2]
    out = x.clone()
    out[..., d::2] = a * cos - b * s
    out[..., d + 1 :: 2] = a * s + b * cos
    return out


def _pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Softmax over the window rows separately per channel, then the weighted sum (§3.5)."""
    return (torch.softmax(score, dim=-2) * kv).sum(dim=-2)


def compressor_step(fr: Frontier, ratio: int, n0: int, kv: torch.Tensor, score: torch.Tensor):
    """engine/model.compressor_step in torch: feed T projected rows after n0 tokens; returns
    (pooled rows of the windows completed, new frontier, position of the first window)."""
    dev = kv.device
    pending = n0 % ratio
    cur = 4 if ratio == 4 else 0
    seq_kv = torch.cat([fr.kv[cur : cur + pending], kv], dim=0)
    seq_sc = torch.cat([fr.score[cur : cur + pending], score], dim=0)
    L, W = seq_kv.shape
    n_emit = L // ratio
    rem = L - n_emit * ratio
    win_kv = seq_kv[: n_emit * ratio].reshape(n_emit, ratio, W)
    win_sc = seq_sc[: n_emit * ratio].reshape(n_emit, ratio, W)
    zeros = lambda n: torch.zeros((n, W), dtype=torch.float32, device=dev)  # noqa: E731
    empty = lambda n: torch.full((n, W), NEG_INF, dtype=torch.float32, device=dev)  # noqa: E731
    if ratio == 4:
        d = W // 2
        if n_emit:
            prev_kv = torch.cat([fr.kv[None, 0:4], win_kv[:-1]], dim=0)
            prev_sc = torch.cat([fr.score[None, 0:4], win_sc[:-1]], dim=0)
            # Lane A: channels [0, d) of the previous window; lane B: [d, 2d) of this one.
            pooled = _pool(torch.cat([prev_kv[..., :d], win_kv[..., d:]], dim=1),
                           torch.cat([prev_sc[..., :d], win_sc[..., d:]], dim=1))
        else:
            pooled = torch.zeros((0, d), dtype=torch.float32, device=dev)
        last_kv = win_kv[-1] if n_emit else fr.kv[0:4]
        last_sc = win_sc[-1] if n_emit else fr.score[0:4]
        new = Frontier(torch.cat([last_kv, seq_kv[n_emit * 4 :], zeros(4 - rem)], dim=0),
                       torch.cat([last_sc, seq_sc[n_emit * 4 :], empty(4 - rem)], dim=0))
    else:
        pooled = _pool(win_kv, win_sc) if n_emit else torch.zeros((0, W), dtype=torch.float32, device=dev)
        new = Frontier(torch.cat([seq_kv[n_emit * ratio :], zeros(ratio - rem)], dim=0),
                       torch.cat([seq_sc[n_emit * ratio :], empty(ratio - rem)], dim=0))
    return pooled, new, n0 - pending


def _tensor(a, device: torch.device) -> torch.Tensor:
    """A state array (MLX, numpy or torch, as a fresh state or a loaded snapshot has it) as a
    float32 tensor on ``device``."""
    if isinstance(a, torch.Tensor):
        return a if a.device == device else a.to(device)
    return torch.from_numpy(np.array(a, dtype=np.float32)).to(device)


def _host(a) -> np.ndarray | None:
    return None if a is None else a.detach().to("cpu").numpy()


class AscendModel:
    """What engine/session.Session runs: ``cfg``, ``opt`` and ``forward(ids, state)``."""

    def __init__(self, weights: DeviceWeights, options: Options, registry: Registry) -> None:
        self.w = weights
        self.cfg = weights.cfg
        self.opt = options
        self.reg = registry
        self.rope = Rope(self.cfg)
        self.moves = 0  # hidden states moved between stages (one per boundary per call)

    # -- state ---------------------------------------------------------------------------------
    def empty_state(self) -> ModelState:
        return ModelState.empty(self.cfg)

    def for_snapshot(self, state: ModelState) -> ModelState:
        """A copy of ``state`` with every tensor as a host numpy array (what write_payload
        reads); the device tensors are untouched."""
        layers = []
        for st in state.layers:
            if st is None or not isinstance(st.raw, torch.Tensor):
                layers.append(st)
                continue
            fr = [None if f is None else Frontier(_host(f.kv), _host(f.score))
                  for f in (st.comp_frontier, st.idx_frontier)]
            layers.append(LayerState(st.ratio, _host(st.raw), _host(st.comp), fr[0], _host(st.idx_comp), fr[1]))
        return ModelState(layers, state.n_tokens)

    def from_snapshot(self, state: ModelState) -> ModelState:
        """A loaded state as it is: forward places it on the devices when it first runs."""
        return state

    def place(self, state: ModelState) -> None:
        """Each layer's arrays onto its stage's device, as float32 tensors: once for a new
        state or a loaded snapshot (MLX arrays), nothing afterwards."""
        if state.xp == TORCH:
            return
        for i, st in enumerate(state.layers):
            if st is None:
                continue
            dev = self.w.devices[self.w.layer_stage[i]]
            st.raw = _tensor(st.raw, dev)
            st.comp = None if st.comp is None else _tensor(st.comp, dev)
            st.idx_comp = None if st.idx_comp is None else _tensor(st.idx_comp, dev)
            for fr in (st.comp_frontier, st.idx_frontier):
                if fr is not None:
                    fr.kv, fr.score = _tensor(fr.kv, dev), _tensor(fr.score, dev)
        state.xp = TORCH

    # -- the forward pass ----------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: np.ndarray, state: ModelState, all_logits: bool = False) -> np.ndarray:
        """Run tokens ``ids`` (positions state.n_tokens ...) and return the logits of the last
        token (V,), or of every token (T, V), as float32 numpy; ``state`` advances (its
        fields are rebound to new tensors, never written into: a fork stays intact)."""
        cfg, w = self.cfg, self.w
        ids = np.asarray(ids, dtype=np.int64)
        T, p0 = len(ids), state.n_tokens
        pos = np.arange(p0, p0 + T)
        self.place(state)
        per_stage: dict[int, dict] = {}
        stage = 0
        X = None
        for i in range(cfg.n_layer):
            s = w.layer_stage[i]
            if s not in per_stage:
                per_stage[s] = self._stage_inputs(w.devices[s], ids, pos)
            ctx = per_stage[s]
            if X is None:
                e = w.embed(ctx["ids"])
                X = e[:, None, :].expand(T, cfg.hc_count, cfg.n_embd).contiguous()
            elif s != stage:
                X = X.to(w.devices[s])
                self.moves += 1
            stage = s
            X = self._layer(i, X, ctx, state.layers[i], p0)
        state.n_tokens = p0 + T
        logits = self._head(X if all_logits else X[-1:])
        out = logits.to("cpu").numpy()
        return out if all_logits else out[0]

    def _stage_inputs(self, dev: torch.device, ids: np.ndarray, pos: np.ndarray) -> dict:
        """What every layer of a stage shares: the token ids, positions and RoPE tables."""
        tabs = {c: tuple(torch.from_numpy(t).to(dev) for t in self.rope.tables(pos, c, NP)) for c in (False, True)}
        return {"ids": torch.from_numpy(ids).to(dev), "pos": torch.from_numpy(pos).to(dev), "np_pos": pos,
                "tables": tabs, "dev": dev}

    def _layer(self, i: int, X: torch.Tensor, ctx: dict, st: LayerState, p0: int) -> torch.Tensor:
        p, w = f"blk.{i}.", self.w.param
        x, post, M = self._hc_pre(X, p + "hc_attn_fn.weight", w(p + "hc_attn_scale.weight"),
                                  w(p + "hc_attn_base.weight"))
        X = plain.hc_post(self._attention(i, x, ctx, st, p0), X, post, M)
        x, post, M = self._hc_pre(X, p + "hc_ffn_fn.weight", w(p + "hc_ffn_scale.weight"), w(p + "hc_ffn_base.weight"))
        return plain.hc_post(self._ffn(i, x, ctx), X, post, M)

    def _hc_pre(self, X: torch.Tensor, fn: str, scale: torch.Tensor, base: torch.Tensor):
        """X (T, hc, E) -> sublayer input (T, E), post (T, hc), comb (T, hc, hc) (§3.2)."""
        cfg = self.cfg
        T, hc, E = X.shape
        flat = plain.rms_norm(X.reshape(T, hc * E), None, cfg.rms_eps)
        mix = self.reg.linear(flat, self.w.matrix(fn))
        pre, post, logits = plain.hc_weights(mix, scale, base, hc, cfg.hc_eps)
        M = self.reg.sinkhorn(logits, cfg.hc_eps, cfg.hc_sinkhorn_iters)
        return (pre[:, :, None] * X).sum(dim=1), post, M

    def _lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.reg.linear(x, self.w.matrix(name))

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.reg.rms_norm(x, self.w.param(name), self.cfg.rms_eps)

    def _finish_kv(self, rows: torch.Tensor) -> torch.Tensor:
        """KV cache rounding: FP8 on the non-RoPE dims, then f16 (§3.4c)."""
        return qat.kv_round(rows, self.cfg.n_rot) if self.opt.qat_sim else rows

    # -- attention -----------------------------------------------------------------------------
    def _attention(self, i: int, x: torch.Tensor, ctx: dict, st: LayerState, p0: int) -> torch.Tensor:
        cfg, p, dev = self.cfg, f"blk.{i}.", ctx["dev"]
        T, R, H, D = x.shape[0], cfg.n_rot, cfg.n_head, cfg.head_dim
        pos_np = ctx["np_pos"]
        ratio = cfg.ratio(i)
        cos, sin = ctx["tables"][ratio != 0]
        a = self._norm(x, p + "attn_norm.weight")
        index = ratio == 4 and (int(pos_np[-1]) + 1) // 4 > cfg.indexer_top_k
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if ratio else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if ratio == 4 else []
        names += ["indexer.proj"] if index else []
        pa = {n: self._lin(a, p + n + ".weight") for n in names}
        qr = self._norm(pa["attn_q_a"], p + "attn_q_a_norm.weight")
        q = self._lin(qr, p + "attn_q_b.weight")
        q = plain.rms_norm(q.reshape(T, H, D), None, cfg.rms_eps).transpose(0, 1)  # per-head, no weight
        q = rope(q, cos, sin, R)  # (H, T, D)
        kv = self._finish_kv(rope(self._norm(pa["attn_kv"], p + "attn_kv_a_norm.weight"), cos, sin, R))

        selected = None
        if ratio:
            rows, st.comp_frontier, start = self._compress(i, pa, p0, st.comp_frontier, ratio, "attn_compressor", dev)
            if rows.shape[0]:
                c, s = self._tables(start + ratio * np.arange(rows.shape[0]), dev)
                st.comp = torch.cat([st.comp, self._finish_kv(rope(rows, c, s, R))], dim=0)
            if ratio == 4:
                qi = self._lin(qr, p + "indexer.attn_q_b.weight") if index else None
                selected = self._indexer(i, pa, qi, ctx, st, p0)

        # Raw window: earlier rows (positions p0 - n_raw ... p0 - 1), then this batch.
        pos = ctx["pos"]
        keys = torch.cat([st.raw, kv], dim=0)
        kpos = torch.arange(p0 - st.raw.shape[0], p0 + T, device=dev)
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - cfg.sliding_window)
        if ratio:
            keys = torch.cat([keys, st.comp], dim=0)
            n_vis = (pos + 1) // ratio
            cvis = torch.arange(st.comp.shape[0], device=dev)[None, :] < n_vis[:, None]
            if selected is not None:
                cvis = cvis & selected
            mask = torch.cat([mask, cvis], dim=1)
        st.raw = torch.cat([st.raw, kv], dim=0)[-cfg.sliding_window :]

        out = self.reg.attend(q, keys, mask, self.w.param(p + "attn_sinks.weight"))  # (H, T, D), K = V
        # Rotate back, group heads g·H/G ... (g+1)·H/G, each group through its own rows of
        # attn_output_a (eight products on Flash, not one).
        low = rope(out, cos, sin, R, inverse=True).transpose(0, 1).reshape(T, cfg.n_out_group, -1)
        wa = self.w.matrix(p + "attn_output_a.weight")
        G = cfg.n_out_group
        rows_g = wa.shape[0] // G
        low = torch.cat([self.reg.linear(low[:, g], _rows(wa, g * rows_g, (g + 1) * rows_g)) for g in range(G)], dim=-1)
        return self._lin(low, p + "attn_output_b.weight")

    def _tables(self, positions: np.ndarray, dev: torch.device):
        return tuple(torch.from_numpy(t).to(dev) for t in self.rope.tables(positions, True, NP))

    def _compress(self, i: int, pa: dict, p0: int, fr: Frontier, ratio: int, prefix: str, dev: torch.device):
        """Pool completed windows of pa[prefix_kv] (scores pa[prefix_gate] + APE), normalise."""
        p = f"blk.{i}."
        kv = pa[f"{prefix}_kv"]
        T = kv.shape[0]
        ape = self.w.param(p + f"{prefix}_ape.weight")  # (ratio, W), by position % ratio
        phase = torch.arange(p0, p0 + T, device=dev) % ratio
        pooled, fr, start = compressor_step(fr, ratio, p0, kv, pa[f"{prefix}_gate"] + ape[phase])
        return self._norm(pooled, p + f"{prefix}_norm.weight"), fr, start

    def _indexer(self, i: int, pa: dict, qi, ctx: dict, st: LayerState, p0: int):
        """Update the indexer rows; return the (T, C) selection, or None when no query has
        more than top-k rows (§3.6)."""
        cfg, dev = self.cfg, ctx["dev"]
        Di, Hi, R = cfg.indexer_head_dim, cfg.indexer_n_head, cfg.n_rot
        rows, st.idx_frontier, start = self._compress(i, pa, p0, st.idx_frontier, 4, "indexer_compressor", dev)
        if rows.shape[0]:
            c, s = self._tables(start + 4 * np.arange(rows.shape[0]), dev)
            rows = rope(rows, c, s, R)
            if self.opt.qat_sim:
                rows = qat.f16_round(qat.indexer_round(rows))
            st.idx_comp = torch.cat([st.idx_comp, rows], dim=0)
        if qi is None:
            return None
        cos, sin = ctx["tables"][True]
        T = qi.shape[0]
        qi = rope(qi.reshape(T, Hi, Di).transpose(0, 1), cos, sin, R).transpose(0, 1)  # (T, Hi, Di)
        if self.opt.qat_sim:
            qi = qat.indexer_round(qi)
        wi = pa["indexer.proj"] * (1.0 / math.sqrt(Di * Hi))
        n_vis = (ctx["pos"] + 1) // 4
        return self.reg.index_select(qi, st.idx_comp, wi, n_vis, cfg.indexer_top_k)

    # -- mixture of experts --------------------------------------------------------------------
    def _ffn(self, i: int, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        cfg, p, w = self.cfg, f"blk.{i}.", self.w
        f = self._norm(x, p + "ffn_norm.weight")
        logits = self._lin(f, p + "ffn_gate_inp.weight")
        g, u = self._lin(f, p + "ffn_gate_shexp.weight"), self._lin(f, p + "ffn_up_shexp.weight")
        hashed = cfg.is_hash_layer(i)
        table = w.hash_table(i) if hashed else None
        bias = w.param(p + "exp_probs_b.bias") if not hashed and w.has(p + "exp_probs_b.bias") else None
        sel, weights = self.reg.route(logits, bias, table, ctx["ids"], cfg.n_expert_used, cfg.expert_weights_norm,
                                      cfg.expert_weights_scale)
        clamp = cfg.swiglu_clamp[i]
        routed = self.reg.experts(f, sel, weights, tuple(w.packed(i, k) for k in ("gate", "up", "down")), clamp)
        return routed + self._lin(plain.swiglu(g, u, clamp), p + "ffn_down_shexp.weight")

    # -- output head ---------------------------------------------------------------------------
    def _head(self, X: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w.param
        T, hc, E = X.shape
        flat = plain.rms_norm(X.reshape(T, hc * E), None, cfg.rms_eps)
        pre = self._lin(flat, "output_hc_fn.weight")
        wts = torch.sigmoid(pre * w("output_hc_scale.weight")[0] + w("output_hc_base.weight")) + cfg.hc_eps
        e = (wts[:, :, None] * X).sum(dim=1)
        return self._lin(self._norm(e, "output_norm.weight"), "output.weight")


def _rows(m, a: int, b: int):
    return m.rows(a, b) if hasattr(m, "rows") else m[a:b]
