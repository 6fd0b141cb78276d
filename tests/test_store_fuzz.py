"""Bounded fuzzing of the session-file reader and the store, and the store read while another
process writes to the same folder."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import convo_session, damage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ds4agent.engine import Engine
from ds4agent.sessions.kvfile import (
    CHECKSUM_MAGIC,
    CHECKSUM_SIZE,
    FLAG_CHECKSUM,
    HEADER,
    KVFileError,
    _checksum,
    read_file,
    read_header,
    text_sha,
)
from ds4agent.sessions.store import SessionStore, StoreError

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


@pytest.fixture(scope="module")
def world(engine, tmp_path_factory):
    """A store with two healthy sessions, the bytes of a full file (with a tool map) and of a
    stripped one to damage, and the user's live conversation."""
    d = tmp_path_factory.mktemp("fuzzstore")
    store = SessionStore(d)
    neighbours = [store.save(convo_session(engine, "healthy one")), store.save(convo_session(engine, "healthy two"))]
    full = store.save(convo_session(engine, "victim"), "cold", tool_map={"call_1": b"<dsml>x</dsml>"})
    stripped = store.save(convo_session(engine, "stripped victim"))
    store.strip(stripped)
    ds4 = store.save(convo_session(engine, "written by ds4"))
    bases = {name: (sha, store.path(sha).read_bytes()) for name, sha in
             (("full", full), ("stripped", stripped), ("ds4", ds4))}
    # As ds4 writes it: no checksum (so damage reaches the semantic checks), fingerprint 0.
    raw = bytearray(bases["ds4"][1][: -CHECKSUM_SIZE])
    raw[6] &= ~FLAG_CHECKSUM & 0xFF
    raw[20:24] = bytes(4)
    bases["ds4"] = (ds4, bytes(raw))
    store.path(ds4).write_bytes(bytes(raw))
    live = convo_session(engine, "my live conversation")
    return {"store": store, "neighbours": neighbours, "bases": bases, "live": live, "cp": live.checkpoint(),
            "before": (list(live.tokens), live.snapshot())}


def _damaged(draw, base: bytes, region: str, reseal: bool) -> bytes:
    if region == "extend":
        blob = base + draw(st.binary(min_size=1, max_size=64))
    else:
        blob = damage(base, draw, span={"header": 64, "anywhere": len(base)}[region], hits=8)
    if reseal and len(blob) >= HEADER.size + CHECKSUM_SIZE and blob[6] & FLAG_CHECKSUM:
        # As a forger (or a buggy writer) would: the checksum made to agree with the damage,
        # so that only the store's other checks stand between the file and the session.
        body = blob[:-CHECKSUM_SIZE]
        blob = body + CHECKSUM_MAGIC + b"\x01" + _checksum(body)
    return blob


@pytest.mark.parametrize("kind,reseal", [("full", False), ("full", True), ("stripped", False), ("stripped", True),
                                         ("ds4", False)])
@pytest.mark.parametrize("region", ["header", "anywhere", "extend"])
@FUZZ
@given(data=st.data())
def test_fuzz_store(world, kind: str, reseal: bool, region: str, data) -> None:
    """Damaged, truncated or extended files: the readers raise KVFileError or succeed, the
    store's public methods raise StoreError or succeed, a healthy neighbour is always listed,
    a listed token count is the true one, and a failed load leaves the live session as it was."""
    store, live = world["store"], world["live"]
    sha, base = world["bases"][kind]
    path = store.path(sha)
    path.write_bytes(_damaged(data.draw, base, region, reseal))
    try:
        for read in (read_header, read_file):
            try:
                read(path)
            except KVFileError as e:
                assert "\n" not in str(e)
        listed = {i.sha: i for i in store.list()}
        assert set(world["neighbours"]) <= set(listed)
        assert all(p and "\n" not in p for p in store.problems)
        live.rollback(world["cp"])
        try:
            got = store.load(sha, live)
        except StoreError as e:
            assert str(e) and "\n" not in str(e)
            assert (live.tokens, live.snapshot()) == world["before"]
        else:
            if sha in listed and not got.stripped:
                assert listed[sha].tokens == got.tokens == len(live.tokens)
        for prefix in (sha[:6], sha):
            try:
                store.resolve(prefix)
            except StoreError as e:
                assert "\n" not in str(e)
        assert store.longest_prefix(b"<\xef\xbd\x9cbegin") is None
    finally:
        path.write_bytes(base)


