"""Phase 1's second half: looking through wrappers (env, xargs, timeout, sudo, ...) to the program
they run, and into the code that nested shells, eval, trap, find -exec and interpreters run, so
that every program a command starts is judged. A mixin of the Analyzer (analyzer.py), whose
walk (expand, command) and judgement it calls back.
"""

from __future__ import annotations

import itertools
import os

from ..shellparse import Word
from .model import DANGEROUS, MAX_WRAPPERS, ORDINARY, UNKNOWN, ProgramStep
from .options import has_long, opt_values, scan
from .programs import _literal_echo
from .tables import _SERVICES, _WRAPPER_ARGS, DOWNLOADERS, INLINE, INLINE_LONG, SHELLS, WRAPPERS, _interp


class WrapperRules:
    """unwrap and what it calls: each found program goes to ``out`` as a ProgramStep of its own."""

    def unwrap(self, step: ProgramStep, out: list[ProgramStep], depth: int) -> None:
        """Look through wrappers; add nested shells' programs to ``out``."""
        for unwrapped in itertools.count():  # (ends at MAX_WRAPPERS below, or sooner)
            prog = step.program
            if prog is None:
                return
            base = os.path.basename(prog)
            args = step.argv[1:]
            if base in ("sudo", "doas", "su", "runuser"):  # run0, pkexec: the dangerous table names them
                step.raise_to(DANGEROUS, f"{base}: runs as another user")
                if base in ("su", "runuser"):
                    # The options that take a value (util-linux su and runuser): -l is --login, a flag,
                    # so the -c after it is seen.
                    o = scan(args, "cgGswu", {"--command", "--group", "--supp-group", "--shell", "--session-command",
                                              "--whitelist-environment", "--user"})
                    for w in opt_values(o, "-c", "--command", "--session-command"):
                        self.nested(step, w, f"{base} -c", out, depth)
                    return
            if base in WRAPPERS or base in ("xargs", "watch", "busybox", "find", "fd", "fdfind"):
                if unwrapped == MAX_WRAPPERS:
                    # `nice nice ... rm`: past this many, what the last wrapper runs is not looked at
                    step.raise_to(UNKNOWN, "wrappers nested too deeply to check")
                    step.coverable = False
                    return
                if base in _SERVICES:
                    step.not_coverable(f"{base} asks a service outside the sandbox to run things")
                inner = self.inner(step, base, args, out, depth)
                if inner is None:
                    return
                step.via = (step.via + " " if step.via else "") + base
                step.argv = inner
                continue
            self.nested_shell(step, base, args, out, depth)
            return

    def inner(self, step: ProgramStep, base: str, args: list[Word], out: list[ProgramStep],
              depth: int) -> list[Word] | None:
        """The command a wrapper runs, or None when it runs none (the wrapper is then the step)."""
        if base == "command":
            if args and args[0].value and args[0].value.startswith("-") and any(c in args[0].value for c in "vV"):
                step.inert = True
                return None
            while args and args[0].value == "-p":
                args = args[1:]
            if args and args[0].value == "--":  # command -- rm: bash's builtins end options at --
                args = args[1:]
            return args or None
        if base in ("builtin", "coproc", "nohup", "catchsegv", "busybox"):
            # No options: the first word is what runs (busybox's applet; `nohup -x` runs nothing
            # and is asked about as a program named -x). GNU nohup and bash's builtin take -- as
            # the end of their (no) options; timeout 5 --, flock f --, taskset 1 -- really run a
            # program named --.
            if args and args[0].value == "--" and base in ("builtin", "nohup"):
                args = args[1:]
            return args or None
        if base == "xargs":
            # GNU xargs: -e[END], -i[R] and -l[N] (and --eof, --replace) take a value only
            # attached: `xargs -e rm -rf /` runs rm.
            o = scan(args, "aEIdLnPs", {"--arg-file", "--delimiter", "--max-lines", "--max-args", "--max-procs",
                                         "--max-chars", "--process-slot-var"}, permute=False, optional="eil")
            if o.operands and o.operands[0].value is None:
                step.raise_to(UNKNOWN, "xargs runs a computed program")
                return None
            inner = list(o.operands) or [Word("echo", "echo")]
            # What a name read from the input replaces: -I R, -iR, --replace=R; -i and --replace
            # alone mean {} (counted even when they name another: a literal {} then only counts
            # as computed, which asks more, never less).
            reps = [w.value for w in opt_values(o, "-I", "-i", "--replace")]
            reps += ["{}"] if "i" in o.shorts or has_long(o, "--replace") else []
            inner = [inner[0]] + [Word(None, w.source) if w.value is not None and any(r and r in w.value for r in reps)
                                  else w for w in inner[1:]]
            return inner + [Word(None, "<arguments read from standard input>")]
        if base == "watch":
            # procps watch: -d[=permanent] takes its value only attached, -g (--chgexit) is a flag.
            o = scan(args, "nqs", {"--interval", "--equexit", "--shotsdir"}, permute=False, optional="d")
            if any(w.value is None for w in o.operands):
                step.raise_to(UNKNOWN, "watch runs a computed command")
                return None
            if o.operands:
                self.nested(step, Word(" ".join(w.value for w in o.operands), ""), "watch", out, depth)
            step.inert = False
            step.argv = [Word("watch", "watch")]
            return None
        if base in ("find", "fd", "fdfind"):
            self.find_exec(step, base, args, out, depth)
            return None
        if base == "arch":
            # macOS arch: -arch NAME, -e VAR=VALUE and -d VAR take the next word; -x86_64, -arm64, -c
            # ... do not. Its single-dash words are not GNU clusters (-arch is not -a -r -c -h).
            while args and args[0].value and args[0].value.startswith("-"):
                args = args[2 if args[0].value in ("-arch", "-e", "-d") else 1:]
            return args or None
        # The rest read their options GNU-style from one table, and stop at the first operand.
        short, longs = _WRAPPER_ARGS.get(base, ("", set()))
        o = scan(args, short, longs, permute=False)
        if base == "env":
            if "S" in o.shorts or has_long(o, "--split-string"):
                step.raise_to(UNKNOWN, "env -S splits a string into a command")
                return None
            for w in opt_values(o, "-C", "--chdir"):
                step.cwd = w
            rest = list(o.operands)
            if rest and rest[0].value == "-":  # a lone - is -i: `env - rm -rf /` runs rm
                rest = rest[1:]
            while rest and rest[0].value and "=" in rest[0].value and not rest[0].value.startswith("="):
                name, _, val = rest[0].value.partition("=")
                step.assigns.append((name, Word(val, val)))
                rest = rest[1:]
            if rest and rest[0].value is None and "=" in rest[0].source.split("$")[0]:
                step.raise_to(UNKNOWN, "env sets a computed variable")
                return None
            return rest or None
        if base == "flock":
            # flock FILE -c CMD runs CMD with sh -c (-c read anywhere: it follows the lock file);
            # otherwise the first operand is the lock file and the rest the command.
            for w in opt_values(scan(args, short, longs), "-c", "--command"):
                self.nested(step, w, "flock -c", out, depth)
                return None
            return o.operands[1:] or None
        if base in ("chrt", "taskset"):
            # The first operand is the priority or the CPU mask. With -p (--pid) they change a
            # running process and run nothing.
            if "p" in o.shorts or has_long(o, "--pid"):
                return None
            return o.operands[1:] or None
        if base in ("timeout", "gtimeout"):
            return o.operands[1:] or None  # the first operand is the duration
        if base in ("sudo", "doas"):
            # -s and -i pass the command to a shell's -c: it runs, and is judged too. sudo -l
            # (--list), -e (--edit) and -v (--validate), and doas -C, run nothing they name.
            if (any(c in o.shorts for c in ("lev" if base == "sudo" else "C"))
                    or any(has_long(o, x) for x in ("--list", "--edit", "--validate"))):
                return None
            rest = list(o.operands)
            while rest and rest[0].value and "=" in rest[0].value:
                rest = rest[1:]
            return rest or None
        return o.operands or None

    def find_exec(self, step: ProgramStep, base: str, args: list[Word], out: list[ProgramStep], depth: int) -> None:
        """find's -exec/-execdir/-ok/-okdir (and fd's -x/-X) run a command per file: each
        becomes a step, with the file name unknown."""
        vals = [w.value for w in args]
        i = 0
        while i < len(args):
            v = vals[i]
            if base == "find" and v in ("-exec", "-execdir", "-ok", "-okdir"):
                j = i + 1
                while j < len(args) and vals[j] not in (";", "+"):
                    j += 1
                inner = [Word(None, w.source) if w.value is not None and "{}" in w.value else w for w in args[i + 1:j]]
                if inner:
                    sub = ProgramStep(inner, step.source, [], [], step.cmd, via=(step.via + f" find {v}").strip(),
                                      dirs=set(step.dirs))
                    out.append(sub)
                    self.unwrap(sub, out, depth)
                i = j + 1
                continue
            if base != "find" and v in ("-x", "--exec", "-X", "--exec-batch"):
                inner = [Word(None, w.source) if w.value is not None and "{" in w.value else w for w in args[i + 1:]]
                if inner:
                    sub = ProgramStep(inner + [Word(None, "{}")], step.source, [], [], step.cmd, via=f"{base} {v}",
                                      dirs=set(step.dirs))
                    out.append(sub)
                    self.unwrap(sub, out, depth)
                return
            i += 1

    def nested(self, step: ProgramStep, w: Word, via: str, out: list[ProgramStep], depth: int) -> None:
        if w.value is None:
            step.raise_to(UNKNOWN, f"{via} runs a computed command ({w.source[:60]})")
            return
        out += self.expand(w.value, via, depth + 1, step.dirs or None)

    def nested_shell(self, step: ProgramStep, base: str, args: list[Word], out: list[ProgramStep], depth: int) -> None:
        """Shells, eval, source, trap and interpreters: the code they run."""
        cmd = step.cmd
        if base == "eval":
            if any(w.value is None for w in args):
                step.raise_to(UNKNOWN, "eval of computed text")
                return
            if args:
                self.nested(step, Word(" ".join(w.value for w in args), ""), "eval", out, depth)
            step.inert = True
            return
        if base == "trap":
            o = scan(args, "", set(), permute=False)
            if "p" in o.shorts or "l" in o.shorts or not o.operands:
                step.inert = True
                return
            code = o.operands[0]
            if len(o.operands) == 1 and code.value and code.value.isdigit():
                step.inert = True
                return
            if code.value != "-":  # - resets the signal; '' ignores it (runs nothing, as nested finds)
                self.nested(step, code, "trap", out, depth)
            step.inert = True
            return
        if base in ("source", "."):
            target = args[0] if args else None
            self.tainted = (self.tainted
                            or f"{base} runs a script in this shell, so the programs after it cannot be known")
            if target is None:
                return
            self.script_source(step, base, target, out, depth)
            return
        family = "shell" if base in SHELLS else _interp(base)
        if family is None:
            return
        if family == "shell":
            o = scan(args, "oO", {"--rcfile", "--init-file"}, permute=False)
            rc = opt_values(o, "--rcfile", "--init-file")
            if rc and "i" in o.shorts:
                # Only an interactive shell reads its startup file, and then before anything
                # else: what that file runs is not seen here (`bash -i --rcfile x.sh -c ls`
                # passed as a read-only ls). Without -i, bash ignores the option.
                step.raise_to(UNKNOWN, f"{base} -i runs its startup file ({rc[0].source[:60]}), which is not checked")
                step.coverable = False
            if "c" in o.shorts:
                if not o.operands:
                    step.raise_to(UNKNOWN, f"{base} -c without a command")
                    return
                self.nested(step, o.operands[0], f"{base} -c", out, depth)
                step.inert = True
                return
            if "s" in o.shorts or not o.operands:
                self.from_stdin(step, base, out, depth, shell=True)
                return
            self.script_source(step, base, o.operands[0], out, depth)  # (a script named - or /dev/stdin: stdin too)
            return
        # Interpreters: inline code cannot be checked; a program on stdin neither.
        letters = INLINE.get(family, "")
        o = scan(args, "".join(letters.split()) + ("mWXQ" if family == "python" else ""), set(), permute=False)
        inline = [c for c in letters.split() if c in o.shorts]
        # PowerShell's parameters are case-insensitive prefixes (-Command, -c, -EncodedCommand, -ec,
        # -e; /Command on Windows): any -c... or -e... word may be inline code.
        powershell = family in ("pwsh", "powershell") and any(
            w.value is None or (w.value[:1] in ("-", "/") and w.value.lstrip("-/")[:1].lower() in ("c", "e"))
            for w in args)
        if (inline or powershell or any(n in INLINE_LONG.get(family, set()) for n in o.longs)
                or (family == "deno" and o.operands and o.operands[0].value == "eval")):
            step.raise_to(UNKNOWN, f"runs inline {family} code, which is not checked")
            step.coverable = False
            return
        if family == "python" and "m" in o.shorts:
            return
        if not o.operands or o.operands[0].value in ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"):
            if cmd is not None and cmd.stdin:
                self.from_stdin(step, base, out, depth, shell=False)
            return
        if o.operands[0].procsub:
            self.script_source(step, base, o.operands[0], out, depth)

    def script_source(self, step: ProgramStep, base: str, target: Word, out: list[ProgramStep], depth: int) -> None:
        if target.procsub:
            if any(os.path.basename(c.name or "") in DOWNLOADERS for c in target.subst):
                step.raise_to(DANGEROUS, f"{base} runs a downloaded script")
            else:
                step.raise_to(UNKNOWN, f"{base} runs the output of a command as code")
            step.coverable = False
            return
        if target.value is None:
            step.raise_to(UNKNOWN, f"{base} runs a script at a computed path")
            return
        if target.value in ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "-"):
            self.from_stdin(step, base, out, depth, shell=base in SHELLS or base in ("source", "."))

    def from_stdin(self, step: ProgramStep, base: str, out: list[ProgramStep], depth: int, shell: bool) -> None:
        cmd = step.cmd
        stdin = cmd.stdin if cmd is not None else ""
        if not stdin:
            return  # the tool gives commands /dev/null on standard input
        # What it reads differs from run to run: no "always" covers the shell, nor is it inert
        # (the code it reads is judged as steps of its own).
        step.coverable = False
        if stdin in ("heredoc", "herestring"):
            text = cmd.stdin_text
            if text is None:
                step.raise_to(UNKNOWN, f"{base} runs a here-document with computed parts")
            elif shell:
                out += self.expand(text, f"{base} <<", depth + 1, step.dirs or None)
            else:
                step.raise_to(UNKNOWN, f"{base} runs code from a here-document, which is not checked")
            return
        if stdin == "file":
            step.raise_to(ORDINARY, f"{base} runs a script read from a file")
            return
        ups = [os.path.basename(c.name) if c.name else None for c in cmd.upstream]
        if any(u in DOWNLOADERS for u in ups if u):
            step.raise_to(DANGEROUS, f"{base} runs a downloaded script")
            return
        if shell and cmd.upstream and all(_literal_echo(c) is not None for c in cmd.upstream):
            out += self.expand("\n".join(_literal_echo(c) for c in cmd.upstream), f"echo | {base}", depth + 1,
                               step.dirs or None)
            return
        step.raise_to(UNKNOWN, f"{base} runs text from a pipe as code (decoded or computed text is not checked)")
