"""classify's program tables, entry by entry : _SYSTEM,
SAFE_PROGRAMS (names and their risky options), _NOT_PAGERS, _ANY_ARGS, _INERT, _VERSION_ONLY,
NULL_DEVICES and _IGNORABLE. Every name is written out here, never read from the module: a
mutant renames an entry in the table, and a test that iterated the table would follow it.

Each test loops over an explicit list, collects the commands whose verdict differs and
asserts that none does, so one failure shows every entry that broke."""

from __future__ import annotations

from pathlib import Path

import pytest
from classify_fixtures import _no_temp_dirs, root  # noqa: F401 (fixtures: temp_dirs emptied, a git workspace)

import ds4agent.tools.classify as classify
from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, UNKNOWN, Places, analyze, tables
from ds4agent.tools.classify.places import is_git_name

# Programs looked up on PATH by the read-only rules: installed as stubs outside the workspace,
# so that a verdict never depends on what this machine has (sw_vers, md5, fdfind ...).
_INSTALLED = [
    "ls", "cat", "head", "tail", "wc", "cut", "nl", "tac", "rev", "paste", "join", "comm", "cmp", "diff", "stat",
    "du", "df", "grep", "egrep", "fgrep", "rg", "basename", "dirname", "realpath", "readlink", "which", "id",
    "whoami", "uname", "md5sum", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum", "cksum",
    "shasum", "md5", "strings", "od", "hexdump", "seq", "sleep", "expr", "column", "fold", "fmt", "expand",
    "unexpand", "nproc", "printenv", "locale", "tr", "file", "jq", "sort", "uniq", "tree", "find", "fd", "fdfind",
    "xxd", "base64", "date", "hostname", "env", "sed", "awk", "gawk", "mawk", "nawk", "git", "tty", "getconf", "ps",
    "free", "uptime", "lsb_release", "sw_vers", "groups", "less", "more", "xargs",
    # version queries
    "python", "python3", "node", "npm", "npx", "pnpm", "yarn", "bun", "deno", "cargo", "rustc", "rustup", "go",
    "gcc", "g++", "clang", "clang++", "cc", "c++", "make", "cmake", "pip", "pip3", "uv", "java", "javac", "ruby",
    "gem", "perl", "php", "docker", "kubectl", "swift", "dotnet", "ld", "gdb", "lldb", "poetry", "tsc", "ruff",
    "black", "mypy", "pytest", "bash", "zsh", "sh",
]


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    d = tmp_path / "bin"
    d.mkdir()
    for name in _INSTALLED:
        p = d / name
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    return {"PATH": str(d)}


def _mismatches(root: Path, env: dict[str, str], expected: dict[str, int]) -> list[tuple[str, str]]:
    out = []
    for cmd, level in expected.items():
        got = analyze(cmd, root, env=env).level
        if got != level:
            out.append((cmd, classify.LEVELS[got]))
    return out


# -- _SYSTEM: programs dangerous by name ----------------------------------------------------------

_SYSTEM_WHY = {
    "writes to disks": ["mkfs", "mke2fs", "mkswap", "fdisk", "sfdisk", "cfdisk", "gdisk", "sgdisk", "parted",
                        "wipefs", "blkdiscard", "hdparm", "losetup", "cryptsetup", "newfs", "diskutil", "format",
                        "mkdosfs", "badblocks", "zpool", "zfs", "lvremove", "vgremove", "pvremove", "dmsetup", "nvme"],
    "changes mounts or the root directory": ["mount", "umount", "swapon", "swapoff", "chroot", "pivot_root"],
    "stops the machine": ["shutdown", "reboot", "halt", "poweroff", "telinit", "kexec", "pmset"],
    "kills processes broadly": ["killall", "pkill", "xkill", "killall5", "skill", "slay", "fuser"],
    "runs as another user": ["sudo", "doas", "su", "pkexec", "run0", "sudoedit", "runuser", "ksu", "calife"],
    "changes scheduled jobs": ["crontab", "at", "batch", "atrm"],
    "changes user accounts": ["passwd", "chpasswd", "useradd", "userdel", "usermod", "groupadd", "groupdel",
                              "groupmod", "adduser", "deluser", "visudo", "vipw", "dscl", "chsh", "chfn"],
    "changes the kernel or the boot setup": ["insmod", "rmmod", "modprobe", "kextload", "kextunload", "csrutil",
                                             "nvram", "bless", "efibootmgr", "grub-install", "update-grub"],
    "changes the firewall": ["iptables", "ip6tables", "nft", "ufw", "pfctl", "firewall-cmd"],
    "destroys file contents": ["shred", "srm", "wipe"],
}


