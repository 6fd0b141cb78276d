"""Streaming markdown for a terminal that never flickers.

rich renders markdown as a whole document, and redrawing a whole long answer in a Live region
flickers and breaks scrollback. Instead, text is cut at block boundaries (a blank line outside
a code fence): finished blocks are rendered once and printed for good; only the block still
being written is redrawn, in a small live region at the bottom (at most ``live_lines`` lines,
at most ``fps`` times a second). Lines that scroll out of the live region are printed as
final. The work per token is bounded by the current block, not by the answer's length.
"""

from __future__ import annotations

import io
import time
from typing import Callable

from rich.console import Console
from rich.markdown import Markdown

_FENCES = ("```", "~~~")


def render_markdown(text: str, width: int) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="256", width=width, legacy_windows=False)
    console.print(Markdown(text, code_theme="monokai"), end="")
    lines = buf.getvalue().split("\n")
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

    def _clear_live(self) -> None:
        if self.live_height:
            self.write(f"\x1b[{self.live_height}F\x1b[J")  # up to the live region's first line, clear
            self.live_height = 0

    def _draw_live(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_draw < self.min_interval:
            return
        self.last_draw = now
        lines = render_markdown(self.tail, self.width) if self.tail.strip() else []
        self._clear_live()
        # Lines that no longer fit the live region are final: print them once.
        keep = lines[self.tail_printed :]
        if len(keep) > self.live_lines:
            for line in keep[: len(keep) - self.live_lines]:
                self.write(line + "\n")
            self.tail_printed += len(keep) - self.live_lines
            keep = keep[len(keep) - self.live_lines :]
        for line in keep:
            self.write(line + "\n")
        self.live_height = len(keep)

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
