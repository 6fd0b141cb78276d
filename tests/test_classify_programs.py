"""classify: the per-program rules (the namespace tools, the shell settings, the awk family, pushd and
popd).

Each test names the slip it guards against."""

from __future__ import annotations

from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze


def _steps(a: classify.Analysis) -> list[tuple]:
    return [(s.program, s.level, s.reasons, s.inert, s.coverable) for s in a.steps]


def _judged(cmd: str, root: Path) -> tuple:
    """What the table tests compare: the level, the reasons, whether the first step may be sandboxed."""
    a = analyze(cmd, root)
    return a.level, a.reasons(), a.steps[0].coverable


# -- programs that change namespaces or privileges ------------------------------------------------

@pytest.mark.parametrize("program", ["nsenter", "unshare", "firejail", "bwrap", "sandbox-exec", "nsjail", "capsh", "setpriv"])
def test_a_namespace_or_privilege_tool_is_asked_about_and_never_sandboxed(root: Path, program: str) -> None:
    # Slip: a name dropped from the list, so `firejail --noprofile sh` passes as an ordinary
    # program that the sandbox may run unasked (a tool made to leave or change the sandbox's
    # own confinement).
    a = analyze(f"{program} --x ls", root)
    assert _steps(a) == [(program, UNKNOWN, [f"{program} changes the process's namespaces or privileges"], False, False)]


# -- shell settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("builtin", ["ulimit", "unalias"])
def test_ulimit_and_unalias_are_inert(root: Path, builtin: str) -> None:
    # Slip: the name dropped from the settings list, so `ulimit -n 512` (a limit on this shell
    # alone) or `unalias ll` becomes an ordinary program to approve.
    a = analyze(f"{builtin} -n 5; ls", root)
    assert _steps(a) == [(builtin, SAFE, [], True, True), ("ls", SAFE, [], False, True)]


@pytest.mark.parametrize("builtin", ["complete", "bind"])
def test_complete_and_bind_taint_what_follows(root: Path, builtin: str) -> None:
    # Slip: the name dropped from the settings list: the line after it is then judged as if
    # names still ran what they ran before.
    a = analyze(f"{builtin} -F f ls; ls", root)
    assert a.level == UNKNOWN
    assert _steps(a) == [(builtin, UNKNOWN, [f"{builtin} changes which programs later names run"], False, True),
                         ("ls", UNKNOWN, [f"{builtin} changes which programs the names after it run"], False, False)]


# -- the awk family -----------------------------------------------------------------------------------

@pytest.mark.parametrize("awk", ["awk", "gawk", "mawk", "nawk"])
def test_every_awk_has_its_program_read(root: Path, awk: str) -> None:
    # Slip: one awk left out of the rule that reads the program, so `mawk 'BEGIN{system("rm
    # -rf x")}'` ran unasked as a reader.
    a = analyze(f"{awk} 'BEGIN{{system(\"rm -rf x\")}}'", root)
    why = f"the {awk} program may run commands or write files (system, |, >, getline ...)"
    assert _steps(a) == [(awk, UNKNOWN, [why], False, False)]
    a = analyze(f"{awk} -f prog.awk f", root)
    assert _steps(a) == [(awk, UNKNOWN, [f"{awk} runs a program from a file, which is not checked"], False, False)]
    # A plain program is no more than a run of it (SAFE where the program is installed: the
    # read-only list also asks that it resolves to a system program, and gawk may be absent).
    a = analyze(f"{awk} '{{print $1}}' src/app.py", root)
    assert a.level <= ORDINARY and a.reasons() == [f"runs {awk}"] and a.steps[0].coverable


# -- directory changes name no path they read -------------------------------------------------------

