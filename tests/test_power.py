"""--power (engine/power.py): the pause after a pass is in proportion (a pass and its pause take
100/P times the pass), the CPU kernels' threads follow the level, every session of the engine
(made before or after) passes through it, out-of-range levels are one line; /power and the
status line. The rate itself is measured by bench/power.py, not here."""

from __future__ import annotations

import io

import pytest

from ds4agent.cli import main
from ds4agent.engine import Engine, EngineError, SamplingParams
from ds4agent.engine.power import Power, PowerError


def test_the_pause_and_the_threads_follow_the_level(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("ds4agent.engine.power.time.sleep", slept.append)
    p = Power(100)
    p.after(0.2)
    assert slept == []  # 100: nothing
    p.set(25)
    p.after(0.2)
    assert slept == [pytest.approx(0.6)] and p.slept == pytest.approx(0.6)  # a pass and its pause: 4 x the pass
    for bad in (0, 101, 50.0, True, "50"):
        with pytest.raises(PowerError, match="1..100"):
            p.set(bad)


def test_fewer_threads_and_the_pause_do_not_compound(monkeypatch) -> None:
    """On the CPU kernels: the full thread count's step is measured first, then threads are
    taken away, and a step made slower by that is paused for less (the rate stays P%)."""
    slept: list[float] = []
    monkeypatch.setattr("ds4agent.engine.power.time.sleep", slept.append)
    threads: list[int] = []
    p = Power(50, (threads.append, 16))
    assert threads == []  # nothing measured yet: all threads for the first step
    p.after(0.1)  # a full-power step: 0.1 s
    assert threads == [8] and slept == [pytest.approx(0.1)]
    p.after(0.15)  # on 8 threads a step takes 1.5x as long: the cycle stays 0.2 s
    assert slept[-1] == pytest.approx(0.05)
    p.after(1.0, tokens=64)  # a prefill chunk: scaled by the same measured slowdown
    assert slept[-1] == pytest.approx(1.0 / 1.5 * 2 - 1.0)
    p.set(1)
    assert threads[-1] == 1  # never fewer than one
    p.set(100)
    assert threads[-1] == 16


def test_every_session_passes_through_it(demo_path, monkeypatch, tmp_path) -> None:
    slept: list[float] = []
    monkeypatch.setattr("ds4agent.engine.power.time.sleep", slept.append)
    with Engine.open(demo_path, backend="cpu", ctx=256) as e:
        before = e.session()
        before.drafter = None
        e.set_power(50)
        after = e.session()
        for s in (before, after):
            s.sync(list(range(300, 320)))
            list(s.generate(SamplingParams(temperature=0), max_tokens=3, stop_at_eos=False))
        assert len(slept) >= 2 * 3 and e.power == 50  # a prefill and two steps each
        with pytest.raises(EngineError, match="1..100"):
            e.set_power(0)
        from ds4agent.conversation.turns import Conversation
        from ds4agent.sessions import SessionStore
        from ds4agent.ui.chat import run_pipe, status_text

        conv = Conversation(e, mode="chat", max_tokens=2)
        assert "power 50%" in status_text(conv)
        out, err = io.StringIO(), io.StringIO()
        run_pipe(conv, SessionStore(tmp_path), io.StringIO("/power 100\n/power 500\n"), out, err)
        assert e.power == 100 and "power" not in status_text(conv)
        assert "power must be an integer percentage 1..100" in err.getvalue()


def test_the_flag(demo_path, capsys) -> None:
    assert main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0", "--power", "0"]) == 2
    assert "power must be" in capsys.readouterr().err
    assert main(["-m", str(demo_path), "-p", "hi", "-n", "2", "--temp", "0", "--power", "80"]) == 0