def test_system_programs_are_dangerous_by_name(root: Path) -> None:
    # Run bare: whatever its operands, each is dangerous, and the reason names the program and
    # what it does (the reason is what the user reads when asked).
    bad = []
    for why, progs in _SYSTEM_WHY.items():
        for prog in progs:
            a = analyze(prog, root)
            got = (a.level, a.reasons())
            if got != (DANGEROUS, [f"{prog}: {why}"]):
                bad.append((prog, got))
    assert bad == []


def test_system_families_by_their_stem(root: Path) -> None:
    # mkfs.ext4, mkfs.vfat ...: the family before the first dot or underscore decides. For
    # sudo and the like the table is all that catches a renamed copy (sudo.ws is Debian's
    # original sudo beside sudo-rs): the wrapper rule knows only the plain names.
    user = "runs as another user"
    for prog, why in [("mkfs.ext4", "writes to disks"), ("mkfs.vfat", "writes to disks"),
                      ("mount.nfs", "changes mounts or the root directory"), ("sudo.ws", user), ("doas.real", user),
                      ("su.real", user), ("pkexec.real", user), ("run0.real", user), ("runuser.real", user)]:
        a = analyze(prog, root)
        assert (a.level, a.reasons()) == (DANGEROUS, [f"{prog}: {why}"])


def test_crontab_list_is_not_dangerous(root: Path) -> None:
    assert analyze("crontab -l", root).level == ORDINARY
    assert analyze("crontab -e", root).level == DANGEROUS


# -- SAFE_PROGRAMS: the read-only list --------------------------------------------------------------

# One read-only use of each program that is not inert: safe (it may run without asking).
_READ_ONLY_USE = {
    "ls": "ls src", "cat": "cat src/app.py", "head": "head src/app.py", "tail": "tail src/app.py",
    "wc": "wc -l src/app.py", "cut": "cut -c1 src/app.py", "nl": "nl src/app.py", "tac": "tac src/app.py",
    "rev": "rev src/app.py", "paste": "paste src/app.py", "join": "join src/app.py src/app.py",
    "comm": "comm src/app.py src/app.py", "cmp": "cmp src/app.py src/app.py", "diff": "diff src/app.py src/app.py",
    "stat": "stat src/app.py", "du": "du src", "df": "df", "grep": "grep x src/app.py", "egrep": "egrep x src/app.py",
    "fgrep": "fgrep x src/app.py", "rg": "rg x src", "basename": "basename src/app.py", "dirname": "dirname src/app.py",
    "realpath": "realpath src/app.py", "readlink": "readlink src/app.py", "which": "which ls", "id": "id",
    "whoami": "whoami", "uname": "uname -a", "md5sum": "md5sum src/app.py", "sha1sum": "sha1sum src/app.py",
    "sha224sum": "sha224sum src/app.py", "sha256sum": "sha256sum src/app.py", "sha384sum": "sha384sum src/app.py",
    "sha512sum": "sha512sum src/app.py", "b2sum": "b2sum src/app.py", "cksum": "cksum src/app.py",
    "shasum": "shasum src/app.py", "md5": "md5 src/app.py", "strings": "strings src/app.py", "od": "od src/app.py",
    "hexdump": "hexdump src/app.py", "seq": "seq 3", "sleep": "sleep 1", "expr": "expr 1 + 1",
    "column": "column src/app.py", "fold": "fold src/app.py", "fmt": "fmt src/app.py", "expand": "expand src/app.py",
    "unexpand": "unexpand src/app.py", "nproc": "nproc", "printenv": "printenv HOME", "locale": "locale",
    "tr": "tr a b < src/app.py", "file": "file src/app.py", "jq": "jq . src/app.py", "sort": "sort src/app.py",
    "uniq": "uniq src/app.py", "tree": "tree src", "find": "find src -name '*.py'", "fd": "fd app src",
    "fdfind": "fdfind app src", "xxd": "xxd src/app.py", "base64": "base64 src/app.py", "date": "date +%s",
    "hostname": "hostname", "env": "env", "type": "type ls", "sed": "sed -n 1p src/app.py",
    "awk": "awk '{print $1}' src/app.py", "gawk": "gawk '{print $1}' src/app.py", "mawk": "mawk '{print $1}' src/app.py",
    "nawk": "nawk '{print $1}' src/app.py", "git": "git status", "tty": "tty", "getconf": "getconf PAGESIZE",
    "ps": "ps", "free": "free", "uptime": "uptime", "lsb_release": "lsb_release -a", "sw_vers": "sw_vers",
    "groups": "groups",
}
# The inert ones (cd, echo ...) are safe anyway when the shell runs them; run by find -exec they
# are not inert, and the read-only list decides.
_BY_FIND = ["cd", "pushd", "popd", "dirs", "pwd", "echo", "printf", "true", "false", ":", "test", "["]