@pytest.mark.parametrize("builtin", ["cd", "pushd", "popd"])
def test_a_directory_change_outside_is_not_a_read_outside(root: Path, builtin: str) -> None:
    # Slip: pushd or popd taken for a program whose operands it reads: `pushd ..` would then
    # ask, as a read outside the workspace, where only the commands after it run there.
    a = analyze(f"{builtin} ..", root)
    assert _steps(a) == [(builtin, SAFE, [], True, True)]
    a = analyze(f"{builtin} /etc && ls", root)
    assert a.steps[0].level == SAFE and a.steps[0].reasons == []
    assert a.steps[1].level == ORDINARY and not a.steps[1].coverable


# -- kill -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("listing", ["-l", "-L", "--list", "--table"])
def test_kill_that_lists_signals_kills_nothing(root: Path, listing: str) -> None:
    # Slip: a listing option dropped, so `kill -l -9` (the name of signal 9) reads as a kill of
    # process group 9.
    a = analyze(f"kill {listing} -9 -1", root)
    assert a.level == ORDINARY and a.reasons() == ["runs kill"]


@pytest.mark.parametrize("option", ["-s", "-n", "--signal"])
def test_a_two_word_signal_is_not_a_target(root: Path, option: str) -> None:
    # Slip: the option not known to take the next word, so its (computed) signal is judged as
    # a process to kill.
    a = analyze(f"kill {option} $SIG 123", root)
    assert a.level == ORDINARY and a.reasons() == ["runs kill"]
    assert analyze(f"kill {option} TERM -1", root).reasons() == ["kills every process it can (kill -1)"]


def test_every_target_after_a_double_dash_is_judged(root: Path) -> None:
    # Slip: the targets read from the wrong word after `--`, so a group named first goes unseen.
    assert analyze("kill -- -5 6", root).reasons() == ["kills a whole process group"]
    assert analyze("kill -9 -- 6 -1", root).reasons() == ["kills every process it can (kill -1)"]
    assert analyze("kill -- 6", root).level == ORDINARY


def test_a_computed_target_is_named_by_its_first_40_characters(root: Path) -> None:
    # Slip: the quoted source cut at another length (the approval line stays short).
    word = "$" + "{PID_OF_THE_SERVER_STARTED_IN_THE_BACKGROUND}"
    assert len(word) > 41
    a = analyze(f"kill {word}", root)
    assert a.reasons() == [f"kill of a computed process ({word[:40]})"]


# -- set --------------------------------------------------------------------------------------------

def test_set_with_known_options_only_is_inert(root: Path) -> None:
    # Slips: an empty `set` (which prints the variables) not inert; one known option enough.
    for cmd in ("set", "set -eu -o pipefail", "set +x --"):
        a = analyze(cmd, root)
        assert [(s.level, s.inert, s.coverable) for s in a.steps] == [(SAFE, True, True)], cmd


def test_set_with_anything_else_changes_what_follows(root: Path) -> None:
    # Slip: one known option enough for the whole line (`set -e x` also sets $1).
    for cmd in ("set -e x", "set -o vi", "set -e $OPTS"):
        a = analyze(cmd, root)
        assert _steps(a) == [("set", ORDINARY, ["set changes how the shell runs what follows"], False, False)], cmd
    assert analyze("set -e x; ls", root).steps[1].reasons == []


@pytest.mark.parametrize("cmd", ["set -x -a; ls", "set -e -o allexport; ls", "set -xa; ls"])
def test_allexport_anywhere_on_the_line_taints_what_follows(root: Path, cmd: str) -> None:
    # Slip: allexport seen only when every word turns it on.
    a = analyze(cmd, root)
    assert _steps(a)[1] == ("ls", UNKNOWN, ["set -a exports every variable set after it"], False, False)
    assert analyze("set +a; ls", root).steps[1].reasons == []  # +a turns it off


# -- shopt --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["nullglob", "globstar", "dotglob", "failglob", "nocaseglob", "extglob", "nocasematch",
                                  "lastpipe", "inherit_errexit", "pipefail"])
