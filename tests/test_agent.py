"""The agent loop with a scripted engine: real template, streaming parser, transcript and KV;
only the sampling is replaced by a script of completions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import scripted_steps

from ds4agent.conversation import agent as agent_mod
from ds4agent.conversation.agent import Agent
from ds4agent.engine import Engine
from ds4agent.sessions import SessionStore
from ds4agent.tools import Policy, Workspace

EOS = "<｜end▁of▁sentence｜>"


def call(name: str, **params) -> str:
    body = "\n".join(f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{v}</｜DSML｜parameter>'
                     for k, v in params.items())
    return f'\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="{name}">\n{body}\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>{EOS}'


class Script:
    """Replaces sampling with fixed completions, one per model turn."""

    def __init__(self, agent: Agent, completions: list[str], interrupt_at: tuple[int, int] | None = None) -> None:
        self.agent, self.completions, self.turn, self.interrupt_at = agent, list(completions), 0, interrupt_at
        self._install()

    def _install(self) -> None:
        self.agent.conv.session.generate = self.generate

    def generate(self, params, max_tokens=50000, stop_at_eos=True):
        turn, self.turn = self.turn, self.turn + 1
        at = self.interrupt_at[1] if self.interrupt_at and self.interrupt_at[0] == turn else None
        yield from scripted_steps(self.agent.conv.tok, self.completions.pop(0), max_tokens, interrupt_at=at)


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=8192) as e:
        yield e


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("agent") / "repo"
    (root / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "AGENTS.md").write_text("Always run pytest.\n")
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> SessionStore:
    """The system prompt's KV, prefilled once for the module (the workspace root is fixed)."""
    return SessionStore(tmp_path_factory.mktemp("syscache"))


@pytest.fixture()
def ws(repo: Path) -> Workspace:
    (repo / "src" / "app.py").write_text("def main():\n    return 1\n")
    return Workspace(repo)


def _consistent(agent: Agent) -> None:
    conv = agent.conv
    assert conv.tok.decode(conv.transcript.tokens) == conv.transcript.text
    live = conv.session.tokens
    assert conv.transcript.tokens[: len(live)] == live


_CACHE: list[SessionStore] = []


def _make(engine, ws, mode="yolo", approve=None) -> Agent:
    a = Agent(engine, ws, Policy(mode), approve, max_tokens=400)
    if _CACHE:
        a.prime(_CACHE[0])
    return a


@pytest.fixture(autouse=True)
def _use_cache(cache):
    _CACHE[:] = [cache]
    yield


def test_tool_round_trip(engine, ws) -> None:
    a = _make(engine, ws)
    Script(a, ["Let me look.</think>" + call("read", path="src/app.py"),
               "It returns 1.</think>`main` returns 1." + EOS])
    events = list(a.run("What does main return?"))
    kinds = [e.kind for e in events]
    assert "tool" in kinds and kinds[-1] == "done"
    tool = next(e for e in events if e.kind == "tool")
    assert tool.text == "read src/app.py (whole file)" and tool.ok
    text = a.conv.transcript.text
    assert "<tool_result>1\tdef main():\n2\t    return 1\n[lines 1-2 of 2; end of file]</tool_result>" in text
    assert "Always run pytest." in text  # AGENTS.md in the system prompt
    assert a.conv.messages[-1]["content"] == "`main` returns 1."
    _consistent(a)


def test_malformed_dsml_is_reported_and_retried(engine, ws) -> None:
    a = _make(engine, ws)
    bad = ('oops</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read">\n'
           '<｜DSML｜parameter name="path">src/app.py</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>' + EOS)
    Script(a, [bad, "again</think>" + call("read", path="src/app.py"), "ok</think>Done." + EOS])
    events = list(a.run("read it"))
    kinds = [e.kind for e in events]
    assert kinds.index("error") < kinds.index("tool") and kinds[-1] == "done"
    assert "could not be parsed" in a.conv.transcript.text
    _consistent(a)


@pytest.mark.parametrize("mode,answer,expect", [
    ("ask", "yes", "tool"), ("ask", "no", "refused"), ("auto-edit", None, "tool"), ("yolo", None, "tool"),
])
def test_edit_approvals_by_mode(engine, ws, mode, answer, expect) -> None:
    asked = []

    def approve(req):
        asked.append(req)
        return answer

    a = _make(engine, ws, mode, approve if answer else None)
    Script(a, ["edit</think>" + call("edit", path="src/app.py", old="return 1", new="return 2"), "ok</think>Done." + EOS])
    events = list(a.run("make main return 2"))
    assert any(e.kind == expect for e in events)
    changed = "return 2" in (ws.root / "src" / "app.py").read_text()
    assert changed == (expect == "tool")
    assert bool(asked) == (mode == "ask")
    if expect == "refused":
        assert "the user declined" in a.conv.transcript.text


