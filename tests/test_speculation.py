"""Speculative decoding (engine/session.py speculate, engine/sampler.py check, engine/drafts.py):
proposed tokens verified in one pass must change nothing but the number of passes. Greedy: the
same tokens and the same saved session as plain decoding, whatever the proposals (right, wrong,
partly right), across compressor windows (ratio 4 and 128) and the token limit; sampling: each
token with exactly the probability a plain draw gives it (a chi-square test of the acceptance
rule); the n-gram drafter proposes what followed the last tokens and backs off."""

from __future__ import annotations

import numpy as np
import pytest

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.drafts import NgramDrafter, Pace, drafter
from ds4agent.engine.sampler import Sampler

GREEDY = SamplingParams(temperature=0)
EAGER = dict(margin=float("inf"), warmup=0)  # a Pace that always asks (the tests count proposals)


class Scripted:
    """Proposes the true continuation (known from a plain run) with mistakes planted: every
    third proposal has its ``wrong``-th token changed; proposals of ``k`` tokens."""

    name = "scripted"

    def __init__(self, truth: list[int], start: int, k: int, wrong: int) -> None:
        self.truth, self.start, self.k, self.wrong = truth, start, k, wrong
        self.calls = self.kept = 0

    def propose(self, history, n: int, token: int, most: int) -> list[int]:
        at = n + 1 - self.start  # tokens generated so far, the last one included
        out = list(self.truth[at : at + min(self.k, most)])
        self.calls += 1
        if out and self.calls % 3 == 0 and self.wrong < len(out):
            out[self.wrong] = (out[self.wrong] + 1) % 1000 + 5
        return out

    def feedback(self, proposed: int, kept: int) -> None:
        self.kept += kept


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=512) as e:
        yield e


def _plain(engine, prompt: list[int], n: int, params: SamplingParams = GREEDY) -> tuple[list[int], bytes]:
    s = engine.session()
    s.sync(prompt)
    toks = [st.token for st in s.generate(params, max_tokens=n, stop_at_eos=False)]
    return toks, s.snapshot()


@pytest.mark.parametrize("length,k,wrong", [(5, 4, 0), (100, 3, 1), (120, 6, 2), (250, 5, 4)])
def test_greedy_speculation_gives_plain_decoding(engine, length: int, k: int, wrong: int) -> None:
    """Prompts ending before and across the 128-token compressor window (and the ratio-4 ones,
    and the indexer's limit), proposals right, wrong at their first token, or later."""
    prompt = np.random.default_rng(length).integers(1000, 100000, length).tolist()
    n = 40
    want, blob = _plain(engine, prompt, n)
    s = engine.session()
    s.sync(prompt)
    s.drafter, s.pace = (d := Scripted(want, len(prompt), k, wrong)), Pace(**EAGER)
    got = [st.token for st in s.generate(GREEDY, max_tokens=n, stop_at_eos=False)]
    assert got == want
    assert s.snapshot() == blob  # rejected proposals leave no trace, the last token is not evaluated
    assert d.kept > n // 3  # most passes verified several tokens


def test_proposals_stop_before_the_token_limit_and_the_context(engine) -> None:
    prompt = list(range(100, 130))
    want, blob = _plain(engine, prompt, 9)
    s = engine.session()
    s.sync(prompt)
    s.drafter = Scripted(want + [7] * 50, len(prompt), 20, 99)
    assert [st.token for st in s.generate(GREEDY, max_tokens=9, stop_at_eos=False)] == want
    assert s.snapshot() == blob
    # Near the context's end: the same finish as plain decoding.
    small = engine.session(ctx=40)
    small.sync(prompt)
    plain = [(st.token, st.finish) for st in small.generate(GREEDY, max_tokens=50, stop_at_eos=False)]
    spec = engine.session(ctx=40)
    spec.sync(prompt)
    spec.drafter = Scripted([t for t, _ in plain] + [7] * 50, len(prompt), 8, 99)
    assert [(st.token, st.finish) for st in spec.generate(GREEDY, max_tokens=50, stop_at_eos=False)] == plain
    assert plain[-1][1] == "context" and spec.snapshot() == small.snapshot()


