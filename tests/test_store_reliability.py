"""The session store against hostile folders: special files named like sessions, sparse and
forged files, failures at every step of a load, and temporary files of killed writers."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest
from helpers import convo_session

from ds4agent.engine import Engine
from ds4agent.sessions import kvfile
from ds4agent.sessions.kvfile import HEADER, read_file, read_header
from ds4agent.sessions.store import SessionStore, StoreError

GB = 1 << 30


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


@pytest.fixture()
def store(engine, tmp_path):
    st = SessionStore(tmp_path / "sessions")
    st.good = st.save(convo_session(engine, "keep me"))
    return st


def _state(s) -> tuple[list[int], bytes]:
    return list(s.tokens), s.snapshot()


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, msg
    return msg


def _bounded(fn, fifos, seconds: float = 10.0):
    """Run fn in a thread; if it is still blocked after ``seconds`` (an open of a FIFO waiting
    for a writer), open the FIFOs for writing so that it can go on, and fail the test instead
    of hanging the suite."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        deadline = time.monotonic() + 10
        while t.is_alive() and time.monotonic() < deadline:
            for p in fifos:
                try:
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            t.join(0.05)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on a FIFO named like a session")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- item 4: FIFOs, sockets, directories and symlinks named like sessions ------------------------

def test_fifo_named_like_a_session_blocks_nothing(engine, store) -> None:
    fifo = store.path("ab" * 20)
    os.mkfifo(fifo)
    listed = _bounded(store.list, [fifo])
    assert [i.sha for i in listed] == [store.good]
    [p] = store.problems
    assert "FIFO" in _one_line(Exception(p)) and fifo.name in p
    # Save holds the store lock: a hang there would block every other ds4 process too.
    sha = _bounded(lambda: store.save(convo_session(engine, "another")), [fifo])
    assert sha in {i.sha for i in store.list()}
    for call in (lambda: store.load("ab" * 20, engine.session()), lambda: store.strip("ab" * 20)):
        with pytest.raises(StoreError) as e:
            _bounded(call, [fifo])
        assert "FIFO" in _one_line(e.value)
    assert _bounded(lambda: store.longest_prefix(b"x"), [fifo]) is None
    assert fifo.exists()  # not a session: nothing removed it


def test_fifo_swapped_in_after_lstat_is_refused_by_fstat(store, monkeypatch) -> None:
    """The lstat check can race with someone replacing the file; the open must not block
    (O_NONBLOCK) and the opened descriptor is checked again."""
    fifo = store.path("cd" * 20)
    os.mkfifo(fifo)
    regular = os.lstat(store.path(store.good))
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: regular if str(p) == str(fifo) else real(p, *a, **k))
    listed = _bounded(store.list, [fifo])
    assert [i.sha for i in listed] == [store.good]
    assert any("FIFO" in p for p in store.problems), store.problems


def test_socket_directory_and_device_named_like_sessions(store, monkeypatch) -> None:
    import socket

    srv = socket.socket(socket.AF_UNIX)
    monkeypatch.chdir(store.dir)  # a relative name: AF_UNIX paths are limited to ~107 bytes
    srv.bind("01" * 20 + ".kv")
    store.path("02" * 20).mkdir()
    try:
        os.symlink("/dev/zero", store.path("03" * 20))  # a device reached through a link
        listed = _bounded(store.list, [])
    finally:
        srv.close()
    assert [i.sha for i in listed] == [store.good]
    text = " | ".join(store.problems)
    assert len(store.problems) == 3 and "socket" in text and "directory" in text and "symbolic link" in text
    with pytest.raises(StoreError, match="directory"):
        store.delete("02" * 20)


def test_symlink_named_like_a_session_is_not_followed(engine, store, tmp_path) -> None:
    """A link is skipped, even to a valid session file: loading touches the file in place (hit
    count, last use), which through a link would write outside the store."""
    outside = tmp_path / "elsewhere.kv"
    outside.write_bytes(store.path(store.good).read_bytes())
    store.path(store.good).unlink()
    store.path(store.good).symlink_to(outside)
    before = outside.read_bytes()
    assert store.list() == [] and "symbolic link" in store.problems[0]
    with pytest.raises(StoreError, match="symbolic link"):
        store.load(store.good, engine.session())
    assert outside.read_bytes() == before


# -- item 5: sparse files claiming huge sizes ----------------------------------------------------

