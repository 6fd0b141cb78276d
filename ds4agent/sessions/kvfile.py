"""The on-disk session file (docs/model.md §6.2), byte-compatible with ds4's KV cache files.

    0  "KVC"  u8 version=1  u8 expert quant bits (2|4)  u8 save reason  u8 flags  u8 reserved
    8  u32 tokens  u32 hits  u32 ctx  u32 model fingerprint (ds4: reserved, 0)
   24  u64 created  u64 last used  u64 payload bytes
   48  u32 text length L, L bytes of rendered text, the engine payload, [tool-id map "KTM"]

The rendered text is the identity of a session: its SHA-1 names the file. Reading a header or
the text reads no more of the payload than its 52-byte header (to check the token count). ds4
leaves the u32 at offset 20 reserved (zero); we store a fingerprint of the model there so a
session cannot be resumed on a different model of the same shape (ds4 files, with zero, are
checked by shape only).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass, field

MAGIC = b"KVC"
VERSION = 1
HEADER = struct.Struct("<3sBBBBBIIIIQQQI")  # through the text length: 52 bytes
TOOLMAP_MAGIC = b"KTM"
FLAG_TOOLMAP = 1
# Our extension (a flag bit ds4 does not use): a trailer with the SHA-1 of everything that must
# not change — header fields other than the hit count and last-used time (updated in place),
# the text, the payload and the tool map. ds4 has no checksum, so a flipped bit in the payload
# would otherwise resume silently wrong. Files without the flag (ds4's) are read unchecked.
FLAG_CHECKSUM = 8
CHECKSUM_MAGIC = b"KCS"
CHECKSUM_SIZE = 4 + 20

# Our extension: the directional steering the KV was computed under (engine/steering.py), as
# a JSON object, placed after the tool map and before the checksum, ending in a footer
# (u32 length, "KSR", version 1) so that a listing reads it from the end without the payload.
FLAG_STEERING = 16
STEERING_MAGIC = b"KSR"
STEERING_FOOTER = struct.Struct("<I3sB")
MAX_STEERING = 4096

REASONS = {"unknown": 0, "cold": 1, "continued": 2, "evict": 3, "shutdown": 4, "agent-system": 5, "agent-session": 6}
REASON_NAMES = {v: k for k, v in REASONS.items()}
MAX_TEXT = 1 << 30  # a rendered text longer than 1 GiB is a corrupt length field
# Extension flags of ds4 (docs/model.md §6.2): the text is the "visible" text, not the tokens' text.
FLAGS_VISIBLE_TEXT = 2 | 4
# Bytes of text per token, at most: the V4 vocabulary's longest token is 128 bytes; the margin
# keeps files of other vocabularies readable. With tokens < ctx this bounds what is read for
# the text, whatever a (sparse, forged) header claims.
MAX_TOKEN_BYTES = 1024
# The tool-id map holds the ids and exact DSML of the conversation's tool calls; the store
# refuses to write a larger one, so a larger tail is damage (and is never read).
MAX_TOOLMAP = 64 << 20
# The engine payload's own header (docs/model.md §6.1): 13 u32, magic "DSV4". Read here, without the
# engine, so that a listing can check the header's token count against the payload's.
PAYLOAD_HEADER = struct.Struct("<13I")
PAYLOAD_MAGIC = 0x34565344
READ_CHUNK = 1 << 20  # what a listing holds at a time while it hashes a text


class KVFileError(ValueError):
    """A session file that cannot be used; one line naming the file."""


class KVFileGone(KVFileError):
    """The file is not there (any more): another process may have dropped it since the folder
    was read, which a listing does not report as damage."""


@dataclass
class KVHeader:
    quant_bits: int
    reason: int
    flags: int
    tokens: int
    hits: int
    ctx: int
    fingerprint: int
    created: int
    last_used: int
    payload_bytes: int
    text_bytes: int
    version: int = VERSION

    @property
    def text_offset(self) -> int:
        return HEADER.size

    @property
    def payload_offset(self) -> int:
        return HEADER.size + self.text_bytes

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.version, self.quant_bits, self.reason, self.flags, 0, self.tokens, self.hits,
                           self.ctx, self.fingerprint, self.created, self.last_used, self.payload_bytes,
                           self.text_bytes)


@dataclass
class KVFile:
    header: KVHeader
    text: bytes
    payload: bytes | memoryview  # read_file: a view into the one buffer holding the file
    tool_map: dict[str, bytes] = field(default_factory=dict)  # tool-call id -> exact DSML bytes
    steering: bytes = b""  # the steering record (JSON), or none

    def sha(self) -> str:
        return text_sha(self.text)

    def to_bytes(self) -> bytes:
        h = self.header
        h.text_bytes = len(self.text)
        h.payload_bytes = len(self.payload)
        if len(self.steering) > MAX_STEERING:
            raise ValueError(f"steering record of {len(self.steering)} bytes (at most {MAX_STEERING})")
        h.flags = ((h.flags & ~(FLAG_TOOLMAP | FLAG_STEERING)) | (FLAG_TOOLMAP if self.tool_map else 0)
                   | (FLAG_STEERING if self.steering else 0) | FLAG_CHECKSUM)
        parts = [h.pack(), self.text, self.payload]
        if self.tool_map:
            parts.append(TOOLMAP_MAGIC + bytes([1]) + struct.pack("<I", len(self.tool_map)))
            for ident, dsml in self.tool_map.items():
                raw = ident.encode("utf-8")
                parts += [struct.pack("<II", len(raw), len(dsml)), raw, dsml]
        if self.steering:
            parts += [self.steering, STEERING_FOOTER.pack(len(self.steering), STEERING_MAGIC, 1)]
        body = b"".join(parts)
        return body + CHECKSUM_MAGIC + bytes([1]) + _checksum(body)


def _checksum(body: bytes | memoryview) -> bytes:
    # Skip the hit count (12..16) and last-used time (32..40): they change in place on load.
    # Hashed piece by piece through a view: no copy of a (maybe multi-GB) body.
    view = memoryview(body)
    h = hashlib.sha1(view[:12])
    h.update(view[16:32])
    h.update(view[40:])
    return h.digest()


def text_sha(text: bytes) -> str:
    return hashlib.sha1(text).hexdigest()


def _parse_header(raw: bytes, path: str, file_size: int) -> KVHeader:
    """The header, checked against itself and the file's size (nothing else is read)."""
    if len(raw) < HEADER.size:
        raise KVFileError(f"{path}: truncated session file ({file_size} bytes)")
    (magic, version, bits, reason, flags, _res, tokens, hits, ctx, fp, created, used,
     pbytes, tbytes) = HEADER.unpack(raw[: HEADER.size])
    if magic != MAGIC:
        raise KVFileError(f"{path}: not a session file (bad magic)")
    if version != VERSION:
        raise KVFileError(f"{path}: session file version {version} is newer than this build understands "
                          f"(version {VERSION})")
    if bits not in (2, 4):
        raise KVFileError(f"{path}: invalid expert quant bits {bits}")
    if tokens == 0:
        raise KVFileError(f"{path}: session file holds no tokens")
    end = HEADER.size + tbytes + pbytes
    if tbytes > MAX_TEXT or end > file_size:
        raise KVFileError(f"{path}: truncated session file (header promises {end} bytes, file has {file_size})")
    # Token count against the text. Every V4 token is at least one byte of text, so a text
    # made of the tokens' bytes has at least `tokens` bytes; ds4's "visible" text may be
    # shorter (reasoning left out), so only the upper bound applies to it. Weaker than the
    # payload check (read_payload_header) but the only one a stripped file allows.
    if tbytes > tokens * MAX_TOKEN_BYTES or (not flags & FLAGS_VISIBLE_TEXT and tbytes < tokens):
        raise KVFileError(f"{path}: header says {tokens} tokens for {tbytes} bytes of text (damaged file)")
    # What follows the payload is known from the flags: our checksum trailer (fixed size) and
    # ds4's tool-id map (bounded). Anything else (a sparse tail of 100 GB) is damage, refused
    # here, before anything but the header has been read.
    rest = file_size - end
    trailer = CHECKSUM_SIZE if flags & FLAG_CHECKSUM else 0
    if rest < trailer:
        raise KVFileError(f"{path}: truncated session file (checksum trailer missing)")
    extra = rest - trailer
    if flags & FLAG_STEERING:  # a steering record (1..MAX_STEERING bytes and its footer), after any tool map
        tools = (8, MAX_TOOLMAP) if flags & FLAG_TOOLMAP else (0, 0)
        lo, hi = tools[0] + 1 + STEERING_FOOTER.size, tools[1] + MAX_STEERING + STEERING_FOOTER.size
        if not lo <= extra <= hi:
            raise KVFileError(f"{path}: corrupt tool-id map or steering record ({extra} bytes)")
    elif flags & FLAG_TOOLMAP:
        if not 8 <= extra <= MAX_TOOLMAP:
            raise KVFileError(f"{path}: corrupt tool-id map ({extra} bytes)")
    elif extra:
        raise KVFileError(f"{path}: {extra} unexpected bytes after the payload (file has {file_size} bytes)")
    return KVHeader(bits, reason, flags, tokens, hits, ctx, fp, created, used, pbytes, tbytes, version)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str | os.PathLike[str], writable: bool = False) -> tuple[int, os.stat_result]:
    """Open a session file without ever blocking: (fd, fstat). Refuses what is not a regular
    file, with one line.

    A FIFO named like a session would block open() until some writer appears, forever, and a
    save holds the store lock while it reads: so lstat first (nothing special is opened at
    all), open with O_NONBLOCK (a FIFO swapped in after the lstat opens at once instead of
    waiting) and check the opened descriptor again. Symbolic links are refused (O_NOFOLLOW):
    the store writes its files in place (hit count, last use), which through a link would
    modify a file outside the store, and a link can lead to a device or a FIFO; the store
    itself never makes links, so one named like a session is not a session."""
    path = str(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise KVFileGone(f"{path}: no such session file") from None
    except OSError as e:
        raise KVFileError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KVFileError(f"{path}: is a {_kind(st.st_mode)}, not a session file")
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise KVFileGone(f"{path}: no such session file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise KVFileError(f"{path}: is a symbolic link, not a session file") from None
        raise KVFileError(f"{path}: cannot {'open' if writable else 'read'}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KVFileError(f"{path}: is a {_kind(st.st_mode)}, not a session file")
        # A regular file: the flag has done its job; without it reads behave as usual on
        # filesystems that honour it for regular files (mandatory locks).
        os.set_blocking(fd, True)
    except OSError as e:
        os.close(fd)
        raise KVFileError(f"{path}: cannot read: {e.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, st


@dataclass(frozen=True)
class PayloadHeader:
    """The 13 u32 at the start of an engine payload (docs/model.md §6.1), as far as a reader without
    the model can check them."""

    version: int
    ctx: int
    tokens: int
    n_layer: int
    head_dim: int
    indexer_dim: int
    n_vocab: int
    raw_live: int


def _check_payload_header(raw: bytes, h: KVHeader, path: str) -> PayloadHeader:
    if len(raw) < PAYLOAD_HEADER.size or h.payload_bytes < PAYLOAD_HEADER.size:
        raise KVFileError(f"{path}: payload of {h.payload_bytes} bytes is too short (damaged file)")
    f = PAYLOAD_HEADER.unpack(raw[: PAYLOAD_HEADER.size])
    if f[0] != PAYLOAD_MAGIC:
        raise KVFileError(f"{path}: the payload is not a DeepSeek V4 snapshot (bad magic)")
    n, window = f[7], f[5]
    if n != h.tokens:
        raise KVFileError(f"{path}: header says {h.tokens} tokens, its payload holds {n} (damaged file)")
    p = PayloadHeader(f[1], f[2], n, f[8], f[9], f[10], f[11], f[12])
    if p.raw_live != min(n, window):
        raise KVFileError(f"{path}: payload raw row count {p.raw_live} is inconsistent with {n} tokens (damaged file)")
    # Its size from its own dimensions, without the model: each layer has a compressor ratio
    # of 0, 4 or 128 (the only ones config.py accepts; spec §6.1 for what each stores), so
    # the payload lies between "every layer ratio 0" and "every layer the dearer of 4 and
    # 128". The exact size needs the model's ratios and is checked by the store on load.
    D, Di, L = p.head_dim, p.indexer_dim, p.n_layer
    fixed = PAYLOAD_HEADER.size + 4 * n + 4 * p.n_vocab + 2 * 4 * L
    raw_rows = 4 * p.raw_live * D
    r4 = 4 * (n // 4) * D + 2 * 4 * 8 * 2 * D + 4 * (n // 4) * Di + 2 * 4 * 8 * 2 * Di
    r128 = 4 * (n // 128) * D + 2 * 4 * 128 * D
    low, high = fixed + L * raw_rows, fixed + L * (raw_rows + max(r4, r128))
    if not low <= h.payload_bytes <= high:
        raise KVFileError(f"{path}: payload of {h.payload_bytes} bytes cannot hold {n} tokens "
                          f"({low}..{high} bytes for its dimensions; damaged file)")
    return p


class KVReader:
    """An opened session file whose header (and payload header) has been checked; nothing big
    has been read yet, so a caller can check sizes against the model before ``read``. All
    reads go through the one descriptor: a file replaced by rename meanwhile is not mixed in."""

    def __init__(self, path: str | os.PathLike[str], writable: bool = False) -> None:
        self.path = str(path)
        self.fd, st = open_regular(self.path, writable)
        try:
            self.size = st.st_size
            self.header = _parse_header(self.pread(0, HEADER.size), self.path, self.size)
            h = self.header
            self.payload_header = (_check_payload_header(self.pread(h.payload_offset, PAYLOAD_HEADER.size), h,
                                                         self.path)
                                   if h.payload_bytes else None)
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> "KVReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def pread(self, offset: int, n: int) -> bytes:
        """Exactly n bytes at offset (short only at the end of the file)."""
        parts, got = [], 0
        try:
            while got < n:
                b = os.pread(self.fd, min(n - got, 1 << 30), offset + got)
                if not b:
                    break
                parts.append(b)
                got += len(b)
        except OSError as e:
            raise KVFileError(f"{self.path}: cannot read: {e.strerror}") from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def text(self) -> bytes:
        h = self.header
        text = self.pread(h.text_offset, h.text_bytes)
        if len(text) != h.text_bytes:
            raise KVFileError(f"{self.path}: truncated session file")
        return text

    def text_summary(self, head_bytes: int = READ_CHUNK) -> tuple[str, bytes]:
        """SHA-1 of the text and its first ``head_bytes``, holding one chunk at a time: a
        listing never holds a whole (maybe forged, 1 GiB) text."""
        h = self.header
        sha, head, pos, end = hashlib.sha1(), b"", h.text_offset, h.payload_offset
        while pos < end:
            chunk = self.pread(pos, min(READ_CHUNK, end - pos))
            if not chunk:
                raise KVFileError(f"{self.path}: truncated session file")
            sha.update(chunk)
            if len(head) < head_bytes:
                head += chunk[: head_bytes - len(head)]
            pos += len(chunk)
        return sha.hexdigest(), head

    def payload_tokens(self) -> list[int]:
        """The token ids at the start of the payload (4 bytes each, after its header)."""
        h = self.header
        raw = self.pread(h.payload_offset + PAYLOAD_HEADER.size, 4 * h.tokens)
        if len(raw) != 4 * h.tokens:
            raise KVFileError(f"{self.path}: truncated session file")
        return list(struct.unpack(f"<{h.tokens}I", raw))

    def tool_map(self) -> dict[str, bytes]:
        """The tool-id map alone (empty when the file has none), read from after the payload
        without reading the payload. Not covered by a checksum check here: readers treat the
        map as advice and check each entry against the text."""
        h = self.header
        if not h.flags & FLAG_TOOLMAP:
            return {}
        start = h.payload_offset + h.payload_bytes
        span = self._steering_span()
        end = span[0] if span is not None else self.size - (CHECKSUM_SIZE if h.flags & FLAG_CHECKSUM else 0)
        if not 8 <= end - start <= MAX_TOOLMAP:
            raise KVFileError(f"{self.path}: corrupt tool-id map")
        return _parse_toolmap(self.pread(start, end - start), self.path)

    def _steering_span(self) -> tuple[int, int] | None:
        """(start, end) of the steering record's JSON, from its footer; None without one."""
        h = self.header
        if not h.flags & FLAG_STEERING:
            return None
        foot_end = self.size - (CHECKSUM_SIZE if h.flags & FLAG_CHECKSUM else 0)
        raw = self.pread(foot_end - STEERING_FOOTER.size, STEERING_FOOTER.size)
        n, magic, version = STEERING_FOOTER.unpack(raw) if len(raw) == STEERING_FOOTER.size else (0, b"", 0)
        start = foot_end - STEERING_FOOTER.size - n
        if magic != STEERING_MAGIC or version != 1 or not 0 < n <= MAX_STEERING or \
                start < h.payload_offset + h.payload_bytes:
            raise KVFileError(f"{self.path}: corrupt steering record")
        return start, foot_end - STEERING_FOOTER.size

    def steering(self) -> dict | None:
        """The steering the KV was computed under (engine/steering.py's record), None for none."""
        span = self._steering_span()
        if span is None:
            return None
        try:
            record = json.loads(self.pread(span[0], span[1] - span[0]))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise KVFileError(f"{self.path}: corrupt steering record") from None
        if not isinstance(record, dict):
            raise KVFileError(f"{self.path}: corrupt steering record")
        return record

    def read(self) -> KVFile:
        """The whole file in one buffer, read once: text is copied out (small), the payload is
        a view into the buffer, the checksum is hashed through views; peak memory is about the
        file's size (it was bytes + slices + a concatenation: three to four times)."""
        size, h, path = self.size, self.header, self.path
        try:
            buf = bytearray(size)
        except MemoryError:
            raise KVFileError(f"{path}: not enough memory to read its {size} bytes") from None
        view = memoryview(buf)
        got = 0
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
            while got < size:
                n = os.readv(self.fd, [view[got:]])
                if n == 0:
                    raise KVFileError(f"{path}: truncated session file (shrank while being read)")
                got += n
        except OSError as e:
            raise KVFileError(f"{path}: cannot read: {e.strerror}") from None
        end = size
        if h.flags & FLAG_CHECKSUM:
            end = size - CHECKSUM_SIZE
            trailer = view[end:]
            if trailer[:4] != CHECKSUM_MAGIC + bytes([1]) or _checksum(view[:end]) != trailer[4:]:
                raise KVFileError(f"{path}: checksum mismatch (the file is damaged)")
        text = bytes(view[h.text_offset : h.payload_offset])
        pend = h.payload_offset + h.payload_bytes
        payload = view[h.payload_offset : pend]
        steering = b""
        span = self._steering_span()
        if span is not None:
            steering, end = bytes(view[span[0] : span[1]]), span[0]
        tool_map = _parse_toolmap(view[pend:end], path) if h.flags & FLAG_TOOLMAP else {}
        return KVFile(h, text, payload, tool_map, steering)


def read_header(path: str | os.PathLike[str], with_text: bool = True) -> tuple[KVHeader, bytes]:
    """Header and (optionally) rendered text; the payload is not read."""
    with KVReader(path) as r:
        return r.header, (r.text() if with_text else b"")


def read_summary(path: str | os.PathLike[str]) -> tuple[KVHeader, str, bytes, int, dict | None]:
    """What a listing needs, in bounded memory: header, SHA-1 of the text, the text's first
    megabyte (for the title), the file's size and its steering record, all from one opened file."""
    with KVReader(path) as r:
        sha, head = r.text_summary()
        return r.header, sha, head, r.size, r.steering()


def read_file(path: str | os.PathLike[str]) -> KVFile:
    with KVReader(path) as r:
        return r.read()


def _parse_toolmap(rest: bytes | memoryview, path: str) -> dict[str, bytes]:
    bad = KVFileError(f"{path}: corrupt tool-id map")
    if len(rest) < 8 or rest[:3] != TOOLMAP_MAGIC or rest[3] != 1:
        raise bad
    (count,) = struct.unpack_from("<I", rest, 4)
    pos, out = 8, {}
    for _ in range(count):
        if pos + 8 > len(rest):
            raise bad
        a, b = struct.unpack_from("<II", rest, pos)
        pos += 8
        if pos + a + b > len(rest):
            raise bad
        try:
            ident = bytes(rest[pos : pos + a]).decode("utf-8")
        except UnicodeDecodeError:
            raise bad from None
        out[ident] = bytes(rest[pos + a : pos + a + b])
        pos += a + b
    if pos != len(rest):
        raise bad
    return out
