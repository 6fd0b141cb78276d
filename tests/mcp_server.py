"""A small MCP server (stdio) for the tests, on the mcp SDK's own server: what the agent's MCP
client is tested against. Its pid goes to $MCP_TEST_PIDFILE (so tests can see it stop), and
$MCP_TEST_MODE changes how it behaves: "crash" exits before answering, "hang" never answers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

mode = os.environ.get("MCP_TEST_MODE", "")
if os.environ.get("MCP_TEST_PIDFILE"):
    Path(os.environ["MCP_TEST_PIDFILE"]).write_text(str(os.getpid()))
print("test server starting", file=sys.stderr, flush=True)  # must land in the log, not the terminal
if mode == "crash":
    sys.exit(3)
if mode == "hang":
    time.sleep(3600)

from mcp.server.mcpserver import MCPServer  # noqa: E402

app = MCPServer("calc")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@app.tool()
def fail(why: str) -> str:
    """Always fails, saying why."""
    raise ValueError(f"refusing: {why}")


@app.tool()
def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    time.sleep(seconds)
    return "woke up"


@app.tool()
def touch(name: str) -> str:
    """Creates an empty file in $MCP_TEST_DIR (so a test can tell whether the call ran)."""
    Path(os.environ["MCP_TEST_DIR"], name).write_text("")
    return f"created {name}"


@app.tool()
def exit_now() -> str:
    """Ends the server at once (a crash in the middle of a session)."""
    os._exit(1)


if __name__ == "__main__":
    app.run("stdio")
