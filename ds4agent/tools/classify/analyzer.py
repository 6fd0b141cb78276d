"""The analyser: a command's parse walked step by step (nested shells expanded, wrappers looked
through, directories followed) and each program judged, and analyze() itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..shellparse import UNKNOWN_DIR, Command, Script, Word, parse
from .git import GitRules
from .model import DANGEROUS, MAX_COMMAND, MAX_NESTING, ORDINARY, SAFE, UNKNOWN, Analysis, ProgramStep
from .options import _pattern_matches
from .places import NULL_DEVICES, Places, is_git_name
from .programs import ProgramRules, _crontab_lists, _env_ok, _system_family
from .readonly import ReadOnlyRules
from .tables import (
    _INERT,
    _RESERVED,
    _RUNNERS,
    _RUNS_PER_INPUT,
    _SETS_SHELL_ENV,
    _SHELL_ENV,
    _SUBCOMMAND_TOOLS,
    _SYSTEM,
    SAFE_PROGRAMS,
    SHELLS,
    _interp,
)
from .texttools import _path_words
from .wrappers import WrapperRules


class Analyzer(WrapperRules, ProgramRules, GitRules, ReadOnlyRules):
    """Walks a parsed command: expands nested shells, looks through wrappers, follows cd, and
    judges each program it finds (the rules are mixed in: programs.py, git.py, readonly.py)."""

    def __init__(self, places: Places, env: dict[str, str] | None = None) -> None:
        self.places = places
        self.env = os.environ if env is None else env
        self.a: Analysis | None = None
        self.scripts: list[tuple[Script, set]] = []  # each parsed script, with the directories it starts in
        self.dirs_unreliable = False  # CDPATH or HOME changed: cd may go anywhere
        self.tainted = ""  # why programs after some point cannot be known (PATH changed ...)

    # phase 1: programs, through wrappers and nested shells
    def expand(self, text: str, via: str, depth: int, start: set | None = None) -> list[ProgramStep]:
        a = self.a
        start = {self.places.root} if start is None else start
        if depth > MAX_NESTING:
            a.findings.append((UNKNOWN, "shells nested too deeply to check"))
            return []
        if len(text) > MAX_COMMAND:
            a.findings.append((UNKNOWN, f"a command of {len(text)} characters is too long to check"))
            return []
        script = parse(text)
        self.scripts.append((script, start))
        for why in script.problems:
            a.findings.append((UNKNOWN, f"{why}{' in ' + via if via else ''}"))
        for name, body in script.functions.items():
            if any(c.name == name for c in body):
                a.findings.append((DANGEROUS, f"function {name} calls itself (a fork bomb)"))
        steps: list[ProgramStep] = []
        for cmd in script.commands:
            steps += self.command(cmd, via, depth, start)
        return steps

    def resolve_dirs(self, histories: frozenset, start: set) -> set:
        """The directories a command may run in, from its cd histories (shellparse)."""
        out: set = set()
        for d0 in start:
            for h in histories:
                d = d0
                for e in h:
                    if d is None:
                        break
                    d = None if e == UNKNOWN_DIR else self._cd(e, d)
                out.add(d)
        if self.dirs_unreliable:
            out.add(None)
        return out

    def _cd(self, cmd: Command, d: Path) -> Path | None:
        # shellparse records cd, pushd and popd themselves (a `builtin cd` is an unknown directory).
        name, words = cmd.words[0].value, cmd.words[1:]
        if name == "popd":
            return None
        # Options (-L, -P, -e, -@) are skipped; `-` (back to $OLDPWD) and -N/+N (dirs) are operands.
        ops = [w for w in words if not (w.value and w.value.startswith("-") and len(w.value) > 1
                                         and not w.value[1:].isdigit())]
        if not ops:
            return self.places.home if name == "cd" else None
        t = ops[0].value
        if t is None or t == "-" or re.fullmatch(r"[+-]\d+", t):
            return None
        q = Path(os.path.normpath(d / t))
        return q if q.is_dir() else None  # a cd that fails leaves the shell where it was: unknown to us

    def command(self, cmd: Command, via: str, depth: int, start: set) -> list[ProgramStep]:
        if cmd.kind == "assignment":
            self.assignment(cmd.assigns, exported=False)
            return []
        step = ProgramStep(list(cmd.words), cmd.source, list(cmd.assigns), list(cmd.redirects), cmd, via=via,
                    dirs=self.resolve_dirs(cmd.cwd, start))
        if cmd.kind == "declaration":
            name = step.program  # (a declaration's keyword: never computed)
            exported = name == "export" or any(w.value and w.value.startswith("-") and "x" in w.value
                                               for w in step.argv[1:])
            self.assignment(step.assigns, exported=exported)
            step.inert = True
            if name in ("export", "declare", "typeset", "local", "readonly"):
                for w in step.argv[1:]:
                    # A computed word may be any name=value; the options (-x, -f ...) were read above.
                    if w.value is None:
                        step.raise_to(UNKNOWN, f"{name} of a computed name")
            return [step]
        out = [step]
        self.unwrap(step, out, depth)
        return out

    def assignment(self, assigns: list[tuple[str, Word]], exported: bool) -> None:
        for name, value in assigns:
            if name in ("CDPATH", "HOME"):
                self.dirs_unreliable = True
            changes_env = exported or name in self.env or name in _SHELL_ENV
            if changes_env and not _env_ok(name, value):
                self.tainted = self.tainted or f"sets {name}, which changes what the programs after it are or read"

    # phase 3: each program
    def judge(self, s: ProgramStep) -> None:
        prog = s.program
        if not s.argv:
            # Only redirections: no program, but where it runs and what it opens still count.
            self.reads_and_dirs(s)
            return
        if prog is None:
            s.raise_to(UNKNOWN, f"the program is computed ({s.argv[0].source[:60]})")
            s.coverable = False
            return
        if s.argv[0].glob:
            s.raise_to(UNKNOWN, f"the program name is a file pattern ({prog})")
            s.coverable = False
            return
        base = os.path.basename(prog)
        if prog in _RESERVED and s.argv[0].source == prog:
            # bash would read this word as syntax (only a word with no quoting at all is a
            # reserved word: not 'then', $'then', th''en, \done): the grammar and bash disagree here
            s.raise_to(UNKNOWN, f"the shell grammar could not be followed here ({prog!r} as a program)")
            s.coverable = False
        if self.tainted:
            s.raise_to(UNKNOWN, self.tainted)
            s.coverable = False
        # A declaration's assignments (export X=1, local x=$1) are the variables it declares, not
        # an environment for it: what they do to later programs is assignment()'s business.
        declared = s.cmd is not None and s.cmd.kind == "declaration"
        for name, value in ([] if declared else s.assigns):
            if not _env_ok(name, value):
                # What a variable does to a program is the program's business: not checked.
                s.raise_to(UNKNOWN, f"sets {name} for {base}, which may change what it runs or reads (not checked)")
                s.coverable = False
        self.reads_and_dirs(s)
        family = base if base in _SYSTEM else _system_family(prog, base)
        if family in _SYSTEM:
            why = _SYSTEM[family]
            if not (family == "crontab" and _crontab_lists(s)):
                s.raise_to(DANGEROUS, f"{base}: {why}")
        self.program_rules(s, base)
        s.prefix = self.prefix(s, base)  # None when no "always" can cover it (not coverable)

    def reads_and_dirs(self, s: ProgramStep) -> None:
        """Where ``s`` runs and the files it opens for reading: a rule or the read-only list
        only hold inside the workspace."""
        for d in self.dirs_of(s):
            if d is None:
                s.not_coverable("runs in a directory the shell computes")
            elif self.places.where(d) not in ("inside", "git"):
                s.not_coverable(f"runs in a directory outside the workspace ({d})")
        for r in s.redirects:
            if r.op in ("<", "<>") and r.target is not None and not r.target.procsub:
                if r.target.value is None:
                    s.not_coverable(f"reads a computed path ({r.target.source[:40]})")
                    continue
                for where, q in self.places_of(r.target.value, s):
                    if where in ("outside", "device", None):
                        s.not_coverable(f"reads a file outside the workspace ({q})")

    def writes(self, s: ProgramStep, words: list[Word], verb: str) -> None:
        for w in words:
            self.write_target(s, w, verb)

    def write_target(self, s: ProgramStep | None, w: Word, verb: str, start: set | None = None) -> None:
        a = self.a

        def raise_(level: int, why: str) -> None:
            if s is None:  # a redirection of no program (a bare `> f`): the command's own finding
                a.findings.append((level, why))
            else:
                s.raise_to(level, why)
                if level >= DANGEROUS:
                    s.coverable = False

        if w.value is None:
            if w.procsub:
                return
            raise_(UNKNOWN, f"{verb} a computed path ({w.source[:60]})")
            return
        places = self.places_of(w.value, s, start)
        if w.glob:
            # bash expands a pattern in a redirection or a writer's operand before it writes, so
            # what it matches is judged too: `> .g*/config` writes .git/config, and `lin*/key`
            # may pass through a link out of the workspace. Hidden names count (`shopt -s
            # dotglob` passes as harmless). The literal name stays judged: with no match bash
            # writes it, and what matches may change before the command runs.
            dirs = self.dirs_of(s, start) if not w.value.startswith("/") else {self.places.root}
            for c in dirs - {None}:  # (an unknown one: the literal name's place already says so)
                try:
                    matches = _pattern_matches(w.value, c, hidden=True)
                except (OSError, ValueError):
                    matches = []
                if len(matches) > 2000:
                    raise_(UNKNOWN, f"{verb} {w.value}: the pattern matches too many files to check")
                for m in matches:  # (at most 2001: what glob yields first, in directory order)
                    q = Path(os.path.normpath(Path(c) / m))
                    places.append((self.places.where(q), q))
        for where, p in places:
            if where is None:
                raise_(UNKNOWN, f"{verb} {w.value} in a directory the shell computes")
            elif where == "git":
                raise_(DANGEROUS, f"{verb} inside .git ({w.value})")
            elif where == "outside":
                raise_(DANGEROUS, f"{verb} outside the workspace ({p})")
            elif where == "device" and str(p).startswith(("/dev/tcp/", "/dev/udp/")):
                raise_(DANGEROUS, f"opens a network connection through bash ({p})")
            elif where == "device":
                raise_(DANGEROUS, f"{verb} a device ({p})")
            elif where == "inside":
                a.writes_workspace = True

    def dirs_of(self, s: ProgramStep | None, start: set | None = None) -> set:
        """Where ``s`` runs: its directories, moved by its own -C option if it has one."""
        dirs = (s.dirs if s is not None else start) or {self.places.root}
        if s is not None and s.cwd is not None:
            if s.cwd.value is None:
                return {None}
            return {Path(os.path.normpath(c / s.cwd.value)) if c is not None else None for c in dirs}
        return dirs

    def places_of(self, value: str, s: ProgramStep | None,
                  start: set | None = None) -> list[tuple[str | None, Path | None]]:
        p = self.places
        if value in NULL_DEVICES:  # (/dev/fd/N too, by Places.where)
            return [("null", Path(value))]
        out: list[tuple[str | None, Path | None]] = []
        for c in (self.dirs_of(s, start) if not value.startswith("/") else {p.root}):
            if c is None:
                out.append((None, None))
            else:
                q = Path(os.path.normpath(c / value))
                out.append((p.where(q), q))
        return out

    def operand_places(self, s: ProgramStep, base: str, args: list[Word]) -> None:
        """Operands that name paths outside the workspace, or inside a .git."""
        for w in _path_words(base, args):
            v = w.value
            if v is None:
                continue
            if v.startswith("-") and "=" in v:
                v = v.split("=", 1)[1]
            elif v.startswith("-"):
                continue
            if not v:
                continue
            # (No ~: shellparse expands a tilde or leaves the word computed, so a value that
            # starts with one was quoted, a name in this directory.)
            looks = v.startswith("/") or ".." in Path(v).parts or self._through_link(s, v)
            in_git = any(is_git_name(part) for part in Path(v).parts)
            if not (looks or in_git) and w.glob is False:
                continue
            for where, p in self.places_of(v, s):
                if where == "outside" or where == "device":
                    s.not_coverable(f"names a path outside the workspace ({p})")
                elif where is None:
                    s.not_coverable(f"names {v} in a directory the shell computes")
                elif where == "git" and base not in SAFE_PROGRAMS:  # (git is on that list)
                    s.raise_to(UNKNOWN, f"{base} is given a path inside .git ({v})")
                    s.coverable = False

    def _through_link(self, s: ProgramStep, v: str) -> bool:
        """Whether the relative path ``v`` passes through a symlink at any depth, from the
        workspace or a directory the step runs in (``src/link``, ``cd src && cat link``): where
        it really leads is then checked, as for an absolute path."""
        for d in (self.dirs_of(s) | {self.places.root}) - {None}:
            p = Path(d)
            for part in Path(v).parts:
                p = p / part
                if os.path.islink(p):
                    return True
        return False

    def prefix(self, s: ProgramStep, base: str) -> tuple[str, ...] | None:
        """What "always" would cover for this program: the program and, for tools with
        subcommands, the subcommand (``npm test``, ``git commit``, ``python -m pytest``)."""
        if not s.coverable:
            return None
        vals = s.values()
        prog = vals[0]  # (judge only asks about a step whose program is known)
        # A runner first: bun and deno are interpreters too, and `bun run` alone would cover
        # every script. `uv tool run X` names X one word later than `uv tool install`.
        runner = next((r for r in _RUNNERS
                       if r[0] in (prog, base) and (r[1] == "" or (len(vals) > 1 and vals[1] == r[1]))), None)
        if runner:
            n = 2 if runner[1] == "" else 4 if runner == ("uv", "tool") and vals[2:3] == ["run"] else 3
            if len(vals) >= n and all(v and not v.startswith("-") for v in vals[1:n]):
                return tuple(vals[:n])
            return None
        fam = _interp(base)
        if fam or base in SHELLS:
            if fam == "python" and len(vals) >= 3 and vals[1] == "-m" and vals[2] and not vals[2].startswith("-"):
                return (prog, "-m", vals[2])
            if len(vals) >= 2 and vals[1] and not vals[1].startswith("-"):
                return (prog, vals[1])
            return None
        key = prog if prog in _SUBCOMMAND_TOOLS or base in _SUBCOMMAND_TOOLS else None
        if key:
            if len(vals) >= 2 and vals[1] and not vals[1].startswith("-"):
                return (prog, vals[1])
            if len(vals) == 1:
                return (prog,)
            return None
        return (prog,)


def analyze(command: str, root: Path, *, places: Places | None = None, env: dict[str, str] | None = None) -> Analysis:
    """Read ``command`` as bash would and judge each program it runs (see module doc)."""
    places = places or Places.for_root(root)
    an = Analyzer(places, env)
    an.a = Analysis(command)
    # bash joins a backslash-newline before it reads a name (PA\<newline>TH is PATH): look at
    # the joined text too (inside single quotes the pair stays, so the joined text errs to asking).
    m = _SETS_SHELL_ENV.search(command) or _SETS_SHELL_ENV.search(command.replace("\\\n", ""))
    if m:
        name = next(g for g in m.groups() if g)
        an.dirs_unreliable = name in ("CDPATH", "HOME")
        an.tainted = f"may set {name} (e.g. in arithmetic, a loop or read), which changes what its programs are or read"
    try:
        steps = an.expand(command, "", 0)
    except RecursionError:
        an.a.findings.append((UNKNOWN, "the command is nested too deeply to check"))
        steps = []
    for s in steps:
        an.judge(s)
    # Redirections anywhere: writes outside the workspace or into .git.
    for script, start in an.scripts:
        for r, cmd in script.redirects:
            if r.dup or r.target is None or r.op == "<":
                continue
            step = next((s for s in steps if s.cmd is cmd), None) if cmd is not None else None
            here = an.resolve_dirs(r.cwd, start)
            an.write_target(step, r.target, "writes", start=here)
            if r.target.value is not None and any(w == "inside" for w, _ in an.places_of(r.target.value, step, here)):
                if step is None:
                    an.a.writes_unattached = True
                else:
                    step.writes = True
    for s in steps:
        base = os.path.basename(s.program or "")
        if base in _INERT and s.via.split(" ")[-1] not in _RUNS_PER_INPUT:
            s.inert = True
        if s.inert and (s.level > ORDINARY or not s.coverable or s.writes or an.a.writes_unattached):
            s.inert = False
        if s.inert:
            s.level = SAFE
            continue
        if s.level <= ORDINARY:
            why = s.unsafe = an.is_safe(s)
            if why is None and s.coverable:
                s.level = SAFE
            elif why and why.startswith("reads outside the workspace ("):
                # As for a path named outside (operand_places): no "always" covers a read that
                # leads out of the workspace (a pattern matching a symlink that leads out). The
                # whole opening is compared: other reasons start with a program's own name.
                s.not_coverable(why)
    an.a.steps = steps
    return an.a
