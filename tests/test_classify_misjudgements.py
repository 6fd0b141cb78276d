"""classify: tar's modes, touch's dates, `--` before a wrapped program, declared variables, git
worktree prune.

Each test names the slip it guards against. Several of the gaps hid real misjudgements, fixed with
them: old-style tar bundles (tar cf /etc/a.tar), tar's append/update/delete modes, touch -d DATE
read as a file, nohup -- and command -- hiding the program, declared variables taken for an
environment of the declaring builtin, git worktree prune -f called dangerous."""

from __future__ import annotations

from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, analyze
from ds4agent.tools.classify.texttools import _sed_safe, _sed_script_ok
from ds4agent.tools.shellparse import Word


def judged(cmd: str, root: Path) -> tuple[int, list[str]]:
    a = analyze(cmd, root)
    return a.level, a.reasons()


# -- functions, declarations, wrappers --------------------------------------------------------------

def test_a_function_that_calls_itself_among_other_commands_is_a_fork_bomb(root: Path) -> None:
    # Any call of itself in the body counts, not only a body made of nothing else.
    assert judged("f() { echo hi; f; }; f", root) == (DANGEROUS, ["function f calls itself (a fork bomb)"])
    assert judged("f() { echo hi; g; }; f", root)[0] < DANGEROUS


@pytest.mark.parametrize("cmd, taints", [
    ("declare -x ZZ=a; ls", True),     # -x alone exports
    ("declare -r -x ZZ=a; ls", True),  # ... and among other flags (not only when every flag has x)
    ("declare -rx ZZ=a; ls", True),
    ("declare -r ZZ=a; ls", False),    # not exported: the programs after it do not see ZZ
    ("local ZZ=a; ls", False),
])
def test_declare_exports_with_x_anywhere_in_its_flags(root: Path, cmd: str, taints: bool) -> None:
    level, reasons = judged(cmd, root)
    taint = "sets ZZ, which changes what the programs after it are or read"
    assert (taint in reasons) is taints
    assert level == (UNKNOWN if taints else SAFE)


@pytest.mark.parametrize("cmd", ["export ZZ=a", "local ZZ=a", "readonly ZZ=1", "declare -r ZZ=a", "typeset ZZ=$1"])
def test_declared_variables_are_not_an_environment_for_the_builtin(root: Path, cmd: str) -> None:
    # `local x=$1` declares x; it is not `x=$1 local` (a variable handed to a program). The
    # step used to say "sets ZZ for local, which may change what it runs or reads".
    level, reasons = judged(cmd, root)
    assert not any(" for " in r and r.startswith("sets ") for r in reasons), reasons
    if not cmd.startswith("export"):
        assert level == SAFE


@pytest.mark.parametrize("cmd, program", [
    ("nohup -- rm -rf /", "rm"),        # GNU nohup ends its (no) options at --
    ("command -- rm -rf /", "rm"),      # bash's builtins too
    ("command -p -- rm -rf /", "rm"),
    ("builtin -- echo hi", "echo"),
    ("nohup -n rm -rf /", "-n"),        # nohup has no options: -n is nohup's error, rm never runs
    ("timeout 5 -- rm -rf /", "--"),    # after the duration, -- is the program (timeout fails)
    ("flock f -- rm -rf /", "--"),
])
def test_double_dash_after_a_wrapper(root: Path, cmd: str, program: str) -> None:
    a = analyze(cmd, root)
    assert [s.program for s in a.steps] == [program]
    if program == "rm":
        assert a.level == DANGEROUS and "recursive delete" in a.reasons()


# -- programs' own rules ------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["truncate -s $N out.txt", "truncate --size $N out.txt", "truncate -r $R out.txt",
                                 "touch -d $D out.txt", "touch -t $T out.txt", "touch --date $D out.txt",
                                 "mkdir -m $M d", "mkfifo -m $M p", "mknod -m $M p p 1 2", "shred -n $N -u out.txt",
                                 "shred -s $N out.txt"])
def test_option_values_of_file_makers_are_not_files(root: Path, cmd: str) -> None:
    # The computed value belongs to an option (size, date, mode): only the operand is written.
    level, reasons = judged(cmd, root)
    assert not any("computed path" in r for r in reasons), reasons
    assert level in (ORDINARY, DANGEROUS)  # shred is dangerous for what it is, not for $N


