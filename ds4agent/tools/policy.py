"""Who may do what: approval modes, scoped "always" answers, the OS sandbox, and the
dispatcher that applies them.

Approval modes: ``ask`` (default: edits and shell commands need a yes), ``auto-edit`` (edits
inside the workspace run; read-only commands from a reviewed list run inside the sandbox; other
commands ask), ``yolo`` (everything runs, outside the sandbox unless one is chosen).

Shell commands are parsed (tools/classify): every program they run is judged from its resolved
name and options. A dangerous one (recursive delete, force-push, writes outside the workspace
or into a .git, a downloaded script run by a shell, ...) asks in every mode, and no earlier
answer covers it. One that cannot be read statically (``$X -rf``, decoded text run as code,
inline interpreter code) asks outside ``yolo``, every time.

"Always" is scoped and the user sees the scope before confirming it: for a shell command, the
prefix of each program that needed the approval (``pytest``, ``npm test``, ``git commit``); for
file edits, edits inside the workspace; for a path outside the workspace, reads (or writes)
below that directory. Nothing is ever approved for "the shell" as a whole.

Sandbox modes (read-only / workspace-write / full-access): in ``ask`` and ``auto-edit``
commands run in ``workspace-write`` unless another is chosen; ``yolo`` runs them with full
access unless one is chosen. A command the sandbox stopped is reported with the reason, and the
user may let it run once outside the sandbox. Without a sandbox on this machine, every command
needs an approval in ``auto-edit``.

Paths: outside ``yolo``, paths outside the workspace, symlinks leading out of it and writes
into any .git (at any depth, in any letter case) ask. Without anyone to ask (headless), an
action that needs approval is refused and the model is told why.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import sandbox as sb
from .base import Tool, ToolError, ToolResult, Workspace, check_arguments, clean_text
from .classify import DANGEROUS, SAFE, UNKNOWN, Analysis, Places, analyze, temp_dirs

MODES = ("ask", "auto-edit", "yolo")
SANDBOX_MODES = sb.MODES


def dangerous(command: str, root: Path | None = None) -> str | None:
    """Why ``command`` is dangerous (parsed, see classify), or None."""
    a = analyze(command, root or Path.cwd())
    return "; ".join(a.reasons(DANGEROUS)) if a.level >= DANGEROUS else None


@dataclass
class Request:
    tool: str
    summary: str  # what will happen, in one line
    reason: str  # why it needs approval
    kind: str  # edit | shell | escape | unknown | dangerous | unsandboxed | mcp
    scope: str | None = None  # what an "always" answer would cover, in words; None: "always" is not offered
    grants: tuple = ()  # what an "always" adds to Policy.always
    # Shown before the question: where a command runs, where a path really leads, ...
    details: tuple[str, ...] = ()
    # What the call would do (run_tool fills it from Tool.preview): an edit's diff, a new
    # file's head and size, an MCP call's arguments. What the user approves is what runs.
    preview: str = ""


Approver = Callable[[Request], str]  # returns "yes", "no" or "always"


def _shell_words(prefix: tuple[str, ...]) -> str:
    import shlex

    return " ".join(shlex.quote(w) for w in prefix)


@dataclass
class Policy:
    mode: str = "ask"
    sandbox: str | None = None  # None: workspace-write in ask/auto-edit, full-access in yolo
    network: bool = True
    writable: tuple[str, ...] = ()  # extra directories the sandbox lets commands write (--allow-write)
    # Grants for the session: ("edit",), ("shell", *prefix), ("read", dir), ("write", dir).
    always: set[tuple] = field(default_factory=set)
    backend: sb.Backend | None = field(default=None, repr=False)
    _detected: bool = field(default=False, repr=False)
    _last: tuple[tuple[str, str], Analysis] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"approval mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.sandbox is not None and self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox mode must be one of {', '.join(SANDBOX_MODES)}, got {self.sandbox!r}")
        if self.backend is not None:
            self._detected = True

    # -- the sandbox ---------------------------------------------------------------------------
    @property
    def sandbox_mode(self) -> str:
        return self.sandbox or ("full-access" if self.mode == "yolo" else "workspace-write")

    def mechanism(self) -> sb.Backend | None:
        if not self._detected:
            self.backend = sb.detect()
            self._detected = True
        return self.backend

    def confined(self) -> bool:
        """Shell commands run inside an OS sandbox."""
        return self.sandbox_mode != "full-access" and self.mechanism() is not None

    def describe(self, detail: bool = False) -> str:
        """The sandbox in a few words (status line); with ``detail``, the mechanism (banner)."""
        mode = self.sandbox_mode
        if mode == "full-access":
            return "full access"
        b = self.mechanism()
        if b is None:
            return f"{mode}: no OS sandbox here"
        text = mode + ("" if self.network else ", no network")
        return f"{text} ({b.detail})" if detail else text

    def startup_note(self) -> str | None:
        """Said once when the agent starts: only when no sandbox can confine commands."""
        if self.sandbox_mode == "full-access" or self.mechanism() is not None:
            return None
        return ("no OS sandbox is available here (Landlock, bubblewrap or sandbox-exec): "
                "shell commands run unconfined, so every one needs an approval in auto-edit")

    def confinement(self, ws: Workspace, analysis: Analysis | None) -> sb.Confinement | None:
        if not self.confined():
            return None
        root = os.path.realpath(ws.root)
        if self.sandbox_mode == "read-only":
            return sb.Confinement("read-only", (), (), self.network)
        writable = [root] + [str(t) for t in temp_dirs() if not _under(str(t), root)]
        writable += [os.path.realpath(w) for w in self.writable]
        protected: list[str] = []
        git_dirs = _git_dirs(root)
        if analysis is not None and analysis.git_only:
            writable += [d for d in git_dirs if not any(_under(d, w) for w in writable)]
        else:
            dotgit = os.path.join(root, ".git")
            if os.path.lexists(dotgit) or self.mechanism().name == "seatbelt":
                protected.append(dotgit)
        return sb.Confinement("workspace-write", tuple(dict.fromkeys(writable)), tuple(protected), self.network)

    # -- what needs approval -------------------------------------------------------------------
    def analyze(self, command: str, ws: Workspace) -> Analysis:
        key = (command, str(ws.root))
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        a = analyze(command, ws.root, places=Places.for_root(ws.root))
        self._last = (key, a)
        return a

    def request(self, tool: Tool, args: dict, ws: Workspace) -> Request | None:
        """The approval this call needs, or None when it may run."""
        if tool.kind == "shell":
            return self._shell_request(tool, str(args.get("command", "")), ws)
        if tool.kind == "mcp":
            return self._mcp_request(tool)
        path = args.get("path")
        writes = tool.kind == "edit"
        if isinstance(path, str) and path.strip() and self.mode != "yolo":
            p = ws.resolve(path)
            escape = ws.escapes(p)
            if escape and (escape != "inside .git" or writes):
                real = Path(os.path.realpath(p))
                where = str(real if real.is_dir() and not writes else real.parent)
                grant = ("write" if writes else "read", where)
                if not any(_granted(g, grant) for g in self.always):
                    verb = "writes" if writes else "reads"
                    return Request(tool.name, f"{tool.name} {path}", f"path is {escape}", "escape",
                                   scope=f"{verb} of files under {where}", grants=(grant,),
                                   details=(f"{path} resolves to {real}",))
        if writes and self.mode != "yolo" and ("edit",) not in self.always:
            if self.mode == "ask":
                return Request(tool.name, f"{tool.name} {path}", "changes a file", "edit",
                               scope="file edits inside the workspace", grants=(("edit",),))
            if self.sandbox_mode == "read-only":
                return Request(tool.name, f"{tool.name} {path}", "changes a file, and the sandbox is read-only", "edit",
                               scope="file edits inside the workspace", grants=(("edit",),))
        return None

    def _mcp_request(self, tool: Tool) -> Request | None:
        """A tool of an MCP server can do anything its server can: it asks outside yolo (also
        in auto-edit), unless an "always" for this one tool was given."""
        if self.mode == "yolo" or ("mcp", tool.name) in self.always:
            return None
        server = tool.name.split("__")[1] if tool.name.count("__") >= 2 else "?"
        return Request(tool.name, f"{tool.name}", f"calls a tool of the MCP server '{server}'", "mcp",
                       scope=f"calls to the MCP tool {tool.name}", grants=(("mcp", tool.name),))

    def _shell_request(self, tool: Tool, command: str, ws: Workspace) -> Request | None:
        a = self.analyze(command, ws)
        summary = f"$ {command}"
        # Where it runs and how it is confined: said with every question about a command.
        where = (f"in {ws.root}", f"sandbox: {self.describe()}")
        if a.level >= DANGEROUS:
            return Request(tool.name, summary, f"dangerous command ({'; '.join(a.reasons(DANGEROUS)[:3])})",
                           "dangerous",
                           details=where)
        if self.mode == "yolo":
            return None
        if a.level >= UNKNOWN:
            return Request(tool.name, summary,
                           f"cannot be checked before it runs ({'; '.join(a.reasons(UNKNOWN)[:3])})",
                           "unknown", details=where)
        auto = self.mode == "auto-edit" and self.confined()
        rules = [g[1:] for g in self.always if g and g[0] == "shell"]
        # Inert parts (cd, echo, set -e ...) never need an approval of their own next to real
        # programs; a command made only of them is still a shell command (asked in `ask`).
        real = [s for s in a.steps if not s.inert]
        needs = []
        for s in real or a.steps:
            if (s.level == SAFE or s.inert) and auto:
                continue
            if s.coverable and s.program is not None and any(_covers(r, s.values()) for r in rules):
                continue
            needs.append(s)
        if not needs:
            return None
        prefixes = [s.prefix for s in needs]
        offer = bool(needs) and all(p is not None and s.coverable for p, s in zip(prefixes, needs))
        why = "runs a shell command"
        detail = [r for s in needs for r in s.reasons if r.startswith(("names a path", "reads outside", "sets "))]
        if auto:
            # Auto-edit runs read-only commands unasked: say what kept this one off the list
            # (git branch NAME creates a branch), unless its reasons above already say it.
            detail += [s.unsafe for s in needs if s.unsafe and s.unsafe != "the sandbox may not run it"]
        if not self.confined() and self.mode == "auto-edit":
            detail.append("no sandbox: every command needs an approval")
        if detail:
            why += f" ({'; '.join(dict.fromkeys(detail))})"
        scope = None
        grants: tuple = ()
        if offer:
            uniq = list(dict.fromkeys(prefixes))
            scope = "commands starting with " + ", ".join(f"`{_shell_words(p)}`" for p in uniq)
            grants = tuple(("shell", *p) for p in uniq)
        return Request(tool.name, summary, why, "shell", scope=scope, grants=grants, details=where)

    def grant(self, req: Request) -> None:
        if req.kind in ("dangerous", "unknown", "unsandboxed") or req.scope is None:
            return
        self.always.update(req.grants)

    def rules(self) -> list[str]:
        """The session's "always" answers, in words (for /approval)."""
        out = []
        for g in sorted(self.always, key=str):
            if g[0] == "shell":
                out.append(f"shell: {_shell_words(g[1:])}")
            elif g[0] == "edit":
                out.append("file edits inside the workspace")
            elif g[0] == "mcp":
                out.append(f"MCP tool {g[1]}")
            else:
                out.append(f"{g[0]}s under {g[1]}")
        return out


