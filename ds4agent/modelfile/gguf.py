"""GGUF v3 reader (one read-only mmap, zero-copy tensor views) and a small writer.

The reader parses only the header: metadata and the tensor directory. Tensor bytes are never
touched until a caller slices a view, so opening an 81 GiB file costs the header pages (the
vocabulary dominates) and nothing else. We parse with ``struct`` ourselves rather than using
``gguf.GGUFReader`` because that reader builds numpy objects for every field of every string
of the 129 280-token vocabulary, which is several times slower (see tests/test_gguf.py).

Layout (all little-endian)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv   × (string key, u32 value_type, value)
    n_tensors × (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to general.alignment, then the data section; tensor offsets are relative to it.
"""

from __future__ import annotations

import errno
import fcntl as _fcntl
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
SUPPORTED_VERSION = 3
DEFAULT_ALIGNMENT = 32
# GGML tensors have at most four dimensions; more means a corrupt directory.
MAX_DIMS = 4
# What direct reads (read_direct: O_DIRECT) align their file offsets, lengths and memory to: the
# largest logical block size of the disks and file systems in use (512 or 4096 bytes), one page.
DIRECT_ALIGN = 4096
# Arrays of arrays: the format allows them, but real files use at most a level or two (the
# Flash file has none). Each level is one Python call, so a damaged header nesting thousands
# deep would exhaust the interpreter's recursion limit; 8 is far beyond any real use and far
# below that limit.
MAX_ARRAY_DEPTH = 8
# The longest metadata string we believe. Real headers hold keys, tensor names, vocabulary
# pieces and chat templates (tens of KB); a longer length is damage, and honouring it could copy
# gigabytes of an 81 GiB file's tensor data into one Python string.
MAX_STRING_BYTES = 64 << 20
# The most items one metadata array may claim. The largest real arrays are vocabularies and
# their merges (129 280 here, ~262 000 in the largest open vocabularies); a count past this is
# damage, refused before anything is allocated for it.
MAX_ARRAY_ITEMS = 1 << 24


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FMT: dict[int, str] = {
    ValueType.UINT8: "<B",
    ValueType.INT8: "<b",
    ValueType.UINT16: "<H",
    ValueType.INT16: "<h",
    ValueType.UINT32: "<I",
    ValueType.INT32: "<i",
    ValueType.FLOAT32: "<f",
    ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q",
    ValueType.INT64: "<q",
    ValueType.FLOAT64: "<d",
}
_NUMPY_DTYPE: dict[int, str] = {
    ValueType.UINT8: "<u1",
    ValueType.INT8: "<i1",
    ValueType.UINT16: "<u2",
    ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4",
    ValueType.INT32: "<i4",
    ValueType.FLOAT32: "<f4",
    ValueType.BOOL: "<u1",
    ValueType.UINT64: "<u8",
    ValueType.INT64: "<i8",
    ValueType.FLOAT64: "<f8",
}


class GGUFError(ValueError):
    """A file that cannot be used as GGUF; the message is one line and names the file."""


def shown(name: str, limit: int = 120) -> str:
    """A key or tensor name as it may appear in a one-line message. A damaged length can swallow
    neighbouring bytes into a name, leaving newlines, control characters or megabytes in it."""
    short = name if len(name) <= limit else name[:limit] + "..."
    return short if short.isprintable() else repr(short)


def type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def block_info(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) for a GGML type; KeyError if unknown."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]


