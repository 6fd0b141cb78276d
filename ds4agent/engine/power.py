"""`--power P` (1-100): a cap on the engine's duty cycle, for a laptop on battery.

At P percent the engine works P of every 100 seconds: after each forward pass that took t
seconds it sleeps t * (100 - P) / P, so a pass and its pause together take t * 100 / P (power
50 halves the rate; 100 sleeps never and changes nothing). On the CPU kernels it also runs
with P percent of the kernel threads it started with (at least one), so fewer cores wake. One
setting per engine: every session of it (a server's slots too) passes through it.
"""

from __future__ import annotations

import threading
import time


class PowerError(ValueError):
    """A power level out of range; one line."""


class Power:
    def __init__(self, level: int = 100, threads: tuple | None = None) -> None:
        """``threads``: (set_threads, the thread count at full power) on the CPU kernels."""
        self._threads = threads
        self._lock = threading.Lock()
        self.level = 100
        self.slept = 0.0  # seconds paused, in all
        self.set(level)

    def set(self, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 100:
            raise PowerError(f"power must be an integer percentage 1..100, got {level!r}")
        with self._lock:
            self.level = level
            if self._threads is not None:
                set_threads, full = self._threads
                set_threads(max(1, round(full * level / 100)))

    def after(self, seconds: float) -> None:
        """A pass took ``seconds``: pause for the rest of its cycle."""
        level = self.level
        if level >= 100 or seconds <= 0:
            return
        pause = seconds * (100 - level) / level
        time.sleep(pause)
        self.slept += pause

    def describe(self) -> str:
        return f"power {self.level}%"
