"""The per-program rules: what each known program does with its options and operands (rm, cp,
chmod, tar, kill, set, shopt, awk, the service managers ...), and the judgements of system
programs, crontab, environment assignments and echoed scripts that the analyser asks for.
"""

from __future__ import annotations

import os
import re

from ..shellparse import Command, Word
from .model import DANGEROUS, UNKNOWN, ProgramStep
from .options import Opts, has_long, opt_values, scan
from .tables import (
    _ANY_ARGS,
    _CHMOD_DASH_MODE,
    _ENV_OK,
    _ENV_VALUE_OK,
    _MAKES_FILES,
    _OUTPUT_OPERAND,
    _SERVICE_READ,
    _SERVICES,
    _SETFACL_VALUES,
    _SYSTEM,
    _TAR_OLD_VALUES,
    _chattr_words,
    _output_file,
)
from .texttools import _SED_VALUES, _awk_reads_only, _sed_script_ok


def _crontab_lists(s: ProgramStep) -> bool:
    """``crontab -l`` (also with ``-u USER``) only lists a crontab; any other letter, or a file
    operand (a crontab to install), changes one."""
    o = scan(s.argv[1:], "u")
    return "l" in o.shorts and set(o.shorts) <= {"l", "u"} and not o.operands


# What a script is named with: `format.sh` or `at.py` is a project's script, not mkfs.ext4's kind.
_SCRIPT_EXTS = {"sh", "bash", "zsh", "fish", "py", "js", "mjs", "cjs", "ts", "rb", "pl", "php", "lua", "ps1", "bat",
                "cmd", "r", "jl", "exs", "tcl", "swift", "kts", "groovy"}


def _system_family(prog: str, base: str) -> str | None:
    """The system program a variant belongs to (mkfs.ext4, mount.nfs, sudo.ws, pivot_root.x):
    its stem before the first dot, or before the first dot or underscore. A program named by a
    path outside the system directories (./format.sh, scripts/at.py) is the project's own, and
    a script's extension says the same of a bare name."""
    if prog != base and not _system_program(prog):
        return None
    stem, dot, ext = base.partition(".")
    if dot and ext.lower() in _SCRIPT_EXTS:
        return None
    return next((f for f in (stem, re.split(r"[._]", base)[0]) if f in _SYSTEM), None)


def _system_program(prog: str) -> bool:
    d = os.path.dirname(prog)
    return d in ("/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/opt/homebrew/bin")


def _env_ok(name: str, value: Word) -> bool:
    if not _ENV_OK.fullmatch(name):
        return False
    allowed = _ENV_VALUE_OK.get(name, ...)
    if allowed is ...:
        return value.value is not None or name not in ("PYTHONPATH", "TMPDIR")
    if allowed is None:
        return value.value is not None and not any(c in value.value for c in "$`")
    return value.value in allowed


def _literal_echo(c: Command) -> str | None:
    """The text an ``echo``/``printf`` with only static words writes, when it is that simple."""
    if not c.words or c.name not in ("echo", "printf") or any(w.value is None for w in c.words):
        return None
    args = [w.value for w in c.words[1:]]
    if c.name == "echo":
        if args and args[0] in ("-n", "-E"):
            args = args[1:]
        if args and args[0].startswith("-"):
            return None
        return " ".join(args)
    if not args or any(ch in args[0] for ch in "%\\") or len(args) > 1:
        return None
    return args[0]


