"""The results of an analysis: the four levels, one ProgramStep per program the command runs, the
Analysis that sums them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..shellparse import Command, Redirect, Word

SAFE, ORDINARY, UNKNOWN, DANGEROUS = 0, 1, 2, 3


LEVELS = ("safe", "ordinary", "unknown", "dangerous")


MAX_NESTING = 8  # bash -c "bash -c '...'" deeper than this is unknown


MAX_WRAPPERS = 16  # nice nice ... rm: a wrapper this many deep is not looked through


MAX_COMMAND = 100_000  # characters; longer commands are not parsed (unknown)


@dataclass
class ProgramStep:
    """One program the command runs (wrappers looked through)."""

    argv: list[Word]
    source: str
    assigns: list[tuple[str, Word]] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    cmd: Command | None = None
    cwd: Word | None = None  # env -C / git -C: its own working directory
    dirs: set = field(default_factory=set)  # the directories it may run in (None: unknown)
    via: str = ""  # the wrappers and nested shells it was found in
    level: int = ORDINARY
    reasons: list[str] = field(default_factory=list)
    prefix: tuple[str, ...] | None = None  # what "always" would cover; None: nothing can
    coverable: bool = True
    inert: bool = False  # cd, echo, true, set -e ...: never needs an approval
    writes: bool = False  # redirects output into a workspace file
    git_write: bool = False  # a git command that may write the repository's .git
    # Why the read-only check did not pass it ("git branch NAME creates a branch"): auto-edit
    # says so when it asks. None: it passed, or it was never asked (inert, or above ORDINARY).
    unsafe: str | None = None

    @property
    def program(self) -> str | None:
        return self.argv[0].value if self.argv else None

    def values(self) -> list[str | None]:
        return [w.value for w in self.argv]

    def raise_to(self, level: int, why: str) -> None:
        self.level = max(self.level, level)
        if why and why not in self.reasons:
            self.reasons.append(why)

    def not_coverable(self, why: str) -> None:
        self.coverable = False
        if why and why not in self.reasons:
            self.reasons.append(why)


@dataclass
class Analysis:
    command: str
    steps: list[ProgramStep] = field(default_factory=list)
    findings: list[tuple[int, str]] = field(default_factory=list)  # levels not tied to one step
    writes_workspace: bool = False  # redirections or writers that change files in the workspace
    writes_unattached: bool = False  # `{ ...; } > file`: a group's output goes into a workspace file

    @property
    def level(self) -> int:
        levels = [s.level for s in self.steps] + [lvl for lvl, _ in self.findings]
        return max(levels, default=SAFE)

    def reasons(self, level: int | None = None) -> list[str]:
        level = self.level if level is None else level
        out: list[str] = []
        for lvl, why in self.findings:
            if lvl >= level and why not in out:
                out.append(why)
        for s in self.steps:
            if s.level >= level:
                # A step without a program has only redirections (a computed program has a reason).
                for why in s.reasons or [f"runs {s.program}" if s.argv else "only redirects (no program runs)"]:
                    if why not in out:
                        out.append(why)
        return out

    def reason(self) -> str:
        return "; ".join(self.reasons()[:3])

    @property
    def git_only(self) -> bool:
        """Every program is git (or inert): such a command may write the repository's .git."""
        real = [s for s in self.steps if not s.inert]
        return bool(real) and all(s.git_write for s in real)
