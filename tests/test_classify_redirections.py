"""classify: bare redirections, symbolic links under temporary directories, which directories
are temporary.

Bare redirections (a step with no program), where a symlink under a temporary directory leads,
and which directories count as temporary."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from classify_fixtures import REAL_TEMP_DIRS, _no_temp_dirs, root  # noqa: F401

from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, Places, analyze

_REAL_TEMP_DIRS = REAL_TEMP_DIRS


@pytest.mark.parametrize("cmd, level, reasons", [
    # `> f` is `: > f` without the colon: no program runs, so nothing needs an approval of its own.
    ("> out.txt", SAFE, ["only redirects (no program runs)"]),
    (">> src/app.py", SAFE, ["only redirects (no program runs)"]),
    ("< src/app.py", SAFE, ["only redirects (no program runs)"]),
    ("2>&1", SAFE, ["only redirects (no program runs)"]),
    # ... but what it opens and where it runs still count, as for any program.
    ("< /etc/hostname", ORDINARY, ["reads a file outside the workspace (/etc/hostname)"]),
    ("< $f", ORDINARY, ["reads a computed path ($f)"]),
    ("cd /etc && < passwd", ORDINARY, ["runs in a directory outside the workspace (/etc)",
                                        "reads a file outside the workspace (/etc/passwd)"]),
    ("> /etc/x", DANGEROUS, ["writes outside the workspace (/etc/x)"]),
    ("> $f", UNKNOWN, ["writes a computed path ($f)"]),
])
def test_a_bare_redirection_runs_no_program(root: Path, cmd: str, level: int, reasons: list[str]) -> None:
    a = analyze(cmd, root)
    assert (a.level, a.reasons()) == (level, reasons)
    step = [s for s in a.steps if s.program is None]
    assert len(step) == 1 and step[0].argv == []
    # The same redirection after a real program: the step's reasons are that program's.
    if level == SAFE:
        assert analyze(f"true {cmd}", root).reasons() == ["runs true"]


def test_a_bare_redirection_writes_the_workspace(root: Path) -> None:
    a = analyze("> out.txt", root)
    assert a.writes_workspace and a.steps[0].writes
    assert not analyze("< src/app.py", root).writes_workspace


def test_symlinks_under_a_temporary_directory(tmp_path: Path) -> None:
    ws, tmp, out = tmp_path / "ws", tmp_path / "tmp", tmp_path / "elsewhere"
    for d in (ws, tmp, out):
        d.mkdir()
    (tmp / "leads-out").symlink_to(out)
    (out / "leads-to-tmp").symlink_to(tmp)
    (ws / "leads-to-tmp").symlink_to(tmp)
    p = Places(ws, (tmp,), tmp_path / "home")
    assert p.where(tmp / "x") == "tmp"
    # Under tmp by name only: the link leads outside, and that is where the write lands.
    assert p.where(tmp / "leads-out" / "x") == "outside"
    # Outside by name, under tmp in fact: still outside (only the workspace's own links count).
    assert p.where(out / "leads-to-tmp" / "x") == "outside"
    assert p.where(ws / "leads-to-tmp" / "x") == "tmp"
    assert p.where(ws / "x") == "inside"


def test_the_temporary_directories_always_include_the_system_ones(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mytmp"
    mine.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(mine))
    monkeypatch.setenv("TMPDIR", str(mine))
    _REAL_TEMP_DIRS.cache_clear()
    try:
        dirs = _REAL_TEMP_DIRS()
    finally:
        _REAL_TEMP_DIRS.cache_clear()
    expect = [Path(os.path.realpath(d)) for d in (mine, "/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)]
    assert list(dirs) == list(dict.fromkeys(expect))


@pytest.mark.parametrize("cmd, level", [
    ("git help log", SAFE), ("git help -a", SAFE),
    # --web starts the configured browser: a program outside any sandbox, never read-only
    ("git help --web log", ORDINARY), ("git help --we log", ORDINARY), ("git help -w log", ORDINARY),
    ("git help -aw", ORDINARY),
])
def test_git_help_is_read_only_unless_it_starts_a_browser(root: Path, cmd: str, level: int) -> None:
    assert analyze(cmd, root).level == level


@pytest.mark.parametrize("cmd, prefix", [
    # bun and deno are interpreters and runners: "always" for `bun run` must name the script,
    # or one answer would cover every script the model writes next.
    ("bun run build", ("bun", "run", "build")), ("bun x cowsay", ("bun", "x", "cowsay")),
    ("deno run main.ts", ("deno", "run", "main.ts")), ("deno task dev", ("deno", "task", "dev")),
    ("deno run -A main.ts", None), ("bun run", None),
    # their other subcommands and scripts stay (interpreter, word)
    ("bun test", ("bun", "test")), ("bun main.ts", ("bun", "main.ts")), ("deno test", ("deno", "test")),
    # uv tool run X names X (`uv tool install` is the subcommand alone, like npm install)
    ("uv tool run ruff", ("uv", "tool", "run", "ruff")), ("uv tool run --from x ruff", None),
    ("uv tool run", None), ("uv tool install ruff", ("uv", "tool", "install")), ("uv tool", None),
])
def test_runner_prefixes_of_interpreters_and_uv_tool(root: Path, cmd: str, prefix: tuple[str, ...] | None) -> None:
    (s,) = analyze(cmd, root).steps
    assert (s.level, s.prefix) == (ORDINARY, prefix)


@pytest.mark.parametrize("cmd, why", [
    # a system program's variants share its stem: before the first dot, or dot or underscore
    ("mkfs.ext4 disk.img", "mkfs.ext4: writes to disks"), ("/sbin/mkfs.ext4 disk.img", "mkfs.ext4: writes to disks"),
    ("/usr/sbin/mount.nfs", "mount.nfs: changes mounts or the root directory"),
    ("pivot_root.x", "pivot_root.x: changes mounts or the root directory"),
    ("shutdown_now", "shutdown_now: stops the machine"), ("sudo.ws ls", "sudo.ws: runs as another user"),
    # the exact name stays dangerous wherever it is
    ("./format", "format: writes to disks"),
    # the project's own scripts are not (they ask as any program does)
    ("./format.sh", None), ("format.sh", None), ("scripts/at.py", None), ("./mount.sh --all", None),
    ("./mkfs.ext4", None), ("batch.PY", None), ("at.sh", None), ("tools/reboot_test", None),
])
def test_system_families_and_project_scripts(root: Path, cmd: str, why: str | None) -> None:
    a = analyze(cmd, root)
    if why is None:
        assert (a.level, a.reasons()) == (ORDINARY, [f"runs {cmd.split()[0]}"])
    else:
        assert (a.level, a.reasons()) == (DANGEROUS, [why])


@pytest.mark.parametrize("ext", ["sh", "bash", "zsh", "fish", "py", "js", "mjs", "cjs", "ts", "rb", "pl", "php", "lua",
                                 "ps1", "bat", "cmd", "r", "jl", "exs", "tcl", "swift", "kts", "groovy"])
def test_a_script_extension_is_not_a_system_variant(root: Path, ext: str) -> None:
    # `at.<ext>` on PATH: a script someone wrote, not a variant of at(1)
    assert analyze(f"at.{ext}", root).level == ORDINARY
    assert analyze(f"at.{ext}x", root).level == DANGEROUS  # not a script's extension: at's family
