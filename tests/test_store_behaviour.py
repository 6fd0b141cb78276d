"""Session store (sessions/store.py): exact behaviour, case by case.

Most tests use a small fake session (the store only needs tokens, a tokenizer, the model's
quantisation and fingerprint, and a snapshot) and write stripped files directly, so no engine
is needed and each test takes milliseconds."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from ds4agent import settings
from ds4agent.sessions import store as store_module
from ds4agent.sessions.kvfile import FLAG_CHECKSUM, MAX_TOOLMAP, REASONS, KVFile, KVFileGone, KVHeader, read_header
from ds4agent.sessions.store import SessionInfo, SessionStore, StoreError, _alive, _checked_tool_map, title_of

USER = "<｜User｜>".encode()
QUANT, FP = 2, 7


class FakeTokenizer:
    """One token per byte: the text of tokens is bytes(tokens)."""

    def decode_bytes(self, tokens: list[int]) -> bytes:
        return bytes(tokens)

    def encode_rendered(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class FakeSession:
    def __init__(self, text: bytes, ctx: int = 4096) -> None:
        self.tokens = list(text)
        self.tokenizer = FakeTokenizer()
        self.info = SimpleNamespace(expert_quant_bits=QUANT, fingerprint=FP, config=SimpleNamespace(n_vocab=256))
        self.ctx = ctx
        self.synced: list[int] | None = None

    def snapshot(self) -> bytes:
        return b""  # a stripped file: no engine payload

    def checkpoint(self) -> list[int]:
        return list(self.tokens)

    def rollback(self, cp: list[int]) -> None:
        self.tokens = cp

    def sync(self, ids: list[int]) -> None:
        self.tokens = list(ids)
        self.synced = list(ids)


def put(d: Path, text: bytes, reason: int = REASONS["continued"], last_used: int = 1000, tokens: int | None = None,
        name: str | None = None) -> Path:
    """Write a stripped session file of ``text`` straight to the folder."""
    d.mkdir(parents=True, exist_ok=True)
    h = KVHeader(QUANT, reason, 0, len(text) if tokens is None else tokens, 0, 4096, FP, 500, last_used, 0, 0)
    p = d / f"{name or hashlib.sha1(text).hexdigest()}.kv"
    p.write_bytes(KVFile(h, text, b"").to_bytes())
    return p


def sha(text: bytes) -> str:
    return hashlib.sha1(text).hexdigest()


# -- title ----------------------------------------------------------------------------------
def test_title_keeps_exactly_70_characters_and_cuts_71() -> None:
    assert title_of(USER + b"x" * 70) == "x" * 70
    assert title_of(USER + b"x" * 71) == "x" * 69 + "…"


def test_title_replaces_bytes_that_are_not_utf8() -> None:
    assert title_of(USER + b"a\xffb") == "a\ufffdb"


# -- folder ---------------------------------------------------------------------------------
def test_the_store_creates_missing_parent_folders(tmp_path) -> None:
    st = SessionStore(tmp_path / "a" / "b" / "c")
    st._ensure_dir()
    assert st.dir.is_dir()


def test_a_folder_that_cannot_be_created_is_one_store_error(tmp_path) -> None:
    (tmp_path / "file").write_bytes(b"")
    st = SessionStore(tmp_path / "file" / "sub")
    with pytest.raises(StoreError) as e:
        st._ensure_dir()
    assert str(e.value) == f"{st.dir}: cannot create the session directory: Not a directory"


def test_a_folder_without_search_permission_counts_as_not_writable(tmp_path, monkeypatch) -> None:
    # Root passes every access check, so the folder's permission bits are simulated: write
    # but no search (x) permission. Creating files needs both.
    st = SessionStore(tmp_path / "s")
    monkeypatch.setattr(store_module.os, "access", lambda p, mode: not mode & os.X_OK)
    with pytest.raises(StoreError) as e:
        st._ensure_dir()
    assert str(e.value) == f"{st.dir}: session directory is not writable"


def test_a_folder_whose_permissions_cannot_be_read_is_one_store_error(tmp_path, monkeypatch) -> None:
    st = SessionStore(tmp_path / "s")

    def fail(p, mode):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store_module.os, "access", fail)
    with pytest.raises(StoreError) as e:
        st._ensure_dir()
    assert str(e.value) == f"{st.dir}: cannot use the session directory: Input/output error"


def test_a_folder_replaced_by_a_file_is_refused(tmp_path, monkeypatch) -> None:
    # mkdir finding a file raises by itself; this is the race where the folder is replaced by a
    # file between the mkdir and the check.
    p = tmp_path / "s"
    p.write_bytes(b"")
    monkeypatch.setattr(Path, "mkdir", lambda self, parents=False, exist_ok=False: None)
    with pytest.raises(StoreError) as e:
        SessionStore(p)._ensure_dir()
    assert str(e.value) == f"{p}: is not a directory"


def test_the_default_folder_is_the_settings_one() -> None:
    assert SessionStore().dir == settings.sessions_dir()


# -- lock -----------------------------------------------------------------------------------
def test_the_lock_is_exclusive_released_and_its_descriptor_closed(tmp_path, monkeypatch) -> None:
    st = SessionStore(tmp_path / "s")
    opened: list[int] = []
    real_open, real_close = os.open, os.close

    def rec_open(*a, **k):
        fd = real_open(*a, **k)
        opened.append(fd)
        return fd

    monkeypatch.setattr(store_module.os, "open", rec_open)
    with st._locked():
        other = real_open(st.dir / ".lock", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            real_close(other)
    assert len(opened) == 1
    with pytest.raises(OSError) as e:
        os.fstat(opened[0])  # closed
    assert e.value.errno == errno.EBADF


def test_the_lock_is_released_explicitly_not_only_by_closing(tmp_path, monkeypatch) -> None:
    # A forked child sharing the descriptor would keep the lock held if it were only closed:
    # here the close is suppressed, and the lock must be free all the same.
    st = SessionStore(tmp_path / "s")
    kept: list[int] = []
    monkeypatch.setattr(store_module.os, "close", kept.append)
    with st._locked():
        pass
    monkeypatch.undo()
    other = os.open(st.dir / ".lock", os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
    finally:
        os.close(other)
        for fd in kept:
            os.close(fd)


def test_a_link_in_the_locks_place_is_not_followed(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    st.dir.mkdir()
    target = tmp_path / "elsewhere"
    (st.dir / ".lock").symlink_to(target)
    with pytest.raises(StoreError, match=r"cannot open the store's lock file"):
        st.save(FakeSession(USER + b"hi"), "cold")
    assert not target.exists()


def test_a_fifo_in_the_locks_place_does_not_hang(tmp_path) -> None:
    import threading

    st = SessionStore(tmp_path / "s")
    st.dir.mkdir()
    os.mkfifo(st.dir / ".lock")
    done: list[object] = []

    def run() -> None:
        try:
            done.append(st.save(FakeSession(USER + b"hi"), "cold"))
        except Exception as e:  # noqa: BLE001 - any outcome but a hang is fine here
            done.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        # Unblock the open so the thread can end, then fail.
        fd = os.open(st.dir / ".lock", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("save blocked opening a FIFO in the lock's place")


def test_lock_and_session_files_are_made_rw_r_r(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        st = SessionStore(tmp_path / "s")
        s = st.save(FakeSession(USER + b"hi"), "cold")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(st.dir / ".lock").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(st.path(s)).st_mode) == 0o644


def test_a_save_leaves_no_descriptor_open(tmp_path, monkeypatch) -> None:
    st = SessionStore(tmp_path / "s")
    opened: list[int] = []
    real_open = os.open

    def rec_open(*a, **k):
        fd = real_open(*a, **k)
        opened.append(fd)
        return fd

    monkeypatch.setattr(store_module.os, "open", rec_open)
    st.save(FakeSession(USER + b"hi"), "cold")
    monkeypatch.undo()
    assert len(opened) >= 3  # the lock, the temporary file, the folder
    for fd in opened:
        with pytest.raises(OSError) as e:
            os.fstat(fd)
        assert e.value.errno == errno.EBADF, fd


# -- save -----------------------------------------------------------------------------------
def test_saved_finds_exactly_the_saved_text(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    text = USER + b"hello"
    assert st.saved(text) is None
    got = st.save(FakeSession(text), "cold")
    assert got == sha(text)
    assert st.saved(text) == sha(text)
    assert st.saved(text + b"!") is None


def test_save_refuses_an_unknown_reason_and_an_empty_session(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        st.save(FakeSession(USER + b"x"), "bogus")
    assert str(e.value) == "unknown save reason 'bogus'"
    with pytest.raises(StoreError) as e:
        st.save(FakeSession(b""), "cold")
    assert str(e.value) == "nothing to save: the session holds no tokens"
    assert not st.dir.exists()  # refused before anything was written


def test_save_writes_the_header_it_should(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(store_module.time, "time", lambda: 1_700_000_000.5)
    st = SessionStore(tmp_path / "s")
    text = USER + b"abc"
    h, t = read_header(st.path(st.save(FakeSession(text), "agent-session")))
    assert t == text
    assert (h.quant_bits, h.reason, h.flags, h.tokens, h.hits, h.ctx, h.fingerprint, h.created, h.last_used,
            h.payload_bytes, h.text_bytes) == (QUANT, 6, FLAG_CHECKSUM, len(text), 0, 4096, FP, 1_700_000_000,
                                               1_700_000_000, 0, len(text))


def test_shared_prefixes_survive_a_save_that_extends_them(tmp_path) -> None:
    d = tmp_path / "s"
    st = SessionStore(d)
    system = put(d, b"<sys>", REASONS["agent-system"])
    cold = put(d, b"<sys><tools>", REASONS["cold"])
    older = put(d, b"<sys><tools>" + USER + b"q", REASONS["continued"])
    st.save(FakeSession(b"<sys><tools>" + USER + b"q and more"), "continued")
    assert system.exists() and cold.exists()
    assert not older.exists()


# -- list / resolve ---------------------------------------------------------------------------
def test_list_is_most_recently_used_first(tmp_path) -> None:
    d = tmp_path / "s"
    for n, used in ((1, 2000), (2, 3000), (3, 1000)):
        put(d, USER + b"q%d" % n, last_used=used)
    assert [i.title for i in SessionStore(d).list()] == ["q2", "q1", "q3"]


def test_an_unknown_reason_code_lists_as_unknown(tmp_path) -> None:
    d = tmp_path / "s"
    put(d, USER + b"q", reason=99)
    assert [i.reason for i in SessionStore(d).list()] == ["unknown"]


def _texts_starting(digit: str, n: int) -> list[bytes]:
    out, k = [], 0
    while len(out) < n:
        t = USER + b"q%d" % k
        if sha(t).startswith(digit):
            out.append(t)
        k += 1
    return out


def test_resolve_names_up_to_five_of_the_ambiguous_matches(tmp_path) -> None:
    d = tmp_path / "s"
    texts = _texts_starting("a", 6)
    for k, t in enumerate(texts):
        put(d, t, last_used=1000 + k)
    newest_first = texts[::-1][:5]
    shown = ", ".join(f"{sha(t)[:12]} ({t[len(USER):].decode()})" for t in newest_first)
    with pytest.raises(StoreError) as e:
        SessionStore(d).resolve("A ")
    assert str(e.value) == f"a is ambiguous: 6 sessions match: {shown}"


def test_resolve_two_matches_is_ambiguous_and_one_resolves(tmp_path) -> None:
    d = tmp_path / "s"
    a1, a2 = _texts_starting("a", 2)
    put(d, a1, last_used=1000)
    put(d, a2, last_used=2000)
    st = SessionStore(d)
    with pytest.raises(StoreError) as e:
        st.resolve("a")
    assert str(e.value) == (f"a is ambiguous: 2 sessions match: {sha(a2)[:12]} ({a2[len(USER):].decode()}), "
                            f"{sha(a1)[:12]} ({a1[len(USER):].decode()})")
    assert st.resolve(sha(a1)[:39]) == sha(a1)


def test_an_unreadable_folder_is_the_reason_resolve_gives(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    put(d, USER + b"q")
    st = SessionStore(d)

    def refuse(p):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(store_module.os, "listdir", refuse)
    msg = f"{d}: cannot read the session directory: Permission denied"
    assert st.list() == []
    assert st.problems == [msg]
    with pytest.raises(StoreError) as e:
        st.resolve("ab")
    assert str(e.value) == msg


def test_a_file_gone_mid_listing_does_not_end_the_listing(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    texts = [USER + b"q%d" % k for k in range(3)]
    for t in texts:
        put(d, t)
    first = min(sha(t) for t in texts)
    real = store_module.read_summary

    def summary(p):
        if Path(p).stem == first:
            raise KVFileGone(f"{p}: gone")
        return real(p)

    monkeypatch.setattr(store_module, "read_summary", summary)
    st = SessionStore(d)
    assert sorted(i.sha for i in st.list()) == sorted(sha(t) for t in texts if sha(t) != first)
    assert st.problems == []


def test_a_path_is_not_a_session_id(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    with pytest.raises(StoreError) as e:
        st.delete("../x")
    assert str(e.value) == "'../x' is not a session id (the 40 hex digits of its SHA-1)"


def test_longest_prefix_includes_the_text_itself(tmp_path) -> None:
    d = tmp_path / "s"
    put(d, b"<sys>")
    put(d, b"<sys>" + USER + b"q")
    assert SessionStore(d).longest_prefix(b"<sys>" + USER + b"q") == sha(b"<sys>" + USER + b"q")


# -- load (stripped files: the fake session re-prefills) ---------------------------------------
def test_load_refuses_a_header_token_count_equal_to_the_context(tmp_path) -> None:
    d = tmp_path / "s"
    text = USER + b"q"  # 13 bytes: 13 tokens of the fake tokenizer
    p = put(d, text)
    s = FakeSession(b"live", ctx=len(text))
    with pytest.raises(StoreError) as e:
        SessionStore(d).load(sha(text), s)
    assert str(e.value) == f"{p}: holds {len(text)} tokens, which needs a context of {len(text) + 1}; " \
                           f"this session has {len(text)}"
    assert s.tokens == list(b"live")


def test_load_refuses_a_text_whose_tokens_fill_the_context(tmp_path) -> None:
    d = tmp_path / "s"
    text = USER + b"q"
    p = put(d, text, tokens=2)  # the header undercounts; the re-encoded text is what counts
    s = FakeSession(b"live", ctx=len(text))
    with pytest.raises(StoreError) as e:
        SessionStore(d).load(sha(text), s)
    assert str(e.value) == f"{p}: its text is {len(text)} tokens, which needs a context of {len(text) + 1}; " \
                           f"this session has {len(text)}"
    assert s.tokens == list(b"live")
    s = FakeSession(b"live", ctx=len(text) + 1)
    SessionStore(d).load(sha(text), s)
    assert s.synced == list(text)


def test_load_reports_the_hit_and_last_use_it_wrote(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    text = USER + b"q"
    put(d, text, last_used=1000)
    monkeypatch.setattr(store_module.time, "time", lambda: 1_800_000_000.0)
    info = SessionStore(d).load(sha(text), FakeSession(b"live"))
    assert (info.hits, info.last_used, info.created) == (1, 1_800_000_000, 500)
    h, _ = read_header(d / f"{sha(text)}.kv")
    assert (h.hits, h.last_used) == (1, 1_800_000_000)


# -- delete / strip ---------------------------------------------------------------------------
def test_delete_refuses_a_directory_named_like_a_session(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    p = st.path("ab" * 20)
    p.mkdir(parents=True)
    with pytest.raises(StoreError) as e:
        st.delete("ab" * 20)
    assert str(e.value) == f"{p}: is a directory, not a session file; not deleted"
    assert p.is_dir()


def test_delete_that_the_system_refuses_is_one_store_error(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    p = put(d, USER + b"q")

    def refuse(self, missing_ok=False):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(StoreError) as e:
        SessionStore(d).delete(p.stem)
    assert str(e.value) == f"{p}: cannot delete: Permission denied"


def test_strip_sweeps_stale_temporary_files_and_refuses_missing_or_renamed(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    text = USER + b"q"
    p = put(d, text)
    tmp = d / f".{'c' * 40}.kv.4000000.1.tmp"
    tmp.write_bytes(b"partial")
    os.utime(tmp, (1000, 1000))
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(ProcessLookupError))
    st = SessionStore(d)
    st.strip(p.stem)
    assert not tmp.exists()
    assert read_header(p)[1] == text
    with pytest.raises(StoreError) as e:
        st.strip("ab" * 20)
    assert str(e.value) == f"no session {'ab' * 20}"
    wrong = put(d, USER + b"other", name="cd" * 20)
    with pytest.raises(StoreError) as e:
        st.strip("cd" * 20)
    assert str(e.value) == f"{wrong}: text does not match the file's name (corrupt); not stripped"


# -- temporary files and pids -----------------------------------------------------------------
def _kill_raising(exc: type[BaseException] | None, calls: list | None = None):
    def kill(pid: int, sig: int) -> None:
        if calls is not None:
            calls.append((pid, sig))
        if exc is not None:
            raise exc()

    return kill


def test_a_dead_writers_temp_file_is_swept_at_exactly_the_stale_age(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    d.mkdir()
    now = 2_000_000_000
    stale = d / f".{'a' * 40}.kv.4000000.1.tmp"
    fresh = d / f".{'b' * 40}.kv.4000000.2.tmp"
    for p, age in ((stale, 300), (fresh, 299)):
        p.write_bytes(b"x")
        os.utime(p, (now - age, now - age))
    monkeypatch.setattr(store_module.time, "time", lambda: float(now))
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(ProcessLookupError))
    SessionStore(d)._sweep_temps()
    assert not stale.exists()
    assert fresh.exists()


def test_alive_asks_with_signal_zero_and_reads_each_answer(monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(None, calls))
    assert _alive(1) is True
    assert calls == [(1, 0)]
    assert _alive(0) is False and _alive(-5) is False
    assert calls == [(1, 0)]  # never asked for pid 0 or below
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(ProcessLookupError))
    assert _alive(12345) is False
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(OverflowError))
    assert _alive(12345) is False
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(PermissionError))
    assert _alive(12345) is True
    assert _alive(os.getpid()) is True


# -- tool maps --------------------------------------------------------------------------------
def test_tool_maps_yields_only_files_with_a_map(tmp_path) -> None:
    st = SessionStore(tmp_path / "s")
    with_map = USER + b"\xffmapped"
    plain = sorted((USER + b"p%d" % k for k in range(6)), key=sha)
    # Names are read in sorted order: at least one file without a map comes before the mapped one.
    plain = [t for t in plain if sha(t) < sha(with_map)] or plain
    assert sha(plain[0]) < sha(with_map)
    for t in plain:
        st.save(FakeSession(t), "agent-session")
    st.save(FakeSession(with_map), "agent-session", tool_map={"call_1": b"<dsml/>"})
    assert list(st.tool_maps()) == [({"call_1": b"<dsml/>"}, "<｜User｜>\ufffdmapped")]


def test_checked_tool_map_bounds_and_types() -> None:
    assert _checked_tool_map(None) == {}
    with pytest.raises(StoreError) as e:
        _checked_tool_map([("a", b"")])  # type: ignore[arg-type]
    assert str(e.value) == "the tool map must be a dict of tool-call ids to DSML bytes"
    # 8 bytes of count and version, then 8 + id + DSML per entry.
    fits = MAX_TOOLMAP - 8 - (8 + 1)
    assert len(_checked_tool_map({"a": b"x" * fits})["a"]) == fits
    with pytest.raises(StoreError) as e:
        _checked_tool_map({"a": b"x" * (fits + 1)})
    assert str(e.value) == f"tool map of {MAX_TOOLMAP + 1} bytes exceeds the 64 MiB a session file may hold"


# -- budget -----------------------------------------------------------------------------------
NOW = 1_000_000_000


def _info(path: Path, tokens: int = 0, size: int = 10, hits: int = 0, last_used: int = NOW, s: str = "") -> SessionInfo:
    return SessionInfo(s or path.stem, "t", NOW, last_used, tokens, size, QUANT, hits, "continued", True, path, 0)


def test_value_per_byte_of_reuse_length_and_age() -> None:
    p = Path("x.kv")
    # (1 + 2) * (1 + 9) / 5 / (1 + 2 days)
    assert SessionStore._value(_info(p, tokens=9, size=5, hits=2, last_used=NOW - 2 * 86400), NOW) == 2.0
    # A last use in the future (a clock step back) counts as now, not as younger than now.
    assert SessionStore._value(_info(p, tokens=9, size=5, hits=2, last_used=NOW + 100), NOW) == 6.0
    # An empty file counts as one byte.
    assert SessionStore._value(_info(p, tokens=3, size=0, hits=0, last_used=NOW), NOW) == 4.0
    assert SessionStore._value(_info(p, tokens=3, size=1, hits=0, last_used=NOW - 43200), NOW) == 4 / 1.5


def _budget_case(tmp_path, monkeypatch, budget: int, protect: str, make_a=None):
    d = tmp_path / "s"
    d.mkdir()
    paths = {k: d / f"{k * 40}.kv" for k in "abc"}
    for k, p in paths.items():
        if k != "a" or make_a is None:
            p.write_bytes(b"x" * 10)
    if make_a is not None:
        make_a(paths["a"])
    infos = [_info(paths["c"], tokens=99), _info(paths["a"], tokens=0), _info(paths["b"], tokens=9)]
    st = SessionStore(d, budget_bytes=budget)
    monkeypatch.setattr(st, "_infos", lambda: list(infos))
    monkeypatch.setattr(store_module.time, "time", lambda: float(NOW))
    st._enforce_budget(protect=protect)
    return {k: p.exists() for k, p in paths.items()}


def test_budget_evicts_the_least_valuable_until_it_fits_exactly(tmp_path, monkeypatch) -> None:
    assert _budget_case(tmp_path, monkeypatch, 20, "c" * 40) == {"a": False, "b": True, "c": True}


def test_budget_never_evicts_the_protected_session(tmp_path, monkeypatch) -> None:
    assert _budget_case(tmp_path, monkeypatch, 20, "a" * 40) == {"a": True, "b": False, "c": True}


def test_budget_counts_a_file_gone_meanwhile_as_freed(tmp_path, monkeypatch) -> None:
    assert _budget_case(tmp_path, monkeypatch, 20, "c" * 40, make_a=lambda p: None) == \
        {"a": False, "b": True, "c": True}


def test_budget_goes_on_past_a_file_it_cannot_remove(tmp_path, monkeypatch) -> None:
    got = _budget_case(tmp_path, monkeypatch, 20, "c" * 40, make_a=lambda p: p.mkdir())
    assert got == {"a": True, "b": False, "c": True}


# -- failures turned into one-line errors ------------------------------------------------------
def test_a_lock_that_cannot_be_taken_is_one_store_error(tmp_path, monkeypatch) -> None:
    st = SessionStore(tmp_path / "s")

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(store_module.fcntl, "flock", refuse)
    with pytest.raises(StoreError) as e:
        st.save(FakeSession(USER + b"q"), "cold")
    assert str(e.value) == f"{st.dir / '.lock'}: cannot lock the store: No locks available"


def test_a_folder_sync_failure_after_the_rename_says_it_was_saved(tmp_path, monkeypatch) -> None:
    st = SessionStore(tmp_path / "s")
    st.dir.mkdir()
    real = os.fsync
    dir_ino = os.stat(st.dir).st_ino

    def fsync(fd):
        if os.fstat(fd).st_ino == dir_ino:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    text = USER + b"q"
    with pytest.raises(StoreError) as e:
        st.save(FakeSession(text), "cold")
    assert str(e.value) == f"{st.dir}: saved, but the folder could not be synced to disk: Input/output error"
    assert read_header(st.path(sha(text)))[1] == text


def test_the_sweep_goes_on_past_a_temp_file_gone_meanwhile(tmp_path, monkeypatch) -> None:
    d = tmp_path / "s"
    d.mkdir()
    gone = d / f".{'a' * 40}.kv.4000000.1.tmp"
    stale = d / f".{'b' * 40}.kv.4000000.2.tmp"
    for p in (gone, stale):
        p.write_bytes(b"x")
        os.utime(p, (1000, 1000))
    real = os.lstat

    def lstat(p, *a, **k):
        if Path(p) == gone:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return real(p, *a, **k)

    monkeypatch.setattr(store_module.os, "lstat", lstat)
    monkeypatch.setattr(store_module.os, "listdir", lambda p: [gone.name, stale.name])
    monkeypatch.setattr(store_module.os, "kill", _kill_raising(ProcessLookupError))
    SessionStore(d)._sweep_temps()
    assert not stale.exists()


def test_load_of_a_file_whose_text_does_not_match_its_name(tmp_path) -> None:
    d = tmp_path / "s"
    p = put(d, USER + b"other", name="cd" * 20)
    s = FakeSession(b"live")
    with pytest.raises(StoreError) as e:
        SessionStore(d).load("cd" * 20, s)
    assert str(e.value) == f"{p}: text does not match the file's name (corrupt); not loaded"
    assert s.tokens == list(b"live")


@pytest.mark.parametrize("exc, tail", [
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
     "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    (OSError(errno.EIO, "Input/output error"), "cannot load: Input/output error"),
    (MemoryError(), "not enough memory to load it"),
])
def test_load_turns_a_failure_of_the_resume_into_one_line(tmp_path, exc, tail) -> None:
    d = tmp_path / "s"
    text = USER + b"q"
    p = put(d, text)
    s = FakeSession(b"live")

    def sync(ids):
        s.tokens = [1]  # half-done: the rollback must undo it
        raise exc

    s.sync = sync  # type: ignore[method-assign]
    with pytest.raises(StoreError) as e:
        SessionStore(d).load(sha(text), s)
    assert str(e.value) == f"{p}: {tail}"
    assert s.tokens == list(b"live")


def test_tool_maps_skip_a_file_that_cannot_be_read_and_go_on(tmp_path, monkeypatch) -> None:
    from ds4agent.sessions.kvfile import KVFileError

    st = SessionStore(tmp_path / "s")
    texts = sorted((USER + b"m%d" % k for k in range(3)), key=sha)
    for t in texts:
        st.save(FakeSession(t), "agent-session", tool_map={"id": t})
    real = store_module.KVReader

    def reader(path, *a, **k):
        if Path(path).stem == sha(texts[0]):
            raise KVFileError(f"{path}: damaged")
        return real(path, *a, **k)

    monkeypatch.setattr(store_module, "KVReader", reader)
    assert list(st.tool_maps()) == [({"id": t}, t.decode()) for t in texts[1:]]


# -- full files (demo engine): the payload's own token ids ----------------------------------------
@pytest.fixture(scope="module")
def engine(demo_path):
    from ds4agent.engine import Engine

    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


def _rewrite_payload_token(path: Path, k: int, new_id: int) -> None:
    """Replace token k of the payload's id list, keeping the file's checksum valid."""
    import struct

    from ds4agent.sessions.kvfile import PAYLOAD_HEADER, read_file

    f = read_file(path)
    payload = bytearray(f.payload)
    struct.pack_into("<I", payload, PAYLOAD_HEADER.size + 4 * k, new_id)
    h = f.header
    path.write_bytes(KVFile(h, bytes(f.text), bytes(payload), dict(f.tool_map)).to_bytes())


def _saved_conversation(engine, tmp_path):
    """A store holding one saved conversation: (store, session, name)."""
    from helpers import convo_session

    st = SessionStore(tmp_path / "s")
    s = convo_session(engine, "count my tokens")
    return st, s, st.save(s, "cold")


def _assert_refused(engine, st: SessionStore, name: str, why: str) -> None:
    """Loading ``name`` fails with exactly this one-line reason and leaves the session empty."""
    r = engine.session()
    with pytest.raises(StoreError) as e:
        st.load(name, r)
    assert str(e.value) == f"{st.path(name)}: {why}; not loaded"
    assert r.tokens == []


def test_load_refuses_a_payload_token_at_the_vocabulary_size(engine, tmp_path) -> None:
    st, s, name = _saved_conversation(engine, tmp_path)
    # One id (the last) exactly at n_vocab: the first id outside the vocabulary.
    _rewrite_payload_token(st.path(name), len(s.tokens) - 1, engine.info.config.n_vocab)
    _assert_refused(engine, st, name, "payload holds a token id outside the vocabulary (damaged)")


def test_load_refuses_payload_tokens_spelling_another_text_of_the_same_length(engine, tmp_path) -> None:
    st, s, name = _saved_conversation(engine, tmp_path)
    tok = engine.tokenizer
    k = len(s.tokens) - 1
    want = len(tok.decode_bytes([s.tokens[k]]))
    other = next(t for t in range(engine.info.config.n_vocab)
                 if t != s.tokens[k] and len(tok.decode_bytes([t])) == want
                 and len(tok.decode_bytes(s.tokens[:k] + [t])) == len(tok.decode_bytes(s.tokens))
                 and tok.decode_bytes(s.tokens[:k] + [t]) != tok.decode_bytes(s.tokens))
    _rewrite_payload_token(st.path(name), k, other)
    _assert_refused(engine, st, name, "payload tokens do not match the saved text (corrupt)")


def test_payload_tokens_of_another_length_are_refused_before_the_file_is_read(engine, tmp_path) -> None:
    # The ids are patched in place (the checksum is now wrong too): the length check on the
    # ids comes first, before the whole file (and its checksum) is read.
    import struct

    from ds4agent.sessions.kvfile import PAYLOAD_HEADER

    st, s, name = _saved_conversation(engine, tmp_path)
    tok = engine.tokenizer
    k = len(s.tokens) - 1
    other = next(t for t in range(engine.info.config.n_vocab)
                 if len(tok.decode_bytes(s.tokens[:k] + [t])) != len(tok.decode_bytes(s.tokens)))
    p = st.path(name)
    h, _ = read_header(p, with_text=False)
    with open(p, "r+b") as f:
        f.seek(h.payload_offset + PAYLOAD_HEADER.size + 4 * k)
        f.write(struct.pack("<I", other))
    _assert_refused(engine, st, name, "payload tokens do not match the saved text (corrupt)")


def test_a_restore_that_disagrees_with_the_payload_ids_is_refused(engine, tmp_path, monkeypatch) -> None:
    # The last check of a load: the engine's restored tokens must be the payload's ids. No file
    # can fail it (the ids were read from the same payload), only an engine whose restore is
    # wrong, so one is simulated: the load is refused and the session rolled back.
    st, s, name = _saved_conversation(engine, tmp_path)
    r = engine.session()
    real = type(r).restore

    def restore_dropping_a_token(self, blob) -> None:
        real(self, blob)
        live = self._live
        self._live = type(live)(live.state, live.tokens, live.n - 1, live.logits)

    monkeypatch.setattr(type(r), "restore", restore_dropping_a_token)
    _assert_refused(engine, st, name, "payload tokens do not match the saved text (corrupt)")
