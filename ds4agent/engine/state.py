"""Per-layer streaming state between tokens (spec/model.md §4.3).

After n tokens a layer holds: the last min(n, window) raw KV rows; for compressed layers the
floor(n/ratio) compressed rows (and, on ratio-4 layers, the indexer's compressed rows); and the
compressor frontier: ``S`` rows of projected kv and gate scores, S = 8 for ratio 4 (rows 0–3 the
last complete window, feeding the overlap lane; rows 4.. the window being filled) and S = 128
for ratio 128. Frontier rows not yet written hold 0 / NEG_INF, the canonical form ds4's CPU
leaves after a prefill, so a snapshot is the same whether tokens came by prefill or decode.
Nothing else (no queries, no HC state) persists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from .config import ModelConfig

# ds4's "empty" score: exp(NEG_INF - m) is exactly 0, and unlike -inf it cannot produce NaN.
NEG_INF = -1e30


@dataclass
class Frontier:
    kv: mx.array  # (S, W) float32
    score: mx.array  # (S, W) float32

    @classmethod
    def empty(cls, rows: int, width: int) -> "Frontier":
        return cls(mx.zeros((rows, width), mx.float32), mx.full((rows, width), NEG_INF, mx.float32))


@dataclass
class LayerState:
    ratio: int
    raw: mx.array  # (n_raw, D): last min(n, window) KV rows, oldest first
    comp: mx.array | None = None  # (n/ratio, D)
    comp_frontier: Frontier | None = None
    idx_comp: mx.array | None = None  # (n/4, Di) ratio-4 layers only
    idx_frontier: Frontier | None = None


@dataclass
class ModelState:
    layers: list[LayerState] = field(default_factory=list)
    n_tokens: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig) -> "ModelState":
        layers = []
        for i in range(cfg.n_layer):
            r = cfg.ratio(i)
            st = LayerState(r, mx.zeros((0, cfg.head_dim), mx.float32))
            if r:
                st.comp = mx.zeros((0, cfg.head_dim), mx.float32)
                st.comp_frontier = Frontier.empty(8 if r == 4 else r, cfg.compressor_width(i))
            if r == 4:
                st.idx_comp = mx.zeros((0, cfg.indexer_head_dim), mx.float32)
                st.idx_frontier = Frontier.empty(8, 2 * cfg.indexer_head_dim)
            layers.append(st)
        return cls(layers, 0)

    def arrays(self) -> list[mx.array]:
        out = []
        for st in self.layers:
            out.append(st.raw)
            for a in (st.comp, st.idx_comp):
                if a is not None:
                    out.append(a)
            for fr in (st.comp_frontier, st.idx_frontier):
                if fr is not None:
                    out += [fr.kv, fr.score]
        return out
