"""classify's git rules: the global options before the subcommand, the rules that make a
subcommand dangerous (each beside its harmless neighbour), and the read-only listing forms.

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
