"""What a shell command does, from its parse (shellparse), not from its text.

``analyze(command, root)`` reads the command as bash would, looks through wrappers (``env``,
``timeout``, ``nice``, ``xargs``, ``find -exec``, ``sudo`` ...) and nested shells (``bash -c``,
``sh -c``, ``eval``, ``trap``, ``watch``, a script fed to a shell on a heredoc or from
``echo ... |``), and gives every simple command one level:

- ``SAFE``: on the reviewed read-only allowlist (``ls``, ``cat``, ``grep``, ``git status`` ...)
  with none of the options that write or run programs, reading only inside the workspace.
  These may run without asking in ``auto-edit`` (and inside the sandbox).
- ``ORDINARY``: anything else that can be read statically (``pytest``, ``npm test``,
  ``git commit``): it asks, unless the user answered "always" to a prefix that covers it.
- ``UNKNOWN``: what cannot be read statically: a program name that is an expansion (``$X``,
  ``$(...)``, ``r${IFS}m``), text decoded or read from a pipe and run as code, ``eval`` or
  ``bash -c`` of computed text, inline interpreter code (``python -c``), an environment change
  that alters what later programs are, a parse error. It always asks (outside ``yolo``).
- ``DANGEROUS``: destroys data or reaches beyond the project whatever the sandbox does
  (recursive or forced delete in any option spelling, ``find -delete``, force-push, ``git reset
  --hard``, ``git clean -f``, recursive chmod/chown, ``sudo``/``su``, disks, shutting down,
  killing broadly, crontab, a downloaded script run by a shell, writes outside the workspace or
  into any ``.git``). It always asks, in every mode, and "always" never covers it.

Nothing here matches the command text with patterns: decisions are made on resolved program
names and their parsed options (short, combined, long and GNU-abbreviated, in any order).

The package: model.py (levels, ProgramStep, Analysis), analyzer.py (the walk, analyze),
wrappers.py (through wrappers, into nested shells), programs.py (per-program rules), git.py,
readonly.py (the read-only list), texttools.py, options.py, tables.py, places.py.
"""

from __future__ import annotations

from .analyzer import analyze
from .model import (
           DANGEROUS,
           LEVELS,
           MAX_COMMAND,
           MAX_NESTING,
           MAX_WRAPPERS,
           ORDINARY,
           SAFE,
           UNKNOWN,
           Analysis,
           ProgramStep,
)
from .options import scan
from .places import Places, in_git_dir, is_git_name, temp_dirs

__all__ = ["analyze", "Analysis", "ProgramStep", "Places", "in_git_dir", "is_git_name", "temp_dirs", "scan", "LEVELS",
           "SAFE", "ORDINARY", "UNKNOWN", "DANGEROUS",
           "MAX_NESTING", "MAX_WRAPPERS", "MAX_COMMAND"]
