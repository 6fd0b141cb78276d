"""What every agent tool shares: the workspace it acts in, its result shape, its errors.

A tool returns a ToolResult: ``text`` goes back to the model (inside the official
``<tool_result>`` block), ``summary`` is the one line the user sees, ``detail`` is optional extra
for the user (a coloured diff). Errors the model can fix (a missing file, a stale edit) are
results with ``ok=False`` and a message that says what to do next, never exceptions.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class ToolResult:
    text: str
    summary: str
    ok: bool = True
    detail: str = ""


class ToolError(Exception):
    """Raised inside a tool; turned into ToolResult(ok=False) by the dispatcher."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    run: Callable[..., ToolResult]
    kind: str = "read"  # read | edit | shell: what approval it needs

    def schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def git_root(start: Path) -> Path | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=start, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


@dataclass
class Workspace:
    """The directory the agent works in: the git root, or the current directory."""

    root: Path
    # What the model was last shown of each file: path -> (mtime_ns, size, text). Line edits are
    # only accepted against an unchanged file the model has read.
    seen: dict[str, tuple[int, int, str]] = field(default_factory=dict)

    @classmethod
    def discover(cls, cwd: str | os.PathLike[str] | None = None) -> "Workspace":
        here = Path(cwd or os.getcwd()).resolve()
        return cls(git_root(here) or here)

    def resolve(self, path: str) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ToolError("a path is required")
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = self.root / p
        return Path(os.path.normpath(p))

    def rel(self, p: Path) -> str:
        try:
            return str(p.relative_to(self.root)) or "."
        except ValueError:
            return str(p)

    def escapes(self, p: Path) -> str | None:
        """Why ``p`` needs approval: outside the workspace, a symlink leading outside, or inside
        .git; None when it is an ordinary workspace path."""
        root = self.root.resolve()
        try:
            p.relative_to(self.root)
        except ValueError:
            return "outside the workspace"
        real = Path(os.path.realpath(p))
        try:
            rel = real.relative_to(root)
        except ValueError:
            return "a symlink that leads outside the workspace"
        if rel.parts and rel.parts[0] == ".git":
            return "inside .git"
        return None

    def remember(self, p: Path, text: str) -> None:
        st = p.stat()
        self.seen[str(p)] = (st.st_mtime_ns, st.st_size, text)


def arg(args: dict[str, Any], name: str, kind: type, default: Any = None, required: bool = False) -> Any:
    if name not in args or args[name] is None:
        if required:
            raise ToolError(f"missing required parameter '{name}'")
        return default
    value = args[name]
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ToolError(f"parameter '{name}' must be {kind.__name__}, got {type(value).__name__}")
    return value
