"""Who may do what: approval modes, the always-ask list, and the dispatcher that applies them.

Modes: ``ask`` (default: edits and shell commands need a yes), ``auto-edit`` (edits inside the
workspace run; shell commands ask), ``yolo`` (everything runs). In every mode, commands on the
dangerous list ask, and outside ``yolo`` so do paths outside the workspace, symlinks that lead
out of it, and writes inside .git. An answer is yes, no, or always (for this kind of action,
for the rest of the session). Without anyone to ask (headless), an action that needs approval
is refused and the model is told why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from .base import Tool, ToolError, ToolResult, Workspace, check_arguments, clean_text

MODES = ("ask", "auto-edit", "yolo")

# Commands that destroy data or reach beyond the project. Always confirmed, even in yolo mode.
DANGEROUS = [
    (r"\brm\s+(-\w*[rf]\w*\s+)+", "recursive or forced delete"),
    (r"\bsudo\b|\bdoas\b", "runs as another user"),
    (r"\bmkfs\b|\bdd\b.*\bof=|\bfdisk\b|\bwipefs\b", "writes to disks"),
    (r">\s*/dev/(sd|nvme|disk)", "writes to a disk device"),
    (r"\b(shutdown|reboot|halt|poweroff)\b", "stops the machine"),
    (r"\bgit\s+push\b.*(--force|-f\b)", "force-push"),
    (r"\bgit\s+(reset\s+--hard|clean\s+-\w*f)", "discards uncommitted work"),
    (r"\b(curl|wget)\b[^|]*\|\s*(ba|z)?sh\b", "runs a downloaded script"),
    (r"\bchmod\s+-R\b|\bchown\s+-R\b", "recursive permission change"),
    (r":\(\)\s*\{\s*:\|:&\s*\};:", "fork bomb"),
    (r"\bkill\s+-9\s+-1\b|\bkillall\b|\bpkill\b", "kills processes broadly"),
]
_DANGEROUS = [(re.compile(p), why) for p, why in DANGEROUS]


def dangerous(command: str) -> str | None:
    for rx, why in _DANGEROUS:
        if rx.search(command):
            return why
    return None


@dataclass
class Request:
    tool: str
    summary: str  # what will happen, in one line
    reason: str  # why it needs approval
    kind: str  # "edit", "shell", "escape" or "dangerous": what an "always" answer covers


Approver = Callable[[Request], str]  # returns "yes", "no" or "always"


@dataclass
class Policy:
    mode: str = "ask"
    always: set[str] = field(default_factory=set)  # kinds approved for the session

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"approval mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def request(self, tool: Tool, args: dict, ws: Workspace) -> Request | None:
        """The approval this call needs, or None when it may run."""
        if tool.name == "bash":
            command = str(args.get("command", ""))
            why = dangerous(command)
            if why:
                return Request(tool.name, f"$ {command}", f"dangerous command ({why})", "dangerous")
            if self.mode == "yolo" or "shell" in self.always:
                return None
            return Request(tool.name, f"$ {command}", "runs a shell command", "shell")
        path = args.get("path")
        if isinstance(path, str) and path.strip() and self.mode != "yolo":
            p = ws.resolve(path)
            escape = ws.escapes(p)
            writes = tool.kind == "edit"
            if escape and (escape != "inside .git" or writes) and "escape" not in self.always:
                return Request(tool.name, f"{tool.name} {path}", f"path is {escape}", "escape")
        if tool.kind == "edit" and self.mode == "ask" and "edit" not in self.always:
            return Request(tool.name, f"{tool.name} {path}", "changes a file", "edit")
        return None


def run_tool(tools: dict[str, Tool], name: str, arguments: str | dict, ws: Workspace, policy: Policy,
             approve: Approver | None) -> tuple[ToolResult, str]:
    """Run one tool call under the policy. Returns the result and the decision taken
    ("auto", "approved", "always", "refused", "error"); never raises for the model's mistakes."""
    tool = tools.get(name)
    if tool is None:
        return ToolResult(f"error: unknown tool {name!r}; available: {', '.join(sorted(tools))}",
                          f"unknown tool {name}", ok=False), "error"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as e:  # RecursionError: "[[[[..." nested too deep
            why = str(e) if isinstance(e, ValueError) else "nested too deeply"
            return ToolResult(f"error: arguments are not valid JSON ({why[:200]})", f"{name}: bad arguments",
                              ok=False), "error"
    # Arguments are checked against the schema before anyone is asked to approve the call.
    try:
        args = check_arguments(tool, arguments)
        req = policy.request(tool, args, ws)
    except ToolError as e:
        return _error(name, str(e)), "error"
    except Exception as e:  # noqa: BLE001 - a bug of ours must not end the agent; the model hears of it
        return _unexpected(name, e), "error"
    decision = "auto"
    if req is not None:
        answer = approve(req) if approve is not None else "no"
        if answer == "always" and req.kind != "dangerous":
            policy.always.add(req.kind)
        if answer not in ("yes", "always"):
            how = "the user declined" if approve is not None else "no one can approve it in this mode"
            return ToolResult(f"error: not run: {req.reason}; {how}. Choose another way or ask the user.",
                              f"refused: {req.summary} ({req.reason})", ok=False), "refused"
        decision = "always" if answer == "always" else "approved"
    try:
        result = tool.run(ws, args)
    except ToolError as e:
        return _error(name, str(e)), decision
    except OSError as e:
        return _error(name, str(e.strerror or e)), decision
    except Exception as e:  # noqa: BLE001 - last resort, see above
        return _unexpected(name, e), decision
    # File names the OS could not decode arrive as surrogate escapes: the transcript needs text.
    return ToolResult(clean_text(result.text), clean_text(result.summary), result.ok, clean_text(result.detail)), decision


def _error(name: str, message: str) -> ToolResult:
    message = clean_text(message)
    return ToolResult(f"error: {message}", f"{name}: {message}", ok=False)


def _unexpected(name: str, e: Exception) -> ToolResult:
    what = clean_text(f"{type(e).__name__}: {e}")[:300]
    return ToolResult(f"error: the {name} tool failed unexpectedly ({what}). This is a fault in ds4agent, not in "
                      "your call; try another way.", f"{name}: internal error ({type(e).__name__})", ok=False)
