"""Reading a program's options as getopt and GNU's long options do (short, combined, long,
abbreviated, values attached or apart), and the glob patterns a word names.
"""

from __future__ import annotations

import glob as globmod
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from ..shellparse import Word


@dataclass
class Opts:
    shorts: str = ""  # every short option letter seen (clusters split)
    longs: list[str] = field(default_factory=list)  # long option names as written (no value)
    values: list[tuple[str, Word]] = field(default_factory=list)  # option -> value word
    operands: list[Word] = field(default_factory=list)
    computed: list[Word] = field(default_factory=list)  # words whose value the shell computes
    # Options ended: after --, or (without permute) after the first operand; every word after
    # it is an operand. (Where they ended is never needed, only whether.)
    ended: bool = False


def _pattern_matches(pattern: str, directory: Path, hidden: bool) -> list[str]:
    """What a pattern matches in ``directory``, at most 2001 names (one past the 2000 the checks
    look at, so that too many shows). Lazily, so a pattern as wide as /*/*/* stops there.
    ``hidden``: whether * also matches names starting with a dot. Raises OSError, ValueError."""
    return list(itertools.islice(globmod.iglob(pattern, root_dir=str(directory), include_hidden=hidden), 2001))


def scan(args: list[Word], short_arg: str = "", long_arg: frozenset[str] | set[str] = frozenset(),
         permute: bool = True, optional: str = "") -> Opts:
    """Split arguments GNU-style: clustered short options (``-rf``), values attached or next
    (``-ofile``, ``-o file``, ``--out=f``, ``--out f``), ``--`` ends options, and options may
    follow operands (``chmod 777 -R .``) unless ``permute`` is False. The letters of
    ``optional`` take a value only attached (getopt's ``d::``: ``-dX`` has the value X, and
    ``-d X`` leaves X an operand); a long option with an optional value is simply left out of
    ``long_arg``, since only ``--name=value`` gives it one."""
    o = Opts()
    i = 0
    while i < len(args):
        w = args[i]
        v = w.value
        i += 1
        if v is None:
            o.computed.append(w)
            o.operands.append(w)
            continue
        if o.ended or not v.startswith("-") or v == "-":
            o.operands.append(w)
            o.ended = o.ended or not permute
            continue
        if v == "--":
            o.ended = True
            continue
        if v.startswith("--"):
            name, eq, val = v.partition("=")
            o.longs.append(name)
            if eq:
                o.values.append((name, Word(val, val)))
            elif any(a.startswith(name) for a in long_arg) and i < len(args):  # the name or a GNU abbreviation
                o.values.append((name, args[i]))
                i += 1
            continue
        for j, c in enumerate(v[1:], 1):
            o.shorts += c
            if c in short_arg or c in optional:
                rest = v[j + 1:]
                if rest:
                    o.values.append(("-" + c, Word(rest, rest)))
                elif i < len(args) and c in short_arg:
                    o.values.append(("-" + c, args[i]))
                    i += 1
                break
    return o


def has_long(o: Opts, full: str) -> bool:
    """``--full`` given, or a GNU abbreviation of it (``--rec`` for ``--recursive``)."""
    return any(n == full or (len(n) >= 3 and full.startswith(n)) for n in o.longs)


def opt_values(o: Opts, *names: str) -> list[Word]:
    out = []
    for n, w in o.values:
        if any(n == x or (x.startswith("--") and len(n) >= 3 and x.startswith(n)) for x in names):
            out.append(w)
    return out
