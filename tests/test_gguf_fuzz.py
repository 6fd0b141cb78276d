"""Bounded fuzzing of the model-file path: damaged GGUF headers either open or fail with the
reader's / validator's one-line error; nothing else escapes, nothing hangs, nothing allocates
in proportion to a damaged count instead of the file.

Mutations are aimed where damage hurts: every length, count and type field of a small model's
header (found by walking it here, independently of the reader under test) and its numeric
values, plus random byte damage and truncation. Each example runs what `ds4 inspect` runs
(reader, config, validator, tokenizer) and, when that passes, what Engine.open runs.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from helpers import damage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_model import write_small

from ds4agent.modelfile.config import ConfigError
from ds4agent.modelfile.gguf import GGUFError, GGUFFile

# Widths of the GGUF scalar value types (0..7, 10..12); 8 is STRING, 9 is ARRAY.
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# Bit patterns that break readers and validators: zero, tiny and huge counts, values one past a
# limit, and (as float32) -1, -0, NaN and the infinities.
_INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1,
                0xBF800000, 0x80000000, 0x7FC00000, 0x7F800000, 0xFF800000]
_INTERESTING_64 = [2**32, 2**40, 2**62, 2**63, 2**64 - 1, 0x7FF8000000000000]
# Replacement bytes inside strings: letters and a space (a valid but wrong vocabulary string),
# NUL, and bytes that cannot stand where they land in UTF-8.
_TEXT_BYTES = list(b"aeklx Z.") + [0x00, 0x80, 0xC3, 0xFF]


class Layout:
    """Where things are in a GGUF header, found by walking it here, independently of the
    reader under test: ``fields`` are (offset, width) of counts, lengths and types, ``numbers``
    of numeric values (scalars and short arrays), ``texts`` (offset, length) of strings;
    ``kv_end`` is where the tensor directory starts and ``end`` where the header ends."""

    def __init__(self, data: bytes) -> None:
        self.fields: list[tuple[int, int]] = [(8, 8), (16, 8)]
        self.numbers: list[tuple[int, int]] = []
        self.texts: list[tuple[int, int]] = []
        self.vocab: list[tuple[int, int]] = []  # the strings of tokenizer.ggml.tokens and merges
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        self.data, self.pos = data, 24
        for _ in range(n_kv):
            self._string()
            key = self.data[self.texts[-1][0] : self.pos]
            texts = len(self.texts)
            self._value(self._take(4, self.fields))
            if key in (b"tokenizer.ggml.tokens", b"tokenizer.ggml.merges"):
                self.vocab += self.texts[texts:]
        self.kv_end = self.pos
        for _ in range(n_tensors):
            self._string()
            for _ in range(self._take(4, self.fields)):
                self._take(8, self.fields)
            self._take(4, self.fields)
            self._take(8, self.fields)
        self.end = self.pos

    def _take(self, width: int, into: list[tuple[int, int]]) -> int:
        into.append((self.pos, width))
        v = int.from_bytes(self.data[self.pos : self.pos + width], "little")
        self.pos += width
        return v

    def _string(self) -> None:
        n = self._take(8, self.fields)
        if n:
            self.texts.append((self.pos, n))
        self.pos += n

    def _value(self, vtype: int) -> None:
        if vtype == 8:
            self._string()
        elif vtype == 9:
            sub, count = self._take(4, self.fields), self._take(8, self.fields)
            if sub in _WIDTH and count <= 64:  # short numeric arrays (ratios, clamps): each value
                for _ in range(count):
                    self._take(_WIDTH[sub], self.numbers)
            elif sub in _WIDTH:
                self.pos += count * _WIDTH[sub]
            else:
                for _ in range(count):
                    self._value(sub)
        else:
            self._take(_WIDTH[vtype], self.numbers)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Layout, int]:
    p = write_small(tmp_path_factory.mktemp("fuzz") / "small.gguf")
    with open(p, "rb") as fh:
        layout = Layout(fh.read(64 * 1024))
    assert len(layout.fields) > 500 and len(layout.numbers) > 40 and len(layout.vocab) > 250
    assert layout.end < 64 * 1024
    return layout, p.stat().st_size


def _hostile_entry(draw) -> bytes:
    """A metadata entry built to hurt: arrays nested up to thousands deep, absurd counts and
    lengths, unknown types."""
    key = draw(st.sampled_from([b"general.x", b"deepseek4.context_length", b"tokenizer.ggml.merges"]))
    depth = draw(st.sampled_from([1, 2, 8, 9, 50, 600, 3000]))
    inner_type = draw(st.sampled_from([0, 4, 6, 8, 9, 12, 13, 2**32 - 1]))
    inner_count = draw(st.sampled_from([0, 1, 3, 2**20, 2**40, 2**64 - 1]))
    return (struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
            + struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQ", inner_type, inner_count)
            + bytes(draw(st.binary(max_size=24))))


def _mutate(draw, layout: Layout) -> bytes:
    blob = bytearray(layout.data[: layout.end])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "number", "number", "text", "text", "insert"]))
        if kind == "text":  # mostly another valid character (a wrong token), sometimes bad UTF-8
            texts = layout.vocab if draw(st.booleans()) else layout.texts
            at, n = texts[draw(st.integers(0, len(texts) - 1))]
            blob[at + draw(st.integers(0, n - 1))] = draw(st.sampled_from(_TEXT_BYTES))
            continue
        if kind == "insert":  # a new entry at the end of the metadata, counted in n_kv
            n_kv = int.from_bytes(blob[16:24], "little")
            blob[16:24] = ((n_kv + 1) % 2**64).to_bytes(8, "little")
            blob[layout.kv_end : layout.kv_end] = _hostile_entry(draw)
            break  # offsets after kv_end have moved
        spots = layout.fields if kind == "field" else layout.numbers
        at, width = spots[draw(st.integers(0, len(spots) - 1))]
        bits = 8 * width
        orig = int.from_bytes(blob[at : at + width], "little")
        choices = [v for v in _INTERESTING + (_INTERESTING_64 if width == 8 else []) if v < 2**bits]
        new = draw(st.one_of(st.sampled_from(choices), st.integers(0, 2**bits - 1),
                             st.integers(-3, 3).map(lambda d: (orig + d) % 2**bits)))
        blob[at : at + width] = new.to_bytes(width, "little")
    if draw(st.integers(0, 5)) == 0:  # sometimes random bytes too, and maybe a cut
        return damage(bytes(blob), draw, span=len(blob), hits=4)
    return bytes(blob)


def _write(path: Path, blob: bytes, header_len: int, size: int) -> None:
    with open(path, "wb") as fh:
        fh.write(blob)
        if len(blob) >= header_len:
            fh.truncate(size)  # the tensor data again, as a sparse hole


def _clean(e: BaseException, path: Path) -> None:
    msg = str(e)
    assert "\n" not in msg and str(path) in msg, msg


def _bounded(run, limit_bytes: int) -> None:
    """Run ``run`` and check it neither hangs nor allocates absurdly (Python and numpy
    allocations; tracemalloc sees both)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        run()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5.0
    assert peak < limit_bytes, peak


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_header_reader(small, tmp_path: Path, data: st.DataObject) -> None:
    """The header alone (the data section cut off): the reader opens it or raises GGUFError."""
    layout, _ = small
    p = tmp_path / "h.gguf"
    p.write_bytes(_mutate(data.draw, layout))

    def run() -> None:
        try:
            GGUFFile(p).close()
        except GGUFError as e:
            _clean(e, p)

    # An 18 KB file: anything near the limit would be an allocation sized by a damaged count.
    _bounded(run, 32 * 2**20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_model_pipeline(small, tmp_path: Path, data: st.DataObject) -> None:
    """A whole (sparse) model: what `ds4 inspect` and Engine.open do either works or raises
    GGUFError / ConfigError / EngineError with one line naming the file."""
    from ds4agent.engine import Engine, EngineError
    from ds4agent.modelfile import describe

    layout, size = small
    p = tmp_path / "m.gguf"
    _write(p, _mutate(data.draw, layout), layout.end, size)

    def run() -> None:
        try:
            report = describe(p)
            if report.usable:
                Engine.open(p, backend="cpu", ctx=64, kernels="reference").close()
        except (GGUFError, ConfigError, EngineError) as e:
            _clean(e, p)

    # Bounded by the file: a metadata array can claim at most what the 13 MB file holds.
    _bounded(run, 16 * size + 64 * 2**20)
