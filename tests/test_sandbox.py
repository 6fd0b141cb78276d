"""The OS sandbox: real commands in a temporary workspace. On Linux, Landlock (through the
wrapper) must stop every write outside the workspace and the temporary directory, keep the
workspace's .git read-only except for git, turn the network off on request and refuse signals
to processes outside it; the agent reports a stopped command and may run it outside once.
The macOS Seatbelt profile is generated and checked rule by rule here (and run on macOS)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from ds4agent.tools import Policy, Workspace, all_tools, run_tool
from ds4agent.tools.sandbox import (
    SANDBOX_EXEC,
    Backend,
    Confinement,
    bwrap_argv,
    denial,
    detect,
    landlock_abi,
    landlock_argv,
    seatbelt_profile,
)
from ds4agent.tools.shell import Jobs, bash

TOOLS = all_tools()
LINUX = sys.platform.startswith("linux")
ABI = landlock_abi()
BACKEND = detect()
landlock = pytest.mark.skipif(not (LINUX and ABI >= 1 and BACKEND is not None and BACKEND.name == "landlock"),
                              reason="Landlock is not available on this machine (Linux 5.13+ with Landlock enabled)")


@pytest.fixture()
def ws(tmp_path: Path, git_init) -> Workspace:
    root = tmp_path / "repo"
    root.mkdir()
    git_init(root)
    subprocess.run(["git", "config", "user.email", "t@example.com"], cwd=root, check=True)
    subprocess.run(["git", "config", "user.name", "T"], cwd=root, check=True)
    (root / "a.txt").write_text("a\n")
    (tmp_path / "outside").mkdir()
    return Workspace(root)


def _only_workspace(ws: Workspace, **kw) -> Confinement:
    """Writable: the workspace alone (the test's workspace is itself in the temporary directory)."""
    return Confinement("workspace-write", (os.path.realpath(ws.root),), (os.path.realpath(ws.root / ".git"),), **kw)


def test_linux_machines_of_this_kind_have_a_sandbox() -> None:
    """CI and development run on Linux with Landlock: the sandbox tests below must not skip
    silently there. (On other machines this documents what is missing.)"""
    if not LINUX:
        pytest.skip("not Linux")
    if ABI < 1:
        pytest.skip(f"this kernel ({os.uname().release}) has no Landlock")
    assert BACKEND is not None and BACKEND.name == "landlock", "Landlock is there but the wrapper could not use it"
    assert f"ABI {ABI}" in BACKEND.detail


@landlock
def test_a_write_outside_the_workspace_fails(ws, tmp_path) -> None:
    outside = tmp_path / "outside" / "x"
    r = bash(ws, {"command": f"echo in > inside.txt && echo out > {outside}; echo done"}, sandbox=(BACKEND, _only_workspace(ws)))
    assert (ws.root / "inside.txt").read_text() == "in\n"
    assert not outside.exists() and "Permission denied" in r.text and "done" in r.text
    # The same write through an interpreter, a subshell and a symlink: the kernel stops them all.
    os.symlink(tmp_path / "outside", ws.root / "link")
    for cmd in (f"python3 -c \"open('{outside}', 'w').write('x')\"", f"sh -c 'cp a.txt {outside}'", "cp a.txt link/y",
                f"mkdir {tmp_path}/outside/d", f"ln -s /etc/passwd {tmp_path}/outside/l", f"mv a.txt {outside}",
                f"touch {tmp_path}/outside/t", "rm -f ../outside/../repo/../outside/z; : > ../outside/z"):
        r = bash(ws, {"command": cmd}, sandbox=(BACKEND, _only_workspace(ws)))
        assert not r.ok, cmd
    assert sorted(os.listdir(tmp_path / "outside")) == [] and (ws.root / "a.txt").exists()


@landlock
def test_the_default_confinement_stops_writes_outside_the_workspace_and_temp(ws) -> None:
    """With the policy's own confinement (workspace + temporary directories): a file in the
    home directory cannot be created, even by a command the classifier cannot see through."""
    target = Path.home() / f".ds4-sandbox-test-{uuid.uuid4().hex}"
    pol = Policy("auto-edit")
    try:
        cmd = f"T={target}; eval 'echo pwned > $T'"  # computed: the classifier asks, the user says yes
        answers = iter(["yes", "no"])  # yes to run it; no to running it outside the sandbox
        r, d = run_tool(TOOLS, "bash", {"command": cmd}, ws, pol, lambda req: next(answers))
        assert d == "approved" and not target.exists()
        assert "the sandbox stopped this command" in r.text and "Permission denied" in r.text
        assert "needs the user's approval; the user declined" in r.text
    finally:
        if target.exists():
            target.unlink()


@landlock
def test_a_stopped_command_can_run_outside_the_sandbox_once(ws, tmp_path) -> None:
    target = Path.home() / f".ds4-sandbox-test-{uuid.uuid4().hex}"
    pol = Policy("auto-edit")
    asked = []

    def approve(req):
        asked.append(req)
        return "yes" if req.kind != "unsandboxed" or len(asked) < 3 else "no"

    try:
        cmd = f"python3 -c \"open('{target}', 'w').write('x')\""
        r, d = run_tool(TOOLS, "bash", {"command": cmd}, ws, pol, approve)
        assert [q.kind for q in asked] == ["unknown", "unsandboxed"]
        assert "sandbox stopped it" in asked[1].reason and asked[1].scope is None  # once, never "always"
        assert target.exists() and "run again outside the sandbox" in r.text
        target.unlink()
        # Headless: no one can approve it; the model hears why.
        r, d = run_tool(TOOLS, "bash", {"command": cmd}, ws, Policy("auto-edit"), None)
        assert d == "refused" and not target.exists()
    finally:
        if target.exists():
            target.unlink()


@landlock
def test_writes_inside_the_workspace_and_temp_work(ws, tmp_path) -> None:
    pol = Policy("auto-edit")
    tmpfile = Path(os.path.realpath(os.environ.get("TMPDIR", "/tmp"))) / f"ds4-sbx-{uuid.uuid4().hex}"
    r, d = run_tool(TOOLS, "bash", {"command": f"mkdir -p build/x && echo hi > build/x/f && echo t > {tmpfile} && cat build/x/f"},
                    ws, pol, lambda req: "yes")
    assert r.ok and "hi" in r.text and tmpfile.read_text() == "t\n"
    tmpfile.unlink()
    r = bash(ws, {"command": "cat /etc/hostname /etc/passwd >/dev/null && echo read-ok && echo x > /dev/null"},
             sandbox=(BACKEND, _only_workspace(ws)))
    assert r.ok and "read-ok" in r.text  # reads anywhere; /dev/null writable


@landlock
def test_git_is_writable_only_through_git(ws) -> None:
    if not BACKEND.namespaces:
        pytest.skip("no unprivileged user namespaces here: Landlock alone cannot keep .git read-only")
    pol = Policy("auto-edit")
    conf = pol.confinement(ws, pol.analyze("echo x > .git/hooks/pre-commit", ws))
    assert conf.protected == (os.path.realpath(ws.root / ".git"),)
    hook = ws.root / ".git" / "hooks" / "pre-commit"
    r = bash(ws, {"command": "echo 'echo hook ran' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; "
                             "python3 -c \"open('.git/config', 'a').write('[core]\\n\\thooksPath = /tmp\\n')\""},
             sandbox=(BACKEND, conf))
    assert not hook.exists() and "Read-only file system" in r.text and "hooksPath" not in (ws.root / ".git" / "config").read_text()
    # git alone (add, commit) may write .git in the sandbox; the same commit next to another program may not.
    r, d = run_tool(TOOLS, "bash", {"command": "git add a.txt && git commit -qm first && git log --oneline"}, ws, pol,
                    lambda req: "yes")
    assert r.ok and "first" in r.text, r.text
    (ws.root / "b.txt").write_text("b\n")
    r, d = run_tool(TOOLS, "bash", {"command": "touch c.txt && git add b.txt && git commit -qm second"}, ws, pol,
                    lambda req: "no" if req.kind == "unsandboxed" else "yes")
    assert not r.ok and "the sandbox stopped this command" in r.text
    assert "second" not in subprocess.run(["git", "log", "--oneline"], cwd=ws.root, capture_output=True, text=True).stdout


@landlock
def test_no_network(ws) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = server.accept()
                c.close()
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    probe = f"python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {port}), 3); print('connected')\""
    try:
        r = bash(ws, {"command": probe}, sandbox=(BACKEND, _only_workspace(ws)))
        assert r.ok and "connected" in r.text
        r = bash(ws, {"command": probe}, sandbox=(BACKEND, _only_workspace(ws, network=False)))
        assert not r.ok and "connected" not in r.text
        pol = Policy("auto-edit", network=False)
        r, d = run_tool(TOOLS, "bash", {"command": probe}, ws, pol, lambda req: "no" if req.kind == "unsandboxed" else "yes")
        assert not r.ok and "connected" not in r.text
    finally:
        stop.set()
        t.join()
        server.close()


@landlock
def test_signals_to_processes_outside_the_sandbox_are_refused(ws) -> None:
    if ABI < 6:
        pytest.skip(f"Landlock ABI {ABI} cannot scope signals (6+)")
    r = bash(ws, {"command": f"kill -0 {os.getpid()} && echo reached"}, sandbox=(BACKEND, _only_workspace(ws)))
    assert not r.ok and "reached" not in r.text
    r = bash(ws, {"command": "sleep 5 & kill $! && echo own-child"}, sandbox=(BACKEND, _only_workspace(ws)))
    assert r.ok and "own-child" in r.text  # its own processes it may signal


@landlock
def test_read_only_mode(ws) -> None:
    pol = Policy("auto-edit", sandbox="read-only")
    r, d = run_tool(TOOLS, "bash", {"command": "touch new.txt"}, ws, pol,
                    lambda req: "no" if req.kind == "unsandboxed" else "yes")
    assert not (ws.root / "new.txt").exists() and "the sandbox stopped this command" in r.text
    r, d = run_tool(TOOLS, "bash", {"command": "cat a.txt"}, ws, pol, None)
    assert d == "auto" and r.ok  # reading runs without asking
    req = pol.request(TOOLS["write"], {"path": "b.txt", "content": "x"}, ws)
    assert req is not None and "read-only" in req.reason  # file edits ask too


@landlock
def test_background_jobs_are_sandboxed(ws, tmp_path) -> None:
    import time

    jobs = Jobs()
    outside = tmp_path / "outside" / "bg"
    bash(ws, {"command": f"echo x > {outside}; echo y > inside-bg", "background": True}, jobs,
         sandbox=(BACKEND, _only_workspace(ws)))
    deadline = time.monotonic() + 10
    while not (ws.root / "inside-bg").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    jobs.stop_all()
    assert (ws.root / "inside-bg").exists() and not outside.exists()


def test_yolo_runs_without_a_sandbox_unless_one_is_chosen(ws) -> None:
    assert Policy("yolo").confinement(ws, None) is None and Policy("yolo").describe() == "full access"
    assert Policy("auto-edit", sandbox="full-access").confinement(ws, None) is None
    if BACKEND is not None:
        conf = Policy("yolo", sandbox="workspace-write").confinement(ws, None)
        assert conf is not None and os.path.realpath(ws.root) in conf.writable


def test_the_wrapper_never_runs_a_command_it_could_not_confine(tmp_path) -> None:
    from ds4agent.tools import sandbox as sb

    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, "-I", "-S", sb.WRAPPER, "--bogus", "--", "touch", str(marker)],
                       capture_output=True, text=True)
    assert r.returncode == 126 and not marker.exists() and "ds4 sandbox:" in r.stderr
    argv = landlock_argv(["bash", "-c", "x"], Confinement("workspace-write", ("/w",), ("/w/.git",), network=False))
    assert argv[1:3] == ["-I", "-S"] and argv[-4:] == ["--", "bash", "-c", "x"]
    assert argv[argv.index("--write") + 1] == "/w" and argv[argv.index("--protect") + 1] == "/w/.git" and "--no-network" in argv