def test_sampled_acceptance_keeps_each_tokens_probability() -> None:
    """Sampler.check against plain draws, for a draft that is likely, unlikely and outside the
    kept set: chi-square over the 5 candidates of top-k 5 at 20 000 draws each (the 0.1%
    critical value for 4 degrees of freedom is 18.5: a true rule fails 1 run in 1 000 with
    this seed fixed, a rule that keeps the draft too often by 0.05 fails almost surely)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=50).astype(np.float32) * 2
    params = SamplingParams(temperature=0.9, top_k=5, seed=11)
    tokens, w = Sampler(params).candidates(logits)
    p = dict(zip(tokens.tolist(), (w / w.sum()).tolist()))
    order = sorted(p, key=lambda t: -p[t])
    N = 20000
    for draft in (order[0], order[3], int(np.argmin(logits))):
        s = Sampler(params)
        counts = dict.fromkeys(p, 0)
        for _ in range(N):
            r = s.check(logits, draft)
            counts[draft if r is None else r] += 1
        chi2 = sum((counts[t] - N * p[t]) ** 2 / (N * p[t]) for t in p)
        assert chi2 < 18.5, (draft, chi2, counts)
    assert Sampler(GREEDY).check(logits, int(np.argmax(logits))) is None
    assert Sampler(GREEDY).check(logits, order[1]) == int(np.argmax(logits))


def test_sampled_generation_with_proposals_runs_to_its_end(engine) -> None:
    prompt = list(range(200, 260))
    want, _ = _plain(engine, prompt, 30)
    s = engine.session()
    s.sync(prompt)
    s.drafter = Scripted(want, len(prompt), 4, 1)
    steps = list(s.generate(SamplingParams(temperature=0.8, top_p=0.9, seed=3), max_tokens=30, stop_at_eos=False))
    assert [st.index for st in steps] == list(range(30)) and steps[-1].finish == "length"
    assert s.tokens == prompt + [st.token for st in steps[:-1]]


def test_ngram_drafter_proposes_what_followed_and_backs_off() -> None:
    d = NgramDrafter(order=3, start=3, most=5, pause_after=2, pause=3)
    history = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2]
    assert d.propose(history, len(history), 3, 10) == [4, 5, 6]  # after the earlier 1 2 3
    d.feedback(3, 3)
    assert d.k == 4
    history += [3]
    assert d.propose(history, len(history), 4, 10) == [5, 6, 9, 9]  # 2 3 4 -> what followed, 4 now
    assert d.propose([1, 2, 1, 2], 4, 1, 10) == [2, 1]  # a repeat reaching the end: then the token
    other = [7, 8, 10]
    assert d.propose(other, 3, 11, 10) == []  # another conversation: no repeat
    d.feedback(4, 1)
    assert d.k == 2
    for _ in range(2):
        d.feedback(2, 0)
    assert d.propose(history, 10, 3, 10) == []  # paused after two proposals kept nothing
    assert [d.propose(history, 10, 3, 10) for _ in range(3)][-1] == [4, 5]  # tries again after the pause
    assert d.propose(history, 10, 3, 1) == [4]  # no more than asked for
    assert drafter("off") is None and isinstance(drafter("ngram"), NgramDrafter)
    with pytest.raises(ValueError, match="needs the MTP file"):
        drafter("mtp")
    with pytest.raises(ValueError, match="unknown --speculate"):
        drafter("fast")


def test_the_flag_and_its_setting(demo_path, monkeypatch, capsys) -> None:
    from ds4agent.cli import main

    monkeypatch.delenv("DS4_SPECULATE", raising=False)
    assert main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0", "--speculate", "mtp"]) == 2
    assert "needs the MTP file" in capsys.readouterr().err
    monkeypatch.setenv("DS4_SPECULATE", "fast")
    assert main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0"]) == 2
    assert "speculate must be one of off, ngram, mtp, dspark" in capsys.readouterr().err
    monkeypatch.setenv("DS4_SPECULATE", "off")
    assert main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0"]) == 0
    with Engine.open(demo_path, backend="cpu", ctx=64) as e:
        assert e.session().drafter is None  # the library speculates only when asked
        e.set_speculation("ngram")
        assert isinstance(e.session().drafter, NgramDrafter)


def test_a_batcher_session_speculates_while_alone(engine) -> None:
    """Through a batcher (a server slot): verification passes run on its thread; alone, the
    proposals are verified; beside another generating session, the steps batch. Both ways the
    tokens and the saved session are plain decoding's."""
    import threading

    from ds4agent.engine import Batcher

    prompts = [list(range(300, 340)), list(range(500, 520))]
    plain = [_plain(engine, p, 24) for p in prompts]
    b = Batcher()
    try:
        sessions = []
        for p, (truth, _) in zip(prompts, plain):
            s = engine.session()
            s.batcher = b
            s.sync(p)
            s.drafter, s.pace = Scripted(truth, len(p), 4, 1), Pace(**EAGER)
            sessions.append(s)
        alone = [st.token for st in sessions[0].generate(GREEDY, max_tokens=24, stop_at_eos=False)]
        assert alone == plain[0][0] and sessions[0].snapshot() == plain[0][1]
        assert sessions[0].drafter.kept > 8 and b.stats.steps < 24  # proposals were verified
        sessions[0].reset()
        sessions[0].sync(prompts[0])
        sessions[0].drafter = Scripted(plain[0][0], len(prompts[0]), 4, 1)
        got: list = [None, None]

        def run(k: int) -> None:
            got[k] = [st.token for st in sessions[k].generate(GREEDY, max_tokens=24, stop_at_eos=False)]

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert got == [plain[0][0], plain[1][0]]
        assert [s.snapshot() for s in sessions] == [plain[0][1], plain[1][1]]
        assert b.stats.widest == 2
    finally:
        b.close()


def test_proposals_pause_while_passes_are_slower_than_steps() -> None:
    """Pace: no proposal before three plain steps are timed; passes slower per token than
    steps pause proposals, each pause twice the last; passes that pay keep them going."""
    p = Pace(hold=4, longest=8)
    assert not p.allow()
    for _ in range(3):
        p.step(0.1)
    assert p.allow()
    for _ in range(4):
        p.verified(0.3, 2)  # 0.15 s per token against 0.1
    assert p.pauses == 1 and [p.allow() for _ in range(5)] == [False] * 4 + [True]
    for _ in range(4):
        p.verified(0.3, 2)
    assert p.pauses == 2 and [p.allow() for _ in range(9)] == [False] * 8 + [True]  # twice as long
    for _ in range(4):
        p.verified(0.12, 2)  # 0.06 s per token: proposals pay
    assert p.pauses == 2 and p.allow()
    for _ in range(4):
        p.verified(0.6, 2)  # slower again: a pause of the first length (the last ones paid)
    assert p.pauses == 3 and [p.allow() for _ in range(5)] == [False] * 4 + [True]
