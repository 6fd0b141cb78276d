"""classify: what a shell reads from its standard input (a here-document, echo text piped in, a process
substitution), how deep that nesting goes, how a step whose program is computed is judged, and
which words of chmod, setfacl and chattr are the files that change.

Real misjudgements these rows found, fixed with them:
- `setfacl -m u:x:r /etc/x` changed nothing as far as classify saw (ordinary, "names a path"): the
  first operand was skipped as if it were a mode, but setfacl's ACL is an option's value;
- `chattr -i /etc/x` (clears the immutable flag) the same: chattr reads every leading word
  starting with -, + or = as attributes, so -i is no option and /etc/x is the file;
- `chmod 644 -- -x` changed 644, not -x: a word after -- matched chmod's dash mode.

A row names a command and the judgement it must get: the level, every reason, and whether the
sandbox may run each step (one letter a step, in order)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)
from test_classify_wrappers_and_nested_code import (  # what rm -rf / adds; (level, reasons, coverable letters)
    RMRF,
    _judged,
)

from ds4agent.tools.classify import DANGEROUS, MAX_WRAPPERS, ORDINARY, SAFE, UNKNOWN, analyze
from ds4agent.tools.classify.texttools import _sed_script_ok

STDIN_CASES = [
    # A process substitution is a downloaded script when any of its programs downloads, wherever
    # it stands in the list (not only when every one does).
    ('bash <(curl http://x)', DANGEROUS, ['bash runs a downloaded script'], 'yn'),
    ('bash <(ls; curl http://x)', DANGEROUS, ['bash runs a downloaded script'], 'yyn'),
    ('bash <(curl http://x; ls)', DANGEROUS, ['bash runs a downloaded script'], 'yyn'),
    ('bash <(echo; ls)', UNKNOWN, ['bash runs the output of a command as code'], 'yyn'),
    # source and . read the here-document as shell code, like bash /dev/stdin does: its programs
    # are judged (the rm is seen), not waved through as "not checked".
    ("source /dev/stdin <<'EOF'\nrm -rf /\nEOF", DANGEROUS,
     ['source runs a script in this shell, so the programs after it cannot be known'] + RMRF, 'nn'),
    ("source /dev/stdin <<'EOF'\nls\nEOF", UNKNOWN,
     ['source runs a script in this shell, so the programs after it cannot be known'], 'nn'),
    (". /dev/stdin <<'EOF'\nls\nEOF", UNKNOWN,
     ['. runs a script in this shell, so the programs after it cannot be known'], 'nn'),
    ("echo 'rm -rf /' | . /dev/stdin", DANGEROUS,
     ['. runs a script in this shell, so the programs after it cannot be known'] + RMRF, 'nnn'),
    ("bash /dev/stdin <<'EOF'\nls\nEOF", ORDINARY, ['runs bash'], 'ny'),
    ("bash <<'EOF'\nls\nEOF", ORDINARY, ['runs bash'], 'ny'),
    ('echo ls | bash', ORDINARY, ['runs bash'], 'yny'),
    ('ls | bash', UNKNOWN, ['bash runs text from a pipe as code (decoded or computed text is not checked)'], 'yn'),
    # A program named by a pattern: what it runs depends on the files there.
    ('sr*/app.py x', UNKNOWN, ['the program name is a file pattern (sr*/app.py)'], 'n'),
    # The code a shell reads runs where the shell runs: after cd /tmp, its `rm x` deletes /tmp/x.
    ("cd /tmp && bash <<'EOF'\nrm x\nEOF", DANGEROUS,
     ['runs in a directory outside the workspace (/tmp)', 'deletes outside the workspace (/tmp/x)'], 'ynn'),
    ("cd /tmp && echo 'rm x' | bash", DANGEROUS,
     ['runs in a directory outside the workspace (/tmp)', 'deletes outside the workspace (/tmp/x)'], 'ynnn'),
]


def _heredocs(n: int, inner: str) -> str:
    """`inner` inside n here-documents, each fed to bash (each its own delimiter)."""
    cmd = inner
    for i in range(n):
        cmd = f"bash <<'E{i}'\n{cmd}\nE{i}"
    return cmd


@pytest.mark.parametrize("inner, depth", [("ls", 1), ("echo ls | bash", 2)])
def test_a_here_document_or_echo_pipe_is_one_level_deeper(root: Path, inner: str, depth: int) -> None:
    # The innermost `ls` sits 8 levels deep (MAX_NESTING): read. One more level is too deep, whether
    # the last level is a here-document or echo text piped into a shell.
    n = 8 - depth + 1  # (MAX_NESTING is 8: written out, so a changed limit fails here)
    a = analyze(_heredocs(n, inner), root)
    assert a.findings == []
    assert [s.program for s in a.steps][-1] == "ls"
    a = analyze(_heredocs(n + 1, inner), root)
    assert a.findings == [(UNKNOWN, "shells nested too deeply to check")]
    assert "ls" not in [s.program for s in a.steps]


def test_a_computed_program_is_named_by_its_first_60_characters(root: Path) -> None:
    word = "$(printf %s " + "a" * 80 + ")"
    a = analyze(word + " y", root)
    (pf, s) = a.steps
    assert pf.program == "printf" and s.program is None
    assert s.reasons == [f"the program is computed ({word[:60]})"] and len(word[:60]) == 60
    assert (s.level, s.coverable, s.prefix) == (UNKNOWN, False, None)


def test_a_step_no_always_can_cover_has_no_prefix(root: Path) -> None:
    (s,) = analyze("rm -rf /", root).steps
    assert (s.level, s.coverable, s.prefix) == (DANGEROUS, False, None)
    (s,) = analyze("git push --force", root).steps
    assert (s.level, s.coverable, s.prefix) == (DANGEROUS, True, ("git", "push"))
    (s,) = analyze("ls", root).steps
    assert (s.level, s.prefix) == (SAFE, ("ls",))


CHANGE_CASES = [
    # setfacl: every operand is a file (the ACL is -m/-x's value, --modify's, --set's ...); -M and
    # -X read the ACL from a file.
    ('setfacl -m u:x:r /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl --modify u:x:r /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl --set u::rw /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl --remove-file a /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl -b /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl -m /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl -M /etc/x a', ORDINARY, ['names a path outside the workspace (/etc/x)'], 'n'),
    ('setfacl -R -m u:x:r src', DANGEROUS, ['recursive permission or owner change'], 'y'),
    ('setfacl -m u:x:r src/app.py', ORDINARY, ['runs setfacl'], 'y'),
    # --set-file, --modify-file and --remove-file name the file an ACL is read from; --restore a
    # dump to apply: none of those is a file that changes.
    ('setfacl --set-file /etc/acl src/app.py', ORDINARY, ['names a path outside the workspace (/etc/acl)'], 'n'),
    ('setfacl --modify-file /etc/acl src/app.py', ORDINARY, ['names a path outside the workspace (/etc/acl)'], 'n'),
    ('setfacl --remove-file /etc/acl src/app.py', ORDINARY, ['names a path outside the workspace (/etc/acl)'], 'n'),
    ('setfacl --restore /etc/acl', ORDINARY, ['names a path outside the workspace (/etc/acl)'], 'n'),
    # chattr: leading words starting with -, + or = are attributes (or -R/-V/-f, -v N, -p N);
    # the files follow.
    ('chattr -i /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr =i /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr -V -i src/app.py /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr -v 5 +i /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr -vp 5 6 /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr -p 5 src/app.py', ORDINARY, ['runs chattr'], 'y'),
    ('chattr -Ri src', DANGEROUS, ['recursive permission or owner change'], 'y'),
    ('chattr -i -R src', DANGEROUS, ['recursive permission or owner change'], 'y'),
    ('chattr +R src', ORDINARY, ['runs chattr'], 'y'),
    ('chattr +i src/app.py -R', ORDINARY, ['runs chattr'], 'y'),
    ('chattr -i', ORDINARY, ['runs chattr'], 'y'),
    ('chattr - /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chattr $A src/app.py', UNKNOWN, ['changes a computed path ($A)'], 'y'),
    ('cd /etc && chattr +i Xorg.conf', DANGEROUS,
     ['runs in a directory outside the workspace (/etc)', 'changes outside the workspace (/etc/Xorg.conf)'], 'yn'),
    # chmod: the dash modes before -- are the mode (GNU joins -x -w into one); after --, a word
    # like -x is a file.
    ('chmod -x -w /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('cd /etc && chmod 644 -- -x', DANGEROUS, ['runs in a directory outside the workspace (/etc)', 'changes outside the workspace (/etc/-x)'], 'yn'),
    ('cd /etc && chmod -w -- -x', DANGEROUS, ['runs in a directory outside the workspace (/etc)', 'changes outside the workspace (/etc/-x)'], 'yn'),
    ('chmod -- -x /etc/x', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('chmod /etc/x --reference src/app.py src/y', DANGEROUS, ['changes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
]


OPTION_CASES = [
    # gawk: --source's value is program text, and options still follow it (permute=False stops
    # only at the first operand): the -f after it is seen.
    ("awk --source 'BEGIN{}' -f x.awk", UNKNOWN, ['awk runs a program from a file, which is not checked'], 'n'),
    ("awk --source '{print}' src/app.py", SAFE, ['runs awk'], 'y'),
    ('awk --source \'BEGIN{system("rm x")}\'', UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'], 'n'),
    ("awk --include lib.awk 'BEGIN{}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], 'n'),
    ("awk --load x 'BEGIN{}'", UNKNOWN, ['awk runs a program from a file, which is not checked'], 'n'),
    ('awk --exec x.awk', UNKNOWN, ['awk runs a program from a file, which is not checked'], 'n'),
    ("awk --assign a=1 '{print}' src/app.py", SAFE, ['runs awk'], 'y'),
    # uniq and xxd write their second operand; a third is refused ("extra operand"), not written.
    ('uniq src/app.py /etc/x', DANGEROUS, ['writes outside the workspace (/etc/x)', 'names a path outside the workspace (/etc/x)'], 'n'),
    ('uniq src/app.py out /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], 'n'),
    ('xxd src/app.py out /etc/x', ORDINARY, ['names a path outside the workspace (/etc/x)'], 'n'),
    # A quoted ~ is a name in this directory (shellparse expands an unquoted one).
    ("cat '~/x'", SAFE, ['runs cat'], 'y'),
]


@pytest.mark.parametrize("cmd", ["sed -n p lin*/passwd", "awk '{print}' lin*/passwd", "mawk '{print}' lin*/passwd",
                                 "gawk 'NR==1' lin*/passwd", "cat lin*/passwd"])
def test_a_reader_s_pattern_through_a_link_out_asks(root: Path, tmp_path: Path, cmd: str) -> None:
    # sed and awk passed as read-only here without looking at what their patterns match (their
    # own checks returned first): lin*/passwd read /etc/passwd through a link, unasked.
    bin_ = tmp_path / "bin"  # the program, installed outside the workspace (a stub)
    bin_.mkdir()
    (bin_ / cmd.split()[0]).write_text("#!/bin/sh\n")
    (bin_ / cmd.split()[0]).chmod(0o755)
    env = {"PATH": str(bin_)}
    os.symlink("/etc", root / "link")
    (s,) = analyze(cmd, root, env=env).steps
    why = f"reads outside the workspace ({root / 'link' / 'passwd'})"
    assert (s.level, s.reasons, s.coverable, s.unsafe) == (ORDINARY, [why], False, why)
    (s,) = analyze(cmd.replace("lin*/passwd", "src/*"), root, env=env).steps
    assert (s.level, s.coverable, s.unsafe) == (SAFE, True, None)


def test_a_step_the_sandbox_may_not_run_says_so(root: Path) -> None:
    # A read-only program that names a path outside: its reasons say where; auto-edit's question
    # says why it was not run as read-only.
    (s,) = analyze("cat /etc/hostname", root).steps
    assert (s.level, s.coverable, s.unsafe) == (ORDINARY, False, "the sandbox may not run it")


@pytest.mark.parametrize("cmd, prefix", [("python3 -c 'print(1)'", None), ("python3 -m pytest", ("python3", "-m", "pytest")),
                                         ("python3 -m -W", None), ("python3 x.py", ("python3", "x.py")),
                                         ("bash -x run.sh", None), ("bash run.sh", ("bash", "run.sh"))])
def test_an_option_is_never_part_of_what_always_covers(root: Path, cmd: str, prefix: tuple | None) -> None:
    # "always" for `python3 -c ...` would cover every inline program: an option word ends it.
    assert analyze(cmd, root).steps[0].prefix == prefix


# What the read-only check says when it does not pass a step (auto-edit's question shows it):
# (command, level, the step's `unsafe`). Run with a workspace holding link -> /etc and
# zero -> /dev/zero, and the programs installed outside it.
UNSAFE_CASES = [
    ('git branch --delete x', ORDINARY, 'git branch that changes branches'),
    ('git branch -d x', ORDINARY, 'git branch that changes branches'),
    ('git branch --move a b', ORDINARY, 'git branch that changes branches'),
    ('git branch --copy a b', ORDINARY, 'git branch that changes branches'),
    ('git branch --track a', ORDINARY, 'git branch that changes branches'),
    ('git branch --no-track a', ORDINARY, 'git branch that changes branches'),
    ('git branch --recurse-submodules a', ORDINARY, 'git branch that changes branches'),
    ('git branch x', ORDINARY, 'git branch NAME creates a branch'),
    ('git branch --list x', SAFE, None),
    ('git tag -d x', ORDINARY, 'git tag that changes tags'),
    ('git tag -a x', ORDINARY, 'git tag that changes tags'),
    ('git tag --delete x', ORDINARY, 'git tag that changes tags'),
    ('git tag --force x', ORDINARY, 'git tag that changes tags'),
    ('git tag --annotate x', ORDINARY, 'git tag that changes tags'),
    ('git tag --sign x', ORDINARY, 'git tag that changes tags'),
    ('git tag --message m x', ORDINARY, 'git tag that changes tags'),
    ('git tag --file f x', ORDINARY, 'git tag that changes tags'),
    ('git tag --edit x', ORDINARY, 'git tag that changes tags'),
    ('git tag x', ORDINARY, 'git tag NAME creates a tag'),
    ('git tag -l x', SAFE, None),
    ('git remote add origin u', ORDINARY, 'git remote add'),
    ('git remote prune origin', ORDINARY, 'git remote prune'),
    ('git remote get-url origin', SAFE, None),
    ('git config user.name x', ORDINARY, 'git config that sets values'),
    ('git config --unset user.name', ORDINARY, 'git config that sets values'),
    ('git config --get user.name', SAFE, None),
    ('git reflog', SAFE, None),
    ('git worktree add wt', ORDINARY, 'git worktree that changes worktrees'),
    ('git worktree list', SAFE, None),
    ('git notes add', ORDINARY, 'git notes that changes notes'),
    ('git notes list', SAFE, None),
    ('git submodule update', ORDINARY, 'git submodule that changes submodules'),
    ('git submodule status', SAFE, None),
    ('git symbolic-ref HEAD refs/heads/x', ORDINARY, 'git symbolic-ref that sets a ref'),
    ('git symbolic-ref -d HEAD', ORDINARY, 'git symbolic-ref that sets a ref'),
    ('git symbolic-ref HEAD', SAFE, None),
    ('git stash push', ORDINARY, 'git stash that changes stashes'),
    # date --file reads dates from a file (not an operand that sets the clock).
    ('date --file f', ORDINARY, 'date --file'),
    ('date -d tomorrow', SAFE, None),
    ('find . -L', ORDINARY, 'find -L'),
    # What a pattern matches: through a link or onto a device is outside; a pattern that starts
    # with a dash may become options (an option word's pattern too: --include=*.py).
    ('cat zer*', ORDINARY, 'reads outside the workspace (ROOT/zero)'),
    ('cat -*', ORDINARY, 'the pattern -* expands to options'),
    ('grep --include=*.py x src', ORDINARY, 'the pattern --include=*.py expands to options'),
    # grep's pattern is no file, whether first or after -e; -f's value is (the patterns' file).
    ('grep lin* src/app.py', SAFE, None),
    ('grep -e a -e lin*/passwd src/app.py', SAFE, None),
    ('grep -f lin*/passwd src/app.py', ORDINARY, 'reads outside the workspace (ROOT/link/passwd)'),
    ('grep -e a lin*/passwd', ORDINARY, 'reads outside the workspace (ROOT/link/passwd)'),
    # getopt permutes: an -e after the operands still makes every operand a file (it read
    # lin*/passwd as the pattern, unchecked).
    ('grep lin*/passwd -e a', ORDINARY, 'reads outside the workspace (ROOT/link/passwd)'),
    ('grep lin*/passwd src/app.py', SAFE, None),  # (the first operand is the pattern)
    # env -u's name, and where cd, pushd, popd or dirs go, are no files read.
    ('env -u lin*', SAFE, None),
    ('cd lin* > out.txt', SAFE, None),
    ('pushd lin* > out.txt', SAFE, None),
    ('popd lin* > out.txt', SAFE, None),
    ('dirs lin* > out.txt', SAFE, None),
]


@pytest.mark.parametrize("row", UNSAFE_CASES, ids=[r[0] for r in UNSAFE_CASES])
def test_what_the_read_only_check_says(root: Path, tmp_path: Path, row: tuple) -> None:
    cmd, level, unsafe = row
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("git", "date", "find", "cat", "grep", "env"):
        (bin_ / name).write_text("#!/bin/sh\n")
        (bin_ / name).chmod(0o755)
    os.symlink("/etc", root / "link")
    os.symlink("/dev/zero", root / "zero")
    (s,) = analyze(cmd, root, env={"PATH": str(bin_)}).steps
    assert (s.level, s.unsafe) == (level, None if unsafe is None else unsafe.replace("ROOT", str(root)))


@pytest.mark.parametrize("d", ["/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/opt/homebrew/bin"])
def test_a_listed_program_named_by_a_system_directory_is_still_read_only(root: Path, d: str) -> None:
    (s,) = analyze(f"{d}/ls src", root).steps
    assert (s.level, s.unsafe) == (SAFE, None)
    (s,) = analyze(f"{d}x/ls src", root).steps
    assert (s.level, s.unsafe) == (ORDINARY, f"{d}x/ls is not a system program")


@pytest.mark.parametrize("script, ok", [("1 p", True), ("/x/ \t p", True), ("1,3 !p", True), ("$ q", True), ("1 s", False)])
def test_sed_blanks_between_an_address_and_its_command(script: str, ok: bool) -> None:
    assert _sed_script_ok(script) is ok


@pytest.mark.parametrize("program", ['@load "readdir"; BEGIN {}', 'BEGIN { f = "x"; @f() }', '@include "lib.awk"'])
def test_gawk_s_at_forms_are_not_read_only(root: Path, program: str) -> None:
    # @load loads a compiled extension, @include reads more code, @f() calls a function named by
    # a string (system too): none is read-only.
    (s,) = analyze(f"awk '{program}' src/app.py", root).steps
    assert (s.level, s.reasons) == (UNKNOWN, ['the awk program may run commands or write files (system, |, >, getline ...)'])


def test_wrappers_past_the_limit_are_unknown_not_looked_through(root: Path) -> None:
    # Seventeen nice's hid the rm: it was judged as nice naming /, ordinary. (The counts are
    # written out: a test that read MAX_WRAPPERS would follow a changed limit.)
    assert MAX_WRAPPERS == 16
    assert _judged("nice " * 16 + "rm -rf /", root) == (DANGEROUS, RMRF, 'n')
    assert _judged("nice " * 17 + "ls", root) == (UNKNOWN, ['wrappers nested too deeply to check'], 'n')
    assert _judged("nice " * 17 + "rm -rf /", root) == (
        UNKNOWN, ['wrappers nested too deeply to check', 'names a path outside the workspace (/)'], 'n')


def test_what_fdfind_runs_per_file_is_a_step(root: Path) -> None:
    # fdfind is fd's name on Debian: its -x command is judged like fd's.
    a = analyze("fdfind . -x rm -rf /", root)
    assert [(s.program, s.via) for s in a.steps] == [("fdfind", ""), ("rm", "fdfind -x")]
    assert a.level == DANGEROUS


def test_the_wrappers_a_step_was_found_in_are_named_in_order(root: Path) -> None:
    assert [(s.program, s.via) for s in analyze("nice timeout 5 ls", root).steps] == [("ls", "nice timeout")]
    assert [(s.program, s.via) for s in analyze("nice xargs echo", root).steps] == [("echo", "nice xargs")]


FIND_CASES = [
    # Each -exec/-ok runs up to its own ; or +, the next one starts after it; an empty one runs
    # nothing. What find and fd run per file runs where they run (after cd /tmp: /tmp/x), and a
    # shell there is read like any other. fd's placeholders ({}, {/}, {//}, {.}) are computed.
    ('find . -exec \\; -exec rm -rf / \\;', DANGEROUS, RMRF, 'nn'),
    ('find . -exec ls {} + -exec rm -rf / \\;', DANGEROUS, RMRF, 'nyn'),
    ('find . -exec ls \\; -exec rm -rf / \\;', DANGEROUS, RMRF, 'nyn'),
    ('cd /tmp && find . -exec rm x \\;', DANGEROUS,
     ['runs in a directory outside the workspace (/tmp)', 'deletes outside the workspace (/tmp/x)'], 'ynn'),
    ('cd /tmp && fd . -x rm x', DANGEROUS,
     ['runs in a directory outside the workspace (/tmp)', 'rm with arguments the shell computes ({}), which may be options',
      'deletes outside the workspace (/tmp/x)', 'deletes a computed path ({})'], 'ynn'),
    ('fd . -x rm -rf {//}', DANGEROUS,
     ['recursive delete', 'forced delete', 'rm with arguments the shell computes ({//}), which may be options',
      'deletes a computed path ({//})', 'deletes a computed path ({})'], 'yy'),
    ("fd . -x sh -c 'rm -rf /'", DANGEROUS, RMRF, 'yyn'),
    ("find . -exec sh -c 'rm -rf /' \\;", DANGEROUS, RMRF, 'yyn'),
    # chattr's -v and -p take the next word (a number), which is no file.
    ('cd /etc && chattr -v 5 +i src', DANGEROUS,
     ['runs in a directory outside the workspace (/etc)', 'changes outside the workspace (/etc/src)'], 'yn'),
    ('cd /etc && chattr -p 6 +i src', DANGEROUS,
     ['runs in a directory outside the workspace (/etc)', 'changes outside the workspace (/etc/src)'], 'yn'),
]


def test_a_computed_nested_command_is_named_by_its_first_60_characters(root: Path) -> None:
    word = '"$(printf %s ' + "a" * 80 + ')"'
    (s, *_) = [s for s in analyze("bash -c " + word, root).steps if s.program == "bash"]
    assert f"bash -c runs a computed command ({word[:60]})" in s.reasons and len(word[:60]) == 60


# Every table above, one test: the command's level, every reason, and which steps may be covered.
JUDGED = [(table, row) for table, rows in (("stdin", STDIN_CASES), ("change", CHANGE_CASES), ("option", OPTION_CASES),
                                           ("find", FIND_CASES)) for row in rows]


@pytest.mark.parametrize("row", [r for _, r in JUDGED], ids=[f"{t}:{r[0].splitlines()[0]}" for t, r in JUDGED])
def test_judgement(root: Path, row: tuple) -> None:
    cmd, level, reasons, coverable = row
    assert _judged(cmd, root) == (level, reasons, coverable)
