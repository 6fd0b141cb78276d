"""classify's git tables, entry by entry: GIT_SAFE (read-only
subcommands and the options that make them write or run programs), GIT_WRITES (subcommands that
may write .git when git runs alone), _GIT_SHORT_VALUES (short options that take a value, per
subcommand), _GIT_GLOBAL_ARG (git's global options that take the next word), _GIT_BENIGN_CONFIG
(git -c keys that only change how output looks), the level constants and LEVELS, and a few other
module-level statements (Places is frozen, scan()'s defaults).

Every name is written out here, never read from the module: a mutant renames an entry in the
table, and a test that iterated the table would follow it. Each test loops over an explicit list,
collects the commands whose verdict differs and asserts that none does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.shellparse import Word


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    # git installed outside the workspace, so "SAFE" never depends on this machine's PATH.
    d = tmp_path / "bin"
    d.mkdir()
    p = d / "git"
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return {"PATH": str(d)}


# Literal level numbers: the tests must not read the constants they pin.
S, O, U, D = 0, 1, 2, 3
_NAMES = {0: "safe", 1: "ordinary", 2: "unknown", 3: "dangerous"}


def _mismatches(root: Path, env: dict[str, str], expected: dict[str, int]) -> list[tuple[str, str]]:
    out = []
    for cmd, level in expected.items():
        got = classify.analyze(cmd, root, env=env).level
        if got != level:
            out.append((cmd, _NAMES.get(got, repr(got))))
    return out


# -- the levels -----------------------------------------------------------------------------------

def test_level_values_and_names(root: Path, env: dict[str, str]) -> None:
    # The order SAFE < ORDINARY < UNKNOWN < DANGEROUS is the policy's whole ladder, and the
    # numbers index LEVELS (the words the user reads).
    assert (classify.SAFE, classify.ORDINARY, classify.UNKNOWN, classify.DANGEROUS) == (0, 1, 2, 3)
    assert classify.LEVELS == ("safe", "ordinary", "unknown", "dangerous")
    # Through the analysis: nothing to run is safe; each level as a number.
    got = {cmd: classify.analyze(cmd, root, env=env).level
           for cmd in ("", "pwd", "git status", "git commit -m x", "eval \"$X\"", "rm -rf src")}
    assert got == {"": 0, "pwd": 0, "git status": 0, "git commit -m x": 1, "eval \"$X\"": 2, "rm -rf src": 3}


# -- GIT_SAFE: read-only subcommands --------------------------------------------------------------

# One read-only use of every subcommand on the list: SAFE (git runs alone, reads inside).
_GIT_READ_ONLY = [
    "git status", "git diff", "git log", "git show", "git blame src/app.py", "git annotate src/app.py",
    "git rev-parse HEAD", "git ls-files", "git ls-tree HEAD", "git cat-file -p HEAD", "git describe",
    "git shortlog", "git grep foo", "git rev-list HEAD", "git merge-base main dev", "git name-rev HEAD",
    "git show-ref", "git for-each-ref", "git count-objects", "git version --build-options", "git whatchanged",
    "git check-ignore src/app.py", "git check-attr diff src/app.py", "git diff-tree HEAD", "git diff-files",
    "git diff-index HEAD", "git range-diff main...dev", "git cherry", "git var -l", "git help log",
    # (bare `git version` is also a version query; with an option it is judged as a subcommand)
    # listing forms (see _git_listing)
    "git branch", "git tag", "git remote", "git config --list", "git stash list", "git reflog",
    "git worktree list", "git notes list", "git submodule status", "git symbolic-ref HEAD",
]


def test_git_read_only_subcommands_are_safe(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, dict.fromkeys(_GIT_READ_ONLY, S)) == []


def test_git_subcommands_off_the_list_are_not_safe(root: Path, env: dict[str, str]) -> None:
    # Not on the read-only list (or not a listing form): asks.
    cmds = ["git frobnicate", "git fsck", "git archive HEAD", "git branch topic", "git tag v1",
            "git remote add up ../up.git", "git stash", "git worktree add wt", "git notes add -m x"]
    assert _mismatches(root, env, dict.fromkeys(cmds, O)) == []


# The options that make a read-only subcommand write files or run programs.
_GIT_RISKY_OPTIONS = [
    "git diff --output=out.txt", "git diff --ext-diff", "git log --output=out.txt", "git log --ext-diff",
    "git show --output=out.txt", "git show --ext-diff", "git blame --contents src/app.py src/app.py",
    "git grep --open-files-in-pager foo", "git grep --ext-grep foo", "git whatchanged --output=out.txt",
    "git diff-tree --output=out.txt HEAD", "git diff-tree --ext-diff HEAD", "git diff-files --output=out.txt",
    "git diff-index --output=out.txt HEAD", "git range-diff --output=out.txt main...dev",
]


def test_git_risky_options_make_it_ordinary(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, dict.fromkeys(_GIT_RISKY_OPTIONS, O)) == []


# -- GIT_WRITES: git alone may write .git -----------------------------------------------------------

# One ordinary (or read-only) use of every subcommand that may write the repository: git_only.
# restore appears twice in the table; prune is always dangerous (never git_only): both explained.
_GIT_WRITERS = [
    "git add src/app.py", "git commit -m x", "git checkout main", "git switch main",
    "git restore --staged src/app.py", "git reset HEAD src/app.py", "git stash", "git merge dev",
    "git rebase main", "git cherry-pick abc123", "git revert abc123", "git fetch origin", "git pull",
    "git push origin main", "git tag v1", "git branch topic", "git mv src/app.py src/b.py",
    "git rm --cached src/app.py", "git am fix.patch", "git apply fix.patch", "git notes add -m x", "git init",
    "git clone https://example.com/r.git", "git status", "git diff", "git log", "git show",
    "git blame src/app.py", "git rev-parse HEAD", "git ls-files", "git describe", "git shortlog", "git grep foo",
    "git remote add up https://example.com/r.git", "git gc", "git clean -n", "git worktree list",
    "git sparse-checkout list", "git update-index --refresh", "git read-tree HEAD", "git write-tree",
    "git commit-tree abc123 -m x", "git update-ref refs/heads/x HEAD", "git symbolic-ref HEAD", "git reflog",
    "git repack", "git maintenance run", "git format-patch -1", "git bisect start", "git range-diff main...dev",
    "git rev-list HEAD", "git cat-file -p HEAD", "git show-ref", "git for-each-ref", "git merge-base main dev",
    "git ls-tree HEAD", "git stage src/app.py", "git cherry", "git whatchanged", "git count-objects", "git fsck",
    "git lfs pull",
]


def test_git_writers_may_write_git_when_alone(root: Path, env: dict[str, str]) -> None:
    bad = []
    for cmd in _GIT_WRITERS:
        a = classify.analyze(cmd, root, env=env)
        if not (a.git_only and [s.git_write for s in a.steps] == [True]):
            bad.append((cmd, _NAMES.get(a.level), a.reasons()))
    assert bad == []


def test_git_write_needs_a_known_writer_alone_in_the_workspace(root: Path, env: dict[str, str]) -> None:
    # An unknown subcommand, a dangerous one, a -C elsewhere, or git with another program: no.
    cmds = ["git frobnicate", "git push --force", "git reset --hard", "git prune", "git -C src status",
            "git status && ls", "git annotate src/app.py", "git diff-tree HEAD", "git var -l", "git help log"]
    assert [c for c in cmds if classify.analyze(c, root, env=env).git_only] == []


# -- _GIT_SHORT_VALUES: the short options that take a value ------------------------------------------

# Each value is skipped: a computed value is no computed operand, an attached value is no cluster of
# letters (-cfix is not -f), and the operands after it are counted from the right place.
_SHORT_VALUES = {
    "git checkout -b feature origin/main": O,  # one operand: a branch to check out, not paths
    "git checkout -B feature origin/main": O,
    "git switch -c \"$BRANCH\"": O,
    "git switch -cfix": O,  # a new branch named fix, not --force
    "git push -o \"$OPT\" origin main": O,
    "git push -oforce origin main": O,  # a push option named force
    "git stash -m \"$MSG\"": O,
    "git stash -m drop": O,  # a message, not `git stash drop`
    "git restore --staged -s \"$REV\" src/app.py": O,
    "git restore --staged -sWIP src/app.py": O,  # source WIP, not -W (the work tree)
    "git rebase -Xsubtree=ext/lib main": O,  # a strategy option, not -x (exec)
    "git rebase -s ours main": O,
    "git clone -b main ../up.git copy": O,  # the repository is read; only copy is written
    "git clone -c color.ui=never ../up.git copy": O,
    "git clone -o upstream ../up.git copy": O,
    "git clone -j 4 ../up.git copy": O,
    "git clone -u git-upload-pack ../up.git copy": O,
    "git worktree add -b hotfix ../hotfix": D,  # the worktree ../hotfix is outside
    "git worktree add -B hotfix ../hotfix": D,
    "git worktree add -b \"$B\" wt": O,
    "git clean -n -e \"$KEEP\"": O,
    "git clean -n -efixtures": O,  # an exclude pattern, not -f
    "git config -f ../shared.cfg user.name me": D,  # writes the file named by -f, outside
    "git branch -u \"$UP\"": O,
    "git branch -uorigin/fix": O,  # an upstream, not -f
}


def test_git_short_options_that_take_a_value(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, _SHORT_VALUES) == []


def test_git_short_flags_that_take_no_value(root: Path, env: dict[str, str]) -> None:
    # git clean -X (remove only ignored files) is a flag: the f after it still forces.
    cmds = {"git clean -Xf": D, "git clean -Xdf": D, "git push -uf origin main": D}
    assert _mismatches(root, env, cmds) == []


# -- _GIT_GLOBAL_ARG: global options whose value is the next word -------------------------------------

_GLOBAL_ARGS = {
    "git -C src push --force": D, "git -c color.ui=never push --force": D,
    "git --git-dir x.git push --force": D, "git --work-tree . reset --hard": D,
    "git --namespace foo push --force": D, "git --config-env color.ui=C push --force": D,
    "git --super-prefix foo/ push --force": D, "git --attr-source HEAD push --force": D,
    # with =, the value is in the same word: the next word is the subcommand
    "git --git-dir=x.git push --force": D, "git --namespace=foo push --force": D,
    # git --exec-path (no =) prints git's directory and exits: nothing after it runs
    "git --exec-path push --force": S,
}


def test_git_global_options_take_the_next_word(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, _GLOBAL_ARGS) == []


# -- _GIT_BENIGN_CONFIG: -c keys that only change how output looks --------------------------------------

_BENIGN_KEYS = ["color", "color.ui", "color.diff.meta", "core.quotepath", "core.quotePath", "log.date", "log.decorate",
                "log.abbrevCommit", "diff.noprefix", "diff.renames", "diff.mnemonicPrefix", "diff.context",
                "diff.interHunkContext", "diff.algorithm", "advice.detachedHead", "user.name", "user.email",
                "init.defaultBranch", "safe.directory", "column.ui"]
# (pager.log=x: x is the pager program; pager.<command> is benign only turned on or off, see
# test_classify_wrappers_and_nested_code.py)
_RISKY_KEYS = ["pager.log", "core.pager", "core.editor", "core.fsmonitor", "core.sshCommand", "core.hooksPath", "diff.external",
               "alias.st", "colorx", "log.showSignature", "gpg.program", "pager", "user.signingKey", "credential.helper"]


def test_git_benign_config_keys(root: Path, env: dict[str, str]) -> None:
    expected = {f"git -c {k}=x status": S for k in _BENIGN_KEYS}
    expected |= {f"git -c {k}=x status": U for k in _RISKY_KEYS}
    assert _mismatches(root, env, expected) == []


def test_git_config_of_a_benign_key_may_be_covered(root: Path, env: dict[str, str]) -> None:
    got = {cmd: classify.analyze(cmd, root, env=env).steps[0].coverable
           for cmd in ("git config user.name me", "git config color.ui auto", "git config core.pager less",
                       "git config alias.st status")}
    assert got == {"git config user.name me": True, "git config color.ui auto": True,
                   "git config core.pager less": False, "git config alias.st status": False}


# -- other module-level statements ---------------------------------------------------------------------

def test_places_is_frozen_and_hashable(root: Path) -> None:
    p = classify.Places(root, (), Path("/nonexistent-home"))
    assert hash(p) == hash(classify.Places(root, (), Path("/nonexistent-home")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.root = Path("/")  # type: ignore[misc]


def _w(*vals: str) -> list[Word]:
    return [Word(v, v) for v in vals]


def test_scan_defaults() -> None:
    # By default no short option takes a value, and options may follow operands.
    o = classify.scan(_w("a", "-X", "b", "-r"))
    assert (o.shorts, [w.value for w in o.operands], o.values, o.ended) == ("Xr", ["a", "b"], [], False)


def test_options_after_operands_still_count(root: Path, env: dict[str, str]) -> None:
    # GNU tools permute: `rm build -rf` and `chmod 777 -R .` are recursive.
    cmds = {"rm build -rf": D, "chmod 777 -R src": D, "rm src/app.py -f": D}
    assert _mismatches(root, env, cmds) == []
