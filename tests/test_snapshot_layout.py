"""The snapshot payload pinned to its documented byte layout (docs/model.md §6.1), the layout
the files share with antirez/ds4. Round trips cannot see a writer and reader changed together
(two fields swapped on both sides); this builds the expected bytes by hand, field by field, from
the document, on a model small enough to write out."""

from __future__ import annotations

import struct
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine.state import (
    Frontier,
    LayerState,
    ModelState,
    PayloadError,
    layer_bytes,
    layer_from_bytes,
    payload_size,
    read_payload,
    write_payload,
)
from ds4agent.modelfile.config import FLASH

# Three layers: window-only, ratio 4, ratio 128. D = 2, Di = 2, V = 5, window 4.
CFG = replace(FLASH, n_layer=3, compress_ratios=(0, 4, 128), head_dim=2, indexer_head_dim=2, n_vocab=5,
              sliding_window=4, swiglu_clamp=(10.0,) * 3)
# 129 tokens: the ratio-128 layer has one compressed row, so its attention and indexer counts
# differ (1 and 0) and the two count arrays cannot be swapped unnoticed.
CTX, N = 256, 129
TOKENS = [(7 * i + 3) % 5 for i in range(N)]
LOGITS = [0.5, -1.0, 2.0, 3.5, -4.0]

_counter = iter(range(1, 10_000))


def _arr(rows: int, cols: int) -> np.ndarray:
    """Distinct small integers (exact in f16 and f32), in row-major order of appearance."""
    return np.array([[next(_counter) for _ in range(cols)] for _ in range(rows)], np.float32)


# What each layer holds after 129 tokens (docs/model.md §4.3). The raw arrays keep one row more
# than the window: only the last 4 (the live ones) are written.
RAW = [_arr(5, 2), _arr(5, 2), _arr(5, 2)]
COMP1, FR1_KV, FR1_SC = _arr(32, 2), _arr(8, 4), _arr(8, 4)  # ratio 4: 129 // 4 = 32 rows, S=8, W=2D
IDX1, IFR1_KV, IFR1_SC = _arr(32, 2), _arr(8, 4), _arr(8, 4)  # indexer: 32 rows, 8 x 2Di
COMP2, FR2_KV, FR2_SC = _arr(1, 2), _arr(128, 2), _arr(128, 2)  # ratio 128: 1 row, S=128, W=D


def _state() -> ModelState:
    m = mx.array
    layers = [
        LayerState(0, m(RAW[0])),
        LayerState(4, m(RAW[1]), m(COMP1), Frontier(m(FR1_KV), m(FR1_SC)), m(IDX1), Frontier(m(IFR1_KV), m(IFR1_SC))),
        LayerState(128, m(RAW[2]), m(COMP2), Frontier(m(FR2_KV), m(FR2_SC))),
    ]
    return ModelState(layers, N)


def _f(a: np.ndarray) -> bytes:
    return struct.pack(f"<{a.size}f", *a.ravel().tolist())


def _expected_layers() -> list[bytes]:
    return [
        _f(RAW[0][1:]),
        _f(RAW[1][1:]) + _f(COMP1) + _f(FR1_KV) + _f(FR1_SC) + _f(IDX1) + _f(IFR1_KV) + _f(IFR1_SC),
        _f(RAW[2][1:]) + _f(COMP2) + _f(FR2_KV) + _f(FR2_SC),
    ]


def _expected() -> bytes:
    header = struct.pack("<13I",
                         0x34565344,  # magic "DSV4"
                         1,  # version
                         256,  # context size
                         256,  # prefill capacity: min(ctx, 2048)
                         4,  # raw row capacity: min(window, ctx)
                         4,  # raw window
                         66,  # compressed capacity: ctx/4 + 2
                         129,  # n
                         3, 2, 2, 5,  # layers, head width, indexer width, vocabulary
                         4)  # raw rows stored per layer: min(n, window)
    body = struct.pack("<129I", *TOKENS) + struct.pack("<5f", *LOGITS)
    body += struct.pack("<3I", 0, 32, 1)  # compressed attention rows per layer
    body += struct.pack("<3I", 0, 32, 0)  # compressed indexer rows per layer
    return header + body + b"".join(_expected_layers())