_SPARSE_CHILD = r"""
import json, resource, sys, time, tracemalloc
from ds4agent.engine import Engine
from ds4agent.sessions.store import SessionStore, StoreError
demo, folder, shas = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
e = Engine.open(demo, backend="cpu", ctx=4096)
store = SessionStore(folder)
live = e.session(); live.sync([7, 8, 9])
out = {}
def measure(fn):
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start(); t = time.perf_counter()
    try:
        fn(); r = "ok"
    except StoreError as ex:
        r = "StoreError: " + str(ex)
    except BaseException as ex:
        r = type(ex).__name__ + ": " + str(ex)
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    return {"result": r, "seconds": time.perf_counter() - t, "peak": peak, "rss_growth": grow}
out["list"] = measure(store.list)
out["listed"] = [i.sha for i in store.list()]
for sha in shas:
    out[sha] = measure(lambda: store.load(sha, live))
out["live"] = live.tokens
print(json.dumps(out))
"""


def _sparse_files(engine, store) -> dict[str, str]:
    """Sessions forged from a real one, each made huge with a hole (truncate): a few KB on disk."""
    s = convo_session(engine, "sparse")
    sha = store.save(s)
    path = store.path(sha)
    f = read_file(path)
    made = {}

    def forge(name: str, size: int, **fields) -> None:
        # Each forgery keeps the real text, so its name is right; only sizes lie.
        other = store.dir / f"{name}.kv"
        h = f.header
        hdr = kvfile.KVHeader(h.quant_bits, h.reason, h.flags, fields.get("tokens", h.tokens), 0, h.ctx,
                              h.fingerprint, h.created, h.last_used, fields.get("payload", len(f.payload)),
                              fields.get("text", len(f.text)))
        with open(other, "wb") as fh:
            fh.write(hdr.pack() + f.text + bytes(f.payload))
            fh.truncate(size)
        made[name] = name
    # Real name, trailing hole: the header is right, the file is 100 GB.
    os.truncate(path, 100 * GB)
    made["trailing"] = sha
    body = 100 * GB - HEADER.size - len(f.text) - kvfile.CHECKSUM_SIZE
    forge("e" * 40, 100 * GB, payload=body)        # the header claims a 100 GB payload
    forge("f" * 40, GB, payload=GB - HEADER.size - len(f.text) - kvfile.CHECKSUM_SIZE)  # 1 GB
    forge("d" * 40, GB, payload=0, text=GB - HEADER.size - kvfile.CHECKSUM_SIZE)  # stripped, 1 GB "text"
    assert path.stat().st_blocks * 512 < 64 << 20  # really sparse: this test writes a few MB
    return made


