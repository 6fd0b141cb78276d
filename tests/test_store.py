"""The session store: exact resume across processes, integrity, and every failure mode."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import convo_session, damage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4agent.engine import Engine, SamplingParams
from ds4agent.sessions.kvfile import KVFileError, read_file, read_header
from ds4agent.sessions.store import SessionStore, StoreError, title_of


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


def _greedy(s, n=8):
    return [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=n, stop_at_eos=False)]


def test_save_list_load_roundtrip(engine, tmp_path) -> None:
    store = SessionStore(tmp_path / "s")
    s = convo_session(engine, "Tell me   about\n the moon")
    sha = store.save(s, "cold")
    assert store.save(s, "cold") == sha  # idempotent
    [info] = store.list()
    assert info.sha == sha and info.tokens == len(s.tokens) and info.quant_bits == 2
    assert info.title == "Tell me about the moon" and not info.stripped and info.size == store.path(sha).stat().st_size
    expect = _greedy(s)
    r = engine.session()
    store.load(sha, r)
    assert _greedy(r) == expect and np.array_equal(r.logits, s.logits)
    assert store.list()[0].hits == 1


def test_resume_across_process_restart(demo_path, engine, tmp_path) -> None:
    d = tmp_path / "store"
    code = r"""
import sys, json
from ds4agent.engine import Engine, SamplingParams
from ds4agent.sessions.store import SessionStore
e = Engine.open(sys.argv[1], backend="cpu", ctx=4096)
st = SessionStore(sys.argv[2])
if sys.argv[3] == "save":
    s = e.session(); s.sync(list(range(3000, 3150)))
    print(st.save(s, "agent-session"))
else:
    s = e.session(); st.load(sys.argv[4], s)
    toks = [x.token for x in s.generate(SamplingParams(temperature=0), max_tokens=10, stop_at_eos=False)]
    print(json.dumps(toks)); sys.stdout.flush()
    import numpy as np; np.save(sys.argv[5], s.logits)
