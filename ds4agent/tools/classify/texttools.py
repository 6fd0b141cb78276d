"""The text tools: which words of grep, sed, awk, jq ... are paths (the pattern first), and the
read-only subsets of sed scripts and awk programs.
"""

from __future__ import annotations

import re

from ..shellparse import Word
from .options import has_long, opt_values, scan

_PATTERN_FIRST = {"grep", "egrep", "fgrep", "rg", "ag", "sed", "gsed", "awk", "gawk", "mawk", "nawk", "jq", "git"}


def _path_words(base: str, args: list[Word]) -> list[Word]:
    """The words of a command that may name files: for grep, sed, awk and jq the pattern or
    program (the first operand, or the values of -e) is not a file name."""
    if base not in _PATTERN_FIRST or base == "git":
        return args
    out: list[Word] = []
    operands: list[Word] = []
    skip_next = pattern_given = dashdash = False
    # -f FILE (grep's patterns, sed's and awk's script, jq's filter) names a file that is read,
    # and then every operand is a file; ag's -f is a flag (follow links).
    file_opts = ("-f", "--file") if base != "ag" else ()
    for w in args:
        v = w.value
        if skip_next:
            skip_next = False
            continue
        if not dashdash and v is not None and v.startswith("-") and v != "-":
            if v == "--":
                dashdash = True
                continue
            if v in ("-e", "--regexp", "--expression"):
                skip_next = pattern_given = True
                continue
            if v in file_opts:
                pattern_given = True
                continue  # the next word is the file: an operand like any other
            if v.startswith(("--regexp=", "--expression=")) or (v.startswith("-e") and base != "jq"):  # -ePATTERN
                pattern_given = True
                continue
            if file_opts and v.startswith(("-f", "--file=")):  # -fFILE, --file=FILE (a lone -f was read above)
                pattern_given = True
                out.append(Word(v[2:] if v[1] == "f" else v[len("--file="):], w.source))
                continue
            out.append(w)
            continue
        operands.append(w)
    # Options may follow operands (getopt permutes): `grep lin*/passwd -e x` reads lin*/passwd.
    return out + (operands if pattern_given else operands[1:])


# A deliberately small part of sed: addresses (line numbers, $, /regex/, ranges, steps) with
# p, d, q, =, l, n, N, P, D, h, H, g, G, x, z, labels and branches, y/../../ and s/../../flags
# without the e and w flags. No w/W/r/R/e commands, no in-place editing.
# An address: a line number (first~step), the last line, or where a /regex/ or \cregexc starts
# (its end is found by _sed_regex_end, as sed finds it).
# GNU sed's options that take a value: -e SCRIPT, -f FILE, -l N.
_SED_VALUES = ("efl", {"--expression", "--file", "--line-length"})


_SED_ADDR = r"\d+(?:~\d+)?|\$|/|\\([^\\\n\[\]])"


def _sed_regex_end(script: str, i: int, d: str) -> int | None:
    r"""Where the regex that starts at ``i`` ends: just past its closing delimiter ``d``, found as
    sed finds it, or None when it does not close on this line. A backslash escapes the next
    character (``\%`` in ``\%a\%b%`` is not the end), and inside a bracket expression (``[/]``,
    ``[^]/]``, ``[[:punct:]/]``) the delimiter is an ordinary character: ending the regex any
    earlier would read the rest of it as commands, and its real end (a ``w FILE`` after it)
    would go unseen."""
    n = len(script)
    if d in "[]\\\n":
        return None
    while i < n:
        ch = script[i]
        if ch == "\\":
            if script[i + 1:i + 2] == "\n":  # (a backslash last: the loop ends, unclosed)
                return None
            i += 2
        elif ch == "\n":
            return None
        elif ch == d:
            return i + 1
        elif ch == "[":
            j = i + 1
            if j < n and script[j] == "^":
                j += 1
            if j < n and script[j] == "]":
                j += 1  # a ] first in the brackets is one of the characters
            while j < n and script[j] != "]":
                if script[j] == "\n":
                    return None
                if script[j] == "[" and script[j + 1:j + 2] in (":", ".", "="):
                    e = script.find(script[j + 1] + "]", j + 2)
                    if e == -1:
                        return None
                    j = e + 2
                else:
                    j += 1
            i = j + 1  # past the closing ] (or past the end: unclosed, the loop ends)
        else:
            i += 1
    return None


