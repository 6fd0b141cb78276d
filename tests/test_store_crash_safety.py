"""Session store crash safety and in-place bookkeeping. A save replaces a file only by renaming a complete, synced temporary file; a load
rewrites the hit count and last use in place, and the file stays loadable after that."""

from __future__ import annotations

import errno
import os
import stat
import time

import pytest
from helpers import convo_session

from ds4agent.engine import Engine
from ds4agent.sessions import store as store_module
from ds4agent.sessions.kvfile import KVFileError, read_header
from ds4agent.sessions.store import SessionStore, StoreError


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


@pytest.fixture()
def saved(engine, tmp_path):
    store = SessionStore(tmp_path / "st")
    s = convo_session(engine, "keep me safe")
    sha = store.save(s, "cold")
    return store, s, sha


def _later(monkeypatch, seconds: int) -> None:
    real = time.time
    monkeypatch.setattr(store_module.time, "time", lambda: real() + seconds)


def test_the_same_file_loads_again_after_a_load_updated_it(engine, saved, monkeypatch) -> None:
    store, s, sha = saved
    p = store.path(sha)
    before = read_header(p, with_text=False)[0]
    for n in (1, 2, 3):
        _later(monkeypatch, 100 * n)  # a later second each time: the last-use field changes
        r = engine.session()
        info = store.load(sha, r)
        assert r.tokens == s.tokens and info.hits == n
        h = read_header(p, with_text=False)[0]
        assert h.hits == n and h.last_used >= before.last_used + 100 * n and h.created == before.created
    # A save of the same conversation keeps the hit count and creation time.
    store.save(s, "continued")
    h = read_header(p, with_text=False)[0]
    assert (h.hits, h.created) == (3, before.created)


def _files(store) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in store.dir.iterdir() if p.name != ".lock" and p.is_file()}


def test_a_resave_that_fails_halfway_keeps_the_old_file(engine, saved, monkeypatch) -> None:
    store, s, sha = saved
    before = _files(store)
    real = os.write
    calls = {"n": 0}

    def half(fd, data):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, bytes(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(StoreError, match="cannot write"):
        store.save(s, "continued")  # the same text: the same file name
    monkeypatch.setattr(os, "write", real)
    assert _files(store) == before  # old file intact, no temporary file left
    r = engine.session()
    store.load(sha, r)
    assert r.tokens == s.tokens


@pytest.mark.parametrize("fault", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_fault_between_write_and_rename_keeps_the_old_file(engine, saved, monkeypatch, fault) -> None:
    store, s, sha = saved
    p = store.path(sha)
    old = p.read_bytes()
    s.sync(s.tokens + [3000, 3001])  # a longer conversation saved next (its own file name)
    longer = s.tokens

    def crash(src, dst):
        assert os.path.getsize(src) > len(old)  # the whole new file was written first
        raise fault

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StoreError if isinstance(fault, OSError) else KeyboardInterrupt):
        store.save(s, "continued")
    monkeypatch.undo()
    # The earlier checkpoint is not dropped for a save that did not land, and is unchanged.
    assert p.read_bytes() == old
    assert [i.sha for i in store.list()] == [sha]
    leftovers = [n for n in os.listdir(store.dir) if n.endswith(".tmp")]
    assert leftovers == ([] if isinstance(fault, OSError) else leftovers)  # an interrupt may leave one: swept later
    assert all(store_module._TEMP.match(n) for n in leftovers)
    r = engine.session()
    store.load(sha, r)
    assert r.tokens == longer[:-2]


def test_a_save_syncs_the_file_before_the_rename_and_the_folder_after(engine, tmp_path, monkeypatch) -> None:
    store = SessionStore(tmp_path / "st")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        mode = os.fstat(fd).st_mode
        events.append(("fsync", "dir" if stat.S_ISDIR(mode) else os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    sha = store.save(convo_session(engine, "sync me"))
    monkeypatch.undo()
    renames = [i for i, e in enumerate(events) if e[0] == "replace"]
    assert len(renames) == 1
    i = renames[0]
    tmp = events[i][1]
    assert tmp != str(store.path(sha)) and store_module._TEMP.match(os.path.basename(tmp))
    assert ("fsync", tmp) in events[:i], events  # the data is on disk before the name points at it
    assert ("fsync", "dir") in events[i + 1:], events  # and the rename itself is made durable


@pytest.mark.parametrize("di,high", [(2, 612 + 3 * (32 + 2056)), (64, 612 + 3 * (32 + 16896))])
def test_the_listing_bounds_a_payload_by_its_own_dimensions(di: int, high: int) -> None:
    # docs/model.md §6.1 without the model: 3 layers, D = 2, V = 5, 129 tokens, window 4. Every
    # layer at least its raw rows (low), at most its raw rows plus the dearer of a ratio-4
    # layer (rows, indexer rows and both frontiers) and a ratio-128 one (high). Hand-computed:
    # fixed 52 + 516 + 20 + 24 = 612, raw 4 x 4 x 2 = 32 a layer; ratio 4: 256 + 256 +
    # 4·32·Di + 2·4·8·2·Di; ratio 128: 8 + 2048.
    import struct as st

    from ds4agent.sessions.kvfile import KVHeader, _check_payload_header

    raw = st.pack("<13I", 0x34565344, 1, 256, 256, 4, 4, 66, 129, 3, 2, di, 5, 4)
    low = 612 + 3 * 32

    def header(payload: int) -> KVHeader:
        return KVHeader(2, 0, 0, 129, 0, 256, 0, 0, 0, payload, 10)

    for ok in (low, high):
        assert _check_payload_header(raw, header(ok), "f").tokens == 129
    for bad in (low - 1, high + 1):
        with pytest.raises(KVFileError, match=f"cannot hold 129 tokens \\({low}..{high} bytes"):
            _check_payload_header(raw, header(bad), "f")
