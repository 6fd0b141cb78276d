"""What every agent tool shares: the workspace it acts in, its result shape, its errors.

A tool returns a ToolResult: ``text`` goes back to the model (inside the official
``<tool_result>`` block), ``summary`` is the one line the user sees, ``detail`` is optional extra
for the user (a coloured diff). Errors the model can fix (a missing file, a stale edit) are
results with ``ok=False`` and a message that says what to do next, never exceptions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class ToolResult:
    text: str
    summary: str
    ok: bool = True
    detail: str = ""
    blocked: str = ""  # shell commands: why the sandbox probably stopped it ("" when it did not)
    output: str = ""  # what a command (or an MCP tool) printed, whole, for the user to expand


class ToolError(Exception):
    """Raised inside a tool; turned into ToolResult(ok=False) by the dispatcher."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    run: Callable[..., ToolResult]
    kind: str = "read"  # read | edit | shell | mcp: what approval it needs
    # What the call would do, shown before the user approves it (edits: the diff, a new file:
    # its head and size). Raises ToolError when the call cannot succeed (no question is asked).
    preview: Callable[["Workspace", dict], str] | None = None
    # Arguments checked against ``parameters`` here (built-in tools); an MCP server checks its own.
    strict: bool = True

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
    # Set when the user stops the agent (the conversation's stop flag): a running shell
    # command is then killed instead of running on to its time limit.
    stop: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # Records what the file tools change, step by step, for /undo (tools/undo.py); None: not kept.
    journal: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def discover(cls, cwd: str | os.PathLike[str] | None = None) -> "Workspace":
        here = Path(cwd or os.getcwd()).resolve()
        return cls(git_root(here) or here)

    def resolve(self, path: str) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ToolError("a path is required")
        # What no file system path can hold is refused here, before the OS raises ValueError
        # (NUL) or UnicodeEncodeError (surrogates) from deep inside a tool.
        problem = path_problem(path)
        if problem:
            raise ToolError(f"the path {problem}")
        if len(path) > MAX_PATH:
            raise ToolError(f"the path is too long ({len(path)} characters; a path has at most {MAX_PATH})")
        if any(len(os.fsencode(part)) > MAX_NAME for part in path.split("/")):
            raise ToolError(f"file name too long in the path (a name has at most {MAX_NAME} bytes)")
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
        a .git directory at any depth (a nested repository's too, in any letter case); None when
        it is an ordinary workspace path."""
        from .classify import in_git_dir

        root = self.root.resolve()
        try:
            lexical = p.relative_to(self.root)
        except ValueError:
            return "outside the workspace"
        real = Path(os.path.realpath(p))
        try:
            rel = real.relative_to(root)
        except ValueError:
            return "a symlink that leads outside the workspace"
        if in_git_dir(rel) or in_git_dir(lexical):
            return "inside .git"
        return None

    def contains(self, p: Path) -> bool:
        """``p`` (a path found by walking the workspace) is a real file or directory of it: not
        a symlink, not below one that leads out, not inside a .git."""
        if p.is_symlink():
            return False
        return self.escapes(p) is None

    def remember(self, p: Path, text: str) -> None:
        st = p.stat()
        self.seen[str(p)] = (st.st_mtime_ns, st.st_size, text)


MAX_PATH = 4096  # Linux's PATH_MAX: nothing longer names a file
MAX_NAME = 255  # bytes of one path component (NAME_MAX)
_INT = re.compile(r"\s*[-+]?[0-9]+\s*")
_JSON_TYPES = {"string": "a string", "integer": "an integer", "boolean": "a boolean (true or false)",
               "object": "an object", "array": "an array", "number": "a number"}
_PY_TYPES = {str: "string", int: "integer", bool: "boolean"}


def _show(value: Any, limit: int = 40) -> str:
    """A value as the model wrote it, cut short: error messages must stay one readable line."""
    try:
        if isinstance(value, (str, int, float, bool)):
            text = json.dumps(value, ensure_ascii=True)
        else:
            text = type(value).__name__
    except ValueError:  # an integer beyond Python's digit limit for str()
        text = "a very large integer"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be passed on as text (to the OS, the file system or the tokenizer)."""
    if "\0" in text:
        return "contains a NUL byte (\\0)"
    if any("\ud800" <= c <= "\udfff" for c in text):
        return "contains a lone surrogate (\\ud800-\\udfff), which is not text"
    return None


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a file name the tools accept: what ``text_problem`` refuses, and
    control characters (a newline, an escape, a DEL), which no project's file names need and
    which can hide what a path really is when shown."""
    problem = text_problem(path)
    if problem:
        return problem
    bad = next((c for c in path if ord(c) < 0x20 or ord(c) == 0x7F or 0x80 <= ord(c) < 0xA0), None)
    if bad is not None:
        return f"contains a control character (U+{ord(bad):04X})"
    return None


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: surrogate escapes (undecodable file names from the OS) become
    U+FFFD, so a result can always be encoded into the transcript."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _coerce(name: str, value: Any, kind: str) -> Any:
    """``value`` as JSON-schema type ``kind``; models often quote numbers and booleans."""
    if kind == "integer":
        if isinstance(value, str) and _INT.fullmatch(value):
            try:
                value = int(value)
            except ValueError:  # beyond Python's digit limit for int()
                raise ToolError(f"parameter '{name}' is too large") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolError(f"parameter '{name}' must be an integer, got {_show(value)}")
    elif kind == "boolean":
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise ToolError(f"parameter '{name}' must be a boolean (true or false), got {_show(value)}")
    elif kind == "string":
        if not isinstance(value, str):
            raise ToolError(f"parameter '{name}' must be a string, got {_show(value)}")
        problem = text_problem(value)
        if problem:
            raise ToolError(f"parameter '{name}' {problem}")
    return value


def check_arguments(tool: Tool, args: Any) -> dict[str, Any]:
    """The call's arguments checked against the tool's JSON schema: an object, no unknown keys,
    the required ones present, each of its type (quoted integers and booleans converted), within
    its ``minimum``/``maximum`` and ``enum``. Returns the converted arguments (null = absent);
    raises ToolError saying what is wrong, so the model can correct the call."""
    if not isinstance(args, dict):
        raise ToolError(f"arguments must be a JSON object, got {_show(args)}")
    props: dict[str, dict] = tool.parameters.get("properties", {})
    known = ", ".join(props) or "no parameters"
    unknown = [k for k in args if k not in props]
    if unknown:
        names = ", ".join(f"'{k}'" if isinstance(k, str) and not text_problem(k) else _show(k) for k in unknown[:5])
        raise ToolError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {names[:200]} for {tool.name}; "
                        f"it takes: {known}")
    out: dict[str, Any] = {}
    for name, value in args.items():
        if value is None:
            continue
        spec = props[name]
        value = _coerce(name, value, spec.get("type", ""))
        if "enum" in spec and value not in spec["enum"]:
            allowed = ", ".join(map(str, spec["enum"]))
            raise ToolError(f"parameter '{name}' must be one of {allowed}, got {_show(value)}")
        if "minimum" in spec and value < spec["minimum"]:
            raise ToolError(f"parameter '{name}' must be at least {spec['minimum']}, got {_show(value)}")
        if "maximum" in spec and value > spec["maximum"]:
            raise ToolError(f"parameter '{name}' must be at most {spec['maximum']}, got {_show(value)}")
        out[name] = value
    missing = [n for n in tool.parameters.get("required", []) if n not in out]
    if missing:
        raise ToolError(f"missing required parameter '{missing[0]}' for {tool.name}")
    return out


def arg(args: dict[str, Any], name: str, kind: type, default: Any = None, required: bool = False) -> Any:
    if name not in args or args[name] is None:
        if required:
            raise ToolError(f"missing required parameter '{name}'")
        return default
    return _coerce(name, args[name], _PY_TYPES[kind])