@pytest.mark.parametrize("output,code,fragment", [
    ("bash: /etc/x: Permission denied\n", 1, "/etc/x"),
    ("touch: cannot touch '/root/y': Permission denied\n", 1, "/root/y"),
    ("bash: .git/hooks/pre-commit: Read-only file system\n", 1, ".git/hooks/pre-commit"),
    ("OSError: [Errno 1] Operation not permitted\n", 1, "does not allow"),
    ("ds4 sandbox: cannot confine the command (x); it was not run\n", 126, "cannot confine"),
])
def test_denials_are_explained(output, code, fragment) -> None:
    conf = Confinement("workspace-write", ("/w",), ("/w/.git",))
    why = denial(output, code, conf)
    assert fragment in why and (code == 126 or "writes only inside /w" in why)
    assert denial(output, 0, conf) == "" and denial(output, code, None) == ""
    assert denial("assert 1 == 2\n", 1, conf) == ""  # an ordinary failure is not the sandbox's
    off = Confinement("workspace-write", ("/w",), network=False)
    assert "network is off" in denial("curl: (6) Could not resolve host: x\n", 6, off)
    assert denial("curl: (6) Could not resolve host: x\n", 6, conf) == ""


# -- bubblewrap -----------------------------------------------------------------------------------

def test_bubblewrap_arguments() -> None:
    argv = bwrap_argv(["bash", "-c", "x"], Confinement("workspace-write", ("/tmp",), ("/tmp/.ds4-no-such",), network=False))
    assert argv[1:4] == ["--ro-bind", "/", "/"] and ["--bind", "/tmp", "/tmp"] == argv[argv.index("--bind"):argv.index("--bind") + 3]
    assert "--unshare-net" in argv and argv[-4:] == ["--", "bash", "-c", "x"]
    assert "/tmp/.ds4-no-such" not in argv  # a protected path that does not exist is not bound
    ro = bwrap_argv(["true"], Confinement("read-only", ("/tmp",)))
    assert "--bind" not in ro and "--unshare-net" not in ro


