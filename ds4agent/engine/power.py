"""`--power P` (1-100): a cap on the engine's duty cycle, for a laptop on battery.

At P percent the engine runs at about P percent of its full rate: fewer cores (on the CPU
kernels, P percent of the threads it started with, at least one) and a pause after each
forward pass. The pause makes a pass and its pause last 100/P of what the pass would take at
full power: a pass that took t seconds on fewer threads is first scaled back by how much slower
those threads make a step (measured: the mean one-token step time at each thread count, the
full count measured on the first step before any thread is taken away), so the two cuts do not
compound. Power 100 pauses never and keeps every thread. One setting per engine: every session
of it passes through it.
"""

from __future__ import annotations

import threading
import time


class PowerError(ValueError):
    """A power level out of range; one line."""


class Power:
    WEIGHT = 0.2  # of each new one-token step in the running mean of its thread count

    def __init__(self, level: int = 100, threads: tuple | None = None) -> None:
        """``threads``: (set_threads, the thread count at full power) on the CPU kernels."""
        self._threads = threads
        self._lock = threading.Lock()
        self._step: dict[int, float] = {}  # thread count -> mean seconds of a one-token step
        self._now = threads[1] if threads else 0  # the thread count in force
        self.level = 100
        self.slept = 0.0  # seconds paused, in all
        self.set(level)

    def set(self, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 100:
            raise PowerError(f"power must be an integer percentage 1..100, got {level!r}")
        with self._lock:
            self.level = level
            if self._threads is not None and (level == 100 or self._threads[1] in self._step):
                self._use_threads()  # (else after the first step, measured at full power)

    def _use_threads(self) -> None:
        set_threads, full = self._threads
        n = max(1, round(full * self.level / 100))
        if n != self._now:
            set_threads(n)
            self._now = n

    def after(self, seconds: float, tokens: int = 1) -> None:
        """A pass of ``tokens`` took ``seconds``: pause for the rest of its cycle."""
        with self._lock:
            slower = 1.0
            if self._threads is not None:
                full = self._threads[1]
                if tokens == 1 and seconds > 0:
                    old = self._step.get(self._now)
                    self._step[self._now] = seconds if old is None else old + self.WEIGHT * (seconds - old)
                if self._now != full and full in self._step and self._now in self._step:
                    slower = min(max(self._step[self._now] / self._step[full], 1.0), 8.0)
                if self.level < 100 and self._now == full and full in self._step:
                    self._use_threads()  # the full count is measured: now take threads away
            level = self.level
        if level >= 100 or seconds <= 0:
            return
        pause = max(0.0, seconds / slower * 100 / level - seconds)
        time.sleep(pause)
        self.slept += pause
