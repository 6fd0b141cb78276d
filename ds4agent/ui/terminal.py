"""Terminal output for every front end (chat, agent, one-shot, headless): the colours, ds4's own
one-line notes, progress lines, and the rendering of a turn's events (reasoning dim, the answer
as markdown, tool lines and diffs). Colours and markdown only on a terminal; in a pipe, ds4's
own notes go to stderr so that stdout carries only the answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import IO, Callable, Iterable

from ..conversation import ContextError, Event
from .markdown import MarkdownStream

GREY, CYAN, RED, GREEN, YELLOW, BOLD, RESET = ("\x1b[38;5;245m", "\x1b[36m", "\x1b[31m", "\x1b[32m", "\x1b[33m",
                                              "\x1b[1m", "\x1b[0m")
CLEAR_LINE = "\r\x1b[K"
ID_CHARS = 12  # hex digits of a session id shown anywhere (/save, /list, /switch, the agent's picker)


def short_count(n: int) -> str:
    """1234 -> "1.2k": token counts in lists and the status line."""
    return str(n) if n < 1000 else (f"{n // 1000}k" if n % 1000 == 0 else f"{n / 1000:.1f}k")


def ago(t: int) -> str:
    d = max(0, int(time.time()) - t)
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= secs:
            return f"{d // secs}{unit} ago"
    return "just now"


@dataclass
class Out:
    """Where a front end writes. ``err`` set: notes go there (pipe and headless modes)."""

    stream: IO[str]
    tty: bool
    width: int = 80
    err: IO[str] | None = None
    errors: int = 0

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def line(self, text: str = "", color: str = "") -> None:
        self.write((color + text + RESET if color and self.tty else text) + "\n")

    def note(self, text: str, error: bool = False) -> None:
        """A one-line message from ds4 itself."""
        self.errors += error
        if self.err is not None:
            self.err.write(f"ds4: {text}\n")
            self.err.flush()
        else:
            self.line(f"ds4: {text}", GREY)

    def progress(self, text: str) -> None:
        """A line that the next progress line or output replaces (terminal only)."""
        if self.tty:
            self.write(f"\r{CYAN}{text}{RESET}\x1b[K")


def color_diff(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            out.append(f"{BOLD}{line}{RESET}")
        elif line.startswith("+"):
            out.append(f"{GREEN}{line}{RESET}")
        elif line.startswith("-"):
            out.append(f"{RED}{line}{RESET}")
        elif line.startswith("@@"):
            out.append(f"{CYAN}{line}{RESET}")
        else:
            out.append(line)
    return "\n".join(out)


OUTPUT_TAIL = 5  # lines of a command's output shown under it; the rest is a key away
EXPAND_HINT = "Ctrl+O or /output shows all"


def output_tail(text: str, tty: bool, lines: int = OUTPUT_TAIL, hint: str = EXPAND_HINT) -> str:
    """The last lines of a command's output, collapsed under its tool line: what ran is seen,
    without the whole output pushing the conversation off the screen."""
    body = text.rstrip("\n").splitlines()
    if not body:
        return ""
    shown = body[-lines:]
    out = []
    if len(body) > lines:
        out.append(f"  … {len(body) - lines} earlier line{'s' if len(body) - lines > 1 else ''} ({hint})")
    out += ["  │ " + (ln if len(ln) <= 400 else ln[:400] + " …") for ln in shown]
    text = "\n".join(out)
    return (GREY + text + RESET if tty else text) + "\n"


def stop_note(finish: str) -> str | None:
    """The note shown when a turn ended early (Event.finish)."""
    return {"interrupted": "interrupted", "withdrawn": "interrupted; your message was withdrawn",
            "length": "stopped at the token limit (-n)", "context": "stopped: the context is full"}.get(finish)


class Renderer:
    """Streams one answer: reasoning dim (or hidden), the answer as markdown on a terminal."""

    def __init__(self, out: Out, show_thinking: bool) -> None:
        self.out = out
        self.show_thinking = show_thinking
        self.md = MarkdownStream(out.write, out.width) if out.tty else None
        self.in_reasoning = False
        self.started_answer = False
        self.progress_shown = False
        self.reasoning_chars = 0

    def prefill(self, done: int, total: int, started: float) -> None:
        if not self.out.tty:
            return
        frac = done / total if total else 1.0
        cells = 24
        filled = max(1, int(frac * cells))
        elapsed = time.perf_counter() - started
        eta = f" ETA {elapsed / frac - elapsed:.0f}s" if 0 < frac < 1 and elapsed > 0.5 else ""
        self.out.progress(f"prefill [{'█' * filled}{'░' * (cells - filled)}] {done}/{total} {100 * frac:.0f}%{eta}")
        self.progress_shown = True

    def _end_progress(self) -> None:
        if self.progress_shown:
            self.out.write(CLEAR_LINE)
            self.progress_shown = False

    def reasoning(self, text: str) -> None:
        self._end_progress()
        if not self.show_thinking:
            self.reasoning_chars += len(text)
            if self.out.tty:
                self.out.write(f"\r{GREY}thinking… {self.reasoning_chars} chars{RESET}\x1b[K")
            return
        if not self.in_reasoning:
            self.in_reasoning = True
            if self.out.tty:
                self.out.write(GREY)
        self.out.write(text)

    def content(self, text: str) -> None:
        self._end_progress()
        if self.in_reasoning or (not self.show_thinking and self.reasoning_chars):
            if self.out.tty:
                self.out.write(RESET + (CLEAR_LINE if not self.show_thinking else "\n\n"))
            elif self.show_thinking:
                self.out.write("\n\n")
            self.in_reasoning = False
            self.reasoning_chars = 0
        if not self.started_answer:
            text = text.lstrip()  # the answer's leading blank lines add nothing
            if not text:
                return
            self.started_answer = True
        if self.md:
            self.md.feed(text)
        else:
            self.out.write(text)

    def finish(self, note: str | None = None) -> None:
        self._end_progress()
        if self.in_reasoning:
            self.out.write((RESET if self.out.tty else "") + "\n")  # ended while still reasoning
        if self.md:
            self.md.finish()
        elif self.started_answer:
            self.out.write("\n")
        if note:
            self.out.note(note)
        if self.out.tty:
            self.out.write("\n")  # a blank line before the next prompt


class TurnView:
    """Shows the events of one chat turn or one agent run, in order, as they come."""

    def __init__(self, out: Out, show_thinking: bool) -> None:
        self.out, self.show_thinking = out, show_thinking
        self.r = Renderer(out, show_thinking)
        self.started = time.perf_counter()
        self.note: str | None = None  # why it stopped early, shown at the end
        self.expand_hint = EXPAND_HINT if out.tty else "the JSON output formats carry it all"

    def _next_block(self) -> None:
        self.r.finish()
        self.r = Renderer(self.out, self.show_thinking)

    def event(self, ev: Event) -> None:
        out, k = self.out, ev.kind
        if k == "prefill":
            self.r.prefill(ev.done, ev.total, self.started)
        elif k == "reasoning":
            self.r.reasoning(ev.text)
        elif k == "content":
            self.r.content(ev.text)
        elif k == "call_start":
            self._next_block()
        elif k in ("tool", "refused"):
            self.r.finish()
            mark, color = ("🛠️ ", GREEN if ev.ok else RED) if k == "tool" else ("✗ ", RED)
            out.line(mark + ev.text, color)
            if ev.detail:
                out.write((color_diff(ev.detail) if out.tty else ev.detail).rstrip("\n") + "\n")
            output = (ev.data or {}).get("output")
            if output:
                out.write(output_tail(output, out.tty, hint=self.expand_hint))
            self.r = Renderer(out, self.show_thinking)
        elif k == "compacted":
            out.note(f"context compacted; summary: {ev.text}")
        elif k == "attached":
            out.note(f"attached {ev.text}")
        elif k in ("note", "compact_failed"):
            out.note(ev.text)
        elif k == "error":
            out.note(ev.text, error=True)
        elif k == "interrupted":
            self.note = stop_note(ev.text)
        elif k == "done":
            if ev.finish:  # a chat turn
                self.note = stop_note(ev.finish)
            elif ev.text:  # an agent run that stopped for a reason worth saying
                self._next_block()
                out.note(ev.text)

    def finish(self, note: str | None = None) -> None:
        self.r.finish(note or self.note)


def run_events(events: Iterable[Event], out: Out, show_thinking: bool, settle: Callable[[], str],
               on_step: Callable[[], None] | None = None) -> None:
    """Show a turn's or a run's events. Esc / Ctrl+C normally only set the conversation's stop
    flag and the events end on their own; a KeyboardInterrupt that lands anyway (pipe mode) is
    settled by ``settle`` (Conversation.interrupted: "rolled back" or "kept")."""
    view = TurnView(out, show_thinking)
    try:
        for ev in events:
            view.event(ev)
            if on_step:
                on_step()
        view.finish()
    except KeyboardInterrupt:
        view.r.finish(stop_note("withdrawn" if settle() == "rolled back" else "interrupted"))
    except ContextError as e:
        view.finish()
        out.note(str(e), error=True)
