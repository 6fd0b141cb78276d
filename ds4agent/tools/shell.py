"""bash: shell commands in the workspace, in the foreground with a timeout or as background jobs.

Output is capped for the model (head and tail kept, the middle elided); the full output goes to
a spill file whose path is given, and spill files are removed when the program exits. A command
runs in its own process group so a timeout or a stop kills everything it started.

``sandbox`` (from the policy: a sandbox.Backend and the command's Confinement) runs the command
under the OS sandbox; a failure the sandbox probably caused is named in ``ToolResult.blocked``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .base import Tool, ToolError, ToolResult, Workspace, arg

DEFAULT_TIMEOUT = 120
MAX_TIMEOUT = 3600
HEAD_LINES = 100
TAIL_LINES = 100
MAX_LINE = 1000

_SPILL_DIR: Path | None = None


def _spill_dir() -> Path:
    global _SPILL_DIR
    if _SPILL_DIR is None:
        _SPILL_DIR = Path(tempfile.mkdtemp(prefix="ds4-bash-"))
        atexit.register(shutil.rmtree, _SPILL_DIR, True)
    return _SPILL_DIR


def cap_output(text: str, spill_name: str) -> str:
    lines = text.splitlines()
    lines = [ln if len(ln) <= MAX_LINE else ln[:MAX_LINE] + " …" for ln in lines]
    if len(lines) <= HEAD_LINES + TAIL_LINES:
        return "\n".join(lines)
    spill = _spill_dir() / spill_name
    spill.write_text(text, encoding="utf-8")
    cut = len(lines) - HEAD_LINES - TAIL_LINES
    return "\n".join(lines[:HEAD_LINES] + [f"[… {cut} lines omitted; full output in {spill} …]"] + lines[-TAIL_LINES:])


USER_OUTPUT = 1 << 20  # characters of a command's output kept for the user to expand


def user_output(text: str) -> str:
    """A command's output as kept for the user (the terminal shows its last lines and expands
    it on request): whole up to USER_OUTPUT characters, else its end, saying where the rest is."""
    if len(text) <= USER_OUTPUT:
        return text
    spill = _spill_dir() / f"user-{time.monotonic_ns()}.log"
    spill.write_text(text, encoding="utf-8")
    note = f"[the first {len(text) - USER_OUTPUT} characters are left out here; full output in {spill}]\n"
    return note + text[-USER_OUTPUT:]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    except ProcessLookupError:
        pass


def _start(ws: Workspace, command: str, out_path: Path, sandbox=None) -> subprocess.Popen:
    argv = ["bash", "-c", command]
    if sandbox is not None:
        backend, conf = sandbox
        argv = backend.wrap(argv, conf)
    fh = open(out_path, "wb")
    try:
        return subprocess.Popen(argv, cwd=ws.root, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        fh.close()


@dataclass
class ShellJob:
    id: int
    command: str
    proc: subprocess.Popen
    out: Path
    started: float = field(default_factory=time.monotonic)

    def status(self) -> str:
        code = self.proc.poll()
        return "running" if code is None else f"exited with status {code}"


class Jobs:
    """Background jobs of one agent session; all are stopped when the program exits."""

    def __init__(self) -> None:
        self.jobs: dict[int, ShellJob] = {}
        self._next = 1
        self._lock = threading.Lock()
        atexit.register(self.stop_all)

    def add(self, ws: Workspace, command: str, sandbox=None) -> ShellJob:
        with self._lock:
            n = self._next
            self._next += 1
        out = _spill_dir() / f"job-{n}.log"
        job = ShellJob(n, command, _start(ws, command, out, sandbox), out)
        self.jobs[n] = job
        return job

    def get(self, n: int) -> ShellJob:
        if n not in self.jobs:
            raise ToolError(f"no background job {n} (jobs: {', '.join(map(str, self.jobs)) or 'none'})")
        return self.jobs[n]

    def stop_all(self) -> None:
        for job in self.jobs.values():
            if job.proc.poll() is None:
                _kill(job.proc)


JOBS = Jobs()


def bash(ws: Workspace, args: dict, jobs: Jobs = JOBS, sandbox=None) -> ToolResult:
    command = arg(args, "command", str, required=True)
    if not command.strip():
        raise ToolError("command is empty")
    timeout = arg(args, "timeout", int, DEFAULT_TIMEOUT)
    if not 1 <= timeout <= MAX_TIMEOUT:
        raise ToolError(f"timeout must be 1..{MAX_TIMEOUT} seconds")
    if arg(args, "background", bool, False):
        job = jobs.add(ws, command, sandbox)
        return ToolResult(f"started background job {job.id}; check it with job(id={job.id}, action=\"status\")",
                          f"$ {command}  (background job {job.id})")
    out_path = _spill_dir() / f"run-{time.monotonic_ns()}.log"
    proc = _start(ws, command, out_path, sandbox)
    started = time.monotonic()
    timed_out = stopped = False
    # Polled rather than one wait: Esc / Ctrl+C only set ws.stop (the command runs in its own
    # process group, so the terminal's SIGINT never reaches it), and the user should not wait
    # for the time limit after stopping the agent.
    while True:
        try:
            code = proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            if ws.stop.is_set() or time.monotonic() - started >= timeout:
                stopped, timed_out = ws.stop.is_set(), not ws.stop.is_set()
                _kill(proc)
                code = proc.returncode
                break
    elapsed = time.monotonic() - started
    text = out_path.read_text(encoding="utf-8", errors="replace")
    out_path.unlink(missing_ok=True)
    body = cap_output(text, f"output-{time.monotonic_ns()}.log")
    if stopped:
        status = "stopped by the user and killed"
    elif timed_out:
        status = f"timed out after {timeout} s and was killed"
    else:
        status = f"exit status {code}"
    result = (body + "\n" if body else "") + f"[{status}; {elapsed:.1f} s]"
    ok = not (timed_out or stopped) and code == 0
    blocked = ""
    if sandbox is not None and not ok and not (timed_out or stopped):
        from .sandbox import denial

        blocked = denial(text, code, sandbox[1])
    summary = f"$ {command}  ({status}{'; stopped by the sandbox' if blocked else ''})"
    return ToolResult(result, summary, ok=ok, blocked=blocked, output=user_output(text))


def job(ws: Workspace, args: dict, jobs: Jobs = JOBS) -> ToolResult:
    n = arg(args, "id", int, required=True)
    action = arg(args, "action", str, "status")
    j = jobs.get(n)
    if action == "stop":
        if j.proc.poll() is None:
            _kill(j.proc)
            action_text = "stopped"
        else:
            action_text = "had already finished"
        return ToolResult(f"job {n} {action_text} ({j.status()})", f"job {n}: {action_text}")
    if action not in ("status", "output"):
        raise ToolError("action must be status, output or stop")
    text = j.out.read_text(encoding="utf-8", errors="replace") if j.out.exists() else ""
    body = cap_output(text, f"job-{n}-view-{time.monotonic_ns()}.log")
    return ToolResult(f"job {n} ({j.command}): {j.status()}, {time.monotonic() - j.started:.0f} s\n{body}",
                      f"job {n}: {j.status()}")


TOOLS = [
    Tool("bash", "Run a bash command in the workspace root. Long output keeps its head and tail. Use background=true "
         "for servers and watchers, then the job tool.",
         {"type": "object", "properties": {
             "command": {"type": "string"},
             "timeout": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT,
                         "description": f"seconds before the command is killed (default {DEFAULT_TIMEOUT})"},
             "background": {"type": "boolean", "description": "run as a background job and return at once"}},
          "required": ["command"]}, bash, kind="shell"),
    Tool("job", "Check, read or stop a background job started by bash.",
         {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1},
                                           "action": {"type": "string", "enum": ["status", "output", "stop"]}},
          "required": ["id"]}, job),
]
