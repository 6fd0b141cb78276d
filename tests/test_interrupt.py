"""Interrupts at every point of a token step never leave a session whose token list and KV
state disagree (issue: a KeyboardInterrupt landing inside a state update made the next save
crash and lost the conversation).

The injector raises KeyboardInterrupt from a trace function: at the k-th call or return of any
function in our package, and at every line of the session and state modules, which is where
a signal handler's exception could land as well (between bytecodes of Python code).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ds4agent
from ds4agent.conversation.turns import Conversation
from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.session import Session
from ds4agent.sessions import SessionStore

PKG = str(Path(ds4agent.__file__).parent)
# Every line here is an injection point: the session's step and its commit, and the turn
# around it. Everything below (the model, the kernels, forking the state) runs on a fork of
# the state that only the commit publishes, so a stride through those points covers them.
FINE = ("session.py", "conversation.py")


class Injector:
    """Trace function raising KeyboardInterrupt at injection point number ``at`` (never, when
    None: then it only counts the points and remembers where each one was)."""

    def __init__(self, at: int | None = None) -> None:
        self.at, self.n, self.fired, self.where = at, 0, False, []

    def __call__(self, frame, event, arg):
        name = frame.f_code.co_filename
        if not name.startswith(PKG):
            return None
        # Lines of comprehensions and generator expressions are left out: one point per
        # element adds nothing but time (their call and return are still points).
        fine = name.endswith(FINE) and not frame.f_code.co_name.startswith("<")
        if event in ("call", "return") or (event == "line" and fine):
            self.n += 1
            if self.at is None:
                self.where.append(Path(name).name if fine else "")
            elif self.n == self.at:
                self.fired = True
                raise KeyboardInterrupt
        return self

    def run(self, fn, *args):
        sys.settrace(self)
        try:
            return fn(*args)
        finally:
            sys.settrace(None)


def points(fn, *args, every: int) -> list[int]:
    """Every fine point, and every ``every``-th of the others (the model's own calls all run
    on a fork of the state, so one in ``every`` covers them; the test stays a few seconds)."""
    probe = Injector()
    probe.run(fn, *args)
    return [i + 1 for i, where in enumerate(probe.where) if where or i % every == 0]


@pytest.fixture(scope="module")
def engine(demo_path):
    # Float activations: a clean prefill batches tokens differently from the interrupted
    # session's chunks and steps, and only float kernels make those agree to rounding.
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="cpu-exact") as e:
        yield e


def test_eval_interrupted_anywhere_leaves_the_state_as_it_was(engine) -> None:
    s = engine.session()
    s.sync(list(range(300, 340)))
    before = s.snapshot()
    tokens = s.tokens
    s.eval(77)
    want = s.logits.copy()
    s.restore(before)
    fired = 0
    for k in points(s.eval, 77, every=15):
        s.restore(before)
        inj = Injector(k)
        try:
            inj.run(s.eval, 77)
        except KeyboardInterrupt:
            pass
        if not inj.fired:
            continue
        fired += 1
        # Either the step committed whole or not at all: never one without the other.
        if s.tokens == tokens:
            assert s.snapshot() == before, f"interrupt at point {k} changed the state"
            s.eval(77)
        else:
            assert s.tokens == tokens + [77]
        np.testing.assert_array_equal(s.logits, want)
    assert fired > 150


def test_prefill_interrupted_anywhere_keeps_a_consistent_prefix(engine, monkeypatch) -> None:
    monkeypatch.setattr(Session, "prefill_chunk", 8)
    ids = list(range(500, 520))  # three chunks: 8, 8, 4
    ref = {}
    for n in (8, 16, 20):  # the state after each chunk boundary, prefilled cleanly
        r = engine.session()
        r.sync(ids[:n])
        ref[n] = r.snapshot()
    s = engine.session()
    fired = 0
    for k in points(s.sync, ids, every=60):
        s.reset()
        inj = Injector(k)
        try:
            inj.run(s.sync, ids)
        except KeyboardInterrupt:
            pass
        fired += inj.fired
        n = len(s.tokens)
        assert s.tokens == ids[:n]
        if n:
            assert s.snapshot() == ref[n], f"interrupt at point {k}: {n} tokens but not their state"
        s.sync(ids)  # and it carries on from there
        assert s.snapshot() == ref[20]
    assert fired > 80


def _conversation(engine) -> Conversation:
    return Conversation(engine, mode="thinking", sampling=SamplingParams(temperature=0), max_tokens=6)


class StepInjector(Injector):
    """Counts (or fires at) injection points only inside the session's model steps, where a
    KeyboardInterrupt could land before this fix; the conversation's own bookkeeping between
    steps is protected by the stop flag instead (test_stop_flag_*)."""

    def install(self, monkeypatch) -> None:
        run = Session._run

        def traced(session, ids):
            if self.fired:
                return run(session, ids)
            sys.settrace(self)
            try:
                return run(session, ids)
            finally:
                sys.settrace(None)

        monkeypatch.setattr(Session, "_run", traced)


def test_turn_interrupted_in_any_step_then_save_switch_restore(engine, tmp_path, monkeypatch) -> None:
    """A turn interrupted inside any model step of its prefill or decode is settled, saved,
    resumed in another conversation, and the resumed KV is exactly the saved one and that of
    a clean prefill of its tokens."""
    monkeypatch.setattr(Session, "prefill_chunk", 16)
    store = SessionStore(tmp_path)
    base = _conversation(engine)
    list(base.turn("first question"))
    cp = base.session.checkpoint()
    transcript = (list(base.transcript.tokens), list(base.messages), base.transcript.text)

    def turn() -> None:
        for _ in base.turn("second question, a bit longer than the first one"):
            pass

    with monkeypatch.context() as m:
        probe = StepInjector()
        probe.install(m)
        turn()
    total = probe.n
    tried = set()
    for k in sorted({1 + (total - 1) * i // 15 for i in range(16)}):  # 16 points spread over the turn
        base.session.rollback(cp)
        base.transcript.tokens, base.transcript.messages, base.transcript.text = (
            list(transcript[0]), list(transcript[1]), transcript[2])
        with monkeypatch.context() as m:
            inj = StepInjector(k)
            inj.install(m)
            try:
                turn()
            except KeyboardInterrupt:
                base.interrupted()
        assert inj.fired
        tried.add(len(base.messages))
        live = base.session.tokens
        assert base.transcript.tokens[: len(live)] == live
        assert base.tok.decode(base.transcript.tokens) == base.transcript.text
        base.sync_for_save()
        sha = store.save(base.session, "continued")
        other = _conversation(engine)
        store.load(sha, other.session)
        other.adopt_session()
        assert other.transcript.tokens == base.transcript.tokens
        # Resumed exactly as saved, and what was saved is the state of its tokens: a clean
        # prefill of them agrees (to float rounding: it batches the tokens differently).
        assert other.session.snapshot() == base.session.snapshot()
        clean = engine.session()
        clean.sync(base.transcript.tokens)
        np.testing.assert_allclose(other.session.logits, clean.logits, rtol=1e-4, atol=1e-4)
        list(other.turn("and on"))  # the resumed conversation goes on
    assert tried == {2, 4}  # both outcomes were reached: withdrawn, and kept


def test_stop_flag_ends_the_turn_at_a_token_boundary(engine) -> None:
    conv = Conversation(engine, mode="thinking", sampling=SamplingParams(temperature=0), max_tokens=40)
    events = []
    for ev in conv.turn("tell me something"):
        events.append(ev)
        if sum(e.kind == "reasoning" for e in events) == 5:
            conv.stop.set()  # what Esc or the SIGINT handler does, from any thread
    done = events[-1]
    assert done.kind == "done" and done.finish == "interrupted"
    produced = len(conv.transcript.tokens) - len(conv.transcript.tokens[: conv.session.n_tokens])
    assert conv.stats.gen_tokens >= 5 and conv.stats.gen_tps > 0  # what was produced is counted
    assert conv.stats.total_generated == conv.stats.gen_tokens
    assert produced >= 1
    assert conv.messages[-1]["role"] == "assistant"
    conv.sync_for_save()
    assert conv.session.tokens == conv.transcript.tokens


def test_stop_during_prefill_withdraws_and_rolls_the_kv_back(engine, monkeypatch) -> None:
    monkeypatch.setattr(Session, "prefill_chunk", 8)
    conv = _conversation(engine)
    list(conv.turn("keep this"))
    conv.sync_for_save()
    kept = conv.session.snapshot()
    before = list(conv.transcript.tokens)
    events = []
    for ev in conv.turn("a long message " * 8):
        events.append(ev)
        if ev.kind == "prefill":
            conv.stop.set()
    assert events[-1].finish == "withdrawn" and sum(e.kind == "prefill" for e in events) == 1
    assert conv.transcript.tokens == before
    assert conv.session.snapshot() == kept  # the KV is back where it was: nothing to prefill again
    events = list(conv.turn("next"))
    assert events[-1].finish in ("eos", "length")
