"""GGUF reader: agreement with gguf.GGUFReader, every value type, alignment, memory, errors."""

from __future__ import annotations

import os
import re
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers import damage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4agent.modelfile.gguf import DIRECT_ALIGN, GGUFError, GGUFFile, direct_span, tensor_nbytes, write_gguf
from ds4agent.modelfile.gguf import ValueType as V

Q = gguf.GGMLQuantizationType


def test_demo_agrees_with_gguf_package(demo_path: Path) -> None:
    ours = GGUFFile(demo_path)
    ref = gguf.GGUFReader(demo_path)
    assert len(ref.tensors) == len(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.dims == tuple(int(x) for x in t.shape)
        assert mine.type == int(t.tensor_type)
        assert mine.offset == t.data_offset
        assert mine.nbytes == t.n_bytes
        if mine.type in (Q.F32, Q.F16, Q.I32):
            assert np.array_equal(ours.array(t.name).reshape(-1), np.asarray(t.data).reshape(-1))
        else:
            assert bytes(ours.raw(t.name)) == np.asarray(t.data).tobytes()
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        got = ours.metadata[key]
        vt = field.types[0]
        if vt == gguf.GGUFValueType.STRING:
            assert got == str(bytes(field.parts[-1]), "utf-8")
        elif vt == gguf.GGUFValueType.ARRAY:
            if field.types[1] == gguf.GGUFValueType.STRING:
                assert got == [str(bytes(field.parts[i]), "utf-8") for i in field.data]
            else:
                assert got == [field.parts[i].tolist()[0] for i in field.data]
        else:
            assert got == field.parts[-1].tolist()[0]
    ours.close()


def test_quantised_view_is_rows_of_blocks(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        t = f.tensors["blk.3.ffn_gate_exps.weight"]
        view = f.array(t.name)
        # (experts, rows, row_bytes): expert e's row r starts at e*(rows*row_bytes) + r*row_bytes.
        assert view.shape == (t.shape[0], t.shape[1], t.row_bytes)
        assert not view.flags.owndata and not view.flags.writeable
        e, r = 5, 17
        start = t.offset + (e * t.shape[1] + r) * t.row_bytes
        assert bytes(view[e, r]) == bytes(f._mm[start : start + t.row_bytes])


ALL_TYPES = {
    "u8": (V.UINT8, 200), "i8": (V.INT8, -100), "u16": (V.UINT16, 60000), "i16": (V.INT16, -30000),
    "u32": (V.UINT32, 4_000_000_000), "i32": (V.INT32, -2_000_000_000), "f32": (V.FLOAT32, 0.5),
    "bool": (V.BOOL, True), "str": (V.STRING, "héllo ｜DSML｜ 🎉"), "u64": (V.UINT64, 2**63 + 5),
    "i64": (V.INT64, -(2**62)), "f64": (V.FLOAT64, 1e-300),
    "arr_u32": (V.ARRAY, (V.UINT32, [0, 0, 4, 128])), "arr_f32": (V.ARRAY, (V.FLOAT32, [10.0, 1.5])),
    "arr_str": (V.ARRAY, (V.STRING, ["a b", "", "ｘ"])), "arr_bool": (V.ARRAY, (V.BOOL, [True, False])),
    "arr_i64": (V.ARRAY, (V.INT64, [-1, 2**40])), "arr_empty": (V.ARRAY, (V.INT32, [])),
}


@pytest.mark.parametrize("alignment", [32, 64, 4096])
def test_every_value_type_and_alignment(tmp_path: Path, alignment: int) -> None:
    p = tmp_path / "t.gguf"
    a = np.arange(96, dtype=np.float32)
    b = np.arange(10, dtype=np.float16)
    write_gguf(p, ALL_TYPES, [("a", Q.F32, (32, 3), a), ("b", Q.F16, (10,), b)], alignment=alignment)
    f = GGUFFile(p)
    for key, (vtype, value) in ALL_TYPES.items():
        expect = value[1] if vtype == V.ARRAY else value
        assert f.metadata[key] == expect, key
        assert f.value_types[key][0] == vtype
    assert f.alignment == alignment
    assert f.data_offset % alignment == 0
    for t in f.tensors.values():
        assert (t.offset - f.data_offset) % alignment == 0
    assert np.array_equal(f.array("a"), a.reshape(3, 32))
    assert np.array_equal(f.array("b"), b)
    # The independent reader agrees on where the data lives.
    ref = gguf.GGUFReader(p)
    assert [t.data_offset for t in ref.tensors] == [f.tensors["a"].offset, f.tensors["b"].offset]


def test_opening_reads_no_tensor_data(flash_header_path: Path) -> None:
    """An 80.8 GiB file (sparse here) opens with resident memory bounded by the header."""
    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    f = GGUFFile(flash_header_path)
    grown = rss() - before
    assert f.file_size > 80 * 1024**3
    vocab_bytes = sum(len(s.encode()) for s in f.metadata["tokenizer.ggml.tokens"])
    vocab_bytes += sum(len(s.encode()) for s in f.metadata["tokenizer.ggml.merges"])
    # Python string objects cost ~60 B each on top of their text.
    vocab_cost = vocab_bytes + 64 * (len(f.metadata["tokenizer.ggml.tokens"]) + len(f.metadata["tokenizer.ggml.merges"]))
    assert grown < 64 * 2**20 + vocab_cost, (grown, vocab_cost)
    f.close()


# -- errors: one line, naming the file --------------------------------------------------------

def _small(tmp_path: Path) -> Path:
    p = tmp_path / "small.gguf"
    write_gguf(p, {"general.architecture": (V.STRING, "deepseek4")},
               [("w", Q.Q8_0, (64, 2), np.zeros(2 * 2 * 34, dtype=np.uint8))])
    return p


def _expect(path: Path, fragment: str) -> None:
    with pytest.raises(GGUFError) as e:
        GGUFFile(path)
    msg = str(e.value)
    assert str(path) in msg and fragment in msg and "\n" not in msg, msg


def test_missing_path(tmp_path: Path) -> None:
    _expect(tmp_path / "nope.gguf", "no such file")


def test_directory(tmp_path: Path) -> None:
    _expect(tmp_path, "is a directory")


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    _expect(p, "not a GGUF file")
    p.write_bytes(b"")
    _expect(p, "not a GGUF file")


def test_unsupported_version(tmp_path: Path) -> None:
    p = _small(tmp_path)
    data = bytearray(p.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    p.write_bytes(bytes(data))
    _expect(p, "unsupported GGUF version 2")


def test_truncated_header_at_every_cut(tmp_path: Path) -> None:
    p = _small(tmp_path)
    data = p.read_bytes()
    with GGUFFile(p) as f:
        header_end = f.data_offset
    cut = tmp_path / "cut.gguf"
    for n in range(4, header_end - 8, 3):
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFError) as e:
            GGUFFile(cut)
        assert "truncated" in str(e.value) or "past the end" in str(e.value), (n, str(e.value))


def test_tensor_past_end(tmp_path: Path) -> None:
    p = _small(tmp_path)
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    _expect(p, "extends past the end of the file")


def test_unknown_tensor_type(tmp_path: Path) -> None:
    p = _small(tmp_path)
    data = bytearray(p.read_bytes())
    i = data.find(b"\x01\x00\x00\x00\x00\x00\x00\x00w")  # name "w" (u64 length 1)
    at = i + 9 + 4 + 16  # past name, n_dims, two u64 dims -> the type field
    assert struct.unpack_from("<I", data, at)[0] == Q.Q8_0
    data[at : at + 4] = struct.pack("<I", 99)
    p.write_bytes(bytes(data))
    _expect(p, "unknown GGML type 99")


def test_bad_alignment_value(tmp_path: Path) -> None:
    p = tmp_path / "a.gguf"
    write_gguf(p, {"general.alignment": (V.UINT32, 48)}, [])
    _expect(p, "general.alignment")


def test_writer_checks_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_gguf(tmp_path / "w.gguf", {}, [("w", Q.Q8_0, (64,), b"\0" * 10)])
    assert tensor_nbytes(Q.IQ2_XXS, (4096, 2048, 256)) == 4096 // 256 * 66 * 2048 * 256
    assert not (tmp_path / "w.gguf").exists()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_reader_never_crashes(tmp_path: Path, data: st.DataObject) -> None:
    """Corrupt headers raise GGUFError (or open cleanly); nothing else escapes, nothing hangs."""
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(damage(_small(tmp_path).read_bytes(), data.draw, span=400, hits=6))
    try:
        GGUFFile(p).close()
    except GGUFError as e:
        assert "\n" not in str(e)


# -- damaged lengths, counts and nesting: one GGUFError that says what is wrong ------------------

def _raw_gguf(path: Path, entries: list[bytes], n_tensors: int = 0, tail: bytes = b"") -> Path:
    """A hand-made header (the writer cannot express some of these): ``entries`` are packed
    metadata entries, ``tail`` follows them (tensor directory, data)."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(entries)) + b"".join(entries) + tail)
    return path


def _entry(key: str, vtype: int, payload: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload


def _nested(levels: int) -> bytes:
    """An ARRAY value holding arrays ``levels`` deep, the innermost an empty u8 array."""
    return struct.pack("<IQ", V.ARRAY, 1) * (levels - 1) + struct.pack("<IQ", V.UINT8, 0)


def test_nested_arrays_within_the_limit_read(tmp_path: Path) -> None:
    from ds4agent.modelfile.gguf import MAX_ARRAY_DEPTH

    p = _raw_gguf(tmp_path / "n.gguf", [_entry("two", V.ARRAY, struct.pack("<IQ", V.ARRAY, 2)
                                                + struct.pack("<IQ", V.UINT32, 1) + struct.pack("<I", 7)
                                                + struct.pack("<IQ", V.UINT32, 0)),
                                         _entry("deep", V.ARRAY, _nested(MAX_ARRAY_DEPTH))])
    with GGUFFile(p) as f:
        assert f.metadata["two"] == [[7], []]
        value = f.metadata["deep"]
        for _ in range(MAX_ARRAY_DEPTH - 1):
            (value,) = value
        assert value == []


@pytest.mark.parametrize("levels", ["limit+1", 600, 100_000])
def test_deeply_nested_arrays_are_refused(tmp_path: Path, levels) -> None:
    """Arrays nested hundreds deep used to exhaust Python's recursion (RecursionError)."""
    from ds4agent.modelfile.gguf import MAX_ARRAY_DEPTH

    n = MAX_ARRAY_DEPTH + 1 if levels == "limit+1" else levels
    p = _raw_gguf(tmp_path / "deep.gguf", [_entry("general.deep", V.ARRAY, _nested(n))])
    _expect(p, f"general.deep nests arrays more than {MAX_ARRAY_DEPTH} levels deep")


def _patch_u64(path: Path, at: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + 8] = struct.pack("<Q", value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["key", "value", "tensor name", "vocabulary entry"])
@pytest.mark.parametrize("length", [2**62, 2**64 - 1, 1 << 40])
def test_huge_string_length_is_called_implausible(tmp_path: Path, where: str, length: int) -> None:
    """A damaged string length used to read as 'truncated GGUF header', which sends people to
    re-download a file whose header is simply corrupt."""
    p = tmp_path / "s.gguf"
    write_gguf(p, {"general.architecture": (V.STRING, "deepseek4"),
                   "tokenizer.ggml.tokens": (V.ARRAY, (V.STRING, ["a", "bc", "def"]))},
               [("w", Q.Q8_0, (64, 2), np.zeros(2 * 2 * 34, dtype=np.uint8))])
    data = p.read_bytes()
    at = {
        "key": 24,  # the first key's u64 length, right after the 24-byte file header
        "value": data.find(struct.pack("<Q", 9) + b"deepseek4"),
        "tensor name": data.find(struct.pack("<Q", 1) + b"w"),
        "vocabulary entry": data.find(struct.pack("<Q", 2) + b"bc"),
    }[where]
    assert at > 0
    _patch_u64(p, at, length)
    with pytest.raises(GGUFError) as e:
        GGUFFile(p)
    msg = str(e.value)
    assert f"implausible string length {length}" in msg and f"at byte {at}" in msg, msg
    assert f"{len(data)} bytes" in msg and "truncated" not in msg and "\n" not in msg, msg
    if where == "vocabulary entry":
        assert "tokenizer.ggml.tokens entry 1" in msg, msg


def test_string_running_past_a_cut_is_still_truncation(tmp_path: Path) -> None:
    """A plausible length that runs past the end is what a cut-off download looks like."""
    p = _small(tmp_path)
    data = p.read_bytes()
    at = data.find(struct.pack("<Q", 9) + b"deepseek4")
    p.write_bytes(data[: at + 12])
    _expect(p, "truncated GGUF header")


@pytest.mark.parametrize("sub", [V.UINT8, V.FLOAT64, V.STRING, V.ARRAY])
def test_huge_array_count_is_refused_before_allocation(tmp_path: Path, sub: int) -> None:
    p = _raw_gguf(tmp_path / "c.gguf", [_entry("general.big", V.ARRAY, struct.pack("<IQ", sub, 2**61))])
    _expect(p, f"implausible item count {2**61} for general.big")


def test_invalid_utf8_names_the_vocabulary_entry(tmp_path: Path) -> None:
    p = tmp_path / "u.gguf"
    write_gguf(p, {"tokenizer.ggml.tokens": (V.ARRAY, (V.STRING, ["a", "bc", "déf"]))}, [])
    data = bytearray(p.read_bytes())
    i = data.find("é".encode())
    data[i] = 0xFF
    p.write_bytes(bytes(data))
    _expect(p, "invalid UTF-8 in tokenizer.ggml.tokens entry 2")


@pytest.mark.parametrize("name", ["bad\nkey", "x" * 5000, "tab\there\x1b[31m"])
def test_damaged_names_stay_on_one_short_line(tmp_path: Path, name: str) -> None:
    """A damaged length can swallow neighbouring bytes into a key or tensor name (a u32 type of
    10 is a newline); messages quoting such a name must still be one readable line."""
    p = _raw_gguf(tmp_path / "k.gguf", [_entry(name, 99, b"")])
    with pytest.raises(GGUFError) as e:
        GGUFFile(p)
    msg = str(e.value)
    assert "unknown metadata value type 99" in msg and "\n" not in msg and msg.isprintable() and len(msg) < 400, msg
    tensor = struct.pack("<Q", len(name.encode())) + name.encode() + struct.pack("<I", 9)
    p = _raw_gguf(tmp_path / "t.gguf", [], n_tensors=1, tail=tensor)
    with pytest.raises(GGUFError) as e:
        GGUFFile(p)
    msg = str(e.value)
    assert "has 9 dimensions" in msg and "\n" not in msg and msg.isprintable() and len(msg) < 400, msg


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the mapping's flags from /proc/self/smaps")
def test_mapping_asks_for_huge_pages(demo_path: Path) -> None:
    """The model's mapping carries MADV_HUGEPAGE (smaps flag "hg"), so weights read from disk
    through it come in as 2 MB pages where the kernel maps file pages that way."""
    f = GGUFFile(demo_path)
    try:
        start = f.array(next(iter(f.tensors))).ctypes.data  # a tensor view lies in the mapping
        flags = None
        for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
            lo, hi = (int(v, 16) for v in block.split(" ", 1)[0].split("-"))
            if lo <= start < hi:
                flags = next(ln for ln in block.splitlines() if ln.startswith("VmFlags:")).split()[1:]
        assert flags is not None and "hg" in flags, flags
    finally:
        f.close()


def test_writer_makes_each_tensor_when_it_writes_it(tmp_path: Path) -> None:
    """Data given as functions is made one tensor at a time, as the file is written (a shape
    model of many layers is larger than memory): when a tensor's bytes are made, none made
    before is still alive."""
    import weakref

    p = tmp_path / "lazy.gguf"
    made: list[weakref.ref] = []
    alive: list[int] = []

    def make(i: int):
        def data() -> np.ndarray:
            alive.append(sum(r() is not None for r in made))
            a = np.full(64, i, dtype=np.float32)
            made.append(weakref.ref(a))
            return a
        return data

    write_gguf(p, {}, [(f"t{i}", Q.F32, (64,), make(i)) for i in range(4)])
    assert alive == [0, 0, 0, 0]  # each made as it is written, and let go once written
    with GGUFFile(p) as f:
        assert [int(f.array(f"t{i}")[0]) for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="t: 160 bytes given"):
        write_gguf(tmp_path / "bad.gguf", {}, [("t", Q.F32, (64,), lambda: np.zeros(40, np.float32))])
    assert not list(tmp_path.glob("bad.gguf*"))


def _aligned(n: int) -> np.ndarray:
    import mmap

    return np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)  # page-aligned, as the expert pool's slots


def test_reads_past_the_page_cache_land_the_bytes_at_their_offset_in_a_page(demo_path: Path) -> None:
    """read_direct (the expert pool's reads): whole pages of the file, the asked bytes at their
    file offset within the first page; read_into the same bytes at the buffer's start."""
    with GGUFFile(demo_path) as f:
        t = f.tensors["blk.1.ffn_down_exps.weight"]
        want = f.array(t.name)[3].tobytes()
        offset, n = t.offset + 3 * len(want), len(want)
        span = direct_span(offset, n)
        assert span % DIRECT_ALIGN == 0 and span >= offset % DIRECT_ALIGN + n > span - DIRECT_ALIGN
        buf = _aligned(span + DIRECT_ALIGN)
        skip = f.read_direct(offset, n, buf)
        if skip is None:
            pytest.skip("this file system does not read with O_DIRECT")
        assert skip == offset % DIRECT_ALIGN and buf[skip : skip + n].tobytes() == want
        assert f.read_direct(f.file_size - 5, 5, buf) == (f.file_size - 5) % DIRECT_ALIGN  # the file's last page
        assert buf[(f.file_size - 5) % DIRECT_ALIGN :][:5].tobytes() == Path(demo_path).read_bytes()[-5:]
        copy = _aligned(n)
        f.read_into(offset, copy)
        assert copy.tobytes() == want
        with pytest.raises(ValueError, match="needs"):
            f.read_direct(offset, n, buf[: span - DIRECT_ALIGN])
        with pytest.raises(GGUFError, match="outside the file"):
            f.read_direct(f.file_size - 4, 8, buf)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")
def test_a_file_system_that_refuses_direct_reads_gets_none(demo_path: Path, monkeypatch) -> None:
    import errno
    import fcntl

    real = os.preadv

    def refusing(fd, buffers, offset):  # as a file system that takes no direct read at this alignment
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", refusing)
    with GGUFFile(demo_path) as f:
        buf = _aligned(1 << 16)
        assert f.read_direct(4096, 100, buf) is None
        assert f.read_direct(0, 100, buf) is None  # remembered
        f.read_into(4096, buf[:100])  # reads through the page cache still work
        assert buf[:100].tobytes() == Path(demo_path).read_bytes()[4096:4196]
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, flags, *a: (_ for _ in ()).throw(OSError(errno.EINVAL, "no"))
                        if flags & os.O_DIRECT else real_open(path, flags, *a))
    with GGUFFile(demo_path) as f:
        assert f.read_direct(0, 100, _aligned(4096)) is None


def test_reads_for_the_expert_pool_skip_the_cache_where_the_os_has_f_nocache(demo_path: Path, monkeypatch) -> None:
    """macOS cannot drop pages from its cache after a read (no posix_fadvise), so read_into's
    descriptor is opened with F_NOCACHE there; elsewhere no such call is made. (The flag's value
    is stood in for here: this machine's fcntl has no F_NOCACHE.)"""
    import fcntl

    calls = []
    real = fcntl.fcntl
    monkeypatch.setattr(fcntl, "fcntl", lambda fd, cmd, arg=0: calls.append((cmd, arg)) or (
        0 if cmd == 48 else real(fd, cmd, arg)))
    want = Path(demo_path).read_bytes()[100:200]
    monkeypatch.delattr(fcntl, "F_NOCACHE", raising=False)
    with GGUFFile(demo_path) as f:
        f.read_into(100, buf := bytearray(100))
        assert bytes(buf) == want and calls == []
    monkeypatch.setattr(fcntl, "F_NOCACHE", 48, raising=False)
    with GGUFFile(demo_path) as f:
        f.read_into(100, buf := bytearray(100))
        assert bytes(buf) == want and calls == [(48, 1)]
