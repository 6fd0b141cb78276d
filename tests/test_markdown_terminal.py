"""Streaming markdown through an emulated terminal: the rows it leaves on screen and in the
scrollback equal printing the finished rendering once, whatever widths the terminal gives
Thai, Devanagari, CJK, emoji and combining marks.

The renderer cannot know those widths: rich wraps by its own table, and terminals disagree
with it and with each other (per code point, per grapheme, eager or deferred wrap at the last
column). So each model below is a terminal that a user may have, not a reference to match.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
from rich.cells import cell_len

from ds4agent.ui.markdown import MarkdownStream, render_markdown

BLOCKS = [
    "# หัวข้อ ภาษาไทย และ हिन्दी शीर्षक\n\n",
    "สวัสดีครับ ผู้ใหญ่ น้ำ ที่นี่ กำลัง เรียน ภาษาไทย สวัสดีครับ ผู้ใหญ่ น้ำ ที่นี่ กำลัง เรียน\n"
    "และ ต่อ บรรทัด ที่สอง ของ ย่อหน้า นี้\n\n",
    "नमस्ते दुनिया क्षत्रिय हिन्दी भाषा में लिखा गया पाठ नमस्ते दुनिया क्षत्रिय हिन्दी भाषा\n\n",
    "中文字符混合排版测试中文字符混合排版测试中文字符混合排版测试 and ｆｕｌｌｗｉｄｔｈ text\n\n",
    "Emoji 👍🏽 family 👨‍👩‍👧 heart ❤️ smile ☺️ flag 🇹🇭 again 👍🏽 👨‍👩‍👧 ❤️ ☺️ 🇹🇭 and e\u0301 a\u0308 n\u0303\n\n",
    "- รายการ หนึ่ง with `โค้ด`\n- सूची दो 中文 👍🏽\n\n",
    "```\n" + "".join(f"{i}\tไทย हिन्दी 中文 👨‍👩‍👧 ❤️ e\u0301\n" for i in range(12)) + "```\n\n",
    "Last **ตัวหนา** paragraph नमस्ते.\n",
]
DOC = "".join(BLOCKS)
WIDTH = 40


def _plain_width(c: str) -> int:
    """One code point as a terminal with a plain wcwidth would count it (xterm-like)."""
    if unicodedata.category(c) in ("Mn", "Me", "Cf") or "\ufe00" <= c <= "\ufe0f":
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _graphemes(text: str) -> list[str]:
    """Enough grapheme clustering for the test text: marks, variation selectors and ZWJ
    sequences stay with their base character."""
    out: list[str] = []
    for c in text:
        joined = out and (out[-1].endswith("\u200d") or c == "\u200d" or "\ufe00" <= c <= "\ufe0f"
                          or unicodedata.category(c) in ("Mn", "Me", "Mc") or "\U0001f3fb" <= c <= "\U0001f3ff")
        if joined:
            out[-1] += c
        else:
            out.append(c)
    return out


def _per_code_point(text: str) -> list[tuple[str, int]]:
    return [(c, _plain_width(c)) for c in text]


def _like_rich(text: str) -> list[tuple[str, int]]:
    return [(g, cell_len(g)) for g in _graphemes(text)]


def _grapheme_terminal(text: str) -> list[tuple[str, int]]:
    """A grapheme-aware terminal: a cluster is 2 cells if any part is wide or it asks for
    emoji presentation, else 1 (spacing marks included)."""
    return [(g, 2 if "\ufe0f" in g or any(_plain_width(c) == 2 for c in g) else 1) for g in _graphemes(text)]


class Term:
    """A small VT terminal: a screen of fixed size over a scrollback, autowrap (DECAWM) with
    deferred or eager wrap at the last column, ONLCR newlines, CPL and ED. It refuses any
    other control sequence so that a new one in the renderer cannot pass unmodelled."""

    TOKEN = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|([\n\r\t])|([^\x1b\n\r\t]+)")

    def __init__(self, cells, cols: int = WIDTH, rows: int = 24, eager_wrap: bool = False) -> None:
        self.cells, self.cols, self.rows, self.eager = cells, cols, rows, eager_wrap
        self.history: list[list[str]] = []
        self.screen = [[""] * cols for _ in range(rows)]
        self.x = self.y = 0
        self.pending = False  # deferred wrap: the last column was just written
        self.autowrap = True

    def _linefeed(self) -> None:
        self.x, self.pending = 0, False
        if self.y == self.rows - 1:
            self.history.append(self.screen.pop(0))
            self.screen.append([""] * self.cols)
        else:
            self.y += 1

    def _put(self, g: str, w: int) -> None:
        row = self.screen[self.y]
        if w == 0:  # a mark joins the cell before it
            x = self.x if self.pending else max(self.x - 1, 0)
            row[x] += g
            return
        if self.pending and self.autowrap:
            self._linefeed()
            row = self.screen[self.y]
        self.pending = False
        if self.x + w > self.cols:
            if self.autowrap:
                self._linefeed()
                row = self.screen[self.y]
            else:
                self.x = self.cols - w  # no autowrap: overwrite at the right margin
        row[self.x] = g
        for i in range(1, w):
            row[self.x + i] = ""
        if self.x + w < self.cols:
            self.x += w
        elif self.autowrap and self.eager:
            self._linefeed()
        else:
            self.x = self.cols - 1
            self.pending = self.autowrap

    def feed(self, data: str) -> None:
        for m in self.TOKEN.finditer(data):
            params, final, ctl, text = m.groups()
            if text is not None:
                for g, w in self.cells(text):
                    self._put(g, w)
            elif ctl == "\n":
                self._linefeed()
            elif ctl == "\r":
                self.x, self.pending = 0, False
            elif ctl == "\t":
                self.x, self.pending = min((self.x // 8 + 1) * 8, self.cols - 1), False
            elif final is None:
                pass  # OSC (hyperlinks): no cells
            elif final == "m":
                pass  # colours: no cells
            elif final == "F":
                self.y, self.x, self.pending = max(self.y - int(params or 1), 0), 0, False
            elif final == "J" and params in ("", "0"):
                self.screen[self.y][self.x :] = [""] * (self.cols - self.x)
                for r in range(self.y + 1, self.rows):
                    self.screen[r] = [""] * self.cols
            elif final in "hl" and params == "?7":
                self.autowrap = final == "h"
            else:
                raise AssertionError(f"unmodelled control sequence {m.group(0)!r}")

    def text(self) -> list[str]:
        rows = ["".join(r).rstrip() for r in self.history + self.screen]
        while rows and not rows[-1]:
            rows.pop()
        return rows


def _spacing_marks(text: str) -> list[tuple[str, int]]:
    """A terminal without complex-script support: every mark takes a cell of its own."""
    return [(c, 2 if _plain_width(c) == 2 else 0 if c == "\u200d" or "\ufe00" <= c <= "\ufe0f" else 1) for c in text]


def _wcwidth_library(text: str) -> list[tuple[str, int]]:
    """The installed wcwidth (prompt_toolkit's): per grapheme where it can, else per code point."""
    import wcwidth

    if hasattr(wcwidth, "iter_graphemes"):
        return [(g, max(wcwidth.width(g), 0)) for g in wcwidth.iter_graphemes(text)]
    return [(c, max(wcwidth.wcwidth(c), 0)) for c in text]


TERMINALS = {
    "agrees with rich": dict(cells=_like_rich),
    "agrees with rich, eager wrap": dict(cells=_like_rich, eager_wrap=True),
    "per code point": dict(cells=_per_code_point),
    "per grapheme": dict(cells=_grapheme_terminal),
    "marks take a cell": dict(cells=_spacing_marks),
    "wcwidth library": dict(cells=_wcwidth_library),
}


def _streamed(step: int) -> str:
    written: list[str] = []
    md = MarkdownStream(written.append, width=WIDTH, live_lines=6, fps=1e9)
    for i in range(0, len(DOC), step):
        md.feed(DOC[i : i + step])
    md.finish()
    return "".join(written)


def _one_shot() -> str:
    lines: list[str] = []
    for i, block in enumerate(BLOCKS):
        lines += render_markdown(block, WIDTH) + ([""] if i < len(BLOCKS) - 1 else [])
    return "".join(line + "\n" for line in lines)


@pytest.fixture(scope="module")
def streams() -> dict[int, str]:
    return {step: _streamed(step) for step in (1, 3, 11)}


@pytest.mark.parametrize("name", TERMINALS)
def test_streamed_rows_equal_one_shot_rows(name: str, streams: dict[int, str]) -> None:
    expected = Term(**TERMINALS[name])
    expected.feed(_one_shot())
    want = expected.text()
    for step, data in streams.items():
        term = Term(**TERMINALS[name])
        term.feed(data)
        got = term.text()
        extra = [row for row in set(got) if row and got.count(row) > want.count(row)]
        assert not extra, f"{name}, {step} chars a token: rows repeated in the scrollback: {extra[:3]}"
        assert got == want, f"{name}, {step} chars a token"


def test_the_text_reaches_the_terminal() -> None:
    """The comparison above is between two emulations; check the emulated screen holds the
    words, so that a model dropping text could not make it pass."""
    term = Term(cells=_per_code_point)
    term.feed(_one_shot())
    screen = "\n".join(term.text())
    for word in ("ภาษาไทย", "क्षत्रिय", "中文字符混合排版测试", "ｆｕｌｌｗｉｄｔｈ", "Last"):
        assert word in screen


def test_autowrap_is_back_on_after_every_write() -> None:
    """The live region turns autowrap off; each write that does so turns it on again at its
    end, so an interrupt between writes never leaves the user's terminal without it."""
    written: list[str] = []
    md = MarkdownStream(written.append, width=WIDTH, live_lines=3, fps=1e9)
    for i in range(0, len(DOC), 5):
        md.feed(DOC[i : i + 5])
    md.finish()
    turned_off = [w for w in written if "\x1b[?7l" in w]
    assert turned_off
    assert all(w.endswith("\x1b[?7h") and w.rfind("\x1b[?7l") < w.rfind("\x1b[?7h") for w in turned_off)
