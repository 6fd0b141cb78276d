"""The read-only list: whether a step may run without asking (the allowlisted programs without
the options that write or run programs, reading only inside the workspace).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..shellparse import Word
from .model import ProgramStep
from .options import _pattern_matches, has_long, scan
from .programs import _system_program
from .tables import (
    _ANY_ARGS,
    _BUILTINS,
    _NOT_PAGERS,
    _OUTPUT_OPERAND,
    _VERSION_ONLY,
    _VERSION_WORDS,
    SAFE_PROGRAMS,
    _output_file,
)
from .texttools import _path_words, _sed_safe


class ReadOnlyRules:
    """The read-only list of Analyzer (mixed in): whether a step may run unasked in auto-edit."""

    def is_safe(self, s: ProgramStep) -> str | None:
        """None when ``s`` is on the read-only allowlist as written; otherwise why not."""
        prog = s.program
        if not s.argv:
            # A bare redirection (`> f`, `< f`, `2>&1`) runs no program: it is `: > f` without
            # the colon, and its targets were judged with every other redirection.
            return None
        assert prog is not None  # judge raised a computed program above ORDINARY: never asked here
        base = os.path.basename(prog)
        if prog != base and not _system_program(prog):
            return f"{prog} is not a system program"
        vals = s.values()
        if base in _VERSION_ONLY and len(vals) == 2 and (
                vals[1] == "--version" or base in _VERSION_WORDS.get(vals[1], ())):
            return self._resolves_safely(base)
        if base not in SAFE_PROGRAMS:
            return f"{base} is not on the read-only list"
        if base in _NOT_PAGERS:
            return f"{base} is interactive"
        if not s.coverable:
            # Its reasons are already on the step; repeating them here (joined) added a second copy.
            return "the sandbox may not run it"
        if self.tainted:  # set by a later step (ls; shopt -s extdebug): this one was judged before it
            return self.tainted
        why = self._resolves_safely(base)
        if why:
            return why
        args = s.argv[1:]
        if base not in _ANY_ARGS and any(w.value is None for w in args):
            return f"{base} with arguments the shell computes"
        if base in ("git",):
            return self.git_safe(s, args)
        shorts, longs = SAFE_PROGRAMS[base]
        if base == "sed":
            # Then, as for any reader, the files a pattern names (lin*/passwd through a link).
            return _sed_safe(args) or self.reads_inside(s, args)
        if base == "env":
            # What env runs became a step of its own (unwrap); what is left only prints.
            return None
        if base in _OUTPUT_OPERAND and _output_file(base, args):
            return f"{base} with an output file"
        if base == "date":
            # -I takes its format attached only (-Iseconds): `date -I 0101` sets the clock.
            o = scan(args, "dfr", {"--date", "--reference", "--file"})
            if any(not (w.value or "").startswith("+") for w in o.operands):
                return "date with an operand sets the clock"
        if base == "hostname" and [w for w in args if w.value and not w.value.startswith("-")]:
            return "hostname with an operand sets the name"
        if base == "find":
            # (-delete was raised to DANGEROUS already, and -L is the read-only list's letter.)
            bad = {"-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls", "-follow", "-H"}
            for v in (w.value for w in args):
                if v in bad:
                    return f"find {v}"
        if base in ("cd", "pushd", "popd", "dirs"):
            return None
        o = scan(args, "", set())
        for c in shorts:
            if c in o.shorts:
                return f"{base} -{c}"
        for full in longs:
            if has_long(o, full):
                return f"{base} {full}"
        if base in _ANY_ARGS:
            return None
        return self.reads_inside(s, args)

    def _resolves_safely(self, base: str) -> str | None:
        if base in _BUILTINS:
            return None
        found = shutil.which(base, path=self.env.get("PATH"))
        if found is None:
            return f"{base} is not installed"
        real = Path(os.path.realpath(found))
        where = self.places.where(real)
        if where in ("inside", "tmp", "git"):
            return f"{base} here is {real}, a file the sandbox lets commands write"
        return None

    def reads_inside(self, s: ProgramStep, args: list[Word]) -> str | None:
        """What a read-only program's patterns expand to. Its other paths were judged by
        operand_places (the same words: outside, a device, a computed directory, .git), its
        directory and `<` redirections by reads_and_dirs; either leaves the step not sandboxable,
        and is_safe stops before this. A pattern is judged there by its literal text only."""
        for w in _path_words(os.path.basename(s.program), args):  # (is_safe: a known program)
            if not w.glob or w.value is None:
                continue
            if w.value.startswith("-"):
                return f"the pattern {w.value} expands to options"
            why = self.glob_inside(s, w.value)
            if why:
                return why
        return None

    def glob_inside(self, s: ProgramStep, pattern: str) -> str | None:
        # (An unknown directory made the step not coverable: is_safe stopped before this.)
        for c in self.dirs_of(s) - {None}:
            try:
                matches = _pattern_matches(pattern, c, hidden=False)
            except (OSError, ValueError):
                return f"the pattern {pattern} cannot be read"
            if len(matches) > 2000:
                return f"the pattern {pattern} matches too many files to check"
            for m in matches or [pattern]:
                if os.path.basename(m).startswith("-"):
                    return f"the pattern {pattern} matches a file name that reads as an option ({m})"
                q = Path(os.path.normpath(Path(c) / m))
                if self.places.where(q) in ("outside", "device"):
                    return f"reads outside the workspace ({q})"
        return None
