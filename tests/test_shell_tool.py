"""The bash and job tools (tools/shell.py), pinned exactly.

Expected values are written out by hand from the tool's contract, not copied from a run: the
head/tail cut at HEAD_LINES + TAIL_LINES = 200 lines, long lines cut at 1000 characters, the
user's copy of the output capped at 1 MiB (1 << 20 = 1048576 characters), the timeout range
1..3600 with default 120, and the schema the model reads. Times are made exact with a fake clock.
"""

from __future__ import annotations

import contextlib
import locale
import os
import shutil
import signal
import subprocess
import time
import types
from pathlib import Path
from typing import Iterator

import pytest

import ds4agent.tools.sandbox as sandbox_mod
import ds4agent.tools.shell as shell
from ds4agent.tools.base import ToolError, Workspace
from ds4agent.tools.shell import Jobs, ShellJob, bash, cap_output, job, user_output

USER_CAP = 1048576  # 1 MiB of characters, written out so a changed USER_OUTPUT shows


@pytest.fixture()
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace(root)


@pytest.fixture()
def spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh spill folder of our own, so what the tools leave in it can be listed exactly."""
    d = tmp_path / "spill"
    d.mkdir()
    monkeypatch.setattr(shell, "_SPILL_DIR", d)
    return d


class FakeClock:
    """time.monotonic returning the given values in turn, then `step` seconds more on each call.
    With `ready` (spill folder, bytes), the second value waits until the command's run file
    holds those bytes, so a command is not killed before it has set itself up."""

    def __init__(self, *values: float, step: float = 1.0, ready: tuple[Path, bytes] | None = None) -> None:
        self.values, self.step, self.ready, self.calls = list(values), step, ready, 0
        self.last = values[-1]

    def monotonic(self) -> float:
        self.calls += 1
        if self.calls == 2 and self.ready is not None:
            folder, want = self.ready
            deadline = time.perf_counter() + 10
            while time.perf_counter() < deadline:
                if any(want in f.read_bytes() for f in folder.glob("run-*.log")):
                    break
                time.sleep(0.02)
        if self.values:
            return self.values.pop(0)
        self.last += self.step
        return self.last


def use_clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    # Only the shell module's view of `time` is replaced; monotonic_ns (spill names) stays real.
    monkeypatch.setattr(shell, "time", types.SimpleNamespace(monotonic=clock.monotonic,
                                                             monotonic_ns=time.monotonic_ns))


@contextlib.contextmanager
def ascii_locale() -> Iterator[None]:
    """The C locale's ASCII as the default encoding: reading or writing without an explicit
    encoding="utf-8" then fails or garbles non-ASCII text, as it would on such a machine."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert locale.getencoding() == "ANSI_X3.4-1968"
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


# -- constants and the schema the model reads ----------------------------------------------------

def test_limits() -> None:
    assert shell.DEFAULT_TIMEOUT == 120
    assert shell.MAX_TIMEOUT == 3600
    assert (shell.HEAD_LINES, shell.TAIL_LINES, shell.MAX_LINE) == (100, 100, 1000)
    assert shell.USER_OUTPUT == USER_CAP


def test_tool_schemas_exact() -> None:
    bash_tool, job_tool = shell.TOOLS
    assert bash_tool.name == "bash" and bash_tool.run is shell.bash and bash_tool.kind == "shell"
    assert bash_tool.description == ("Run a bash command in the workspace root. Long output keeps its head and "
                                     "tail. Use background=true for servers and watchers, then the job tool.")
    assert bash_tool.parameters == {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 3600,
                        "description": "seconds before the command is killed (default 120)"},
            "background": {"type": "boolean", "description": "run as a background job and return at once"},
        },
        "required": ["command"],
    }
    assert job_tool.name == "job" and job_tool.run is shell.job and job_tool.kind == "read"
    assert job_tool.description == "Check, read or stop a background job started by bash."
    assert job_tool.parameters == {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1},
                       "action": {"type": "string", "enum": ["status", "output", "stop"]}},
        "required": ["id"],
    }


# -- the spill folder ------------------------------------------------------------------------------

def test_spill_dir_made_once_and_removed_at_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[tuple] = []
    monkeypatch.setattr(shell, "_SPILL_DIR", None)
    monkeypatch.setattr(shell.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shell.atexit, "register", lambda *a: registered.append(a))
    d = shell._spill_dir()
    assert d.parent == tmp_path and d.name.startswith("ds4-bash-") and d.is_dir()
    assert shell._spill_dir() == d  # the same folder on every call
    assert list(tmp_path.iterdir()) == [d]
    # removed at exit, ignoring errors (True), so a half-removed folder cannot fail the exit
    assert registered == [(shutil.rmtree, d, True)]