def test_bubblewrap_confines_writes(ws, tmp_path) -> None:
    import shutil

    if not LINUX or shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (it is only the fallback where Landlock is missing)")
    b = Backend("bubblewrap", "bubblewrap")
    probe = subprocess.run(b.wrap(["true"], _only_workspace(ws)), capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:100]}")
    outside = tmp_path / "outside" / "x"
    r = bash(ws, {"command": f"echo in > i.txt; echo out > {outside}; echo g > .git/x; echo done"},
             sandbox=(b, _only_workspace(ws)))
    assert (ws.root / "i.txt").exists() and not outside.exists() and not (ws.root / ".git" / "x").exists()
    assert "done" in r.text


# -- macOS: the Seatbelt profile ------------------------------------------------------------------

def _sexp_balanced(text: str) -> bool:
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == '"' or (c == "#" and text[i:i + 2] == '#"'):
            i += 2 if c == "#" else 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return False
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def test_seatbelt_profile_rules() -> None:
    root = '/Users/me/my "odd" (proj)'
    conf = Confinement("workspace-write", (root, "/private/tmp"), (root + "/.git",), network=True)
    profile, params = seatbelt_profile(conf)
    lines = profile.splitlines()
    assert lines[0] == "(version 1)" and _sexp_balanced(profile)
    assert dict(params) == {"WRITABLE_ROOT_0": root, "WRITABLE_ROOT_1": "/private/tmp", "PROTECTED_0": root + "/.git"}
    # order is the policy: allow all, deny writes, allow the roots, deny .git again (last match wins)
    i_allow = lines.index("(allow default)")
    i_deny = lines.index("(deny file-write*)")
    i_roots = next(i for i, ln in enumerate(lines) if ln.startswith("(allow file-write* "))
    i_git = next(i for i, ln in enumerate(lines) if ln.startswith("(deny file-write* "))
    assert i_allow < i_deny < i_roots < i_git
    assert '(subpath (param "WRITABLE_ROOT_0"))' in lines[i_roots] and '(subpath (param "WRITABLE_ROOT_1"))' in lines[i_roots]
    git_rule = lines[i_git]
    assert '(literal (param "PROTECTED_0"))' in git_rule and '(subpath (param "PROTECTED_0"))' in git_rule
    assert "\\.[gG][iI][tT](/.*)?$" in git_rule  # nested repositories, any letter case
    assert '\\(proj\\)' in git_rule and '\\"odd\\"' in git_rule  # the root is escaped inside the regex
    assert root not in profile.replace('\\"', '"').split("regex")[0]  # paths come as parameters, not text
    assert "/dev/null" in profile and "(allow signal (target same-sandbox))" in profile
    assert "network" not in profile.split("same-sandbox")[1]  # network on: no network rules