def test_hand_computed_sizes() -> None:
    # 52 header + 516 ids + 20 logits + 24 counts; layer 0: 4x2 raw; layer 1: raw 32 + comp 256 +
    # frontier 2x128 + indexer 256 + its frontier 2x128; layer 2: raw 32 + comp 8 + frontier 2x1024.
    assert len(_expected()) == 612 + 32 + 1056 + 2088 == payload_size(CFG, N)


def test_the_writer_writes_the_documented_bytes() -> None:
    blob = write_payload(CFG, CTX, _state(), TOKENS, np.array(LOGITS, np.float32))
    assert blob[:4] == b"DSV4"
    want = _expected()
    if blob != want:  # name the first differing byte: which field moved
        i = next(k for k, (a, b) in enumerate(zip(blob, want)) if a != b) if len(blob) == len(want) else -1
        pytest.fail(f"payload differs from docs/model.md §6.1 at byte {i} (lengths {len(blob)}, {len(want)})")


@pytest.mark.parametrize("f16_rows", [False, True])
def test_the_reader_reads_the_documented_bytes(f16_rows: bool) -> None:
    state, tokens, logits = read_payload(CFG, CTX, _expected(), f16_rows=f16_rows)
    assert tokens == TOKENS and logits.tolist() == LOGITS and state.n_tokens == N
    l0, l1, l2 = state.layers
    eq = lambda a, b: np.array_equal(np.asarray(a), b)  # noqa: E731
    assert l0.ratio == 0 and eq(l0.raw, RAW[0][1:]) and l0.comp is None and l0.idx_comp is None
    assert l1.ratio == 4 and eq(l1.raw, RAW[1][1:]) and eq(l1.comp, COMP1)
    assert eq(l1.comp_frontier.kv, FR1_KV) and eq(l1.comp_frontier.score, FR1_SC)
    assert eq(l1.idx_comp, IDX1) and eq(l1.idx_frontier.kv, IFR1_KV) and eq(l1.idx_frontier.score, IFR1_SC)
    assert l2.ratio == 128 and eq(l2.raw, RAW[2][1:]) and eq(l2.comp, COMP2)
    assert eq(l2.comp_frontier.kv, FR2_KV) and eq(l2.comp_frontier.score, FR2_SC) and l2.idx_frontier is None


def test_the_reader_rounds_stored_rows_to_f16_and_leaves_frontiers() -> None:
    # A ds4-GPU file stores rows unrounded: 1 + 2**-12 is not an f16 value (rounds to 1.0).
    odd = 1 + 2**-12
    blob = bytearray(_expected())
    raw0 = 612  # layer 0's first raw value
    fr2 = len(blob) - 2 * 1024  # layer 2's frontier kv, first value
    blob[raw0:raw0 + 4] = struct.pack("<f", odd)
    blob[fr2:fr2 + 4] = struct.pack("<f", odd)
    rounded, _, _ = read_payload(CFG, CTX, bytes(blob), f16_rows=True)
    kept, _, _ = read_payload(CFG, CTX, bytes(blob), f16_rows=False)
    assert float(np.asarray(rounded.layers[0].raw)[0, 0]) == 1.0 and float(np.asarray(kept.layers[0].raw)[0, 0]) == odd
    assert float(np.asarray(rounded.layers[2].comp_frontier.kv)[0, 0]) == odd


@pytest.mark.parametrize("where,value,fragment", [
    (4 * 3, 128, "prefill capacity"),  # a ds4 build with another chunk size
    (4 * 4, 3, "raw row count"),  # raw capacity below the rows stored
    (4 * 6, 67, "compressed capacity"),
    (52 + 516 + 20 + 4, 31, "compressed rows"),  # layer 1's attention row count
    (52 + 516 + 20 + 8, 0, "compressed rows"),  # layer 2's attention row count
    (52 + 516 + 20 + 12 + 4, 33, "compressed rows"),  # layer 1's indexer row count
    (52 + 4 * 2, 5, "outside the vocabulary"),  # third token id = V
])
def test_the_reader_checks_each_documented_field(where: int, value: int, fragment: str) -> None:
    blob = bytearray(_expected())
    blob[where:where + 4] = struct.pack("<I", value)
    with pytest.raises(PayloadError, match=fragment):
        read_payload(CFG, CTX, bytes(blob), f16_rows=False)


