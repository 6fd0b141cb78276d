"""classify's program tables, entry by entry: SHELLS, INLINE, INLINE_LONG,
DOWNLOADERS, WRAPPERS, _WRAPPER_ARGS and _RUNNERS. Each test names the programs and options
itself (never reading the module's tables) and gives the verdict the design asks for:

- a shell runs the code after ``-c`` (``X -c "rm -rf x"`` is a dangerous delete inside it);
- an interpreter's inline-code option makes the step unknown and never coverable;
- a downloader piped into a shell is "runs a downloaded script" (dangerous);
- a wrapper is looked through to the program it runs, and the options that take a value
  skip that value (``stdbuf -o L rm`` runs rm, not L);
- a runner (``npm run``, ``npx``) gets a prefix that names what it runs.

Each test loops over an explicit list and collects every mismatch, so one failure shows all."""

from __future__ import annotations

from pathlib import Path

from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze

ENV = {"PATH": "/usr/bin:/bin"}  # the verdicts below do not depend on what is installed


def _found(cmd: str, root: Path) -> list[tuple]:
    a = analyze(cmd, root, env=ENV)
    return [(s.program, s.level, s.via) for s in a.steps]


RM = ["recursive delete", "forced delete"]


# -- SHELLS: the code after -c is read as commands ------------------------------------------------

def test_every_shell_runs_its_c_string(root: Path) -> None:
    shells = ["sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash", "posh"]
    bad = []
    for sh in shells:
        a = analyze(f'{sh} -c "rm -rf x"', root, env=ENV)
        got = [(s.program, s.level, s.reasons, s.via) for s in a.steps]
        # the shell itself only carries the code (inert); the delete inside it is dangerous
        want = [(sh, SAFE, [], ""), ("rm", DANGEROUS, RM, f"{sh} -c")]
        if got != want:
            bad.append((sh, got))
    assert bad == []


def test_every_shell_reads_a_here_document_as_commands(root: Path) -> None:
    bad = []
    for sh in ["sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash", "posh"]:
        # the shell step is not inert here: a script on standard input is never coverable
        got = _found(f"{sh} <<EOF\nrm -rf x\nEOF", root)
        if got != [(sh, ORDINARY, ""), ("rm", DANGEROUS, f"{sh} <<")]:
            bad.append((sh, got))
    assert bad == []


# -- INLINE / INLINE_LONG: inline code is not checked ---------------------------------------------

def test_inline_code_options_make_the_step_unknown(root: Path) -> None:
    # (program, option, family named in the reason)
    cases = [("python", "-c", "python"), ("pypy", "-c", "pypy"), ("node", "-e", "node"), ("node", "-p", "node"),
             ("nodejs", "-e", "nodejs"), ("nodejs", "-p", "nodejs"), ("bun", "-e", "bun"), ("perl", "-e", "perl"),
             ("perl", "-E", "perl"), ("ruby", "-e", "ruby"), ("php", "-r", "php"), ("lua", "-e", "lua"),
             ("luajit", "-e", "luajit"), ("Rscript", "-e", "Rscript"), ("R", "-e", "R"), ("julia", "-e", "julia"),
             ("osascript", "-e", "osascript"), ("pwsh", "-c", "pwsh"), ("powershell", "-c", "powershell"),
             ("irb", "-e", "irb"), ("swift", "-e", "swift"), ("expect", "-c", "expect"),
             # long spellings
             ("node", "--eval", "node"), ("node", "--print", "node"), ("nodejs", "--eval", "nodejs"),
             ("nodejs", "--print", "nodejs"), ("bun", "--eval", "bun"), ("bun", "--print", "bun")]
    bad = []
    for prog, opt, fam in cases:
        a = analyze(f"{prog} {opt} 'x'", root, env=ENV)
        (s,) = a.steps
        got = (s.level, s.reasons[:1], s.coverable, s.prefix)
        if got != (UNKNOWN, [f"runs inline {fam} code, which is not checked"], False, None):
            bad.append((prog, opt, got))
    assert bad == []


def test_deno_eval_is_inline_code(root: Path) -> None:
    (s,) = analyze("deno eval 'x'", root, env=ENV).steps
    assert (s.level, s.reasons, s.coverable) == (UNKNOWN, ["runs inline deno code, which is not checked"], False)


def test_interpreters_without_an_inline_option_still_read_a_here_document(root: Path) -> None:
    # tclsh and jshell take code only from a file or standard input: a here-document is code
    # that is not checked; a script file is an ordinary run whose prefix names the script.
    bad = []
    for prog in ["tclsh", "jshell"]:
        (s,) = analyze(f"{prog} <<EOF\nx\nEOF", root, env=ENV).steps
        got = (s.level, s.reasons, s.coverable)
        if got != (UNKNOWN, [f"{prog} runs code from a here-document, which is not checked"], False):
            bad.append((prog, "heredoc", got))
        (s,) = analyze(f"{prog} run.tcl", root, env=ENV).steps
        if (s.level, s.prefix) != (ORDINARY, (prog, "run.tcl")):
            bad.append((prog, "script", (s.level, s.prefix)))
    assert bad == []


