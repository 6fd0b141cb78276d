"""Tools from MCP servers (stdio), beside the built-in ones.

Servers are configured as ``[mcp_servers.NAME]`` tables (the layout Codex uses) in
``~/.ds4agent/config.toml`` or in the workspace's ``.ds4agent.toml``::

    [mcp_servers.files]
    command = "npx"
    args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
    env = { LOG_LEVEL = "warn" }

A server named in the workspace's file is the project's, not the user's: it starts only once the
user allowed it (asked at start on a terminal, remembered with "always"; never headless without
that), because cloning a repository must not be enough to run a program.

Each server runs as a child process for the life of the agent, driven through the ``mcp`` SDK on
one asyncio loop in a background thread (the agent itself is synchronous). Its tools appear to
the model as ``mcp__SERVER__TOOL`` with the server's own description and JSON schema; a call
goes through the same approval policy as every tool (kind "mcp": it asks outside yolo, with an
"always" for that one tool), can be stopped by the user (Esc, Ctrl+C) and has a time limit.
What a server writes on stderr goes to ``~/.ds4agent/logs/mcp-NAME.log``, never the terminal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .base import Tool, ToolError, ToolResult, Workspace
from .shell import cap_output

SERVER_KEYS = ("command", "args", "env", "cwd", "enabled", "startup_timeout_sec", "tool_timeout_sec",
               "enabled_tools", "disabled_tools")
STARTUP_TIMEOUT = 30.0  # seconds for a server to start and list its tools
TOOL_TIMEOUT = 120.0  # seconds for one call
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpConfigError(ValueError):
    """A wrong [mcp_servers] entry; one line naming the file and the key."""


@dataclass
class ServerConfig:
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    startup_timeout: float = STARTUP_TIMEOUT
    tool_timeout: float = TOOL_TIMEOUT
    enabled_tools: list[str] | None = None
    disabled_tools: list[str] = field(default_factory=list)
    source: str = ""  # the file it is configured in
    project: bool = False  # from the workspace's file: needs the user's permission to start

    def fingerprint(self, root: Path) -> str:
        """What the user allows when allowing a project's server: this workspace, this name,
        this exact command line, environment and directory."""
        what = [os.path.realpath(root), self.name, self.command, self.args, sorted(self.env.items()), self.cwd]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()

    def command_line(self) -> str:
        import shlex

        return " ".join(shlex.quote(w) for w in [self.command, *self.args])


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"{where} must be a list of strings")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise McpConfigError(f"{where} must be a number of seconds in (0, 3600]")
    return float(value)


def parse_servers(data: dict, source: Path, project: bool, root: Path) -> list[ServerConfig]:
    """The [mcp_servers] tables of one settings file (disabled ones left out)."""
    table = data.get("mcp_servers")
    if table is None:
        return []
    if not isinstance(table, dict):
        raise McpConfigError(f"{source}: mcp_servers must be a table of [mcp_servers.NAME] tables")
    out = []
    for name, entry in table.items():
        where = f"{source}: mcp_servers.{name}"
        if not isinstance(entry, dict):
            raise McpConfigError(f"{where} must be a table")
        if not _NAME.sub("", name) == name or not name:
            raise McpConfigError(f"{where}: a server name may hold only letters, digits, '-' and '_'")
        unknown = [k for k in entry if k not in SERVER_KEYS]
        if "url" in entry:
            raise McpConfigError(f"{where}: only stdio servers (command = ...) are supported, not url")
        if unknown:
            raise McpConfigError(f"{where}: unknown key '{unknown[0]}'; known keys: {', '.join(SERVER_KEYS)}")
        if not isinstance(entry.get("command"), str) or not entry["command"].strip():
            raise McpConfigError(f"{where}: 'command' (the program to start) is required")
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise McpConfigError(f"{where}.env must be a table of strings")
        enabled = entry.get("enabled", True)
        if not isinstance(enabled, bool):
            raise McpConfigError(f"{where}.enabled must be true or false")
        if not enabled:
            continue
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise McpConfigError(f"{where}.cwd must be a string")
        if cwd is not None:
            given = Path(cwd).expanduser()
            cwd = str(given if given.is_absolute() else root / given)
        out.append(ServerConfig(
            name, entry["command"], _strings(entry.get("args", []), f"{where}.args"), dict(env), cwd,
            _seconds(entry.get("startup_timeout_sec", STARTUP_TIMEOUT), f"{where}.startup_timeout_sec"),
            _seconds(entry.get("tool_timeout_sec", TOOL_TIMEOUT), f"{where}.tool_timeout_sec"),
            _strings(entry["enabled_tools"], f"{where}.enabled_tools") if "enabled_tools" in entry else None,
            _strings(entry.get("disabled_tools", []), f"{where}.disabled_tools"), str(source), project))
    return out


def merge_servers(user: list[ServerConfig], project: list[ServerConfig]) -> list[ServerConfig]:
    """The user's servers, and the workspace's (which replace a user server of the same name)."""
    names = {s.name for s in project}
    return [s for s in user if s.name not in names] + project


# -- which project servers the user allowed --------------------------------------------------------

def trusted(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def trust(path: Path, server: ServerConfig, root: Path) -> None:
    data = trusted(path)
    data[server.fingerprint(root)] = {"workspace": str(root), "server": server.name, "command": server.command_line(),
                                      "allowed": int(time.time())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


# -- the running servers -------------------------------------------------------------------------

@dataclass
class ServerStatus:
    name: str
    ok: bool
    tools: list[str] = field(default_factory=list)  # the model's names of its tools
    error: str = ""

    def line(self) -> str:
        if self.ok:
            return f"{self.name} ({len(self.tools)} tool{'s' if len(self.tools) != 1 else ''})"
        return f"{self.name} failed: {self.error}"


def tool_name(server: str, tool: str) -> str:
    return f"mcp__{server}__{_NAME.sub('_', tool)}"


def result_text(result: Any) -> str:
    """A CallToolResult as text for the model: text blocks as they are, other blocks named."""
    parts = []
    for c in result.content or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(c.text)
        elif kind in ("image", "audio"):
            size = len(c.data) * 3 // 4
            parts.append(f"[{kind} ({c.mime_type}, about {size} bytes): not shown; this model reads text only]")
        elif kind == "resource":
            r = c.resource
            parts.append(r.text if hasattr(r, "text") else f"[resource {r.uri}: binary content, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {c.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content: not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpHub:
    """The MCP servers of one agent: started together, stopped together (close)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.status: list[ServerStatus] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sessions: dict[str, Any] = {}
        self._closing: dict[str, asyncio.Event] = {}
        self._tasks: list[concurrent.futures.Future] = []
        self._configs: dict[str, ServerConfig] = {}
        self._gone: dict[str, str] = {}  # servers that stopped while the agent ran: why
        self._tools_of: dict[str, list] = {}  # the MCP tool objects each server listed

    # -- lifetime --------------------------------------------------------------------------------
    def start(self, servers: list[ServerConfig]) -> list[ServerStatus]:
        """Start every server at once and wait until each has listed its tools or failed."""
        if not servers:
            return []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ds4-mcp", daemon=True)
        self._thread.start()
        ready: dict[str, concurrent.futures.Future] = {}
        for cfg in servers:
            self._configs[cfg.name] = cfg
            ready[cfg.name] = concurrent.futures.Future()
            self._tasks.append(asyncio.run_coroutine_threadsafe(self._serve(cfg, ready[cfg.name]), self._loop))
        for cfg in servers:
            try:
                tools = ready[cfg.name].result(timeout=cfg.startup_timeout + 10)
                self.status.append(ServerStatus(cfg.name, True, [tool_name(cfg.name, t.name) for t in tools]))
                self._tools_of[cfg.name] = tools
            except concurrent.futures.TimeoutError:
                self.status.append(ServerStatus(cfg.name, False,
                                                error=f"did not start within {cfg.startup_timeout:g} s"))
            except Exception as e:  # noqa: BLE001 - whatever a server did, the agent goes on without it
                self.status.append(ServerStatus(cfg.name, False, error=_why(e, cfg, self._log(cfg.name))))
        return self.status

    def _log(self, name: str) -> Path:
        return self.log_dir / f"mcp-{name}.log"

    async def _serve(self, cfg: ServerConfig, ready: concurrent.futures.Future) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client
        from mcp.types import Implementation

        from .. import __version__

        closing = self._closing[cfg.name] = asyncio.Event()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._log(cfg.name), "a", encoding="utf-8")
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {cfg.command_line()}\n")
        log.flush()
        try:
            params = StdioServerParameters(command=cfg.command, args=cfg.args, env=cfg.env or None, cwd=cfg.cwd)
            async with stdio_client(params, errlog=log) as (read, write):
                async with ClientSession(read, write,
                                         client_info=Implementation(name="ds4agent", version=__version__)) as s:
                    await asyncio.wait_for(s.initialize(), cfg.startup_timeout)
                    tools = await asyncio.wait_for(self._list_tools(s), cfg.startup_timeout)
                    tools = [t for t in tools if (cfg.enabled_tools is None or t.name in cfg.enabled_tools)
                             and t.name not in cfg.disabled_tools]
                    self._sessions[cfg.name] = s
                    ready.set_result(tools)
                    await closing.wait()
        except BaseException as e:  # noqa: BLE001 - reported, never raised into the agent
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(type(e).__name__))
            elif not closing.is_set():
                self._gone[cfg.name] = _why(e, cfg, self._log(cfg.name))
            if not isinstance(e, Exception):
                raise
        finally:
            self._sessions.pop(cfg.name, None)
            log.close()

    @staticmethod
    async def _list_tools(session: Any) -> list:
        from mcp.types import PaginatedRequestParams

        tools, cursor = [], None
        for _ in range(100):  # a server that pages forever is cut off
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def close(self, timeout: float = 10.0) -> None:
        """Stop every server (its stdin is closed, then it is terminated) and the loop."""
        loop = self._loop
        if loop is None:
            return
        for ev in list(self._closing.values()):
            loop.call_soon_threadsafe(ev.set)
        deadline = time.monotonic() + timeout
        for task in self._tasks:
            try:
                task.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a server that failed is already reported
                task.cancel()
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
        self._loop = None

    # -- the tools -------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        out = []
        for st in self.status:
            if not st.ok:
                continue
            for t in self._tools_of[st.name]:
                name = tool_name(st.name, t.name)
                desc = (t.description or "").strip()
                desc = (desc + " " if desc else "") + f"(tool '{t.name}' of the MCP server '{st.name}')"
                schema = t.input_schema if isinstance(t.input_schema, dict) else {}
                if schema.get("type") != "object":
                    schema = {"type": "object", "properties": {}}
                out.append(Tool(name, desc, schema, self._runner(st.name, t.name), kind="mcp", strict=False))
        return out

    def _runner(self, server: str, tool: str) -> Callable[[Workspace, dict], ToolResult]:
        def run(ws: Workspace, args: dict) -> ToolResult:
            return self.call(server, tool, args, ws.stop)

        return run

    def call(self, server: str, tool: str, args: dict, stop: threading.Event | None = None) -> ToolResult:
        """One tool call, waited for while watching ``stop`` (the user stopping the agent)."""
        name = tool_name(server, tool)
        session = self._sessions.get(server)
        if session is None or self._loop is None:
            why = self._gone.get(server, "it is not running")
            raise ToolError(f"the MCP server '{server}' stopped ({why}); its tools are not available")
        limit = self._configs[server].tool_timeout
        fut = asyncio.run_coroutine_threadsafe(asyncio.wait_for(session.call_tool(tool, args), limit), self._loop)
        started = time.monotonic()
        while True:
            try:
                result = fut.result(timeout=0.1)
                break
            except concurrent.futures.TimeoutError:
                if stop is not None and stop.is_set():
                    fut.cancel()
                    return ToolResult(f"error: {name} was stopped by the user", f"{name}: stopped by the user",
                                      ok=False)
                if time.monotonic() - started > limit + 5:
                    fut.cancel()
                    raise ToolError(f"{name} gave no answer within {limit:g} s (tool_timeout_sec)") from None
            except asyncio.TimeoutError:
                raise ToolError(f"{name} gave no answer within {limit:g} s (tool_timeout_sec)") from None
            except Exception as e:  # noqa: BLE001 - the server's failure, for the model to read
                if "connection closed" in str(e).lower():  # the server process is gone
                    self._gone.setdefault(server, f"it exited; see {self._log(server)}")
                    self._sessions.pop(server, None)
                gone = self._gone.get(server)
                raise ToolError(f"the MCP server '{server}' failed: {gone or _short(e)}") from None
        text = result_text(result)
        elapsed = time.monotonic() - started
        failed = bool(result.is_error)
        body = cap_output(text, f"mcp-{server}-{time.monotonic_ns()}.log")
        return ToolResult(("error: " if failed else "") + (body or "(no output)"),
                          f"{name}  ({'error' if failed else 'done'}; {elapsed:.1f} s)", ok=not failed, output=text)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _why(e: BaseException, cfg: ServerConfig, log: Path) -> str:
    """One line on why a server did not start (the log has its own words)."""
    if isinstance(e, FileNotFoundError):
        return f"{cfg.command}: command not found"
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {cfg.startup_timeout:g} s (startup_timeout_sec); see {log}"
    if isinstance(e, OSError):
        return f"{cfg.command}: {e.strerror or e}"
    if isinstance(e, BaseExceptionGroup):  # anyio task groups wrap what went wrong
        inner = e.exceptions[0] if e.exceptions else e
        return _why(inner, cfg, log)
    return f"{_short(e)}; see {log}"