def test_non_finite_logits_are_refused() -> None:
    blob = bytearray(_expected())
    blob[52 + 516 + 8:52 + 516 + 12] = struct.pack("<f", float("nan"))
    with pytest.raises(PayloadError, match="not finite"):
        read_payload(CFG, CTX, bytes(blob), f16_rows=False)


def test_a_state_that_does_not_match_the_tokens_is_refused() -> None:
    with pytest.raises(PayloadError, match="state holds 129 tokens but 128"):
        write_payload(CFG, CTX, _state(), TOKENS[:-1], np.array(LOGITS, np.float32))


def test_layer_bytes_are_the_payloads_own_layer_sections() -> None:
    st = _state()
    for i, want in enumerate(_expected_layers()):
        assert layer_bytes(CFG, st.layers[i], N) == want
        back = layer_from_bytes(CFG, i, N, want)
        assert np.array_equal(np.asarray(back.raw), RAW[i][1:])
    with pytest.raises(PayloadError, match="layer 1 state of"):
        layer_from_bytes(CFG, 1, N, _expected_layers()[1][:-4])


def test_header_of_a_context_smaller_than_the_window() -> None:
    # Fields 3-6 differ from each other only here (ctx 3 < window 4): min(ctx, 2048) = 3,
    # raw capacity min(window, ctx) = 3, window 4, compressed capacity 3 // 4 + 2 = 2.
    st = ModelState.empty(CFG)
    for layer in st.layers:
        layer.raw = mx.array(_arr(2, 2))
    st.n_tokens = 2
    blob = write_payload(CFG, 3, st, [1, 2], np.array(LOGITS, np.float32))
    assert struct.unpack("<13I", blob[:52]) == (0x34565344, 1, 3, 3, 3, 4, 2, 2, 3, 2, 2, 5, 2)
    state, tokens, _ = read_payload(CFG, 3, blob, f16_rows=False)
    assert tokens == [1, 2] and np.array_equal(np.asarray(state.layers[2].raw), np.asarray(st.layers[2].raw))


def test_a_fork_shares_arrays_but_not_the_objects_a_step_rebinds() -> None:
    # The forward pass rebinds fields (st.raw = ..., frontier.kv = ...) on the fork; the
    # original must not see it, or a failed step would leave it half-updated.
    st = _state()
    f = st.fork()
    assert f.n_tokens == N and f.layers[1].raw is st.layers[1].raw
    f.layers[1].raw = mx.zeros((1, 2))
    f.layers[1].comp_frontier.kv = mx.zeros((8, 4))
    f.layers[1].idx_frontier.score = mx.zeros((8, 4))
    f.layers[2].comp_frontier.score = mx.zeros((128, 2))
    assert write_payload(CFG, CTX, st, TOKENS, np.array(LOGITS, np.float32)) == _expected()


def test_the_empty_state_is_the_documented_before_any_token() -> None:
    from ds4agent.engine.state import NEG_INF

    st = ModelState.empty(CFG)
    assert st.n_tokens == 0 and [layer.ratio for layer in st.layers] == [0, 4, 128]
    shape = lambda a: tuple(np.asarray(a).shape)  # noqa: E731
    l0, l1, l2 = st.layers
    assert shape(l0.raw) == (0, 2) and l0.comp is None and l0.comp_frontier is None and l0.idx_frontier is None
    assert shape(l1.raw) == (0, 2) and shape(l1.comp) == (0, 2) and shape(l1.idx_comp) == (0, 2)
    for fr, rows, width in ((l1.comp_frontier, 8, 4), (l1.idx_frontier, 8, 4), (l2.comp_frontier, 128, 2)):
        assert shape(fr.kv) == (rows, width) and not np.asarray(fr.kv).any()
        assert (np.asarray(fr.score) == np.float32(NEG_INF)).all()
    assert shape(l2.comp) == (0, 2) and l2.idx_comp is None and l2.idx_frontier is None
    # Only the layers this process holds (a pipeline split): the others are None.
    part = ModelState.empty(CFG, held=range(1, 2))
    assert part.layers[0] is None and part.layers[2] is None and part.layers[1].ratio == 4 and part.n_tokens == 0
    assert len(part.arrays()) == 7 and len(st.arrays()) == 1 + 7 + 4
    # An empty state's payload: the header, the logits, the counts, the frontiers; no rows.
    blob = write_payload(CFG, CTX, st, [], np.array(LOGITS, np.float32))
    assert len(blob) == payload_size(CFG, 0) == 52 + 20 + 24 + 2 * 4 * (32 + 32) + 2 * 4 * 256