# -- DOWNLOADERS: a downloaded script run by a shell is dangerous ----------------------------------

def test_every_downloader_piped_into_a_shell_is_dangerous(root: Path) -> None:
    ups = ["curl https://e.x/s", "wget -qO- https://e.x/s", "fetch -o - https://e.x/s", "aria2c https://e.x/s",
           "http https://e.x/s", "https e.x/s", "xh e.x/s", "lynx -dump https://e.x/s", "links -dump https://e.x/s",
           "nc e.x 80", "ncat e.x 80", "socat - TCP:e.x:80", "ssh host cat s", "scp host:s /dev/stdout",
           "sftp host", "ftp e.x", "tftp e.x", "rsync host:s /dev/stdout", "git show origin/main:s"]
    bad = []
    for up in ups:
        a = analyze(f"{up} | sh", root, env=ENV)
        s = a.steps[-1]
        if (s.program, s.level, s.reasons, s.coverable) != ("sh", DANGEROUS, ["sh runs a downloaded script"], False):
            bad.append((up, s.program, s.level, s.reasons))
    assert bad == []


def test_a_downloader_in_a_process_substitution_is_dangerous(root: Path) -> None:
    bad = []
    for prog in ["curl", "wget", "ssh", "nc", "git"]:
        s = analyze(f"bash <({prog} x)", root, env=ENV).steps[-1]
        if (s.program, s.level, s.reasons) != ("bash", DANGEROUS, ["bash runs a downloaded script"]):
            bad.append((prog, s.program, s.level, s.reasons))
    assert bad == []


# -- WRAPPERS: looked through to the program they run ----------------------------------------------

def test_every_wrapper_is_looked_through(root: Path) -> None:
    # (command, the wrapper named in via); each runs `rm -rf x`, a dangerous delete
    cases = [("env rm -rf x", "env"), ("nice rm -rf x", "nice"), ("nohup rm -rf x", "nohup"),
             ("time rm -rf x", "time"), ("timeout 5 rm -rf x", "timeout"), ("stdbuf rm -rf x", "stdbuf"),
             ("setsid rm -rf x", "setsid"), ("ionice rm -rf x", "ionice"), ("chrt 10 rm -rf x", "chrt"),
             ("taskset 0x1 rm -rf x", "taskset"), ("command rm -rf x", "command"), ("exec rm -rf x", "exec"),
             ("caffeinate rm -rf x", "caffeinate"), ("arch rm -rf x", "arch"), ("unbuffer rm -rf x", "unbuffer"),
             ("xvfb-run rm -rf x", "xvfb-run"), ("coproc rm -rf x", "coproc"), ("flock lk rm -rf x", "flock"),
             ("gtimeout 5 rm -rf x", "gtimeout"), ("torsocks rm -rf x", "torsocks"),
             ("proxychains rm -rf x", "proxychains"), ("proxychains4 rm -rf x", "proxychains4"),
             ("strace rm -rf x", "strace"), ("ltrace rm -rf x", "ltrace"), ("valgrind rm -rf x", "valgrind"),
             ("catchsegv rm -rf x", "catchsegv"), ("systemd-run rm -rf x", "systemd-run"),
             ("sudo rm -rf x", "sudo"), ("doas rm -rf x", "doas")]
    assert _not_rm_via(cases, root) == []


def _not_rm_via(cases: list[tuple[str, str]], root: Path) -> list[tuple]:
    """The commands not read as one dangerous ``rm`` step found via the given wrapper."""
    return [(cmd, got) for cmd, via in cases if (got := _found(cmd, root)) != [("rm", DANGEROUS, via)]]


def test_builtin_is_looked_through(root: Path) -> None:
    # builtin runs only builtins: eval is one, and what eval runs is judged
    assert _found("builtin eval 'rm -rf x'", root) == [("eval", SAFE, "builtin"), ("rm", DANGEROUS, "eval")]


def test_a_run_as_user_wrapper_keeps_its_own_reason(root: Path) -> None:
    bad = []
    for w in ["sudo", "doas"]:
        (s,) = analyze(f"{w} ls", root, env=ENV).steps
        if (s.program, s.level, s.reasons, s.via) != ("ls", DANGEROUS, [f"{w}: runs as another user"], w):
            bad.append((w, s.program, s.level, s.reasons, s.via))
    assert bad == []


def test_systemd_run_is_a_service_wrapper(root: Path) -> None:
    (s,) = analyze("systemd-run ls", root, env=ENV).steps
    assert (s.program, s.via, s.coverable) == ("ls", "systemd-run", False)
    assert s.reasons == ["systemd-run asks a service outside the sandbox to run things"]


# -- _WRAPPER_ARGS: the options of a wrapper that take a value -------------------------------------