def test_read_only_programs_are_safe(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, {cmd: SAFE for cmd in _READ_ONLY_USE.values()}) == []


def test_read_only_builtins_run_by_find_are_safe(root: Path, env: dict[str, str]) -> None:
    bad = []
    for prog in _BY_FIND:
        q = f"'{prog}'" if prog == "[" else prog  # an unquoted [ is a pattern
        a = analyze(f"find src -exec {q} \\;", root, env=env)
        got = [(s.program, s.level, s.via) for s in a.steps]
        if got != [("find", ORDINARY, ""), (prog, SAFE, "find -exec")]:
            bad.append((prog, got))
    assert bad == []


def test_a_read_only_program_may_read_git_files(root: Path, env: dict[str, str]) -> None:
    # Programs on the list read .git (a pager asks, but for being interactive, not for .git);
    # any other program given a path inside .git is unknown.
    expected = {"cat .git/config": SAFE, "pwd .git": SAFE, "dirs .git": SAFE, "less .git/config": ORDINARY,
                "more .git/config": ORDINARY, "wait .git": UNKNOWN}
    assert _mismatches(root, env, expected) == []


def test_pagers_ask(root: Path, env: dict[str, str]) -> None:
    # _NOT_PAGERS: less and more are interactive (they can run a shell: `!cmd`, `v` for an editor).
    assert _mismatches(root, env, {"less src/app.py": ORDINARY, "more src/app.py": ORDINARY}) == []


# Short options: each listed letter makes the program write, run programs or follow links out.
_RISKY = [
    "ls -L src", "ls --dereference src", "stat -L src/app.py", "stat --dereference src/app.py", "du -L src",
    "du --dereference src", "du --files0-from=src/app.py", "wc --files0-from=src/app.py",
    "diff --to-file=src/app.py src/app.py", "diff --from-file=src/app.py src/app.py", "grep -R x src",
    "grep --dereference-recursive x src", "egrep -R x src", "egrep --dereference-recursive x src", "fgrep -R x src",
    "fgrep --dereference-recursive x src", "rg -L x src", "rg --pre=cat x src", "rg --follow x src",
    "rg --search-zip x src", "file -C", "file -m src/app.py src/app.py", "file --compile",
    "file --magic-file=src/app.py src/app.py", "jq --rawfile a src/app.py . src/app.py",
    "jq --slurpfile a src/app.py . src/app.py", "sort -o out src/app.py", "sort -T src src/app.py",
    "sort --output=out src/app.py", "sort --compress-program=gzip src/app.py",
    "sort --temporary-directory=src src/app.py", "sort --files0-from=src/app.py", "tree -o out src", "tree -R src",
    "tree -l src", "tree -H x src", "tree --fromfile src/app.py", "tree --output=out src", "fd -x cat app src",
    "fd -X cat app src", "fd -L app src", "fd --exec=cat app src", "fd --exec-batch=cat app src",
    "fd --follow app src", "fdfind -x cat app src", "fdfind -X cat app src", "fdfind -L app src",
    "fdfind --exec=cat app src", "fdfind --exec-batch=cat app src", "fdfind --follow app src",
    "base64 -o out src/app.py", "base64 --output=out src/app.py", "date -f src/app.py", "date --set=12:00",
    "date --file=src/app.py", "hostname -F src/app.py", "hostname -b", "hostname --file=src/app.py",
    "hostname --boot",
]


