"""The agent's tools: files, search, shell, outline; and the policy that gates them (parsed
shell commands, scoped approvals, the OS sandbox)."""

from __future__ import annotations

from .base import Tool, ToolError, ToolResult, Workspace
from .files import TOOLS as _FILES
from .outline import TOOLS as _OUTLINE
from .policy import MODES, SANDBOX_MODES, Approver, Policy, Request, run_tool
from .search import TOOLS as _SEARCH
from .shell import TOOLS as _SHELL


def all_tools() -> dict[str, Tool]:
    return {t.name: t for t in (*_FILES, *_SEARCH, *_SHELL, *_OUTLINE)}


__all__ = ["MODES", "SANDBOX_MODES", "Approver", "Policy", "Request", "Tool", "ToolError", "ToolResult", "Workspace",
           "all_tools", "run_tool"]