def direct_span(offset: int, length: int) -> int:
    """Bytes a direct read (GGUFFile.read_direct) of ``length`` bytes at ``offset`` fills: the
    whole DIRECT_ALIGN pages that hold them."""
    return -(-(offset % DIRECT_ALIGN + length) // DIRECT_ALIGN) * DIRECT_ALIGN


def tensor_nbytes(ggml_type: int, dims: Iterable[int]) -> int:
    dims = list(dims)
    block, size = block_info(ggml_type)
    if dims and dims[0] % block:
        raise ValueError(f"row of {dims[0]} elements is not a multiple of the {type_name(ggml_type)} block ({block})")
    n = 1
    for d in dims:
        n *= d
    return n // block * size


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: int
    dims: tuple[int, ...]  # GGUF order, fastest-varying first
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (numpy) shape: the GGUF dims reversed."""
        return tuple(reversed(self.dims))

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of dims[0] elements."""
        return tensor_nbytes(self.type, self.dims[:1])


class _Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    __slots__ = ("buf", "pos", "end", "path")

    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.path = path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise GGUFError(f"{self.path}: truncated GGUF header (reading {what} at byte {self.pos})")

    def scalar(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", 8, what)

    def bad_length(self, n: int, at: int, what: str) -> None:
        """Raise for string length ``n`` (its u64 at byte ``at``) that cannot be read: an
        implausible one is damage; a plausible one running past the end is a cut-off file."""
        if n > MAX_STRING_BYTES:
            bound = (f"longer than the whole file ({self.end} bytes)" if n > self.end else
                     f"beyond any GGUF metadata string "
                     f"(at most {MAX_STRING_BYTES} bytes here; the file has {self.end})")
            raise GGUFError(f"{self.path}: damaged GGUF header: implausible string length {n} for {what} "
                            f"at byte {at}, {bound}")
        raise GGUFError(f"{self.path}: truncated GGUF header ({what} at byte {at} is a {n}-byte string, but the "
                        f"{self.end}-byte file ends {self.end - at - 8} bytes later)")

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(what)
        if n > MAX_STRING_BYTES or self.pos + n > self.end:
            self.bad_length(n, at, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: invalid UTF-8 in {what}") from None

    def string_array(self, count: int, what: str) -> list[str]:
        # Hot path for the vocabulary and merges: avoid per-item method dispatch.
        buf, pos, end = self.buf, self.pos, self.end
        unpack = struct.unpack_from
        out: list[str] = []
        append = out.append
        cap = MAX_STRING_BYTES
        try:
            for _ in range(count):
                if pos + 8 > end:
                    raise IndexError
                (n,) = unpack("<Q", buf, pos)
                if n > cap or pos + 8 + n > end:
                    self.bad_length(n, pos, f"{what} entry {len(out)}")
                pos += 8
                append(buf[pos : pos + n].decode("utf-8"))
                pos += n
        except IndexError:
            self.pos = pos
            raise GGUFError(f"{self.path}: truncated GGUF header (reading {what} at byte {pos})") from None
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: invalid UTF-8 in {what} entry {len(out)} at byte {pos}") from None
        self.pos = pos
        return out

    def array_count(self, sub: int, what: str, at: int) -> int:
        """The item count of an array (header at byte ``at``, cursor past its count), refused
        when it is implausible or cannot fit in what is left of the file, before any list or
        buffer is made for it."""
        count = self.u64(what)
        # Smallest encoding of one item: a string's u64 length, a nested array's type and count.
        least = {ValueType.STRING: 8, ValueType.ARRAY: 12}.get(sub) or np.dtype(_NUMPY_DTYPE[sub]).itemsize
        if count > MAX_ARRAY_ITEMS:
            raise GGUFError(f"{self.path}: damaged GGUF header: implausible item count {count} for {what} at byte {at} "
                            f"(at most {MAX_ARRAY_ITEMS} here; the whole file is {self.end} bytes)")
        if self.pos + count * least > self.end:
            raise GGUFError(f"{self.path}: truncated GGUF header ({what} at byte {at} claims {count} items of at least "
                            f"{least} bytes, but the {self.end}-byte file ends {self.end - self.pos} bytes later)")
        return count

    def value(self, vtype: int, what: str, depth: int = 1) -> Any:
        """One value of type ``vtype``; ``depth`` counts the arrays it sits in, itself included."""
        if vtype == ValueType.STRING:
            return self.string(what)
        if vtype == ValueType.ARRAY:
            at = self.pos
            sub = self.u32(what)
            if sub not in _NUMPY_DTYPE and sub not in (ValueType.STRING, ValueType.ARRAY):
                raise GGUFError(f"{self.path}: unknown metadata value type {sub} in {what}")
            if sub == ValueType.ARRAY and depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"{self.path}: damaged GGUF header: {what} nests arrays more than {MAX_ARRAY_DEPTH} "
                                f"levels deep (at byte {at}; real files nest one or two)")
            count = self.array_count(sub, what, at)
            if sub == ValueType.STRING:
                return self.string_array(count, what)
            if sub == ValueType.ARRAY:
                return [self.value(ValueType.ARRAY, what, depth + 1) for _ in range(count)]
            dtype = np.dtype(_NUMPY_DTYPE[sub])
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            if sub == ValueType.BOOL:
                return [bool(x) for x in arr]
            return arr.tolist()
        fmt = _SCALAR_FMT.get(vtype)
        if fmt is None:
            raise GGUFError(f"{self.path}: unknown metadata value type {vtype} in {what}")
        return self.scalar(fmt, struct.calcsize(fmt), what)


class GGUFFile:
    """A GGUF v3 file opened read-only over one mmap.

    ``metadata`` maps keys to Python values (arrays become lists); ``value_types`` keeps the
    stored type of each key, ``(type, array_subtype_or_None)``, because the Flash validator
    insists on exact integer types. ``tensors`` is the directory in file order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._fd: int | None = None  # for read_into, opened on first use
        self._direct_fd: int | None = None  # for read_direct: opened on first use, -1 if it cannot be
        self._direct_refused = False  # the file system refused a direct read's alignment
        self._fd_lock = threading.Lock()
        p = Path(path)
        if not p.exists():
            raise GGUFError(f"{self.path}: no such file")
        if p.is_dir():
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from None
        try:
            self.file_size = os.fstat(fd).st_size
            if self.file_size < 4:
                raise GGUFError(f"{self.path}: not a GGUF file (too short)")
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        # Ask for 2 MB pages: a page fault that reads weights from disk into a mapping so advised
        # brings them in as 2 MB folios, mapped with one TLB entry each (Linux with file THP).
        # Measured on Linux 6.18/ext4 after dropping the 8.9 GB shape model from the cache:
        # read back through an advised mapping, 100% of it was mapped with 2 MB pages; without
        # the advice 99.5% (this kernel's readahead makes large folios anyway), and the pages a
        # freshly written file left in the cache were 87%. Only advice: elsewhere a no-op.
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        try:
            self._parse()
        except Exception:
            self._mm.close()
            raise

    def _parse(self) -> None:
        c = _Cursor(self._mm, self.path)
        if self._mm[:4] != MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic {bytes(self._mm[:4])!r})")
        c.pos = 4
        self.version = c.u32("version")
        if self.version != SUPPORTED_VERSION:
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version} (only version 3 is supported)")
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata count")
        # Each entry needs at least 8+4 (kv) / 8+4+4+8 (tensor) bytes: reject absurd counts early.
        if n_kv * 12 + n_tensors * 24 > self.file_size:
            raise GGUFError(f"{self.path}: truncated GGUF header "
                            f"({n_kv} metadata entries and {n_tensors} tensors do not fit)")

        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, tuple[int, int | None]] = {}
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}")
            label = shown(key)
            vtype = c.u32(f"type of {label}")
            sub = None
            if vtype == ValueType.ARRAY:
                c.need(4, label)
                (sub,) = struct.unpack_from("<I", self._mm, c.pos)
            self.metadata[key] = c.value(vtype, label)
            self.value_types[key] = (vtype, sub)

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment must be a positive power of two, found {align!r}")
        self.alignment = align

        raw: list[tuple[str, int, tuple[int, ...], int]] = []
        for i in range(n_tensors):
            name = c.string(f"tensor name #{i}")
            label = shown(name)
            n_dims = c.u32(f"dims of {label}")
            if n_dims == 0 or n_dims > MAX_DIMS:
                raise GGUFError(f"{self.path}: tensor {label} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            dims = tuple(c.u64(f"dims of {label}") for _ in range(n_dims))
            ttype = c.u32(f"type of {label}")
            offset = c.u64(f"offset of {label}")
            raw.append((name, ttype, dims, offset))

        self.data_offset = -(-c.pos // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, ttype, dims, offset in raw:
            label = shown(name)
            try:
                block_info(ttype)
            except (KeyError, ValueError):
                raise GGUFError(f"{self.path}: tensor {label} has unknown GGML type {ttype}") from None
            try:
                nbytes = tensor_nbytes(ttype, dims)
            except ValueError as e:
                raise GGUFError(f"{self.path}: tensor {label}: {e}") from None
            if offset % align:
                raise GGUFError(f"{self.path}: tensor {label} offset {offset} is not aligned to {align}")
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise GGUFError(
                    f"{self.path}: tensor {label} extends past the end of the file "
                    f"(needs bytes {start}..{start + nbytes}, file has {self.file_size}); truncated download?"
                )
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {label} appears twice")
            self.tensors[name] = TensorInfo(name, ttype, dims, start, nbytes)

    # -- access -----------------------------------------------------------------------------

    def raw(self, name: str) -> memoryview:
        """Zero-copy read-only bytes of one tensor."""
        t = self.tensors[name]
        return memoryview(self._mm)[t.offset : t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """Zero-copy numpy view in logical shape.

        Plain types (F32, F16, I32, ...) come back typed; block-quantised ones as uint8 with one
        row of packed blocks per output row, shape ``(*shape[:-1], row_bytes)``.
        """
        t = self.tensors[name]
        plain = {0: "<f4", 1: "<f2", 24: "<i1", 25: "<i2", 26: "<i4", 27: "<i8", 28: "<f8"}
        if t.type in plain:
            return np.frombuffer(self._mm, dtype=plain[t.type], count=t.n_elements, offset=t.offset).reshape(t.shape)
        if t.type == GGMLQuantizationType.BF16:
            return np.frombuffer(self._mm, dtype="<u2", count=t.n_elements, offset=t.offset).reshape(t.shape)
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset).reshape(
            *t.shape[:-1], t.row_bytes
        )

    def read_into(self, offset: int, out: memoryview | np.ndarray) -> None:
        """Fill ``out`` with the file's bytes from absolute ``offset`` by pread, not through the
        mapping: the expert pool copies routed experts into memory it owns this way, from
        several threads at once (pread has no shared file position), and then drops the pages
        from the page cache (``drop_cached``) so that they are not held twice."""
        view = memoryview(out).cast("B")
        if offset < 0 or offset + len(view) > self.file_size:
            raise GGUFError(f"{self.path}: read of {len(view)} bytes at {offset} is outside the file")
        fd = self._read_fd()
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise GGUFError(f"{self.path}: the file ended at byte {offset + done} (was it truncated?)")
            done += n

    def drop_cached(self, offset: int, length: int) -> None:
        """Advise the OS that the page cache need not keep these bytes (after read_into copied
        them). Only advice, and only where posix_fadvise exists (not macOS, where read_into skips
        the cache instead)."""
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self._read_fd(), offset, length, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def read_direct(self, offset: int, length: int, out: memoryview | np.ndarray) -> int | None:
        """Read the whole DIRECT_ALIGN-byte pages that hold the file's bytes ``offset`` ..
        ``offset + length`` into ``out`` past the page cache (O_DIRECT): the device writes them
        where they are wanted, with no copy by the CPU and nothing left in the page cache (which
        a memory limit would charge, and whose reclaim would take the CPU from decode). ``out``
        starts on a DIRECT_ALIGN boundary and holds ``direct_span(offset, length)`` bytes.
        Returns where in ``out`` the bytes start (``offset % DIRECT_ALIGN``), or None where this
        OS or file system does not read that way (then use read_into)."""
        if offset < 0 or length < 0 or offset + length > self.file_size:
            raise GGUFError(f"{self.path}: read of {length} bytes at {offset} is outside the file")
        fd = self._direct_read_fd()
        if fd < 0 or self._direct_refused:
            return None
        view = memoryview(out).cast("B")
        skip = offset % DIRECT_ALIGN
        start, want = offset - skip, skip + length
        span = direct_span(offset, length)
        if len(view) < span:
            raise ValueError(f"a direct read of {length} bytes at {offset} needs {span} bytes, not {len(view)}")
        done = 0
        while done < want:
            try:
                n = os.preadv(fd, [view[done:span]], start + done)
            except OSError as e:
                if e.errno == errno.EINVAL and done == 0:  # alignment this file system will not take
                    self._direct_refused = True  # the fd stays open until close(): others may hold it
                    return None
                raise
            if n <= 0:
                raise GGUFError(f"{self.path}: the file ended at byte {start + done} (was it truncated?)")
            done += n
        return skip

    def _direct_read_fd(self) -> int:
        with self._fd_lock:
            if self._direct_fd is None:
                try:  # no O_DIRECT (macOS) or a file system that will not open with it: -1
                    self._direct_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT) if hasattr(os, "O_DIRECT") else -1
                except OSError:
                    self._direct_fd = -1
            return self._direct_fd

    def _read_fd(self) -> int:
        with self._fd_lock:
            if self._fd is None:
                fd = os.open(self.path, os.O_RDONLY)
                # macOS has no posix_fadvise to drop what a read left in its unified buffer cache,
                # so its reads skip that cache instead (F_NOCACHE): a pool over the GPU's memory
                # would otherwise leave a second copy of every expert it read.
                nocache = getattr(_fcntl, "F_NOCACHE", None)
                if nocache is not None:
                    try:
                        _fcntl.fcntl(fd, nocache, 1)
                    except OSError:
                        pass
                self._fd = fd
            return self._fd

    def release_pages(self, name: str) -> None:
        """Tell the OS this process is done with one tensor's pages (a GPU holds its own copy
        now): they leave this mapping and, on Linux, the page cache, so the weights are not
        resident twice on a machine whose GPU shares the memory. Only advice: the data stays
        readable (read again from the file if asked), and a system without these calls skips
        them."""
        t = self.tensors[name]
        page = mmap.PAGESIZE
        start = t.offset // page * page  # whole pages inside the tensor's span and its neighbours'
        length = t.offset + t.nbytes - start
        if length <= 0:
            return
        try:
            if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                self._mm.madvise(mmap.MADV_DONTNEED, start, length)
            if hasattr(os, "posix_fadvise"):
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        except (OSError, ValueError):
            pass

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def close(self) -> None:
        with self._fd_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._direct_fd is not None and self._direct_fd >= 0:
                os.close(self._direct_fd)
            self._direct_fd = None
        try:
            self._mm.close()
        except BufferError:
            # A caller still holds a view; the mapping is released when it is dropped.
            pass

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- writer -----------------------------------------------------------------------------------

Meta = Mapping[str, tuple[int, Any]]  # key -> (ValueType, value); arrays: (ARRAY, (subtype, list))


def _pack_value(vtype: int, value: Any) -> bytes:
    if vtype == ValueType.STRING:
        b = value.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    if vtype == ValueType.ARRAY:
        sub, items = value
        head = struct.pack("<IQ", sub, len(items))
        if sub == ValueType.STRING:
            parts = [head]
            for s in items:
                b = s.encode("utf-8")
                parts.append(struct.pack("<Q", len(b)))
                parts.append(b)
            return b"".join(parts)
        return head + np.asarray(items, dtype=_NUMPY_DTYPE[sub]).tobytes()
    return struct.pack(_SCALAR_FMT[vtype], value)


TensorData = bytes | memoryview | np.ndarray | None | Callable[[], "bytes | memoryview | np.ndarray"]


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Meta,
    tensors: Iterable[tuple[str, int, tuple[int, ...], TensorData]],
    alignment: int = DEFAULT_ALIGNMENT,
) -> None:
    """Write a GGUF v3 file atomically (temp file + rename).

    ``tensors`` yields (name, ggml_type, GGUF dims fastest-first, raw bytes). Data ``None``
    leaves a hole (a sparse file of the right size): header-only files with the real 81 GiB
    layout let tests check the validator and our memory use without the weights. Data may
    also be a function that returns the bytes: it is called when the tensor is written, so a
    file larger than memory is written one tensor at a time.
    ``alignment`` is written as ``general.alignment`` when it differs from the default.
    """
    path = str(path)
    tensors = list(tensors)  # (the data itself may still be a function: made when written)
    meta = dict(metadata)
    if alignment != DEFAULT_ALIGNMENT:
        meta["general.alignment"] = (ValueType.UINT32, alignment)

    header = [MAGIC, struct.pack("<IQQ", SUPPORTED_VERSION, len(tensors), len(meta))]
    for key, (vtype, value) in meta.items():
        header.append(_pack_value(ValueType.STRING, key))
        header.append(struct.pack("<I", vtype))
        header.append(_pack_value(vtype, value))
    offset = 0
    layout = []
    def checked(name: str, ttype: int, dims: tuple[int, ...], data) -> memoryview | None:
        if data is None:
            return None
        blob = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
        if blob.nbytes != tensor_nbytes(ttype, dims):
            raise ValueError(f"{name}: {blob.nbytes} bytes given, {type_name(ttype)} {list(dims)} needs "
                             f"{tensor_nbytes(ttype, dims)}")
        return blob

    for name, ttype, dims, data in tensors:
        nbytes = tensor_nbytes(ttype, dims)
        blob = data if callable(data) else checked(name, ttype, dims, data)
        header.append(_pack_value(ValueType.STRING, name))
        header.append(struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
        header.append(struct.pack("<IQ", ttype, offset))
        layout.append((name, ttype, dims, blob, nbytes))
        offset += -(-nbytes // alignment) * alignment

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            head = b"".join(header)
            f.write(head)
            f.write(b"\0" * (-len(head) % alignment))
            for i, (name, ttype, dims, blob, nbytes) in enumerate(layout):
                pad = -nbytes % alignment if i + 1 < len(layout) else 0  # no tail padding
                if callable(blob):
                    blob = checked(name, ttype, dims, blob())
                if blob is None:
                    f.seek(nbytes + pad, os.SEEK_CUR)
                else:
                    f.write(blob)
                    f.write(b"\0" * pad)
            f.truncate()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