def test_headless_refuses_shell_without_a_mode(engine, ws) -> None:
    a = _make(engine, ws, "auto-edit", None)
    Script(a, ["run</think>" + call("bash", command="touch made-by-the-model"), "ok</think>Could not run it." + EOS])
    events = list(a.run("run echo"))
    assert any(e.kind == "refused" for e in events)
    assert "no one can approve it in this mode" in a.conv.transcript.text


def test_repeat_guard(engine, ws) -> None:
    a = _make(engine, ws)
    same = call("read", path="src/app.py")
    Script(a, ["r</think>" + same, "r</think>" + same, "ok</think>Done." + EOS])
    events = list(a.run("read twice"))
    assert [e.kind for e in events].count("tool") == 1
    assert any(e.kind == "refused" and "repeated" in e.text for e in events)
    assert "do not repeat it" in a.conv.transcript.text


def test_interrupt_keeps_transcript_consistent(engine, ws) -> None:
    a = _make(engine, ws)
    Script(a, ["I will read.</think>" + call("read", path="src/app.py")], interrupt_at=(0, 5))
    with pytest.raises(KeyboardInterrupt):
        list(a.run("read"))
    assert a.conv.interrupted() == "kept"
    _consistent(a)
    Script(a, ["ok</think>Fine." + EOS])
    assert [e.kind for e in a.run("continue")][-1] == "done"
    _consistent(a)


def test_compaction(engine, ws, monkeypatch) -> None:
    a = _make(engine, ws)
    for n in range(3):  # earlier exchanges, long enough that a summary is shorter than them
        Script(a, ["ok</think>" + f"Answer {n}: " + "a long explanation " * 60 + EOS])
        list(a.run(f"question {n}"))
    monkeypatch.setattr(agent_mod, "COMPACT_AT", 0.0)  # compact before every step
    # Before step 1 the conversation is compacted (the summary is a model turn of its own);
    # step 1 calls a tool; before step 2 the now short conversation cannot be made shorter
    # (that summary is refused and nothing changes); step 2 answers.
    Script(a, ["summarising</think>Three answers were long explanations." + EOS,
               "look</think>" + call("read", path="src/app.py"),
               "summarising</think>Answers were explanations; read src/app.py: main returns 1, "
               "and much more detail than the conversation itself holds. " * 8 + EOS,
               "ok</think>Done." + EOS])
    events = list(a.run("what does main return?"))
    kinds = [e.kind for e in events if e.kind in ("compacted", "compact_failed", "tool", "done")]
    assert kinds == ["compacted", "tool", "compact_failed", "done"]
    assert "not shorter" in next(e.text for e in events if e.kind == "compact_failed")
    assert "Three answers" in next(e.text for e in events if e.kind == "compacted")
    text = a.conv.transcript.text
    assert "Summary of the work so far:" in text and text.count("<｜User｜>") <= 6
    _consistent(a)


@pytest.mark.parametrize("summary, why", [("only reasoning</think>" + EOS, "no summary"),
                                          ("thinking and thinking", "token limit"),
                                          ("</think>  \n" + EOS, "no summary")])
def test_compaction_without_a_summary_changes_nothing(engine, ws, summary, why) -> None:
    """An empty summary, or one cut off by the token limit, leaves the conversation (and its
    KV) exactly as it was, and says so. (The conversation is long enough that any summary
    would be shorter: the refusal is for the summary's sake.)"""
    a = _make(engine, ws)
    for n in range(3):
        Script(a, ["ok</think>" + f"Answer {n}: " + "a long explanation " * 60 + EOS])
        list(a.run(f"question {n}"))
    Script(a, ["look</think>" + call("read", path="src/app.py"), "ok</think>main returns 1." + EOS])
    list(a.run("what does main return?"))
    a.conv.sync_for_save()
    before = (list(a.conv.transcript.tokens), list(a.conv.messages), a.conv.session.snapshot())
    Script(a, [summary])
    events = list(a.compact())
    assert [e.kind for e in events] == ["compact_failed"] and "unchanged" in events[0].text and why in events[0].text
    assert (a.conv.transcript.tokens, a.conv.messages, a.conv.session.snapshot()) == before
    _consistent(a)
    Script(a, ["ok</think>Still here." + EOS])
    assert [e.kind for e in a.run("go on")][-1] == "done"