def test_risky_options_ask(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, {cmd: ORDINARY for cmd in _RISKY}) == []


def test_risky_long_options_match_abbreviated(root: Path, env: dict[str, str]) -> None:
    expected = {"ls --deref src": ORDINARY, "sort --out=x src/app.py": ORDINARY, "rg --foll x src": ORDINARY}
    assert _mismatches(root, env, expected) == []


# An option letter the program's list does not name (-X: ls sorts by extension, tree writes XML
# to the terminal, find -X (BSD) warns about names; for most it is an error) leaves the program
# read-only: the list names the risky letters, not the harmless ones.
_OTHER_LETTER = [
    "ls -X src", "cat -X src/app.py", "head -X src/app.py", "tail -X src/app.py", "wc -X src/app.py",
    "cut -X src/app.py", "nl -X src/app.py", "tac -X src/app.py", "rev -X src/app.py", "paste -X src/app.py",
    "join -X src/app.py src/app.py", "comm -X src/app.py src/app.py", "cmp -X src/app.py src/app.py",
    "diff -X src/app.py src/app.py", "stat -X src/app.py", "du -X src/app.py src", "df -X", "grep -X x src/app.py",
    "egrep -X x src/app.py", "fgrep -X x src/app.py", "rg -X x src", "basename -X src/app.py",
    "dirname -X src/app.py", "realpath -X src/app.py", "readlink -X src/app.py", "which -X ls", "id -X",
    "whoami -X", "uname -X", "md5sum -X src/app.py", "sha1sum -X src/app.py", "sha224sum -X src/app.py",
    "sha256sum -X src/app.py", "sha384sum -X src/app.py", "sha512sum -X src/app.py", "b2sum -X src/app.py",
    "cksum -X src/app.py", "shasum -X src/app.py", "md5 -X src/app.py", "strings -X src/app.py", "od -X src/app.py",
    "hexdump -X src/app.py", "seq -X 3", "sleep -X 1", "expr -X", "column -X src/app.py", "fold -X src/app.py",
    "fmt -X src/app.py", "expand -X src/app.py", "unexpand -X src/app.py", "nproc -X", "printenv -X",
    "locale -X", "tr -X a b", "file -X src/app.py", "jq -X . src/app.py", "sort -X src/app.py",
    "uniq -X src/app.py", "tree -X src", "find -X src", "xxd -X src/app.py", "base64 -X src/app.py",
    "date -X +%s", "hostname -X", "type -X ls", "tty -X", "getconf -X PAGESIZE", "ps -X", "free -X",
    "uptime -X", "lsb_release -X", "sw_vers -X", "groups -X",
]
_OTHER_LETTER_BY_FIND = ["pwd", "echo", "printf", "true", "false", ":", "test", "["]


def test_other_option_letters_stay_read_only(root: Path, env: dict[str, str]) -> None:
    assert _mismatches(root, env, {cmd: SAFE for cmd in _OTHER_LETTER}) == []
    bad = []
    for prog in _OTHER_LETTER_BY_FIND:
        q = f"'{prog}'" if prog == "[" else prog
        a = analyze(f"find src -exec {q} -X \\;", root, env=env)
        if a.steps[1].level != SAFE:
            bad.append(prog)
    assert bad == []


# -- _ANY_ARGS: operands that are strings, not paths ----------------------------------------------

_ANY_ARGS_PROGS = ["echo", "printf", "true", "false", ":", "test", "[", "expr", "seq", "sleep", "basename", "dirname"]