def test_sparse_huge_files_are_refused_without_reading_them(demo_path, engine, store) -> None:
    made = _sparse_files(engine, store)
    shas = list(made.values())
    r = subprocess.run([sys.executable, "-c", _SPARSE_CHILD, str(demo_path), str(store.dir), ",".join(shas)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["list"]["result"] == "ok" and out["list"]["peak"] < 8 << 20 and out["list"]["rss_growth"] < 64 << 20
    assert out["listed"] == [store.good], out["listed"]
    for name, sha in made.items():
        got = out[sha]
        assert got["result"].startswith("StoreError: ") and "\n" not in got["result"], (name, got)
        assert got["seconds"] < 2 and got["peak"] < 8 << 20 and got["rss_growth"] < 64 << 20, (name, got)
    assert out["live"] == [7, 8, 9]


def test_read_holds_one_copy_of_the_file(engine, tmp_path) -> None:
    """Reading a session costs about one file size, not two or three (bytes, slices, a
    concatenation for the checksum)."""
    import numpy as np

    st = SessionStore(tmp_path)
    s = engine.session()
    s.sync(np.random.default_rng(5).integers(0, 128000, 2000).tolist())
    sha = st.save(s)
    size = st.path(sha).stat().st_size
    tracemalloc.start()
    f = read_file(st.path(sha))
    peak_read = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(f.payload) > 0.9 * size
    del f
    r = engine.session()
    tracemalloc.start()
    st.load(sha, r)
    peak_load = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert r.tokens == s.tokens
    assert peak_read < 1.1 * size, (peak_read, size)
    # A load adds what restoring costs on top of the one buffer: read_payload's copy of the
    # logits and one layer's f16 rounding temporaries (about 1.5x here; 4x before).
    assert peak_load < 2 * size, (peak_load, size)


# -- item 6: every failure is one StoreError line, and a failed load changes nothing ------------------

@pytest.fixture()
def live(engine):
    """The user's live conversation, which a failed load must leave exactly as it was."""
    return convo_session(engine, "my live conversation, not saved yet")


def _check_failed_load(store, sha, session, match: str) -> None:
    before = _state(session)
    with pytest.raises(StoreError, match=match) as e:
        store.load(sha, session)
    _one_line(e.value)
    assert _state(session) == before


def _same_length_pair(engine) -> tuple:
    a, b = engine.session(), engine.session()
    a.sync(list(range(3000, 3040)))
    b.sync(list(range(4000, 4040)))
    return a, b


def test_payload_not_matching_the_text_keeps_the_live_session(engine, store, live) -> None:
    a, b = _same_length_pair(engine)
    sha = store.save(a)
    f = read_file(store.path(sha))
    f.payload = b.snapshot()  # a valid payload of the same length, of another conversation
    store.path(sha).write_bytes(f.to_bytes())  # checksum recomputed: only the mismatch is left
    _check_failed_load(store, sha, live, "do not match|does not match")


def test_stripped_file_with_altered_text_length(engine, store, live) -> None:
    sha = store.save(convo_session(engine, "strip me"))
    store.strip(sha)
    f = read_file(store.path(sha))
    h = f.header
    h.text_bytes = len(f.text) + 1  # one byte too many, the checksum made to agree
    body = h.pack() + f.text
    store.path(sha).write_bytes(body + kvfile.CHECKSUM_MAGIC + b"\x01" + kvfile._checksum(body))
    _check_failed_load(store, sha, live, "truncated|does not match|damaged")


@pytest.mark.parametrize("fault", ["stat", "unlink"])
def test_failure_after_restore(engine, store, live, monkeypatch, fault: str) -> None:
    """Another process drops the file between the restore and the end of the load, or the last
    stat fails: the load either succeeds (the session holds the saved conversation) or raises a
    StoreError and leaves the live conversation; never a KVFileError or an OSError."""
    saved = convo_session(engine, "to be resumed")
    sha = store.save(saved)
    before = _state(live)
    real_restore = type(live).restore

    def restore(self, blob):
        real_restore(self, blob)
        if fault == "unlink":
            store.path(sha).unlink()
            return

        def broken(*a, **k):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "stat", broken)
        monkeypatch.setattr(pathlib.Path, "stat", broken)

    monkeypatch.setattr(type(live), "restore", restore)
    info = error = None
    try:
        info = store.load(sha, live)
    except StoreError as e:
        error = e
    finally:
        monkeypatch.undo()  # before anything (pytest's report included) needs os.stat again
    if error is not None:
        _one_line(error)
        assert _state(live) == before
    else:
        assert live.tokens == saved.tokens and info.sha == sha and info.tokens == len(saved.tokens)


def test_stripped_text_too_long_for_the_context(demo_path, engine, store) -> None:
    s = engine.session()
    s.sync(list(range(5000, 5700)))
    sha = store.save(s)
    store.strip(sha)
    with Engine.open(demo_path, backend="cpu", ctx=512) as small:
        r = small.session()
        r.sync([1, 2, 3])
        _check_failed_load(store, sha, r, "context")


def test_interrupted_reprefill_keeps_the_live_session(engine, store, live, monkeypatch) -> None:
    s = engine.session()
    s.sync(list(range(6000, 6600)))
    sha = store.save(s)
    store.strip(sha)
    before = _state(live)
    real_run = type(live)._run
    calls = []

    def run(self, ids):
        calls.append(len(ids))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_run(self, ids)

    monkeypatch.setattr(type(live), "_run", run)
    with pytest.raises(KeyboardInterrupt):
        store.load(sha, live)
    monkeypatch.undo()
    assert _state(live) == before


def test_every_failure_is_a_store_error(engine, store, live) -> None:
    for bad in ("../../etc/passwd", "g" * 40, "", "ab" * 21):
        for call in (lambda: store.load(bad, live), lambda: store.delete(bad), lambda: store.strip(bad)):
            with pytest.raises(StoreError) as e:
                call()
            _one_line(e.value)
    _check_failed_load(store, "0" * 40, live, "no session")
    with pytest.raises(StoreError):
        store.save(live, tool_map={"id": "not bytes"})  # type: ignore[dict-item]
    with pytest.raises(StoreError):
        store.save(live, tool_map={"\udc80": b"x"})
    # A directory in the place of the lock file, of a session being saved, of one being deleted.
    sha = store.save(live)
    store.path(sha).unlink()
    store.path(sha).mkdir()
    with pytest.raises(StoreError) as e:
        store.save(live)
    _one_line(e.value)
    with pytest.raises(StoreError):
        store.delete(sha)
    os.rmdir(store.path(sha))
    (store.dir / ".lock").unlink()
    (store.dir / ".lock").mkdir()
    with pytest.raises(StoreError) as e:
        store.save(live)
    _one_line(e.value)
    with pytest.raises(StoreError):
        store.longest_prefix("\udc80")
    assert store.good in {i.sha for i in store.list()}


def test_read_only_store_still_loads(engine, store, monkeypatch) -> None:
    """Counting a hit is bookkeeping: a store that cannot be written (or locked) still loads."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if mode & os.W_OK else real(p, mode, *a, **k))
    r = engine.session()
    info = store.load(store.good, r)
    assert info.sha == store.good and r.tokens


# -- item 7: the header's token count against the payload and the file size --------------------------

def _rewrite(path, **fields) -> None:
    f = read_file(path)
    for k, v in fields.items():
        setattr(f.header, k, v)
    path.write_bytes(f.to_bytes())  # the checksum agrees: only the field lies


@pytest.mark.parametrize("tokens", [1 << 30, 1, "one less"])
def test_forged_token_count(engine, store, live, tokens) -> None:
    sha = store.save(convo_session(engine, "forged"))
    real = read_header(store.path(sha))[0].tokens
    _rewrite(store.path(sha), tokens=real - 1 if tokens == "one less" else tokens)
    assert [i.sha for i in store.list()] == [store.good]
    assert any("token" in p for p in store.problems), store.problems
    _check_failed_load(store, sha, live, "token")


def test_forged_token_count_of_a_stripped_file(engine, store) -> None:
    sha = store.save(convo_session(engine, "forged"))
    store.strip(sha)
    h, text = read_header(store.path(sha))
    _rewrite(store.path(sha), tokens=len(text) + 1)  # more tokens than bytes of text
    assert [i.sha for i in store.list()] == [store.good]
    assert any("token" in p for p in store.problems), store.problems


def test_payload_size_must_be_the_models(engine, store, live, monkeypatch) -> None:
    sha = store.save(convo_session(engine, "padded"))
    f = read_file(store.path(sha))
    f.payload = bytes(f.payload) + b"\0" * 64  # the payload header still says the same tokens
    store.path(sha).write_bytes(f.to_bytes())

    def restore(self, blob):
        raise AssertionError("the size is checked against the model before the payload is read")

    monkeypatch.setattr(type(live), "restore", restore)
    _check_failed_load(store, sha, live, "payload")


# -- item 8: temporary files of writers killed mid-save --------------------------------------------

_KILLED_CHILD = r"""
import os, sys, time
from ds4agent.engine import Engine
from ds4agent.sessions.store import SessionStore
real = os.replace
def paused(src, dst):
    if str(src).endswith(".tmp"):
        print(src, flush=True)  # written and fsynced, not yet renamed: wait to be killed
        time.sleep(600)
    return real(src, dst)
os.replace = paused
e = Engine.open(sys.argv[1], backend="cpu", ctx=4096)
s = e.session(); s.sync([11, 12, 13, 14])
SessionStore(sys.argv[2]).save(s)
"""


def _age(path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_temp_file_of_a_killed_writer_is_swept(demo_path, engine, store) -> None:
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(demo_path), str(store.dir)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    tmp = pathlib.Path(line)
    assert tmp.parent == store.dir and tmp.exists() and f".{child.pid}." in tmp.name
    # The store keeps a dead writer's file for a few minutes (a writer in another pid
    # namespace or on another host sharing the folder looks dead here); age it past that.
    _age(tmp, 3600)
    store.save(convo_session(engine, "after the crash"))
    assert not tmp.exists()
    assert not [p for p in store.dir.iterdir() if p.name.endswith(".tmp")]
    assert store.good in {i.sha for i in store.list()} and store.problems == []


def test_sweep_never_takes_a_live_or_recent_writers_file(engine, store) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        alive_old = store.dir / f".{'a' * 40}.kv.{sleeper.pid}.1.tmp"
        mine_old = store.dir / f".{'b' * 40}.kv.{os.getpid()}.2.tmp"
        dead_new = store.dir / f".{'c' * 40}.kv.{dead.pid}.3.tmp"
        dead_old = store.dir / f".{'d' * 40}.kv.{dead.pid}.4.tmp"
        other = store.dir / "notes.tmp"  # not ours at all
        for p in (alive_old, mine_old, dead_new, dead_old, other):
            p.write_bytes(b"partial")
        for p in (alive_old, mine_old, dead_old, other):
            _age(p, 3600)
        store.save(convo_session(engine, "sweeper"))
        assert alive_old.exists() and mine_old.exists() and dead_new.exists() and other.exists()
        assert not dead_old.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