def test_compaction_stopped_by_the_user_changes_nothing(engine, ws) -> None:
    a = _make(engine, ws)
    Script(a, ["ok</think>main returns 1." + EOS])
    list(a.run("what does main return?"))
    before = list(a.conv.transcript.tokens)
    script = Script(a, ["summary so far: main returns 1 and more text follows" + EOS])
    real = script.generate

    def stopping(*args, **kw):
        for i, step in enumerate(real(*args, **kw)):
            if i == 3:
                a.conv.stop.set()
            yield step

    a.conv.session.generate = stopping
    events = list(a.compact())
    assert events[-1].kind == "compact_failed" and "interrupted" in events[-1].text
    assert a.conv.transcript.tokens == before
    _consistent(a)


def test_mentions_attach_files(engine, ws) -> None:
    a = _make(engine, ws)
    Script(a, ["ok</think>Seen." + EOS])
    events = list(a.run("explain @src/app.py please"))
    assert any(e.kind == "attached" and e.text == "src/app.py" for e in events)
    assert "Content of src/app.py:\n```\ndef main():" in a.conv.transcript.text


def test_system_prompt_kv_is_cached(engine, ws, tmp_path) -> None:
    store = SessionStore(tmp_path / "sessions")
    _CACHE.clear()
    a = _make(engine, ws)
    assert a.prime(store) > 1000  # the first time the system prompt is prefilled
    b = _make(engine, ws)
    assert b.prime(store) == 0  # then loaded from the store
    assert np.array_equal(a.conv.session.logits, b.conv.session.logits)
    Script(b, ["ok</think>Hi." + EOS])
    list(b.run("hello"))
    b.conv.sync_for_save()
    store.save(b.conv.session, "agent-session")  # a longer session must not evict the system cache
    assert len(store.list()) == 2
    before = b.conv.session.tokens
    b.new_conversation()  # back to the system prompt without prefill
    assert len(b.conv.session.tokens) < len(before) and b.conv.session.tokens == b.conv.transcript.tokens


# -- end to end on the demo model (plumbing only: the demo's words are noise) ---------------------

def _env(demo_path, tmp_path):
    import os

    return {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path / "home"),
            "DS4_SESSIONS": str(tmp_path / "sessions"), "TERM": "xterm-256color"}