def test_any_operand_is_fine_for_string_programs(root: Path, env: dict[str, str]) -> None:
    # An operand outside the workspace is a string to these (basename /etc/passwd reads
    # nothing), and so is one the shell computes: xargs' arguments from standard input.
    bad = []
    for prog in _ANY_ARGS_PROGS:
        q = f"'{prog}'" if prog == "[" else prog
        a = analyze(f"{q} /etc/passwd", root, env=env)
        if [(s.program, s.level, s.coverable) for s in a.steps] != [(prog, SAFE, True)]:
            bad.append(("operand", prog, _summary(a)))
        a = analyze(f"xargs {q}", root, env=env)
        if [(s.program, s.level, s.via) for s in a.steps] != [(prog, SAFE, "xargs")]:
            bad.append(("xargs", prog, _summary(a)))
    assert bad == []


def test_a_path_program_with_computed_or_outside_operands_asks(root: Path, env: dict[str, str]) -> None:
    # The contrast: cat reads its operands.
    a = analyze("xargs cat", root, env=env)
    assert [(s.program, s.level) for s in a.steps] == [("cat", ORDINARY)]
    a = analyze("cat /etc/passwd", root, env=env)
    assert [(s.program, s.level, s.coverable) for s in a.steps] == [("cat", ORDINARY, False)]


def _summary(a: classify.Analysis) -> list[tuple]:
    return [(s.program, classify.LEVELS[s.level], s.reasons, s.via, s.coverable, s.inert) for s in a.steps]


# -- _INERT: never needs an approval -----------------------------------------------------------------

_INERT_USE = {
    "cd": "cd src", "pushd": "pushd src", "popd": "popd", "dirs": "dirs", "pwd": "pwd", "echo": "echo hi",
    "printf": "printf hi", "true": "true", "false": "false", ":": ":", "test": "test -n x", "[": "'[' -n x ]",
    "wait": "wait", "read": "read x", "shift": "shift", "return": "return", "exit": "exit 1", "break": "break",
    "continue": "continue", "let": "let x=1", "getopts": "getopts ab x", "jobs": "jobs", "umask": "umask 022",
}


def test_inert_builtins(root: Path, env: dict[str, str]) -> None:
    bad = []
    for prog, cmd in _INERT_USE.items():
        a = analyze(cmd, root, env=env)
        if [(s.program, s.level, s.inert) for s in a.steps] != [(prog, SAFE, True)]:
            bad.append((cmd, _summary(a)))
    assert bad == []


def test_inert_steps_leave_a_git_command_git_only(root: Path, env: dict[str, str]) -> None:
    # git_only looks past inert steps: `cd src && git add app.py` may write .git.
    assert analyze("cd src && git add app.py", root, env=env).git_only is True
    assert analyze("cat app.py && git add app.py", root, env=env).git_only is False


# -- _VERSION_ONLY: `PROG --version` is read-only -------------------------------------------------

_VERSION_QUERY = [
    "python", "python3", "node", "npm", "npx", "pnpm", "yarn", "bun", "deno", "cargo", "rustc", "rustup", "go",
    "gcc", "g++", "clang", "clang++", "cc", "c++", "make", "cmake", "pip", "pip3", "uv", "java", "javac", "ruby",
    "gem", "perl", "php", "git", "swift", "dotnet", "ld", "gdb", "lldb", "poetry", "tsc",
    "ruff", "black", "mypy", "pytest", "bash", "zsh", "sh",
]


def test_version_queries_are_safe(root: Path, env: dict[str, str]) -> None:
    # Installed outside the workspace (the stubs): `PROG --version` only prints.
    # (git's entry never decides: its own rule already makes `git --version` inert.)
    assert _mismatches(root, env, {f"{p} --version": SAFE for p in _VERSION_QUERY}) == []
    # ... and nothing else they do is read-only.
    expected = {"python x.py": ORDINARY, "make": ORDINARY, "git --version x": ORDINARY, "pytest -q": ORDINARY}
    assert _mismatches(root, env, expected) == []