def _covers(rule: tuple[str, ...], argv: list[str | None]) -> bool:
    return len(argv) >= len(rule) and all(a is not None and a == r for a, r in zip(argv, rule))


def _granted(have: tuple, want: tuple) -> bool:
    if have[0] != want[0] or len(have) != 2:
        return False
    return _under(want[1], have[1])


def _under(p: str, root: str) -> bool:
    return p == root or p.startswith(root.rstrip("/") + "/")


_GIT_DIRS: dict[str, list[str]] = {}


def _git_dirs(root: str) -> list[str]:
    """The repository's git directory and common directory (outside the tree for worktrees)."""
    if root not in _GIT_DIRS:
        dirs: list[str] = []
        try:
            out = subprocess.run(["git", "rev-parse", "--absolute-git-dir", "--git-common-dir"], cwd=root,
                                 capture_output=True, text=True, timeout=10)
            if out.returncode == 0:
                for line in out.stdout.splitlines():
                    d = os.path.realpath(os.path.join(root, line.strip()))
                    if d not in dirs:
                        dirs.append(d)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _GIT_DIRS[root] = dirs
    return _GIT_DIRS[root]


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
    # Arguments are checked against the schema before anyone is asked to approve the call, and
    # what the call would do is worked out first: a call that cannot succeed asks nothing.
    try:
        args = check_arguments(tool, arguments) if tool.strict else loose_arguments(arguments)
        req = policy.request(tool, args, ws)
        if req is not None and approve is not None:  # (with no one to ask, it is refused anyway)
            req.preview = _preview(tool, ws, args)
    except ToolError as e:
        return _error(name, str(e)), "error"
    except Exception as e:  # noqa: BLE001 - a bug of ours must not end the agent; the model hears of it
        return _unexpected(name, e), "error"
    decision = "auto"
    if req is not None:
        answer = approve(req) if approve is not None else "no"
        if answer == "always":
            policy.grant(req)
        if answer not in ("yes", "always"):
            how = "the user declined" if approve is not None else "no one can approve it in this mode"
            return ToolResult(f"error: not run: {req.reason}; {how}. Choose another way or ask the user.",
                              f"refused: {req.summary} ({req.reason})", ok=False), "refused"
        decision = "always" if answer == "always" and req.scope else "approved"
        # The approval was for the change shown; if the file changed while the user looked at
        # it (an editor saved it), that is no longer the change that would be made.
        try:
            now = _preview(tool, ws, args)
        except ToolError as e:
            now = f"error: {e}"
        if tool.preview is not None and now != req.preview:
            return _error(name, "the file changed while the user was being asked, so the approved change is not the "
                                "one that would be made; not run. Read the file again."), "error"
    try:
        if tool.kind == "shell":
            result = _run_shell(tool, ws, args, policy, approve)
        else:
            result = tool.run(ws, args)
    except ToolError as e:
        return _error(name, str(e)), decision
    except OSError as e:
        return _error(name, str(e.strerror or e)), decision
    except Exception as e:  # noqa: BLE001 - last resort, see above
        return _unexpected(name, e), decision
    # File names the OS could not decode arrive as surrogate escapes: the transcript needs text.
    return ToolResult(clean_text(result.text), clean_text(result.summary), result.ok, clean_text(result.detail),
                      output=clean_text(result.output)), decision