def test_shopt_of_a_reading_option_is_inert(root: Path, name: str) -> None:
    # Slip: a name dropped from the list of options that change only how words expand.
    a = analyze(f"shopt -s {name}; ls", root)
    assert [(s.program, s.level, s.inert, s.coverable) for s in a.steps] == [("shopt", SAFE, True, True), ("ls", SAFE, False, True)]


def test_shopt_of_anything_else_taints_what_follows(root: Path) -> None:
    # Slips: one known name enough (`any`); the taint's reason lost or changed.
    a = analyze("shopt -s extglob expand_aliases; ls", root)
    assert _steps(a) == [("shopt", ORDINARY, ["shopt changes how the shell reads what follows"], False, False),
                         ("ls", UNKNOWN, ["shopt changes how the shell reads the commands after it"], False, False)]


# -- the variables the shell reads, set by other means than NAME=value ------------------------------------

@pytest.mark.parametrize("name", ["PATH", "CDPATH", "HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4",
                                  "PROMPT_COMMAND", "GLOBIGNORE", "BASH_LOADABLES_PATH", "ZDOTDIR", "FPATH"])
def test_a_loop_over_any_shell_variable_taints_the_command(root: Path, name: str) -> None:
    # Slip: the names joined wrongly into the pattern (another separator), so only the first
    # and last, or none, are still seen.
    a = analyze(f"for {name} in /tmp/x; do ls; done", root)
    why = f"may set {name} (e.g. in arithmetic, a loop or read), which changes what its programs are or read"
    assert a.level == UNKNOWN and why in a.reasons()


# -- rm's options from patterns and computed words -------------------------------------------------------

def test_only_a_pattern_that_can_start_a_name_with_a_dash_is_an_option_risk(root: Path) -> None:
    # Slips: any pattern taken for a risk (`X*` can only match names starting with X); each
    # pattern reported (the first is enough: the reason line stays short).
    assert analyze("rm X*", root).reasons() == ["runs rm"]
    a = analyze("rm *.o ?.tmp [ab].log", root)
    assert a.reasons() == ["rm *.o: the pattern may match file names that read as options"]
    assert analyze("rm -- *.o", root).reasons() == ["runs rm"]  # after --, nothing is an option
    assert analyze("rm [-a]*", root).reasons() == ["rm [-a]*: the pattern may match file names that read as options"]


def test_a_computed_rm_argument_is_named_by_its_first_40_characters(root: Path) -> None:
    word = "$" + "{THE_DIRECTORY_THAT_THE_BUILD_SCRIPT_WROTE_TO}"
    assert len(word) > 41
    assert analyze(f"rm {word}", root).reasons() == [
        f"rm with arguments the shell computes ({word[:40]}), which may be options", f"deletes a computed path ({word})"]


# -- patterns in what a command writes ---------------------------------------------------------------------

def test_a_pattern_a_command_writes_is_judged_by_what_it_matches(root: Path, tmp_path: Path) -> None:
    # The bug this found: a written pattern was judged as its literal name only, so
    # `echo x > .g*/config` (bash writes .git/config) passed as a write inside the workspace,
    # which auto-edit runs unasked, and a pattern through a link out of the workspace did too.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_text("k")
    (root / "link").symlink_to(outside)
    assert analyze("echo x > .g*/config", root).reasons() == ["writes inside .git (.g*/config)"]
    assert analyze("tee .g?t/config", root).reasons() == ["writes inside .git (.g?t/config)"]
    assert analyze("echo x > lin*/k?y", root).reasons() == [f"writes outside the workspace ({root / 'link' / 'key'})"]
    # A pattern that matches nothing is written as its literal name, here inside the workspace.
    a = analyze("echo x > *.txt", root)
    assert a.level == SAFE and a.writes_workspace
    assert analyze("echo x > src/*.py", root).level == SAFE
    a = analyze("cd $D && echo x > *.py", root)
    assert a.reasons() == ["writes *.py in a directory the shell computes"]