def test_fuzz_does_not_leave_the_live_session_changed(world) -> None:
    """After the fuzzing above (and whatever order it ran in), the live conversation can still
    be rolled back and continues as before."""
    live = world["live"]
    live.rollback(world["cp"])
    assert (live.tokens, live.snapshot()) == world["before"]


# -- the store read while another process saves and drops sessions -------------------------------

_WRITER = r"""
import random, sys, time
from ds4agent.engine import Engine
from ds4agent.sessions.store import SessionStore, StoreError
e = Engine.open(sys.argv[1], backend="cpu", ctx=4096)
store = SessionStore(sys.argv[2])
family = [[int(x) for x in c.split(".")] for c in sys.argv[3].split(",")]
seconds = float(sys.argv[4])
rng = random.Random(0)
sessions = []
for ids in family:  # prefilled before the clock starts: the timed loop only writes and drops
    s = e.session(); s.sync(ids); sessions.append(s)
print("ready", flush=True)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    sha = store.save(rng.choice(sessions), "continued")  # also drops saved prefixes of its conversation
    roll = rng.random()
    if roll < 0.25:
        store.delete(sha)
    elif roll < 0.45:
        store.strip(sha)
    n += 1
print(n, flush=True)
"""


def _family(tok) -> list[list[int]]:
    """Conversations as growing token lists (each extends the shorter one, so saving it drops
    the shorter checkpoints), of real text: a stripped one re-prefills to the same text."""
    out = []
    for c in range(4):
        ids = tok.encode(f"Conversation {c}:")
        for length in range(3):
            ids = ids + tok.encode(" " + " ".join(f"word{c}{length}{w}" for w in range(4)))
            out.append(ids)
    return out


def test_list_and_load_while_another_process_writes(demo_path, engine, tmp_path) -> None:
    folder = tmp_path / "busy"
    store = SessionStore(folder)
    tok = engine.tokenizer
    family = _family(tok)
    want = {}  # every name the writer can produce -> its tokens and text
    for ids in family:
        text = tok.decode_bytes(ids)
        want[text_sha(text)] = (ids, text)
    arg = ",".join(".".join(map(str, ids)) for ids in family)
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(demo_path), str(folder), arg, "2.0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        live = convo_session(engine, "mine")
        before = (list(live.tokens), live.snapshot())
        cp = live.checkpoint()
        listings = loads = failures = 0
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)  # two shared cores: leave the writer its share
            infos = store.list()
            listings += 1
            assert store.problems == [], store.problems
            for i in infos:
                assert re.fullmatch(r"[0-9a-f]{40}", i.sha) and i.path.name == f"{i.sha}.kv" and i.sha in want
                assert i.tokens == len(want[i.sha][0]) and i.size > 52
                assert i.reason == "continued" and isinstance(i.title, str)
            if not infos:
                continue
            info = infos[int(rng.integers(len(infos)))]
            live.rollback(cp)
            try:
                got = store.load(info.sha, live)
            except StoreError as e:
                assert str(e) and "\n" not in str(e)
                assert (live.tokens, live.snapshot()) == before
                failures += 1
                continue
            ids, text = want[info.sha]
            if got.stripped:  # re-prefilled from the text: the text is the identity
                assert tok.decode_bytes(live.tokens) == text
            else:
                assert live.tokens == ids
            loads += 1
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-2000:]
    saves = int(out.strip().splitlines()[-1])
    assert saves > 5 and listings > 5 and loads > 0, (saves, listings, loads, failures)