def test_other_version_spellings_only_where_they_are_one(root: Path, env: dict[str, str]) -> None:
    # Slip: -v, -V or `version` taken as a version query for every tool on the list. For some it
    # runs something: pytest -v runs the tests, python -v, ruby -v and bash -v read commands,
    # cargo -v and black -v are "verbose", make builds a target named version, npx fetches and
    # runs a package, gcc compiles a file of that name, yarn and pnpm bump the project version.
    # Each spelling's programs named here, not read from the table (a renamed spelling would
    # otherwise rename what is expected with it).
    for word, progs in (("version", ["go", "cargo", "ruff", "poetry", "uv"]),
                        ("-V", ["python", "python3", "cargo", "rustc", "rustup", "deno", "pip", "pip3", "uv", "perl",
                                "rg", "fd", "jq", "mypy", "pytest", "ruff", "poetry"]),
                        ("-v", ["node", "npm", "npx", "pnpm", "yarn", "bun", "gcc", "g++", "clang", "clang++", "cc",
                                "c++", "make", "perl", "php", "tsc"])):
        assert tables._VERSION_WORDS[word] == set(progs), word
    expected = {f"{p} {word}": SAFE for word, progs in tables._VERSION_WORDS.items() for p in progs}
    assert len(expected) == 38 and {w for w in tables._VERSION_WORDS} == {"version", "-V", "-v"}
    # git's version queries: by git's own rule, not this table.
    expected |= {"git --version": SAFE, "git version": SAFE}
    for word, progs in (("-v", ["pytest", "python", "python3", "ruby", "bash", "sh", "zsh", "cargo", "black", "mypy",
                                 "java", "go", "rustc", "pip"]),
                        ("-V", ["node", "npm", "bash", "make", "gcc", "go", "black", "php"]),
                        ("version", ["make", "npx", "npm", "yarn", "pnpm", "bun", "gcc", "python", "pytest", "bash",
                                     "cmake", "java", "black", "tsc", "deno"])):
        expected |= {f"{p} {word}": ORDINARY for p in progs}
    assert _mismatches(root, env, expected) == []


def test_docker_and_kubectl_ask_even_for_their_version(root: Path, env: dict[str, str]) -> None:
    # Neither is a version query: they talk to a daemon or a cluster (`docker version` prints
    # the server's), and the service rule makes every use ask.
    for cmd in ("docker --version", "docker version", "kubectl --version"):
        (s,) = analyze(cmd, root, env=env).steps
        assert (s.level, s.coverable) == (ORDINARY, False), cmd


def test_a_version_query_of_a_missing_program_asks(root: Path, tmp_path: Path) -> None:
    assert analyze("python3 --version", root, env={"PATH": str(tmp_path / "nothing")}).level == ORDINARY


# -- NULL_DEVICES -------------------------------------------------------------------------------------

_NULL = ["/dev/null", "/dev/zero", "/dev/full", "/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/tty",
         "/dev/random", "/dev/urandom"]


def test_null_devices(root: Path, env: dict[str, str]) -> None:
    # Every sandbox mode lets a command write these: writing one is no write at all, reading
    # one reads nothing of the machine's.
    places = Places(root, (), Path("/nonexistent-home"))
    bad = [d for d in _NULL if places.where(Path(d)) != "null"]
    assert bad == []
    expected = {f"echo hi > {d}": SAFE for d in _NULL} | {f"head -c 4 {d}": SAFE for d in _NULL}
    assert _mismatches(root, env, expected) == []


def test_other_devices_are_devices(root: Path, env: dict[str, str]) -> None:
    assert Places(root, (), Path("/nonexistent-home")).where(Path("/dev/sda")) == "device"
    a = analyze("echo hi > /dev/sda", root, env=env)
    assert a.level == DANGEROUS


# -- _IGNORABLE ----------------------------------------------------------------------------------------

_HFS_IGNORED = ["\u200c", "\u200d", "\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
                "\u206a", "\u206b", "\u206c", "\u206d", "\u206e", "\u206f", "\ufeff"]


def test_hfs_ignorable_code_points_still_name_git() -> None:
    bad = [hex(ord(c)) for c in _HFS_IGNORED if not (is_git_name(f".g{c}it") and is_git_name(f"{c}.git{c}"))]
    assert bad == []
    # Only those: a letter is a letter (".gXit" is another name).
    assert [n for n in (".gXit", "X.git", ".gitX", ".g it") if is_git_name(n)] == []