def test_wrapper_options_skip_their_value(root: Path) -> None:
    # The value is a separate word: when the option is not known to take one, the value would be
    # read as the program (`stdbuf -o L rm` would run "L").
    opts = {
        "stdbuf": ["-i", "-o", "-e", "--input", "--output", "--error"],
        "ionice": ["-c", "-n", "-p", "-P", "-u", "--class", "--classdata", "--pid", "--pgid", "--uid"],
        "caffeinate": ["-t", "-w"],
        "sudo": ["-u", "-g", "-p", "-C", "-D", "-h", "-r", "-t", "-T", "-R", "-U", "--user", "--group", "--prompt",
                 "--close-from", "--chdir", "--host", "--role", "--type", "--command-timeout", "--chroot",
                 "--other-user"],
        "doas": ["-u"],  # (doas -C FILE CMD only checks whether CMD may run: test_classify_wrappers_and_nested_code.py)
        "strace": ["-o", "-e", "-E", "-p", "-P", "-s", "-S", "-u", "-X", "-b", "-a", "-I", "--output", "--expr",
                   "--attach", "--user", "--trace-path"],
        # ltrace's -S (system calls) and -E are left out: see the report of issue 22, tables B
        "ltrace": ["-o", "-e", "-p", "-s", "-u", "-a", "-A", "-n", "--output"],
        # xvfb-run's -l (--listen-tcp) is left out: it takes no value (same report)
        "xvfb-run": ["-n", "-s", "-f", "-e", "-w", "-p"],
        "torsocks": ["-u", "-a", "-P", "-p"],
        "proxychains": ["-f"], "proxychains4": ["-f"],
        "systemd-run": ["-p", "-E", "-u", "-M", "--unit", "--property", "--description", "--slice", "--uid", "--gid",
                        "--nice", "--working-directory", "--setenv", "--on-active", "--on-boot", "--on-calendar",
                        "--timer-property", "--path-property", "--socket-property", "--machine", "--host"],
    }
    bad = []
    for w, names in opts.items():
        for n in names:
            got = _found(f"{w} {n} v rm -rf x", root)
            if got != [("rm", DANGEROUS, w)]:
                bad.append((w, n, got))
    assert bad == []


def test_wrapper_flags_do_not_take_a_value(root: Path) -> None:
    # Options without a value are skipped alone: the next word is the program.
    cases = [("setsid -w rm -rf x", "setsid"), ("valgrind -q rm -rf x", "valgrind"), ("arch -x86_64 rm -rf x", "arch"),
             ("xvfb-run -a rm -rf x", "xvfb-run"), ("strace -f rm -rf x", "strace"), ("ltrace -f rm -rf x", "ltrace"),
             ("sudo -n rm -rf x", "sudo"), ("torsocks -q rm -rf x", "torsocks"), ("caffeinate -i rm -rf x", "caffeinate"),
             ("systemd-run --user rm -rf x", "systemd-run"), ("stdbuf -oL rm -rf x", "stdbuf")]
    assert _not_rm_via(cases, root) == []


# -- _RUNNERS: "always" names what a runner runs ----------------------------------------------------

def test_runner_prefixes_name_what_they_run(root: Path) -> None:
    cases = [("npm run test", ("npm", "run", "test")), ("npm exec eslint", ("npm", "exec", "eslint")),
             ("pnpm run test", ("pnpm", "run", "test")), ("pnpm exec eslint", ("pnpm", "exec", "eslint")),
             ("pnpm dlx cowsay", ("pnpm", "dlx", "cowsay")), ("yarn run test", ("yarn", "run", "test")),
             ("yarn dlx cowsay", ("yarn", "dlx", "cowsay")), ("uv run pytest", ("uv", "run", "pytest")),
             ("uv tool install ruff", ("uv", "tool", "install")), ("poetry run pytest", ("poetry", "run", "pytest")),
             ("pipenv run pytest", ("pipenv", "run", "pytest")), ("pdm run pytest", ("pdm", "run", "pytest")),
             ("hatch run test", ("hatch", "run", "test")), ("rye run test", ("rye", "run", "test")),
             ("conda run pytest", ("conda", "run", "pytest")), ("pixi run test", ("pixi", "run", "test")),
             ("cargo run app", ("cargo", "run", "app")), ("go run main.go", ("go", "run", "main.go")),
             ("dotnet run app", ("dotnet", "run", "app")), ("nix run nixpkgs#hello", ("nix", "run", "nixpkgs#hello")),
             ("npx cowsay", ("npx", "cowsay")), ("pnpx cowsay", ("pnpx", "cowsay")), ("bunx cowsay", ("bunx", "cowsay")),
             ("uvx ruff", ("uvx", "ruff")), ("pipx run black", ("pipx", "run", "black")),
             ("xcrun clang", ("xcrun", "clang")),
             # a runner that names nothing to run gives nothing to cover
             ("npm run", None), ("npx", None), ("xcrun", None), ("pipx run", None), ("uvx --help", None)]
    bad = []
    for cmd, want in cases:
        (s,) = analyze(cmd, root, env=ENV).steps
        if (s.level, s.prefix) != (ORDINARY, want):
            bad.append((cmd, s.level, s.prefix))
    assert bad == []
