"""Exact verdicts of the approval policy (policy.py), the shell parser (shellparse.py) and the
command classifier (tools/classify), each pinned by a concrete
command or call and the exact request, reason, scope or parse it must give.

Nothing here runs a real command: the shell tool is a recorder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import ds4agent.tools.classify as classify
import ds4agent.tools.policy as policy_mod
from ds4agent.tools import Policy, Tool, ToolResult, Workspace, all_tools, run_tool
from ds4agent.tools import sandbox as sb
from ds4agent.tools.base import ToolError
from ds4agent.tools.classify import DANGEROUS, ORDINARY, SAFE, analyze
from ds4agent.tools.policy import Request, dangerous, loose_arguments

TOOLS = all_tools()
CALLS: list[tuple[dict, object]] = []  # (args, sandbox) of every recorded shell run
LANDLOCK = sb.Backend("landlock", "test landlock")


def _record(ws, args, sandbox=None):
    CALLS.append((dict(args), sandbox))
    return ToolResult("recorded", "recorded")


BASH = Tool("bash", "runs a command", TOOLS["bash"].parameters, _record, kind="shell")


@pytest.fixture(autouse=True)
def _no_temp_dirs(monkeypatch):
    # The workspace lives in the temporary directory: here it counts as outside (as in
    # test_shell_policy), so that paths next to the workspace are outside it.
    monkeypatch.setattr(classify.places, "temp_dirs", lambda: ())
    monkeypatch.setattr(policy_mod, "temp_dirs", lambda: ())
    monkeypatch.setattr(policy_mod, "_GIT_DIRS", {})  # asked afresh: a path may be reused by another run
    CALLS.clear()


@pytest.fixture()
def ws(tmp_path: Path, git_init) -> Workspace:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    git_init(root)
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    (tmp_path / "outside" / "sub").mkdir(parents=True)
    (tmp_path / "outside" / "key").write_text("private")
    return Workspace(root)


def _pol(mode: str = "ask", backend: sb.Backend | None = LANDLOCK, **kw) -> Policy:
    p = Policy(mode, **kw)
    p.backend, p._detected = backend, True  # no probing of this machine: the sandbox is chosen here
    return p


def _where(ws: Workspace, pol: Policy) -> tuple[str, str]:
    return (f"in {ws.root}", f"sandbox: {pol.describe()}")


# -- policy.py: modes and the sandbox ------------------------------------------------------------

def test_modes_are_checked_with_exact_messages() -> None:
    for mode in ("ask", "auto-edit", "yolo"):
        assert Policy(mode).mode == mode
    for s in ("read-only", "workspace-write", "full-access"):
        assert Policy(sandbox=s).sandbox == s
    with pytest.raises(ValueError) as e:
        Policy("bogus")
    assert str(e.value) == "approval mode must be one of ask, auto-edit, yolo, got 'bogus'"
    with pytest.raises(ValueError) as e:
        Policy("ask", sandbox="none")
    assert str(e.value) == "sandbox mode must be one of read-only, workspace-write, full-access, got 'none'"


def test_defaults_of_a_policy_and_a_request() -> None:
    # Looked up on the module at call time (not the name bound at import), so that this checks
    # the class as the module defines it now.
    p = policy_mod.Policy()
    assert (p.mode, p.sandbox, p.network, p.writable, p.always) == ("ask", None, True, (), set())
    # The machinery (backend, detection, the cached analysis) stays out of the repr.
    assert repr(p) == "Policy(mode='ask', sandbox=None, network=True, writable=(), always=set())"
    r = policy_mod.Request("t", "s", "r", "k")
    assert (r.scope, r.grants, r.details, r.preview) == (None, (), (), "")


def test_a_given_backend_is_used_without_probing(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(sb, "detect", lambda: calls.append(1) or LANDLOCK)
    given = sb.Backend("bubblewrap", "given")
    assert Policy("ask", backend=given).mechanism() is given and calls == []
    p = Policy("ask")
    assert p.mechanism() is LANDLOCK and p.mechanism() is LANDLOCK and calls == [1]  # probed once


def test_sandbox_mode_confined_describe_and_startup_note() -> None:
    assert Policy("ask").sandbox_mode == "workspace-write"
    assert Policy("auto-edit").sandbox_mode == "workspace-write"
    assert Policy("yolo").sandbox_mode == "full-access"
    assert Policy("yolo", sandbox="read-only").sandbox_mode == "read-only"
    assert Policy("ask", sandbox="full-access").sandbox_mode == "full-access"

    assert _pol("ask").confined() is True
    assert _pol("yolo").confined() is False
    assert _pol("ask", backend=None).confined() is False

    assert _pol("yolo").describe() == "full access" and _pol("yolo").describe(detail=True) == "full access"
    assert _pol("ask", backend=None).describe() == "workspace-write: no OS sandbox here"
    assert _pol("ask").describe() == "workspace-write"
    assert _pol("ask").describe(detail=True) == "workspace-write (test landlock)"
    assert _pol("ask", network=False).describe() == "workspace-write, no network"
    assert _pol("ask", sandbox="read-only", network=False).describe(detail=True) == "read-only, no network (test landlock)"

    assert _pol("ask").startup_note() is None
    assert _pol("yolo", backend=None).startup_note() is None
    assert _pol("ask", backend=None).startup_note() == (
        "no OS sandbox is available here (Landlock, bubblewrap or sandbox-exec): shell commands run unconfined, "
        "so every one needs an approval in auto-edit")


def test_confinement_of_each_mode(ws, tmp_path, monkeypatch) -> None:
    root = os.path.realpath(ws.root)
    assert _pol("yolo").confinement(ws, None) is None
    assert _pol("ask", backend=None).confinement(ws, None) is None
    assert _pol("ask", sandbox="read-only", network=False).confinement(ws, None) == sb.Confinement(
        "read-only", (), (), False)
    # Temporary directories are writable unless below the workspace (already writable); the
    # extra --allow-write directories by their real path; the workspace's .git stays protected.
    tmp1 = tmp_path / "t1"
    tmp1.mkdir()
    monkeypatch.setattr(policy_mod, "temp_dirs", lambda: (tmp1, ws.root / "src"))
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    pol = _pol("ask", writable=(str(tmp_path / "alias"), root))
    assert pol.confinement(ws, None) == sb.Confinement(
        "workspace-write", (root, str(tmp1), os.path.realpath(tmp_path / "real")), (os.path.join(root, ".git"),), True)
    # Without a .git there is nothing to protect, except under seatbelt (it protects the name).
    bare = tmp_path / "bare"
    bare.mkdir()
    bws = Workspace(bare)
    broot = os.path.realpath(bare)
    src = os.path.realpath(ws.root / "src")  # not below this workspace: listed
    assert _pol("ask").confinement(bws, None) == sb.Confinement("workspace-write", (broot, str(tmp1), src), (), True)
    seat = _pol("ask", backend=sb.Backend("seatbelt", "s"))
    assert seat.confinement(bws, None).protected == (os.path.join(broot, ".git"),)


def test_confinement_of_git_only_commands_opens_a_git_dir_outside_the_tree(ws, tmp_path, monkeypatch) -> None:
    # A repository whose git directory lives elsewhere (as for a worktree): a git-only command
    # may write it; any other command runs with the .git pointer protected instead.
    tree, gd = tmp_path / "tree", tmp_path / "gitdir"
    tree.mkdir()
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(gd), str(tree)], check=True)
    tws = Workspace(tree)
    troot, rgd = os.path.realpath(tree), os.path.realpath(gd)
    pol = _pol("ask")
    git = pol.confinement(tws, analyze("git add . && git commit -m x", tree))
    assert git == sb.Confinement("workspace-write", (troot, rgd), (), True)
    other = pol.confinement(tws, analyze("make", tree))
    assert other == sb.Confinement("workspace-write", (troot,), (os.path.join(troot, ".git"),), True)
    # The repository's own .git below the workspace is already writable: not listed twice.
    assert pol.confinement(ws, analyze("git commit -m x", ws.root)).writable == (os.path.realpath(ws.root),)
    assert policy_mod._git_dirs(troot) == [rgd]
    assert policy_mod._GIT_DIRS[troot] == [rgd] and policy_mod._git_dirs(troot) is policy_mod._GIT_DIRS[troot]
    # An ordinary repository: its git dir and common dir are the same .git, listed once.
    wroot = os.path.realpath(ws.root)
    assert policy_mod._git_dirs(wroot) == [os.path.join(wroot, ".git")]
    # A git dir already below one of the writable directories (here a temporary one) is not
    # listed again, even though it is not below the workspace.
    monkeypatch.setattr(policy_mod, "temp_dirs", lambda: (tmp_path,))
    assert pol.confinement(tws, analyze("git commit -m x", tree)).writable == (troot, os.path.realpath(tmp_path))
    assert policy_mod._git_dirs(str(tmp_path / "outside")) == []  # not a repository


def test_analysis_is_cached_for_the_same_command_and_workspace(ws, tmp_path) -> None:
    pol = _pol("ask")
    a = pol.analyze("ls -la", ws)
    assert pol.analyze("ls -la", ws) is a
    b = pol.analyze("ls", ws)
    assert b is not a and b.command == "ls"
    other = Workspace(tmp_path / "outside")
    c = pol.analyze("ls", other)
    assert c is not b and c.command == "ls"


# -- policy.py: what needs approval ----------------------------------------------------------------

def test_dangerous_gives_every_dangerous_reason(ws, monkeypatch) -> None:
    assert dangerous("rm -rf a; git push -f", ws.root) == "recursive delete; forced delete; force-push or remote delete"
    assert dangerous("ls -la", ws.root) is None
    assert dangerous("pytest", ws.root) is None  # ordinary is not dangerous
    assert dangerous("$X -rf", ws.root) is None  # unknown is not dangerous either
    # Without a root, the current directory is the workspace.
    target = ws.root / "notes.txt"
    assert dangerous(f"echo hi > {target}", ws.root) is None
    monkeypatch.chdir(ws.root / "src")
    assert dangerous(f"echo hi > {target}") == f"writes outside the workspace ({target})"


def test_a_path_outside_the_workspace_asks_with_its_scope(ws, tmp_path) -> None:
    read, write = TOOLS["read"], TOOLS["write"]
    out = tmp_path / "outside"
    key = str(out / "key")
    req = _pol("ask").request(read, {"path": key}, ws)
    assert req == Request("read", f"read {key}", "path is outside the workspace", "escape",
                          scope=f"reads of files under {out}", grants=(("read", str(out)),),
                          details=(f"{key} resolves to {key}",))
    # A directory that is read: the grant is the directory itself; a write: its parent.
    req = _pol("auto-edit").request(TOOLS["list"], {"path": str(out / "sub")}, ws)
    assert req.grants == (("read", str(out / "sub")),) and req.scope == f"reads of files under {out / 'sub'}"
    req = _pol("auto-edit").request(write, {"path": str(out / "sub"), "content": "x"}, ws)
    assert req.kind == "escape" and req.grants == (("write", str(out)),)
    assert req.scope == f"writes of files under {out}" and req.reason == "path is outside the workspace"
    # yolo asks nothing; a grant covers the directory and below it, for its own verb only.
    assert _pol("yolo").request(read, {"path": key}, ws) is None
    assert _pol("ask", always={("read", str(tmp_path))}).request(read, {"path": key}, ws) is None
    assert _pol("ask", always={("read", str(out / "sub"))}).request(read, {"path": key}, ws) is not None
    assert _pol("ask", always={("write", str(tmp_path))}).request(read, {"path": key}, ws) is not None
    assert _pol("ask", always={("read", str(tmp_path), "x")}).request(read, {"path": key}, ws) is not None
    assert _pol("ask", always={("read", str(tmp_path) + "/out")}).request(read, {"path": key}, ws) is not None


def test_a_symlink_and_a_git_dir(ws, tmp_path) -> None:
    os.symlink(tmp_path / "outside", ws.root / "link")
    req = _pol("ask").request(TOOLS["read"], {"path": "link/key"}, ws)
    real = tmp_path / "outside" / "key"
    assert (req.kind, req.reason, req.details) == ("escape", "path is a symlink that leads outside the workspace",
                                                   (f"link/key resolves to {real}",))
    assert req.grants == (("read", str(tmp_path / "outside")),)
    # Reading inside .git runs; writing there asks, whatever "always" was given for edits.
    assert _pol("ask").request(TOOLS["read"], {"path": ".git/HEAD"}, ws) is None
    req = _pol("auto-edit", always={("edit",)}).request(TOOLS["write"], {"path": ".git/HEAD", "content": "x"}, ws)
    assert (req.kind, req.reason) == ("escape", "path is inside .git")
    assert req.grants == (("write", str(ws.root / ".git")),)


def test_edits_inside_the_workspace(ws) -> None:
    write = TOOLS["write"]
    args = {"path": "a.txt", "content": "x"}
    edit = Request("write", "write a.txt", "changes a file", "edit", scope="file edits inside the workspace",
                   grants=(("edit",),))
    assert _pol("ask").request(write, args, ws) == edit
    assert _pol("ask", backend=None).request(write, args, ws) == edit
    assert _pol("auto-edit").request(write, args, ws) is None
    assert _pol("auto-edit", backend=None).request(write, args, ws) is None  # edits are not shell commands
    assert _pol("auto-edit", sandbox="read-only").request(write, args, ws) == Request(
        "write", "write a.txt", "changes a file, and the sandbox is read-only", "edit",
        scope="file edits inside the workspace", grants=(("edit",),))
    assert _pol("ask", always={("edit",)}).request(write, args, ws) is None
    assert _pol("yolo").request(write, args, ws) is None
    assert _pol("yolo", sandbox="read-only").request(write, args, ws) is None  # yolo: edits run, whatever the sandbox
    assert _pol("ask").request(TOOLS["read"], {"path": "src/app.py"}, ws) is None
    assert _pol("ask").request(TOOLS["read"], {"path": "  "}, ws) is None  # no path: nothing to check here


def test_mcp_tools_ask_outside_yolo(ws) -> None:
    t = Tool("mcp__files__delete", "d", {"type": "object"}, _record, kind="mcp", strict=False)
    want = Request("mcp__files__delete", "mcp__files__delete", "calls a tool of the MCP server 'files'", "mcp",
                   scope="calls to the MCP tool mcp__files__delete", grants=(("mcp", "mcp__files__delete"),))
    assert _pol("ask").request(t, {}, ws) == want
    assert _pol("auto-edit").request(t, {}, ws) == want
    assert _pol("yolo").request(t, {}, ws) is None
    assert _pol("ask", always={("mcp", "mcp__files__delete")}).request(t, {}, ws) is None
    assert _pol("ask", always={("mcp", "mcp__files__other")}).request(t, {}, ws) == want
    odd = Tool("mcp__x", "d", {"type": "object"}, _record, kind="mcp", strict=False)
    assert _pol("ask").request(odd, {}, ws).reason == "calls a tool of the MCP server '?'"
    deep = Tool("a__b__c__d", "d", {"type": "object"}, _record, kind="mcp", strict=False)
    assert _pol("ask").request(deep, {}, ws).reason == "calls a tool of the MCP server 'b'"


def test_shell_requests_exact(ws) -> None:
    pol = _pol("ask")
    where = _where(ws, pol)
    assert where == (f"in {ws.root}", "sandbox: workspace-write")
    four = "rm -rf a; git push -f; git reset --hard; sudo ls"
    assert pol.request(BASH, {"command": four}, ws) == Request(
        "bash", f"$ {four}", "dangerous command (recursive delete; forced delete; force-push or remote delete)",
        "dangerous", details=where)
    assert _pol("yolo").request(BASH, {"command": "rm -r x"}, ws) == Request(
        "bash", "$ rm -r x", "dangerous command (recursive delete)", "dangerous",
        details=(f"in {ws.root}", "sandbox: full access"))
    assert _pol("yolo").request(BASH, {"command": "$X; python -c 1"}, ws) is None
    assert pol.request(BASH, {"command": "$X; $Y; $Z; $W"}, ws) == Request(
        "bash", "$ $X; $Y; $Z; $W", "cannot be checked before it runs (the program is computed ($X); the program is "
        "computed ($Y); the program is computed ($Z))", "unknown", details=where)
    assert pol.request(BASH, {"command": "pytest a; pytest b && npm test"}, ws) == Request(
        "bash", "$ pytest a; pytest b && npm test", "runs a shell command", "shell",
        scope="commands starting with `pytest`, `npm test`", grants=(("shell", "pytest"), ("shell", "npm", "test")),
        details=where)
    # A name that needs quoting is shown quoted in the scope.
    assert pol.request(BASH, {"command": "'./my tool' -v"}, ws).scope == "commands starting with `'./my tool'`"
    # Inert parts need nothing of their own next to a real program; alone they are still asked in ask.
    assert pol.request(BASH, {"command": "cd src && pytest"}, ws).grants == (("shell", "pytest"),)
    assert pol.request(BASH, {"command": "echo hi"}, ws).grants == (("shell", "echo"),)
    assert pol.request(BASH, {"command": "command"}, ws) is not None
    assert pol.request(BASH, {}, ws) is None and pol.request(BASH, {"command": ""}, ws) is None  # nothing to run


def test_auto_edit_runs_safe_parts_only_when_confined(ws) -> None:
    auto = _pol("auto-edit")
    assert auto.request(BASH, {"command": "ls -la"}, ws) is None
    assert auto.request(BASH, {"command": "echo hi"}, ws) is None
    req = auto.request(BASH, {"command": "ls && pytest"}, ws)
    # (what kept it off the read-only list is said: only pytest asks, and why)
    assert (req.reason, req.grants) == ("runs a shell command (pytest is not on the read-only list)", (("shell", "pytest"),))
    assert _pol("ask", backend=None).request(BASH, {"command": "pytest"}, ws).reason == "runs a shell command"
    assert _pol("ask").request(BASH, {"command": "ls && pytest"}, ws).grants == (("shell", "ls"), ("shell", "pytest"))
    bare = _pol("auto-edit", backend=None)
    req = bare.request(BASH, {"command": "ls"}, ws)
    assert (req.reason, req.scope) == ("runs a shell command (no sandbox: every command needs an approval)",
                                       "commands starting with `ls`")
    req = bare.request(BASH, {"command": "cat /etc/hosts"}, ws)
    assert req.reason == ("runs a shell command (names a path outside the workspace (/etc/hosts); "
                          "no sandbox: every command needs an approval)")
    assert req.scope is None and req.grants == ()
    # The same reason from two steps is said once.
    req = _pol("ask").request(BASH, {"command": "cat /etc/hosts; cat /etc/hosts"}, ws)
    assert req.reason == "runs a shell command (names a path outside the workspace (/etc/hosts))"
    # "yolo" with a sandbox chosen is confined but asks nothing for ordinary commands.
    assert _pol("yolo", sandbox="workspace-write").request(BASH, {"command": "pytest"}, ws) is None


def test_always_rules_cover_by_prefix(ws) -> None:
    pol = _pol("ask", always={("shell", "npm", "test"), ("shell", "pytest"), ("edit",)})
    assert pol.request(BASH, {"command": "pytest -x"}, ws) is None
    assert pol.request(BASH, {"command": "npm test -- --ci"}, ws) is None
    assert pol.request(BASH, {"command": "npm"}, ws).grants == (("shell", "npm"),)  # shorter than the rule
    assert pol.request(BASH, {"command": "npm run test"}, ws).grants == (("shell", "npm", "run", "test"),)
    # A rule covers only a coverable step: the same program naming a path outside still asks.
    assert _pol("ask", always={("shell", "cat")}).request(BASH, {"command": "cat /etc/hosts"}, ws) is not None
    assert _pol("ask", always={("shell", "cat")}).request(BASH, {"command": "cat src/app.py"}, ws) is None
    # Every step is checked: a rule covering the first does not cover the next.
    assert pol.request(BASH, {"command": "pytest && npm run x"}, ws).grants == (("shell", "npm", "run", "x"),)
    # "always" is offered only when every step that asks has a prefix and can be covered.
    req = pol.request(BASH, {"command": "make; cat /etc/hosts"}, ws)
    assert (req.scope, req.grants) == (None, ())
    assert policy_mod._covers(("npm", "test"), ["npm", "test", "x"]) is True
    assert policy_mod._covers(("npm", "test"), ["npm"]) is False
    assert policy_mod._covers(("npm", "test"), ["npm", None]) is False
    assert policy_mod._covers(("npm",), ["npx"]) is False
    assert policy_mod._covers((), ["anything"]) is True


def test_grant_and_rules(ws) -> None:
    pol = _pol("ask")
    for kind in ("dangerous", "unknown", "unsandboxed"):
        pol.grant(Request("bash", "s", "r", kind, scope="x", grants=(("shell", "rm"),)))
    pol.grant(Request("bash", "s", "r", "shell", scope=None, grants=(("shell", "ls"),)))
    assert pol.always == set()
    pol.grant(Request("bash", "s", "r", "shell", scope="x", grants=(("shell", "git", "commit"), ("shell", "a b"))))
    pol.grant(Request("x", "s", "r", "edit", scope="e", grants=(("edit",),)))
    pol.grant(Request("x", "s", "r", "mcp", scope="m", grants=(("mcp", "mcp__s__t"),)))
    pol.grant(Request("x", "s", "r", "escape", scope="r", grants=(("read", "/x"), ("write", "/y"))))
    assert pol.rules() == ["file edits inside the workspace", "MCP tool mcp__s__t", "reads under /x",
                           "shell: 'a b'", "shell: git commit", "writes under /y"]
    # Sorted by the grants' text: a name holding a quote is written in double quotes, which
    # sort before single ones (by the tuples themselves, 'a' would come first).
    two = _pol("ask", always={("shell", "a"), ("shell", "it's")})
    assert two.rules() == ["shell: 'it'\"'\"'s'", "shell: a"]


def test_paths_under_a_root() -> None:
    u = policy_mod._under
    assert u("/a/b", "/a") and u("/a", "/a") and u("/a/b", "/a/")
    assert not u("/ab", "/a") and not u("/", "/a") and not u("/a/b", "/aX") and u("/aX/b", "/aX")
    g = policy_mod._granted
    assert g(("read", "/a"), ("read", "/a/b")) and not g(("write", "/a"), ("read", "/a/b"))
    assert not g(("read",), ("read", "/a")) and not g(("read", "/a", "b"), ("read", "/a"))


# -- policy.py: run_tool ---------------------------------------------------------------------------

def test_run_tool_errors_before_anyone_is_asked(ws) -> None:
    tools = {"bash": BASH, "b": BASH}
    r, d = run_tool(tools, "nuke", {}, ws, _pol("yolo"), None)
    assert (r.text, r.summary, r.ok, d) == ("error: unknown tool 'nuke'; available: b, bash", "unknown tool nuke",
                                            False, "error")
    r, d = run_tool(tools, "bash", "{not json", ws, _pol("yolo"), None)
    assert (r.text, r.summary, r.ok, d) == (
        "error: arguments are not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1))", "bash: bad arguments", False, "error")
    r, d = run_tool(tools, "bash", "[" * 200_000, ws, _pol("yolo"), None)
    assert (r.text, d) == ("error: arguments are not valid JSON (nested too deeply)", "error")
    r, d = run_tool(tools, "bash", '"' + "x" * 300, ws, _pol("yolo"), None)
    assert r.text.startswith("error: arguments are not valid JSON (Unterminated string")
    r, d = run_tool(tools, "bash", {"nope": 1}, ws, _pol("yolo"), None)
    assert (r.text, r.summary, d) == ("error: unknown parameter 'nope' for bash; it takes: command, timeout, background",
                                      "bash: unknown parameter 'nope' for bash; it takes: command, timeout, background",
                                      "error")
    assert CALLS == []


def test_run_tool_decisions(ws) -> None:
    tools = {"bash": BASH}
    asked: list[Request] = []

    def answer(a):
        return lambda req: asked.append(req) or a

    r, d = run_tool(tools, "bash", {"command": "pytest"}, ws, _pol("ask"), None)
    assert (r.text, r.summary, r.ok, d) == (
        "error: not run: runs a shell command; no one can approve it in this mode. Choose another way or ask the user.",
        "refused: $ pytest (runs a shell command)", False, "refused")
    r, d = run_tool(tools, "bash", {"command": "pytest"}, ws, _pol("ask"), answer("no"))
    assert r.text == "error: not run: runs a shell command; the user declined. Choose another way or ask the user."
    assert d == "refused" and CALLS == []
    assert asked[-1].preview == ""  # a shell command has no preview
    pol = _pol("ask")
    r, d = run_tool(tools, "bash", '{"command": "pytest"}', ws, pol, answer("yes"))
    assert (r.text, d, pol.always) == ("recorded", "approved", set())
    r, d = run_tool(tools, "bash", {"command": "pytest"}, ws, pol, answer("always"))
    assert (d, pol.always) == ("always", {("shell", "pytest")})
    r, d = run_tool(tools, "bash", {"command": "pytest -q"}, ws, pol, answer("no"))
    assert d == "auto"  # covered now: not asked
    r, d = run_tool(tools, "bash", {"command": "cat /etc/hosts"}, ws, pol, answer("always"))
    assert d == "approved" and pol.always == {("shell", "pytest")}  # nothing to remember: no scope
    r, d = run_tool(tools, "bash", {"command": "rm -rf x"}, ws, _pol("yolo"), answer("maybe"))
    assert d == "refused" and r.text.startswith("error: not run: dangerous command (recursive delete; forced delete)")


def _tool(run, kind="read", preview=None, strict=True, name="t") -> Tool:
    params = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}
    return Tool(name, "d", params, run, kind=kind, preview=preview, strict=strict)


def test_run_tool_faults_of_a_tool(ws) -> None:
    def raiser(e):
        def run(ws, args):
            raise e
        return run

    pol = _pol("yolo")
    r, d = run_tool({"t": _tool(raiser(ToolError("no such file")))}, "t", {"path": "x"}, ws, pol, None)
    assert (r.text, r.summary, r.ok, d) == ("error: no such file", "t: no such file", False, "auto")
    r, d = run_tool({"t": _tool(raiser(PermissionError(13, "Permission denied")))}, "t", {}, ws, pol, None)
    assert (r.text, d) == ("error: Permission denied", "auto")
    r, d = run_tool({"t": _tool(raiser(OSError("plain")))}, "t", {}, ws, pol, None)
    assert r.text == "error: plain"
    r, d = run_tool({"t": _tool(raiser(ValueError("boom")))}, "t", {}, ws, pol, None)
    assert (r.text, r.summary, r.ok, d) == (
        "error: the t tool failed unexpectedly (ValueError: boom). This is a fault in ds4agent, not in your call; "
        "try another way.", "t: internal error (ValueError)", False, "auto")
    r, d = run_tool({"t": _tool(raiser(ValueError("b" * 400)))}, "t", {}, ws, pol, None)
    assert r.text == ("error: the t tool failed unexpectedly (ValueError: " + "b" * 288 + "). This is a fault in "
                      "ds4agent, not in your call; try another way.")
    # A fault while working out the request is reported the same way, nothing is run.
    bad = _tool(raiser(AssertionError()), kind="edit", preview=lambda ws, a: 1 / 0)
    r, d = run_tool({"t": bad}, "t", {"path": "a"}, ws, _pol("ask"), lambda req: "yes")
    assert (r.summary, d) == ("t: internal error (ZeroDivisionError)", "error")
    bad = _tool(raiser(AssertionError()), kind="edit", preview=lambda ws, a: (_ for _ in ()).throw(ToolError("gone")))
    r, d = run_tool({"t": bad}, "t", {"path": "a"}, ws, _pol("ask"), lambda req: "yes")
    assert (r.text, r.summary, d) == ("error: gone", "t: gone", "error")
    # Undecodable names from the OS reach the transcript as U+FFFD (one per byte of the
    # surrogate's 3-byte encoding, none of which starts valid UTF-8); ok is kept.
    odd, fixed = "a\udcff", "a" + "\ufffd" * 3
    r, d = run_tool({"t": _tool(lambda ws, a: ToolResult(odd, odd, False, odd, output=odd))}, "t", {}, ws, pol, None)
    assert (r.text, r.summary, r.ok, r.detail, r.output) == (fixed, fixed, False, fixed, fixed)


def test_run_tool_refuses_a_change_that_moved_while_asking(ws) -> None:
    views = iter(["diff 1", "diff 2"])
    seen: list[str] = []
    t = _tool(lambda ws, a: ToolResult("done", "done"), kind="edit", preview=lambda ws, a: next(views))
    r, d = run_tool({"t": t}, "t", {"path": "a.txt"}, ws, _pol("ask"), lambda req: seen.append(req.preview) or "yes")
    assert seen == ["diff 1"] and d == "error" and r.text == (
        "error: the file changed while the user was being asked, so the approved change is not the one that would "
        "be made; not run. Read the file again.")
    same = _tool(lambda ws, a: ToolResult("done", "done"), kind="edit", preview=lambda ws, a: "diff")
    r, d = run_tool({"t": same}, "t", {"path": "a.txt"}, ws, _pol("ask"), lambda req: "yes")
    assert (r.text, d) == ("done", "approved")
    # With no one to ask, the preview is not even worked out.
    r, d = run_tool({"t": _tool(None, kind="edit", preview=lambda ws, a: 1 / 0)}, "t", {"path": "a"}, ws, _pol("ask"),
                    None)
    assert d == "refused"


def test_mcp_arguments_are_previewed_and_loosely_checked(ws) -> None:
    seen: list[str] = []
    t = Tool("mcp__s__t", "d", {"type": "object"}, lambda ws, a: ToolResult(json.dumps(a), "ok"), kind="mcp",
             strict=False)
    r, d = run_tool({"mcp__s__t": t}, "mcp__s__t", {"q": "é", "n": None, "k": [1]}, ws, _pol("ask"),
                    lambda req: seen.append(req.preview) or "yes")
    assert seen == ['{\n  "q": "é",\n  "k": [\n    1\n  ]\n}'] and d == "approved"
    assert json.loads(r.text) == {"q": "é", "k": [1]}  # None dropped
    seen.clear()
    run_tool({"mcp__s__t": t}, "mcp__s__t", {"q": "x" * 5000}, ws, _pol("ask"), lambda req: seen.append(req.preview) or "no")
    text = json.dumps({"q": "x" * 5000}, indent=2)
    assert seen == [text[:4000] + f"\n… ({len(text)} characters in all)"]
    exact = {"q": "x" * (4000 - len(json.dumps({"q": ""}, indent=2)))}
    seen.clear()
    run_tool({"mcp__s__t": t}, "mcp__s__t", exact, ws, _pol("ask"), lambda req: seen.append(req.preview) or "no")
    assert seen == [json.dumps(exact, indent=2)] and len(seen[0]) == 4000

    with pytest.raises(ToolError) as e:
        loose_arguments([1])
    assert str(e.value) == "arguments must be a JSON object, got list"
    cases = {
        "argument 'k' contains a NUL byte (\\0)": {"k": "a\0"},
        "argument 'k'.sub contains a NUL byte (\\0)": {"k": {"sub": "\0"}},
        "argument 'k'[1] contains a NUL byte (\\0)": {"k": ["ok", "\0"]},
        "argument 'k'[0].x contains a NUL byte (\\0)": {"k": [{"x": "\0"}]},
        "argument 'k' contains a NUL byte (\\0) ": {"k": {"\0": 1}},
        "argument 'a\\x00' contains a NUL byte (\\0)": {"a\0": 1},
        "argument '" + "b" * 39 + " contains a NUL byte (\\0)": {"b" * 50 + "\0": 1},  # a key's name: 40 characters
        "argument 'k' contains a lone surrogate (\\ud800-\\udfff), which is not text": {"k": {1: "\ud800"}},
    }
    for want, args in cases.items():
        with pytest.raises(ToolError) as e:
            loose_arguments(args)
        assert str(e.value) == want.strip(), args
    assert loose_arguments({"a": 1, "b": None, "c": {"d": None}}) == {"a": 1, "c": {"d": None}}


def test_shell_runs_in_the_sandbox_and_may_run_once_outside(ws) -> None:
    tools = {"bash": BASH}
    pol = _pol("ask", always={("shell", "pytest")})
    r, d = run_tool(tools, "bash", {"command": "pytest"}, ws, pol, None)
    assert d == "auto" and CALLS == [({"command": "pytest"}, (LANDLOCK, pol.confinement(ws, pol.analyze("pytest", ws))))]
    assert CALLS[0][1][1].mode == "workspace-write"
    CALLS.clear()
    run_tool(tools, "bash", {"command": "pytest"}, ws, _pol("yolo"), None)
    assert CALLS == [({"command": "pytest"}, None)]  # full access: no sandbox argument at all
    CALLS.clear()
    run_tool(tools, "bash", {"command": "   "}, ws, _pol("yolo", sandbox="workspace-write"), None)
    assert CALLS == [({"command": "   "}, None)]

    CALLS.clear()
    policy_mod._run_shell(BASH, ws, {}, _pol("ask"), None)  # no command: nothing to confine
    assert CALLS == [({}, None)]

    runs: list[object] = []

    def blocked(ws, args, sandbox=None):
        runs.append(sandbox)
        return ToolResult("out", "s", blocked="" if sandbox is None else "write to /etc denied")

    tb = {"bash": Tool("bash", "d", TOOLS["bash"].parameters, blocked, kind="shell")}
    asked: list[Request] = []
    pol = _pol("yolo", sandbox="workspace-write")
    r, d = run_tool(tb, "bash", {"command": "make"}, ws, pol, lambda req: asked.append(req) or "yes")
    assert asked == [Request("bash", "$ make", "the sandbox stopped it: write to /etc denied. Run it again outside the "
                             "sandbox, this once", "unsandboxed", details=(f"in {ws.root}", "sandbox: none for this run"))]
    assert asked[0].preview == ""  # nothing to preview: the question is about the sandbox
    assert r.text == "[run again outside the sandbox, with the user's approval]\nout" and len(runs) == 2
    assert runs[1] is None and d == "auto" and pol.always == set()
    runs.clear()
    r, d = run_tool(tb, "bash", {"command": "make"}, ws, pol, lambda req: "always")
    assert r.text.startswith("[run again outside") and len(runs) == 2 and pol.always == set()
    runs.clear()
    r, d = run_tool(tb, "bash", {"command": "make"}, ws, pol, lambda req: "no")
    assert r.text == ("out\n[the sandbox stopped this command: write to /etc denied. Running it outside the sandbox "
                      "needs the user's approval; the user declined.]") and len(runs) == 1
    r, d = run_tool(tb, "bash", {"command": "make"}, ws, pol, None)
    assert r.text.endswith("needs the user's approval; no one can approve that in this mode.]")


# -- shellparse.py ---------------------------------------------------------------------------------

from ds4agent.tools import shellparse as sp  # noqa: E402
from ds4agent.tools.shellparse import UNKNOWN_DIR, parse  # noqa: E402


def _words(text: str) -> list[list[str | None]]:
    return [[w.value for w in c.words] for c in parse(text).commands]


def _hist(c) -> list[tuple[str, ...]]:
    """A command's cd histories, each as the cd commands' words (or "?")."""
    return sorted(tuple("?" if x == UNKNOWN_DIR else " ".join(str(w.value) for w in x.words) for x in h) for h in c.cwd)


def _cmd(text: str, name: str):
    return next(c for c in parse(text).commands if c.name == name)


def test_ansi_c_strings_decode_like_bash() -> None:
    a = sp._ansi_c
    assert a(r"\x72\x6d") == "rm" and a(r"\162\155") == "rm"
    assert a(r"\a\b\e\E\f\n\r\t\v\\\'\"\?") == "\a\b\x1b\x1b\f\n\r\t\v\\'\"?"
    assert a(r"\0101") == "\x081"  # at most three octal digits
    assert a(r"\777") == "\xff"  # bash keeps the low byte
    assert a(r"\x4g") == "\x04g" and a(r"\x414") == "A4"  # at most two hex digits
    assert a(r"\xg") == "\\xg" and a(r"\q") == "\\q"
    assert a(r"\X9") == "\\X9"  # an unknown escape is kept as written
    assert a(r"\u00e9x") == "éx" and a(r"\u00e9ab") == "\u00e9ab" and a(r"\u12345") == "\u12345"
    assert a(r"\U0001F600") == "\U0001F600" and a(r"\U001100000") == "\ufffd0"
    assert a(r"\u") == "\\u" and a(r"\Uz") == "\\Uz"
    assert a(r"\cA") == "\x01" and a(r"\ca") == "\x01" and a(r"\c") == "\\c"
    assert a("ab\\") == "ab\\" and a("") == ""
    assert _words("$'\\x72\\x6d' -rf $'a\\tb'") == [["rm", "-rf", "a\tb"]]


def test_double_quotes_escape_only_five_characters() -> None:
    assert sp._dquote(r"a\$b\`c\"d\\e\q") == 'a$b`c"d\\e\\q'
    assert sp._dquote("a\\\nb") == "ab"
    assert _words('echo "a\\$b" "x\\qy" $"rm"') == [["echo", "a$b", "x\\qy", None]]  # $"": catalogue text


def test_words_globs_braces_and_tildes(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    c = parse("ls *.py 'a*' \"b\"? \\* {a,b} {x} a{1..3} }{a,b} '{a,b}' ~/x '~'/y ~ a~ ~\"q\"/z").commands[0]
    assert [w.value for w in c.words] == ["ls", "*.py", "a*", "b?", "*", None, "{x}", None, None, "{a,b}",
                                          f"{tmp_path}/x", "~/y", str(tmp_path), "a~", "~q/z"]
    assert [w.glob for w in c.words] == [False, True, False, True, False, False, False, False, False, False,
                                         False, False, False, False, False]
    assert _words("ls ~nosuchuser-q9/z") == [["ls", None]]  # an unknown user: left unknown
    w = parse("ls *$X").commands[0].words[1]
    assert (w.value, w.glob, w.static) == (None, True, False)
    assert parse("ls $X").commands[0].words[1].glob is False
    assert parse("ls XX").commands[0].words[1].glob is False  # only * ? [ are pattern characters
    assert parse("ls a*$X").commands[0].words[1].glob is True
    assert sp._has_brace_expansion("{{a,b}}") and sp._has_brace_expansion("{a}{b..c}")
    assert not sp._has_brace_expansion("{a}") and not sp._has_brace_expansion("a,b}") and not sp._has_brace_expansion("{a,b")
    assert not sp._has_brace_expansion("}a,b{")


def test_words_made_of_parts() -> None:
    # A substitution's commands are listed before the command whose word holds them.
    assert _words("r\\m 'r'\"m\"x r''m \"$X\" \"a$(echo b)\"") == [["echo", "b"], ["rm", "rmx", "rm", None, None]]
    c = parse('echo "a$(rm x)" `ls`').commands
    assert [x.name for x in c] == ["rm", "ls", "echo"]
    echo = c[-1]
    assert [x.source for x in echo.words[1].subst] == ["rm x"] and [x.source for x in echo.words[2].subst] == ["ls"]
    w = parse("cat <(ls) >(wc)").commands[-1].words
    assert [(x.value, x.procsub) for x in w] == [("cat", ""), (None, "<"), (None, ">")]
    sh = _cmd("cat <(ls) >(wc)", "wc")
    assert sh.stdin == "pipe" and _cmd("cat <(ls) >(wc)", "ls").stdin == ""
    assert _words("echo $((1 + 2)) ${X:-$(id)}") == [["id"], ["echo", None, None]]


def test_redirections_and_where_stdin_comes_from() -> None:
    s = parse("cat < f; cat < <(ls); cat <&3; cat <&$X; cat <<< \"hi\"; grep x <<< $Y; wc 2< g; ls >&2; ls >&f; ls >&$X")
    by = [(c.name, c.stdin, c.stdin_text, [u.source for u in c.upstream]) for c in s.commands]
    assert by == [("cat", "file", None, []), ("ls", "", None, []), ("cat", "procsub", None, ["ls"]),
                  ("cat", "", None, []), ("cat", "file", None, []), ("cat", "herestring", "hi\n", []),
                  ("grep", "herestring", None, []), ("wc", "", None, []),
                  ("ls", "", None, []), ("ls", "", None, []), ("ls", "", None, [])]
    reds = [(r.op, r.fd, r.target.value if r.target else None, r.dup) for r, _ in s.redirects]
    assert reds == [("<", None, "f", False), ("<", None, None, False), ("<&", None, "3", True), ("<&", None, None, False),
                    ("<<<", None, None, False), ("<<<", None, None, False), ("<", 2, "g", False),
                    (">&", None, "2", True), (">&", None, "f", False), (">&", None, None, False)]
    assert all(c is not None for _, c in s.redirects)
    c = parse("ls > f more args").commands[0]
    assert [w.value for w in c.words] == ["ls", "more", "args"] and [(r.op, r.target.value) for r in c.redirects] == [(">", "f")]


def test_heredocs() -> None:
    c = _cmd("cat <<EOF\na \\$x \\\\ b\\\nc\nEOF", "cat")
    assert (c.stdin, c.stdin_text) == ("heredoc", "a $x \\ bc\n")
    c = _cmd("cat <<'EOF'\na \\$x $y\nEOF", "cat")
    assert (c.stdin, c.stdin_text) == ("heredoc", "a \\$x $y\n")
    c = _cmd('cat <<"EOF"\n$y\nEOF', "cat")
    assert c.stdin_text == "$y\n"
    c = _cmd("cat <<-EOF\n\t\tx\n\tEOF", "cat")
    assert (c.redirects[0].op, c.stdin_text) == ("<<-", "x\n")
    c = _cmd("cat <<EOF\nx\n\ty\nEOF", "cat")
    assert (c.redirects[0].op, c.stdin_text) == ("<<", "x\n\ty\n")
    c = _cmd("cat <<-EOF\nx\n\ty\nEOF", "cat")
    assert (c.redirects[0].op, c.stdin_text) == ("<<-", "x\ny\n")
    s = parse("cat <<EOF > out\nhi $(rm x)\nEOF")
    cat = next(c for c in s.commands if c.name == "cat")
    assert (cat.stdin, cat.stdin_text) == ("heredoc", None) and "rm" in [c.name for c in s.commands]
    assert [(r.op, r.target.value if r.target else None, c is None) for r, c in s.redirects] == [
        (">", "out", True), ("<<", None, False)]
    c = _cmd("cat 3<<EOF\nx\nEOF", "cat")
    assert (c.stdin, c.redirects[0].fd) == ("", 3)


def test_pipelines_feed_every_later_stage() -> None:
    s = parse("a | b | c")
    assert [(c.name, c.stdin, [u.name for u in c.upstream]) for c in s.commands] == [
        ("a", "", []), ("b", "pipe", ["a"]), ("c", "pipe", ["a", "b"])]
    # The grammar hangs `< f` on the whole pipeline: it may feed any stage (bash: the last).
    s = parse("a | b < f")
    assert [(c.name, c.stdin) for c in s.commands] == [("a", "file"), ("b", "file")]
    assert [(c.name, c.stdin) for c in parse("a | { b; c; }").commands] == [("a", ""), ("b", "pipe"), ("c", "pipe")]


def test_assignments_and_declarations() -> None:
    cs = parse("X=1; Y= Z=2 env; export A=1 B; unset Q; local L").commands
    assert [(c.kind, [w.value for w in c.words], [(n, w.value) for n, w in c.assigns]) for c in cs] == [
        ("assignment", [], [("X", "1")]), ("simple", ["env"], [("Y", ""), ("Z", "2")]),
        ("declaration", ["export", "B"], [("A", "1")]), ("declaration", ["unset", "Q"], []),
        ("declaration", ["local", "L"], [])]
    assert [c.source for c in cs] == ["X=1", "Y= Z=2 env", "export A=1 B", "unset Q", "local L"]
    c = parse("X=$(rm y)").commands
    assert [(x.name, x.kind) for x in c] == [("rm", "simple"), (None, "assignment")]


def test_cd_histories() -> None:
    assert _hist(_cmd("cd a && ls", "ls")) == [("cd a",)]
    assert _hist(_cmd("cd a; pushd b; popd; ls", "ls")) == [("cd a", "pushd b", "popd")]
    assert _hist(_cmd("cd a || ls", "ls")) == [(), ("cd a",)]
    assert _hist(_cmd("cd a || true; ls", "ls")) == [(), ("cd a",)]
    assert _hist(_cmd("true || cd a; ls", "ls")) == [(), ("cd a",)]
    assert _hist(_cmd("(cd a); ls", "ls")) == [()]
    assert _hist(_cmd("cd a & ls", "ls")) == [()]
    assert _hist(_cmd("x=$(cd a); ls", "ls")) == [()]
    assert _hist(_cmd("cd a | cat; ls", "ls")) == [()]
    assert _hist(_cmd("builtin cd x; ls", "ls")) == [("?",)]
    assert _hist(_cmd("command pushd x; ls", "ls")) == [("?",)]
    assert _hist(_cmd("command ls; builtin; ls", "ls")) == [()]
    s = parse("if cd a; then cd b; elif true; then cd c; else cd d; fi; ls")
    assert _hist(s.commands[-1]) == [("cd a",), ("cd a", "cd b"), ("cd a", "cd c"), ("cd a", "cd d")]
    assert _hist(_cmd("if true; then cd b; fi; ls", "ls")) == [(), ("cd b",)]
    assert _hist(_cmd("case $x in a) cd a;; b) cd b;; esac; ls", "ls")) == [(), ("cd a",), ("cd b",)]
    s = parse("for x in 1; do ls; cd a; done; pwd")
    assert _hist(s.commands[0]) == [(), ("?",)]
    assert _hist(s.commands[-1]) == [(), ("?",), ("cd a",)]
    assert _hist(parse("while true; do ls; done; pwd").commands[-1]) == [()]  # no cd: still known
    s = parse("f() { cd /x; ls; }; f; pwd")
    assert [(c.name, c.function, _hist(c)) for c in s.commands] == [
        ("cd", "f", [("?",)]), ("ls", "f", [("?", "cd /x")]), ("f", None, [(), ("?",)]), ("pwd", None, [(), ("?",)])]
    assert list(s.functions) == ["f"] and [c.source for c in s.functions["f"]] == ["cd /x", "ls"]
    assert [(c.name, c.function, _hist(c)) for c in parse("g() { ls; }; pwd").commands] == [
        ("ls", "g", [("?",)]), ("pwd", None, [()])]


def test_cd_histories_are_bounded() -> None:
    five = "; ".join(f"if t; then cd d{i}; fi" for i in range(5))
    assert len(_cmd(five + "; ls", "ls").cwd) == 32  # 2**5 histories are kept
    assert _hist(_cmd(five + "; if t; then cd e; fi; ls", "ls")) == [("?",)]  # 64: unknown


def test_redirections_of_compound_commands() -> None:
    s = parse("{ a; b; } > f")
    assert [(r.op, r.target.value, c) for r, c in s.redirects] == [(">", "f", None)]
    s = parse("cd x && ls > f")
    r, c = s.redirects[0]
    assert c is None and sorted(len(h) for h in r.cwd) == [0, 1]  # in either directory
    s = parse("{ cat; } < in")
    assert s.commands[0].stdin == "file"
    assert parse("{ a; } > f x").problems == ["words after a redirection of a compound command"]
    assert parse("(a) > f x").problems == ["words after a redirection of a compound command"]
    assert parse("{ a; } > f").problems == []
    s = parse("> f")
    assert [(c.words, [r.target.value for r in c.redirects]) for c in s.commands] == [([], ["f"])]
    assert [c is s.commands[0] for _, c in s.redirects] == [True]


def test_problems_and_second_readings() -> None:
    assert parse("ls").problems == []
    assert parse("echo 'unfinished").problems[0].startswith("the command is not valid bash")
    assert parse("ls <&-").problems == ["a redirection without a target ('<&-')"]
    deep = "echo " + "$(echo " * 120 + "x" + ")" * 120
    assert "the command is nested too deeply to check" in parse(deep).problems
    assert parse("echo " + "$(echo " * 10 + "x" + ")" * 10).problems == []
    assert _words("r\\\nm -rf x") == [["r", "m", "-rf", "x"], ["rm", "-rf", "x"]]
    assert ["rm", "x"] in _words("coproc { rm x; }") and ["rm", "y"] in _words("coproc NAME ( rm y )")
    s = parse("f() { ls; }\\\n; g")
    assert "f" in s.functions
    assert parse("rm x").commands[0].source == "rm x" and parse("é; rm x").commands[1].source == "rm x"


# -- classify -----------------------------------------------------------------------------------

S, O, Un, Dg = "safe", "ordinary", "unknown", "dangerous"
# (command, level, the reasons at that level): each read off the program's rule in classify.
VERDICTS: list[tuple[str, str, list[str]]] = [
    ("rm x", O, []), ("rm -f x", Dg, ["forced delete"]), ("rm -rf x", Dg, ["recursive delete", "forced delete"]),
    ("rm --recursive x", Dg, ["recursive delete"]), ("rm --force x", Dg, ["forced delete"]),
    ("rm -R x", Dg, ["recursive delete"]), ("rm -- -f", O, []), ("rm -- *.txt", O, []),
    ("rm --no-preserve-root /", Dg, ["delete without root protection", "deletes outside the workspace (/)",
                                     "names a path outside the workspace (/)"]),
    ("rm $X", Un, ["rm with arguments the shell computes ($X), which may be options", "deletes a computed path ($X)"]),
    ("rm *.txt", Un, ["rm *.txt: the pattern may match file names that read as options"]),
    ("chmod 644 src/app.py", O, []), ("chmod -R 755 src", Dg, ["recursive permission or owner change"]),
    ("chown --recursive me src", Dg, ["recursive permission or owner change"]),
    ("find . -delete", Dg, ["find -delete removes files"]),
    ("find . -name x -fprint /etc/out", Dg, ["writes outside the workspace (/etc/out)",
                                             "names a path outside the workspace (/etc/out)"]),
    ("find . -exec rm {} \\;", Un, ["rm with arguments the shell computes ({}), which may be options",
                                    "deletes a computed path ({})"]),
    ("kill 123", O, []), ("kill -l", O, []),
    ("kill -1", O, []),  # -1 alone is the signal (SIGHUP) with no process: bash refuses it
    ("kill -9 -123", Dg, ["kills a whole process group"]), ("kill -- -5", Dg, ["kills a whole process group"]),
    ("kill -s TERM -1", Dg, ["kills every process it can (kill -1)"]), ("kill $P", Un, ["kill of a computed process ($P)"]),
    ("systemctl status x", O, []), ("service nginx status", O, []),
    ("systemctl restart x", Dg, ["systemctl: changes system services"]),
    ("systemctl $A", Un, ["systemctl with a computed action"]),
    ("init 0", Dg, ["init: stops the machine"]), ("sysctl a", O, []), ("sysctl -w a=1", Dg, ["changes kernel settings"]),
    ("curl http://a", O, []),
    ("curl -o /etc/x http://a", Dg, ["writes outside the workspace (/etc/x)", "names a path outside the workspace (/etc/x)"]),
    ("wget -O /etc/x http://a", Dg, ["writes outside the workspace (/etc/x)", "names a path outside the workspace (/etc/x)"]),
    ("tar xf a.tar -C /etc", Dg, ["extracts into outside the workspace (/etc)", "names a path outside the workspace (/etc)"]),
    ("tar -cf /etc/a.tar src", Dg, ["writes outside the workspace (/etc/a.tar)",
                                    "names a path outside the workspace (/etc/a.tar)"]),
    ("tar --use-compress-program=x -xf a", Un, ["tar runs a program given in its options"]),
    ("unzip a.zip -d /etc", Dg, ["extracts into outside the workspace (/etc)", "names a path outside the workspace (/etc)"]),
    ("sed -i s/a/b/ /etc/f", Dg, ["edits outside the workspace (/etc/f)", "names a path outside the workspace (/etc/f)"]),
    # With -f, f is a file to read, not a script to check.
    ("sed -f s f", Un, ["sed runs a script from a file, which is not checked"]),
    ("sed 'e ls' f", Un, ["the sed script may run commands or write files (e, w, r ...)"]),
    ("set -e", S, []), ("shopt -s extglob", S, []), ("hash", S, []),
    ("hash -r", Un, ["hash changes which programs later names run"]),
    ("alias ls=rm", Un, ["alias changes which programs later names run"]),
    ("sudo ls", Dg, ["sudo: runs as another user"]), ("env -i ls", S, []),
    ("timeout 5 rm -rf x", Dg, ["recursive delete", "forced delete"]),
    ("xargs rm -f", Dg, ["forced delete",
                         "rm with arguments the shell computes (<arguments read from standard input>), which may be options",
                         "deletes a computed path (<arguments read from standard input>)"]),
    ("nice -n 5 git push --force", Dg, ["force-push or remote delete"]),
    ("git push --force-with-lease", Dg, ["force-push or remote delete"]),
    ("git push origin +main", Dg, ["force-push or remote delete (+refspec or :ref)"]),
    ("git push origin :main", Dg, ["force-push or remote delete (+refspec or :ref)"]),
    ("git reset --hard", Dg, ["discards uncommitted work (git reset --hard)"]),
    ("git clean -fd", Dg, ["deletes untracked files (git clean -f)"]),
    ("git checkout -- .", Dg, ["discards uncommitted changes (git checkout of paths)"]),
    ("git checkout -f main", Dg, ["discards uncommitted changes (git checkout of paths)"]),
    ("git switch -C x", Dg, ["discards changes or resets a branch (git switch --force / -C)"]),
    ("git branch -D x", Dg, ["deletes or overwrites a branch (git branch -D/-M/-C/-f)"]),
    ("git stash drop", Dg, ["git stash drop loses stashed work"]), ("git stash clear", Dg, ["git stash clear loses stashed work"]),
    ("crontab -l", O, []), ("crontab -e", Dg, ["crontab: changes scheduled jobs"]),
    ("shutdown now", Dg, ["shutdown: stops the machine"]),
    ("dd if=a of=/dev/sda", Dg, ["writes a device (/dev/sda)"]), ("dd if=$X of=b", Un, ["dd with computed operands"]),
    ("mkfs.ext4 /dev/sda1", Dg, ["mkfs.ext4: writes to disks", "names a path outside the workspace (/dev/sda1)"]),
    ("cp a /etc/", Dg, ["writes outside the workspace (/etc)", "names a path outside the workspace (/etc)"]),
    ("mv a /etc/b", Dg, ["moves outside the workspace (/etc/b)", "names a path outside the workspace (/etc/b)"]),
    ("ln -s a /etc/b", Dg, ["writes outside the workspace (/etc/b)", "names a path outside the workspace (/etc/b)"]),
    ("rsync -a --delete src/ dst/", Dg, ["rsync --delete removes files"]),
    ("tee /etc/x", Dg, ["writes outside the workspace (/etc/x)", "names a path outside the workspace (/etc/x)"]),
    ("touch /etc/x", Dg, ["writes outside the workspace (/etc/x)", "names a path outside the workspace (/etc/x)"]),
    ("echo x > .git/config", Dg, ["writes inside .git (.git/config)"]),
    ("ls > /dev/null", S, []),
    ("nsenter -t 1 ls", Un, ["nsenter changes the process's namespaces or privileges"]),
]
# Ordinary, but no "always" can cover them (the reason says why).
UNCOVERABLE = [("set -a", "set changes how the shell runs what follows"),
               ("shopt -s expand_aliases", "shopt changes how the shell reads what follows"),
               ("docker run x", "docker asks a service outside the sandbox to run things"),
               ("rsync -e ssh a b:c", "rsync runs a remote shell command"),
               ("ssh-keygen -f k", "ssh-keygen touches keys or secrets")]


@pytest.mark.parametrize("command,level,reasons", VERDICTS, ids=[c for c, _, _ in VERDICTS])
def test_classify_verdict(ws, command, level, reasons) -> None:
    a = analyze(command, ws.root)
    assert (classify.LEVELS[a.level], a.reasons(a.level) if a.level > ORDINARY else []) == (level, reasons)
    if level in (S, O):
        assert [s.reasons for s in a.steps] == [[] for _ in a.steps]
        assert all(s.prefix is not None and s.coverable for s in a.steps)


@pytest.mark.parametrize("command,why", UNCOVERABLE, ids=[c for c, _ in UNCOVERABLE])
def test_classify_uncoverable(ws, command, why) -> None:
    a = analyze(command, ws.root)
    assert a.level == ORDINARY and [(s.reasons, s.prefix, s.coverable) for s in a.steps] == [([why], None, False)]


def test_classify_writes_next_to_the_workspace(ws) -> None:
    a = analyze("echo x >> ../out", ws.root)
    assert (a.level, a.reasons(DANGEROUS)) == (DANGEROUS, [f"writes outside the workspace ({ws.root.parent / 'out'})"])
    a = analyze("echo x > notes.txt", ws.root)
    assert a.level == SAFE and a.steps[0].writes and a.writes_workspace is True


def test_no_always_covers_a_read_through_a_symlink_below_the_workspace(ws, tmp_path) -> None:
    # Bug fixed here: only a symlink as the path's first component was looked through, and a
    # pattern matching a symlink that leads out was only mentioned, so "always cat" let
    # `cat src/lnk` (and `cat src/*`) read outside the workspace unasked.
    os.symlink(tmp_path / "outside" / "key", ws.root / "src" / "lnk")
    lnk = Path(os.path.realpath(ws.root)) / "src" / "lnk"
    pol = _pol("ask", always={("shell", "cat")})
    for command in ("cat src/lnk", "cd src && cat lnk"):
        req = pol.request(BASH, {"command": command}, ws)
        assert (req.kind, req.reason, req.scope, req.grants) == (
            "shell", f"runs a shell command (names a path outside the workspace ({lnk}))", None, ()), command
    req = pol.request(BASH, {"command": "cat src/*"}, ws)
    assert (req.kind, req.reason, req.scope, req.grants) == (
        "shell", f"runs a shell command (reads outside the workspace ({lnk}))", None, ())
    assert pol.request(BASH, {"command": "cat src/app.py"}, ws) is None  # the rule still covers the workspace
    assert _pol("auto-edit").request(BASH, {"command": "cat src/*"}, ws).scope is None