# -- wrappers that change user, directory changes, exports, awk's options, written and read paths --------

# (command, level, reasons, coverable), each row reasoned through before it was written down: a
# slip in any option list, message or branch of these rules changes at least one row.
RULE_CASES = [
    ('sudo rm -rf x', DANGEROUS, ['sudo: runs as another user', 'recursive delete', 'forced delete'], True),
    ('doas rm -rf x', DANGEROUS, ['doas: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --command 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --command='rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --session-command 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -l root -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -g wheel -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --group wheel -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -s /bin/sh -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'names a path outside the workspace (/bin/sh)', 'recursive delete', 'forced delete'], False),
    ("su --shell /bin/sh -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'names a path outside the workspace (/bin/sh)', 'recursive delete', 'forced delete'], False),
    ('su -u x -c ls', DANGEROUS, ['su: runs as another user'], True),
    ('su root', DANGEROUS, ['su: runs as another user'], True),
    ('run0 rm -rf x', DANGEROUS, ['run0: runs as another user'], True),
    ('pkexec rm -rf x', DANGEROUS, ['pkexec: runs as another user'], True),
    ('runuser -u x -- rm -rf y', DANGEROUS, ['runuser: runs as another user'], True),
    ('cd src; ls', SAFE, ['runs cd', 'runs ls'], True),
    ('cd -; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('cd +1; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('cd -L src; ls', SAFE, ['runs cd', 'runs ls'], True),
    ('cd -P /etc; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('cd -- /etc; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('cd -e /etc; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('cd -Pe /etc; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('cd /etc extra; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('builtin cd /etc; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('command cd /etc; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('pushd; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('pushd -n /etc; ls', ORDINARY, ['runs in a directory outside the workspace (/etc)'], True),
    ('pushd +2; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('popd -1; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('cd -12; ls', ORDINARY, ['runs in a directory the shell computes'], True),
    ('export X=1; ls', UNKNOWN, ['sets X, which changes what the programs after it are or read'], False),
    ('export -n X; ls', SAFE, ['runs export', 'runs ls'], True),
    ('declare -x X=1; ls', UNKNOWN, ['sets X, which changes what the programs after it are or read'], False),
    ('declare -f foo; ls', SAFE, ['runs declare', 'runs ls'], True),
    ('declare -F; ls', SAFE, ['runs declare', 'runs ls'], True),
    ('typeset -x X=1; ls', UNKNOWN, ['sets X, which changes what the programs after it are or read'], False),
    ('local X=1', SAFE, ['runs local'], True),
    ('readonly X=1; ls', SAFE, ['runs readonly', 'runs ls'], True),
    ('declare -x PATH=/tmp/x; ls', UNKNOWN, ['may set PATH (e.g. in arithmetic, a loop or read), which changes what its programs are or read'], False),
    ('typeset PATH=/tmp/x; ls', UNKNOWN, ['may set PATH (e.g. in arithmetic, a loop or read), which changes what its programs are or read'], False),
    ('readonly PATH=/tmp/x; ls', UNKNOWN, ['may set PATH (e.g. in arithmetic, a loop or read), which changes what its programs are or read'], False),
    ('local PATH=/tmp/x; ls', UNKNOWN, ['may set PATH (e.g. in arithmetic, a loop or read), which changes what its programs are or read'], False),
    ('export PATH=/tmp/x; ls', UNKNOWN, ['may set PATH (e.g. in arithmetic, a loop or read), which changes what its programs are or read'], False),
    ('declare -fx foo; ls', SAFE, ['runs declare', 'runs ls'], True),
    ('declare -A m; ls', SAFE, ['runs declare', 'runs ls'], True),
    ('awk -f prog.awk x', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --file=prog.awk x', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --file prog.awk x', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk -i lib.awk '{print}' x", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk --include lib.awk '{print}' x", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk --include=lib '{print}' x", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk -l ext '{print}' x", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk --load ext '{print}' x", UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk -E prog.awk x', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --exec prog.awk x', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ("awk -v x=1 '{print}' f", SAFE, ['runs awk'], True),
    ("awk --assign x=1 '{print}' f", SAFE, ['runs awk'], True),
    ("awk -F: '{print $1}' f", SAFE, ['runs awk'], True),
    ("awk -F : '{print $1}' f", SAFE, ['runs awk'], True),
    ("awk --field-separator : '{print $1}' f", SAFE, ['runs awk'], True),
    ('awk --source \'{system("x")}\' f', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ("awk --source='{print}' f", SAFE, ['runs awk'], True),
    ("awk -- '{print}' f", SAFE, ['runs awk'], True),
    ('awk $P f', UNKNOWN, ['awk runs a computed program'], False),
    ('awk \'{print > "/etc/x"}\' f', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk', SAFE, ['runs awk'], True),
    ('echo x > $F', UNKNOWN, ['writes a computed path ($F)'], True),
    ('echo x > *.txt', SAFE, ['runs echo'], True),
    ('echo x > src/*.py', SAFE, ['runs echo'], True),
    ('echo x > "$D/x"', UNKNOWN, ['writes a computed path ("$D/x")'], True),
    ('cd $D && echo x > f', UNKNOWN, ['writes f in a directory the shell computes'], True),
    ('echo x > /dev/null', SAFE, ['runs echo'], True),
    ('echo x > /dev/fd/3', SAFE, ['runs echo'], True),
    ('echo x > /dev/stderr', SAFE, ['runs echo'], True),
    ('echo x > /dev/sda', DANGEROUS, ['writes a device (/dev/sda)'], False),
    ('echo x > .git/config', DANGEROUS, ['writes inside .git (.git/config)'], False),
    ('cat /etc/passwd', ORDINARY, ['names a path outside the workspace (/etc/passwd)'], False),
    ('cat .git/config', SAFE, ['runs cat'], True),
    ('cat src/.git/x', SAFE, ['runs cat'], True),
    ('cat --file=/etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('cat -f/etc/x', SAFE, ['runs cat'], True),
    ('cat x=/etc/y', SAFE, ['runs cat'], True),
    ('ls -la /etc', ORDINARY, ['names a path outside the workspace (/etc)'], False),
    ('ls --color=auto', SAFE, ['runs ls'], True),
    ('grep -r x .', SAFE, ['runs grep'], True),
    ('rm -rf $D/x', DANGEROUS, ['recursive delete', 'forced delete', 'rm with arguments the shell computes ($D/x), which may be options', 'deletes a computed path ($D/x)'], True),
    ('cd $D && cat f', ORDINARY, ['runs in a directory the shell computes'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_rules_for_users_directories_exports_awk_and_paths(root: Path, cmd: str, level: int, reasons: list[str],
                                                           coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_home_is_outside(root: Path) -> None:
    home = Path.home()
    assert analyze("cd; ls", root).reasons() == [f"runs in a directory outside the workspace ({home})"]
    assert analyze("echo x > ~/x", root).reasons() == [f"writes outside the workspace ({home / 'x'})"]
    assert analyze("cat ~/x", root).reasons() == [f"names a path outside the workspace ({home / 'x'})"]


# (command, level, reasons, coverable): the option tables of su/runuser, awk and the declaration
# builtins, found wrong or unpinned by the fifth round.
OPTION_CASES = [
    # Bugs this found: gawk's -I (--trace, a flag) was read as taking a value, which hid the
    # program after it (a system() call passed as an ordinary run of gawk); su's -l (--login,
    # a flag) likewise hid the -c command after it.
    ('gawk -I \'BEGIN{system("rm -rf x")}\'', UNKNOWN,
     ['the gawk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk -I \'BEGIN{system("rm -rf x")}\'', UNKNOWN,
     ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ("su -l -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    # getopt gives an option that takes a value the next word, even one that starts with "-".
    ("su -g -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -G -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -s -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su -w -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --group -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --supp-group -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --shell -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("su --whitelist-environment -c -c 'rm -rf x'", DANGEROUS, ['su: runs as another user', 'recursive delete', 'forced delete'], True),
    ("runuser -u -c -c 'rm -rf x'", DANGEROUS, ['runuser: runs as another user', 'recursive delete', 'forced delete'], True),
    ("runuser --user -c -c 'rm -rf x'", DANGEROUS, ['runuser: runs as another user', 'recursive delete', 'forced delete'], True),
    ('typeset $X', UNKNOWN, ['typeset of a computed name'], True),
    ('declare $X', UNKNOWN, ['declare of a computed name'], True),
    ('local $X', UNKNOWN, ['local of a computed name'], True),
    ('readonly $X', UNKNOWN, ['readonly of a computed name'], True),
    ('export $X', UNKNOWN, ['export of a computed name'], True),
    ('awk --include', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --file', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --load', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --exec', UNKNOWN, ['awk runs a program from a file, which is not checked'], False),
    ('awk --field-separator : \'BEGIN{system("x")}\'', UNKNOWN,
     ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk -F : \'BEGIN{system("x")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk -v x=1 \'BEGIN{system("x")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('awk --assign x=1 \'BEGIN{system("x")}\'', UNKNOWN,
     ['the awk program may run commands or write files (system, |, >, getline ...)'], False),
    ('echo x > /dev/fd/3', SAFE, ['runs echo'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_option_tables(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_cd_options_and_stack_entries(root: Path) -> None:
    # Slips: an option with a digit after its letter (`-a1`) taken for a directory; `+1` (a
    # stack entry) taken for a directory of that name.
    assert analyze("cd -a1; ls", root).reasons() == [f"runs in a directory outside the workspace ({Path.home()})"]
    (root / "+1").mkdir()
    assert analyze("cd +1; ls", root).reasons() == ["runs in a directory the shell computes"]
    assert analyze("cd src; ls", root).level == SAFE


def test_a_computed_written_path_is_named_by_its_first_60_characters(root: Path) -> None:
    word = "$" + "{THE_OUTPUT_FILE_THAT_THE_CALLER_GAVE_US_TO_WRITE_INTO_WHEN_IT_IS_DONE}"
    assert len(word) > 61
    assert analyze(f"echo x > {word}", root).reasons() == [f"writes a computed path ({word[:60]})"]


# -- commands inside other commands: find/fd's -exec, wrappers' own options, shells and interpreters -----

# (command, level, reasons, coverable). Each wrapper option that takes a value appears once, so a
# value mistaken for the wrapped program (or the reverse) changes its row.
NESTED_CASES = [
    ('find . -delete', DANGEROUS, ['find -delete removes files'], True),
    ('find . -fprint /tmp/x', DANGEROUS, ['writes outside the workspace (/tmp/x)', 'names a path outside the workspace (/tmp/x)'], False),
    ('find . -fprint0 out', ORDINARY, ['runs find'], True),
    ('find . -fprintf out %p', ORDINARY, ['runs find'], True),
    ('find . -fls out', ORDINARY, ['runs find'], True),
    ('find -L . -name x', ORDINARY, ['runs find'], True),
    ('find . -follow', ORDINARY, ['runs find'], True),
    ('find -H . -name x', ORDINARY, ['runs find'], True),
    ('find . -execdir rm {} +', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('fd -x rm', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('fd --exec rm', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('fd -X rm', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('fd --exec-batch rm', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('fd x -x cat', ORDINARY, ['runs fd', 'runs cat'], True),
    ('timeout 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('timeout -s KILL 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('timeout --signal KILL 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('timeout -k 1 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('timeout --kill-after 1 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('time rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('time -f %e rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('time -o out rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('time --format %e rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('time --output out rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('nice rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('nice -5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('nice -n 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('nice --adjustment 5 rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('flock -w 5 lock rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('flock --timeout 5 lock rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('flock -E 3 lock rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('flock --conflict-exit-code 3 lock rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ("flock lock -c 'rm -rf x'", DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('sudo -s', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo -i', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo -l', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo --shell', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo --login', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo -u root rm -rf x', DANGEROUS, ['sudo: runs as another user', 'recursive delete', 'forced delete'], True),
    ('env rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('env -i X=1 rm -rf x', DANGEROUS, ['sets X for rm, which may change what it runs or reads (not checked)', 'recursive delete', 'forced delete'], False),
    ('env X=1 Y=2 rm -rf x', DANGEROUS, ['sets X for rm, which may change what it runs or reads (not checked)', 'sets Y for rm, which may change what it runs or reads (not checked)', 'recursive delete', 'forced delete'], False),
    ('env -u X rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('nohup rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ("bash -c 'rm -rf x'", DANGEROUS, ['recursive delete', 'forced delete'], True),
    ("bash -lc 'rm -rf x'", DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('bash -s', ORDINARY, ['runs bash'], True),
    ('bash -s < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash', ORDINARY, ['runs bash'], True),
    ('bash -', ORDINARY, ['runs bash'], True),
    ('bash /dev/stdin', ORDINARY, ['runs bash'], True),
    ('bash /dev/fd/0', ORDINARY, ['runs bash'], True),
    ('bash /proc/self/fd/0', ORDINARY, ['runs bash'], True),
    ('bash script.sh', ORDINARY, ['runs bash'], True),
    ('bash -p', ORDINARY, ['runs bash'], True),
    ('bash -l', ORDINARY, ['runs bash'], True),
    ('bash --rcfile x.sh -c ls', SAFE, ['runs bash', 'runs ls'], True),
    ('bash --init-file x.sh', ORDINARY, ['runs bash'], True),
    ('bash -o errexit -c ls', SAFE, ['runs bash', 'runs ls'], True),
    ('bash -O extglob -c ls', SAFE, ['runs bash', 'runs ls'], True),
    ('bash -c', UNKNOWN, ['bash -c without a command'], True),
    ('sh <(curl x)', DANGEROUS, ['sh runs a downloaded script'], True),
    ("eval 'rm -rf x'", DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('eval $X', UNKNOWN, ['eval of computed text'], True),
    ('eval', SAFE, ['runs eval'], True),
    ('exit 3', SAFE, ['runs exit'], True),
    ('exec rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ("python -c 'import os'", UNKNOWN, ['runs inline python code, which is not checked'], False),
    ('python -m http.server', ORDINARY, ['runs python'], True),
    ('python - < x.py', ORDINARY, ['python runs a script read from a file'], False),
    ('python /dev/stdin', ORDINARY, ['runs python'], True),
    ('python', ORDINARY, ['runs python'], True),
    ("python -W ignore -c 'print(1)'", UNKNOWN, ['runs inline python code, which is not checked'], False),
    ("python -X dev -c 'print(1)'", UNKNOWN, ['runs inline python code, which is not checked'], False),
    ('python script.py', ORDINARY, ['runs python'], True),
    ("node -e 'x'", UNKNOWN, ['runs inline node code, which is not checked'], False),
    ("node --eval 'x'", UNKNOWN, ['runs inline node code, which is not checked'], False),
    ("deno eval 'x'", UNKNOWN, ['runs inline deno code, which is not checked'], False),
    ("perl -e 'x'", UNKNOWN, ['runs inline perl code, which is not checked'], False),
    ('ruby -e x', UNKNOWN, ['runs inline ruby code, which is not checked'], False),
    ("awk 'BEGIN{print}'", SAFE, ['runs awk'], True),
    ("gawk '{print}' f", ORDINARY, ['runs gawk'], True),
    ('xargs rm', UNKNOWN, ['rm with arguments the shell computes (<arguments read from standard input>), which may be options', 'deletes a computed path (<arguments read from standard input>)'], True),
    ('xargs -0 rm -rf', DANGEROUS, ['recursive delete', 'forced delete', 'rm with arguments the shell computes (<arguments read from standard input>), which may be options', 'deletes a computed path (<arguments read from standard input>)'], True),
    ('xargs -I{} rm {}', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})', 'deletes a computed path (<arguments read from standard input>)'], True),
    ('watch rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('busybox rm -rf x', DANGEROUS, ['recursive delete', 'forced delete'], True),
    ('bash -i --rcfile x.sh -c ls', UNKNOWN, ['bash -i runs its startup file (x.sh), which is not checked'], False),
    ('bash -ic ls', SAFE, ['runs bash', 'runs ls'], True),
    ('bash --init-file=x.sh -i', UNKNOWN, ['bash -i runs its startup file (x.sh), which is not checked'], False),
    ('bash --rcfile x.sh -c ls', SAFE, ['runs bash', 'runs ls'], True),
    ("find . -name '*.py' -exec cat {} \\; -exec rm {} \\;", UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('find . -okdir rm {} \\;', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('find . -ok rm {} \\;', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    ('find . -execdir rm {} +', UNKNOWN, ['rm with arguments the shell computes ({}), which may be options', 'deletes a computed path ({})'], True),
    # sudo -l only lists what may run (-s and -i run it: test_classify_wrappers_and_nested_code.py)
    ('sudo -l rm -rf x', DANGEROUS, ['sudo: runs as another user'], True),
    ('sudo X=1 rm -rf x', DANGEROUS, ['sudo: runs as another user', 'recursive delete', 'forced delete'], True),
    ('doas X=1 rm -rf x', DANGEROUS, ['doas: runs as another user', 'recursive delete', 'forced delete'], True),
    ('doas -s', DANGEROUS, ['doas: runs as another user'], True),
    ('bash -s arg < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash /proc/self/fd/0 < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash /dev/fd/0 < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash /dev/stdin < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash - < script.sh', ORDINARY, ['bash runs a script read from a file'], False),
    ('bash script.sh < other.sh', ORDINARY, ['runs bash'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", NESTED_CASES, ids=[c[0] for c in NESTED_CASES])
def test_commands_inside_commands(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


# -- the option scanner: words after a computed one or `--`, abbreviations, a value at the end --------------

SCAN_CASES = [
    ('rm $X -rf y', DANGEROUS, ['recursive delete', 'forced delete', 'rm with arguments the shell computes ($X), which may be options', 'deletes a computed path ($X)'], True),
    ('rm -- /etc/passwd', DANGEROUS, ['deletes outside the workspace (/etc/passwd)', 'names a path outside the workspace (/etc/passwd)'], False),
    ('sort --o /etc/x f', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('sort --ou=/etc/x f', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('sort -o', ORDINARY, ['runs sort'], True),
    ('rm --r x', DANGEROUS, ['recursive delete'], True),
    ('rm --re x', DANGEROUS, ['recursive delete'], True),
    ('rm --=x y', ORDINARY, ['runs rm'], True),
    ('cat -- -', SAFE, ['runs cat'], True),
    ('curl --o /etc/x http://x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('curl -o', ORDINARY, ['runs curl'], True),
    ('curl --out /etc/x http://x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('tar -C', ORDINARY, ['runs tar'], True),
    ('unzip x.zip -d', ORDINARY, ['runs unzip'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", SCAN_CASES, ids=[c[0] for c in SCAN_CASES])
def test_option_scanning(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    # Slips: scanning stopped at a computed word or at `--`; a three-letter abbreviation
    # (`--r`) not matched; `--=x` (an empty name) matching every long option; a value-taking
    # short option at the end read past the words.
    assert _judged(cmd, root) == (level, reasons, coverable)
