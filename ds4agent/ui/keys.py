"""Keys typed while the model works: Esc interrupts the answer, anything else is queued.

prompt_toolkit only owns the keyboard while a prompt is shown. During a turn this watcher puts
the terminal in cbreak mode (no echo, key by key) and reads it from a thread: Esc sets the
turn's stop flag; typed lines are kept, in order, for the prompts that follow; an unfinished
line becomes the next prompt's starting text. Ctrl+C (SIGINT) sets the same flag while a turn
runs (``stop_on_sigint``) instead of raising KeyboardInterrupt wherever the main thread happens
to be: the turn ends at the next token boundary, never halfway through a model step.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

_ACTIVE: "KeyWatcher | None" = None


@contextmanager
def suspended() -> Iterator[None]:
    """Give the keyboard back (for a question asked in the middle of a turn)."""
    w = _ACTIVE
    if w is None:
        yield
        return
    w._halt()
    try:
        yield
    finally:
        w._start()


@contextmanager
def stop_on_sigint(stop: threading.Event) -> Iterator[None]:
    """While the block runs, Ctrl+C sets ``stop`` rather than raising KeyboardInterrupt.

    Outside the main thread (where signal handlers cannot be installed) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class KeyWatcher:
    def __init__(self, on_escape: Callable[[], None], fd: int | None = None,
                 on_key: dict[str, Callable[[], None]] | None = None) -> None:
        self.on_escape = on_escape
        self.on_key = on_key or {}  # control characters with a meaning of their own (Ctrl+O: "\x0f")
        self.fd = sys.stdin.fileno() if fd is None else fd
        self.queued: list[str] = []
        self.partial = ""
        self.escaped = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved = None

    def __enter__(self) -> "KeyWatcher":
        global _ACTIVE
        self._start()
        _ACTIVE = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        self._halt()

    def _start(self) -> None:
        try:
            import termios
            import tty

            if not os.isatty(self.fd):
                return
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        except (ImportError, OSError, ValueError):
            self._saved = None
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
        if self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def _read(self) -> None:
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 1024)
            except OSError:
                return
            if not data:
                return
            text = decoder.decode(data)
            i = 0
            while i < len(text):
                ch = text[i]
                i += 1
                if ch == "\x1b":
                    if i < len(text) and text[i] in "[O":  # an arrow or function key: skip it
                        i += 1
                        while i < len(text) and not (text[i].isalpha() or text[i] == "~"):
                            i += 1
                        i += 1
                        continue
                    self.escaped = True  # a lone Esc
                    self.on_escape()
                elif ch in self.on_key:
                    self.on_key[ch]()
                elif ch in "\r\n":
                    if self.partial.strip():
                        self.queued.append(self.partial)
                    self.partial = ""
                elif ch in "\x7f\x08":
                    self.partial = self.partial[:-1]
                elif ch == "\x15":  # Ctrl+U
                    self.partial = ""
                elif ch >= " " or ch == "\t":
                    self.partial += ch
