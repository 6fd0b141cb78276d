"""Streaming markdown: what ends on screen equals rendering the finished blocks, however the
text arrives, and the live region stays small."""

from __future__ import annotations

import re

from ds4agent.ui.markdown import MarkdownStream, render_markdown

DOC = """# Title

Some *emphasis* and `code` in a paragraph
that spans two lines.

```python
def f(x):

    return x + 1
```

- one
- two

Final paragraph with **bold**.
"""


class Screen:
    """Just enough of a terminal: lines, 'previous line N' + 'clear to end'."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.max_live = 0
        self.buf = ""

    def write(self, s: str) -> None:
        self.buf += re.sub(r"\x1b\[\?7[hl]", "", s)  # autowrap off/on around the live region
        while True:
            m = re.search(r"\x1b\[(\d+)F\x1b\[J", self.buf)
            nl = self.buf.find("\n")
            if m and (nl < 0 or m.start() < nl):
                n = int(m.group(1))
                self.max_live = max(self.max_live, n)
                del self.lines[len(self.lines) - n :]
                self.buf = self.buf[: m.start()] + self.buf[m.end() :]
                continue
            if nl < 0:
                break
            self.lines.append(self.buf[:nl])
            self.buf = self.buf[nl + 1 :]


def _expected(doc: str, width: int) -> list[str]:
    blocks = ["# Title\n\n", "Some *emphasis* and `code` in a paragraph\nthat spans two lines.\n\n",
              "```python\ndef f(x):\n\n    return x + 1\n```\n\n", "- one\n- two\n\n", "Final paragraph with **bold**.\n"]
    assert "".join(blocks) == doc
    out = []
    for i, b in enumerate(blocks):
        out += render_markdown(b, width) + ([""] if i < len(blocks) - 1 else [])
    return out


def test_char_by_char_equals_block_rendering() -> None:
    for step in (1, 3, 17):
        screen = Screen()
        md = MarkdownStream(screen.write, width=60, live_lines=4, fps=1e9)
        for i in range(0, len(DOC), step):
            md.feed(DOC[i : i + step])
        md.finish()
        assert screen.lines == _expected(DOC, 60), step
        assert screen.max_live <= 4


def test_blank_line_inside_a_fence_does_not_split() -> None:
    screen = Screen()
    md = MarkdownStream(screen.write, width=60, fps=1e9)
    md.feed("```\na\n\nb\n")
    assert md.in_fence is False and "```" in md.tail  # still one open block
    md.feed("```\n\nafter\n")
    md.finish()
    assert any("after" in ln for ln in screen.lines)


def test_long_block_scrolls_out_of_the_live_region() -> None:
    screen = Screen()
    md = MarkdownStream(screen.write, width=40, live_lines=3, fps=1e9)
    code = "```\n" + "".join(f"line {i}\n" for i in range(50)) + "```\n"
    for ch in code:
        md.feed(ch)
    md.finish()
    text = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in screen.lines)
    assert all(f"line {i}" in text for i in range(50))
    assert screen.max_live <= 3
