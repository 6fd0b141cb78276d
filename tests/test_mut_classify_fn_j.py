"""classify.py: the gaps the fifth round of the whole-module run found (issue 22): the per-program
rules whose names no test used (the namespace tools, the shell settings, the awk family, pushd and
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


# -- git's options before the subcommand -----------------------------------------------------------------

def test_git_global_options_and_their_values(root: Path) -> None:
    # Slips in reading `git [-c N=V | --config-env=N=ENV | -C DIR | --git-dir ...] SUB`: the
    # setting's name taken from the wrong part of the word, the next word read past the end,
    # a form (attached, separate, `=`) not recognised.
    def judged(cmd: str) -> tuple:
        a = analyze(cmd, root)
        return a.level, a.reasons(), [(s.inert, s.coverable) for s in a.steps]

    run = "can make git run programs"
    assert judged("git $X status") == (UNKNOWN, ["git with a computed argument before the subcommand"], [(False, True)])
    assert judged("git -c $X log") == (UNKNOWN, ["git -c with a computed setting"], [(False, True)])
    assert judged("git -c core.pager=less") == (UNKNOWN, [f"git -c core.pager {run}"], [(False, False)])
    assert judged("git -c") == (UNKNOWN, [f"git -c  {run}"], [(False, False)])  # no setting at all
    assert judged("git -ccore.pager=x log") == (UNKNOWN, [f"git -c core.pager {run}"], [(False, False)])
    assert judged("git -cx status") == (UNKNOWN, [f"git -c x {run}"], [(False, False)])
    assert judged("git -ccolor.ui=never log") == (ORDINARY, ["runs git"], [(False, True)])
    assert judged("git -c color.ui=never log")[0] == SAFE  # the read-only list knows only the separate form
    assert judged("git --config-env=color.ui=ENVVAR log") == (UNKNOWN, [f"git -c color.ui {run}"], [(False, False)])
    assert judged("git --config-env color.ui=ENVVAR log") == (UNKNOWN, [f"git -c color.ui {run}"], [(False, False)])


@pytest.mark.parametrize("option", ["--git-dir", "--work-tree"])
def test_git_pointed_at_another_repository(root: Path, option: str) -> None:
    # Slips: the option dropped; its path read from the wrong word or cut at a second `=`.
    away = f"git {option} points git somewhere else"
    assert analyze(f"git {option}=/tmp/a=b status", root).reasons() == [away, "names a path outside the workspace (/tmp/a=b)"]
    assert analyze(f"git {option} /etc/x status", root).reasons() == [away, "names a path outside the workspace (/etc/x)"]
    a = analyze(f"git {option}", root)
    assert a.reasons() == [away] and not a.steps[0].coverable


def test_git_exec_path(root: Path) -> None:
    # Slips: its reasons lost; the bare option (which prints the path and exits) judged as a setting.
    assert analyze("git --exec-path=/tmp/e status", root).reasons() == [
        "git --exec-path points git somewhere else", "git --exec-path runs git programs from elsewhere",
        "names a path outside the workspace (/tmp/e)"]
    a = analyze("git --exec-path", root)
    assert a.level == SAFE and a.steps[0].inert


def test_git_dash_capital_c(root: Path) -> None:
    # Slips: the directory read past the end of the words, or not taken when it is the last word.
    assert analyze("git -C /etc", root).reasons() == ["names a path outside the workspace (/etc)"]
    a = analyze("git -C", root)
    assert a.level == SAFE and a.steps[0].inert


_GIT_LONG_VALUES = ["--message", "--file", "--author", "--date", "--template", "--format", "--output", "--upload-pack",
                    "--receive-pack", "--exec", "--strategy", "--strategy-option", "--onto", "--source",
                    "--pathspec-from-file", "--push-option", "--orphan", "--reuse-message", "--reedit-message", "--fixup",
                    "--squash", "--cleanup", "--trailer", "--repo", "--conflict"]


@pytest.mark.parametrize("option", _GIT_LONG_VALUES)
def test_a_git_option_value_is_not_an_operand(root: Path, option: str) -> None:
    # Slip: the option dropped from the list of those that take the next word, so its value
    # is read as a refspec (one table serves every subcommand; push's `+ref` shows it).
    assert analyze(f"git push {option} +x origin main", root).level == ORDINARY
    assert analyze("git push origin +main", root).level > ORDINARY


@pytest.mark.parametrize("cmd,why", [
    ("git reset --recurse-submodules --hard", "discards uncommitted work (git reset --hard)"),
    ("git checkout --recurse-submodules .", "discards uncommitted changes (git checkout of paths)"),
    ("git push --recurse-submodules=check +main", "force-push or remote delete (+refspec or :ref)"),
    ("git push --recurse-submodules +main", "force-push or remote delete (+refspec or :ref)"),
])
def test_an_optional_value_never_hides_the_next_word(root: Path, cmd: str, why: str) -> None:
    # The bug this found: --recurse-submodules was taken to consume the next word, so the
    # `--hard` (or the path, or the +refspec) after it went unseen and a destructive command
    # passed as an ordinary one. Its value is optional, so git only takes it attached (`=`).
    assert analyze(cmd, root).reasons() == [why]


# -- git's subcommands: every rule that makes one dangerous, and its harmless neighbour -----------------

# (command, level, reasons, coverable). One row per option or operand a rule looks at, so that
# dropping or renaming any of them (the slips mutants make) changes a row; the harmless form
# next to each shows the rule is not simply "every use of the subcommand".
GIT_CASES = [
    ('git push -f', DANGEROUS, ['force-push or remote delete'], True),
    ('git push -d origin x', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --force', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --force-with-lease', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --mirror', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --delete origin x', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --prune origin', DANGEROUS, ['force-push or remote delete'], True),
    ('git push --force-if-includes', DANGEROUS, ['force-push or remote delete'], True),
    ('git push origin +main', DANGEROUS, ['force-push or remote delete (+refspec or :ref)'], True),
    ('git push origin :old', DANGEROUS, ['force-push or remote delete (+refspec or :ref)'], True),
    ('git push origin main:+x', ORDINARY, ['runs git'], True),
    ('git push origin main', ORDINARY, ['runs git'], True),
    ('git reset --hard', DANGEROUS, ['discards uncommitted work (git reset --hard)'], True),
    ('git reset --merge', DANGEROUS, ['discards uncommitted work (git reset --hard)'], True),
    ('git reset --keep', DANGEROUS, ['discards uncommitted work (git reset --hard)'], True),
    ('git reset HEAD~1', ORDINARY, ['runs git'], True),
    ('git clean -f', DANGEROUS, ['deletes untracked files (git clean -f)'], True),
    ('git clean --force', DANGEROUS, ['deletes untracked files (git clean -f)'], True),
    ('git clean -n', ORDINARY, ['runs git'], True),
    ('git checkout -f', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --force main', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --discard-changes main', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout -- src/app.py', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout .', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ("git checkout '*'", DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout :/', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --ours src/app.py', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --theirs src/app.py', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout -p', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --patch', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout --pathspec-from-file=list.txt', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout main src/app.py', DANGEROUS, ['discards uncommitted changes (git checkout of paths)'], True),
    ('git checkout main', ORDINARY, ['runs git'], True),
    ('git checkout -b new', ORDINARY, ['runs git'], True),
    ('git restore src/app.py', DANGEROUS, ['discards uncommitted changes (git restore)'], True),
    ('git restore --staged src/app.py', ORDINARY, ['runs git'], True),
    ('git restore -S src/app.py', ORDINARY, ['runs git'], True),
    ('git restore --staged --worktree src/app.py', DANGEROUS, ['discards uncommitted changes (git restore)'], True),
    ('git restore -S -W src/app.py', DANGEROUS, ['discards uncommitted changes (git restore)'], True),
    ('git switch -f main', DANGEROUS, ['discards changes or resets a branch (git switch --force / -C)'], True),
    ('git switch -C main', DANGEROUS, ['discards changes or resets a branch (git switch --force / -C)'], True),
    ('git switch --force main', DANGEROUS, ['discards changes or resets a branch (git switch --force / -C)'], True),
    ('git switch --discard-changes main', DANGEROUS, ['discards changes or resets a branch (git switch --force / -C)'], True),
    ('git switch --force-create main', DANGEROUS, ['discards changes or resets a branch (git switch --force / -C)'], True),
    ('git switch main', ORDINARY, ['runs git'], True),
    ('git switch -c new', ORDINARY, ['runs git'], True),
    ('git branch -D x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -M x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -C x y', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -f x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch --force x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch --delete --force x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch --delete x', ORDINARY, ['runs git'], True),
    ('git branch -d x', ORDINARY, ['runs git'], True),
    ('git stash drop', DANGEROUS, ['git stash drop loses stashed work'], True),
    ('git stash clear', DANGEROUS, ['git stash clear loses stashed work'], True),
    ('git stash pop', ORDINARY, ['runs git'], True),
    ('git filter-branch --all', DANGEROUS, ['rewrites the whole history'], True),
    ('git filter-repo --force', DANGEROUS, ['rewrites the whole history'], True),
    ('git reflog expire --all', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ('git reflog delete HEAD@{1}', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ('git reflog show', SAFE, ['runs git'], True),
    ('git gc --prune=now', DANGEROUS, ['prunes unreachable objects'], True),
    ('git gc --aggressive', DANGEROUS, ['prunes unreachable objects'], True),
    ('git gc', ORDINARY, ['runs git'], True),
    ('git prune', DANGEROUS, ['prunes unreachable objects'], True),
    ('git update-ref -d refs/heads/x', DANGEROUS, ['deletes or rewrites refs'], True),
    ('git update-ref --stdin', DANGEROUS, ['deletes or rewrites refs'], True),
    ('git update-ref refs/heads/x HEAD', ORDINARY, ['runs git'], True),
    ('git rm -f src/app.py', DANGEROUS, ['git rm -f discards uncommitted changes'], True),
    ('git rm --force src/app.py', DANGEROUS, ['git rm -f discards uncommitted changes'], True),
    ('git rm src/app.py', ORDINARY, ['runs git'], True),
    ('git worktree remove -f /etc/x', DANGEROUS, ['removes a worktree with its changes', 'names a path outside the workspace (/etc/x)'], False),
    ('git worktree remove --force /etc/x', DANGEROUS, ['removes a worktree with its changes', 'names a path outside the workspace (/etc/x)'], False),
    ('git worktree remove /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    ('git worktree prune', ORDINARY, ['runs git'], True),
    ('git submodule deinit -f x', DANGEROUS, ['removes submodule work trees'], True),
    ('git submodule deinit --force x', DANGEROUS, ['removes submodule work trees'], True),
    ('git submodule deinit --all', DANGEROUS, ['removes submodule work trees'], True),
    ('git submodule deinit x', ORDINARY, ['runs git'], True),
    ("git submodule foreach 'rm -rf x'", UNKNOWN, ['git submodule foreach runs a command in every submodule'], False),
    ('git submodule update', ORDINARY, ['runs git'], True),
    ('git rebase -x make main', UNKNOWN, ['git rebase --exec runs commands'], False),
    ('git rebase --exec make main', UNKNOWN, ['git rebase --exec runs commands'], False),
    ('git rebase main', ORDINARY, ['runs git'], True),
    ('git bisect run make', UNKNOWN, ['git bisect run runs a command'], False),
    ('git bisect start', ORDINARY, ['runs git'], True),
    ('git difftool', ORDINARY, ['git difftool runs other programs'], False),
    ('git mergetool', ORDINARY, ['git mergetool runs other programs'], False),
    ('git daemon', ORDINARY, ['git daemon runs other programs'], False),
    ('git instaweb', ORDINARY, ['git instaweb runs other programs'], False),
    ('git web--browse', ORDINARY, ['git web--browse runs other programs'], False),
    ('git credential fill', ORDINARY, ['git credential runs other programs'], False),
    ('git hook run pre-commit', ORDINARY, ['git hook runs other programs'], False),
    ('git config --get core.pager', SAFE, ['runs git'], True),
    ('git config --get-all core.pager', SAFE, ['runs git'], True),
    ('git config --get-regexp core', SAFE, ['runs git'], True),
    ('git config --list', SAFE, ['runs git'], True),
    ('git config --get-urlmatch http x', SAFE, ['runs git'], True),
    ('git config --get-color core.x red', ORDINARY, ['runs git'], True),
    ('git config --get-colorbool core.x', ORDINARY, ['runs git'], True),
    ('git config --show-origin -l', SAFE, ['runs git'], True),
    ('git config -l', SAFE, ['runs git'], True),
    ('git config get core.pager', SAFE, ['runs git'], True),
    ('git config list', SAFE, ['runs git'], True),
    ('git config core.pager less', ORDINARY, ['git config core.pager may make git run programs'], False),
    ('git config set core.pager less', ORDINARY, ['git config core.pager may make git run programs'], False),
    ('git config unset core.pager', ORDINARY, ['git config core.pager may make git run programs'], False),
    ('git config add core.pager x', ORDINARY, ['git config core.pager may make git run programs'], False),
    ('git config color.ui auto', ORDINARY, ['runs git'], True),
    ('git config set color.ui auto', ORDINARY, ['runs git'], True),
    ('git config --global color.ui auto', DANGEROUS, ['git config --global/--system writes outside the workspace'], True),
    ('git config --system color.ui auto', DANGEROUS, ['git config --global/--system writes outside the workspace'], True),
    ('git config --file /etc/x color.ui auto', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('git config -f /etc/x color.ui auto', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('git config --fi /etc/x color.ui auto', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('git config --fil /etc/x color.ui auto', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], False),
    ('git config $K x', UNKNOWN, ['git config of a computed key'], True),
    ('git clone https://x/y /etc/y', DANGEROUS, ['creates a repository in outside the workspace (/etc/y)', 'names a path outside the workspace (/etc/y)'], False),
    ('git clone https://x/y', ORDINARY, ['runs git'], True),
    ('git init /etc/y', DANGEROUS, ['creates a repository in outside the workspace (/etc/y)', 'names a path outside the workspace (/etc/y)'], False),
    ('git init', ORDINARY, ['runs git'], True),
    ('git worktree add /etc/w main', DANGEROUS, ['creates a worktree in outside the workspace (/etc/w)', 'names a path outside the workspace (/etc/w)'], False),
    ('git worktree add src/w', ORDINARY, ['runs git'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", GIT_CASES, ids=[c[0] for c in GIT_CASES])
def test_git_subcommand_rules(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


@pytest.mark.parametrize("sub", ["push", "reset", "clean", "checkout", "restore", "switch", "branch", "stash", "rm", "gc",
                                 "reflog", "update-ref", "worktree", "submodule", "filter-branch", "prune"])
def test_computed_arguments_of_a_git_subcommand_that_can_destroy_work(root: Path, sub: str) -> None:
    # Slip: a subcommand dropped from the list, so `git reset $MODE` (which may be --hard) is
    # judged by its words as written.
    assert analyze(f"git {sub} $X", root).reasons()[0] == f"git {sub} with computed arguments ($X)"


def test_computed_git_arguments_elsewhere_and_the_cut_at_40(root: Path) -> None:
    assert analyze("git status $X", root).reasons() == ["runs git"]
    word = "$" + "{THE_REMOTE_AND_BRANCH_THAT_THE_SCRIPT_CHOSE}"
    assert analyze(f"git push {word}", root).reasons() == [f"git push with computed arguments ({word[:40]})"]


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
    # sudo -l only lists what may run (-s and -i run it: test_mut_classify_fn_l.py)
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


# -- git on the read-only list: listing forms pass unasked, every form that changes something does not ------

# (command, level, reasons, coverable). is_safe's own reason is read only for whether it is
# there (and for the reads-outside prefix), so these rows pin the decision itself: a listing
# form at SAFE, each option or word that makes the subcommand change something at ORDINARY.
GIT_READ_CASES = [
    ('git branch', SAFE, ['runs git'], True),
    ('git branch -a', SAFE, ['runs git'], True),
    ('git branch -d x', ORDINARY, ['runs git'], True),
    ('git branch -D x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -m a b', ORDINARY, ['runs git'], True),
    ('git branch -M a b', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -c a b', ORDINARY, ['runs git'], True),
    ('git branch -C a b', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -f x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch -u origin/x', ORDINARY, ['runs git'], True),
    ('git branch --delete x', ORDINARY, ['runs git'], True),
    ('git branch --move a b', ORDINARY, ['runs git'], True),
    ('git branch --copy a b', ORDINARY, ['runs git'], True),
    ('git branch --force x', DANGEROUS, ['deletes or overwrites a branch (git branch -D/-M/-C/-f)'], True),
    ('git branch --set-upstream-to=origin/x', ORDINARY, ['runs git'], True),
    ('git branch --unset-upstream', ORDINARY, ['runs git'], True),
    ('git branch --edit-description', ORDINARY, ['runs git'], True),
    ('git branch --track x origin/x', ORDINARY, ['runs git'], True),
    ('git branch --no-track x origin/x', ORDINARY, ['runs git'], True),
    ('git branch --create-reflog x', ORDINARY, ['runs git'], True),
    ('git branch --recurse-submodules x', ORDINARY, ['runs git'], True),
    ('git branch newname', ORDINARY, ['runs git'], True),
    ("git branch -l 'fe*'", SAFE, ['runs git'], True),
    ("git branch --list 'fe*'", SAFE, ['runs git'], True),
    ('git branch --contains HEAD', SAFE, ['runs git'], True),
    ('git branch --no-contains HEAD x', SAFE, ['runs git'], True),
    ('git branch --merged main', SAFE, ['runs git'], True),
    ('git branch --no-merged main', SAFE, ['runs git'], True),
    ('git branch --points-at HEAD', SAFE, ['runs git'], True),
    ('git tag', SAFE, ['runs git'], True),
    ('git tag -d v1', ORDINARY, ['runs git'], True),
    ('git tag -f v1', ORDINARY, ['runs git'], True),
    ('git tag -a v1', ORDINARY, ['runs git'], True),
    ('git tag -s v1', ORDINARY, ['runs git'], True),
    ('git tag -u key v1', ORDINARY, ['runs git'], True),
    ('git tag -m msg v1', ORDINARY, ['runs git'], True),
    ('git tag -e v1', ORDINARY, ['runs git'], True),
    ('git tag --delete v1', ORDINARY, ['runs git'], True),
    ('git tag --force v1', ORDINARY, ['runs git'], True),
    ('git tag --annotate v1', ORDINARY, ['runs git'], True),
    ('git tag --sign v1', ORDINARY, ['runs git'], True),
    ('git tag --message=m v1', ORDINARY, ['runs git'], True),
    ('git tag --file=f v1', ORDINARY, ['runs git'], True),
    ('git tag --edit v1', ORDINARY, ['runs git'], True),
    ('git tag v1', ORDINARY, ['runs git'], True),
    ("git tag -l 'v*'", SAFE, ['runs git'], True),
    ("git tag --list 'v*'", SAFE, ['runs git'], True),
    ('git tag --contains HEAD', SAFE, ['runs git'], True),
    ('git tag --no-contains HEAD', SAFE, ['runs git'], True),
    ('git tag --merged main', SAFE, ['runs git'], True),
    ('git tag --no-merged main', SAFE, ['runs git'], True),
    ('git tag --points-at HEAD', SAFE, ['runs git'], True),
    ('git remote', SAFE, ['runs git'], True),
    ('git remote -v', SAFE, ['runs git'], True),
    ('git remote get-url origin', SAFE, ['runs git'], True),
    ('git remote add x url', ORDINARY, ['runs git'], True),
    ('git remote remove x', ORDINARY, ['runs git'], True),
    ('git config --get user.name', SAFE, ['runs git'], True),
    ('git config --get-all user.name', SAFE, ['runs git'], True),
    ('git config --get-regexp user', SAFE, ['runs git'], True),
    ('git config --list', SAFE, ['runs git'], True),
    ('git config --get-urlmatch http x', SAFE, ['runs git'], True),
    ('git config --show-origin --list', SAFE, ['runs git'], True),
    ('git config --show-scope --list', SAFE, ['runs git'], True),
    ('git config --name-only --list', SAFE, ['runs git'], True),
    ('git config -l', SAFE, ['runs git'], True),
    ('git config get user.name', SAFE, ['runs git'], True),
    ('git config list', SAFE, ['runs git'], True),
    ('git config --add --get x', ORDINARY, ['runs git'], True),
    ('git config --unset x', ORDINARY, ['git config x may make git run programs'], False),
    ('git config --unset-all x', ORDINARY, ['git config x may make git run programs'], False),
    ('git config --replace-all x y', ORDINARY, ['git config x may make git run programs'], False),
    ('git config --rename-section a b', ORDINARY, ['git config a may make git run programs'], False),
    ('git config --remove-section a', ORDINARY, ['git config a may make git run programs'], False),
    ('git config --edit', ORDINARY, ['runs git'], True),
    ('git config -e', ORDINARY, ['runs git'], True),
    ('git config set user.name x', ORDINARY, ['runs git'], True),
    ('git config unset user.name', ORDINARY, ['runs git'], True),
    ('git config rename-section a b', ORDINARY, ['git config rename-section may make git run programs'], False),
    ('git config remove-section a', ORDINARY, ['git config remove-section may make git run programs'], False),
    ('git config edit', ORDINARY, ['git config edit may make git run programs'], False),
    ('git config user.name', ORDINARY, ['runs git'], True),
    ('git stash list', SAFE, ['runs git'], True),
    ('git stash show', SAFE, ['runs git'], True),
    ('git stash', ORDINARY, ['runs git'], True),
    ('git stash push', ORDINARY, ['runs git'], True),
    ('git reflog', SAFE, ['runs git'], True),
    ('git reflog show', SAFE, ['runs git'], True),
    ('git reflog exists HEAD', SAFE, ['runs git'], True),
    ('git reflog expire', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ('git reflog delete x', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ('git reflog drop', DANGEROUS, ['deletes reflog entries (loses the way back)'], True),
    ('git reflog HEAD', SAFE, ['runs git'], True),
    ('git worktree list', SAFE, ['runs git'], True),
    ('git worktree add x', ORDINARY, ['runs git'], True),
    ('git notes', SAFE, ['runs git'], True),
    ('git notes list', SAFE, ['runs git'], True),
    ('git notes show', SAFE, ['runs git'], True),
    ('git notes add -m x', ORDINARY, ['runs git'], True),
    ('git submodule', SAFE, ['runs git'], True),
    ('git submodule status', SAFE, ['runs git'], True),
    ('git submodule summary', SAFE, ['runs git'], True),
    ('git submodule update', ORDINARY, ['runs git'], True),
    ('git grep -O x', ORDINARY, ['runs git'], True),
    ('git grep --open-files-in-pager x', ORDINARY, ['runs git'], True),
    ('git grep x', SAFE, ['runs git'], True),
    ('git help -w log', ORDINARY, ['runs git'], True),
    ('git help --web log', ORDINARY, ['runs git'], True),
    ('git help log', SAFE, ['runs git'], True),
    ('git --no-pager log', SAFE, ['runs git'], True),
    ('git -P log', SAFE, ['runs git'], True),
    ('git --no-optional-locks status', SAFE, ['runs git'], True),
    ('git --literal-pathspecs log', SAFE, ['runs git'], True),
    ('git --no-replace-objects log', SAFE, ['runs git'], True),
    ('git --glob-pathspecs log', SAFE, ['runs git'], True),
    ('git --noglob-pathspecs log', SAFE, ['runs git'], True),
    ('git --icase-pathspecs log', SAFE, ['runs git'], True),
    ('git --paginate log', SAFE, ['runs git'], True),
    ('git -p log', SAFE, ['runs git'], True),
    ('git -C src log', SAFE, ['runs git'], True),
    ('git -C', SAFE, ['runs git'], True),
    ('git -c color.ui=never log', SAFE, ['runs git'], True),
    ('git -c core.pager=x log', UNKNOWN, ['git -c core.pager can make git run programs'], False),
    ('git -c', UNKNOWN, ['git -c  can make git run programs'], False),
    ('git --bogus log', ORDINARY, ['runs git'], True),
    ('git log /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], False),
    # A reading option with a writing one (or word) still writes.
    ('git config -l -e', ORDINARY, ['runs git'], True),
    ('git config --list --edit', ORDINARY, ['runs git'], True),
    ('git config --list unset x', ORDINARY, ['runs git'], True),
    ('git config --get x --unset', ORDINARY, ['runs git'], True),
    ('git config --list --remove-section', ORDINARY, ['runs git'], True),
    ('git config --list rename-section', ORDINARY, ['runs git'], True),
]


@pytest.mark.parametrize("cmd,level,reasons,coverable", GIT_READ_CASES, ids=[c[0] for c in GIT_READ_CASES])
def test_git_read_only_forms(root: Path, cmd: str, level: int, reasons: list[str], coverable: bool) -> None:
    assert _judged(cmd, root) == (level, reasons, coverable)


def test_git_read_only_patterns_are_expanded(root: Path, tmp_path: Path) -> None:
    # Slip: git's own read check (reads_inside) dropped: a pattern that matches a link out of
    # the workspace is named only as its literal text, which lies inside.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_text("k")
    (root / "link").symlink_to(outside)
    a = analyze("git log -- lin*/key", root)
    assert a.level == ORDINARY and not a.steps[0].coverable
    assert a.reasons() == [f"reads outside the workspace ({root / 'link' / 'key'})"]
    assert analyze("git log -- src/*.py", root).level == SAFE


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
