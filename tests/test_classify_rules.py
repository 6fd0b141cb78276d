"""Exact analyses of classify's rules: each test
gives a concrete command and the level, reasons and Step fields the code must give for it,
reasoned from the rules in classify (wrappers, nested shells, git, tar, sed, grep, kill ...)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from classify_fixtures import REAL_TEMP_DIRS, _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, Places, analyze

_REAL_TEMP_DIRS = REAL_TEMP_DIRS


def _steps(a: classify.Analysis) -> list[tuple]:
    return [(s.program, s.level, s.reasons, s.via, s.coverable) for s in a.steps]


# -- places and temporary directories -------------------------------------------------------------

def test_dev_null_is_null(root: Path) -> None:
    assert Places(root, (), Path("/nonexistent-home")).where(Path("/dev/null")) == "null"


def test_tmpdir_counts_as_a_temporary_directory(tmp_path: Path, monkeypatch) -> None:
    mine = tmp_path / "mytmp"
    mine.mkdir()
    monkeypatch.setenv("TMPDIR", str(mine))
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")  # gettempdir() would otherwise also be TMPDIR
    assert Path(os.path.realpath(mine)) in _REAL_TEMP_DIRS.__wrapped__()


# -- wrappers -------------------------------------------------------------------------------------

def test_popd_leaves_the_directory_unknown(root: Path) -> None:
    # popd ignores its operand: later relative reads are in a directory we cannot know.
    a = analyze("popd src && cat app.py", root)
    assert a.level == ORDINARY
    assert _steps(a)[1] == ("cat", ORDINARY, ["runs in a directory the shell computes"], "", False)


def test_su_c_runs_its_command(root: Path) -> None:
    a = analyze('su -c "rm x"', root)
    assert _steps(a) == [("su", DANGEROUS, ["su: runs as another user"], "", True),
                         ("rm", ORDINARY, [], "su -c", True)]


def test_setsid_options_are_skipped(root: Path) -> None:
    a = analyze("setsid -w ls", root)
    assert _steps(a) == [("ls", SAFE, [], "setsid", True)]


def test_env_unset_takes_a_value(root: Path) -> None:
    a = analyze("env --unset FOO ls", root)
    assert _steps(a) == [("ls", SAFE, [], "env", True)]


def test_env_assignment_is_kept_on_the_step(root: Path) -> None:
    a = analyze("env FOO=bar ls", root)
    (s,) = a.steps
    assert [(n, w.value) for n, w in s.assigns] == [("FOO", "bar")]
    assert (s.level, s.reasons, s.coverable) == (
        UNKNOWN, ["sets FOO for ls, which may change what it runs or reads (not checked)"], False)


def test_flock_runs_the_command_after_the_lock_file(root: Path) -> None:
    a = analyze("flock lk ls", root)
    assert _steps(a) == [("ls", SAFE, [], "flock", True)]


def test_nice_adjustment_takes_a_value(root: Path) -> None:
    a = analyze("nice --adjustment 5 ls", root)
    assert _steps(a) == [("ls", SAFE, [], "nice", True)]


def test_find_exec_braces_are_unknown_file_names(root: Path) -> None:
    a = analyze("find . -exec cat {} \\;", root)
    assert [s.values() for s in a.steps] == [["find", ".", "-exec", "cat", "{}", ";"], ["cat", None]]
    assert a.steps[1].via == "find -exec"


def test_fd_x_step_is_via_fd(root: Path) -> None:
    a = analyze("fd -x rm", root)
    assert _steps(a)[1] == ("rm", UNKNOWN, ["rm with arguments the shell computes ({}), which may be options",
                                            "deletes a computed path ({})"], "fd -x", True)


def test_trap_options_stop_at_the_first_operand(root: Path) -> None:
    # `-p` after the code is an operand: the trap code still runs rm.
    a = analyze('trap "rm x" EXIT -p', root)
    assert [(s.program, s.via, s.inert) for s in a.steps] == [("trap", "", True), ("rm", "trap", False)]


def test_python_m_with_a_pipe_is_not_code_from_the_pipe(root: Path) -> None:
    a = analyze("echo x | python -m json.tool", root)
    assert _steps(a)[1] == ("python", ORDINARY, [], "", True)


def test_shell_reading_a_script_file(root: Path) -> None:
    a = analyze("bash < s.sh", root)
    assert _steps(a) == [("bash", ORDINARY, ["bash runs a script read from a file"], "", False)]


def test_every_input_redirect_is_checked(root: Path) -> None:
    a = analyze("cat < $F < /etc/passwd", root)
    assert a.steps[0].reasons == ["reads a computed path ($F)", "reads a file outside the workspace (/etc/passwd)"]


def test_group_redirect_writes_unattached(root: Path) -> None:
    a = analyze("{ ls; } > out.txt", root)
    assert a.writes_unattached is True
    assert _steps(a) == [("ls", SAFE, [], "", True)]


# -- program rules ----------------------------------------------------------------------------------

def test_truncate_size_takes_a_value(root: Path) -> None:
    # The size is not a file written: only the operand f is (named-path note for the value).
    a = analyze("truncate --size /etc/passwd f", root)
    assert (a.level, a.reasons()) == (ORDINARY, ["names a path outside the workspace (/etc/passwd)"])


def test_rsync_remove_source_files_deletes_its_sources(root: Path) -> None:
    a = analyze("rsync --remove-source-files $SRC dest", root)
    assert (a.level, a.reasons()) == (UNKNOWN, ["deletes a computed path ($SRC)"])


def test_chmod_computed_argument_may_be_an_option(root: Path) -> None:
    a = analyze("chmod 644 $F", root)
    assert a.reasons() == ["chmod with arguments the shell computes ($F), which may be options",
                           "changes a computed path ($F)"]


def test_curl_trace_ascii_writes_its_value(root: Path) -> None:
    a = analyze("curl --trace-ascii /etc/x http://e", root)
    assert (a.level, a.reasons()) == (DANGEROUS, ["writes outside the workspace (/etc/x)",
                                                  "names a path outside the workspace (/etc/x)"])


def test_tar_new_volume_script_runs_a_program(root: Path) -> None:
    a = analyze("tar --new-volume-script x.sh -c -f a.tar b", root)
    assert _steps(a) == [("tar", UNKNOWN, ["tar runs a program given in its options"], "", False)]


def test_tar_c_as_a_separate_option_writes_the_archive(root: Path) -> None:
    a = analyze("tar -v -c -f /etc/a.tar x", root)
    assert (a.level, a.reasons()) == (DANGEROUS, ["writes outside the workspace (/etc/a.tar)",
                                                  "names a path outside the workspace (/etc/a.tar)"])


def test_sed_e_script_is_checked(root: Path) -> None:
    a = analyze('sed -e "s/a/b/w out.txt" p', root)
    assert _steps(a) == [("sed", UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"], "", False)]


@pytest.mark.parametrize("script", ["Xp", "s"])
def test_sed_scripts_outside_the_subset(root: Path, script: str) -> None:
    # X is no sed command; a bare s has no delimiter.
    a = analyze(f"sed {script} src/app.py", root)
    assert (a.level, a.reasons()) == (UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"])


def test_sed_leading_separators_are_skipped(root: Path) -> None:
    assert analyze("sed ' ;p' src/app.py", root).level == SAFE


def test_namespace_tools_with_i_options_are_unknown(root: Path) -> None:
    a = analyze("unshare -i ls", root)
    assert _steps(a) == [("unshare", UNKNOWN, ["unshare changes the process's namespaces or privileges"], "", False)]


def test_nsjail_is_unknown(root: Path) -> None:
    a = analyze("nsjail ls", root)
    assert _steps(a) == [("nsjail", UNKNOWN, ["nsjail changes the process's namespaces or privileges"], "", False)]


def test_kill_n_takes_a_signal_number(root: Path) -> None:
    # The computed word is the signal, not a process: only 5 is a target.
    a = analyze("kill -n $SIG 5", root)
    assert _steps(a) == [("kill", ORDINARY, [], "", True)]


def test_set_with_a_clustered_a_taints_what_follows(root: Path) -> None:
    a = analyze("set -ea; ls", root)
    assert _steps(a) == [("set", ORDINARY, ["set changes how the shell runs what follows"], "", False),
                         ("ls", UNKNOWN, ["set -a exports every variable set after it"], "", False)]


def test_awk_options_after_the_program_are_operands(root: Path) -> None:
    assert _steps(analyze("awk '{print}' -f prog.awk", root)) == [("awk", SAFE, [], "", True)]


# -- git ---------------------------------------------------------------------------------------------

def test_git_c_with_a_literal_setting(root: Path) -> None:
    a = analyze("git -c core.pager=less status", root)
    assert _steps(a) == [("git", UNKNOWN, ["git -c core.pager can make git run programs"], "", False)]


def test_git_C_skips_its_directory(root: Path) -> None:
    a = analyze("git -C src push -f origin", root)
    assert (a.level, a.reasons()) == (DANGEROUS, ["force-push or remote delete"])
    assert analyze("git -C src status --short", root).level == SAFE


def test_git_source_takes_a_value(root: Path) -> None:
    # `drop` is the value of --source, so this is no `git stash drop`.
    assert analyze("git stash --source drop", root).level == ORDINARY


def test_git_prune_with_computed_arguments(root: Path) -> None:
    a = analyze("git prune $X", root)
    assert a.steps[0].reasons == ["git prune with computed arguments ($X)", "prunes unreachable objects"]


def test_git_switch_f_is_dangerous(root: Path) -> None:
    a = analyze("git switch -f main", root)
    assert (a.level, a.reasons()) == (DANGEROUS, ["discards changes or resets a branch (git switch --force / -C)"])


def test_git_filter_repo_is_dangerous(root: Path) -> None:
    assert analyze("git filter-repo --force", root).reasons() == ["rewrites the whole history"]


def test_git_credential_is_not_coverable(root: Path) -> None:
    a = analyze("git credential fill", root)
    assert _steps(a) == [("git", ORDINARY, ["git credential runs other programs"], "", False)]


def test_git_config_of_a_computed_key(root: Path) -> None:
    a = analyze("git config $K v", root)
    assert (a.level, a.reasons()) == (UNKNOWN, ["git config of a computed key"])


@pytest.mark.parametrize("command", ["git branch --list foo", "git config --show-scope user.name",
                                     "git submodule status"])
def test_git_listing_forms_are_safe(root: Path, command: str) -> None:
    assert analyze(command, root).level == SAFE


def test_git_reflog_drop_is_not_read_only(root: Path) -> None:
    # git 2.50's `reflog drop` deletes a ref's whole reflog: as dangerous as `reflog delete`.
    assert _steps(analyze("git reflog drop", root)) == [("git", DANGEROUS, ["deletes reflog entries (loses the way back)"], "", True)]


# -- the read-only list --------------------------------------------------------------------------------

def test_usr_local_bin_is_a_system_directory(root: Path) -> None:
    assert analyze("/usr/local/bin/cat src/app.py", root).level == SAFE


def test_find_execdir_is_not_read_only(root: Path) -> None:
    a = analyze("find . -execdir ls \\;", root)
    assert [(s.program, s.level) for s in a.steps] == [("find", ORDINARY), ("ls", SAFE)]


def test_grep_e_value_is_a_pattern_not_a_path(root: Path) -> None:
    assert analyze("grep -e /etc/passwd src", root).level == SAFE


def _fake(tmp_path: Path, name: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return d


def test_go_version_forms(root: Path, tmp_path: Path) -> None:
    # go: only `version` and `--version` are version queries (-v is not).
    env = {"PATH": str(_fake(tmp_path, "go"))}
    assert analyze("go version", root, env=env).level == SAFE
    assert analyze("go -v", root, env=env).level == ORDINARY


def test_version_of_a_missing_program_is_not_safe(root: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert analyze("go version", root, env={"PATH": str(empty)}).level == ORDINARY


@pytest.mark.parametrize("pattern", ["-e/etc", "--regexp=/etc"])
def test_grep_joined_pattern_then_the_files_are_judged(root: Path, pattern: str) -> None:
    # A pattern joined to its option ends no scan: the files after it are still paths.
    assert analyze(f"grep {pattern} src", root).level == SAFE
    a = analyze(f"grep {pattern} src /etc/passwd", root)
    assert a.level == ORDINARY and a.steps[0].reasons == ["names a path outside the workspace (/etc/passwd)"]


# -- the shell's own variables set without NAME=value ------------------------------------------------

@pytest.mark.parametrize("command, name", [
    ("read PATH <<< /tmp; ls", "PATH"), ("read -r -a PATH < f; ls", "PATH"), ("printf -v PATH /tmp; ls", "PATH"),
    ("getopts a PATH; ls", "PATH"), ("mapfile PATH < f; ls", "PATH"), ("let PATH=1; ls", "PATH"),
    ("let PATH++; ls", "PATH"), ("((--PATH)); ls", "PATH"), ("echo $((PATH=5)); ls", "PATH"),
    ("((PATH += 1)); ls", "PATH"), ("echo ${PATH:=/tmp}; ls", "PATH"), (": ${CDPATH=/tmp}; cd src; cat app.py", "CDPATH"),
    ("for PATH in /tmp; do ls; done", "PATH"), ("select BASH_ENV in x; do bash -c true; done", "BASH_ENV"),
    ('bash -c "read PATH; ls"', "PATH"), ("PATH[0]=/tmp; ls", "PATH"),
    ("printf -v PA\\\nTH /tmp; ls", "PATH"), ("read PA\\\nTH </dev/null; ls", "PATH"), ("let HO\\\nME=5; cd; ls", "HOME"),
])
def test_setting_a_shell_variable_any_way_taints_the_programs(root: Path, command: str, name: str) -> None:
    # bash looks programs up in PATH when they run: `for PATH in /tmp; do ls; done` runs /tmp/ls.
    a = analyze(command, root)
    assert a.level == UNKNOWN
    assert all(not s.coverable for s in a.steps) and a.steps
    assert (f"may set {name} (e.g. in arithmetic, a loop or read), which changes what its programs are or read"
            in a.steps[-1].reasons)


@pytest.mark.parametrize("command", [
    "echo $PATH; ls", "echo ${PATH}; ls", "echo ${PATH:-x}; ls", "grep -rn PATH src", "ls src/PATH",
    'printf "%s" "$PATH"; ls', "read -r line; ls", "let x=1; ls", '[ "$PATH" = x ] && ls', "ls --HOME src",
    "git log --oneline -- PATH",
])
def test_reading_a_shell_variable_or_naming_it_is_not_setting_it(root: Path, command: str) -> None:
    assert analyze(command, root).level == SAFE


# -- wrappers' options read as the programs do (found while pinning the tables) -------------------

@pytest.mark.parametrize("command, via", [
    ("ltrace -S rm -rf x", "ltrace"), ("ltrace -x foo rm -rf x", "ltrace"), ("ltrace -l libc.so rm -rf x", "ltrace"),
    ("xvfb-run -l rm -rf x", "xvfb-run"), ("xvfb-run --error-file log rm -rf x", "xvfb-run"),
    ("arch -arch x86_64 rm -rf x", "arch"), ("arch -x86_64 rm -rf x", "arch"), ("arch -e FOO=1 -d BAR rm -rf x", "arch"),
])
def test_the_program_a_wrapper_runs_is_found_past_its_options(root: Path, command: str, via: str) -> None:
    a = analyze(command, root)
    assert [(s.program, s.level, s.via) for s in a.steps] == [("rm", DANGEROUS, via)]


@pytest.mark.parametrize("command", ["pwsh -Command 'Remove-Item x'", "pwsh --command ls", "pwsh -e ZQBjAGgAbwA=",
                                     "powershell -Command ls", "pwsh -EncodedCommand ZQBjAGgAbwA=", "pwsh -ec x",
                                     "powershell /Command ls", 'pwsh "$mode" ls'])
def test_powershell_inline_code_in_any_spelling_is_unknown(root: Path, command: str) -> None:
    a = analyze(command, root)
    assert a.level == UNKNOWN and not a.steps[0].coverable


def test_powershell_running_a_script_is_not_inline_code(root: Path) -> None:
    assert "inline" not in " ".join(analyze("pwsh -File build.ps1", root).steps[0].reasons)
