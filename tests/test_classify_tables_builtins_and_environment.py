"""classify's tables, entry by entry: _BUILTINS, _RESERVED, _SUBCOMMAND_TOOLS,
_SERVICES, _SERVICE_READ, _SHELL_ENV, _ENV_OK, _ENV_VALUE_OK, _PATTERN_FIRST, _SED_ADDR, MAX_NESTING and
MAX_COMMAND. Each test names the programs, words and variables itself (never reading the module's
tables) and gives the verdict the design asks for:

- a shell builtin run by the shell itself is not looked up on PATH (safe with an empty PATH);
- a reserved word that ends up as a program name means the grammar was not followed: unknown;
- a tool with subcommands gets "always" for its subcommand (``make build``), not for the tool;
- a program that hands work to a daemon outside the sandbox is never coverable;
- systemctl's read-only actions are not "changes system services";
- setting one of the variables the shell reads to find programs taints what follows;
- only the listed harmless variables may prefix a command, GIT_PAGER/PAGER only as cat or empty,
  MAKEFLAGS only without expansions;
- for grep, sed, awk, jq ... the pattern (first operand) is not a path;
- sed addresses of every documented form are read-only;
- nesting and length limits are exact.

Each test loops over an explicit list and collects every mismatch, so one failure shows all."""

from __future__ import annotations

import shlex
from pathlib import Path

from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze


