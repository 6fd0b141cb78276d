"""The on-disk session file (spec/model.md §6.2), byte-compatible with ds4's KV cache files.

    0  "KVC"  u8 version=1  u8 expert quant bits (2|4)  u8 save reason  u8 flags  u8 reserved
    8  u32 tokens  u32 hits  u32 ctx  u32 model fingerprint (ds4: reserved, 0)
   24  u64 created  u64 last used  u64 payload bytes
   48  u32 text length L, L bytes of rendered text, the engine payload, [tool-id map "KTM"]

The rendered text is the identity of a session: its SHA-1 names the file. Reading a header or
the text never touches the payload. ds4 leaves the u32 at offset 20 reserved (zero); we store a
fingerprint of the model there so a session cannot be resumed on a different model of the same
shape (ds4 files, with zero, are checked by shape only).
"""

from __future__ import annotations

import hashlib
import os
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

REASONS = {"unknown": 0, "cold": 1, "continued": 2, "evict": 3, "shutdown": 4, "agent-system": 5, "agent-session": 6}
REASON_NAMES = {v: k for k, v in REASONS.items()}
MAX_TEXT = 1 << 30  # a rendered text longer than 1 GiB is a corrupt length field


class KVFileError(ValueError):
    """A session file that cannot be used; one line naming the file."""


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
    payload: bytes
    tool_map: dict[str, bytes] = field(default_factory=dict)  # tool-call id -> exact DSML bytes

    def sha(self) -> str:
        return text_sha(self.text)

    def to_bytes(self) -> bytes:
        h = self.header
        h.text_bytes = len(self.text)
        h.payload_bytes = len(self.payload)
        h.flags = (h.flags & ~FLAG_TOOLMAP) | (FLAG_TOOLMAP if self.tool_map else 0) | FLAG_CHECKSUM
        parts = [h.pack(), self.text, self.payload]
        if self.tool_map:
            parts.append(TOOLMAP_MAGIC + bytes([1]) + struct.pack("<I", len(self.tool_map)))
            for ident, dsml in self.tool_map.items():
                raw = ident.encode("utf-8")
                parts += [struct.pack("<II", len(raw), len(dsml)), raw, dsml]
        body = b"".join(parts)
        return body + CHECKSUM_MAGIC + bytes([1]) + _checksum(body)


def _checksum(body: bytes) -> bytes:
    # Skip the hit count (12..16) and last-used time (32..40): they change in place on load.
    return hashlib.sha1(body[:12] + body[16:32] + body[40:]).digest()


def text_sha(text: bytes) -> str:
    return hashlib.sha1(text).hexdigest()


def _parse_header(raw: bytes, path: str, file_size: int) -> KVHeader:
    if len(raw) < HEADER.size:
        raise KVFileError(f"{path}: truncated session file ({file_size} bytes)")
    magic, version, bits, reason, flags, _res, tokens, hits, ctx, fp, created, used, pbytes, tbytes = HEADER.unpack(raw[: HEADER.size])
    if magic != MAGIC:
        raise KVFileError(f"{path}: not a session file (bad magic)")
    if version != VERSION:
        raise KVFileError(f"{path}: session file version {version} is newer than this build understands (version {VERSION})")
    if bits not in (2, 4):
        raise KVFileError(f"{path}: invalid expert quant bits {bits}")
    if tokens == 0:
        raise KVFileError(f"{path}: session file holds no tokens")
    if tbytes > MAX_TEXT or HEADER.size + tbytes + pbytes > file_size:
        raise KVFileError(f"{path}: truncated session file (header promises {HEADER.size + tbytes + pbytes} bytes, file has {file_size})")
    return KVHeader(bits, reason, flags, tokens, hits, ctx, fp, created, used, pbytes, tbytes, version)


def read_header(path: str | os.PathLike[str], with_text: bool = True) -> tuple[KVHeader, bytes]:
    """Header and (optionally) rendered text; the payload is not read."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            h = _parse_header(f.read(HEADER.size), path, size)
            text = f.read(h.text_bytes) if with_text else b""
    except OSError as e:
        raise KVFileError(f"{path}: cannot read: {e.strerror}") from None
    if with_text and len(text) != h.text_bytes:
        raise KVFileError(f"{path}: truncated session file")
    return h, text


def read_file(path: str | os.PathLike[str]) -> KVFile:
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise KVFileError(f"{path}: cannot read: {e.strerror}") from None
    h = _parse_header(data, path, len(data))
    if h.flags & FLAG_CHECKSUM:
        body, trailer = data[:-CHECKSUM_SIZE], data[-CHECKSUM_SIZE:]
        if len(data) < HEADER.size + CHECKSUM_SIZE or trailer[:4] != CHECKSUM_MAGIC + bytes([1]) or _checksum(body) != trailer[4:]:
            raise KVFileError(f"{path}: checksum mismatch (the file is damaged)")
        data = body
    text = data[h.text_offset : h.payload_offset]
    payload = data[h.payload_offset : h.payload_offset + h.payload_bytes]
    rest = data[h.payload_offset + h.payload_bytes :]
    tool_map: dict[str, bytes] = {}
    if h.flags & FLAG_TOOLMAP:
        tool_map = _parse_toolmap(rest, path)
    elif rest:
        raise KVFileError(f"{path}: {len(rest)} unexpected bytes after the payload")
    return KVFile(h, text, payload, tool_map)


def _parse_toolmap(rest: bytes, path: str) -> dict[str, bytes]:
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
            ident = rest[pos : pos + a].decode("utf-8")
        except UnicodeDecodeError:
            raise bad from None
        out[ident] = rest[pos + a : pos + a + b]
        pos += a + b
    if pos != len(rest):
        raise bad
    return out