@pytest.mark.parametrize("cmd", ["touch -d $D out.txt", "touch -r $R /etc/x", "truncate -s 0 /etc/x"])
def test_the_operand_of_a_file_maker_is_still_judged(root: Path, cmd: str) -> None:
    level, reasons = judged(cmd, root)
    if "/etc/x" in cmd:
        assert level == DANGEROUS and "writes outside the workspace (/etc/x)" in reasons
    else:
        assert level == ORDINARY


@pytest.mark.parametrize("word", ["0", "6", "1", "s", "S"])
def test_init_runlevels_that_stop_the_machine(root: Path, word: str) -> None:
    assert judged(f"init {word}", root) == (DANGEROUS, ["init: stops the machine"])
    assert judged("init 3", root)[0] == ORDINARY


@pytest.mark.parametrize("cmd", ["tar --use-compress-program=gzip -cf a.tar src", "tar --use-compress gzip -cf a.tar src",
                                 "tar -I gzip -cf a.tar src", "tar cIf gzip a.tar src", "tar --to-command=sh -xf a.tar",
                                 "tar --checkpoint-action=exec=sh -cf a.tar src", "tar --info-script=x -cf a.tar src",
                                 "tar --new-volume-script=x -cf a.tar src", "tar --rsh-command=x -cf h:a.tar src"])
def test_tar_options_that_run_a_program(root: Path, cmd: str) -> None:
    assert judged(cmd, root) == (UNKNOWN, ["tar runs a program given in its options"])


@pytest.mark.parametrize("cmd", [
    "tar --extract -f a.tar -C /etc", "tar --get -f a.tar -C /etc", "tar -x -f a.tar -C /etc", "tar xf a.tar -C /etc",
    "tar xfC a.tar /etc",  # old style: C takes the word after f's
    "tar -x -f a.tar --directory /etc", "tar -x -f a.tar --directory=/etc", "tar -x -f a.tar --dir=/etc",
])
def test_tar_extracts_into_a_directory(root: Path, cmd: str) -> None:
    level, reasons = judged(cmd, root)
    assert level == DANGEROUS and "extracts into outside the workspace (/etc)" in reasons


@pytest.mark.parametrize("cmd", [
    "tar -cf /etc/a.tar src", "tar cf /etc/a.tar src", "tar czf /etc/a.tar src", "tar cbf 20 /etc/a.tar src",
    "tar -rf /etc/a.tar src", "tar rf /etc/a.tar src", "tar uf /etc/a.tar src", "tar -f /etc/a.tar -u src",
    "tar -A -f /etc/a.tar b.tar", "tar --append -f /etc/a.tar src", "tar --update -f /etc/a.tar src",
    "tar --catenate -f /etc/a.tar b.tar", "tar --concatenate -f /etc/a.tar b.tar", "tar --delete -f /etc/a.tar x",
    "tar --create --file=/etc/a.tar src",
])
def test_tar_modes_that_write_the_archive(root: Path, cmd: str) -> None:
    level, reasons = judged(cmd, root)
    assert level == DANGEROUS and "writes outside the workspace (/etc/a.tar)" in reasons


@pytest.mark.parametrize("cmd", ["tar tf /etc/a.tar", "tar -tvf /etc/a.tar", "tar --list -f /etc/a.tar",
                                 # long names are not letter bundles: --compare has c and r, but only reads
                                 "tar --compare -f /etc/a.tar", "tar --diff --recursion -f /etc/a.tar",
                                 # -X names a file of exclusions (read), not a mode
                                 "tar -t -X excl -f /etc/a.tar", "tar tXf excl /etc/a.tar",
                                 # in a dashed bundle a value letter takes the rest of the word:
                                 # -xCf extracts into the directory "f" (and /etc is a member name)
                                 ])
def test_tar_listing_only_reads_the_archive(root: Path, cmd: str) -> None:
    level, reasons = judged(cmd, root)
    assert (level, reasons) == (ORDINARY, ["names a path outside the workspace (/etc/a.tar)"])


@pytest.mark.parametrize("prog", ["ssh-keygen", "ssh-add", "security", "gpg", "gpg2", "keyctl", "pass", "op"])
def test_secret_stores(root: Path, prog: str) -> None:
    a = analyze(f"{prog} read x", root)
    assert (a.level, a.reasons()) == (ORDINARY, [f"{prog} touches keys or secrets"])
    assert not a.steps[0].coverable


# -- git -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["git checkout .", "git checkout '*'", "git checkout :/", "git checkout -- '*'"])
def test_git_checkout_of_every_path_discards_changes(root: Path, cmd: str) -> None:
    assert judged(cmd, root) == (DANGEROUS, ["discards uncommitted changes (git checkout of paths)"])


