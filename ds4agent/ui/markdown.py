"""Streaming markdown for a terminal that never flickers.

rich renders markdown as a whole document, and redrawing a whole long answer in a Live region
flickers and breaks scrollback. Instead, text is cut at block boundaries (a blank line outside
a code fence): finished blocks are rendered once and printed for good; only the block still
being written is redrawn, in a small live region at the bottom (at most ``live_lines`` lines,
at most ``fps`` times a second). Lines that scroll out of the live region are printed as
final. The work per token is bounded by the current block, not by the answer's length.

Redrawing moves the cursor up as many rows as the live region has lines, so each line must take
exactly one row. rich wraps by its own cell widths and pads lines to the full width, but the
terminal counts cells by its own table: for Thai, Devanagari and emoji terminals disagree with
rich and with each other (per code point or per grapheme, marks as 0 or 1 cell, eager or
deferred wrap at the last column), and no width we could compute here would match them all.
A line the terminal finds one cell too wide wraps onto a second row, the cursor then stops a
row short, and that row stays in the scrollback, once more on every redraw. So the live
region is drawn with the terminal's autowrap off (DECAWM): a line takes one row whatever its
width, at worst its end is hidden until it is printed for good, with autowrap back on.
"""

from __future__ import annotations

import io
import time
from typing import Callable

from rich.console import Console
from rich.markdown import Markdown

_FENCES = ("```", "~~~")
_NO_WRAP, _WRAP = "\x1b[?7l", "\x1b[?7h"  # DECAWM reset / set


def render_markdown(text: str, width: int) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="256", width=width, legacy_windows=False)
    console.print(Markdown(text, code_theme="monokai"), end="")
    # Unstyled trailing spaces are rich's padding: invisible, but they make most lines exactly
    # as wide as the terminal, one cell of disagreement from wrapping. Styled ones (code
    # backgrounds) stay.
    lines = [line.rstrip(" ") for line in buf.getvalue().split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


class MarkdownStream:
    def __init__(self, write: Callable[[str], None], width: int = 80, live_lines: int = 6, fps: float = 20.0) -> None:
        self.write = write
        self.width = max(20, width)
        self.live_lines = live_lines
        self.min_interval = 1.0 / fps
        self.done = ""  # text of blocks already printed for good
        self.tail = ""  # text of the block being written
        self.tail_printed = 0  # lines of the tail's rendering already printed for good
        self.live_height = 0  # lines currently drawn in the live region
        self.last_draw = 0.0
        self.in_fence = False

    def _split_block(self) -> None:
        """Move every finished block from the tail to final output."""
        lines = self.tail.split("\n")
        cut = None
        offset = 0
        fence = self.in_fence
        for i, line in enumerate(lines[:-1]):  # the last line may be incomplete
            stripped = line.lstrip()
            if stripped.startswith(_FENCES):
                fence = not fence
            offset += len(line) + 1
            if not fence and not line.strip() and i > 0:
                cut, cut_fence = offset, fence
        if cut is not None:
            block = self.tail[:cut]
            self.tail = self.tail[cut:]
            self.in_fence = cut_fence
            self._clear_live()
            rendered = render_markdown(block, self.width)
            for line in rendered[self.tail_printed :]:
                self.write(line + "\n")
            self.write("\n")
            self.tail_printed = 0
            self.done += block

    def _clear_code(self) -> str:
        """Up to the live region's first line (one row a line: see the module doc), clear."""
        code = f"\x1b[{self.live_height}F\x1b[J" if self.live_height else ""
        self.live_height = 0
        return code

    def _clear_live(self) -> None:
        if code := self._clear_code():
            self.write(code)

    def _draw_live(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_draw < self.min_interval:
            return
        self.last_draw = now
        lines = render_markdown(self.tail, self.width) if self.tail.strip() else []
        out = [self._clear_code()]
        # Lines that no longer fit the live region are final: print them once, wrapping as the
        # terminal likes (the cursor never moves back over them).
        keep = lines[self.tail_printed :]
        if len(keep) > self.live_lines:
            out += [line + "\n" for line in keep[: len(keep) - self.live_lines]]
            self.tail_printed += len(keep) - self.live_lines
            keep = keep[len(keep) - self.live_lines :]
        if keep:
            # One write with autowrap switched back on at its end, so that an interrupt cannot
            # leave the user's terminal without it; one write also flushes once, not per line.
            out.append(_NO_WRAP + "".join(line + "\n" for line in keep) + _WRAP)
        self.live_height = len(keep)
        if text := "".join(out):
            self.write(text)

    def feed(self, text: str) -> None:
        self.tail += text
        if "\n" in text:
            self._split_block()
        self._draw_live()

    def finish(self) -> None:
        self._clear_live()
        if self.tail.strip():
            for line in render_markdown(self.tail, self.width)[self.tail_printed :]:
                self.write(line + "\n")
        self.done += self.tail
        self.tail = ""
        self.tail_printed = 0
