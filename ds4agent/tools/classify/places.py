"""Where a command's paths lead: the workspace, its .git, the temporary directories, devices;
names as HFS+ and NTFS compare them.
"""

from __future__ import annotations

import os
import re
import tempfile
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Code points HFS+ ignores in names (git's CVE-2014-9390 list): ".g\u200cit" is ".git" there.
_IGNORABLE = dict.fromkeys(map(ord, "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u206a\u206b\u206c"
                                    "\u206d\u206e\u206f\ufeff"))


def is_git_name(part: str) -> bool:
    """Whether a path component names a .git directory on some file system this runs on:
    case-insensitive (APFS, HFS+), with HFS+'s ignorable code points and Windows' trailing dots
    and spaces removed."""
    name = unicodedata.normalize("NFC", part.translate(_IGNORABLE)).rstrip(". ").casefold()
    return name == ".git"


def in_git_dir(p: Path) -> bool:
    return any(is_git_name(part) for part in p.parts)


@dataclass(frozen=True)
class Places:
    """Where paths are: the workspace, the temporary directories, and the device files that
    every sandbox mode lets a command write."""

    root: Path
    tmp: tuple[Path, ...]
    home: Path

    @classmethod
    def for_root(cls, root: Path, tmp: tuple[Path, ...] | None = None) -> "Places":
        return cls(Path(os.path.realpath(root)), tmp if tmp is not None else temp_dirs(), Path(os.path.expanduser("~")))

    def where(self, p: Path) -> str:
        """inside | git | tmp | null | device | outside (``p`` absolute, normalised)."""
        s = str(p)
        if (s in NULL_DEVICES or s.startswith(("/dev/fd/", "/proc/self/fd/", "/dev/pts/"))
                or re.fullmatch(r"/dev/ttys\d+", s)):
            return "null"
        real = Path(os.path.realpath(p))
        for q in (p, real):
            # Only the part below the root counts: a workspace kept under a folder named .git
            # is still a workspace.
            if _under(q, self.root) and in_git_dir(q.relative_to(self.root)):
                return "git"
        if in_git_dir(p) or in_git_dir(real):
            # a .git outside the workspace is outside; inside one under tmp is still .git
            if any(_under(q, t) for q in (p, real) for t in self.tmp):
                return "git"
        if _under(p, self.root) and _under(real, self.root):
            return "inside"
        if (any(_under(p, t) and _under(real, t) for t in self.tmp)
                or (_under(p, self.root) and any(_under(real, t) for t in self.tmp))):
            return "tmp"
        if s.startswith("/dev/"):
            return "device"
        return "outside"


NULL_DEVICES = {"/dev/null", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/tty",
                "/dev/random", "/dev/urandom"}


def _under(p: Path, root: Path) -> bool:
    return p == root or root in p.parents


@lru_cache(maxsize=1)
def temp_dirs() -> tuple[Path, ...]:
    out: list[Path] = []
    for d in (tempfile.gettempdir(), os.environ.get("TMPDIR") or "", "/tmp", "/var/tmp", "/dev/shm"):
        if d and os.path.isdir(d):
            real = Path(os.path.realpath(d))
            if real not in out and str(real) != "/":
                out.append(real)
    return tuple(out)