@pytest.mark.parametrize("cmd, level", [
    ("git worktree remove -f x", DANGEROUS), ("git worktree remove --force x", DANGEROUS),
    ("git worktree remove x", ORDINARY),
    # prune only forgets worktrees whose directories are gone; it has no -f (git refuses it)
    ("git worktree prune", ORDINARY), ("git worktree prune -f", ORDINARY),
    ("git submodule deinit -f x", DANGEROUS), ("git submodule deinit --force x", DANGEROUS),
    ("git submodule deinit --all", DANGEROUS), ("git submodule deinit x", ORDINARY),
])
def test_git_worktree_and_submodule_removal(root: Path, cmd: str, level: int) -> None:
    assert judged(cmd, root)[0] == level


@pytest.mark.parametrize("cmd, level", [
    ("git notes show HEAD", SAFE), ("git notes list", SAFE), ("git notes", SAFE),
    ("git notes add -m x", ORDINARY), ("git notes remove HEAD", ORDINARY),
    # -c with a benign setting, then an empty last argument: the setting is what is checked
    ('git -c color.ui=never log ""', SAFE), ("git -c color.ui=never log", SAFE),
    ("git -c core.pager=sh log", UNKNOWN),  # the pager is a program
])
def test_git_read_only_forms(root: Path, cmd: str, level: int) -> None:
    assert judged(cmd, root)[0] == level


# -- paths ---------------------------------------------------------------------------------------------

def test_bash_network_redirections_are_named_as_such(root: Path) -> None:
    for dev in ("/dev/tcp/example.org/80", "/dev/udp/10.0.0.1/53"):
        assert judged(f"echo hi > {dev}", root) == (DANGEROUS, [f"opens a network connection through bash ({dev})"])
    assert judged("echo hi > /dev/sda", root) == (DANGEROUS, ["writes a device (/dev/sda)"])


def test_a_computed_operand_does_not_hide_the_ones_after_it(root: Path) -> None:
    assert judged("ls $X /etc", root) == (ORDINARY, ["names a path outside the workspace (/etc)"])
    assert judged("ls -l /etc", root) == (ORDINARY, ["names a path outside the workspace (/etc)"])


# -- echo | sh ---------------------------------------------------------------------------------------

def test_echo_into_a_shell_with_a_computed_word_is_not_read_as_code(root: Path) -> None:
    # Every word of the echo must be static, not only one of them.
    why = "sh runs text from a pipe as code (decoded or computed text is not checked)"
    assert judged("echo rm -rf $x | sh", root) == (UNKNOWN, [why])
    assert judged("echo $x | sh", root) == (UNKNOWN, [why])
    assert judged("echo rm -rf x | sh", root) == (DANGEROUS, ["recursive delete", "forced delete"])


def test_printf_into_a_shell_is_read_when_it_is_one_plain_format(root: Path) -> None:
    assert judged("printf 'rm -rf x' | sh", root) == (DANGEROUS, ["recursive delete", "forced delete"])
    assert judged("printf 'ls' | sh", root)[0] == ORDINARY
    why = "sh runs text from a pipe as code (decoded or computed text is not checked)"
    for fmt in ("'rm %s' x", "'rm\\tx'", "'rm' 'x'"):  # a format, an escape, two arguments: not plain
        assert judged(f"printf {fmt} | sh", root) == (UNKNOWN, [why]), fmt


# -- sed -------------------------------------------------------------------------------------------------

def w(*vals: str) -> list[Word]:
    return [Word(v, v) for v in vals]


def test_sed_safe_reasons() -> None:
    assert _sed_safe(w()) == "sed without a script"
    assert _sed_safe(w("-n")) == "sed without a script"
    assert _sed_safe(w("-n", "p", "f")) is None
    assert _sed_safe(w("-e", "p")) is None
    assert _sed_safe(w("-i", "p", "f")) == "sed -i edits files in place"
    assert _sed_safe(w("-ni.bak", "p", "f")) == "sed -i edits files in place"
    assert _sed_safe(w("--in-place=.bak", "p", "f")) == "sed -i edits files in place"
    # -l, -e, -f take a value, as getopt reads it (`-l -i` is a line length of "-i", not -i);
    # the script is program_rules' to judge
    assert _sed_safe(w("-l", "-i", "p", "f")) is None
    assert _sed_safe(w("--line-length", "-i", "p", "f")) is None
    assert _sed_safe(w("-e", "-i", "f")) is None
    assert _sed_safe(w("--expression", "-i", "f")) is None
    assert _sed_safe(w("-f", "-i", "f")) is None
    assert _sed_safe(w("--file", "-i", "f")) is None
    assert _sed_safe(w("--expression", "p")) is None
    assert _sed_safe(w("w out")) is None