def test_seatbelt_profile_without_network_and_read_only() -> None:
    profile, params = seatbelt_profile(Confinement("workspace-write", ("/w",), (), network=False))
    assert '(deny network-outbound (remote ip "*:*"))' in profile and '(deny network-bind (local ip "*:*"))' in profile
    assert "PROTECTED" not in profile and _sexp_balanced(profile)
    ro, params = seatbelt_profile(Confinement("read-only", ("/w",), ("/w/.git",)))
    assert params == [] and "WRITABLE_ROOT" not in ro and "(deny file-write*)" in ro
    args = Backend("seatbelt", "Seatbelt").wrap(["bash", "-c", "x"], Confinement("workspace-write", ("/w",)))
    assert args[0] == SANDBOX_EXEC == "/usr/bin/sandbox-exec" and args[1] == "-p" and "-DWRITABLE_ROOT_0=/w" in args
    assert args[-4:] == ["--", "bash", "-c", "x"]


def test_seatbelt_runs_on_macos(ws, tmp_path) -> None:
    if sys.platform != "darwin" or not os.path.exists(SANDBOX_EXEC):
        pytest.skip("Seatbelt (sandbox-exec) exists only on macOS; the profile is checked above")
    assert BACKEND is not None and BACKEND.name == "seatbelt"
    outside = Path.home() / f".ds4-sandbox-test-{uuid.uuid4().hex}"
    conf = Policy("auto-edit").confinement(ws, None)
    try:
        r = bash(ws, {"command": f"echo in > i.txt; echo out > {outside}; echo g > .git/x; mkdir -p v/.GIT; echo done"},
                 sandbox=(BACKEND, conf))
        assert (ws.root / "i.txt").exists() and not outside.exists() and not (ws.root / ".git" / "x").exists()
        assert "done" in r.text
    finally:
        if outside.exists():
            outside.unlink()
