"""classify: the Analysis summary, Places (device files, .git under a temporary directory, a workspace whose
own path holds a .git folder) and temp_dirs.

Each test names the slip it guards against."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
from classify_fixtures import REAL_TEMP_DIRS, _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

from ds4agent.tools.classify import DANGEROUS, ORDINARY, UNKNOWN, Analysis, Places, analyze

_REAL_TEMP_DIRS = REAL_TEMP_DIRS


# -- the summary of an analysis -------------------------------------------------------------------

def test_reasons_keep_only_findings_at_the_asked_level() -> None:
    # Slip: a finding below the level asked for is listed (`and` read as `or`).
    a = Analysis("x", findings=[(UNKNOWN, "low"), (DANGEROUS, "high"), (UNKNOWN, "low")])
    assert a.reasons() == ["high"]
    assert a.reasons(UNKNOWN) == ["low", "high"]  # each once, in the order found
    assert a.reasons(ORDINARY) == ["low", "high"]


def test_the_one_line_reason_joins_the_first_three() -> None:
    # Slips: another separator; a fourth reason shown (the approval prompt's line stays short).
    a = Analysis("x", findings=[(UNKNOWN, w) for w in ("a", "b", "c", "d")])
    assert a.reason() == "a; b; c"
    assert Analysis("x", findings=[(UNKNOWN, "only")]).reason() == "only"


# -- places -----------------------------------------------------------------------------------------

def test_places_cannot_be_changed_once_made(root: Path) -> None:
    # One Places is shared by every analysis of a policy: an analysis must not be able to move
    # the workspace or the temporary directories for the next one (and it must stay hashable).
    p = Places(root, (), Path("/nonexistent-home"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.root = Path("/")  # type: ignore[misc]
    assert hash(p) == hash(Places(root, (), Path("/nonexistent-home")))


def test_for_root_takes_home_from_the_environment(root: Path, tmp_path: Path, monkeypatch) -> None:
    # Slip: the home directory spelled as a literal path instead of expanding "~".
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert Places.for_root(root, ()).home == tmp_path / "h"


@pytest.mark.parametrize("dev", ["/dev/fd/3", "/proc/self/fd/1", "/dev/pts/0", "/dev/ttys003"])
def test_the_descriptor_and_terminal_files_are_null(root: Path, dev: str) -> None:
    # Slips: one of the prefixes (or the macOS terminal pattern) lost: /dev/fd/3 would then be a
    # device (dangerous to write), /proc/self/fd/1 a file outside.
    assert Places(root, (), Path("/nonexistent-home")).where(Path(dev)) == "null"


def test_ttys_must_be_the_whole_name(root: Path) -> None:
    p = Places(root, (), Path("/nonexistent-home"))
    assert p.where(Path("/dev/ttys003x")) == "device"
    assert p.where(Path("/dev/ttysx")) == "device"


def test_a_git_folder_under_a_temporary_directory_is_git(tmp_path: Path) -> None:
    # A repository under /tmp is still a repository: writing its .git plants hooks there.
    ws, tmp, out = tmp_path / "ws", tmp_path / "tmp", tmp_path / "elsewhere"
    for d in (ws, tmp / "r" / ".git", out / "r" / ".git"):
        d.mkdir(parents=True)
    (tmp / "to-git").symlink_to(tmp / "r" / ".git")
    (out / "to-tmp-git").symlink_to(tmp / "r" / ".git")
    p = Places(ws, (tmp,), tmp_path / "home")
    assert p.where(tmp / "r" / ".git" / "config") == "git"
    # Slip: both the name and the resolved path must be under .git (`or` read as `and`).
    assert p.where(tmp / "to-git" / "config") == "git"
    assert p.where(out / "to-tmp-git" / "config") == "git"
    # A .git that is neither in the workspace nor under tmp is simply outside.
    assert p.where(out / "r" / ".git" / "config") == "outside"
    assert p.where(tmp / "r" / "file") == "tmp"


def test_a_workspace_under_a_folder_named_git_is_still_a_workspace(tmp_path: Path) -> None:
    # Only the path below the root is searched for .git.
    ws = tmp_path / ".git" / "ws"
    (ws / ".git").mkdir(parents=True)
    p = Places(ws, (), tmp_path / "home")
    assert p.where(ws / "src" / "a.py") == "inside"
    assert p.where(ws) == "inside"
    assert p.where(ws / ".git" / "hooks" / "pre-commit") == "git"


# -- temp_dirs ---------------------------------------------------------------------------------------

def _temp_dirs_with(monkeypatch, tmpdir: str, gettempdir: str = "/tmp") -> list[Path]:
    monkeypatch.setenv("TMPDIR", tmpdir)
    monkeypatch.setattr(tempfile, "tempdir", gettempdir)
    return list(_REAL_TEMP_DIRS.__wrapped__())


def _system() -> list[Path]:
    return list(dict.fromkeys(Path(os.path.realpath(d)) for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)))


def test_a_tmpdir_that_does_not_exist_is_left_out(tmp_path: Path, monkeypatch) -> None:
    # Slip: `d and isdir(d)` read as `or`: a missing TMPDIR would count as temporary.
    assert _temp_dirs_with(monkeypatch, str(tmp_path / "missing")) == _system()


def test_the_root_folder_is_never_a_temporary_directory(monkeypatch) -> None:
    # TMPDIR=/ must not make the whole machine writable.
    assert _temp_dirs_with(monkeypatch, "/", gettempdir="/") == _system()


def test_temporary_directories_are_resolved_and_listed_once(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "link").symlink_to("/tmp")
    dirs = _temp_dirs_with(monkeypatch, str(tmp_path / "link"))
    assert dirs == _system()
    assert dirs[0] == Path(os.path.realpath("/tmp"))
    mine = tmp_path / "mine"
    mine.mkdir()
    assert _temp_dirs_with(monkeypatch, str(mine)) == [Path(os.path.realpath("/tmp")), mine.resolve()] + [
        d for d in _system() if d != Path(os.path.realpath("/tmp"))]


def test_without_tmpdir_only_the_system_ones(monkeypatch) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert list(_REAL_TEMP_DIRS.__wrapped__()) == _system()


# -- wrappers' long options that take a value ---------------------------------------------------

@pytest.mark.parametrize("wrapper,option", [
    ("ltrace", o) for o in ("--output", "--library", "--config", "--where", "--align", "--indent", "--user")] + [
    ("xvfb-run", o) for o in ("--server-num", "--error-file", "--auth-file", "--server-args", "--xauth-protocol")])
def test_a_wrappers_long_option_takes_the_next_word(root: Path, wrapper: str, option: str) -> None:
    # Slip: one long option missing from the wrapper's table: its value would be taken for the
    # program, and the rm behind it never judged.
    a = analyze(f"{wrapper} {option} v rm -rf x", root)
    assert [(s.program, s.level, s.via) for s in a.steps] == [("rm", DANGEROUS, wrapper)]