def _sed_safe(args: list[Word]) -> str | None:
    """sed is read-only unless it edits in place. (Its scripts were judged by program_rules: one
    outside the read-only subset, or a script file, is unknown and never reaches this.)"""
    o = scan(args, *_SED_VALUES)
    if "i" in o.shorts or has_long(o, "--in-place"):
        return "sed -i edits files in place"
    if not o.operands and not opt_values(o, "-e", "--expression"):
        return "sed without a script"
    return None


def _sed_script_ok(script: str) -> bool:
    i, n = 0, len(script)

    def addr(i: int) -> int:
        m = re.compile(_SED_ADDR).match(script, i)
        if not m:
            return i
        if m.group(0)[0] not in "/\\":
            return m.end()
        end = _sed_regex_end(script, m.end(), m.group(1) or "/")
        if end is None:
            return i  # no address: the caller finds no command here either
        return re.compile(r"I?M?").match(script, end).end()

    while True:
        while i < n and script[i] in " \t;\n":
            i += 1
        if i >= n:
            return True
        j = addr(i)
        if j != i and j < n and script[j] == ",":
            k = addr(j + 1)
            if k == j + 1:
                m = re.compile(r"[+~]\d+").match(script, j + 1)
                if not m:
                    return False
                k = m.end()
            j = k
        i = j
        while i < n and script[i] in " \t":
            i += 1
        if i < n and script[i] == "!":
            i += 1
        if i >= n:
            return False
        c = script[i]
        if c in "pdqQ=lnNPDhHgGxzF":
            i += 1
            m = re.compile(r"\s*\d*").match(script, i) if c in "qQl" else None
            if m:
                i = m.end()
        elif c == ":":
            m = re.compile(r":[A-Za-z0-9_]+").match(script, i)
            if not m:
                return False
            i = m.end()
        elif c in "btT":
            m = re.compile(r"[btT]\s*[A-Za-z0-9_]*").match(script, i)
            i = m.end()
        elif c in "sy":
            d = script[i + 1:i + 2]
            if d in "\\\n" or d.isalnum():  # ("" too: the script ends here)
                return False
            # Only where the command ends matters (what follows it is read next), not its text.
            k, left = i + 2, 2  # y: two lists; s: a pattern and a replacement
            if c == "s":
                # the pattern is a regex: a delimiter in brackets or escaped does not end it
                k = _sed_regex_end(script, i + 2, d)
                if k is None:
                    return False
                left = 1
            while k < n and left:
                if script[k] == "\\":  # escapes the next character (a last one: the loop ends)
                    k += 2
                    continue
                left -= script[k] == d
                k += 1
            if left:
                return False
            flags = re.compile(r"[gpiImM0-9]*").match(script, k) if c == "s" else None
            i = flags.end() if flags else k
        else:
            return False
        while i < n and script[i] in " \t":
            i += 1
        if i < n and script[i] not in ";\n":  # (no { } blocks in the subset)
            return False


def _awk_reads_only(program: str) -> bool:
    """An awk program that uses none of awk's ways to run commands or write files: no
    system(), no pipes, no output redirection (any > counts: comparisons included), no
    getline, close, fflush, no gawk @load/@include."""
    return not any(t in program for t in ("|", ">", "@")) and not re.search(r"\b(system|getline|close|fflush|"
                                                                           r"PROCINFO|printf?\s*\()", program)
