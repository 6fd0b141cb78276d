"""Helpers for tests that corrupt or patch model files."""

from __future__ import annotations

import os

from pathlib import Path


def copy_model(src: Path, dst: Path) -> Path:
    """Copy a model file keeping its holes (SEEK_DATA/SEEK_HOLE): a copy of the sparse 80 GiB
    Flash header file stays a few MB, where a plain copy would write 80 GiB."""
    size = src.stat().st_size
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fd = fi.fileno()
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # no data after pos: the rest is a hole
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            fi.seek(start)
            fo.seek(start)
            left = end - start
            while left:
                block = fi.read(min(left, 1 << 22))
                fo.write(block)
                left -= len(block)
            pos = end
        fo.truncate(size)
    return dst


def patch_metadata(path: Path, key: str, old: bytes, new: bytes) -> None:
    """Overwrite the stored value of metadata ``key`` in place (same byte length).

    The value follows the key string and its u32 type (and, for strings, the u64 length);
    ``old`` must be what is stored there, so
    a test cannot silently patch the wrong bytes."""
    assert len(old) == len(new)
    with open(path, "rb") as f:
        data = bytearray(f.read(64 * 1024 * 1024))  # the header; never the (maybe 80 GiB) data
    k = key.encode()
    i = data.find(len(k).to_bytes(8, "little") + k)
    assert i >= 0, key
    at = i + 8 + len(k) + 4
    if int.from_bytes(data[at - 4 : at], "little") == 8:  # a string value: skip its u64 length
        at += 8
    assert bytes(data[at : at + len(old)]) == old, (key, bytes(data[at : at + len(old)]))
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
