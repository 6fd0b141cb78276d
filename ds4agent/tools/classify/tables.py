"""The program tables the rules read: shells, interpreters, downloaders, wrappers, system tools,
the read-only allowlist and its risky options, builtins, the environment variables that matter
(git's tables are in git.py), and the small readers of their entries.
"""

from __future__ import annotations

import re

from ..shellparse import Word
from .options import scan

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
    "ionice": ("cnpPu", {"--class", "--classdata", "--pid", "--pgid", "--uid"}),
    "chrt": ("TPD", {"--sched-runtime", "--sched-period", "--sched-deadline"}),
    "exec": ("a", set()), "caffeinate": ("tw", set()),
    "sudo": ("ugpCDhrtTRU", {"--user", "--group", "--prompt", "--close-from", "--chdir", "--host", "--role", "--type",
                             "--command-timeout", "--chroot", "--other-user"}),
    "doas": ("uC", set()), "flock": ("wEc", {"--timeout", "--conflict-exit-code", "--command"}),
    "strace": ("oeEpPsSuXbaI", {"--output", "--expr", "--attach", "--user", "--trace-path"}),
    "ltrace": ("aADeFlnopsuwx", {"--output", "--library", "--config", "--where", "--align", "--indent", "--user"}),
    "xvfb-run": ("nsfewp", {"--server-num", "--error-file", "--auth-file", "--server-args", "--xauth-protocol"}),
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
    **dict.fromkeys(["mount", "umount", "swapon", "swapoff", "chroot", "pivot_root"],
                    "changes mounts or the root directory"),
    **dict.fromkeys(["shutdown", "reboot", "halt", "poweroff", "telinit", "kexec", "pmset"], "stops the machine"),
    **dict.fromkeys(["killall", "pkill", "xkill", "killall5", "skill", "slay", "fuser"], "kills processes broadly"),
    **dict.fromkeys(["sudo", "doas", "su", "pkexec", "run0", "sudoedit", "runuser", "ksu", "calife"],
                    "runs as another user"),
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
    "ls": ("L", ("--dereference",)), "cat": ("", ()), "head": ("", ()), "tail": ("", ()),
    "wc": ("", ("--files0-from",)),
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
    "nproc": ("", ()), "printenv": ("", ()), "locale": ("", ()), "tr": ("", ()),
    "file": ("Cm", ("--compile", "--magic-file")),
    "jq": ("", ("--rawfile", "--slurpfile")),
    "sort": ("oT", ("--output", "--compress-program", "--temporary-directory", "--files0-from")),
    "uniq": ("", ()), "tree": ("oRlH", ("--fromfile", "--output",)), "find": ("L", ()),
    "fd": ("xXL", ("--exec", "--exec-batch", "--follow")),
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
             "kill", "times", "caller", "mapfile", "readarray", "history", "fc", "help", "compgen", "complete",
             "logout"}


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