# -- cap_output ------------------------------------------------------------------------------------

def test_cap_output_short_text_joined_with_newlines(spill: Path) -> None:
    assert cap_output("a\nb\r\nc\n", "x.log") == "a\nb\nc"
    assert list(spill.iterdir()) == []


def test_cap_output_long_line_boundary(spill: Path) -> None:
    exact, over = "a" * 1000, "b" * 1000 + "c"
    assert cap_output(exact, "x.log") == exact
    assert cap_output(over, "x.log") == "b" * 1000 + " …"
    assert cap_output(f"{exact}\n{over}", "x.log") == exact + "\n" + "b" * 1000 + " …"


def test_cap_output_line_count_boundary(spill: Path) -> None:
    text200 = "".join(f"{i}\n" for i in range(1, 201))
    assert cap_output(text200, "a.log") == "\n".join(str(i) for i in range(1, 201))
    assert list(spill.iterdir()) == []  # no spill at exactly 200 lines
    text201 = "".join(f"é{i}\n" for i in range(1, 202))
    with ascii_locale():
        out = cap_output(text201, "b.log")
    head = [f"é{i}" for i in range(1, 101)]
    tail = [f"é{i}" for i in range(102, 202)]  # line 101 is the one left out
    assert out == "\n".join(head + [f"[… 1 lines omitted; full output in {spill / 'b.log'} …]"] + tail)
    assert (spill / "b.log").read_text(encoding="utf-8") == text201


def test_cap_output_cut_count(spill: Path) -> None:
    text = "\n".join(str(i) for i in range(1, 251))
    out = cap_output(text, "c.log").splitlines()
    assert out[100] == f"[… 50 lines omitted; full output in {spill / 'c.log'} …]"
    assert out[:100] == [str(i) for i in range(1, 101)] and out[101:] == [str(i) for i in range(151, 251)]


# -- user_output -------------------------------------------------------------------------------------

def test_user_output_boundary(spill: Path) -> None:
    exact = "z" * USER_CAP
    assert user_output(exact) == exact
    assert user_output("abc") == "abc"
    assert list(spill.iterdir()) == []


def test_user_output_keeps_the_end_and_spills_all(spill: Path) -> None:
    text = "éé" + "x" * 3 + "y" * USER_CAP  # 5 characters over the cap
    with ascii_locale():
        out = user_output(text)
    files = list(spill.iterdir())
    assert len(files) == 1 and files[0].name.startswith("user-") and files[0].name.endswith(".log")
    assert out == f"[the first 5 characters are left out here; full output in {files[0]}]\n" + "y" * USER_CAP
    assert files[0].read_text(encoding="utf-8") == text


# -- _kill and _start ----------------------------------------------------------------------------------

class WaitRecorder:
    """A Popen stand-in: records each wait's timeout; the first one can be made to time out."""

    def __init__(self, proc: subprocess.Popen, first_times_out: bool) -> None:
        self.proc, self.pid, self.first_times_out = proc, proc.pid, first_times_out
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if self.first_times_out and len(self.waits) == 1:
            raise subprocess.TimeoutExpired("bash", timeout)
        return self.proc.wait(timeout)


def _group(command: str) -> subprocess.Popen:
    p = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    return p


def test_kill_terminates_with_sigterm_first() -> None:
    p = _group("echo ready; exec sleep 30")
    rec = WaitRecorder(p, first_times_out=False)
    shell._kill(rec)  # type: ignore[arg-type]
    assert rec.waits == [3] and p.returncode == -signal.SIGTERM


def test_kill_escalates_to_sigkill() -> None:
    # TERM ignored by the whole group (an ignored signal stays ignored across exec)
    p = _group("trap '' TERM; echo ready; exec sleep 30")
    rec = WaitRecorder(p, first_times_out=True)
    try:
        shell._kill(rec)  # type: ignore[arg-type]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert rec.waits == [3, 5] and p.returncode == -signal.SIGKILL