PREVIEW_ARGS = 4000  # characters of an MCP call's arguments shown before approving it


def _preview(tool: Tool, ws: Workspace, args: dict) -> str:
    if tool.preview is not None:
        return tool.preview(ws, args)
    if tool.kind == "mcp":
        text = json.dumps(args, ensure_ascii=False, indent=2)
        return text if len(text) <= PREVIEW_ARGS else text[:PREVIEW_ARGS] + f"\n… ({len(text)} characters in all)"
    return ""


def loose_arguments(args: object) -> dict:
    """For tools whose server checks its own arguments (MCP): an object whose strings are text."""
    from .base import text_problem

    if not isinstance(args, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(args).__name__}")

    def walk(v: object, where: str) -> None:
        if isinstance(v, str):
            problem = text_problem(v)
            if problem:
                raise ToolError(f"argument {where} {problem}")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k, where)
                walk(x, f"{where}.{k}" if isinstance(k, str) else where)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")

    for k, v in args.items():
        walk(k, repr(k)[:40])
        walk(v, f"'{k}'")
    return {k: v for k, v in args.items() if v is not None}


def _run_shell(tool: Tool, ws: Workspace, args: dict, policy: Policy, approve: Approver | None) -> ToolResult:
    """A shell command in the sandbox; if the sandbox stopped it, the user may let it run
    again outside the sandbox, this once."""
    command = str(args.get("command", ""))
    conf = policy.confinement(ws, policy.analyze(command, ws)) if command.strip() else None
    if conf is None:
        return tool.run(ws, args)
    result = tool.run(ws, args, sandbox=(policy.mechanism(), conf))
    if not result.blocked:
        return result
    req = Request(tool.name, f"$ {command}", f"the sandbox stopped it: {result.blocked}. Run it again outside the "
                  "sandbox, this once", "unsandboxed", details=(f"in {ws.root}", "sandbox: none for this run"))
    answer = approve(req) if approve is not None else "no"
    if answer in ("yes", "always"):
        again = tool.run(ws, args)
        again.text = f"[run again outside the sandbox, with the user's approval]\n{again.text}"
        return again
    how = "the user declined" if approve is not None else "no one can approve that in this mode"
    result.text += (f"\n[the sandbox stopped this command: {result.blocked}. Running it outside the sandbox needs "
                    f"the user's approval; {how}.]")
    return result


def _error(name: str, message: str) -> ToolResult:
    message = clean_text(message)
    return ToolResult(f"error: {message}", f"{name}: {message}", ok=False)


def _unexpected(name: str, e: Exception) -> ToolResult:
    what = clean_text(f"{type(e).__name__}: {e}")[:300]
    return ToolResult(f"error: the {name} tool failed unexpectedly ({what}). This is a fault in ds4agent, not in "
                      "your call; try another way.", f"{name}: internal error ({type(e).__name__})", ok=False)
