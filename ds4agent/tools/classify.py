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
"""

from __future__ import annotations

import glob as globmod
import itertools
import os
import re
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .shellparse import UNKNOWN_DIR, Command, Redirect, Script, Word, parse

SAFE, ORDINARY, UNKNOWN, DANGEROUS = 0, 1, 2, 3
LEVELS = ("safe", "ordinary", "unknown", "dangerous")
MAX_NESTING = 8  # bash -c "bash -c '...'" deeper than this is unknown
MAX_WRAPPERS = 16  # nice nice ... rm: a wrapper this many deep is not looked through
MAX_COMMAND = 100_000  # characters; longer commands are not parsed (unknown)


# -- results ------------------------------------------------------------------------------------

@dataclass
class Step:
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
    steps: list[Step] = field(default_factory=list)
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


# -- paths --------------------------------------------------------------------------------------

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
        if s in NULL_DEVICES or s.startswith(("/dev/fd/", "/proc/self/fd/", "/dev/pts/")) or re.fullmatch(r"/dev/ttys\d+", s):
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
        if any(_under(p, t) and _under(real, t) for t in self.tmp) or (_under(p, self.root) and any(_under(real, t) for t in self.tmp)):
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


# -- program knowledge ----------------------------------------------------------------------------

SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash", "posh"}
# Interpreters and how they take a program on the command line. PowerShell (pwsh, powershell) is
# not listed: its parameters are case-insensitive prefixes in any spelling, found by their own
# rule in _Analyzer.nested_shell.
INLINE = {"python": "c", "pypy": "c", "node": "e p", "nodejs": "e p", "deno": "", "bun": "e", "perl": "e E",
          "ruby": "e", "php": "r", "lua": "e", "luajit": "e", "Rscript": "e", "R": "e", "julia": "e",
          "osascript": "e", "tclsh": "", "jshell": "", "irb": "e", "swift": "e",
          "expect": "c"}
INLINE_LONG = {"node": {"--eval", "--print"}, "nodejs": {"--eval", "--print"}, "bun": {"--eval", "--print"},
               "deno": set()}
DOWNLOADERS = {"curl", "wget", "fetch", "aria2c", "http", "https", "xh", "lynx", "links", "nc", "ncat", "socat",
               "ssh", "scp", "sftp", "ftp", "tftp", "rsync", "git"}  # git: `git show URL:file`, archive --remote
WRAPPERS = {"env", "nice", "nohup", "time", "timeout", "stdbuf", "setsid", "ionice", "chrt", "taskset", "command",
            "builtin", "exec", "caffeinate", "arch", "unbuffer", "xvfb-run", "coproc", "doas", "sudo", "flock",
            "gtimeout", "torsocks", "proxychains", "proxychains4", "strace", "ltrace", "valgrind", "catchsegv",
            "systemd-run"}
# The options of each wrapper that take a value as the next word (_Analyzer.inner knows where
# its command starts). A wrapper not listed (setsid, valgrind, unbuffer ...) takes no option with
# a separate value. Options whose value is optional take it only attached (env --block-signal=INT),
# so they are not listed.
_WRAPPER_ARGS = {
    "env": ("uSC", {"--unset", "--chdir", "--split-string"}),
    "nice": ("n", {"--adjustment"}), "timeout": ("sk", {"--signal", "--kill-after"}),
    "gtimeout": ("sk", {"--signal", "--kill-after"}), "stdbuf": ("ioe", {"--input", "--output", "--error"}),
    "ionice": ("cnpPu", {"--class", "--classdata", "--pid", "--pgid", "--uid"}), "chrt": ("TPD", {"--sched-runtime", "--sched-period", "--sched-deadline"}),
    "exec": ("a", set()), "caffeinate": ("tw", set()),
    "sudo": ("ugpCDhrtTRU", {"--user", "--group", "--prompt", "--close-from", "--chdir", "--host", "--role", "--type",
                             "--command-timeout", "--chroot", "--other-user"}),
    "doas": ("uC", set()), "flock": ("wEc", {"--timeout", "--conflict-exit-code", "--command"}),
    "strace": ("oeEpPsSuXbaI", {"--output", "--expr", "--attach", "--user", "--trace-path"}),
    "ltrace": ("aADeFlnopsuwx", {"--output", "--library", "--config", "--where", "--align", "--indent", "--user"}), "xvfb-run": ("nsfewp", {"--server-num", "--error-file", "--auth-file", "--server-args", "--xauth-protocol"}),
    "time": ("fo", {"--format", "--output"}), "torsocks": ("uaPp", set()), "proxychains": ("f", set()),
    "proxychains4": ("f", set()),
    "systemd-run": ("pEuM", {"--unit", "--property", "--description", "--slice", "--uid", "--gid", "--nice",
                             "--working-directory", "--setenv", "--on-active", "--on-boot", "--on-calendar",
                             "--timer-property", "--path-property", "--socket-property", "--machine", "--host"}),
}
# Programs that stop the machine, touch disks, change system state or other users' processes.
_SYSTEM = {
    **dict.fromkeys(["mkfs", "mke2fs", "mkswap", "fdisk", "sfdisk", "cfdisk", "gdisk", "sgdisk", "parted", "wipefs",
                     "blkdiscard", "hdparm", "losetup", "cryptsetup", "newfs", "diskutil", "format", "mkdosfs",
                     "badblocks", "zpool", "zfs", "lvremove", "vgremove", "pvremove", "dmsetup", "nvme"],
                    "writes to disks"),
    **dict.fromkeys(["mount", "umount", "swapon", "swapoff", "chroot", "pivot_root"], "changes mounts or the root directory"),
    **dict.fromkeys(["shutdown", "reboot", "halt", "poweroff", "telinit", "kexec", "pmset"], "stops the machine"),
    **dict.fromkeys(["killall", "pkill", "xkill", "killall5", "skill", "slay", "fuser"], "kills processes broadly"),
    **dict.fromkeys(["sudo", "doas", "su", "pkexec", "run0", "sudoedit", "runuser", "ksu", "calife"], "runs as another user"),
    **dict.fromkeys(["crontab", "at", "batch", "atrm"], "changes scheduled jobs"),
    **dict.fromkeys(["passwd", "chpasswd", "useradd", "userdel", "usermod", "groupadd", "groupdel", "groupmod",
                     "adduser", "deluser", "visudo", "vipw", "dscl", "chsh", "chfn"], "changes user accounts"),
    **dict.fromkeys(["insmod", "rmmod", "modprobe", "kextload", "kextunload", "csrutil", "nvram", "bless", "efibootmgr",
                     "grub-install", "update-grub"], "changes the kernel or the boot setup"),
    **dict.fromkeys(["iptables", "ip6tables", "nft", "ufw", "pfctl", "firewall-cmd"], "changes the firewall"),
    **dict.fromkeys(["shred", "srm", "wipe"], "destroys file contents"),
}
# Programs whose operands are the files they make, change or remove, with the options that
# take a value (touch -d "2 days ago" f: the date is not a file; touch -r REF only reads REF).
_MAKES_FILES = {"rmdir": ("", set()), "unlink": ("", set()), "tee": ("", set()),
                "touch": ("drt", {"--date", "--reference", "--time"}), "truncate": ("sr", {"--size", "--reference"}),
                "mkdir": ("m", {"--mode"}), "mkfifo": ("m", {"--mode"}), "mknod": ("m", {"--mode"}),
                "shred": ("ns", {"--iterations", "--size", "--random-source"})}
# tar's short options that take a value, which old-style bundles (tar cbf 20 a.tar) take in order.
_TAR_OLD_VALUES = set("bCfFgHIKLNTVX")
# A chmod mode written with a leading dash: letters GNU chmod reads as permissions, not options.
_CHMOD_DASH_MODE = re.compile(r"-[rwxXst]+(,[ugoa]*[-+=][rwxXstugo]*)*")
# setfacl's long options that take the next word (its ACL or a file of them); with --restore it
# reads a dump and names no file (the operands it is given are refused).
_SETFACL_VALUES = frozenset({"--set", "--set-file", "--modify", "--modify-file", "--remove", "--remove-file",
                             "--restore"})


def _chattr_words(args: list[Word]) -> tuple[list[Word], bool]:
    """chattr's files, and whether it recurses. chattr reads every leading word that starts
    with -, + or = as attributes or options (`chattr -i f` clears the immutable flag: -i is
    no option), -v and -p each take the next word (a version, a project), and -R recurses;
    the files start at the first other word (-- is no end of options: chattr refuses it)."""
    i, recursive = 0, False
    while i < len(args):
        v = args[i].value
        if v is None or len(v) < 2 or v[0] not in "-+=":
            break
        i += 1
        if v[0] == "-":
            recursive = recursive or "R" in v
            i += v.count("v") + v.count("p")
    return args[i:], recursive


# Programs that hand work to a daemon running outside the sandbox (containers, terminal
# multiplexers, the service manager, the desktop): confined or not, the result is not.
_SERVICES = {"docker", "podman", "nerdctl", "colima", "lima", "limactl", "kubectl", "tmux", "screen", "byobu",
             "systemd-run", "open", "osascript", "dbus-send", "busctl", "gdbus", "qdbus", "xdg-open", "gio",
             "ssh-agent", "gpg-connect-agent", "xdotool", "ydotool", "wmctrl", "code", "emacsclient", "nvr"}
_RESERVED = {"{", "}", "(", ")", "then", "do", "done", "fi", "esac", "elif", "else", "in", "function", "select",
             "until", "while", "if", "case", "for", "[[", "]]", "!", "coproc"}
_SERVICE_READ = {"status", "show", "list-units", "list-unit-files", "is-active", "is-enabled", "is-failed", "cat",
                 "list", "print", "help", "list-timers", "list-sockets", "list-dependencies", "get-default"}

# Everyday read-only programs that may run without asking in auto-edit (inside the sandbox),
# each with the options that would make it write files, run programs or follow symlinks out
# of the workspace. Short options are letters; long ones match GNU-style abbreviations too.
SAFE_PROGRAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ls": ("L", ("--dereference",)), "cat": ("", ()), "head": ("", ()), "tail": ("", ()), "wc": ("", ("--files0-from",)),
    "cut": ("", ()), "nl": ("", ()), "tac": ("", ()), "rev": ("", ()), "paste": ("", ()), "join": ("", ()),
    "comm": ("", ()), "cmp": ("", ()), "diff": ("", ("--to-file", "--from-file")), "stat": ("L", ("--dereference",)),
    "du": ("L", ("--dereference", "--files0-from")), "df": ("", ()), "grep": ("R", ("--dereference-recursive",)),
    "egrep": ("R", ("--dereference-recursive",)), "fgrep": ("R", ("--dereference-recursive",)),
    "rg": ("L", ("--pre", "--follow", "--search-zip")), "basename": ("", ()), "dirname": ("", ()), "realpath": ("", ()),
    "readlink": ("", ()), "pwd": ("", ()), "echo": ("", ()), "printf": ("v", ()), "true": ("", ()), "false": ("", ()),
    "test": ("", ()), "[": ("", ()), "which": ("", ()), "id": ("", ()), "whoami": ("", ()), "uname": ("", ()),
    "md5sum": ("", ()), "sha1sum": ("", ()), "sha224sum": ("", ()), "sha256sum": ("", ()), "sha384sum": ("", ()),
    "sha512sum": ("", ()), "b2sum": ("", ()), "cksum": ("", ()), "shasum": ("", ()), "md5": ("", ()),
    "strings": ("", ()), "od": ("", ()), "hexdump": ("", ()), "seq": ("", ()), "sleep": ("", ()), "expr": ("", ()),
    "column": ("", ()), "fold": ("", ()), "fmt": ("", ()), "expand": ("", ()), "unexpand": ("", ()),
    "nproc": ("", ()), "printenv": ("", ()), "locale": ("", ()), "tr": ("", ()), "file": ("Cm", ("--compile", "--magic-file")),
    "jq": ("", ("--rawfile", "--slurpfile")), "sort": ("oT", ("--output", "--compress-program", "--temporary-directory", "--files0-from")),
    "uniq": ("", ()), "tree": ("oRlH", ("--fromfile", "--output",)), "find": ("L", ()), "fd": ("xXL", ("--exec", "--exec-batch", "--follow")),
    "fdfind": ("xXL", ("--exec", "--exec-batch", "--follow")), "xxd": ("", ()), "base64": ("o", ("--output",)),
    "date": ("sf", ("--set", "--file")), "hostname": ("Fb", ("--file", "--boot")), "env": ("", ()), "type": ("", ()),
    # sed's script and options are judged by _sed_safe, awk's by awk() (anything but a read-only
    # program is raised above ORDINARY there): no letters here.
    "sed": ("", ()), "awk": ("", ()), "gawk": ("", ()), "mawk": ("", ()), "nawk": ("", ()),
    "cd": ("", ()), "pushd": ("", ()), "popd": ("", ()), "dirs": ("", ()), ":": ("", ()), "git": ("", ()),
    "tty": ("", ()), "getconf": ("", ()), "ps": ("", ()), "free": ("", ()), "uptime": ("", ()), "lsb_release": ("", ()),
    "sw_vers": ("", ()), "groups": ("", ()), "less": ("", ()), "more": ("", ()),
}
# Read-only programs whose second operand is an output file (uniq IN OUT, xxd IN OUT; "-" is
# stdout, also as the input), with the options that take a value.
_OUTPUT_OPERAND = {"uniq": ("fsw", {"--skip-fields", "--skip-chars", "--check-chars"}), "xxd": ("cglosnR", set())}


def _output_file(base: str, args: list[Word]) -> list[Word]:
    """uniq's or xxd's output file ([] when there is none, or it is "-")."""
    out = scan(args, *_OUTPUT_OPERAND[base]).operands[1:2]
    return out if out and out[0].value != "-" else []

_NOT_PAGERS = {"less", "more"}  # listed only to be refused a clear reason
# Programs whose every operand may be anything (strings, not paths or options that matter).
_ANY_ARGS = {"echo", "printf", "true", "false", ":", "test", "[", "expr", "seq", "sleep", "basename", "dirname"}
# Shell builtins: no PATH lookup.
_BUILTINS = {"echo", "printf", "true", "false", ":", "test", "[", "cd", "pwd", "pushd", "popd", "dirs", "type",
             "command", "builtin", "exec", "eval", "source", ".", "export", "declare", "local", "readonly", "typeset",
             "set", "shopt", "unset", "trap", "wait", "read", "shift", "return", "exit", "break", "continue", "let",
             "alias", "unalias", "hash", "enable", "ulimit", "umask", "getopts", "jobs", "fg", "bg", "disown",
             "kill", "times", "caller", "mapfile", "readarray", "history", "fc", "help", "compgen", "complete", "logout"}
_INERT = {"cd", "pushd", "popd", "dirs", "pwd", "echo", "printf", "true", "false", ":", "test", "[", "wait", "read",
          "shift", "return", "exit", "break", "continue", "let", "getopts", "jobs", "umask"}
# How xargs, find and fd run a program per input (the last word of a step's via): that echo or
# test is the program on disk, never inert like the shell's builtin.
_RUNS_PER_INPUT = {"xargs", "-exec", "-execdir", "-ok", "-okdir", "-x", "--exec", "-X", "--exec-batch"}
_VERSION_ONLY = {"python", "python3", "node", "npm", "npx", "pnpm", "yarn", "bun", "deno", "cargo", "rustc", "rustup",
                 "go", "gcc", "g++", "clang", "clang++", "cc", "c++", "make", "cmake", "pip", "pip3", "uv", "java",
                 "javac", "ruby", "gem", "perl", "php", "swift", "dotnet", "ld", "gdb",
                 "lldb", "poetry", "tsc", "ruff", "black", "mypy", "pytest", "bash", "zsh", "sh", "jq", "rg", "fd"}
# `--version` is a version query for all of them; the other spellings only where they are one.
# (Not git: `git --version` and `git version` are read-only by git's own rule, GIT_SAFE.)
# Elsewhere the same word runs something: `pytest -v` runs the tests, `python -v` and `bash -v`
# read commands, `make version` builds a target, `npx version` fetches and runs a package,
# `gcc version` compiles a file, `yarn version` bumps the project's version.
_VERSION_WORDS = {"version": {"go", "cargo", "ruff", "poetry", "uv"},
                  "-V": {"python", "python3", "cargo", "rustc", "rustup", "deno", "pip", "pip3", "uv", "perl", "rg",
                         "fd", "jq", "mypy", "pytest", "ruff", "poetry"},
                  "-v": {"node", "npm", "npx", "pnpm", "yarn", "bun", "gcc", "g++", "clang", "clang++", "cc", "c++",
                         "make", "perl", "php", "tsc"}}

# git: read-only subcommands, the options that make them write or run programs, and the
# subcommands that change .git (allowed to write it inside the sandbox when git runs alone).
GIT_SAFE: dict[str, tuple[str, ...]] = {
    "status": (), "diff": ("--output", "--ext-diff"), "log": ("--output", "--ext-diff"), "show": ("--output", "--ext-diff"),
    "blame": ("--contents",), "annotate": (), "rev-parse": (), "ls-files": (), "ls-tree": (), "cat-file": (),
    "describe": (), "shortlog": (), "grep": ("--open-files-in-pager", "--ext-grep"), "rev-list": (), "merge-base": (),
    "name-rev": (), "show-ref": (), "for-each-ref": (), "count-objects": (), "version": (), "whatchanged": ("--output",),
    "check-ignore": (), "check-attr": (), "diff-tree": ("--output", "--ext-diff"), "diff-files": ("--output",),
    "diff-index": ("--output",), "range-diff": ("--output",), "cherry": (), "var": (), "help": ("--web",),
    # listing forms only; see _git_listing (reflog's expire/delete/drop: DANGEROUS by git(), never asked)
    "branch": (), "tag": (), "remote": (), "config": (), "stash": (), "reflog": (), "worktree": (), "notes": (),
    "submodule": (), "symbolic-ref": (),
}
GIT_WRITES = {"add", "commit", "checkout", "switch", "restore", "reset", "stash", "merge", "rebase", "cherry-pick",
              "revert", "fetch", "pull", "push", "tag", "branch", "mv", "rm", "am", "apply", "notes", "init", "clone",
              "status", "diff", "log", "show", "blame", "rev-parse", "ls-files", "describe", "shortlog", "grep",
              "remote", "gc", "clean", "worktree", "sparse-checkout", "update-index", "read-tree", "write-tree",
              "commit-tree", "update-ref", "symbolic-ref", "reflog", "prune", "repack", "maintenance", "format-patch",
              "bisect", "restore", "range-diff", "rev-list", "cat-file", "show-ref", "for-each-ref", "merge-base",
              "ls-tree", "stage", "cherry", "whatchanged", "count-objects", "fsck", "lfs"}
# git -c keys that only change how output looks.
_GIT_BENIGN_CONFIG = re.compile(r"(color(\..*)?|core\.quotepath|log\.(date|decorate|abbrevcommit)|"
                                r"diff\.(noprefix|renames|mnemonicprefix|context|interhunkcontext|algorithm)|"
                                r"advice\..*|user\.(name|email)|init\.defaultbranch|safe\.directory|"
                                r"column\.ui)", re.I)


def _git_config_benign(setting: str) -> bool:
    """Whether ``git -c NAME=VALUE`` cannot make git run a program: NAME is one of the settings
    above, or pager.<command> turned on or off (any other value of it is the pager program, as
    for core.pager: `git -c pager.log='rm -rf x' log`)."""
    name, _, value = setting.partition("=")
    if name.lower().startswith("pager."):
        return value.lower() in ("", "true", "false", "yes", "no", "on", "off", "1", "0")
    return bool(_GIT_BENIGN_CONFIG.fullmatch(name))


_GIT_SHORT_VALUES = {"commit": "mFCcSt", "checkout": "bB", "switch": "cC", "push": "o", "tag": "mFu", "stash": "m",
                     "restore": "s", "merge": "msSX", "pull": "sX", "rebase": "sXx", "log": "nL", "show": "n",
                     "clone": "bbcoju", "worktree": "bB", "cherry-pick": "mXS", "revert": "mXS", "am": "pCS",
                     "clean": "e", "config": "f", "branch": "u", "grep": "efABC", "diff": "ULOSGM", "notes": "mFcC",
                     "fetch": "jo", "remote": "tm"}
_GIT_GLOBAL_ARG = {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--exec-path", "--super-prefix",
                   "--list-cmds", "--attr-source"}
# Environment variables a command may set without changing what programs run or read.
_ENV_OK = re.compile(r"(LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|COLUMNS|LINES|NO_COLOR|FORCE_COLOR|CLICOLOR(_FORCE)?|"
                     r"COLORTERM|CI|DEBUG|VERBOSE|QUIET|RUST_BACKTRACE|RUST_LOG|RUST_TEST_THREADS|RUST_MIN_STACK|"
                     r"NODE_ENV|PYTHONUNBUFFERED|PYTHONDONTWRITEBYTECODE|PYTHONHASHSEED|PYTHONWARNINGS|"
                     r"PYTHONIOENCODING|PYTHONUTF8|PYTHONFAULTHANDLER|PYTHONDEVMODE|PYTHONPATH|CGO_ENABLED|GOOS|GOARCH|"
                     r"GOMAXPROCS|GOEXPERIMENT|OMP_NUM_THREADS|MKL_NUM_THREADS|OPENBLAS_NUM_THREADS|"
                     r"CUDA_VISIBLE_DEVICES|HYPOTHESIS_PROFILE|TMPDIR|DS4_[A-Z_]+|GIT_PAGER|PAGER|NPM_CONFIG_COLOR|"
                     r"MallocNanoZone|OBJC_DISABLE_INITIALIZE_FORK_SAFETY|TQDM_DISABLE|TOKENIZERS_PARALLELISM|"
                     r"MLX_[A-Z_]+|CARGO_TERM_COLOR|CARGO_INCREMENTAL|JOBS|MAKEFLAGS|PYTEST_XDIST_AUTO_NUM_WORKERS)")
_ENV_VALUE_OK = {"GIT_PAGER": {"cat", ""}, "PAGER": {"cat", ""}, "MAKEFLAGS": None}
# Variables the shell itself reads to find programs, directories and startup code.
_SHELL_ENV = {"PATH", "CDPATH", "HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
              "GLOBIGNORE", "BASH_LOADABLES_PATH", "ZDOTDIR", "FPATH"}
_SHELL_ENV_NAMES = "|".join(sorted(_SHELL_ENV))
# Ways to set one of those besides NAME=value, which a command's words or grammar do not show as an
# assignment: arithmetic ((PATH=5)), let, ${PATH:=...}, a for/select loop variable, and builtins that
# set the variables they name (read, mapfile, getopts, printf -v). A mention in any of those places,
# quoted or not (the text may be a nested shell's), taints every program of the command: cheap, and
# it errs towards asking.
_SETS_SHELL_ENV = re.compile(
    rf"(?<![\w$.{{/-])({_SHELL_ENV_NAMES})\s*(?:\[[^\]]*\])?\s*(?:[-+*/%&|^]|<<|>>|\*\*)?=(?!=)"
    rf"|\$\{{({_SHELL_ENV_NAMES}):?="
    rf"|(?<![\w$])({_SHELL_ENV_NAMES})(?:\+\+|--)(?![\w-])"
    rf"|(?:\(\(|\blet\b)[^;&|\n]*?(?<![\w$])({_SHELL_ENV_NAMES})\b"
    rf"|\b(?:for|select)\s+({_SHELL_ENV_NAMES})\b"
    rf"|\b(?:read|mapfile|readarray|getopts|printf)\b[^;&|\n]*?(?<![\w$/.-])({_SHELL_ENV_NAMES})(?![\w/])")

_SUBCOMMAND_TOOLS = {"git", "npm", "pnpm", "yarn", "bun", "cargo", "go", "docker", "podman", "kubectl", "pip", "pip3",
                     "uv", "poetry", "pipenv", "conda", "mamba", "micromamba", "brew", "apt", "apt-get", "dnf", "yum",
                     "gem", "bundle", "rake", "mix", "dotnet", "gradle", "./gradlew", "mvn", "./mvnw", "swift",
                     "make", "just", "task", "nox", "hatch", "pdm", "rye", "deno", "terraform", "helm", "gh",
                     "meson", "ninja", "bazel", "bazelisk", "pants", "lerna", "nx", "turbo", "composer", "rustup",
                     "flutter", "dart", "zig", "stack", "cabal", "pixi", "tox", "xcodebuild", "xcrun", "corepack",
                     "ruff", "ctest", "pre-commit", "invoke", "fab", "sbt", "lein", "opam", "dune", "nix"}
_RUNNERS = {("npm", "run"), ("npm", "exec"), ("pnpm", "run"), ("pnpm", "exec"), ("pnpm", "dlx"), ("yarn", "run"),
            ("yarn", "dlx"), ("bun", "run"), ("bun", "x"), ("uv", "run"), ("uv", "tool"), ("poetry", "run"),
            ("pipenv", "run"), ("pdm", "run"), ("hatch", "run"), ("rye", "run"), ("conda", "run"), ("pixi", "run"),
            ("deno", "run"), ("deno", "task"), ("cargo", "run"), ("go", "run"), ("dotnet", "run"), ("nix", "run"),
            ("npx", ""), ("pnpx", ""), ("bunx", ""), ("uvx", ""), ("pipx", "run"), ("xcrun", "")}


def _interp(base: str) -> str | None:
    """The interpreter family of a program name: python3.12 -> python. (awk's program is
    judged by its own rule; busybox is a wrapper.)"""
    if base in INLINE:
        return base
    m = re.fullmatch(r"(python|pypy|ruby|perl|php|lua|node|pwsh|powershell)[0-9.]*[a-z]?", base)
    if m:
        return m.group(1)
    return None


# -- option scanning ----------------------------------------------------------------------------

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


# -- the analysis -------------------------------------------------------------------------------

class _Analyzer:
    def __init__(self, places: Places, env: dict[str, str] | None = None) -> None:
        self.places = places
        self.env = os.environ if env is None else env
        self.a: Analysis | None = None
        self.scripts: list[tuple[Script, set]] = []  # each parsed script, with the directories it starts in
        self.dirs_unreliable = False  # CDPATH or HOME changed: cd may go anywhere
        self.tainted = ""  # why programs after some point cannot be known (PATH changed ...)

    # phase 1: programs, through wrappers and nested shells
    def expand(self, text: str, via: str, depth: int, start: set | None = None) -> list[Step]:
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
        steps: list[Step] = []
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

    def command(self, cmd: Command, via: str, depth: int, start: set) -> list[Step]:
        if cmd.kind == "assignment":
            self.assignment(cmd.assigns, exported=False)
            return []
        step = Step(list(cmd.words), cmd.source, list(cmd.assigns), list(cmd.redirects), cmd, via=via,
                    dirs=self.resolve_dirs(cmd.cwd, start))
        if cmd.kind == "declaration":
            name = step.program  # (a declaration's keyword: never computed)
            exported = name == "export" or any(w.value and w.value.startswith("-") and "x" in w.value for w in step.argv[1:])
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

    def unwrap(self, step: Step, out: list[Step], depth: int) -> None:
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

    def inner(self, step: Step, base: str, args: list[Word], out: list[Step], depth: int) -> list[Word] | None:
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

    def find_exec(self, step: Step, base: str, args: list[Word], out: list[Step], depth: int) -> None:
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
                    sub = Step(inner, step.source, [], [], step.cmd, via=(step.via + f" find {v}").strip(), dirs=set(step.dirs))
                    out.append(sub)
                    self.unwrap(sub, out, depth)
                i = j + 1
                continue
            if base != "find" and v in ("-x", "--exec", "-X", "--exec-batch"):
                inner = [Word(None, w.source) if w.value is not None and "{" in w.value else w for w in args[i + 1:]]
                if inner:
                    sub = Step(inner + [Word(None, "{}")], step.source, [], [], step.cmd, via=f"{base} {v}", dirs=set(step.dirs))
                    out.append(sub)
                    self.unwrap(sub, out, depth)
                return
            i += 1

    def nested(self, step: Step, w: Word, via: str, out: list[Step], depth: int) -> None:
        if w.value is None:
            step.raise_to(UNKNOWN, f"{via} runs a computed command ({w.source[:60]})")
            return
        out += self.expand(w.value, via, depth + 1, step.dirs or None)

    def nested_shell(self, step: Step, base: str, args: list[Word], out: list[Step], depth: int) -> None:
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
            self.tainted = self.tainted or f"{base} runs a script in this shell, so the programs after it cannot be known"
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
            w.value is None or (w.value[:1] in ("-", "/") and w.value.lstrip("-/")[:1].lower() in ("c", "e")) for w in args)
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

    def script_source(self, step: Step, base: str, target: Word, out: list[Step], depth: int) -> None:
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

    def from_stdin(self, step: Step, base: str, out: list[Step], depth: int, shell: bool) -> None:
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

    # phase 3: each program
    def judge(self, s: Step) -> None:
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

    def reads_and_dirs(self, s: Step) -> None:
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

    def program_rules(self, s: Step, base: str) -> None:
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
                                                                     "--filter", "--exclude", "--include", "--temp-dir"})
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
            o = scan(args, "odDcKTuXHeEbrwxAFyYz", {"--output", "--dump-header", "--cookie-jar", "--trace", "--trace-ascii",
                                                     "--output-dir", "--config", "--upload-file", "--stderr", "--libcurl",
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

    def kill(self, s: Step, args: list[Word]) -> None:
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

    def shell_setting(self, s: Step, base: str, args: list[Word]) -> None:
        vals = [w.value for w in args]
        if base == "set":
            ok = all(v is not None and re.fullmatch(r"[-+][euxvnfCBHhTbmPk]+|[-+]o|pipefail|errexit|nounset|xtrace|verbose|"
                                                    r"noglob|noclobber|errtrace|functrace|--", v) for v in vals)
            # The letters leave out a (allexport: every variable set after it is exported to the
            # programs it runs), so an `ok` line never turns it on.
            if ok:
                s.inert = True
            else:
                s.not_coverable("set changes how the shell runs what follows")
                if any(v == "allexport" or (v and v.startswith("-") and "a" in v) for v in vals):  # -a, -xa, -o allexport
                    self.tainted = self.tainted or "set -a exports every variable set after it"
            return
        if base == "shopt":
            names = [v for v in vals if v and not v.startswith("-")]
            if all(n in ("nullglob", "globstar", "dotglob", "failglob", "nocaseglob", "extglob", "nocasematch", "lastpipe",
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

    def option_risk(self, s: Step, o: Opts, base: str) -> None:
        """Computed words and file patterns can become options (a file named -rf)."""
        if o.computed:
            s.raise_to(UNKNOWN, f"{base} with arguments the shell computes ({o.computed[0].source[:40]}), which may be options")
        for w in o.operands:
            if w.glob and w.value is not None and w.value[:1] in "*?[" and not o.ended:
                s.raise_to(UNKNOWN, f"{base} {w.value}: the pattern may match file names that read as options")
                break

    def git(self, s: Step, args: list[Word]) -> None:
        i = 0
        vals = [w.value for w in args]
        while i < len(args):
            v = vals[i]
            if v is None:
                s.raise_to(UNKNOWN, "git with a computed argument before the subcommand")
                return
            if not v.startswith("-"):
                break
            name = v.split("=", 1)[0]
            if name == "--config-env" or v.startswith("-c"):  # -c NAME=VALUE, or attached: -cNAME=VALUE
                value = v[2:] if v.startswith("-c") and len(v) > 2 else (v.split("=", 1)[1] if "=" in v else (vals[i + 1] if i + 1 < len(args) else ""))
                if value is None:
                    s.raise_to(UNKNOWN, "git -c with a computed setting")
                elif name == "--config-env" or not _git_config_benign(value):
                    s.raise_to(UNKNOWN, f"git -c {value.split('=', 1)[0]} can make git run programs")
                    s.coverable = False
            elif name in ("--exec-path", "--git-dir", "--work-tree") and ("=" in v or name != "--exec-path"):
                s.not_coverable(f"git {name} points git somewhere else")
                if name == "--exec-path":
                    s.raise_to(UNKNOWN, "git --exec-path runs git programs from elsewhere")
                # Its path (attached or the next word) is judged with git's other words, by
                # operand_places in program_rules.
            elif name == "-C":
                if i + 1 < len(args):
                    s.cwd = args[i + 1]
            if name in _GIT_GLOBAL_ARG and "=" not in v:  # its value is the next word
                i += 2
            else:
                i += 1
        if i >= len(args):
            s.inert = True  # bare `git` prints help
            return
        sub = vals[i]
        rest = args[i + 1:]
        if s.cwd is not None:
            d = s.cwd.value
            if d is None:
                s.raise_to(UNKNOWN, "git -C a computed directory")
        # Which short options take a value differs per subcommand; where it is not listed, none
        # do, so every letter of a cluster counts as an option (``git push -uf``).
        short_values = _GIT_SHORT_VALUES.get(sub or "", "")
        # Long options whose value may be the next word. Not those whose value is optional and
        # so only ever attached with `=` (git's parse-options): taking the next word for the
        # value of --recurse-submodules hid `--hard` in `git reset --recurse-submodules --hard`;
        # a --pretty with no `=` is followed by a revision.
        o = scan(rest, short_values, {"--message", "--file", "--author", "--date", "--template", "--format",
                                      "--output", "--upload-pack", "--receive-pack", "--exec", "--strategy",
                                      "--strategy-option", "--onto", "--source", "--pathspec-from-file", "--push-option",
                                      "--orphan", "--reuse-message", "--reedit-message", "--fixup", "--squash",
                                      "--cleanup", "--trailer", "--repo", "--conflict"})
        danger = None
        if o.computed and sub in ("push", "reset", "clean", "checkout", "restore", "switch", "branch", "stash", "rm",
                                  "gc", "reflog", "update-ref", "worktree", "submodule", "filter-branch", "prune"):
            s.raise_to(UNKNOWN, f"git {sub} with computed arguments ({o.computed[0].source[:40]})")
        if sub == "push":
            if "f" in o.shorts or "d" in o.shorts or any(has_long(o, x) for x in ("--force", "--force-with-lease", "--mirror",
                                                                                   "--delete", "--prune", "--force-if-includes")):
                danger = "force-push or remote delete"
            elif any(w.value and (w.value.startswith("+") or w.value.startswith(":")) for w in o.operands):
                danger = "force-push or remote delete (+refspec or :ref)"
        elif sub == "reset":
            if has_long(o, "--hard") or has_long(o, "--merge") or has_long(o, "--keep"):
                danger = "discards uncommitted work (git reset --hard)"
        elif sub == "clean":
            if "f" in o.shorts or has_long(o, "--force"):
                danger = "deletes untracked files (git clean -f)"
        elif sub == "checkout":
            if "f" in o.shorts or has_long(o, "--force") or has_long(o, "--discard-changes") or o.ended \
                    or any(w.value in (".", "*", ":/") for w in o.operands) or has_long(o, "--ours") or has_long(o, "--theirs") \
                    or "p" in o.shorts or has_long(o, "--patch") or has_long(o, "--pathspec-from-file"):
                danger = "discards uncommitted changes (git checkout of paths)"
            elif len(o.operands) >= 2:
                danger = "discards uncommitted changes (git checkout of paths)"
        elif sub == "restore":
            staged_only = ("S" in o.shorts or has_long(o, "--staged")) and not ("W" in o.shorts or has_long(o, "--worktree"))
            if not staged_only:
                danger = "discards uncommitted changes (git restore)"
        elif sub == "switch":
            if "f" in o.shorts or "C" in o.shorts or has_long(o, "--force") or has_long(o, "--discard-changes") or has_long(o, "--force-create"):
                danger = "discards changes or resets a branch (git switch --force / -C)"
        elif sub == "branch":
            if any(c in o.shorts for c in "DMCf") or has_long(o, "--force"):  # -d --force too
                danger = "deletes or overwrites a branch (git branch -D/-M/-C/-f)"
        elif sub == "stash":
            if o.operands and o.operands[0].value in ("drop", "clear"):
                danger = f"git stash {o.operands[0].value} loses stashed work"
        elif sub in ("filter-branch", "filter-repo"):
            danger = "rewrites the whole history"
        elif sub == "reflog":
            if o.operands and o.operands[0].value in ("expire", "delete", "drop"):  # drop: git 2.50's whole-reflog delete
                danger = "deletes reflog entries (loses the way back)"
        elif sub == "gc":
            if any(n.startswith("--prune") for n in o.longs) or has_long(o, "--aggressive"):
                danger = "prunes unreachable objects"
        elif sub == "prune":
            danger = "prunes unreachable objects"
        elif sub == "update-ref":
            if "d" in o.shorts or has_long(o, "--stdin"):
                danger = "deletes or rewrites refs"
        elif sub == "rm":
            if "f" in o.shorts or has_long(o, "--force"):
                danger = "git rm -f discards uncommitted changes"
        elif sub == "worktree":
            # remove -f drops a dirty or locked worktree (prune has no -f: it only forgets missing ones)
            if o.operands and o.operands[0].value == "remove" and ("f" in o.shorts or has_long(o, "--force")):
                danger = "removes a worktree with its changes"
        elif sub == "submodule":
            if o.operands and o.operands[0].value == "deinit" and ("f" in o.shorts or has_long(o, "--force") or has_long(o, "--all")):
                danger = "removes submodule work trees"
            if o.operands and o.operands[0].value == "foreach":
                s.raise_to(UNKNOWN, "git submodule foreach runs a command in every submodule")
                s.coverable = False
        elif sub in ("rebase",):
            if "x" in o.shorts or has_long(o, "--exec"):
                s.raise_to(UNKNOWN, "git rebase --exec runs commands")
                s.coverable = False
        elif sub == "bisect":
            if o.operands and o.operands[0].value == "run":
                s.raise_to(UNKNOWN, "git bisect run runs a command")
                s.coverable = False
        elif sub in ("difftool", "mergetool", "daemon", "instaweb", "web--browse", "credential", "hook"):
            s.not_coverable(f"git {sub} runs other programs")
        elif sub == "config":
            reading = any(has_long(o, x) for x in ("--get", "--get-all", "--get-regexp", "--list", "--get-urlmatch",
                                                   "--get-color", "--get-colorbool", "--show-origin")) or "l" in o.shorts \
                or (o.operands and o.operands[0].value in ("get", "list"))
            if not reading:
                key = next((w.value for w in o.operands if w.value not in ("set", "unset", "add")), None)
                if key is None and o.operands:
                    s.raise_to(UNKNOWN, "git config of a computed key")
                elif key and not _GIT_BENIGN_CONFIG.fullmatch(key):
                    s.not_coverable(f"git config {key} may make git run programs")
                if any(has_long(o, x) for x in ("--global", "--system")):
                    s.raise_to(DANGEROUS, "git config --global/--system writes outside the workspace")
                if has_long(o, "--file") or "f" in o.shorts:
                    self.writes(s, [w for n, w in o.values if n in ("-f", "--file", "--fi", "--fil")], "writes")
        if danger:
            s.raise_to(DANGEROUS, danger)
        if sub in ("clone", "init"):
            targets = o.operands[1:] if sub == "clone" else o.operands[:1]
            self.writes(s, targets, "creates a repository in")
        if sub == "worktree" and o.operands and o.operands[0].value == "add":
            self.writes(s, o.operands[1:2], "creates a worktree in")
        s.git_write = sub in GIT_WRITES and s.coverable and s.level < UNKNOWN and s.cwd is None

    def awk(self, s: Step, base: str, args: list[Word]) -> None:
        # Only the options whose value decides which word is the program are read as taking the
        # next one (-v, -F, --assign, --field-separator, --source): a program from a file
        # (-f/-i/-l/-E, --file/--include/--load/--exec) is refused whatever follows.
        o = scan(args, "fvFilE", {"--assign", "--field-separator", "--source"}, permute=False)
        if opt_values(o, "-f", "-i", "-l", "-E") or any(has_long(o, x) for x in ("--file", "--include", "--load", "--exec")):
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

    def writes(self, s: Step, words: list[Word], verb: str) -> None:
        for w in words:
            self.write_target(s, w, verb)

    def write_target(self, s: Step | None, w: Word, verb: str, start: set | None = None) -> None:
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

    def dirs_of(self, s: Step | None, start: set | None = None) -> set:
        """Where ``s`` runs: its directories, moved by its own -C option if it has one."""
        dirs = (s.dirs if s is not None else start) or {self.places.root}
        if s is not None and s.cwd is not None:
            if s.cwd.value is None:
                return {None}
            return {Path(os.path.normpath(c / s.cwd.value)) if c is not None else None for c in dirs}
        return dirs

    def places_of(self, value: str, s: Step | None, start: set | None = None) -> list[tuple[str | None, Path | None]]:
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

    def operand_places(self, s: Step, base: str, args: list[Word]) -> None:
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

    def _through_link(self, s: Step, v: str) -> bool:
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

    def prefix(self, s: Step, base: str) -> tuple[str, ...] | None:
        """What "always" would cover for this program: the program and, for tools with
        subcommands, the subcommand (``npm test``, ``git commit``, ``python -m pytest``)."""
        if not s.coverable:
            return None
        vals = s.values()
        prog = vals[0]  # (judge only asks about a step whose program is known)
        # A runner first: bun and deno are interpreters too, and `bun run` alone would cover
        # every script. `uv tool run X` names X one word later than `uv tool install`.
        runner = next((r for r in _RUNNERS if r[0] in (prog, base) and (r[1] == "" or (len(vals) > 1 and vals[1] == r[1]))), None)
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

    def is_safe(self, s: Step) -> str | None:
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
        if base in _VERSION_ONLY and len(vals) == 2 and (vals[1] == "--version" or base in _VERSION_WORDS.get(vals[1], ())):
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

    def reads_inside(self, s: Step, args: list[Word]) -> str | None:
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

    def glob_inside(self, s: Step, pattern: str) -> str | None:
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

    def git_safe(self, s: Step, args: list[Word]) -> str | None:
        vals = [w.value for w in args]
        i = 0
        while i < len(vals) and vals[i] and vals[i].startswith("-"):
            v = vals[i]
            if v in ("--no-pager", "-P", "--no-optional-locks", "--literal-pathspecs", "--no-replace-objects",
                     "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--paginate", "-p"):
                i += 1
            elif v == "-C" and i + 1 < len(vals):
                i += 2
            elif v == "-c" and i + 1 < len(vals) and vals[i + 1] and _git_config_benign(vals[i + 1]):
                i += 2
            else:
                return f"git {v}"
        if i >= len(vals):
            return None
        sub = vals[i]
        if sub not in GIT_SAFE:
            return f"git {sub} is not read-only"
        rest = args[i + 1:]
        o = scan(rest, "", set())
        for full in GIT_SAFE[sub]:
            if has_long(o, full):
                return f"git {sub} {full}"
        if sub in ("grep",) and "O" in o.shorts:
            return "git grep -O runs a pager"
        if sub == "help" and "w" in o.shorts:
            return "git help -w starts a web browser"  # the browser runs outside any sandbox
        listing = _git_listing(sub, o, rest)
        if listing:
            return listing
        return self.reads_inside(s, [w for w in rest])


def _git_listing(sub: str, o: Opts, rest: list[Word]) -> str | None:
    """branch/tag/remote/config/stash/... are read-only only in their listing forms."""
    ops = [w.value for w in o.operands]
    if sub == "branch":
        if any(c in o.shorts for c in "dDmMcCfu") or any(has_long(o, x) for x in (
                "--delete", "--move", "--copy", "--force", "--set-upstream-to", "--unset-upstream", "--edit-description",
                "--track", "--no-track", "--create-reflog", "--recurse-submodules")):
            return "git branch that changes branches"
        if ops and not ("l" in o.shorts or has_long(o, "--list") or any(has_long(o, x) for x in (
                "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"))):
            return "git branch NAME creates a branch"
        return None
    if sub == "tag":
        if any(c in o.shorts for c in "dfasume") or any(has_long(o, x) for x in ("--delete", "--force", "--annotate", "--sign",
                                                                                  "--message", "--file", "--edit")):
            return "git tag that changes tags"
        if ops and not ("l" in o.shorts or has_long(o, "--list") or any(has_long(o, x) for x in (
                "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"))):
            return "git tag NAME creates a tag"
        return None
    if sub == "remote":
        # (-v is an option, never the first operand)
        return None if not ops or ops[0] == "get-url" else f"git remote {ops[0]}"
    if sub == "config":
        reading = any(has_long(o, x) for x in ("--get", "--get-all", "--get-regexp", "--list", "--get-urlmatch",
                                               "--show-origin", "--show-scope", "--name-only")) or "l" in o.shorts
        if ops and ops[0] in ("get", "list"):
            reading = True
        writing = any(has_long(o, x) for x in ("--add", "--unset", "--unset-all", "--replace-all", "--rename-section",
                                               "--remove-section", "--edit")) or "e" in o.shorts or (ops and ops[0] in (
                                                   "set", "unset", "rename-section", "remove-section", "edit"))
        return None if reading and not writing else "git config that sets values"
    if sub == "stash":
        return None if ops and ops[0] in ("list", "show") else "git stash that changes stashes"
    if sub == "worktree":
        return None if ops and ops[0] == "list" else "git worktree that changes worktrees"
    if sub == "notes":
        return None if not ops or ops[0] in ("list", "show") else "git notes that changes notes"
    if sub == "submodule":
        return None if not ops or ops[0] in ("status", "summary") else "git submodule that changes submodules"
    if sub == "symbolic-ref":
        return None if len(ops) <= 1 and not ("d" in o.shorts or has_long(o, "--delete")) else "git symbolic-ref that sets a ref"
    return None


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


def _crontab_lists(s: Step) -> bool:
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


def analyze(command: str, root: Path, *, places: Places | None = None, env: dict[str, str] | None = None) -> Analysis:
    """Read ``command`` as bash would and judge each program it runs (see module doc)."""
    places = places or Places.for_root(root)
    an = _Analyzer(places, env)
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