def test_start_closes_its_file_and_gives_no_stdin(ws: Workspace, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    opened = []

    def recording_open(*a, **k):
        fh = open(*a, **k)
        opened.append(fh)
        return fh

    monkeypatch.setattr(shell, "open", recording_open, raising=False)
    # Our own stdin is a pipe for the moment: a child that inherited it would show "pipe:[…]".
    r, w = os.pipe()
    saved = os.dup(0)
    os.dup2(r, 0)
    try:
        out = tmp_path / "o.log"
        p = shell._start(ws, "readlink /proc/self/fd/0; pwd -P", out)
        p.wait(10)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, r, w):
            os.close(fd)
    assert len(opened) == 1 and opened[0].closed
    assert out.read_text() == f"/dev/null\n{ws.root.resolve()}\n"


# -- bash -----------------------------------------------------------------------------------------------

def test_bash_argument_errors(ws: Workspace) -> None:
    with pytest.raises(ToolError, match=r"^missing required parameter 'command'$"):
        bash(ws, {})
    with pytest.raises(ToolError, match=r"^command is empty$"):
        bash(ws, {"command": "  \n "})
    for bad in (0, 3601):
        with pytest.raises(ToolError, match=r"^timeout must be 1\.\.3600 seconds$"):
            bash(ws, {"command": "true", "timeout": bad})


