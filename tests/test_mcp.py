"""MCP: the agent's client (tools/mcp.py on the mcp SDK) against a real stdio server process
(tests/mcp_server.py), the settings that configure servers, the trust a workspace's server
needs, the approval policy its tools go through, and the whole path through `ds4 agent -p`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ds4agent.tools import Policy, Workspace, run_tool
from ds4agent.tools.base import ToolError
from ds4agent.tools.mcp import McpConfigError, McpHub, ServerConfig, parse_servers

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def _server(name: str = "calc", env: dict | None = None, **kw) -> ServerConfig:
    return ServerConfig(name, sys.executable, [SERVER], env=env or {}, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp")
    env = {"MCP_TEST_PIDFILE": str(d / "pid"), "MCP_TEST_DIR": str(d), "PATH": os.environ.get("PATH", "")}
    h = McpHub(d / "logs")
    status = h.start([_server(env=env), _server("broken", {**env, "MCP_TEST_MODE": "crash", "MCP_TEST_PIDFILE": ""}),
                      ServerConfig("missing", "/nonexistent/mcp-server")])
    h.dir = d  # type: ignore[attr-defined]
    h.pid = int((d / "pid").read_text())  # type: ignore[attr-defined]
    assert [s.ok for s in status] == [True, False, False]
    yield h
    h.close()


def test_tools_listed_beside_the_built_ins_and_called(hub) -> None:
    names = [t.name for t in hub.tools()]
    assert names == ["mcp__calc__add", "mcp__calc__shout", "mcp__calc__fail", "mcp__calc__slow", "mcp__calc__touch",
                     "mcp__calc__exit_now"]
    add = next(t for t in hub.tools() if t.name == "mcp__calc__add")
    assert add.kind == "mcp" and "Add two integers." in add.description
    assert add.schema()["function"]["parameters"]["properties"].keys() >= {"a", "b"}  # the server's own schema
    r = hub.call("calc", "add", {"a": 2, "b": 40})
    assert r.ok and r.text == "42" and r.output == "42"
    r = hub.call("calc", "fail", {"why": "bad day"})
    assert not r.ok and r.text.startswith("error: ") and "fail" in r.text  # the SDK server keeps its reason to itself
    # what the server wrote on stderr is in its log, never on the terminal
    assert "test server starting" in (hub.dir / "logs" / "mcp-calc.log").read_text()


def test_failed_servers_say_why(hub) -> None:
    by = {s.name: s for s in hub.status}
    assert by["missing"].error == "/nonexistent/mcp-server: command not found"
    assert not by["broken"].ok and by["broken"].error and "mcp-broken.log" in by["broken"].error
    assert "failed" in by["broken"].line()
    with pytest.raises(ToolError, match="'broken' stopped"):
        hub.call("broken", "add", {"a": 1, "b": 1})


def test_calls_go_through_the_same_policy(hub) -> None:
    tools = {t.name: t for t in hub.tools()}
    ws = Workspace(hub.dir)
    target = hub.dir / "made"
    args = json.dumps({"name": "made"})
    # auto-edit lets edits run, but an MCP tool can do anything its server can: it asks
    asked = []
    r, decision = run_tool(tools, "mcp__calc__touch", args, ws, Policy("auto-edit"), lambda req: asked.append(req) or "no")
    assert decision == "refused" and not target.exists()
    assert asked[0].kind == "mcp" and '"name": "made"' in asked[0].preview  # the arguments are shown before asking
    r, decision = run_tool(tools, "mcp__calc__touch", args, ws, Policy("ask"), None)  # headless: no one to ask
    assert decision == "refused" and not target.exists()
    pol = Policy("ask")
    r, decision = run_tool(tools, "mcp__calc__touch", args, ws, pol, lambda req: "always")
    assert decision == "always" and target.exists() and r.ok
    r, decision = run_tool(tools, "mcp__calc__add", '{"a": 1, "b": 2}', ws, pol, None)
    assert decision == "refused"  # "always" was for that one tool only
    r, decision = run_tool(tools, "mcp__calc__shout", '{"text": "hi"}', ws, Policy("yolo"), None)
    assert decision == "auto" and r.text == "HI"


def test_a_call_is_stopped_by_the_user(hub) -> None:
    import threading

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    r = hub.call("calc", "slow", {"seconds": 30}, stop)
    assert not r.ok and "stopped by the user" in r.text and time.monotonic() - started < 5


def test_a_server_that_dies_mid_session_and_close_stops_the_process(tmp_path) -> None:
    env = {"MCP_TEST_PIDFILE": str(tmp_path / "pid"), "PATH": os.environ.get("PATH", "")}
    h = McpHub(tmp_path / "logs")
    assert h.start([_server(env=env)])[0].ok
    with pytest.raises(ToolError, match="'calc'"):
        h.call("calc", "exit_now", {})
    with pytest.raises(ToolError, match="'calc' stopped"):
        h.call("calc", "add", {"a": 1, "b": 1})
    h.close()
    h2 = McpHub(tmp_path / "logs2")
    assert h2.start([_server(env=env)])[0].ok
    pid = int((tmp_path / "pid").read_text())
    assert _alive(pid)
    h2.close()
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), "the server process outlived the agent"


def test_a_server_that_never_answers_times_out(tmp_path) -> None:
    h = McpHub(tmp_path / "logs")
    started = time.monotonic()
    st = h.start([_server(env={"MCP_TEST_MODE": "hang", "PATH": os.environ.get("PATH", "")}, startup_timeout=1.0)])[0]
    h.close(timeout=3)
    assert not st.ok and "1 s" in st.error and time.monotonic() - started < 20


def test_configuration_and_workspace_trust(tmp_path, monkeypatch) -> None:
    from ds4agent.conversation.agent_setup import SetupError, allowed_servers, read_agent_settings

    home, root = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    root.mkdir()
    monkeypatch.setenv("DS4_HOME", str(home))
    (home / "config.toml").write_text(f'[mcp_servers.mine]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n'
                                      '[mcp_servers.off]\ncommand = "x"\nenabled = false\n')
    (root / ".ds4agent.toml").write_text('git_commit = "auto"\n[mcp_servers.proj]\ncommand = "proj-server"\n'
                                         'args = ["--x"]\nenv = { A = "1" }\n')
    git_commit, servers = read_agent_settings(root)
    assert git_commit == "auto" and [(s.name, s.project) for s in servers] == [("mine", False), ("proj", True)]
    said: list[str] = []
    ok, skipped = allowed_servers(servers, root, None, said.append)  # headless: a project server needs trust
    assert [s.name for s in ok] == ["mine"] and "proj" in skipped[0]
    ok, skipped = allowed_servers(servers, root, lambda q, k: "n", said.append)
    assert [s.name for s in ok] == ["mine"] and "proj-server --x" in said[0]
    ok, _ = allowed_servers(servers, root, lambda q, k: "a", said.append)  # allowed, and remembered
    assert [s.name for s in ok] == ["mine", "proj"]
    ok, _ = allowed_servers(servers, root, None, said.append)
    assert [s.name for s in ok] == ["mine", "proj"]
    # a changed command line is a different program: asked again
    (root / ".ds4agent.toml").write_text('[mcp_servers.proj]\ncommand = "proj-server"\nargs = ["--evil"]\n')
    _, servers = read_agent_settings(root)
    ok, skipped = allowed_servers(servers, root, None, said.append)
    assert [s.name for s in ok] == ["mine"]
    for bad, why in [('[mcp_servers.x]\nargs = ["a"]\n', "'command'"), ('[mcp_servers.x]\ncommand = "a"\nurl = "http://h"\n',
                     "only stdio"), ('[mcp_servers.x]\ncommand = "a"\nargz = []\n', "unknown key 'argz'"),
                     ('git_commit = "always"\n', "git_commit must be one of")]:
        (root / ".ds4agent.toml").write_text(bad)
        with pytest.raises(SetupError, match=why):
            read_agent_settings(root)
    with pytest.raises(McpConfigError, match="a server name"):
        parse_servers({"mcp_servers": {"a b": {"command": "x"}}}, Path("f"), False, root)


def test_headless_agent_uses_an_mcp_tool_through_the_cli(demo_path, tmp_path) -> None:
    """The whole path: config.toml names the server, `ds4 agent -p` starts it, the model calls its
    tool (stream-json shows it), and the server process is gone when the command returns."""
    from test_agent import EOS, call

    home, root = tmp_path / "home", tmp_path / "w"
    home.mkdir()
    root.mkdir()
    pidfile = tmp_path / "pid"
    (home / "config.toml").write_text(f'[mcp_servers.calc]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n'
                                      f'env = {{ MCP_TEST_PIDFILE = "{pidfile}" }}\n')
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(["add</think>" + call("mcp__calc__add", a=20, b=22), "ok</think>It is 42." + EOS]))
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(home), "DS4_SESSIONS": str(tmp_path / "s")}
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("agent_script.py")), str(answers), "agent",
                        "--ctx", "4096", "--approval", "yolo", "-p", "add", "--output-format", "stream-json"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[0]["mcp_servers"] == [{"name": "calc", "status": "connected"}]
    assert "mcp__calc__add" in lines[0]["tools"] and "read" in lines[0]["tools"]
    use = lines[1]["message"]["content"][-1]
    assert use["type"] == "tool_use" and use["name"] == "mcp__calc__add" and use["input"] == {"a": 20, "b": 22}
    assert lines[2]["message"]["content"][0]["content"] == "42"
    assert lines[-1]["result"] == "It is 42."
    assert not _alive(int(pidfile.read_text()))
