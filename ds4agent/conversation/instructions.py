"""Project instructions: AGENTS.md and CLAUDE.md, wherever people put them.

At start the agent reads, from the most general to the most specific: the user's own file in
the home folder (``~/.ds4agent/AGENTS.md`` or ``CLAUDE.md``), the workspace root's, and those of
every directory from the root down to the directory ``ds4 agent`` was started in. They go into the
system prompt in that order, and the prompt says that a nearer file wins where they disagree.

Directories the agent works in later (a file read, edited or listed in ``src/api/``) may hold
their own: the first time a tool touches a path there, the files of the directories between the
root and it that were not read yet are added to that tool's result (the system prompt, evaluated
once and cached, stays as it is), and the user is told. In one directory AGENTS.md comes before
CLAUDE.md; a file that is a link to, or a copy of, one already read is not read twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NAMES = ("AGENTS.md", "CLAUDE.md")
MAX_CHARS = 20_000  # of one file


@dataclass(frozen=True)
class InstructionFile:
    path: Path
    label: str  # as the user sees it: "~/.ds4agent/AGENTS.md", "AGENTS.md", "src/CLAUDE.md"
    text: str
    cut: bool  # longer than MAX_CHARS: the rest is left out

    def shown(self) -> str:
        return self.label + (f" (first {MAX_CHARS} characters)" if self.cut else "")


def _read(path: Path, label: str) -> InstructionFile | None:
    try:
        if not path.is_file():
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_CHARS + 1)
    except OSError:
        return None
    if not text.strip():
        return None
    return InstructionFile(path, label, text[:MAX_CHARS], len(text) > MAX_CHARS)


class Instructions:
    """The instruction files of one workspace: those read at start and those found later."""

    def __init__(self, root: Path, start: Path | None = None, user_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.files: list[InstructionFile] = []  # read at start: in the system prompt
        self.later: list[InstructionFile] = []  # found while working: in tool results
        self._seen_dirs: set[Path] = set()
        self._seen_text: set[str] = set()
        self._seen_real: set[str] = set()
        if user_dir is not None:
            home = str(Path.home())
            for name in NAMES:
                p = Path(user_dir) / name
                label = str(p).replace(home, "~", 1) if str(p).startswith(home + os.sep) else str(p)
                f = _read(p, label)
                if self._new(f):
                    self.files.append(f)
        start = Path(start) if start is not None else self.root
        for d in self._chain(start if start.is_dir() else start.parent):
            self.files += self._dir(d)

    def _chain(self, d: Path) -> list[Path]:
        """The directories from the root down to ``d`` (only ``[root]`` when d is outside it)."""
        try:
            rel = Path(os.path.normpath(d)).relative_to(self.root)
        except ValueError:
            return [self.root]
        out, cur = [self.root], self.root
        for part in rel.parts:
            if part in (".git",) or part.lower() == ".git":
                break
            cur = cur / part
            out.append(cur)
        return out

    def _new(self, f: InstructionFile | None) -> bool:
        if f is None:
            return False
        real = os.path.realpath(f.path)
        if real in self._seen_real or f.text in self._seen_text:
            return False  # CLAUDE.md linked to (or copied from) AGENTS.md: read once
        self._seen_real.add(real)
        self._seen_text.add(f.text)
        return True

    def _dir(self, d: Path) -> list[InstructionFile]:
        """The files of directory ``d`` not read yet (each directory is looked at once)."""
        if d in self._seen_dirs:
            return []
        self._seen_dirs.add(d)
        found = []
        for name in NAMES:
            rel = os.path.relpath(d / name, self.root)
            f = _read(d / name, rel)
            if self._new(f):
                found.append(f)
        return found

    def prompt(self) -> str:
        """The system prompt's part: every file read at start, general to specific."""
        if not self.files:
            return ""
        parts = ["\n\nProject instructions follow, from the most general to the most specific. Where they disagree, "
                 "the later (nearer) one wins; the user's own messages come before all of them."]
        for f in self.files:
            parts.append(f"\n\nInstructions from {f.label}:\n{f.text.strip()}")
        return "".join(parts)

    def for_path(self, path: Path) -> list[InstructionFile]:
        """Files that apply to ``path`` (a file or directory a tool touched) and were not read
        yet: those of its directory and the directories between the root and it."""
        p = Path(os.path.normpath(path))
        d = p if p.is_dir() else p.parent
        found: list[InstructionFile] = []
        for step in self._chain(d):
            found += self._dir(step)
        self.later += found
        return found

    @staticmethod
    def as_result(files: list[InstructionFile]) -> str:
        """Found later: appended to the tool result that led to them."""
        parts = []
        for f in files:
            where = os.path.dirname(f.label) or "."
            parts.append(f"\n\n[Project instructions from {f.label}; they apply to files under {where}/ and take "
                         f"precedence over more general ones:\n{f.text.strip()}\n]")
        return "".join(parts)