def test_bash_timeout_range_ends_accepted(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    for ok in (1, 3600):
        r = bash(ws, {"command": "echo hi", "timeout": ok})
        assert r.ok and r.text == "hi\n[exit status 0; 0.0 s]"


def test_bash_exact_result(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    r = bash(ws, {"command": "echo hello; echo err >&2"})
    assert (r.text, r.summary, r.ok, r.blocked) == ("hello\nerr\n[exit status 0; 0.0 s]", "$ echo hello; echo err >&2  (exit status 0)", True, "")
    assert r.output == "hello\nerr\n"
    r = bash(ws, {"command": "true"})
    assert (r.text, r.summary, r.ok, r.output) == ("[exit status 0; 0.0 s]", "$ true  (exit status 0)", True, "")
    r = bash(ws, {"command": "exit 3"})
    assert (r.text, r.summary, r.ok) == ("[exit status 3; 0.0 s]", "$ exit 3  (exit status 3)", False)
    assert list(spill.iterdir()) == []  # the run's own output file is removed


def test_bash_output_encoding(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    with ascii_locale():
        r = bash(ws, {"command": r"printf 'caf\xc3\xa9 \xff!\n'"})
    assert r.text == "café \ufffd!\n[exit status 0; 0.0 s]" and r.output == "café \ufffd!\n"


def test_bash_long_output_keeps_whole_copy_for_user(ws: Workspace, spill: Path) -> None:
    r = bash(ws, {"command": "seq 1 201"})
    assert r.output == "".join(f"{i}\n" for i in range(1, 202))
    spills = [p.name for p in spill.iterdir()]
    assert len(spills) == 1 and spills[0].startswith("output-")


def test_bash_timeout_exact(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # started at 100; the first poll sees 101 (>= 1 s: killed); elapsed is read at 102
    use_clock(monkeypatch, FakeClock(100.0, 101.0, 102.0, ready=(spill, b"started\n")))
    r = bash(ws, {"command": "echo started; exec sleep 30", "timeout": 1})
    assert r.text == "started\n[timed out after 1 s and was killed; 2.0 s]"
    assert r.summary == "$ echo started; exec sleep 30  (timed out after 1 s and was killed)" and not r.ok


def test_bash_default_timeout_is_120(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, FakeClock(100.0, 220.0, 220.0))
    r = bash(ws, {"command": "exec sleep 30"})
    assert r.text == "[timed out after 120 s and was killed; 120.0 s]"


def test_bash_killed_command_that_exits_0_is_not_ok(ws: Workspace, spill: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(sandbox_mod, "denial", lambda *a: calls.append(a) or "refused")
    box = (types.SimpleNamespace(wrap=lambda argv, conf: argv), "CONF")
    use_clock(monkeypatch, FakeClock(100.0, 101.0, 102.0, ready=(spill, b"ready\n")))
    # the TERM trap makes the killed command exit with status 0
    r = bash(ws, {"command": "trap 'exit 0' TERM; echo ready; sleep 30 & wait", "timeout": 1}, sandbox=box)
    assert r.text == "ready\n[timed out after 1 s and was killed; 2.0 s]"
    assert not r.ok and r.blocked == "" and calls == []  # a timeout is never put down to the sandbox


def test_bash_sandbox_denial_named(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    verdicts = iter(["writing x was refused", ""])
    monkeypatch.setattr(sandbox_mod, "denial", lambda *a: calls.append(a) or next(verdicts))
    box = (types.SimpleNamespace(wrap=lambda argv, conf: argv), "CONF")
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    r = bash(ws, {"command": "echo no; exit 1"}, sandbox=box)
    assert calls == [("no\n", 1, "CONF")]
    assert r.blocked == "writing x was refused" and not r.ok
    assert r.summary == "$ echo no; exit 1  (exit status 1; stopped by the sandbox)"
    r = bash(ws, {"command": "exit 2"}, sandbox=box)
    assert r.blocked == "" and r.summary == "$ exit 2  (exit status 2)"


def test_bash_stopped_by_user_exact(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    ws.stop.set()
    try:
        r = bash(ws, {"command": "exec sleep 30"})
    finally:
        ws.stop.clear()
    assert r.text == "[stopped by the user and killed; 0.0 s]"
    assert r.summary == "$ exec sleep 30  (stopped by the user and killed)" and not r.ok


def test_bash_stop_seen_within_a_short_poll(ws: Workspace, spill: Path) -> None:
    # Already stopped: the command is killed after the first 0.1 s poll, not after a long wait.
    ws.stop.set()
    try:
        r = bash(ws, {"command": "exec sleep 30"})
    finally:
        ws.stop.clear()
    elapsed = float(r.text.rsplit("; ", 1)[1].removesuffix(" s]"))
    assert elapsed < 1.0


# -- background jobs ------------------------------------------------------------------------------------

def test_jobs_numbered_from_1_and_stopped_at_exit(ws: Workspace, spill: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[tuple] = []
    monkeypatch.setattr(shell.atexit, "register", lambda *a: registered.append(a))
    jobs = Jobs()
    assert registered == [(jobs.stop_all,)]
    r = bash(ws, {"command": "exec sleep 30", "background": True}, jobs)
    assert r.text == 'started background job 1; check it with job(id=1, action="status")'
    assert r.summary == "$ exec sleep 30  (background job 1)"
    done = jobs.add(ws, "true")
    third = jobs.add(ws, "exec sleep 30")
    assert (done.id, third.id) == (2, 3) and sorted(jobs.jobs) == [1, 2, 3]
    assert done.out == spill / "job-2.log"
    done.proc.wait(10)
    jobs.stop_all()
    assert jobs.jobs[1].proc.returncode == -signal.SIGTERM and third.proc.returncode == -signal.SIGTERM
    assert done.proc.returncode == 0


def test_job_status_text(tmp_path: Path) -> None:
    p = subprocess.Popen(["sleep", "30"])
    j = ShellJob(1, "sleep 30", p, tmp_path / "none.log")
    assert j.status() == "running"
    p.kill()
    p.wait()
    assert j.status() == "exited with status -9"


def test_job_tool_exact(ws: Workspace, spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = Jobs()
    with pytest.raises(ToolError, match=r"^missing required parameter 'id'$"):
        job(ws, {}, jobs)
    j = jobs.add(ws, r"printf 'ready \xc3\xa9 \xff\n'; exec sleep 30")
    deadline = time.monotonic() + 10
    while j.out.read_bytes() == b"" and time.monotonic() < deadline:
        time.sleep(0.05)
    j.started = 100.0
    use_clock(monkeypatch, FakeClock(107.0, step=0.0))
    cmd = r"printf 'ready \xc3\xa9 \xff\n'; exec sleep 30"
    with ascii_locale():
        r = job(ws, {"id": 1}, jobs)  # default action: status
    assert r.text == f"job 1 ({cmd}): running, 7 s\nready é \ufffd"
    assert r.summary == "job 1: running"
    with ascii_locale():
        r = job(ws, {"id": 1, "action": "output"}, jobs)
    assert r.text == f"job 1 ({cmd}): running, 7 s\nready é \ufffd"
    with pytest.raises(ToolError, match=r"^action must be status, output or stop$"):
        job(ws, {"id": 1, "action": "kill"}, jobs)
    r = job(ws, {"id": 1, "action": "stop"}, jobs)
    assert (r.text, r.summary) == ("job 1 stopped (exited with status -15)", "job 1: stopped")
    r = job(ws, {"id": 1, "action": "stop"}, jobs)
    assert (r.text, r.summary) == ("job 1 had already finished (exited with status -15)",
                                   "job 1: had already finished")


def test_job_without_output_file(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = Jobs()
    p = subprocess.Popen(["true"])
    p.wait()
    jobs.jobs[4] = ShellJob(4, "true", p, tmp_path / "gone.log", started=100.0)
    use_clock(monkeypatch, FakeClock(100.0, step=0.0))
    r = job(ws, {"id": 4}, jobs)
    assert r.text == "job 4 (true): exited with status 0, 0 s\n"