def test_prefill_capacity_field_is_capped_at_2048() -> None:
    blob = write_payload(CFG, 4096, ModelState.empty(CFG), [], np.array(LOGITS, np.float32))
    assert struct.unpack("<13I", blob[:52])[2:7] == (4096, 2048, 4, 4, 4096 // 4 + 2)
    read_payload(CFG, 4096, blob, f16_rows=False)
    with pytest.raises(PayloadError, match="prefill capacity 2048 differs from this session's 1000"):
        read_payload(CFG, 1000, _patched_ctx(blob, 1000), f16_rows=False)


def _patched_ctx(blob: bytes, ctx: int) -> bytes:
    b = bytearray(blob)
    b[8:12] = struct.pack("<I", ctx)
    return bytes(b)


def test_use_moves_every_array_to_the_namespace_and_back() -> None:
    from ds4agent.engine.xp import NP

    st = _state()
    st.use(NP)
    assert st.xp is NP and all(isinstance(a, np.ndarray) for a in st.arrays()) and len(st.arrays()) == 1 + 7 + 4
    assert np.array_equal(st.layers[1].idx_frontier.score, IFR1_SC) and st.layers[0].comp is None
    st.use(NP)  # already there: nothing changes
    st.use(mx)
    assert st.xp is mx and all(isinstance(a, mx.array) for a in st.arrays())
    assert write_payload(CFG, CTX, st, TOKENS, np.array(LOGITS, np.float32)) == _expected()
    part = ModelState.empty(CFG, held=range(2, 3))
    part.use(NP)
    assert part.layers[:2] == [None, None] and isinstance(part.layers[2].comp_frontier.kv, np.ndarray)


def test_the_reader_refuses_short_odd_and_too_long_payloads_with_their_own_error() -> None:
    blob = _expected()
    with pytest.raises(PayloadError, match=r"truncated \(51 bytes, the header alone needs 52\)"):
        read_payload(CFG, CTX, blob[:51], f16_rows=False)
    with pytest.raises(PayloadError, match=rf"truncated \(52 bytes, expected {len(blob)}\)"):
        read_payload(CFG, CTX, blob[:52], f16_rows=False)
    with pytest.raises(PayloadError, match="1 unexpected trailing bytes"):
        read_payload(CFG, CTX, blob + b"\0", f16_rows=False)
    # n == ctx: a context of n + 1 is needed (the next token needs a slot).
    same = bytearray(blob)
    same[8:12] = struct.pack("<I", N)
    with pytest.raises(PayloadError, match=f"needs a context of {N + 1} tokens, this session has {N}"):
        read_payload(CFG, N, bytes(same), f16_rows=False)


def test_layer_from_bytes_reads_every_part_in_order() -> None:
    back = layer_from_bytes(CFG, 1, N, _expected_layers()[1])
    for got, want in ((back.raw, RAW[1][1:]), (back.comp, COMP1), (back.comp_frontier.kv, FR1_KV),
                      (back.comp_frontier.score, FR1_SC), (back.idx_comp, IDX1), (back.idx_frontier.kv, IFR1_KV),
                      (back.idx_frontier.score, IFR1_SC)):
        assert np.array_equal(np.asarray(got), want)
