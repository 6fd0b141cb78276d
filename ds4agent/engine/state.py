"""Per-layer streaming state between tokens (docs/model.md §4.3).

After n tokens a layer holds: the last min(n, window) raw KV rows; for compressed layers the
floor(n/ratio) compressed rows (and, on ratio-4 layers, the indexer's compressed rows); and the
compressor frontier: ``S`` rows of projected kv and gate scores, S = 8 for ratio 4 (rows 0–3 the
last complete window, feeding the overlap lane; rows 4.. the window being filled) and S = 128
for ratio 128. Frontier rows not yet written hold 0 / NEG_INF, the canonical form ds4's CPU
leaves after a prefill, so a snapshot is the same whether tokens came by prefill or decode.
Nothing else (no queries, no HC state) persists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import mlx.core as mx
import numpy as np

from ..modelfile.config import ModelConfig
from .xp import to

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


def _copy_frontier(fr: Frontier | None) -> Frontier | None:
    return None if fr is None else Frontier(fr.kv, fr.score)


@dataclass
class ModelState:
    # A layer another process holds (a pipeline split, engine/group/distributed.py) is None here.
    layers: list[LayerState | None] = field(default_factory=list)
    n_tokens: int = 0
    xp: object = mx  # the array namespace the arrays are in (engine/xp.py)
    # engine/group/distributed.py: the handle on the other processes' copy of this state (None: they
    # hold the empty state, or there are none). Forks share it until a step replaces it.
    remote: object = None

    @classmethod
    def empty(cls, cfg: ModelConfig, held: range | None = None) -> "ModelState":
        """The state before any token; ``held``: only these layers (the others None)."""
        held = range(cfg.n_layer) if held is None else held
        state = cls([cls.empty_layer(cfg, i) if i in held else None for i in range(cfg.n_layer)], 0)
        # Evaluated here: MLX evaluates a pending array only on the thread that made it, and a
        # session made on one thread may run on another (a server's slot, engine/batch.py).
        mx.eval(*state.arrays())
        return state

    @staticmethod
    def empty_layer(cfg: ModelConfig, i: int) -> LayerState:
        r = cfg.ratio(i)
        st = LayerState(r, mx.zeros((0, cfg.head_dim), mx.float32))
        if r:
            st.comp = mx.zeros((0, cfg.head_dim), mx.float32)
            st.comp_frontier = Frontier.empty(8 if r == 4 else r, cfg.compressor_width(i))
        if r == 4:
            st.idx_comp = mx.zeros((0, cfg.indexer_head_dim), mx.float32)
            st.idx_frontier = Frontier.empty(8, 2 * cfg.indexer_head_dim)
        return st

    def fork(self) -> "ModelState":
        """A copy that shares every array. The forward pass never writes into an array, it
        only rebinds fields to new ones, so a step run on a fork leaves this state untouched:
        a session commits the fork only once the whole step succeeded (engine/session.py)."""
        layers = []
        for st in self.layers:
            layers.append(None if st is None else replace(st, comp_frontier=_copy_frontier(st.comp_frontier),
                                                          idx_frontier=_copy_frontier(st.idx_frontier)))
        return ModelState(layers, self.n_tokens, self.xp, self.remote)

    def use(self, xp: object) -> None:
        """Move every array into namespace ``xp``: states start, and snapshots load, as MLX
        arrays; the CPU kernels path runs on numpy. Once per state, not per token."""
        if self.xp is xp:
            return
        for st in self.layers:
            if st is None:
                continue
            st.raw = to(xp, st.raw)
            st.comp = None if st.comp is None else to(xp, st.comp)
            st.idx_comp = None if st.idx_comp is None else to(xp, st.idx_comp)
            for fr in (st.comp_frontier, st.idx_frontier):
                if fr is not None:
                    fr.kv, fr.score = to(xp, fr.kv), to(xp, fr.score)
        self.xp = xp

    def arrays(self) -> list[mx.array]:
        out = []
        for st in self.layers:
            if st is None:
                continue
            out.append(st.raw)
            for a in (st.comp, st.idx_comp):
                if a is not None:
                    out.append(a)
            for fr in (st.comp_frontier, st.idx_frontier):
                if fr is not None:
                    out += [fr.kv, fr.score]
        return out


# -- the session payload (docs/model.md §6.1) ---------------------------------------------------
#
# Byte-compatible with ds4's DSV4 payload: 13 little-endian u32 header fields, then token ids,
# next-token logits, per-layer compressed-row counts, and per layer the raw window rows in
# logical order, compressed rows and compressor frontiers, all float32. The dimension fields
# come from the loaded model, so tiny models round-trip through the same code.

PAYLOAD_MAGIC = 0x34565344  # b"DSV4"
PAYLOAD_VERSION = 1
HEADER_FIELDS = 13
# ds4's prefill capacity: prompts are processed in chunks of at most 2048 tokens. The field is
# part of the format and must match on load, so we write the same value.
PREFILL_CAP = 2048


class PayloadError(ValueError):
    """A snapshot that does not fit this model or context; one line."""


def prefill_cap(ctx: int) -> int:
    return min(ctx, PREFILL_CAP)


def _frontier_shape(cfg: ModelConfig, layer: int) -> tuple[int, int]:
    r = cfg.ratio(layer)
    return (8 if r == 4 else r), cfg.compressor_width(layer)


def layer_nbytes(cfg: ModelConfig, layer: int, n: int) -> int:
    """Bytes of one layer's part of the payload after n tokens (the per-layer section below)."""
    r = cfg.ratio(layer)
    size = 4 * min(n, cfg.sliding_window) * cfg.head_dim
    if r:
        S, W = _frontier_shape(cfg, layer)
        size += 4 * (n // r) * cfg.head_dim + 2 * 4 * S * W
    if r == 4:
        size += 4 * (n // 4) * cfg.indexer_head_dim + 2 * 4 * 8 * 2 * cfg.indexer_head_dim
    return size


def payload_size(cfg: ModelConfig, n: int) -> int:
    """Exact payload bytes after n tokens, computed without building it (docs/model.md §4.3)."""
    size = 4 * HEADER_FIELDS + 4 * n + 4 * cfg.n_vocab + 2 * 4 * cfg.n_layer
    return size + sum(layer_nbytes(cfg, i, n) for i in range(cfg.n_layer))


def _f32(a: mx.array) -> bytes:
    return np.asarray(a, dtype="<f4").tobytes()


def _layer_parts(st: LayerState, live: int) -> list[bytes]:
    """One layer's section: the live raw rows, then compressed rows and frontiers, float32."""
    parts = [_f32(st.raw[st.raw.shape[0] - live :]) if live else b""]
    if st.ratio:
        parts += [_f32(st.comp), _f32(st.comp_frontier.kv), _f32(st.comp_frontier.score)]
    if st.ratio == 4:
        parts += [_f32(st.idx_comp), _f32(st.idx_frontier.kv), _f32(st.idx_frontier.score)]
    return parts


def _read_layer(cfg: ModelConfig, i: int, n: int, take, rnd) -> LayerState:
    """The inverse of _layer_parts: ``take(count)`` hands out the next count float32 values."""
    live = min(n, cfg.sliding_window)
    st = ModelState.empty_layer(cfg, i)
    r = st.ratio
    st.raw = mx.array(rnd(take(live * cfg.head_dim).reshape(live, cfg.head_dim)))
    if r:
        S, W = _frontier_shape(cfg, i)
        c = n // r
        st.comp = mx.array(rnd(take(c * cfg.head_dim).reshape(c, cfg.head_dim)))
        st.comp_frontier = Frontier(mx.array(take(S * W).reshape(S, W)), mx.array(take(S * W).reshape(S, W)))
    if r == 4:
        Di, c = cfg.indexer_head_dim, n // 4
        st.idx_comp = mx.array(rnd(take(c * Di).reshape(c, Di)))
        st.idx_frontier = Frontier(mx.array(take(8 * 2 * Di).reshape(8, 2 * Di)),
                                   mx.array(take(8 * 2 * Di).reshape(8, 2 * Di)))
    return st


def layer_bytes(cfg: ModelConfig, st: LayerState, n: int) -> bytes:
    """One layer's state after n tokens in the payload's own per-layer layout: what a process
    of a distributed group hands over for the layers it holds (engine/group/distributed.py), so that
    the session file written from the pieces is one ordinary payload."""
    return b"".join(_layer_parts(st, min(n, cfg.sliding_window)))


def layer_from_bytes(cfg: ModelConfig, layer: int, n: int, buf: bytes | memoryview) -> LayerState:
    """The LayerState that layer_bytes wrote (bit for bit: no rounding is applied)."""
    buf = memoryview(buf).cast("B")
    if len(buf) != layer_nbytes(cfg, layer, n):
        raise PayloadError(f"layer {layer} state of {len(buf)} bytes, expected {layer_nbytes(cfg, layer, n)}")
    pos = 0

    def take(count: int) -> np.ndarray:
        nonlocal pos
        a = np.frombuffer(buf, dtype="<f4", count=count, offset=pos)
        pos += 4 * count
        return a

    return _read_layer(cfg, layer, n, take, lambda a: a)


def write_payload(cfg: ModelConfig, ctx: int, state: ModelState, tokens: list[int], logits: np.ndarray) -> bytes:
    n = len(tokens)
    if state.n_tokens != n:
        raise PayloadError(f"state holds {state.n_tokens} tokens but {n} token ids were given")
    live = min(n, cfg.sliding_window)
    header = [PAYLOAD_MAGIC, PAYLOAD_VERSION, ctx, prefill_cap(ctx), min(cfg.sliding_window, ctx),
              cfg.sliding_window, ctx // 4 + 2, n, cfg.n_layer, cfg.head_dim, cfg.indexer_head_dim,
              cfg.n_vocab, live]
    parts = [np.asarray(header, dtype="<u4").tobytes(), np.asarray(tokens, dtype="<u4").tobytes(),
             np.asarray(logits, dtype="<f4").tobytes()]
    comp = [st.comp.shape[0] if st.comp is not None else 0 for st in state.layers]
    idx = [st.idx_comp.shape[0] if st.idx_comp is not None else 0 for st in state.layers]
    parts += [np.asarray(comp, dtype="<u4").tobytes(), np.asarray(idx, dtype="<u4").tobytes()]
    for st in state.layers:
        parts += _layer_parts(st, live)
    blob = b"".join(parts)
    assert len(blob) == payload_size(cfg, n)
    return blob


def read_payload(cfg: ModelConfig, ctx: int, blob: bytes | memoryview,
                 f16_rows: bool) -> tuple[ModelState, list[int], np.ndarray]:
    """Parse and check a payload against this model and context.

    ``f16_rows`` re-applies the cache's f16 rounding to stored rows: ds4's GPU writes them
    unrounded (its kernels round on read); for CPU-written files it changes nothing."""
    buf = memoryview(blob).cast("B")
    if len(buf) < 4 * HEADER_FIELDS:
        raise PayloadError(f"snapshot is truncated ({len(buf)} bytes, the header alone needs {4 * HEADER_FIELDS})")
    h = np.frombuffer(buf, dtype="<u4", count=HEADER_FIELDS).tolist()
    if h[0] != PAYLOAD_MAGIC:
        raise PayloadError("not a DeepSeek V4 session snapshot (bad magic)")
    if h[1] != PAYLOAD_VERSION:
        raise PayloadError(f"snapshot format version {h[1]} is not supported "
                           f"(this build reads version {PAYLOAD_VERSION})")
    saved_ctx, cap, raw_cap, window, comp_cap, n = h[2], h[3], h[4], h[5], h[6], h[7]
    dims = (h[8], h[9], h[10], h[11])
    want = (cfg.n_layer, cfg.head_dim, cfg.indexer_head_dim, cfg.n_vocab)
    if dims != want:
        raise PayloadError(f"snapshot is for another model shape (layers/head/indexer/vocab {dims}, this model {want})")
    if saved_ctx > ctx or n >= ctx:
        raise PayloadError(f"snapshot needs a context of {max(saved_ctx, n + 1)} tokens, this session has {ctx}")
    if cap != prefill_cap(ctx):
        raise PayloadError(f"snapshot prefill capacity {cap} differs from this session's {prefill_cap(ctx)}")
    if window != cfg.sliding_window:
        raise PayloadError(f"snapshot window {window} differs from the model's {cfg.sliding_window}")
    live = min(n, window)
    if h[12] != live or live > raw_cap:
        raise PayloadError(f"snapshot raw row count {h[12]} is inconsistent with {n} tokens")
    if comp_cap > ctx // 4 + 2:
        raise PayloadError(f"snapshot compressed capacity {comp_cap} exceeds this session's {ctx // 4 + 2}")
    expected = payload_size(cfg, n)
    pos = 4 * HEADER_FIELDS

    def take(count: int, dtype: str) -> np.ndarray:
        nonlocal pos
        nbytes = count * 4
        if pos + nbytes > len(buf):
            raise PayloadError(f"snapshot is truncated ({len(buf)} bytes, expected {expected})")
        a = np.frombuffer(buf, dtype=dtype, count=count, offset=pos)
        pos += nbytes
        return a

    tokens = take(n, "<u4").astype(np.int64)
    if n and int(tokens.max()) >= cfg.n_vocab:
        raise PayloadError("snapshot holds a token id outside the vocabulary")
    logits = take(cfg.n_vocab, "<f4").copy()
    comp_counts = take(cfg.n_layer, "<u4").tolist()
    idx_counts = take(cfg.n_layer, "<u4").tolist()
    state = ModelState.empty(cfg)
    state.n_tokens = n
    rnd = (lambda a: a.astype(np.float16).astype(np.float32)) if f16_rows else (lambda a: a)
    for i, st in enumerate(state.layers):
        r = st.ratio
        want_comp = n // r if r else 0
        want_idx = n // 4 if r == 4 else 0
        if comp_counts[i] != want_comp or idx_counts[i] != want_idx:
            raise PayloadError(f"snapshot layer {i} has {comp_counts[i]}/{idx_counts[i]} compressed rows, "
                               f"expected {want_comp}/{want_idx} after {n} tokens")
        state.layers[i] = _read_layer(cfg, i, n, lambda count: take(count, "<f4"), rnd)
    if pos != len(buf):
        raise PayloadError(f"snapshot has {len(buf) - pos} unexpected trailing bytes")
    if not np.isfinite(logits).all():
        raise PayloadError("snapshot logits are not finite (corrupt file?)")
    return state, tokens.tolist(), logits
