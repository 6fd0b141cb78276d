"""Answer extractors of `ds4 eval`: from a model's answer, the thing a case compares (a choice
letter, an integer, an exact text, a set of lines, a code block), each with its own self-test.

Models answer in prose: the extractors look first at what follows the last "Answer:" (any
case, markdown emphasis allowed), else at the last line that has anything, and take the last
candidate there (a conclusion comes after the working). They never guess beyond that: an answer
without a candidate extracts to None, which grades as wrong.
"""

from __future__ import annotations

import re
from typing import Callable

_ANSWER = re.compile(r"(?:\*\*|__)?\s*(?:final\s+)?answer\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(\w*)[^\n]*\n(.*?)```", re.DOTALL)


def conclusion(text: str) -> str:
    """What follows the last "Answer:" marker, else the last non-empty line (fenced code and
    markdown emphasis left out)."""
    text = _FENCE.sub("", text)
    marks = list(_ANSWER.finditer(text))
    if marks:
        return text[marks[-1].end():].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _plain(text: str) -> str:
    return re.sub(r"[*_`]", "", text).strip()


def choice(text: str) -> str | None:
    """The last standalone capital letter A-E of the conclusion ("C", "(C)", "C) 59", "**B**")."""
    found = re.findall(r"(?<![A-Za-z])([A-E])(?![A-Za-z])", _plain(conclusion(text)))
    return found[-1] if found else None


def integer(text: str) -> str | None:
    """The last integer of the conclusion, thousands separators removed ("1,591" -> "1591")."""
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", _plain(conclusion(text)))
    for f in reversed(found):
        f = f.replace(",", "")
        if "." in f:
            whole, frac = f.split(".", 1)
            if set(frac) != {"0"}:
                continue  # 2.5 is not an integer answer
            f = whole
        return str(int(f))
    return None


def exact(text: str) -> str | None:
    """The conclusion's text without emphasis, quotes and closing punctuation, lower-cased (the
    first line of it)."""
    c = _plain(conclusion(text)).splitlines()
    if not c:
        return None
    word = c[0].strip().strip("\"'“”‘’").rstrip(".!").strip().strip("\"'“”‘’").lower()
    return word or None


def lines(text: str) -> str | None:
    """The answer's items, one per line (list markers and emphasis removed), as a sorted,
    comma-joined set (the order of a listing is not graded)."""
    body = _FENCE.sub("", text)
    marks = list(_ANSWER.finditer(body))
    if marks:
        body = body[marks[-1].end():]
    items = set()
    for ln in body.splitlines():
        ln = re.sub(r"^\s*(?:[-*+•]|\d+[.)])\s+", "", _plain(ln)).strip().rstrip(",.;").lower()
        if ln:
            items.add(ln)
    return ",".join(sorted(items)) or None


def code(text: str) -> str | None:
    """The last fenced code block (a python one preferred), else None."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    python = [b for lang, b in blocks if lang.lower() in ("python", "py")]
    return (python or [b for _, b in blocks])[-1]


EXTRACT: dict[str, Callable[[str], str | None]] = {
    "choice": choice, "integer": integer, "exact": exact, "lines": lines, "test": code,
}

# Each extractor on answers written the ways models write them: (answer, what it extracts).
SELF_TESTS: dict[str, list[tuple[str, str | None]]] = {
    "choice": [("The answer is C.", "C"), ("Answer: (B)", "B"), ("**Answer:** D) 63", "D"),
               ("A is wrong, B too.\nAnswer: C", "C"), ("I am not sure.", None), ("Answer: **A**", "A")],
    "integer": [("37 * 43 = 1591", "1591"), ("Answer: 1,591", "1591"), ("It takes 155 minutes.", "155"),
                ("First 12, then 7.\n\n**Answer: 28**", "28"), ("Answer: -4", "-4"), ("Answer: 3.0", "3"),
                ("about 2.5", None), ("no idea", None)],
    "exact": [("desserts", "desserts"), ('Answer: "Desserts".', "desserts"), ("The word is:\n**desserts**", "desserts"),
              ("Answer: `blue`", "blue"), ("", None)],
    "lines": [("11\n13\n17", "11,13,17"), ("- 13\n- 11\n* 17.", "11,13,17"), ("Answer:\n1. 11\n2. 13", "11,13"),
              ("", None)],
    "test": [("```python\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),
             ("```\nx = 1\n```\nthen\n```py\ny = 2\n```", "y = 2\n"), ("no code", None)],
}


def self_test() -> list[str]:
    """Every self-test case that an extractor gets wrong (empty: all pass)."""
    wrong = []
    for kind, cases in SELF_TESTS.items():
        for text, want in cases:
            got = EXTRACT[kind](text)
            if got != want:
                wrong.append(f"{kind}: {text!r} -> {got!r}, expected {want!r}")
    return wrong