def test_headless_end_to_end(demo_path, repo, tmp_path) -> None:
    import json
    import sys

    env = _env(demo_path, tmp_path)
    base = [sys.executable, "-m", "ds4agent", "agent", "--ctx", "4096", "-n", "8", "--temp", "0"]
    r = subprocess.run(base + ["-p", "hello", "--json"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    # -n 8 cuts the demo's noise off in the middle of its reasoning: not a finished answer.
    assert r.returncode == 3, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[-1]["type"] == "done" and events[-1]["stop_reason"] == "max_tokens"
    assert "token limit" in events[-1]["text"] and any(e["type"] == "reasoning" for e in events)
    r = subprocess.run(base + ["-p", "hello again", "--nothink"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 3 and "ds4: stopped: the model reached the token limit (8 per turn, -n)" in r.stderr
    assert "\x1b[" not in r.stdout
    r = subprocess.run(base + ["--resume"], cwd=repo, env=env, capture_output=True, text=True, timeout=600, input="")
    assert r.returncode == 2 and "needs a terminal" in r.stderr


def test_interactive_end_to_end(demo_path, repo, tmp_path) -> None:
    """Starts, answers, saves, starts anew, switches back, exits cleanly, in a real pty."""
    import re
    import sys

    import pexpect  # the test extra: missing means a broken install, not a skip
    env = _env(demo_path, tmp_path)
    child = pexpect.spawn(sys.executable, ["-m", "ds4agent", "agent", "--ctx", "4096", "-n", "6", "--temp", "0"],
                          cwd=str(repo), env=env, encoding="utf-8", timeout=300, dimensions=(40, 140))
    try:
        child.expect("ds4 agent>")
        assert "approvals: ask" in child.before
        child.send("hello\r")
        child.expect("ds4 agent>")
        child.send("/save\r")
        child.expect(r"saved ([0-9a-f]{12})")
        sha = child.match.group(1)
        child.expect("ds4 agent>")
        child.send("/new\r")
        child.expect("no prefill")
        child.expect("ds4 agent>")
        child.send(f"/switch {sha}\r")
        child.expect("resumed")
        child.expect("ds4 agent>")
        child.send("/approval yolo\r")
        child.expect("approval mode: yolo")
        child.expect("ds4 agent>")
        child.sendcontrol("d")
        index = child.expect([re.escape("[Y/n]"), pexpect.EOF])
        if index == 0:
            child.send("n\r")
            child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_tty_approver_answers_and_rendering(tmp_path) -> None:
    """One key per answer (y, n, a, Esc), and what the call would do is shown before the key."""
    import io

    from ds4agent.tools import Request
    from ds4agent.ui.agent_ui import tty_approver
    from ds4agent.ui.terminal import Out, color_diff

    out = Out(io.StringIO(), tty=False)
    asked: list[tuple[str, str, str]] = []  # (question, keys offered, what was on screen when asked)
    answers = iter(["y", "n", "a", "escape", "a", "v", "n"])

    def ask(q: str, keys: str) -> str:
        asked.append((q, keys, out.stream.getvalue()))
        return next(answers)

    approve = tty_approver(out, ask)
    diff = "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-    return 1\n+    return 2\n"
    edit = Request("edit", "edit src/app.py", "changes a file", "edit", scope="file edits inside the workspace",
                   grants=(("edit",),), preview=diff)
    shell = Request("bash", "$ pytest -x", "runs a shell command", "shell", scope="commands starting with `pytest`",
                    grants=(("shell", "pytest"),), details=("in /work/repo", "sandbox: workspace-write"))
    danger = Request("bash", "$ rm -rf /", "dangerous command (recursive delete)", "dangerous")
    assert [approve(edit), approve(edit)] == ["yes", "no"]
    q, keys, screen = asked[0]
    assert keys == "yna" and "+    return 2" in screen and "-    return 1" in screen  # the diff, before the key
    assert approve(shell) == "always"  # one key: the scope was on screen before it was pressed
    q, keys, screen = asked[-1]
    assert "always allow commands starting with `pytest`" in screen and "in /work/repo" in screen
    assert "sandbox: workspace-write" in screen
    assert approve(shell) == "no"  # Esc
    assert approve(danger) == "no"  # "a" is not offered: never "always"
    assert asked[-1][1] == "yn" and "a always" not in asked[-1][0]
    long = Request("edit", "write big.py", "changes a file", "edit", scope="file edits inside the workspace",
                   grants=(("edit",),), preview="".join(f"+line {i}\n" for i in range(300)))
    assert approve(long) == "no"  # v shows the rest, then n
    assert "v" in asked[-2][1] and "+line 299" not in asked[-2][2] and "+line 299" in asked[-1][2]
    text = out.stream.getvalue()
    assert "→ yes" in text and "→ always (commands starting with `pytest`)" in text and "→ no" in text
    colored = color_diff("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n")
    assert "\x1b[31m-old" in colored and "\x1b[32m+new" in colored


# -- why a run stopped (headless stop_reason and exit status) ------------------------------------

def _stop(events) -> str:
    assert events[-1].kind == "done", [e.kind for e in events]
    assert [e.kind for e in events].count("done") == 1
    return events[-1].stop


def test_stop_reasons(engine, ws, monkeypatch) -> None:
    a = _make(engine, ws)
    Script(a, ["ok</think>Done." + EOS])
    assert _stop(list(a.run("hi"))) == "end_turn"
    # Cut off by -n while reasoning: the last step's finish is "length", not an end of turn.
    Script(a, ["still thinking about it"])
    events = list(a.run("think"))
    assert _stop(events) == "max_tokens" and a.conv.messages[-1]["role"] == "assistant"
    # Cut off inside a tool block: the limit, not a malformed call to be written again.
    Script(a, ['x</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read">\n<｜DSML｜parameter name="pa'])
    events = list(a.run("read"))
    assert _stop(events) == "max_tokens" and "could not be parsed" not in a.conv.transcript.text
    _consistent(a)


def test_stop_reason_refused_and_error(engine, ws, monkeypatch) -> None:
    a = _make(engine, ws, "auto-edit", None)
    Script(a, ["run</think>" + call("bash", command="touch made-by-the-model"), "ok</think>Could not run it." + EOS])
    assert _stop(list(a.run("run echo"))) == "refused"
    Script(a, ["ok</think>Fine." + EOS])
    assert _stop(list(a.run("again"))) == "end_turn"  # a refusal counts for its own run only
    monkeypatch.setattr(agent_mod, "MAX_STEPS", 1)
    b = _make(engine, ws)
    Script(b, ["r</think>" + call("read", path="src/app.py")])
    events = list(b.run("loop"))
    assert _stop(events) == "error" and any(e.kind == "error" and "tool steps" in e.text for e in events)


def test_stop_reason_context(engine, ws) -> None:
    a = _make(engine, ws)
    events = list(a.run("word " * 9000))  # more than the 8192-token context: never reaches the model
    assert _stop(events) == "context" and any(e.kind == "error" and "does not fit" in e.text for e in events)
    _consistent(a)


def test_done_event_json_names_the_stop_reason() -> None:
    import json

    from ds4agent.conversation import Event, event_json

    assert json.loads(event_json(Event("done", stop="max_tokens"))) == {"type": "done", "stop_reason": "max_tokens"}


@pytest.mark.parametrize("completion,code,fragment", [
    ("thinking hard</think>The answer is 42." + EOS, 0, ""),
    ("thinking and thinking", 3, "token limit"),
])
def test_headless_plain_output_and_exit_status(engine, ws, completion, code, fragment) -> None:
    import io

    from ds4agent.ui.agent_ui import EXIT_CODES, run_headless

    a = _make(engine, ws)
    Script(a, [completion])
    out, err = io.StringIO(), io.StringIO()
    assert run_headless(a, "question", False, out, err) == code
    if code == 0:
        assert "The answer is 42." in out.getvalue() and "thinking hard" not in out.getvalue()
    else:
        assert fragment in err.getvalue() and "-n" in err.getvalue()
    assert EXIT_CODES == {"end_turn": 0, "error": 1, "max_tokens": 3, "context": 4, "refused": 5, "interrupted": 130}


# -- @mentions that are not attached say why ------------------------------------------------------

def test_mentions_that_cannot_be_attached_say_why(tmp_path) -> None:
    from ds4agent.conversation.agent import MENTION_MAX, attach_mentions

    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "big.txt").write_text("x" * (MENTION_MAX + 50))
    (tmp_path / "secret.txt").write_text("s3cret")
    ws = Workspace(root)

    def notes(message: str) -> list[str]:
        return attach_mentions(message, ws)[2]

    assert notes("look at @nosuchfile") == ["@nosuchfile: no such file in the workspace; not attached"]
    assert "outside the workspace" in notes("compare with @../secret.txt")[0]
    assert "s3cret" not in attach_mentions("compare with @../secret.txt", ws)[0]
    assert "is a directory" in notes("everything in @src")[0]
    assert "not a text file" in notes("what is @logo.png")[0]
    assert "not UTF-8" in notes("fix @latin1.txt")[0]
    assert "too long" in notes("@" + "a" * 300)[0]  # the OS refuses the name: a note, not an OSError
    text, attached, found = attach_mentions("summarise @big.txt", ws)
    assert attached == ["big.txt"] and len(found) == 1 and f"first {MENTION_MAX} characters" in found[0]
    assert "[truncated:" in text
    # Not meant as files: e-mail addresses, code (decorators, npm scopes) in backticks.
    assert notes("mail me@example.com, use `@property` or\n```\n@app.route('/')\n```\n") == []
    # A sentence may end right after the path.
    text, attached, found = attach_mentions("Explain @src/app.py.", ws)
    assert attached == ["src/app.py"] and found == [] and "def main()" in text
    # Each file once, whatever the spelling.
    assert attach_mentions("@src/app.py and @./src/app.py", ws)[1] == ["src/app.py"]


def test_mention_notes_reach_the_user(engine, ws) -> None:
    a = _make(engine, ws)
    Script(a, ["ok</think>Seen." + EOS])
    events = list(a.run("explain @nosuchfile please"))
    assert any(e.kind == "note" and "@nosuchfile: no such file" in e.text for e in events)


# -- chat and agent sessions in one store: each kind is shown and said ----------------------------

def test_session_kinds_are_saved_listed_and_said(engine, ws, tmp_path) -> None:
    import io
    from types import SimpleNamespace

    from ds4agent.conversation.turns import Conversation
    from ds4agent.ui.agent_ui import AgentCommands, pick_session, resume
    from ds4agent.ui.commands import ChatCommands
    from ds4agent.ui.terminal import ID_CHARS, Out

    store = SessionStore(tmp_path / "sessions")
    out = Out(io.StringIO(), tty=False)
    # An agent session, saved from the agent.
    a = _make(engine, ws)
    Script(a, ["ok</think>Agent answer." + EOS])
    list(a.run("agent task"))
    AgentCommands(a, store, out, lambda q: False).save()
    # A chat session, saved from the chat.
    conv = Conversation(engine, mode="chat", max_tokens=50)
    Script(SimpleNamespace(conv=conv), ["Chat answer." + EOS])
    list(conv.turn("chat question"))
    chat = ChatCommands(conv, store, out, lambda q: False)
    chat.save()
    kinds = {i.title: i.reason for i in store.list()}
    assert kinds["agent task"] == "agent-session" and kinds["chat question"] == "continued"
    by_title = {i.title: i.sha for i in store.list()}

    out.stream = io.StringIO()
    chat.cmd_list("")
    listing = out.stream.getvalue()
    assert ID_CHARS == 12
    for title, sha in by_title.items():
        line = next(ln for ln in listing.splitlines() if title in ln)
        assert line.split()[0] == sha[:ID_CHARS] and line.split()[1] == ("agent" if "agent" in title else "chat")
    out.stream = io.StringIO()
    pick_session(store, None, out)
    picker = out.stream.getvalue()
    for title, sha in by_title.items():
        line = next(ln for ln in picker.splitlines() if title in ln)
        assert sha[:ID_CHARS] + " " in line and ("agent" if "agent" in title else "chat") in line.split()

    # The chat session resumed in the agent: said, and the agent's prompt and tools are back.
    b = _make(engine, ws)
    out.stream = io.StringIO()
    assert resume(b, store, by_title["chat question"], out)
    assert "resumed a chat session in the agent" in out.stream.getvalue() and "tools" in out.stream.getvalue()
    assert b.conv.tools and b.conv.messages[0]["role"] == "system" and b.conv.messages[0].get("tools")
    assert [m["content"] for m in b.conv.messages if m["role"] == "user"] == ["chat question"]
    assert b.conv.mode == "chat"  # the session's thinking mode is kept
    Script(b, ["Reading." + call("read", path="src/app.py"), "Read it." + EOS])
    assert any(e.kind == "tool" and e.ok for e in b.run("read the app"))
    _consistent(b)
    # An agent session resumed in the agent: nothing to say about kinds.
    out.stream = io.StringIO()
    assert resume(b, store, by_title["agent task"], out)
    assert "session in the agent" not in out.stream.getvalue()
    # The agent session switched to in the chat: said, its tools do not run there.
    out.stream = io.StringIO()
    chat.cmd_switch(by_title["agent task"][:ID_CHARS])
    said = out.stream.getvalue()
    assert "resumed an agent session in the chat" in said and f"ds4 agent --resume {by_title['agent task'][:ID_CHARS]}" in said


def test_approval_and_sandbox_commands_and_status_line(tmp_path) -> None:
    import io
    from types import SimpleNamespace

    from ds4agent.tools import Policy
    from ds4agent.ui.agent_ui import AgentCommands
    from ds4agent.ui.terminal import Out

    pol = Policy("auto-edit")
    pol.always.update({("shell", "pytest"), ("edit",)})
    out = Out(io.StringIO(), tty=False, err=io.StringIO())
    cmds = AgentCommands(SimpleNamespace(conv=None, policy=pol), None, out, ask=lambda q: False)
    cmds.run("/approval")
    text = out.err.getvalue()
    assert "approval mode is auto-edit" in text and "shell: pytest" in text and "file edits inside the workspace" in text
    cmds.run("/approval clear")
    assert not pol.always
    cmds.run("/sandbox read-only")
    assert pol.sandbox == "read-only" and pol.describe().startswith(("read-only", "read-only: no OS sandbox"))
    cmds.run("/sandbox nonsense")
    assert "choose one of read-only, workspace-write, full-access" in out.err.getvalue() and out.errors == 1
    cmds.run("/approval yolo")
    assert pol.mode == "yolo" and pol.sandbox == "read-only"  # a chosen sandbox stays chosen
    assert Policy("yolo").describe() == "full access"
