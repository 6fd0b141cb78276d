"""What `ds4 agent` sets up around the Agent before the first request: its settings (the user's
~/.ds4agent/config.toml and the workspace's .ds4agent.toml), the undo journal, the project
instruction files, and the MCP servers (started here, stopped by ``close``).

No terminal of its own: the one question it may ask (may this workspace's MCP server start?)
goes through the ``ask_key`` it is given; headless there is none, and a project server the
user has not allowed before does not start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import settings
from ..tools import Workspace
from ..tools.mcp import McpConfigError, McpHub, ServerConfig, ServerStatus, merge_servers, parse_servers, trust, trusted
from ..tools.undo import Journal
from .instructions import Instructions

GIT_COMMIT = ("off", "ask", "auto")  # commit each step that changed files: never, after asking, always


class SetupError(ValueError):
    """A settings file the agent cannot use; one line naming the file and the key."""


@dataclass
class AgentSetup:
    git_commit: str = "off"
    servers: list[ServerConfig] = field(default_factory=list)
    hub: McpHub | None = None
    status: list[ServerStatus] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # project servers not allowed: one line each
    instructions: Instructions | None = None

    def tools(self) -> list:
        return self.hub.tools() if self.hub is not None else []

    def mcp_summary(self) -> list[tuple[str, bool]]:
        """(name, started) of each configured server, for stream-json's init line."""
        return [(s.name, s.ok) for s in self.status] + [(line.split(" ", 1)[0], False) for line in self.skipped]

    def close(self) -> None:
        """Stop the MCP servers (their processes end with the agent)."""
        if self.hub is not None:
            self.hub.close()
            self.hub = None


def read_agent_settings(root: Path) -> tuple[str, list[ServerConfig]]:
    """git_commit and the MCP servers, from the user's file and the workspace's (which wins)."""
    user_path, ws_path = settings.config_path(), Path(root) / settings.WORKSPACE_CONFIG
    try:
        user = settings.read_settings(user_path, settings.CONFIG_KEYS)
        project = settings.read_settings(ws_path, settings.WORKSPACE_KEYS)
        servers = merge_servers(parse_servers(user, user_path, False, Path(root)),
                                parse_servers(project, ws_path, True, Path(root)))
    except (settings.SettingsError, McpConfigError) as e:
        raise SetupError(str(e)) from None
    git_commit = "off"
    for path, data in ((user_path, user), (ws_path, project)):
        if "git_commit" in data:
            value = data["git_commit"]
            if value not in GIT_COMMIT:
                raise SetupError(f"{path}: git_commit must be one of {', '.join(GIT_COMMIT)} (found {value!r})")
            git_commit = value
    return git_commit, servers


def allowed_servers(servers: list[ServerConfig], root: Path, ask_key: Callable[[str, str], str] | None,
                    say: Callable[[str], None]) -> tuple[list[ServerConfig], list[str]]:
    """The servers that may start: the user's own, and the workspace's that the user allowed
    (before, with "always", or now). Cloning a repository must not be enough to run a program."""
    trust_file = settings.mcp_trust_file()
    known = trusted(trust_file)
    ok, skipped = [], []
    for s in servers:
        if not s.project or s.fingerprint(root) in known:
            ok.append(s)
            continue
        if ask_key is None:
            skipped.append(f"{s.name} (from {s.source}: not started; allow it once in an interactive ds4 agent)")
            continue
        say(f"the workspace's {settings.WORKSPACE_CONFIG} asks to start the MCP server '{s.name}': {s.command_line()}")
        question = "  Start it? y yes, this time · a always for this command · n no "
        key = ask_key(question, "yna")
        say(question + "→ " + {"y": "yes", "a": "always"}.get(key, "no"))  # the question is erased when answered
        if key == "a":
            trust(trust_file, s, root)
        if key in ("y", "a"):
            ok.append(s)
        else:
            skipped.append(f"{s.name} (from {s.source}: not allowed)")
    return ok, skipped


def set_up(ws: Workspace, start: Path | None = None, ask_key: Callable[[str, str], str] | None = None,
           say: Callable[[str], None] = lambda s: None, undo: bool = True) -> AgentSetup:
    """Read the settings, open the undo journal and the instruction files, start the servers."""
    git_commit, servers = read_agent_settings(ws.root)
    setup = AgentSetup(git_commit=git_commit, servers=servers)
    if undo:
        ws.journal = Journal.for_workspace(ws.root, settings.undo_dir())
    setup.instructions = Instructions(ws.root, start or Path(os.getcwd()), settings.user_instructions_dir())
    ok, setup.skipped = allowed_servers(servers, ws.root, ask_key, say)
    if ok:
        setup.hub = McpHub(settings.logs_dir())
        setup.status = setup.hub.start(ok)
    return setup
