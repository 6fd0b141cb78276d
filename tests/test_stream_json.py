"""`ds4 agent -p --output-format stream-json | json`: every line parsed on its own and checked
against the shapes Claude Code documents for `claude -p --output-format stream-json` (the SDK's
message types: system/init, assistant, user with tool_result blocks, result), so that scripts
written for Claude Code read ds4 agent's runs. The model's answers are dictated; the template,
parser, tools and policy are the real ones."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from test_agent import EOS, Script, call

from ds4agent.conversation.agent import Agent
from ds4agent.engine import Engine
from ds4agent.sessions import SessionStore
from ds4agent.tools import Policy, Workspace
from ds4agent.ui.agent_ui import EXIT_CODES, run_headless

STR, INT, BOOL, LIST, DICT = str, int, bool, list, dict
# The documented fields of each message type (name: type; a tuple: one of these values).
INIT = {"type": ("system",), "subtype": ("init",), "session_id": STR, "uuid": STR, "cwd": STR, "tools": LIST,
        "mcp_servers": LIST, "model": STR, "permissionMode": ("default", "acceptEdits", "bypassPermissions", "plan"),
        "slash_commands": LIST, "apiKeySource": STR}
ASSISTANT = {"type": ("assistant",), "session_id": STR, "uuid": STR, "message": DICT, "parent_tool_use_id": (None,)}
MESSAGE = {"id": STR, "type": ("message",), "role": ("assistant",), "model": STR, "content": LIST,
           "stop_reason": ("end_turn", "max_tokens", "tool_use", "stop_sequence", "model_context_window_exceeded", None),
           "stop_sequence": (None,), "usage": DICT}
USAGE = {"input_tokens": INT, "output_tokens": INT, "cache_read_input_tokens": INT, "cache_creation_input_tokens": INT}
USER = {"type": ("user",), "session_id": STR, "uuid": STR, "message": DICT, "parent_tool_use_id": (None,)}
RESULT = {"type": ("result",), "subtype": ("success", "error_max_turns", "error_during_execution"), "is_error": BOOL,
          "duration_ms": INT, "duration_api_ms": INT, "num_turns": INT, "result": STR, "session_id": STR, "uuid": STR,
          "total_cost_usd": (int, float), "usage": DICT, "permission_denials": LIST}
BLOCKS = {"text": {"type": STR, "text": STR}, "thinking": {"type": STR, "thinking": STR, "signature": STR},
          "tool_use": {"type": STR, "id": STR, "name": STR, "input": DICT}}
TOOL_RESULT = {"type": ("tool_result",), "tool_use_id": STR, "content": STR, "is_error": BOOL}


def check(obj: dict, shape: dict, what: str) -> None:
    for key, want in shape.items():
        assert key in obj, f"{what}: no '{key}' in {obj}"
        value = obj[key]
        if isinstance(want, tuple) and not all(isinstance(w, type) for w in want):
            assert value in want, f"{what}.{key} = {value!r}, not one of {want}"
        else:
            assert isinstance(value, want) and not (want is INT and isinstance(value, bool)), f"{what}.{key}: {value!r}"


def parse_stream(text: str) -> list[dict]:
    """Each line alone is one JSON object of a documented type; tool_result ids answer earlier
    tool_use blocks; the session id is the same on every line; init first, result last."""
    lines = [json.loads(line) for line in text.splitlines()]  # one object per line, nothing else
    assert lines and lines[0].get("subtype") == "init" and lines[-1]["type"] == "result"
    uses: list[str] = []
    for i, d in enumerate(lines):
        assert d["session_id"] == lines[0]["session_id"]
        if d["type"] == "system" and d["subtype"] == "init":
            check(d, INIT, "init")
            assert i == 0 and all(isinstance(t, str) for t in d["tools"])
            for s in d["mcp_servers"]:
                assert set(s) == {"name", "status"} and s["status"] in ("connected", "failed", "pending")
        elif d["type"] == "assistant":
            check(d, ASSISTANT, "assistant")
            check(d["message"], MESSAGE, "assistant.message")
            check(d["message"]["usage"], USAGE, "assistant.message.usage")
            for b in d["message"]["content"]:
                assert b["type"] in BLOCKS, b
                check(b, BLOCKS[b["type"]], f"block {b['type']}")
                if b["type"] == "tool_use":
                    uses.append(b["id"])
            has_use = any(b["type"] == "tool_use" for b in d["message"]["content"])
            assert (d["message"]["stop_reason"] == "tool_use") == has_use
        elif d["type"] == "user":
            check(d, USER, "user")
            assert d["message"]["role"] == "user"
            for b in d["message"]["content"]:
                check(b, TOOL_RESULT, "tool_result")
                assert b["tool_use_id"] in uses, "a tool_result answers a tool_use sent before it"
        elif d["type"] == "result":
            check(d, RESULT, "result")
            check(d["usage"], USAGE, "result.usage")
            assert i == len(lines) - 1
            assert d["is_error"] == (d["subtype"] != "success")
        else:
            assert d["type"] == "system" and d["subtype"] == "compact_boundary", d
    assert len(set(d["uuid"] for d in lines)) == len(lines)
    return lines


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=8192) as e:
        yield e


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> SessionStore:
    return SessionStore(tmp_path_factory.mktemp("syscache"))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sj") / "repo"  # one root: the system prompt (it names it) is prefilled once


@pytest.fixture()
def ws(root, cache) -> Workspace:
    root.mkdir(exist_ok=True)
    for p in root.iterdir():
        p.unlink()
    (root / "app.py").write_text("def main():\n    return 1\n")
    w = Workspace(root)
    w.cache = cache  # type: ignore[attr-defined]
    return w


def _run(engine, ws, mode: str, answers: list[str], fmt: str, task: str = "task") -> tuple[int, str, str]:
    agent = Agent(engine, ws, Policy(mode), None, max_tokens=400)
    agent.prime(ws.cache)
    Script(agent, answers)
    out, err = io.StringIO(), io.StringIO()
    code = run_headless(agent, task, fmt, out, err)
    return code, out.getvalue(), err.getvalue()


def test_stream_json_lines_have_claude_codes_shapes(engine, ws) -> None:
    answers = ["look first</think>" + call("read", path="app.py"),
               "now edit</think>" + call("edit", path="app.py", old="return 1", new="return 2"),
               "done</think>It returns **2** now." + EOS]
    code, out, err = _run(engine, ws, "yolo", answers, "stream-json")
    assert code == 0, err
    lines = parse_stream(out)
    assert [d["type"] for d in lines] == ["system", "assistant", "user", "assistant", "user", "assistant", "result"]
    first = lines[1]["message"]["content"]
    assert first[0] == {"type": "thinking", "thinking": "look first", "signature": ""}
    assert first[1]["name"] == "read" and first[1]["input"] == {"path": "app.py"}
    assert "def main()" in lines[2]["message"]["content"][0]["content"]
    assert lines[2]["message"]["content"][0]["tool_use_id"] == first[1]["id"]
    assert lines[-2]["message"]["content"][-1] == {"type": "text", "text": "It returns **2** now."}
    assert lines[-2]["message"]["stop_reason"] == "end_turn"
    result = lines[-1]
    assert result["subtype"] == "success" and result["result"] == "It returns **2** now."
    assert result["stop_reason"] == "end_turn" and result["num_turns"] == 3
    # usage adds up the turns' own counts: what was prefilled, read from the cache and generated
    turns = [d["message"]["usage"] for d in lines if d["type"] == "assistant"]
    for k in ("input_tokens", "output_tokens", "cache_read_input_tokens"):
        assert result["usage"][k] == sum(u[k] for u in turns) > 0
    assert "read" in lines[0]["tools"] and lines[0]["permissionMode"] == "bypassPermissions"
    assert (ws.root / "app.py").read_text() == "def main():\n    return 2\n"


def test_refusals_are_permission_denials_and_json_is_the_result_alone(engine, ws) -> None:
    answers = ["write it</think>" + call("write", path="new.py", content="x = 1\n"), "ok</think>Could not." + EOS]
    code, out, err = _run(engine, ws, "ask", answers, "json")
    assert code == EXIT_CODES["refused"]
    assert len(out.splitlines()) == 1  # json: one object, the result
    result = json.loads(out)
    check(result, RESULT, "result")
    denial = result["permission_denials"]
    assert len(denial) == 1 and denial[0]["tool_name"] == "write" and denial[0]["tool_input"]["path"] == "new.py"
    assert denial[0]["tool_use_id"].startswith("toolu_")
    assert result["result"] == "Could not." and not (ws.root / "new.py").exists()
    # the same run as stream-json: the refused call's tool_result is an error
    code, out, err = _run(engine, ws, "ask", list(answers), "stream-json")
    lines = parse_stream(out)
    tr = [b for d in lines if d["type"] == "user" for b in d["message"]["content"]]
    assert len(tr) == 1 and tr[0]["is_error"] and "not run" in tr[0]["content"]


def test_a_run_cut_by_the_token_limit_is_reported_as_such(engine, ws) -> None:
    code, out, err = _run(engine, ws, "yolo", ["still thinking"], "stream-json")
    assert code == EXIT_CODES["max_tokens"]
    lines = parse_stream(out)
    assert lines[-2]["message"]["stop_reason"] == "max_tokens"
    assert lines[-1]["stop_reason"] == "max_tokens" and lines[-1]["ds4_stop_reason"] == "max_tokens"
    assert "token limit" in err  # ds4's own words go to stderr, never between the JSON lines


def test_cli_output_format_flags(tmp_path) -> None:
    """The flags' usage errors through the real command (a full CLI run is in test_mcp.py)."""
    import os
    import sys

    env = {**os.environ, "DS4_HOME": str(tmp_path / "home")}
    base = [sys.executable, "-m", "ds4agent", "agent"]
    r = subprocess.run(base + ["--output-format", "json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "needs a task (-p)" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base + ["-p", "x", "--json", "--output-format", "stream-json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--json is --output-format events" in r.stderr
    r = subprocess.run(base + ["--undo", "--prompt", "x"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "takes no task" in r.stderr
