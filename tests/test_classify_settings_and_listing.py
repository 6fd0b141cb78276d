"""Exact analyses of classify (shell settings, listings, globbing, sed, the environment):
each test gives a concrete command and the level, reasons and Step fields the code must give for
it, reasoned from classify's rules (shell settings, git's options and listing forms, find's
allowlist, globbing as bash does it, sed's read-only subset, the environment allowlist)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.classify import ORDINARY, SAFE, UNKNOWN, analyze


def _steps(a: classify.Analysis) -> list[tuple]:
    return [(s.program, s.level, s.reasons, s.via, s.coverable) for s in a.steps]


# -- shell settings -------------------------------------------------------------------------------

def test_alias_taints_the_programs_after_it(root: Path) -> None:
    # After `alias ls=rm` the name ls runs rm: the later ls cannot be judged by its name.
    a = analyze("alias ls=rm; ls", root)
    assert _steps(a) == [
        ("alias", UNKNOWN, ["alias changes which programs later names run"], "", True),
        ("ls", UNKNOWN, ["alias changes which programs the names after it run"], "", False),
    ]


# -- git ------------------------------------------------------------------------------------------

def test_git_dash_c_computed_directory_is_unknown(root: Path) -> None:
    # git -C "$D": where git runs (and so which repository it changes) is computed.
    a = analyze('git -C "$D" status', root)
    assert a.level == UNKNOWN
    assert _steps(a) == [("git", UNKNOWN, ["git -C a computed directory"], "", True)]


def test_git_pathspec_from_file_takes_the_next_word(root: Path) -> None:
    # The computed word is the option's file name, not a pathspec or option of reset: the step
    # stays ordinary, and may write .git.
    a = analyze('git reset --pathspec-from-file "$F"', root)
    assert _steps(a) == [("git", ORDINARY, [], "", True)]
    assert a.steps[0].git_write is True
    assert a.git_only is True


def test_git_switch_with_computed_arguments_is_unknown(root: Path) -> None:
    # A computed word given to git switch may be -f or --discard-changes.
    a = analyze('git switch "$B"', root)
    assert _steps(a) == [("git", UNKNOWN, ['git switch with computed arguments ("$B")'], "", True)]
    assert a.steps[0].git_write is False


def test_git_hook_runs_other_programs(root: Path) -> None:
    # git hook run executes the repository's hook scripts: no "always" may cover it.
    a = analyze("git hook run pre-commit", root)
    assert _steps(a) == [("git", ORDINARY, ["git hook runs other programs"], "", False)]
    assert a.steps[0].prefix is None


def test_git_config_get_subcommand_reads(root: Path) -> None:
    # The git 2.46 spelling `git config get KEY` only reads: it is no write of the key "get".
    a = analyze("git config get core.editor", root)
    assert _steps(a) == [("git", SAFE, [], "", True)]
    assert a.steps[0].prefix == ("git", "config")


def test_git_unknown_level_is_not_a_git_write(root: Path) -> None:
    # git_write lets git alone write .git without asking: never for an unknown step.
    a = analyze('git reset "$REV"', root)
    assert _steps(a) == [("git", UNKNOWN, ['git reset with computed arguments ("$REV")'], "", True)]
    assert a.steps[0].git_write is False
    assert a.git_only is False


def test_git_branch_contains_lists(root: Path) -> None:
    # An operand with --contains is a commit to filter by, not a branch to create.
    a = analyze("git branch --contains HEAD", root)
    assert _steps(a) == [("git", SAFE, [], "", True)]


def test_git_tag_message_is_not_a_listing(root: Path) -> None:
    # --message makes an annotated tag: never read-only, even with no tag name given.
    a = analyze("git tag --message=v1", root)
    assert _steps(a) == [("git", ORDINARY, [], "", True)]
    assert a.steps[0].prefix == ("git", "tag")


def test_git_config_name_only_reads(root: Path) -> None:
    # --name-only is a listing option of git config: no value is set.
    a = analyze("git config --name-only", root)
    assert _steps(a) == [("git", SAFE, [], "", True)]


def test_git_stash_show_reads(root: Path) -> None:
    a = analyze("git stash show", root)
    assert _steps(a) == [("git", SAFE, [], "", True)]


def test_git_symbolic_ref_with_two_operands_sets_a_ref(root: Path) -> None:
    # symbolic-ref NAME REF points NAME at REF: a write, so not on the read-only list.
    a = analyze("git symbolic-ref HEAD refs/heads/main", root)
    assert _steps(a) == [("git", ORDINARY, [], "", True)]
    assert a.steps[0].prefix == ("git", "symbolic-ref")
    assert a.steps[0].git_write is True


# -- the read-only list ---------------------------------------------------------------------------

def test_find_ok_is_not_read_only(root: Path) -> None:
    # find -ok runs a command per file: find itself is not read-only (its command is a step).
    a = analyze(r"find . -ok cat {} \;", root)
    assert _steps(a) == [("find", ORDINARY, [], "", True), ("cat", ORDINARY, [], "find -ok", True)]


def test_sbin_program_is_a_system_program(root: Path) -> None:
    # /sbin is a system directory: a listed program named by that path is still read-only.
    a = analyze("/sbin/ls", root)
    assert _steps(a) == [("/sbin/ls", SAFE, [], "", True)]


def test_double_star_is_one_level_as_in_bash(root: Path, tmp_path: Path) -> None:
    # Without globstar bash reads ** as *: **/link matches only src/link (absent), never the
    # deeper src/sub/link that leads out of the workspace.
    (tmp_path / "secret.txt").write_text("s\n")
    (root / "src" / "sub").mkdir()
    os.symlink(tmp_path / "secret.txt", root / "src" / "sub" / "link")
    a = analyze("cat **/link", root)
    assert _steps(a) == [("cat", SAFE, [], "", True)]


def test_makeflags_without_expansions_is_allowed(root: Path) -> None:
    # MAKEFLAGS is allowed with any value that expands nothing ($ or `).
    a = analyze("MAKEFLAGS=-j4 ls", root)
    assert _steps(a) == [("ls", SAFE, [], "", True)]
    assert [(n, w.value) for n, w in a.steps[0].assigns] == [("MAKEFLAGS", "-j4")]


# -- sed ------------------------------------------------------------------------------------------

def test_sed_label_after_a_blank_is_outside_the_subset(root: Path) -> None:
    # GNU sed accepts ': a' (blanks before the label); the subset does not, so the w FILE after
    # it is never read as part of an accepted script.
    a = analyze("sed -n ': a;w /tmp/pwn' src/app.py", root)
    assert _steps(a) == [("sed", UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"], "", False)]


def test_sed_commands_separated_by_semicolons_read_only(root: Path) -> None:
    a = analyze("sed -n 'p;p' src/app.py", root)
    assert _steps(a) == [("sed", SAFE, [], "", True)]


# -- analyze --------------------------------------------------------------------------------------

def test_deeper_than_the_stack_is_unknown(root: Path) -> None:
    # 150 nested subshells are within the parser's own limit (200) but deeper than a stack of
    # 100 more frames: the RecursionError is a finding, not a crash.
    command = "(" * 150 + "ls" + ")" * 150
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 100)
    try:
        a = analyze(command, root)
    finally:
        sys.setrecursionlimit(old)
    assert a.findings == [(UNKNOWN, "the command is nested too deeply to check")]
    assert a.steps == []
    assert a.level == UNKNOWN