"""
    run = lambda *a: subprocess.run([sys.executable, "-c", code, str(demo_path), str(d), *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=300, check=True).stdout.strip()
    sha = run("save")
    out = run("load", sha, str(tmp_path / "l.npy"))
    s = engine.session()
    s.sync(list(range(3000, 3150)))
    assert out == str(_greedy(s, 10)).replace(" ", "").replace(",", ", ")
    assert np.array_equal(np.load(tmp_path / "l.npy"), s.logits)


def test_switch_runs_no_forward_pass(engine, tmp_path, monkeypatch) -> None:
    store = SessionStore(tmp_path)
    s = engine.session()
    s.sync(np.random.default_rng(0).integers(0, 128000, 2000).tolist())
    sha = store.save(s)
    calls = []
    monkeypatch.setattr(engine.model, "forward", lambda *a, **k: calls.append(1))
    r = engine.session()
    store.load(sha, r)
    assert calls == [] and r.tokens == s.tokens and np.array_equal(r.logits, s.logits)


def test_older_checkpoints_of_the_conversation_are_removed(engine, tmp_path) -> None:
    store = SessionStore(tmp_path)
    s = convo_session(engine, "count")
    first = store.save(s)
    other = store.save(convo_session(engine, "unrelated"))
    s.sync(s.tokens + engine.tokenizer.encode(" one two"))
    second = store.save(s, "continued")
    shas = {i.sha for i in store.list()}
    assert second in shas and other in shas and first not in shas


def test_resolve_strip_delete_prefix(engine, tmp_path) -> None:
    store = SessionStore(tmp_path)
    a, b = convo_session(engine, "alpha"), convo_session(engine, "beta")
    sa, sb = store.save(a), store.save(b)
    assert store.resolve(sa[:12]) == sa
    common = os.path.commonprefix([sa, sb])
    with pytest.raises(StoreError, match="ambiguous" if common else "no session"):
        store.resolve(common or "0" * 40)
    with pytest.raises(StoreError, match="not a session id"):
        store.resolve("xyz")
    text = engine.tokenizer.decode_bytes(a.tokens) + "more".encode()
    assert store.longest_prefix(text) == sa and store.longest_prefix(b"nothing") is None
    store.strip(sa)
    info = next(i for i in store.list() if i.sha == sa)
    assert info.stripped and info.size < 10_000
    r = engine.session()
    store.load(sa, r)  # re-prefills from the text
    assert r.tokens == a.tokens and np.allclose(r.logits, a.logits, rtol=1e-4, atol=1e-4)
    store.delete(sb)
    assert [i.sha for i in store.list()] == [sa]
    with pytest.raises(StoreError):
        store.delete(sb)


def test_budget_evicts_least_valuable_but_never_the_new_file(engine, tmp_path) -> None:
    store = SessionStore(tmp_path)
    shas = [store.save(convo_session(engine, f"topic {i}")) for i in range(3)]
    size = store.list()[0].size
    store.budget_bytes = int(size * 2.5)
    newest = store.save(convo_session(engine, "topic new"))
    left = {i.sha for i in store.list()}
    assert newest in left and len(left) == 2
    assert sum(i.size for i in store.list()) <= store.budget_bytes
    del shas


def test_title() -> None:
    t = "<｜begin▁of▁sentence｜>sys<｜User｜>  hello\n\n world <｜Assistant｜>".encode()
    assert title_of(t) == "hello world"
    assert len(title_of(("<｜User｜>" + "x" * 200).encode())) == 70
    assert title_of(b"no user") == "(no user message)"


# -- robustness ---------------------------------------------------------------------------------

@pytest.fixture()
def saved(engine, tmp_path):
    store = SessionStore(tmp_path / "st")
    good = store.save(convo_session(engine, "keep me"))
    victim = store.save(convo_session(engine, "break me"))
    return store, good, victim


def _assert_skipped(store, good, victim, fragment):
    listed = [i.sha for i in store.list()]
    assert good in listed and victim not in listed
    assert any(fragment in p for p in store.problems), store.problems
    assert all("\n" not in p for p in store.problems)


def test_truncated_file(saved) -> None:
    store, good, victim = saved
    p = store.path(victim)
    p.write_bytes(p.read_bytes()[:40])
    _assert_skipped(store, good, victim, "truncated")


def test_wrong_magic(saved) -> None:
    store, good, victim = saved
    p = store.path(victim)
    p.write_bytes(b"XYZ" + p.read_bytes()[3:])
    _assert_skipped(store, good, victim, "bad magic")


def test_newer_version(saved) -> None:
    store, good, victim = saved
    p = store.path(victim)
    data = bytearray(p.read_bytes())
    data[3] = 2
    p.write_bytes(bytes(data))
    _assert_skipped(store, good, victim, "version 2 is newer")


def test_renamed_file(saved) -> None:
    store, good, victim = saved
    store.path(victim).rename(store.path("f" * 40))
    listed = [i.sha for i in store.list()]
    assert listed == [good] and any("does not match" in p for p in store.problems)


# Each damaged location and the one error it must give (and whether a listing still shows the
# file: only the text and the token count are checked by a listing).
_FLIPS = {
    "text": (lambda h, n: h.text_offset + 5, "checksum mismatch", False),
    "payload_header": (lambda h, n: h.payload_offset + 8, "checksum mismatch", True),
    "payload_tail": (lambda h, n: n - 30, "checksum mismatch", True),
    "checksum_trailer": (lambda h, n: n - 3, "checksum mismatch", True),
    "header_tokens": (lambda h, n: 8, r"header says \d+ tokens for \d+ bytes of text", False),
    "header_ctx": (lambda h, n: 17, "checksum mismatch", True),
    "header_created": (lambda h, n: 25, "checksum mismatch", True),
    "header_reason": (lambda h, n: 5, "checksum mismatch", True),
}


@pytest.mark.parametrize("where", sorted(_FLIPS))
def test_flipped_bytes_are_caught(engine, saved, where: str) -> None:
    store, good, victim = saved
    p = store.path(victim)
    data = bytearray(p.read_bytes())
    h, text = read_header(p)
    offset, error, listed = _FLIPS[where]
    data[offset(h, len(data))] ^= 0xFF
    p.write_bytes(bytes(data))
    s = engine.session()
    assert (victim in [i.sha for i in store.list()]) == listed
    # A flipped token count is caught by the token checks (item 7), before the checksum.
    with pytest.raises(StoreError, match=error):
        store.load(victim, s)
    assert good in [i.sha for i in store.list()]
    store.load(good, engine.session())


@pytest.mark.parametrize("offset", [12, 13, 32, 36])
def test_hit_count_and_last_use_are_outside_the_checksum(engine, saved, offset: int) -> None:
    # They are rewritten in place on every load: a checksum covering them would refuse the
    # file at its second load.
    store, good, victim = saved
    p = store.path(victim)
    data = bytearray(p.read_bytes())
    data[offset] ^= 0x5A
    p.write_bytes(bytes(data))
    s = engine.session()
    store.load(victim, s)
    assert s.tokens == convo_session(engine, "break me").tokens


def test_another_model_is_refused(demo_q4_path, tmp_path, saved) -> None:
    store, good, _ = saved
    with Engine.open(demo_q4_path, backend="cpu", ctx=4096) as q4:
        with pytest.raises(StoreError, match="4-bit experts"):
            store.load(good, q4.session())


def test_another_model_same_shape_is_refused(tmp_path, saved) -> None:
    from ds4agent.modelfile.demo import write_demo

    store, good, _ = saved
    other = write_demo(tmp_path / "seed1.gguf", "tiny", 1)
    with Engine.open(other, backend="cpu", ctx=4096) as e:
        with pytest.raises(StoreError, match="another model file"):
            store.load(good, e.session())


def test_unwritable_directory(engine, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="session directory|not a directory"):
        SessionStore(blocker / "sessions").save(convo_session(engine, "x"))
    assert SessionStore(blocker / "sessions").list() == []


def test_disk_full_leaves_store_unchanged(engine, saved, monkeypatch) -> None:
    store, good, victim = saved
    before = {p.name: p.read_bytes() for p in store.dir.iterdir()}
    real = os.write
    state = {"n": 0}

    def full(fd, data):
        state["n"] += 1
        if state["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bytes(data)[: len(data) // 2])

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreError, match="disk full"):
        store.save(convo_session(engine, "keep me", extra="more text"))
    monkeypatch.setattr(os, "write", real)
    after = {p.name: p.read_bytes() for p in store.dir.iterdir()}
    assert after == before


def test_two_processes_saving_at_once(demo_path, tmp_path) -> None:
    d = tmp_path / "race"
    code = r"""