def _bin(tmp_path: Path, *names: str) -> dict[str, str]:
    """A PATH (outside the workspace) holding stand-ins for ``names``: verdicts that depend on a
    program being installed then do not depend on this machine."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for n in names:
        p = d / n
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    return {"PATH": str(d)}


def _empty_path(tmp_path: Path) -> dict[str, str]:
    d = tmp_path / "empty"
    d.mkdir(exist_ok=True)
    return {"PATH": str(d)}


def _one(cmd: str, root: Path, env: dict[str, str]) -> tuple:
    a = analyze(cmd, root, env=env)
    return tuple((s.program, s.level, s.reasons, s.coverable, s.prefix) for s in a.steps), a.findings


# -- _BUILTINS: no PATH lookup for what the shell runs itself ---------------------------------------

def test_builtins_on_the_read_only_list_need_no_program_on_path(root: Path, tmp_path: Path) -> None:
    # With an empty PATH, a read-only builtin is still safe: bash runs its own, nothing on PATH
    # is looked up. The redirect keeps the inert ones from being waved through before the
    # read-only check (a step that writes a workspace file is judged by is_safe).
    env = _empty_path(tmp_path)
    cases = {"echo": "echo hi > out.txt", "printf": "printf hi > out.txt", "true": "true > out.txt",
             "false": "false > out.txt", ":": ": > out.txt", "test": "test -n x > out.txt",
             "[": "\\[ -n x ] > out.txt", "cd": "cd src > out.txt", "pwd": "pwd > out.txt",
             "pushd": "pushd src > out.txt", "popd": "popd > out.txt", "dirs": "dirs > out.txt",
             "type": "type ls"}
    bad = []
    for prog, cmd in cases.items():
        got = _one(cmd, root, env)
        want = (((prog, SAFE, [], True, (prog,)),), [])
        if got != want:
            bad.append((prog, got))
    assert bad == []


def test_a_program_that_is_not_a_builtin_needs_to_be_on_path(root: Path, tmp_path: Path) -> None:
    # The contrast: ls, cat and which are programs; with an empty PATH they are not installed.
    env = _empty_path(tmp_path)
    bad = []
    for cmd in ["ls", "cat x", "which ls"]:
        got = _one(cmd, root, env)
        prog = cmd.split()[0]
        if got != (((prog, ORDINARY, [], True, (prog,)),), []):
            bad.append((cmd, got))
    assert bad == []


# -- _RESERVED: a reserved word as a program name -------------------------------------------------

def test_reserved_words_as_programs_are_unknown(root: Path, tmp_path: Path) -> None:
    env = _bin(tmp_path)
    words = ["{", "}", "then", "do", "done", "fi", "esac", "elif", "else", "in", "function", "select",
             "until", "while", "if", "case", "for", "]]", "!", "coproc"]
    bad = []
    for w in words:
        got = _one(f"env {w}", root, env)
        want = (((w, UNKNOWN, [f"the shell grammar could not be followed here ({w!r} as a program)"], False, None),), [])
        if got != want:
            bad.append((w, got))
    assert bad == []


def test_a_quoted_reserved_word_is_a_program_name(root: Path, tmp_path: Path) -> None:
    # Quoted, bash never reads the word as syntax: an ordinary (missing) program.
    env = _bin(tmp_path)
    bad = []
    # Nor in part, nor in $'...' (these were unknown before: the check looked at the first
    # character only, so th''en and $'then' passed for syntax).
    for cmd, prog in [("env 'then'", "then"), ('env "fi"', "fi"), ("env \\done", "done"), ("env $'then'", "then"),
                      ("env th''en", "then"), ("env $'('", "("), ("env $'[['", "[["),
                      ("env i\\f", "if")]:
        got = _one(cmd, root, env)
        if got != (((prog, ORDINARY, [], True, (prog,)),), []):
            bad.append((cmd, got))
    assert bad == []
    # $"esac" is different: the message catalogue decides its text, so the program is computed.
    assert _one('env $"esac"', root, env) == (((None, UNKNOWN, ['the program is computed ($"esac")'], False, None),), [])


# -- _SUBCOMMAND_TOOLS: "always" covers the subcommand --------------------------------------------

TOOLS = ["git", "npm", "pnpm", "yarn", "cargo", "go", "pip", "pip3", "uv", "poetry", "pipenv", "conda", "mamba",
         "micromamba", "brew", "apt", "apt-get", "dnf", "yum", "gem", "bundle", "rake", "mix", "dotnet", "gradle",
         "./gradlew", "mvn", "./mvnw", "make", "just", "task", "nox", "hatch", "pdm", "rye", "terraform", "helm", "gh",
         "meson", "ninja", "bazel", "bazelisk", "pants", "lerna", "nx", "turbo", "composer", "rustup", "flutter",
         "dart", "zig", "stack", "cabal", "pixi", "tox", "xcodebuild", "corepack", "ruff", "ctest", "pre-commit",
         "invoke", "fab", "sbt", "lein", "opam", "dune", "nix"]


def test_tools_with_subcommands_are_covered_per_subcommand(root: Path, tmp_path: Path) -> None:
    # `X build` -> "always" covers X build only; an option first (`X --help`) gives no prefix,
    # since what the option selects is not known; the tool alone is covered as itself.
    env = _empty_path(tmp_path)
    bad = []
    for tool in TOOLS:
        for cmd, want in [(f"{tool} build", (tool, "build")), (f"{tool} --help", None), (tool, (tool,))]:
            got = analyze(cmd, root, env=env).steps[0].prefix
            if got != want:
                bad.append((cmd, got))
    assert bad == []


def test_a_tool_without_subcommands_is_covered_as_itself(root: Path, tmp_path: Path) -> None:
    env = _empty_path(tmp_path)
    bad = []
    for cmd, want in [("pytest tests", ("pytest",)), ("mytool --help", ("mytool",)), ("gcc -c x.c", ("gcc",))]:
        got = analyze(cmd, root, env=env).steps[0].prefix
        if got != want:
            bad.append((cmd, got))
    assert bad == []


# -- _SERVICES: work handed to a daemon outside the sandbox ---------------------------------------

def test_service_clients_are_never_coverable(root: Path, tmp_path: Path) -> None:
    env = _empty_path(tmp_path)
    progs = ["docker", "podman", "nerdctl", "colima", "lima", "limactl", "kubectl", "tmux", "screen", "byobu",
             "open", "dbus-send", "busctl", "gdbus", "qdbus", "xdg-open", "gio", "ssh-agent",
             "gpg-connect-agent", "xdotool", "ydotool", "wmctrl", "code", "emacsclient", "nvr"]
    bad = []
    for p in progs:
        got = _one(f"{p} thing", root, env)
        want = (((p, ORDINARY, [f"{p} asks a service outside the sandbox to run things"], False, None),), [])
        if got != want:
            bad.append((p, got))
    # osascript is also an interpreter: a script file is run (it reads the file), and asks always.
    got = _one("osascript build.scpt", root, env)
    if got[0][0][3:] != (False, None) or "osascript asks a service outside the sandbox to run things" not in got[0][0][2]:
        bad.append(("osascript", got))
    # systemd-run is a wrapper: the program it starts is found, and the service mark is on it.
    got = _one("systemd-run ls", root, _bin(tmp_path, "ls"))
    if got != ((("ls", ORDINARY, ["systemd-run asks a service outside the sandbox to run things"], False, None),), []):
        bad.append(("systemd-run", got))
    assert bad == []


# -- _SERVICE_READ: systemctl actions that only read ----------------------------------------------

def test_service_manager_read_actions_are_not_changes(root: Path, tmp_path: Path) -> None:
    env = _empty_path(tmp_path)
    actions = ["status", "show", "list-units", "list-unit-files", "is-active", "is-enabled", "is-failed", "cat",
               "list", "print", "help", "list-timers", "list-sockets", "list-dependencies", "get-default"]
    bad = []
    for act in actions:
        got = _one(f"systemctl {act}", root, env)
        if got != ((("systemctl", ORDINARY, [], True, ("systemctl",)),), []):
            bad.append((act, got))
    # service NAME ACTION: the action is the second operand
    for act in ["status", "cat"]:
        got = _one(f"service nginx {act}", root, env)
        if got != ((("service", ORDINARY, [], True, ("service",)),), []):
            bad.append(("service", act, got))
    for cmd, prog in [("systemctl restart nginx", "systemctl"), ("systemctl enable x", "systemctl"),
                      ("service nginx stop", "service")]:
        got = _one(cmd, root, env)
        if got != (((prog, DANGEROUS, [f"{prog}: changes system services"], True, (prog,)),), []):
            bad.append((cmd, got))
    assert bad == []


# -- _SHELL_ENV: variables bash reads to find programs and startup code ---------------------------

def test_assigning_a_shell_variable_taints_what_follows(root: Path) -> None:
    # `NAME==x` is an assignment of "=x" to NAME (bash), which the text scan for other ways of
    # setting these names does not see: only the assignment rule catches it. The env passed holds
    # none of the names, so "already in the environment" does not decide it either.
    names = ["PATH", "CDPATH", "HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
             "GLOBIGNORE", "BASH_LOADABLES_PATH", "ZDOTDIR", "FPATH"]
    bad = []
    for n in names:
        a = analyze(f"{n}==x; make", root, env={})
        (s,) = a.steps
        want_reasons = [f"sets {n}, which changes what the programs after it are or read"]
        if n in ("CDPATH", "HOME"):
            want_reasons.append("runs in a directory the shell computes")  # cd may then go anywhere
        got = (s.level, s.reasons, s.coverable, s.prefix)
        if got != (UNKNOWN, want_reasons, False, None):
            bad.append((n, got))
    assert bad == []


def test_assigning_another_variable_changes_nothing(root: Path) -> None:
    a = analyze("FOO==x; make", root, env={})
    assert [(s.program, s.level, s.reasons, s.coverable, s.prefix) for s in a.steps] == \
        [("make", ORDINARY, [], True, ("make",))]


# -- _ENV_OK and _ENV_VALUE_OK: what may prefix a command -----------------------------------------

def test_harmless_variables_may_prefix_a_safe_command(root: Path, tmp_path: Path) -> None:
    env = _bin(tmp_path, "ls")
    names = ["LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR",
             "CLICOLOR", "CLICOLOR_FORCE", "COLORTERM", "CI", "DEBUG", "VERBOSE", "QUIET", "RUST_BACKTRACE",
             "RUST_LOG", "RUST_TEST_THREADS", "RUST_MIN_STACK", "NODE_ENV", "PYTHONUNBUFFERED",
             "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING", "PYTHONUTF8",
             "PYTHONFAULTHANDLER", "PYTHONDEVMODE", "PYTHONPATH", "CGO_ENABLED", "GOOS", "GOARCH", "GOMAXPROCS",
             "GOEXPERIMENT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
             "HYPOTHESIS_PROFILE", "TMPDIR", "DS4_HOME", "NPM_CONFIG_COLOR", "MallocNanoZone",
             "OBJC_DISABLE_INITIALIZE_FORK_SAFETY", "TQDM_DISABLE", "TOKENIZERS_PARALLELISM", "MLX_METAL_DEBUG",
             "CARGO_TERM_COLOR", "CARGO_INCREMENTAL", "JOBS", "MAKEFLAGS", "PYTEST_XDIST_AUTO_NUM_WORKERS"]
    bad = []
    for n in names:
        got = _one(f"{n}=1 ls", root, env)
        if got != ((("ls", SAFE, [], True, ("ls",)),), []):
            bad.append((n, got))
    assert bad == []


def test_other_variables_make_the_command_unknown(root: Path, tmp_path: Path) -> None:
    env = _bin(tmp_path, "ls")
    bad = []
    for n in ["FOO", "LD_PRELOAD", "lang", "LC_", "PYTHONSTARTUP", "GIT_DIR"]:
        got = _one(f"{n}=1 ls", root, env)
        want = ((("ls", UNKNOWN, [f"sets {n} for ls, which may change what it runs or reads (not checked)"], False,
                  None),), [])
        if got != want:
            bad.append((n, got))
    assert bad == []


def test_pager_variables_only_as_cat_or_empty(root: Path, tmp_path: Path) -> None:
    # GIT_PAGER/PAGER name a program git runs: only cat (or none) keeps git status read-only.
    env = _bin(tmp_path, "git")
    bad = []
    for n in ["GIT_PAGER", "PAGER"]:
        for value, ok in [("cat", True), ("", True), ("less", False), ("'sh -c x'", False), ("$P", False)]:
            got = _one(f"{n}={value} git status", root, env)
            if ok:
                want = ((("git", SAFE, [], True, ("git", "status")),), [])
            else:
                want = ((("git", UNKNOWN, [f"sets {n} for git, which may change what it runs or reads (not checked)"],
                          False, None),), [])
            if got != want:
                bad.append((n, value, got))
    assert bad == []


def test_makeflags_without_expansions(root: Path, tmp_path: Path) -> None:
    # MAKEFLAGS may carry variable definitions that make expands ($(shell ...)): a $ or ` in the
    # value, or a value the shell computes, is refused.
    env = _empty_path(tmp_path)
    bad = []
    for value, ok in [("-j4", True), ("'-j4 -k'", True), ("'X=$(shell id)'", False), ("'X=`id`'", False),
                      ('"-j$N"', False)]:
        got = _one(f"MAKEFLAGS={value} make", root, env)
        if ok:
            want = ((("make", ORDINARY, [], True, ("make",)),), [])
        else:
            want = ((("make", UNKNOWN, ["sets MAKEFLAGS for make, which may change what it runs or reads (not checked)"],
                      False, None),), [])
        if got != want:
            bad.append((value, got))
    assert bad == []


# -- _PATTERN_FIRST: the pattern is not a path ----------------------------------------------------

def test_the_pattern_of_pattern_first_programs_is_not_a_path(root: Path, tmp_path: Path) -> None:
    # A pattern that looks like a path outside the workspace (/usr/lib, /^#/d, ..) names no file.
    env = _bin(tmp_path, "grep", "egrep", "fgrep", "rg", "ag", "sed", "gsed", "awk", "gawk", "mawk", "nawk", "jq")
    cases = [("grep /usr/lib notes.txt", SAFE), ("egrep /usr/lib notes.txt", SAFE), ("fgrep /usr/lib notes.txt", SAFE),
             ("rg /usr/lib src", SAFE), ("ag /usr/lib src", ORDINARY), ("sed /^#/d notes.txt", SAFE),
             ("gsed /^#/d notes.txt", ORDINARY), ("awk /^#/ notes.txt", SAFE), ("gawk /^#/ notes.txt", SAFE),
             ("mawk /^#/ notes.txt", SAFE), ("nawk /^#/ notes.txt", SAFE), ("jq .. data.json", SAFE)]
    bad = []
    for cmd, level in cases:
        prog = cmd.split()[0]
        got = _one(cmd, root, env)
        if got != (((prog, level, [], True, (prog,)),), []):
            bad.append((cmd, got))
    assert bad == []


def test_the_files_after_the_pattern_are_paths(root: Path, tmp_path: Path) -> None:
    env = _bin(tmp_path, "grep", "ag", "jq", "cat")
    bad = []
    for cmd in ["grep x /etc/passwd", "ag x /etc", "jq . /etc/passwd", "cat /usr/lib"]:
        a = analyze(cmd, root, env=env)
        (s,) = a.steps
        path = cmd.split()[-1]
        if (s.coverable, s.reasons) != (False, [f"names a path outside the workspace ({path})"]):
            bad.append((cmd, s.level, s.reasons, s.coverable))
    assert bad == []


# -- _SED_ADDR: every address form of the read-only sed subset ------------------------------------

def test_sed_addresses_are_read_only(root: Path, tmp_path: Path) -> None:
    env = _bin(tmp_path, "sed")
    scripts = ["3p", "1~2p", "$p", "/re/p", "/a\\/b/p", "/re/Ip", "/re/Mp", "/re/IMp", "\\%re%p", "\\%a\\%b%Ip",
               "1,5p", "/a/,/b/p", "3,+2p", "3,~4p", "$!d", "2q"]
    bad = []
    for sc in scripts:
        got = _one(f"sed -n {shlex.quote(sc)} notes.txt", root, env)
        if got != ((("sed", SAFE, [], True, ("sed",)),), []):
            bad.append((sc, got))
    # not addresses, or a write after one: not read-only
    for sc in ["1,p", "/re/w out", "3r /etc/passwd", "~2p"]:
        got = _one(f"sed -n {shlex.quote(sc)} notes.txt", root, env)
        want = ((("sed", UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"], False, None),), [])
        if got != want:
            bad.append((sc, got))
    assert bad == []


def test_sed_regex_ends_where_sed_ends_it(root: Path, tmp_path: Path) -> None:
    # GNU sed (4.9, checked by hand): an escaped delimiter and a delimiter inside a bracket
    # expression do not end an address or an s pattern. Ending the regex there read the rest of it
    # as commands and missed the real `w FILE` after it: these three wrote ../x, /tmp/x%% and
    # /tmp/pwn%% and were safe.
    env = _bin(tmp_path, "sed")
    bad = []
    for sc in ["s/[/]/g;/w ../x", "/[/s%]/w /tmp/x%%", "\\%x\\%s%w /tmp/pwn%%", "/[abc/p", "\\[a[p"]:
        got = _one(f"sed -n {shlex.quote(sc)} notes.txt", root, env)
        want = ((("sed", UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"], False, None),), [])
        if got != want:
            bad.append((sc, got))
    for sc in ["/[/]/p", "/[^]/]/p", "/[]/]/,/b/p", "/[[:punct:]/]/p", "/[[.-.]/]/p", "/[[=a=]/]/p",
               "s/a[/]b/c/g", "s/x/[/g", "\\%[%]%p", "y/[/]/"]:
        got = _one(f"sed -n {shlex.quote(sc)} notes.txt", root, env)
        if got != ((("sed", SAFE, [], True, ("sed",)),), []):
            bad.append((sc, got))
    assert bad == []


# -- MAX_NESTING and MAX_COMMAND ------------------------------------------------------------------

def _nested(n: int, inner: str) -> str:
    cmd = inner
    for _ in range(n):
        cmd = "bash -c " + shlex.quote(cmd)
    return cmd


def test_eight_nested_shells_are_followed_nine_are_not(root: Path, tmp_path: Path) -> None:
    env = _empty_path(tmp_path)
    a = analyze(_nested(8, "make"), root, env=env)
    assert a.findings == []
    assert [(s.program, s.level) for s in a.steps] == [("bash", SAFE)] * 8 + [("make", ORDINARY)]
    a = analyze(_nested(9, "make"), root, env=env)
    assert a.findings == [(UNKNOWN, "shells nested too deeply to check")]
    assert [(s.program, s.level) for s in a.steps] == [("bash", SAFE)] * 9
    assert a.level == UNKNOWN


def test_a_command_of_100000_characters_is_read_one_more_is_not(root: Path, tmp_path: Path) -> None:
    env = _empty_path(tmp_path)
    cmd = "echo " + "a" * (100_000 - 5)
    a = analyze(cmd, root, env=env)
    assert (a.level, a.findings, [s.program for s in a.steps]) == (SAFE, [], ["echo"])
    a = analyze(cmd + "a", root, env=env)
    assert (a.level, a.findings, a.steps) == (UNKNOWN, [(UNKNOWN, "a command of 100001 characters is too long to check")], [])