class ProgramRules:
    """The per-program rules of Analyzer (mixed in): what each known program does with its
    options and operands."""

    def program_rules(self, s: ProgramStep, base: str) -> None:
        args = s.argv[1:]
        vals = [w.value for w in args]
        if base == "rm":
            o = scan(args)
            if "r" in o.shorts or "R" in o.shorts or has_long(o, "--recursive"):
                s.raise_to(DANGEROUS, "recursive delete")
            if "f" in o.shorts or has_long(o, "--force"):
                s.raise_to(DANGEROUS, "forced delete")
            if has_long(o, "--no-preserve-root"):
                s.raise_to(DANGEROUS, "delete without root protection")
            self.option_risk(s, o, "rm")
            self.writes(s, o.operands, "deletes")
        elif base in _MAKES_FILES:
            o = scan(args, *_MAKES_FILES[base])
            self.writes(s, o.operands, "writes")
        elif base in ("cp", "install", "ln", "rsync", "scp"):
            o = scan(args, "tSm" if base != "rsync" else "efT", {"--target-directory", "--suffix", "--mode", "--rsh",
                                                                     "--filter", "--exclude", "--include",
                                                                     "--temp-dir"})
            targets = opt_values(o, "-t", "--target-directory")
            ops = [w for w in o.operands if not (w.value and ":" in w.value.split("/")[0] and base in ("rsync", "scp"))]
            if base == "install" and "d" in o.shorts:
                targets += o.operands
            elif not targets and len(o.operands) >= 2 and ops and ops[-1] is o.operands[-1]:
                targets = [o.operands[-1]]
            self.writes(s, targets, "writes")
            if base == "rsync" and (has_long(o, "--remove-source-files") or has_long(o, "--delete")):
                self.writes(s, o.operands, "deletes")
                if has_long(o, "--delete"):
                    s.raise_to(DANGEROUS, "rsync --delete removes files")
            if base == "rsync" and ("e" in o.shorts or has_long(o, "--rsh")):
                s.not_coverable("rsync runs a remote shell command")
        elif base == "mv":
            o = scan(args, "tS", {"--target-directory", "--suffix"})
            self.writes(s, o.operands + opt_values(o, "-t", "--target-directory"), "moves")
        elif base == "dd":
            for w in args:
                if w.value is None:
                    s.raise_to(UNKNOWN, "dd with computed operands")
                elif w.value.startswith("of="):
                    self.writes(s, [Word(w.value[3:], w.source)], "writes")
        elif base == "chattr":
            files, recursive = _chattr_words(args)
            if recursive:
                s.raise_to(DANGEROUS, "recursive permission or owner change")
            self.writes(s, files, "changes")
        elif base in ("chmod", "chown", "chgrp", "setfacl", "chflags"):
            # The first operand is the mode or owner, the files that change come after it; but
            # chmod's mode may be written as options before any -- (chmod -x run.sh, -w,o+r: GNU
            # joins them into one mode), setfacl's ACL is an option's value, and --reference
            # takes the mode from a file: then every operand is a file that changes.
            end = next((i for i, w in enumerate(args) if w.value == "--"), len(args))
            dash_mode = [w for w in args[:end] if base == "chmod" and w.value and _CHMOD_DASH_MODE.fullmatch(w.value)]
            o = scan([w for w in args if w not in dash_mode], "" if base != "setfacl" else "mMxX",
                     {"--reference", "--from"} if base != "setfacl" else _SETFACL_VALUES)
            if "R" in o.shorts or has_long(o, "--recursive"):
                s.raise_to(DANGEROUS, "recursive permission or owner change")
            self.option_risk(s, o, base)
            every = base == "setfacl" or opt_values(o, "--reference") or dash_mode
            self.writes(s, o.operands if every else o.operands[1:], "changes")
        elif base == "find":
            o = vals
            for v in o:
                if v in ("-delete",):
                    s.raise_to(DANGEROUS, "find -delete removes files")
                if v in ("-fprint", "-fprint0", "-fprintf", "-fls"):
                    i = o.index(v)
                    if i + 1 < len(args):
                        self.writes(s, [args[i + 1]], "writes")
        elif base in _OUTPUT_OPERAND:
            self.writes(s, _output_file(base, args), "writes")
        elif base == "git":
            self.git(s, args)
        elif base == "kill":
            self.kill(s, args)
        elif base in ("systemctl", "service", "launchctl", "initctl", "rc-service", "sv"):
            o = scan(args, "H M", {"--host", "--machine"})
            sub = next((w.value for w in o.operands), None)
            if sub is None and o.operands:
                s.raise_to(UNKNOWN, f"{base} with a computed action")
            # service and OpenRC's rc-service name the service first, the action second.
            elif sub not in _SERVICE_READ and not (base in ("service", "rc-service") and len(o.operands) > 1
                                                   and o.operands[1].value in _SERVICE_READ):
                s.raise_to(DANGEROUS, f"{base}: changes system services")
        elif base == "init" and vals[:1] and vals[0] in ("0", "6", "1", "s", "S"):
            s.raise_to(DANGEROUS, "init: stops the machine")
        elif base in ("sysctl",):
            if any(v and ("=" in v or v in ("-w", "--write", "-p", "--load")) for v in vals):
                s.raise_to(DANGEROUS, "changes kernel settings")
        elif base in ("curl",):
            o = scan(args, "odDcKTuXHeEbrwxAFyYz",
                     {"--output", "--dump-header", "--cookie-jar", "--trace", "--trace-ascii",
                                                     "--output-dir", "--config", "--upload-file", "--stderr",
                                                     "--libcurl",
                                                     "--etag-save", "--hsts", "--alt-svc"})
            self.writes(s, opt_values(o, "-o", "--output", "-D", "--dump-header", "-c", "--cookie-jar", "--trace",
                                      "--trace-ascii", "--output-dir", "--stderr", "--libcurl", "--etag-save",
                                      "--hsts", "--alt-svc"), "writes")
            if opt_values(o, "-K", "--config"):
                # A config file holds more options (output = /x ...), which are not checked.
                s.raise_to(UNKNOWN, "curl reads options from a file, which are not checked")
                s.coverable = False
        elif base in ("wget",):
            # Every short option of GNU wget that takes a value, so that none swallows the next word.
            o = scan(args, "OoaPXIDARetTwQBiUl", {"--output-document", "--output-file", "--append-output",
                                                 "--directory-prefix", "--execute", "--config"})
            if opt_values(o, "-e", "--execute", "--config"):
                # A wgetrc command (-e output_document=/x) or file can set where wget writes.
                s.raise_to(UNKNOWN, "wget runs wgetrc commands given in its options, which are not checked")
                s.coverable = False
            self.writes(s, opt_values(o, "-O", "--output-document", "-o", "--output-file", "-a", "--append-output",
                                      "-P", "--directory-prefix"), "writes")
        elif base in ("tar", "bsdtar", "gtar"):
            # GNU tar's short options that take a value, less -H and -L: bsdtar (macOS's tar) reads
            # them as flags, and a flag taken for a value option would swallow the next word
            # (tar -c -L -f x); a value read as an operand is only named, which asks no less.
            o = scan(args, "bCfFgIKNTVX",
                     {"--file", "--directory", "--use-compress-program", "--to-command", "--files-from",
                      "--checkpoint-action", "--info-script", "--new-volume-script", "--rsh-command",
                      "--listed-incremental", "--exclude-from"})
            first = vals[0] if vals else ""
            # Old style (tar cf out.tar src, tar xfC a.tar dir): a first word of letters without a
            # dash, each letter that takes a value taking the next word, in order.
            old: dict[str, list[Word]] = {}
            if first and first.isalpha():
                rest = iter(args[1:])
                for ch in first:
                    w = next(rest, None) if ch in _TAR_OLD_VALUES else None
                    if w is not None:
                        old.setdefault(ch, []).append(w)

            def given(short: str, *longs: str) -> list[Word]:
                return opt_values(o, "-" + short, *longs) + old.get(short, [])

            if (given("I", "--use-compress-program") or given("F", "--info-script", "--new-volume-script")
                    or opt_values(o, "--to-command", "--checkpoint-action", "--rsh-command")):
                s.raise_to(UNKNOWN, "tar runs a program given in its options")
                s.coverable = False
            # The incremental snapshot file is rewritten by every run that uses it.
            self.writes(s, given("g", "--listed-incremental"), "writes")
            letters = set(o.shorts) | (set(first.lstrip("-")) if first and not first.startswith("--") else set())
            if "x" in letters or has_long(o, "--extract") or has_long(o, "--get"):
                self.writes(s, given("C", "--directory"), "extracts into")
            # c creates the archive; r, u, A (append, update, catenate) and --delete change it in place
            if letters & set("cruA") or any(has_long(o, x) for x in ("--create", "--append", "--update", "--catenate",
                                                                     "--concatenate", "--delete")):
                self.writes(s, given("f", "--file"), "writes")
        elif base == "unzip":
            o = scan(args, "d")
            self.writes(s, opt_values(o, "-d"), "extracts into")
        elif base in ("7z", "7za", "7zr"):
            # 7-Zip: a command letter, the archive, then files; switches are one word each, their
            # value attached (-o/out, -pSECRET). a/u/d/rn change the archive, e/x extract (into -o).
            ops = [w for w in args if not (w.value and w.value.startswith("-"))]
            cmd = ops[0].value if ops else None
            if cmd in ("a", "u", "d", "rn"):
                self.writes(s, ops[1:2], "writes")
            elif cmd in ("e", "x"):
                self.writes(s, [Word(None if w.value is None else w.value[2:], w.source) for w in args
                                if (w.value or w.source).startswith("-o")], "extracts into")
        elif base in ("sed", "gsed"):
            o = scan(args, *_SED_VALUES)
            scripts = opt_values(o, "-e", "--expression")
            from_file = "f" in o.shorts or has_long(o, "--file")
            if from_file:
                s.raise_to(UNKNOWN, "sed runs a script from a file, which is not checked")
                s.coverable = False
            # Without -e or -f the first operand is the script; with -f alone every operand is a file.
            for sc in scripts or ([] if from_file else o.operands[:1]):
                if sc.value is None or not _sed_script_ok(sc.value):
                    s.raise_to(UNKNOWN, "the sed script may run commands or write files (e, w, r ...)")
                    s.coverable = False
            if "i" in o.shorts or has_long(o, "--in-place"):
                files = o.operands if (opt_values(o, "-e", "--expression", "-f", "--file")) else o.operands[1:]
                self.writes(s, files, "edits")
        elif base in _SERVICES:
            # The work is done by a daemon that the sandbox does not confine: every use asks.
            s.not_coverable(f"{base} asks a service outside the sandbox to run things")
        elif base in ("nsenter", "unshare", "firejail", "bwrap", "sandbox-exec", "nsjail", "capsh", "setpriv"):
            s.raise_to(UNKNOWN, f"{base} changes the process's namespaces or privileges")
            s.coverable = False
        elif base in ("enable", "hash", "alias", "shopt", "set", "ulimit", "unalias", "complete", "bind"):
            self.shell_setting(s, base, args)
        elif base in ("ssh-keygen", "ssh-add", "security", "gpg", "gpg2", "keyctl", "pass", "op"):
            s.not_coverable(f"{base} touches keys or secrets")
        if base in ("awk", "gawk", "mawk", "nawk"):
            self.awk(s, base, args)
        if base not in _ANY_ARGS and base not in ("cd", "pushd", "popd"):
            self.operand_places(s, base, args)

    def kill(self, s: ProgramStep, args: list[Word]) -> None:
        """kill [-s SIG | -n NUM | -SIG] [--] TARGET...: -1 is every process, -N a group."""
        vals = [w.value for w in args]
        first = vals[0] if vals else None
        if first in ("-l", "-L", "--list", "--table"):
            return  # lists or names signals: kills nothing
        # The signal comes first, in two words (-s SIG, -n NUM, --signal SIG) or one (-SIG). A
        # `--` is passed over as if it were the signal, or judged as a target after one: either
        # way it names no process, so it needs no case of its own.
        i = 2 if first in ("-s", "-n", "--signal") else 1 if first is not None and first.startswith("-") else 0
        for w in args[i:]:
            v = w.value
            if v is None:
                s.raise_to(UNKNOWN, f"kill of a computed process ({w.source[:40]})")
            elif v == "-1":
                s.raise_to(DANGEROUS, "kills every process it can (kill -1)")
            elif v.startswith("-") and v[1:].isdigit():
                s.raise_to(DANGEROUS, "kills a whole process group")

    def shell_setting(self, s: ProgramStep, base: str, args: list[Word]) -> None:
        vals = [w.value for w in args]
        if base == "set":
            ok = all(v is not None and re.fullmatch(r"[-+][euxvnfCBHhTbmPk]+|[-+]o|pipefail|errexit|nounset|"
                                                    r"xtrace|verbose|noglob|noclobber|errtrace|functrace|--", v)
                     for v in vals)
            # The letters leave out a (allexport: every variable set after it is exported to the
            # programs it runs), so an `ok` line never turns it on.
            if ok:
                s.inert = True
            else:
                s.not_coverable("set changes how the shell runs what follows")
                # -a, -xa, -o allexport
                if any(v == "allexport" or (v and v.startswith("-") and "a" in v) for v in vals):
                    self.tainted = self.tainted or "set -a exports every variable set after it"
            return
        if base == "shopt":
            names = [v for v in vals if v and not v.startswith("-")]
            if all(n in ("nullglob", "globstar", "dotglob", "failglob", "nocaseglob", "extglob", "nocasematch",
                         "lastpipe",
                         "inherit_errexit", "pipefail") for n in names):
                s.inert = True
            else:
                s.not_coverable("shopt changes how the shell reads what follows")
                self.tainted = self.tainted or "shopt changes how the shell reads the commands after it"
            return
        if base in ("hash", "enable", "alias", "bind", "complete"):
            if base == "hash" and not args:
                s.inert = True
                return
            s.raise_to(UNKNOWN, f"{base} changes which programs later names run")
            self.tainted = self.tainted or f"{base} changes which programs the names after it run"
            return
        s.inert = base in ("ulimit", "unalias")

    def option_risk(self, s: ProgramStep, o: Opts, base: str) -> None:
        """Computed words and file patterns can become options (a file named -rf)."""
        if o.computed:
            s.raise_to(UNKNOWN,
                       f"{base} with arguments the shell computes ({o.computed[0].source[:40]}), which may be options")
        for w in o.operands:
            if w.glob and w.value is not None and w.value[:1] in "*?[" and not o.ended:
                s.raise_to(UNKNOWN, f"{base} {w.value}: the pattern may match file names that read as options")
                break

    def awk(self, s: ProgramStep, base: str, args: list[Word]) -> None:
        # Only the options whose value decides which word is the program are read as taking the
        # next one (-v, -F, --assign, --field-separator, --source): a program from a file
        # (-f/-i/-l/-E, --file/--include/--load/--exec) is refused whatever follows.
        o = scan(args, "fvFilE", {"--assign", "--field-separator", "--source"}, permute=False)
        if opt_values(o, "-f", "-i", "-l",
                      "-E") or any(has_long(o, x) for x in ("--file", "--include", "--load", "--exec")):
            s.raise_to(UNKNOWN, f"{base} runs a program from a file, which is not checked")
            s.coverable = False
            return
        prog = next(iter(opt_values(o, "--source")), None) or (o.operands[0] if o.operands else None)
        if prog is None:
            return
        if prog.value is None:
            s.raise_to(UNKNOWN, f"{base} runs a computed program")
            s.coverable = False
        elif not _awk_reads_only(prog.value):
            s.raise_to(UNKNOWN, f"the {base} program may run commands or write files (system, |, >, getline ...)")
            s.coverable = False