import sys
from ds4agent.engine import Engine
from ds4agent.sessions.store import SessionStore
e = Engine.open(sys.argv[1], backend="cpu", ctx=4096)
st = SessionStore(sys.argv[2])
for k in range(4):
    s = e.session(); s.sync([int(sys.argv[3]) + k, 5, 6, 7])
    st.save(s)
    s2 = e.session(); s2.sync([9, 9, 9])  # both processes also write the same session
    st.save(s2)
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, str(demo_path), str(d), str(base)]) for base in (100, 200)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    store = SessionStore(d)
    infos = store.list()
    assert len(infos) == 9 and store.problems == []
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    for i in infos:
        read_file(i.path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_reader(tmp_path, data) -> None:
    """Random damage to a real file: the readers raise KVFileError or succeed; never crash."""
    base = _FUZZ_BASE.get("blob")
    if base is None:
        pytest.skip("no base file")
    p = tmp_path / ("a" * 40 + ".kv")
    p.write_bytes(damage(base, data.draw, span=2000, hits=8))
    for fn in (read_header, read_file):
        try:
            fn(p)
        except KVFileError as e:
            assert "\n" not in str(e)
    SessionStore(tmp_path).list()


_FUZZ_BASE: dict = {}


@pytest.fixture(autouse=True, scope="module")
def _fuzz_base(engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzzbase")
    store = SessionStore(d)
    sha = store.save(convo_session(engine, "fuzz"), "cold", tool_map={"call_1": b"<dsml>"})
    _FUZZ_BASE["blob"] = store.path(sha).read_bytes()
    assert read_file(store.path(sha)).tool_map == {"call_1": b"<dsml>"}
    yield
    time.sleep(0)


def test_ds4_layout_and_files_without_our_checksum(engine, tmp_path) -> None:
    """Offsets of docs/model.md §6.2; a file as ds4 writes it (no checksum, fingerprint 0) loads."""
    import struct

    from ds4agent.sessions.kvfile import FLAG_CHECKSUM, HEADER

    store = SessionStore(tmp_path)
    s = convo_session(engine, "layout")
    sha = store.save(s, "agent-session")
    raw = store.path(sha).read_bytes()
    assert raw[:4] == b"KVC\x01" and raw[4] == 2 and raw[5] == 6
    tokens, = struct.unpack_from("<I", raw, 8)
    ctx, = struct.unpack_from("<I", raw, 16)
    payload_bytes, = struct.unpack_from("<Q", raw, 40)
    text_len, = struct.unpack_from("<I", raw, 48)
    assert HEADER.size == 52 and tokens == len(s.tokens) and ctx == 4096
    assert raw[52 : 52 + text_len] == engine.tokenizer.decode_bytes(s.tokens)
    payload = raw[52 + text_len : 52 + text_len + payload_bytes]
    assert payload[:4] == b"DSV4"  # the engine payload, magic 0x34565344 little-endian
    # Rewrite it the way ds4 would: no checksum trailer, no flag, reserved fingerprint 0.
    ds4 = bytearray(raw[: 52 + text_len + payload_bytes])
    ds4[6] &= ~FLAG_CHECKSUM & 0xFF
    ds4[20:24] = b"\0\0\0\0"
    store.path(sha).write_bytes(bytes(ds4))
    r = engine.session()
    store.load(sha, r)
    assert r.tokens == s.tokens and np.array_equal(r.logits, s.logits)
