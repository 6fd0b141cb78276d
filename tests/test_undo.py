"""/undo: the journal of the agent's file tools (tools/undo.py), written through the real tools
and policy: steps undone newest first, the user's own edits kept, nothing lost when an undo fails
halfway or is interrupted, git commits per step, and what the agent's front ends say."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from ds4agent.tools import Policy, Workspace, all_tools, run_tool
from ds4agent.tools import undo as undo_mod
from ds4agent.tools.undo import Journal, UndoError


@pytest.fixture()
def ws(tmp_path) -> Workspace:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.py").write_text("one\ntwo\nthree\nfour\nfive\nsix\nseven\n")
    w = Workspace(root)
    w.journal = Journal.for_workspace(root, tmp_path / "undo")
    return w


TOOLS = all_tools()


def tool(ws: Workspace, name: str, **args) -> None:
    r, decision = run_tool(TOOLS, name, json.dumps(args), ws, Policy("yolo"), None)
    assert r.ok, r.text


def step(ws: Workspace, task: str, *calls: tuple) -> None:
    ws.journal.begin(task)
    for name, args in calls:
        tool(ws, name, **args)
    ws.journal.end()


def test_undo_reverts_the_last_step_then_the_one_before(ws) -> None:
    a, root = ws.root / "a.py", ws.root
    original = a.read_text()
    step(ws, "first", ("edit", {"path": "a.py", "old": "two", "new": "TWO"}))
    step(ws, "second", ("edit", {"path": "a.py", "old": "six", "new": "SIX"}),
         ("write", {"path": "pkg/sub/new.py", "content": "x = 1\n"}))
    assert [s.task for s in ws.journal.steps()] == ["first", "second"]
    [r] = ws.journal.undo(1)
    assert r.step.task == "second" and r.reverted == ["a.py"] and r.removed == ["pkg/sub/new.py"]
    assert "TWO" in a.read_text() and "SIX" not in a.read_text()
    assert not (root / "pkg").exists()  # the directories the step created went with it
    [r] = ws.journal.undo(1)
    assert r.step.task == "first" and a.read_text() == original
    with pytest.raises(UndoError, match="nothing to undo"):
        ws.journal.undo(1)


def test_undo_n_and_a_later_process(ws, tmp_path) -> None:
    for n in range(3):
        step(ws, f"step {n}", ("write", {"path": f"f{n}.txt", "content": f"{n}\n"}))
    again = Journal.for_workspace(ws.root, tmp_path / "undo")  # `ds4 agent --undo` in a new process
    reports = again.undo(2)
    assert [r.step.task for r in reports] == ["step 2", "step 1"]
    assert sorted(p.name for p in ws.root.iterdir()) == ["a.py", "f0.txt"]


def test_the_users_own_edits_are_kept(ws) -> None:
    a = ws.root / "a.py"
    step(ws, "agent", ("edit", {"path": "a.py", "old": "two", "new": "TWO"}))
    a.write_text(a.read_text().replace("six", "six (mine)"))  # by hand, elsewhere in the file
    [r] = ws.journal.undo(1)
    assert r.merged == ["a.py"] and a.read_text() == "one\ntwo\nthree\nfour\nfive\nsix (mine)\nseven\n"
    step(ws, "agent again", ("edit", {"path": "a.py", "old": "four", "new": "FOUR"}))
    a.write_text(a.read_text().replace("FOUR", "FOUR and more"))  # by hand, over the agent's change
    before = a.read_text()
    [r] = ws.journal.undo(1)
    assert r.kept and "changed since, where the agent changed it" in r.kept[0] and a.read_text() == before
    step(ws, "create", ("write", {"path": "c.txt", "content": "agent\n"}))
    (ws.root / "c.txt").write_text("agent\nand me\n")
    [r] = ws.journal.undo(1)
    assert "kept" in r.kept[0] and (ws.root / "c.txt").read_text() == "agent\nand me\n"


def test_a_failure_halfway_puts_back_what_was_written(ws, monkeypatch) -> None:
    step(ws, "two files", ("write", {"path": "x.txt", "content": "x2\n"}), ("edit", {"path": "a.py", "old": "one", "new": "ONE"}))
    (ws.root / "x.txt").write_text("x2\n")
    before = {p.name: p.read_text() for p in ws.root.iterdir()}
    real = undo_mod.Journal._apply
    calls = []

    def failing(self, item, sha):
        calls.append(item["path"])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, item, sha)

    monkeypatch.setattr(undo_mod.Journal, "_apply", failing)
    with pytest.raises(UndoError, match="nothing was changed"):
        ws.journal.undo(1)
    assert {p.name: p.read_text() for p in ws.root.iterdir()} == before
    monkeypatch.setattr(undo_mod.Journal, "_apply", real)
    [r] = ws.journal.undo(1)  # the step is still there to undo
    assert sorted(r.reverted + r.removed) == ["a.py", "x.txt"]


def test_an_interrupted_undo_is_completed_by_the_next(ws, monkeypatch) -> None:
    step(ws, "two files", ("edit", {"path": "a.py", "old": "one", "new": "ONE"}), ("write", {"path": "b.txt", "content": "b\n"}))
    real = undo_mod.Journal._apply
    calls = []

    def crash(self, item, sha):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between two files
        return real(self, item, sha)

    monkeypatch.setattr(undo_mod.Journal, "_apply", crash)
    with pytest.raises(KeyboardInterrupt):
        ws.journal.undo(1)
    monkeypatch.setattr(undo_mod.Journal, "_apply", real)
    [r] = Journal(ws.root, ws.journal.dir).undo(1)
    assert r.resumed and (ws.root / "a.py").read_text().startswith("one\n") and not (ws.root / "b.txt").exists()


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def test_git_commit_per_step_and_undo_removes_it(ws, monkeypatch) -> None:
    from ds4agent.ui.agent_ui import after_step
    from ds4agent.ui.terminal import Out

    root = ws.root
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "add", "a.py")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    (root / "notes.txt").write_text("the user's, uncommitted\n")
    ws.journal.begin("make it loud")
    tool(ws, "edit", path="a.py", old="one", new="ONE")

    class FakeAgent:  # after_step reads only these
        last_step = ws.journal.end()

    FakeAgent.ws = ws
    out = io.StringIO()
    for k, v in (("GIT_AUTHOR_NAME", "t"), ("GIT_AUTHOR_EMAIL", "t@t"), ("GIT_COMMITTER_NAME", "t"),
                 ("GIT_COMMITTER_EMAIL", "t@t")):
        monkeypatch.setenv(k, v)
    after_step(FakeAgent, Out(out, tty=False), "ask", lambda q, keys: "n")  # asked, declined
    assert "committed" not in out.getvalue() and _git(root, "log", "--oneline").count("\n") == 1
    after_step(FakeAgent, Out(out, tty=False), "auto", None)
    assert "committed" in out.getvalue() and "/undo reverts this step" in out.getvalue()
    log = _git(root, "log", "--format=%s")
    assert log.splitlines()[0] == "ds4 agent: make it loud"
    assert _git(root, "show", "--name-only", "--format=", "HEAD").split() == ["a.py"]  # only the step's files
    [r] = ws.journal.undo(1)
    assert "was removed" in r.git and _git(root, "log", "--format=%s").splitlines() == ["init"]
    assert (root / "a.py").read_text().startswith("one\n") and (root / "notes.txt").exists()
    assert _git(root, "status", "--porcelain").split() == ["??", "notes.txt"]


def test_the_front_ends_say_what_undo_did(ws, tmp_path, monkeypatch) -> None:
    from ds4agent.ui.agent_ui import run_undo
    from ds4agent.ui.terminal import Out

    monkeypatch.setenv("DS4_HOME", str(tmp_path / "home"))
    from ds4agent import settings

    ws.journal = Journal.for_workspace(ws.root, settings.undo_dir())
    step(ws, "add a file", ("write", {"path": "n.txt", "content": "n\n"}))
    out = io.StringIO()
    assert run_undo(ws, 0, Out(out, tty=False)) == 0 and "add a file" in out.getvalue()  # --undo 0 lists
    assert run_undo(ws, 1, Out(out, tty=False)) == 0
    assert "undid step 1 (add a file): removed n.txt (created by the step)" in out.getvalue()
    err = io.StringIO()
    assert run_undo(ws, 1, Out(io.StringIO(), tty=False, err=err)) == 1 and "nothing to undo" in err.getvalue()
