"""Exact analyses of classify's option scanning and per-program rules: each test
gives a concrete command and the level, reasons and Step fields that the rules in classify
give it (option scanning, wrappers, nested shells, heredocs, and the per-program rules)."""

from __future__ import annotations

from pathlib import Path

from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze


def _steps(a: classify.Analysis) -> list[tuple]:
    return [(s.program, s.level, s.reasons, s.via, s.coverable) for s in a.steps]


# -- scan ---------------------------------------------------------------------------------------

def test_attached_short_value_is_kept_under_its_option(root: Path) -> None:
    # -o/etc/x is -o with the value /etc/x: curl writes there. The word itself starts with "-"
    # and has no "=", so only the option's value (not operand_places) can see the path.
    a = analyze("curl -o/etc/x http://example.com", root)
    assert _steps(a) == [("curl", DANGEROUS, ["writes outside the workspace (/etc/x)"], "", False)]


# -- declarations and assignments -----------------------------------------------------------------

def test_export_of_a_computed_name_is_unknown(root: Path) -> None:
    # `export $X` may export (or set) any variable: PATH included.
    a = analyze("export $X", root)
    assert _steps(a) == [("export", UNKNOWN, ["export of a computed name"], "", True)]
    assert a.steps[0].inert is False  # inert only below UNKNOWN


def test_home_set_after_a_line_continuation_makes_later_directories_unknown(root: Path) -> None:
    # bash joins HO\<newline>ME into HOME, and so does the check of the text: from then on `cd` may
    # go anywhere, so the last ls runs in a computed directory (and HOME taints it as well).
    a = analyze("HO\\\nME=/tmp; ls", root)
    taint = "may set HOME (e.g. in arithmetic, a loop or read), which changes what its programs are or read"
    assert a.level == UNKNOWN
    assert _steps(a)[-1] == ("ls", UNKNOWN, [taint, "runs in a directory the shell computes"], "", False)


# -- wrappers -----------------------------------------------------------------------------------

def test_runuser_c_runs_its_command(root: Path) -> None:
    # runuser takes -c like su: the command it runs is a step of its own.
    a = analyze('runuser -c "rm -r x"', root)
    assert _steps(a) == [("runuser", DANGEROUS, ["runuser: runs as another user"], "", True),
                         ("rm", DANGEROUS, ["recursive delete"], "runuser -c", True)]


def test_command_v_only_looks_a_name_up(root: Path) -> None:
    # `command -v ls` prints where ls is and runs nothing: inert, hence safe.
    a = analyze("command -v ls", root)
    assert a.level == SAFE
    (s,) = a.steps
    assert (s.program, s.level, s.inert, s.reasons) == ("command", SAFE, True, [])


def test_xargs_without_a_command_runs_echo(root: Path) -> None:
    # xargs with no command runs echo with what it reads.
    a = analyze("ls | xargs", root)
    s = a.steps[1]
    assert (s.program, s.via, s.prefix) == ("echo", "xargs", ("echo",))
    assert s.values() == ["echo", None]


def test_watch_stays_the_step_named_watch(root: Path) -> None:
    # watch's command is a nested step; the watch step itself is watch, with no arguments.
    a = analyze("watch -n 1 ls", root)
    assert [(s.program, s.via) for s in a.steps] == [("watch", ""), ("ls", "watch")]
    w = a.steps[0]
    assert (w.level, w.prefix, w.values()) == (ORDINARY, ("watch",), ["watch"])


def test_env_split_string_is_unknown(root: Path) -> None:
    # env -S splits its string into a command we do not read: it must not look like plain env.
    a = analyze('env -S "rm -rf /"', root)
    assert _steps(a) == [("env", UNKNOWN, ["env -S splits a string into a command"], "", True)]


def test_sudo_login_shell_runs_its_command(root: Path) -> None:
    # sudo -i (like -s) passes the words to a login shell's -c: the ls runs, as another user
    # (sudo's manual); the step is the ls, through sudo. -l only lists: the step stays sudo.
    a = analyze("sudo -i ls", root)
    assert _steps(a) == [("ls", DANGEROUS, ["sudo: runs as another user"], "sudo", True)]
    a = analyze("sudo -l ls", root)
    assert _steps(a) == [("sudo", DANGEROUS, ["sudo: runs as another user"], "", True)]


def test_fd_exec_batch_runs_its_command(root: Path) -> None:
    a = analyze("fd . --exec-batch rm -r", root)
    assert [(s.program, s.via) for s in a.steps] == [("fd", ""), ("rm", "fd --exec-batch")]
    assert a.level == DANGEROUS
    assert "recursive delete" in a.steps[1].reasons