def test_sed_without_a_script_is_not_read_only(root: Path) -> None:
    assert judged("sed", root)[0] == ORDINARY
    assert judged("sed -n", root)[0] == ORDINARY


@pytest.mark.parametrize("script, ok", [
    ("p;", True), ("p;\n", True), ("p ;", True), (";p", True), (";;p", True),
    # one separator before a w: skipping two characters would swallow the w
    (";w /etc/x", False), ("; w out", False), ("\nw out", False),
    # a regex that never closes: the end of the text is not a delimiter
    ("s/abc", False), ("/abc", False), ("/abc/p", True), ("s/a/b", False), ("s/a/b/", True),
    ("y/ab/cd", False), ("y/ab/cd/", True), ("y/a\\/b/c\\/d/", True), ("s/a/b\\/c/g", True),
    ("s/a/b/w out", False), ("s/[/]/x/;w out", False), ("s/a/b/;p", True),
    # a separator then w: skipping two characters would read `wp` (write to file p) as `p`
    (";wp", False), ("\nwp", False),
    # an address with no command after it (the check must not read past the end)
    ("1", False), ("/x/", False), ("1!", False), ("$", False), ("1,3", False),
    # s or y as the last character
    ("s", False), ("y", False), ("1s", False),
    # y's lists start right after the delimiter: empty lists are two delimiters
    ("y///", True), ("y//", False),
    # an escaped delimiter second to last leaves the replacement open
    ("s/a/b\\/", False), ("y/a/b\\/", False), ("s/a/b\\", False),
])
def test_sed_script_subset(script: str, ok: bool) -> None:
    assert _sed_script_ok(script) is ok


@pytest.mark.parametrize("prog", ["rmdir", "unlink", "tee", "touch", "truncate -s 0", "mkdir", "mkfifo", "mknod",
                                  "shred"])
def test_each_file_maker_writes_its_operand(root: Path, prog: str) -> None:
    level, reasons = judged(f"{prog} /etc/x", root)
    assert level == DANGEROUS and "writes outside the workspace (/etc/x)" in reasons


@pytest.mark.parametrize("cmd", ["touch --date $V out.txt", "touch --reference $V out.txt", "touch --time $V out.txt",
                                 "touch -r $V out.txt", "truncate --size $V out.txt", "truncate --reference $V out.txt",
                                 "truncate -r $V out.txt", "mkdir --mode $V d", "mkfifo --mode $V p",
                                 "mknod --mode $V p p 1 2", "mknod -m $V p p 1 2", "shred --iterations $V out.txt",
                                 "shred --size $V out.txt", "shred --random-source $V out.txt"])
def test_each_value_option_of_a_file_maker_takes_the_next_word(root: Path, cmd: str) -> None:
    # Read as a flag, the option would leave $V as an operand: "writes a computed path ($V)".
    assert not any("computed path" in r for r in judged(cmd, root)[1])


def test_a_dashed_bundle_gives_a_value_letter_the_rest_of_the_word(root: Path) -> None:
    # tar -xCf /etc a.tar: -C takes "f" (GNU getopt), so /etc is a member to extract, not the
    # directory; only old-style bundles without a dash hand values out word by word.
    reasons = judged("tar -xCf /etc a.tar", root)[1]
    assert not any(r.startswith("extracts into") for r in reasons), reasons
    assert judged("tar xCf /etc a.tar", root)[0] == DANGEROUS


def test_what_the_parser_fixes_change_in_the_judgement(root: Path) -> None:
    # A backquoted command in a heredoc was invisible (level SAFE); a cd in a test's $(...)
    # moved the next write to /tmp (where .git/hooks is not this repository's).
    assert judged("cat <<EOF\n`rm -rf x`\nEOF", root) == (
        UNKNOWN, ["a heredoc runs a command substitution the checker cannot follow"])
    assert judged("[[ $(cd /tmp) ]]; echo x > .git/hooks/pre-commit", root) == (
        DANGEROUS, ["writes inside .git (.git/hooks/pre-commit)"])
