"""The session file format (docs/model.md §6.1-§6.2) at the byte level, without an engine or a
model: files are built here by hand (an independent writer following the documented layout),
written to tmp_path and read back with the module's readers; the writer is checked against a
hand-written hex dump. Every refusal is checked by its exact one-line message.

Fast on purpose: dev/mutate.py runs the fastest tests first, so this file is what makes a
whole-module mutation run of kvfile.py feasible (docs/testing.md)."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import stat
import struct
from pathlib import Path
from typing import Any, Callable

import pytest

from ds4agent.sessions import kvfile as kv
from ds4agent.sessions.kvfile import KVFile, KVFileError, KVFileGone, KVHeader, KVReader, PayloadHeader

ROOT = Path(__file__).resolve().parent.parent
_REAL_FSTAT = os.fstat  # kept before any test patches os.fstat
_REAL_PREAD = os.pread
_REAL_OPEN = os.open

MAP, VISIBLE_A, VISIBLE_B, CHECKSUM = 1, 2, 4, 8  # flag bits as docs/model.md §6.2 lists them
MiB = 1 << 20


# ---------------------------------------------------------------------------------------------
# An independent writer: the documented layout, not KVFile.to_bytes


def _head(*, magic: bytes = b"KVC", version: int = 1, bits: int = 4, reason: int = 0, flags: int = CHECKSUM,
          tokens: int = 3, hits: int = 0, ctx: int = 4096, fp: int = 0, created: int = 0, used: int = 0,
          pbytes: int = 0, tbytes: int = 3) -> bytes:
    return struct.pack("<3sBBBBBIIIIQQQI", magic, version, bits, reason, flags, 0, tokens, hits, ctx, fp,
                       created, used, pbytes, tbytes)


def _covered(body: bytes) -> bytes:
    """What the checksum covers: all but hits (12..16) and last used (32..40)."""
    return body[:12] + body[16:32] + body[40:]


def _file(*, text: bytes = b"abc", payload: bytes = b"", tail: bytes = b"", pbytes: int | None = None,
          checksum: bool | None = None, **fields: Any) -> bytes:
    flags = fields.setdefault("flags", CHECKSUM)
    body = _head(pbytes=len(payload) if pbytes is None else pbytes, tbytes=len(text), **fields) + text + payload + tail
    if flags & CHECKSUM if checksum is None else checksum:
        body += b"KCS\x01" + hashlib.sha1(_covered(body)).digest()
    return body


def _map(entries: list[tuple[bytes, bytes]], count: int | None = None) -> bytes:
    out = b"KTM\x01" + struct.pack("<I", len(entries) if count is None else count)
    for ident, dsml in entries:
        out += struct.pack("<II", len(ident), len(dsml)) + ident + dsml
    return out


# A payload the listing can check (§6.1 header, 13 u32), with every field distinct:
# n = 128 tokens, window 4 (so raw_live = min(128, 4) = 4), 2 layers, D = 3, Di = 5, V = 7.
N = 128
TEXT = b"t" * N  # a text of the tokens' bytes has at least one byte per token
IDS = list(range(1000, 1000 + N))


def _payload_header(*, magic: int = 0x34565344, n: int = N, window: int = 4, comp_cap: int = 9, layers: int = 2,
                    d: int = 3, di: int = 5, vocab: int = 7, raw_live: int = 4) -> bytes:
    return struct.pack("<13I", magic, 1, 4096, 2048, 6, window, comp_cap, n, layers, d, di, vocab, raw_live)


def _payload(size: int, **fields: Any) -> bytes:
    head = _payload_header(**fields) + struct.pack(f"<{N}I", *IDS)
    return (head + bytes(size))[:size]


# Hand-computed bounds for those dimensions (docs/model.md §6.1):
#   fixed = 52 + 4·128 (ids) + 4·7 (logits) + 2·4·2 (two u32 counts per layer) = 608
#   raw rows a layer = 4 · raw_live 4 · D 3 = 48                      -> low = 608 + 2·48 = 704
#   ratio 4 = 4·32·3 + 2·4·8·2·3 + 4·32·Di + 2·4·8·2·Di; Di 5: 384 + 384 + 640 + 640 = 2048
#   ratio 128 = 4·1·3 + 2·4·128·3 = 12 + 3072 = 3084 (the dearer one)  -> high = 608 + 2·(48 + 3084) = 6872
# With Di = 100 ratio 4 is the dearer: 384 + 384 + 12800 + 12800 = 26368 -> high = 608 + 2·(48 + 26368) = 53440
LOW, HIGH, HIGH_DI100 = 704, 6872, 53440
PHEADER = PayloadHeader(version=1, ctx=4096, tokens=N, n_layer=2, head_dim=3, indexer_dim=5, n_vocab=7, raw_live=4)


def _write(tmp_path: Path, data: bytes, name: str = "s.kv") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _refused(path: Path, message: str, reader: Callable[[Path], object] = kv.read_file,
             kind: type[KVFileError] = KVFileError) -> None:
    with pytest.raises(kind) as e:
        reader(path)
    assert type(e.value) is kind
    assert str(e.value) == f"{path}: {message}"


def _closed(fd: int) -> bool:
    try:
        _REAL_FSTAT(fd)
    except OSError as e:
        return e.errno == errno.EBADF
    return False


def _spy_open(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    fds: list[int] = []

    def spy(*a: Any, **k: Any) -> int:
        fds.append(_REAL_OPEN(*a, **k))
        return fds[-1]

    monkeypatch.setattr(os, "open", spy)
    return fds


def _guard_reads(monkeypatch: pytest.MonkeyPatch, pread_cap: int | None = None,
                 readv_cap: int | None = None) -> list[tuple[int, int]]:
    """os.pread/os.readv that give at most so many bytes a call (short reads are allowed by
    POSIX) and fail a loop that never ends instead of hanging; returns the requests."""
    calls: list[tuple[int, int]] = []
    real_read = os.read

    def pread(fd: int, n: int, offset: int) -> bytes:
        calls.append((offset, n))
        assert len(calls) < 100_000, "read loop does not end"
        return _REAL_PREAD(fd, n if pread_cap is None else min(n, pread_cap), offset)

    def readv(fd: int, bufs: list[memoryview]) -> int:
        calls.append((-1, len(bufs[0])))
        assert len(calls) < 100_000, "read loop does not end"
        data = real_read(fd, len(bufs[0]) if readv_cap is None else min(len(bufs[0]), readv_cap))
        bufs[0][: len(data)] = data
        return len(data)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "readv", readv)
    return calls


# ---------------------------------------------------------------------------------------------
# The writer: exact bytes


def test_a_header_packs_to_the_documented_bytes() -> None:
    h = KVHeader(quant_bits=4, reason=2, flags=5, tokens=3, hits=0x01020304, ctx=4096, fingerprint=0x0A0B0C0D,
                 created=0x0102030405060708, last_used=0x1112131415161718, payload_bytes=0x2122232425262728,
                 text_bytes=0x31323334)
    assert h.pack().hex() == (
        "4b5643" "01" "04" "02" "05" "00"  # "KVC", version 1, 4-bit experts, reason 2, flags 5, reserved 0
        "03000000" "04030201" "00100000" "0d0c0b0a"  # tokens, hits, ctx 4096, fingerprint (u32 LE)
        "0807060504030201" "1817161514131211" "2827262524232221"  # created, last used, payload bytes (u64)
        "34333231")  # text bytes: 52 bytes in all
    assert (h.text_offset, h.payload_offset) == (52, 52 + 0x31323334)


def test_a_file_is_header_text_payload_tool_map_and_checksum() -> None:
    # Sizes and flags in the header are the writer's business: stale values are replaced, a
    # stale map bit is cleared or set from the map, the checksum bit is always set.
    h = KVHeader(4, 2, 0, 3, 5, 4096, 0x0A0B0C0D, 0x0102030405060708, 0x1112131415161718, 99, 99)
    f = KVFile(h, b"abc", b"PAY", {"call_1": b"<x/>", "\u00e9": b""})
    data = f.to_bytes()
    assert data[:-20].hex() == (
        "4b5643" "01" "04" "02" "09" "00"  # flags 1 (tool map) | 8 (checksum)
        "03000000" "05000000" "00100000" "0d0c0b0a"
        "0807060504030201" "1817161514131211" "0300000000000000" "03000000"
        "616263" "504159"  # text "abc", payload "PAY"
        "4b544d" "01" "02000000"  # "KTM", version 1, two entries in insertion order
        "06000000" "04000000" "63616c6c5f31" "3c782f3e"  # "call_1" -> "<x/>"
        "02000000" "00000000" "c3a9"  # "é" in UTF-8 -> empty DSML
        "4b435301")  # "KCS", version 1, then the SHA-1
    assert data[-20:] == hashlib.sha1(data[:12] + data[16:32] + data[40:-24]).digest()
    assert (h.text_bytes, h.payload_bytes, h.flags) == (3, 3, 9)


def test_without_a_map_no_map_bit_and_other_bits_kept() -> None:
    # A stale map bit (1) goes, the visible-text bit (2) stays, the checksum bit (8) is added.
    f = KVFile(KVHeader(2, 0, MAP | VISIBLE_A, 3, 0, 8, 0, 0, 0, 0, 0), b"abc", b"")
    data = f.to_bytes()
    assert data[:52] == _head(bits=2, flags=10, ctx=8, tbytes=3)
    assert data[52:55] == b"abc" and len(data) == 52 + 3 + 24
    assert data[55:59] == b"KCS\x01" and data[59:] == hashlib.sha1(data[:12] + data[16:32] + data[40:55]).digest()


def test_a_file_is_named_by_the_sha1_of_its_text() -> None:
    f = KVFile(KVHeader(4, 0, 0, 3, 0, 8, 0, 0, 0, 0, 0), b"abc", b"")
    assert f.sha() == kv.text_sha(b"abc") == "a9993e364706816aba3e25717850c26c9cd0d89d"  # FIPS 180 test vector


def test_the_save_reasons_are_the_documented_table() -> None:
    doc = " ".join((ROOT / "docs" / "model.md").read_text().split())
    listed = re.search(r"Save reasons: (.*?) \(", doc)
    assert listed is not None
    from_doc = {name: int(num) for num, name in re.findall(r"(\d+) ([a-z-]+)", listed.group(1))}
    expected = {"unknown": 0, "cold": 1, "continued": 2, "evict": 3, "shutdown": 4, "agent-system": 5,
                "agent-session": 6}
    assert from_doc == expected
    assert kv.REASONS == expected
    assert kv.REASON_NAMES == {v: k for k, v in expected.items()}


def test_the_payload_header_is_immutable() -> None:
    p = kv._check_payload_header(_payload_header(), KVHeader(4, 0, 8, N, 0, 4096, 0, 0, 0, LOW, N), "f")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.tokens = 1  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# The checksum's exact coverage


def test_hits_and_last_used_change_in_place_without_breaking_the_checksum(tmp_path: Path) -> None:
    data = bytearray(_file(hits=1, used=2))
    data[12:16] = struct.pack("<I", 77)
    data[32:40] = struct.pack("<Q", 0x0102030405060708)
    f = kv.read_file(_write(tmp_path, bytes(data)))
    assert (f.header.hits, f.header.last_used, f.text) == (77, 0x0102030405060708, b"abc")


@pytest.mark.parametrize("offset", [5, 7, 16, 19, 20, 24, 31, 52, 54, 55, 58, 63])
def test_every_other_byte_is_covered(tmp_path: Path, offset: int) -> None:
    # reason, reserved, ctx, fingerprint, created, the text, the payload and the map; the
    # fields whose damage the header check would see first (sizes, tokens) are left out.
    data = bytearray(_file(flags=MAP | CHECKSUM, text=b"abc", tail=_map([]), pbytes=0))
    assert len(data) == 52 + 3 + 8 + 24
    # offsets 55.. are the map: magic, version, count; damage there must not read as a map either
    data[offset] ^= 0x40
    _refused(_write(tmp_path, bytes(data)), "checksum mismatch (the file is damaged)")


def test_the_trailer_needs_its_magic_and_version(tmp_path: Path) -> None:
    good = _file()
    for trailer_head in (b"KCX\x01", b"KCS\x02"):
        bad = good[:-24] + trailer_head + good[-20:]  # digest right, trailer head wrong
        _refused(_write(tmp_path, bad), "checksum mismatch (the file is damaged)")


def test_a_ds4_file_without_the_checksum_flag_is_read_unchecked(tmp_path: Path) -> None:
    data = bytearray(_file(flags=0))
    assert len(data) == 55
    data[53] = ord("X")
    f = kv.read_file(_write(tmp_path, bytes(data)))
    assert (f.text, bytes(f.payload), f.tool_map, f.header.flags) == (b"aXc", b"", {}, 0)


# ---------------------------------------------------------------------------------------------
# Reading a good file


def _full_file(**fields: Any) -> bytes:
    return _file(flags=MAP | CHECKSUM, tokens=N, text=TEXT, payload=_payload(LOW),
                 tail=_map([(b"call_1", b"<x/>"), ("\u00e9".encode(), b"")]), reason=6, hits=2, created=10,
                 used=20, fp=0xCAFE, **fields)


def test_a_good_file_reads_back_in_every_reader(tmp_path: Path) -> None:
    data = _full_file()
    p = _write(tmp_path, data)
    expected = KVHeader(quant_bits=4, reason=6, flags=9, tokens=N, hits=2, ctx=4096, fingerprint=0xCAFE,
                        created=10, last_used=20, payload_bytes=LOW, text_bytes=N, version=1)
    tools = {"call_1": b"<x/>", "\u00e9": b""}
    f = kv.read_file(p)
    assert (f.header, f.text, bytes(f.payload), f.tool_map) == (expected, TEXT, _payload(LOW), tools)
    assert kv.read_header(p) == (expected, TEXT)
    assert kv.read_header(p, with_text=False) == (expected, b"")
    assert kv.read_summary(p) == (expected, hashlib.sha1(TEXT).hexdigest(), TEXT, len(data), None)
    with KVReader(p) as r:
        assert (r.size, r.header, r.payload_header) == (len(data), expected, PHEADER)
        assert r.text() == TEXT
        assert r.payload_tokens() == IDS
        assert r.tool_map() == tools
        assert r.read().text == TEXT
        assert r.read().tool_map == tools  # a second read starts again at offset 0


def test_a_ds4_file_with_a_map_and_no_trailer(tmp_path: Path) -> None:
    tail = _map([(b"a", b"xyz")])
    p = _write(tmp_path, _file(flags=MAP, tokens=N, text=TEXT, payload=_payload(LOW), tail=tail))
    with KVReader(p) as r:
        assert r.size == 52 + N + LOW + len(tail)
        assert r.tool_map() == {"a": b"xyz"}
    assert kv.read_file(p).tool_map == {"a": b"xyz"}


def test_a_stripped_file_has_no_payload_header(tmp_path: Path) -> None:
    p = _write(tmp_path, _file())
    with KVReader(p) as r:
        assert (r.payload_header, r.header.payload_bytes, r.tool_map(), r.text()) == (None, 0, {}, b"abc")
    f = kv.read_file(p)
    assert (bytes(f.payload), f.tool_map) == (b"", {})


def test_an_empty_map_of_eight_bytes_is_a_map(tmp_path: Path) -> None:
    p = _write(tmp_path, _file(flags=MAP | CHECKSUM, tail=_map([])))
    with KVReader(p) as r:
        assert r.tool_map() == {}
    assert kv.read_file(p).tool_map == {}


def test_reads_that_come_back_short_are_assembled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _full_file()
    p = _write(tmp_path, data)
    # 7 bytes a pread: the last piece of most reads is shorter than what a wrong request asks
    _guard_reads(monkeypatch, pread_cap=7, readv_cap=1)
    f = kv.read_file(p)
    assert (f.text, bytes(f.payload)) == (TEXT, _payload(LOW))
    with KVReader(p) as r:
        assert (r.text(), r.payload_tokens(), r.tool_map()) == (TEXT, IDS, {"call_1": b"<x/>", "\u00e9": b""})
        assert r.pread(0, 60) == data[:60] and r.pread(len(data) - 5, 50) == data[-5:]
        assert r.pread(3, 10) == data[3:13]  # two pieces, 7 + 3


def test_a_listing_hashes_the_text_a_megabyte_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = 2 * MiB + MiB // 2
    text = (bytes(range(251)) * (size // 251 + 1))[:size]
    p = _write(tmp_path, _file(tokens=2560, text=text))  # 1024 bytes a token, at most
    with KVReader(p) as r:
        calls = _guard_reads(monkeypatch)
        sha, head = r.text_summary()
        assert calls == [(52, MiB), (52 + MiB, MiB), (52 + 2 * MiB, MiB // 2)]
        assert (sha, head) == (hashlib.sha1(text).hexdigest(), text[:MiB])
        assert r.text_summary(head_bytes=MiB + MiB // 2) == (sha, text[: MiB + MiB // 2])
        assert r.text_summary(head_bytes=10) == (sha, text[:10])


# ---------------------------------------------------------------------------------------------
# The header check: each refusal, and the boundary that is still accepted


@pytest.mark.parametrize("fields,message", [
    (dict(magic=b"KVD"), "not a session file (bad magic)"),
    (dict(version=2), "session file version 2 is newer than this build understands (version 1)"),
    (dict(bits=3), "invalid expert quant bits 3"),
    (dict(bits=8), "invalid expert quant bits 8"),
    (dict(tokens=0), "session file holds no tokens"),
    (dict(pbytes=100), "truncated session file (header promises 155 bytes, file has 79)"),
    (dict(tokens=4), "header says 4 tokens for 3 bytes of text (damaged file)"),
    (dict(tokens=4, flags=MAP | CHECKSUM, tail=_map([])), "header says 4 tokens for 3 bytes of text (damaged file)"),
    (dict(tokens=1, text=b"x" * 1025), "header says 1 tokens for 1025 bytes of text (damaged file)"),
    (dict(checksum=False), "truncated session file (checksum trailer missing)"),
    (dict(tail=b"12345"), "5 unexpected bytes after the payload (file has 84 bytes)"),
    (dict(flags=0, tail=b"12345"), "5 unexpected bytes after the payload (file has 60 bytes)"),
    (dict(flags=MAP | CHECKSUM), "corrupt tool-id map (0 bytes)"),
    (dict(flags=MAP | CHECKSUM, tail=b"KTM"), "corrupt tool-id map (3 bytes)"),
    (dict(flags=MAP, tail=b"KTM\x01\x00\x00\x00"), "corrupt tool-id map (7 bytes)"),
])
def test_the_header_check_refuses(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    p = _write(tmp_path, _file(**fields))
    for reader in (kv.read_file, kv.read_header, kv.read_summary):
        _refused(p, message, reader)


def test_a_file_shorter_than_a_header(tmp_path: Path) -> None:
    _refused(_write(tmp_path, _file()[:51]), "truncated session file (51 bytes)", kv.read_header)
    _refused(_write(tmp_path, b""), "truncated session file (0 bytes)", kv.read_header)


@pytest.mark.parametrize("fields,tokens,text", [
    (dict(bits=2), 3, b"abc"),
    (dict(bits=4), 3, b"abc"),
    (dict(), 3, b"abc"),  # as many bytes as tokens
    (dict(), 1, b"x" * 1024),  # 1024 bytes a token is still a text
    (dict(flags=VISIBLE_A | CHECKSUM), 4, b"abc"),  # ds4's "visible" text may be shorter than the tokens
    (dict(flags=VISIBLE_B | CHECKSUM), 4, b"abc"),
    (dict(flags=VISIBLE_A), 1, b""),  # a header alone, exactly 52 bytes, is a (ds4) file
])
def test_the_header_check_accepts(tmp_path: Path, fields: dict[str, Any], tokens: int, text: bytes) -> None:
    data = _file(tokens=tokens, text=text, **fields)
    h, got = kv.read_header(_write(tmp_path, data))
    assert (h.tokens, h.quant_bits, h.text_bytes, got) == (tokens, fields.get("bits", 4), len(text), text)
    assert kv.read_file(tmp_path / "s.kv").text == text
    if not text:
        assert len(data) == 52


def test_a_text_of_exactly_one_gib_is_the_largest(tmp_path: Path) -> None:
    # Sparse files: only the header is ever read.
    p = tmp_path / "big.kv"
    for tbytes, tokens, ok in ((1 << 30, 1 << 20, True), ((1 << 30) + 1, (1 << 20) + 1, False)):
        p.write_bytes(_head(flags=0, tokens=tokens, tbytes=tbytes))
        os.truncate(p, 52 + tbytes)
        if ok:
            h, _ = kv.read_header(p, with_text=False)
            assert (h.text_bytes, h.payload_offset) == (1 << 30, 52 + (1 << 30))
        else:
            n = 52 + tbytes
            _refused(p, f"truncated session file (header promises {n} bytes, file has {n})",
                     lambda q: kv.read_header(q, with_text=False))


def test_a_tool_map_of_exactly_64_mib_is_the_largest(tmp_path: Path) -> None:
    limit = 64 * MiB
    p = tmp_path / "map.kv"
    # One entry: id "x" and limit - 17 zero bytes of DSML (8 map head + 8 entry head + 1 id).
    p.write_bytes(_file(flags=MAP, text=b"abc") + _map([])[:4] + struct.pack("<III", 1, 1, limit - 17) + b"x")
    os.truncate(p, 55 + limit)
    with KVReader(p) as r:
        tools = r.tool_map()
    assert list(tools) == ["x"] and tools["x"] == bytes(limit - 17)
    os.truncate(p, 55 + limit + 1)
    _refused(p, f"corrupt tool-id map ({limit + 1} bytes)", KVReader)


# ---------------------------------------------------------------------------------------------
# The payload header check (docs/model.md §6.1, without the model)


def _payload_file(tmp_path: Path, payload: bytes, pbytes: int | None = None) -> Path:
    return _write(tmp_path, _file(tokens=N, text=TEXT, payload=payload, pbytes=pbytes))


@pytest.mark.parametrize("size,fields,message", [
    (40, {}, "payload of 40 bytes is too short (damaged file)"),
    (52, {}, f"payload of 52 bytes cannot hold {N} tokens ({LOW}..{HIGH} bytes for its dimensions; damaged file)"),
    (LOW - 1, {}, f"payload of {LOW - 1} bytes cannot hold {N} tokens ({LOW}..{HIGH} bytes for its dimensions; damaged file)"),
    (HIGH + 1, {}, f"payload of {HIGH + 1} bytes cannot hold {N} tokens ({LOW}..{HIGH} bytes for its dimensions; damaged file)"),
    (HIGH_DI100 + 1, dict(di=100),
     f"payload of {HIGH_DI100 + 1} bytes cannot hold {N} tokens ({LOW}..{HIGH_DI100} bytes for its dimensions; damaged file)"),
    (LOW, dict(magic=0x34565345), "the payload is not a DeepSeek V4 snapshot (bad magic)"),
    (LOW, dict(n=N - 1), f"header says {N} tokens, its payload holds {N - 1} (damaged file)"),
    (LOW, dict(raw_live=5), f"payload raw row count 5 is inconsistent with {N} tokens (damaged file)"),
])
def test_the_payload_check_refuses(tmp_path: Path, size: int, fields: dict[str, Any], message: str) -> None:
    p = _payload_file(tmp_path, _payload(size, **fields))
    for reader in (KVReader, kv.read_header, kv.read_summary, kv.read_file):
        _refused(p, message, reader)


@pytest.mark.parametrize("size,fields,expected", [
    (LOW, {}, PHEADER),
    (HIGH, {}, PHEADER),
    (HIGH_DI100, dict(di=100), dataclasses.replace(PHEADER, indexer_dim=100)),
])
def test_the_payload_check_accepts_its_bounds(tmp_path: Path, size: int, fields: dict[str, Any],
                                              expected: PayloadHeader) -> None:
    with KVReader(_payload_file(tmp_path, _payload(size, **fields))) as r:
        assert r.payload_header == expected
        assert r.payload_tokens() == IDS


# ---------------------------------------------------------------------------------------------
# The tool-id map


def _parse(rest: bytes) -> dict[str, bytes]:
    return kv._parse_toolmap(rest, "f")


def test_the_tool_map_decodes_exactly() -> None:
    two = _map([(b"call_1", b"<x/>"), ("\u00e9".encode(), b"")])
    assert _parse(two) == {"call_1": b"<x/>", "\u00e9": b""}
    assert _parse(memoryview(two)) == {"call_1": b"<x/>", "\u00e9": b""}
    assert _parse(_map([])) == {}
    assert _parse(_map([(b"", b"")])) == {"": b""}  # an entry that ends exactly at the end


@pytest.mark.parametrize("rest", [
    b"KTM\x01\x00\x00\x00",  # shorter than its own head
    b"KTX\x01" + bytes(4),  # magic
    b"KTM\x02" + bytes(4),  # version
    _map([], count=1),  # an entry promised, none there
    _map([(b"call_1", b"<x/>")])[:-1],  # an entry one byte short
    _map([(b"call_1", b"<x/>")], count=2),  # the second entry missing
    _map([(b"\xff", b"")]),  # an id that is not UTF-8
    _map([(b"a", b"b")]) + b"\x00",  # bytes after the last entry
])
def test_a_damaged_tool_map_is_refused(rest: bytes) -> None:
    with pytest.raises(KVFileError) as e:
        _parse(rest)
    assert str(e.value) == "f: corrupt tool-id map"


# ---------------------------------------------------------------------------------------------
# A file that changes while it is open


@pytest.mark.parametrize("cut,call,message", [
    (53, lambda r: r.text(), "truncated session file"),
    (53, lambda r: r.text_summary(), "truncated session file"),
    (52 + N + 52 + 8, lambda r: r.payload_tokens(), "truncated session file"),
    (100, lambda r: r.read(), "truncated session file (shrank while being read)"),
])
def test_a_file_that_shrinks_after_it_was_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int,
                                                 call: Callable[[KVReader], object], message: str) -> None:
    p = _payload_file(tmp_path, _payload(LOW))
    with KVReader(p) as r:
        os.truncate(p, cut)
        _guard_reads(monkeypatch)
        _refused(p, message, lambda _: call(r))


def test_read_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, _file())

    def fail(*a: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    with KVReader(p) as r:
        monkeypatch.setattr(os, "readv", fail)
        _refused(p, "cannot read: Input/output error", lambda _: r.read())
        monkeypatch.setattr(os, "pread", fail)
        _refused(p, "cannot read: Input/output error", lambda _: r.text())
    _refused(p, "cannot read: Input/output error", KVReader)


def test_a_file_too_large_for_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, _file())

    def no_memory(n: int) -> bytearray:
        raise MemoryError

    monkeypatch.setattr(kv, "bytearray", no_memory, raising=False)  # the module's name, before the builtin
    _refused(p, "not enough memory to read its 79 bytes")


# ---------------------------------------------------------------------------------------------
# Opening: only regular files, never blocking, never through a link; descriptors closed


def _access(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def test_a_regular_file_opens_blocking_and_read_only_unless_asked(tmp_path: Path) -> None:
    p = _write(tmp_path, _file())
    for kwargs, mode in (({}, os.O_RDONLY), (dict(writable=False), os.O_RDONLY), (dict(writable=True), os.O_RDWR)):
        fd, st = kv.open_regular(p, **kwargs)
        try:
            assert (_access(fd), os.get_blocking(fd)) == (mode, True)
            assert (st.st_ino, st.st_size, stat.S_ISREG(st.st_mode)) == (os.stat(p).st_ino, 79, True)
        finally:
            os.close(fd)
    with KVReader(p) as r:
        assert _access(r.fd) == os.O_RDONLY
    with KVReader(p, writable=True) as r:
        assert _access(r.fd) == os.O_RDWR


def test_what_is_not_a_regular_file_is_named(tmp_path: Path) -> None:
    target = _write(tmp_path, _file(), "target.kv")
    (tmp_path / "dir.kv").mkdir()
    os.mkfifo(tmp_path / "fifo.kv")
    (tmp_path / "link.kv").symlink_to(target)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock.kv"))
        for name, kind in (("dir.kv", "directory"), ("fifo.kv", "FIFO"), ("sock.kv", "socket"),
                           ("link.kv", "symbolic link")):
            _refused(tmp_path / name, f"is a {kind}, not a session file", kv.open_regular)
    finally:
        sock.close()
    _refused(Path("/dev/null"), "is a character device, not a session file", kv.open_regular)
    _refused(tmp_path / "gone.kv", "no such session file", kv.open_regular, KVFileGone)
    _refused(target / "x.kv", "cannot read: Not a directory", kv.open_regular)


def test_every_kind_has_its_name() -> None:
    kinds = [(stat.S_IFDIR, "directory"), (stat.S_IFIFO, "FIFO"), (stat.S_IFSOCK, "socket"),
             (stat.S_IFCHR, "character device"), (stat.S_IFBLK, "block device"), (stat.S_IFLNK, "symbolic link"),
             (0, "special file")]
    assert [kv._kind(mode | 0o644) for mode, _ in kinds] == [name for _, name in kinds]


def _regular_lstat(monkeypatch: pytest.MonkeyPatch, like: Path) -> None:
    """What a path swapped after the lstat looks like: lstat saw a regular file."""
    st = os.lstat(like)
    monkeypatch.setattr(os, "lstat", lambda *a, **k: st)


def test_a_swap_after_the_lstat_is_caught_when_opening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _write(tmp_path, _file(), "target.kv")
    (tmp_path / "link.kv").symlink_to(target)
    (tmp_path / "dir.kv").mkdir()
    fds = _spy_open(monkeypatch)
    _regular_lstat(monkeypatch, target)
    _refused(tmp_path / "link.kv", "is a symbolic link, not a session file", kv.open_regular)
    _refused(tmp_path / "gone.kv", "no such session file", kv.open_regular, KVFileGone)
    _refused(tmp_path / "dir.kv", "cannot open: Is a directory", lambda q: kv.open_regular(q, writable=True))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock.kv"))
        _refused(tmp_path / "sock.kv", "cannot read: No such device or address", kv.open_regular)
    finally:
        sock.close()
    assert fds == []  # none of these opened anything


def test_a_fifo_swapped_in_is_refused_without_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo.kv"
    os.mkfifo(fifo)
    other_end = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer: a blocking open would not hang
    try:
        _regular_lstat(monkeypatch, _write(tmp_path, _file(), "target.kv"))
        fds = _spy_open(monkeypatch)
        for writable in (False, True):
            _refused(fifo, "is a FIFO, not a session file", lambda q: kv.open_regular(q, writable=writable))
        assert len(fds) == 2 and all(_closed(fd) for fd in fds)
    finally:
        os.close(other_end)


def test_a_failed_fstat_closes_the_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, _file())
    fds = _spy_open(monkeypatch)

    def fail(fd: int) -> os.stat_result:
        if fd not in fds:  # pytest's own descriptors
            return _REAL_FSTAT(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fstat", fail)
    _refused(p, "cannot read: Input/output error", kv.open_regular)
    assert len(fds) == 1 and _closed(fds[0])


def test_a_refused_file_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fds = _spy_open(monkeypatch)
    _refused(_write(tmp_path, _file(magic=b"KVD")), "not a session file (bad magic)", KVReader)
    _refused(_payload_file(tmp_path, _payload(LOW, raw_live=5)),
             f"payload raw row count 5 is inconsistent with {N} tokens (damaged file)", KVReader)
    assert len(fds) == 2 and all(_closed(fd) for fd in fds)


def test_closing_a_reader_closes_its_descriptor_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _write(tmp_path, _file())
    fds = _spy_open(monkeypatch)
    with KVReader(p) as r:
        assert r.fd == fds[0] and not _closed(fds[0])
    assert r.fd == -1 and _closed(fds[0])
    r.close()  # again: nothing to close
    assert r.fd == -1


def test_a_reader_on_descriptor_zero_closes_it(tmp_path: Path) -> None:
    # fd 0 is a descriptor like any other: a reader given it (stdin closed) must close it.
    p = _write(tmp_path, _file())
    saved = os.dup(0)
    try:
        os.close(0)
        r = KVReader(p)
        assert r.fd == 0
        r.close()
        assert r.fd == -1 and _closed(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_steering_record_reads_back_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    """Our extension: the steering record (JSON, then a footer) between the tool map and the
    checksum: read by every reader without the payload; the tool map before it intact."""
    record = {"name": "verbosity", "digest": "0123456789ab", "ffn": 1.0, "attn": 0.0}
    header = KVHeader(4, 6, 0, N, 0, 4096, 0xCAFE, 10, 20, 0, 0)
    tools = {"call_1": b"<x/>"}
    data = kv.KVFile(header, TEXT, _payload(LOW), tools, json.dumps(record).encode()).to_bytes()
    p = _write(tmp_path, data)
    f = kv.read_file(p)
    assert f.header.flags == MAP | CHECKSUM | kv.FLAG_STEERING and f.tool_map == tools
    assert json.loads(f.steering) == record and bytes(f.payload) == _payload(LOW)
    assert kv.read_summary(p)[4] == record
    with KVReader(p) as r:
        assert r.tool_map() == tools and r.steering() == record
    bad = bytearray(data)
    footer = len(bad) - kv.CHECKSUM_SIZE - kv.STEERING_FOOTER.size
    bad[footer + 4 : footer + 7] = b"XXX"
    q = _write(tmp_path, bytes(bad), "bad")
    with pytest.raises(kv.KVFileError, match="corrupt steering record"):
        kv.read_summary(q)
    with pytest.raises(kv.KVFileError, match="checksum mismatch|corrupt steering"):
        kv.read_file(q)