# -- nesting ------------------------------------------------------------------------------------

def test_nine_nested_evals_are_too_deep(root: Path) -> None:
    # Each eval reads its text one level deeper: the ninth is past MAX_NESTING (8).
    a = analyze("eval " * 9 + "ls", root)
    assert a.findings == [(UNKNOWN, "shells nested too deeply to check")]
    assert [s.program for s in a.steps] == ["eval"] * 9


def test_eight_nested_evals_are_read(root: Path) -> None:
    a = analyze("eval " * 8 + "ls", root)
    assert a.findings == []
    assert [s.program for s in a.steps] == ["eval"] * 8 + ["ls"]
    assert a.level == SAFE


def test_heredoc_with_computed_parts_for_an_interpreter_is_unknown(root: Path) -> None:
    a = analyze("python3 <<EOF\nprint($X)\nEOF", root)
    assert _steps(a) == [("python3", UNKNOWN, ["python3 runs a here-document with computed parts"], "", False)]


def test_heredoc_with_computed_parts_for_a_shell_is_unknown(root: Path) -> None:
    a = analyze("bash <<EOF\necho $X\nEOF", root)
    assert _steps(a) == [("bash", UNKNOWN, ["bash runs a here-document with computed parts"], "", False)]


# -- program rules ------------------------------------------------------------------------------

def test_mknod_writes_its_operand(root: Path) -> None:
    a = analyze("mknod /etc/x p", root)
    assert _steps(a) == [("mknod", DANGEROUS, ["writes outside the workspace (/etc/x)",
                                                "names a path outside the workspace (/etc/x)"], "", False)]


def test_curl_output_dir_takes_the_next_word(root: Path) -> None:
    # --output-dir DIR: curl writes into DIR.
    a = analyze("curl --output-dir /etc -O http://example.com/y", root)
    assert _steps(a) == [("curl", DANGEROUS, ["writes outside the workspace (/etc)",
                                               "names a path outside the workspace (/etc)"], "", False)]


def test_curl_libcurl_writes_its_file(root: Path) -> None:
    # --libcurl FILE writes C source there.
    a = analyze("curl --libcurl /etc/x.c http://example.com", root)
    assert _steps(a) == [("curl", DANGEROUS, ["writes outside the workspace (/etc/x.c)",
                                               "names a path outside the workspace (/etc/x.c)"], "", False)]


def test_tar_rsh_command_runs_a_program(root: Path) -> None:
    a = analyze("tar -cf out.tar --rsh-command=/usr/bin/ssh src", root)
    assert _steps(a) == [("tar", UNKNOWN, ["tar runs a program given in its options",
                                            "names a path outside the workspace (/usr/bin/ssh)"], "", False)]


def test_tar_create_with_c_dir_does_not_extract(root: Path) -> None:
    # -C of a create is where tar reads from: named outside (asks, never covered), not a write.
    a = analyze("tar -c -f a.tar -C /etc hosts", root)
    assert _steps(a) == [("tar", ORDINARY, ["names a path outside the workspace (/etc)"], "", False)]


def test_sed_long_expression_is_the_script(root: Path) -> None:
    # With --expression the first operand (p) is a file, not the script: the w command of the
    # expression must be seen.
    a = analyze("sed --expression='1w /etc/x' p", root)
    assert _steps(a) == [("sed", UNKNOWN, ["the sed script may run commands or write files (e, w, r ...)"], "", False)]


def test_sed_long_in_place_edits_its_files(root: Path) -> None:
    a = analyze("sed --in-place s/a/b/ /etc/passwd", root)
    assert _steps(a) == [("sed", DANGEROUS, ["edits outside the workspace (/etc/passwd)",
                                              "names a path outside the workspace (/etc/passwd)"], "", False)]


def test_capsh_changes_privileges(root: Path) -> None:
    a = analyze("capsh --print", root)
    assert _steps(a) == [("capsh", UNKNOWN, ["capsh changes the process's namespaces or privileges"], "", False)]


def test_macos_security_touches_secrets(root: Path) -> None:
    a = analyze("security find-generic-password -s x", root)
    assert _steps(a) == [("security", ORDINARY, ["security touches keys or secrets"], "", False)]
    assert a.steps[0].prefix is None


def test_shopt_lastpipe_is_inert(root: Path) -> None:
    # lastpipe only runs a pipeline's last part in this shell: nothing later reads differently.
    a = analyze("shopt -s lastpipe; ls", root)
    assert _steps(a) == [("shopt", SAFE, [], "", True), ("ls", SAFE, [], "", True)]
    assert a.steps[0].inert is True
