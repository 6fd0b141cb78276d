"""Helpers for tests that corrupt or patch model files."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def patch_metadata(path: Path, key: str, old: bytes, new: bytes) -> None:
    """Overwrite the stored value of metadata ``key`` in place (same byte length).

    The value follows the key string and its u32 type (and, for strings, the u64 length);
    ``old`` must be what is stored there, so
    a test cannot silently patch the wrong bytes."""
    assert len(old) == len(new)
    data = bytearray(path.read_bytes()[: 64 * 1024 * 1024])
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


def metadata_value_offset(path: Path, key: str) -> int:
    data = path.read_bytes()[: 64 * 1024 * 1024]
    k = key.encode()
    i = data.find(len(k).to_bytes(8, "little") + k)
    assert i >= 0, key
    return i + 8 + len(k)  # offset of the u32 value type
