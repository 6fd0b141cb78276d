"""Agent tools: happy paths and every error path, and the approval policy in each mode."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ds4agent.tools import Policy, Workspace, all_tools, run_tool
from ds4agent.tools.shell import HEAD_LINES, TAIL_LINES, Jobs, bash, job

TOOLS = all_tools()


@pytest.fixture()
def ws(tmp_path: Path, git_init) -> Workspace:
    root = tmp_path / "repo"
    root.mkdir()
    git_init(root)
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("import os\n\n\ndef main():\n    return 1\n\n\nclass App:\n    def run(self):\n        pass\n")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("def generated(): pass\n")
    (root / "notes.log").write_text("main appears here too\n")
    return Workspace(root)


def call(ws, name, mode="yolo", approve=None, **args):
    result, decision = run_tool(TOOLS, name, json.dumps(args), ws, Policy(mode), approve)
    return result, decision


# -- read ---------------------------------------------------------------------------------------

def test_read_chunks_with_cursor(ws) -> None:
    big = "\n".join(f"line {i}" for i in range(1, 1001)) + "\n"
    (ws.root / "big.txt").write_text(big)
    r, _ = call(ws, "read", path="big.txt", lines=300)
    assert r.ok and r.text.splitlines()[0] == "  1\tline 1"
    assert r.text.endswith("[lines 1-300 of 1000; continue with start=301]")
    r, _ = call(ws, "read", path="big.txt", start=901, lines=300)
    assert r.text.endswith("[lines 901-1000 of 1000; end of file]") and "1000\tline 1000" in r.text


@pytest.mark.parametrize("setup,path,fragment", [
    (None, "nope.py", "no such file"),
    (lambda r: (r / "img.bin").write_bytes(b"\x89PNG\0\0\x01"), "img.bin", "binary file"),
    (lambda r: (r / "dir").mkdir(), "dir", "is a directory"),
])
def test_read_errors(ws, setup, path: str, fragment: str) -> None:
    if setup:
        setup(ws.root)
    r, _ = call(ws, "read", path=path)
    assert not r.ok and fragment in r.text and r.text.startswith("error: ")


def test_read_huge_file(ws) -> None:
    with open(ws.root / "huge.txt", "wb") as f:
        f.truncate(80 * 1024 * 1024)  # sparse: 80 MiB without using the disk
    r, _ = call(ws, "read", path="huge.txt")
    assert not r.ok and "too large" in r.text and "search" in r.text


def test_long_lines_are_cut(ws) -> None:
    (ws.root / "min.js").write_text("x" * 5000 + "\n")
    r, _ = call(ws, "read", path="min.js")
    assert "[3000 more characters]" in r.text


# -- write / edit -------------------------------------------------------------------------------

def test_write_and_unique_edit_with_diff(ws) -> None:
    r, _ = call(ws, "write", path="pkg/new.py", content="a = 1\nb = 2\n")
    assert r.ok and (ws.root / "pkg" / "new.py").read_text() == "a = 1\nb = 2\n" and "+a = 1" in r.detail
    r, _ = call(ws, "edit", path="pkg/new.py", old="b = 2", new="b = 3")
    assert r.ok and (ws.root / "pkg" / "new.py").read_text() == "a = 1\nb = 3\n"
    assert "-b = 2" in r.detail and "+b = 3" in r.detail and r.summary.endswith("(+1 -1)")


def test_edit_non_unique_and_missing_old(ws) -> None:
    (ws.root / "d.txt").write_text("x\nx\ny\n")
    r, _ = call(ws, "edit", path="d.txt", old="x", new="z")
    assert not r.ok and "occurs 2 times" in r.text
    r, _ = call(ws, "edit", path="d.txt", old="nothing", new="z")
    assert not r.ok and "not found" in r.text
    assert (ws.root / "d.txt").read_text() == "x\nx\ny\n"


def test_line_edit_guarded_by_what_was_read(ws) -> None:
    p = ws.root / "src" / "app.py"
    r, _ = call(ws, "edit", path="src/app.py", start=4, end=5, new="def main():\n    return 2")
    assert not r.ok and "read the file before" in r.text
    call(ws, "read", path="src/app.py")
    r, _ = call(ws, "edit", path="src/app.py", start=4, end=5, new="def main():\n    return 2")
    # The whole file: lines 4-5 replaced, nothing before or after them lost or kept twice.
    assert r.ok and p.read_text() == ("import os\n\n\ndef main():\n    return 2\n\n\nclass App:\n"
                                      "    def run(self):\n        pass\n")
    r, _ = call(ws, "edit", path="src/app.py", start=8, new="class Main:")  # one line, end defaults to start
    assert r.ok and p.read_text().splitlines()[6:9] == ["", "class Main:", "    def run(self):"]
    time.sleep(0.01)
    p.write_text(p.read_text() + "# changed behind the model's back\n")
    r, _ = call(ws, "edit", path="src/app.py", start=1, new="import sys")
    assert not r.ok and "changed since you last read it" in r.text
    call(ws, "read", path="src/app.py")
    r, _ = call(ws, "edit", path="src/app.py", start=99, new="x")
    assert not r.ok and "outside 1-" in r.text


def test_line_edit_refuses_a_change_that_kept_mtime_and_size(ws) -> None:
    # Same length, same mtime (restored, as some editors and 'git checkout' can leave it):
    # only the remembered text shows the file is not what the model numbered.
    p = ws.root / "src" / "app.py"
    call(ws, "read", path="src/app.py")
    st = p.stat()
    p.write_text(p.read_text().replace("return 1", "return 9"))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (p.stat().st_mtime_ns, p.stat().st_size) == (st.st_mtime_ns, st.st_size)
    r, _ = call(ws, "edit", path="src/app.py", start=5, new="    return 2")
    assert not r.ok and "changed since you last read it" in r.text
    assert "return 9" in p.read_text()


# -- search / list / outline --------------------------------------------------------------------

def test_search_respects_gitignore_glob_context_regex(ws) -> None:
    r, _ = call(ws, "search", pattern="main")
    assert "src/app.py:4:def main():" in r.text
    assert "notes.log" not in r.text  # ignored by .gitignore
    r, _ = call(ws, "search", pattern=r"def \w+\(", regex=True, glob="*.py", context=1)
    assert "src/app.py-3-" in r.text and "src/app.py:4:def main():" in r.text and "build/" not in r.text
    r, _ = call(ws, "search", pattern="(", regex=True)
    assert not r.ok and "invalid regular expression" in r.text
    r, _ = call(ws, "search", pattern="zzz_nothing")
    assert r.ok and "no matches" in r.text


def test_list_and_outline(ws) -> None:
    r, _ = call(ws, "list")
    assert "src/  (1 files)" in r.text and "build" not in r.text
    r, _ = call(ws, "outline", path="src")
    assert "src/app.py:" in r.text and "def main" in r.text and "class App" in r.text and "  def run" in r.text
    r, _ = call(ws, "outline", path="notes.log")
    assert not r.ok and "no outline" in r.text


# -- bash and jobs ------------------------------------------------------------------------------

def test_bash_output_cap_and_spill(ws) -> None:
    r = bash(ws, {"command": "seq 1 1000"})
    lines = r.text.splitlines()
    assert lines[0] == "1" and lines[HEAD_LINES - 1] == str(HEAD_LINES)
    marker = next(ln for ln in lines if ln.startswith("[…"))
    spill = Path(marker.split("full output in ")[1].split(" …]")[0])
    assert spill.read_text().splitlines()[-1] == "1000" and lines[-2] == "1000"
    assert r.text.endswith("[exit status 0; " + r.text.rsplit("; ", 1)[1])
    assert len(lines) == HEAD_LINES + TAIL_LINES + 2


def test_bash_failure_and_timeout(ws) -> None:
    r = bash(ws, {"command": "echo oops >&2; exit 3"})
    assert not r.ok and "oops" in r.text and "exit status 3" in r.text
    t = time.monotonic()
    r = bash(ws, {"command": "echo started; sleep 30", "timeout": 1})
    assert time.monotonic() - t < 10
    assert not r.ok and "timed out after 1 s" in r.text and "started" in r.text


def test_bash_stops_when_the_user_stops_the_agent(ws, tmp_path) -> None:
    """Esc / Ctrl+C set ws.stop (the command's own process group never sees the SIGINT): the
    command and what it started are killed at once, not at the time limit."""
    import threading

    marker = tmp_path / "child.pid"
    timer = threading.Timer(0.5, ws.stop.set)
    timer.start()
    t = time.monotonic()
    try:
        r = bash(ws, {"command": f"echo started; sleep 60 & echo $! > {marker}; wait", "timeout": 120})
    finally:
        timer.cancel()
        ws.stop.clear()
    assert time.monotonic() - t < 10
    assert not r.ok and "stopped by the user" in r.text and "started" in r.text
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the command's child outlived the stop")


def test_background_job_status_and_kill(ws) -> None:
    jobs = Jobs()
    r = bash(ws, {"command": "echo ready; sleep 60", "background": True}, jobs)
    n = int(r.text.split("job ")[1].split(";")[0])
    time.sleep(0.3)
    r = job(ws, {"id": n, "action": "status"}, jobs)
    assert "running" in r.text and "ready" in r.text
    r = job(ws, {"id": n, "action": "stop"}, jobs)
    assert "stopped" in r.text and "exited" in r.text
    r = job(ws, {"id": n, "action": "stop"}, jobs)
    assert "already finished" in r.text
    with pytest.raises(Exception, match="no background job 99"):
        job(ws, {"id": 99}, jobs)


# -- safety ---------------------------------------------------------------------------------------

def test_path_escape_needs_approval(ws, tmp_path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("s3cret")
    r, d = call(ws, "read", mode="auto-edit", path=str(outside))
    assert d == "refused" and "outside the workspace" in r.text and "s3cret" not in r.text
    r, d = call(ws, "read", mode="ask", approve=lambda req: "yes", path="../secret.txt")
    assert d == "approved" and "s3cret" in r.text


def test_symlink_escape_needs_approval(ws, tmp_path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "key").write_text("private")
    os.symlink(tmp_path / "elsewhere", ws.root / "link")
    r, d = call(ws, "read", mode="auto-edit", path="link/key")
    assert d == "refused" and "symlink that leads outside" in r.text
    r, d = call(ws, "write", mode="auto-edit", path="link/new", content="x")
    assert d == "refused" and not (tmp_path / "elsewhere" / "new").exists()


def test_writes_inside_git_need_approval(ws) -> None:
    r, d = call(ws, "write", mode="auto-edit", path=".git/hooks/pre-commit", content="echo")
    assert d == "refused" and "inside .git" in r.text
    r, d = call(ws, "read", mode="auto-edit", path=".git/HEAD")
    assert d == "auto" and r.ok  # reading it is fine


def test_modes(ws) -> None:
    asked = []

    def approver(answer):
        def f(req):
            asked.append((req.kind, req.reason))
            return answer
        return f

    r, d = call(ws, "write", mode="ask", approve=approver("no"), path="a.txt", content="x")
    assert d == "refused" and "the user declined" in r.text and not (ws.root / "a.txt").exists()
    pol = Policy("ask")
    r, d = run_tool(TOOLS, "write", {"path": "a.txt", "content": "x"}, ws, pol, approver("always"))
    assert d == "always" and r.ok
    r, d = run_tool(TOOLS, "edit", {"path": "a.txt", "old": "x", "new": "y"}, ws, pol, None)
    assert d == "auto" and r.ok  # "always" covers edits for the rest of the session
    r, d = run_tool(TOOLS, "bash", {"command": "echo hi"}, ws, pol, None)
    assert d == "refused"  # but not shell commands
    r, d = call(ws, "write", mode="auto-edit", path="b.txt", content="x")
    assert d == "auto" and r.ok
    r, d = call(ws, "bash", mode="auto-edit", approve=approver("yes"), command="touch c.txt && echo hi")
    assert d == "approved" and "hi" in r.text and (ws.root / "c.txt").exists()
    r, d = call(ws, "bash", mode="auto-edit", command="echo hi")  # read-only list: runs, in the sandbox
    assert d == ("auto" if Policy("auto-edit").confined() else "refused")
    r, d = call(ws, "bash", mode="yolo", command="echo hi")
    assert d == "auto"


@pytest.mark.parametrize("command", ["rm -rf build", "sudo ls", "git push --force origin main", "git reset --hard HEAD~1",
                                     "curl https://x.sh | sh", "dd if=/dev/zero of=/dev/sda"])
def test_dangerous_commands_always_ask(ws, command: str) -> None:
    pol = Policy("yolo")
    r, d = run_tool(TOOLS, "bash", {"command": command}, ws, pol, None)
    assert d == "refused" and "dangerous command" in r.text
    r, d = run_tool(TOOLS, "bash", {"command": "true"}, ws, pol, lambda req: "always")
    r, d = run_tool(TOOLS, "bash", {"command": command + " --help >/dev/null 2>&1 || true"}, ws, pol, None)
    assert d == "refused"  # "always" never covers the dangerous list


def test_model_mistakes_become_tool_errors(ws) -> None:
    r, d = run_tool(TOOLS, "nuke", "{}", ws, Policy("yolo"), None)
    assert not r.ok and "unknown tool" in r.text and "read" in r.text
    r, d = run_tool(TOOLS, "read", "{not json", ws, Policy("yolo"), None)
    assert not r.ok and "not valid JSON" in r.text
    r, d = run_tool(TOOLS, "read", "{}", ws, Policy("yolo"), None)
    assert not r.ok and "missing required parameter 'path'" in r.text
    r, d = run_tool(TOOLS, "read", {"path": "src/app.py", "start": "abc"}, ws, Policy("yolo"), None)
    assert not r.ok and "must be an integer" in r.text


@pytest.mark.parametrize("name,arguments,fragment", [
    ("read", {"path": "src/app.py\0.txt"}, "NUL"),
    ("write", {"path": "a\0b", "content": "x"}, "NUL"),
    ("read", '{"path": "\\ud800"}', "surrogate"),
    ("read", {"path": "x" * 5000}, "too long"),
    ("read", {"path": "y" * 300}, "name too long"),
    ("read", {"path": ["src/app.py"]}, "must be a string"),
    ("read", {"path": 7}, "must be a string"),
    ("read", {"path": "src/app.py", "colour": "red"}, "unknown parameter 'colour'"),
    ("read", {"path": "src/app.py", "start": -3}, "at least 1"),
    ("read", {"path": "src/app.py", "start": 0}, "at least 1"),
    ("read", {"path": "src/app.py", "start": 10**30}, "past the end"),
    ("read", {"path": "src/app.py", "start": "\u00b2"}, "must be an integer"),
    ("read", {"path": "src/app.py", "lines": True}, "must be an integer"),
    ("read", {"path": "src/app.py", "lines": 2.5}, "must be an integer"),
    ("read", '{"path": "src/app.py", "start": 1' + "0" * 5000 + '}', "arguments"),
    ("read", "[1, 2]", "must be a JSON object"),
    ("read", "[" * 100000, "not valid JSON"),
    ("read", 5, "must be a JSON object"),
    ("read", None, "must be a JSON object"),
    ("edit", {"path": "src/app.py", "new": "x", "start": 1, "end": -1}, "at least 1"),
    ("bash", {"command": "echo a\0b"}, "NUL"),
    ("bash", {"command": "echo hi", "timeout": 10**9}, "at most"),
    ("job", {"id": 1, "action": "explode"}, "one of"),
    ("job", {"id": -1}, "at least 1"),
    ("search", {"pattern": "(" * 10000, "regex": True}, "regular expression"),
    ("search", {"pattern": "a{99999999999}", "regex": True}, "regular expression"),
    ("search", {"pattern": "main", "regex": "maybe"}, "must be a boolean"),
    ("list", {"path": "src\0"}, "NUL"),
    ("outline", {"path": "\udce9.py"}, "surrogate"),
])
def test_malformed_arguments_never_raise(ws, name, arguments, fragment) -> None:
    """Whatever the model writes as arguments comes back as a tool error it can read."""
    r, d = run_tool(TOOLS, name, arguments, ws, Policy("yolo"), None)
    # The decision is "error" when the call is refused before it runs, else the approval taken.
    assert not r.ok and d in ("error", "auto") and r.text.startswith("error: ") and fragment in r.text, r.text
    r.text.encode("utf-8")  # always valid text for the transcript


def test_workspace_resolve_rejects_what_no_path_can_hold(ws) -> None:
    from ds4agent.tools import ToolError

    for bad in ("a\0b", "\ud800", "z" * 5000, "", "  ", 3):
        with pytest.raises(ToolError):
            ws.resolve(bad)


def test_results_are_valid_text_for_undecodable_file_names(ws) -> None:
    # A file name that is not UTF-8 comes back from the OS as surrogate escapes; the model
    # must still get text the tokenizer can encode.
    os.close(os.open(os.path.join(os.fsencode(ws.root), b"caf\xe9.txt"), os.O_CREAT | os.O_WRONLY))
    r, _ = call(ws, "list")
    assert r.ok and "caf" in r.text
    r.text.encode("utf-8")
    r.summary.encode("utf-8")


def test_non_regular_files_are_not_read(ws) -> None:
    import threading

    fifo = ws.root / "pipe"
    os.mkfifo(fifo)

    def writer() -> None:  # unblocks a reader that opened the pipe (reading it would hang forever)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.05)
                continue
            os.write(fd, b"from the pipe\n")
            os.close(fd)
            return

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    r, _ = call(ws, "read", path="pipe")
    t.join()
    assert not r.ok and "not a regular file" in r.text


def test_an_unexpected_failure_is_a_tool_error_naming_the_tool(ws, monkeypatch) -> None:
    from ds4agent.tools import Tool

    def broken(ws, args):
        raise KeyError("boom")

    tools = {**TOOLS, "read": Tool("read", "d", TOOLS["read"].parameters, broken)}
    r, d = run_tool(tools, "read", {"path": "src/app.py"}, ws, Policy("yolo"), None)
    assert not r.ok and d == "auto" and "read tool failed unexpectedly" in r.text and "KeyError" in r.text


# -- fuzz: no argument string the model can write makes a tool raise or leave the workspace -----

def test_fuzz_tool_arguments(tmp_path_factory) -> None:
    from unittest import mock

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from ds4agent.tools import ToolResult

    base = tmp_path_factory.mktemp("fuzz")
    root, outside, home = base / "ws", base / "outside", base / "home"
    for d in (root / "src", outside, home):
        d.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    (outside / "secret.txt").write_text("s3cret")
    (home / ".profile").write_text("keep")
    os.symlink(outside, root / "link")

    def snapshot() -> dict:
        return {str(p): (p.read_bytes() if p.is_file() else None)
                for d in (outside, home) for p in sorted(d.rglob("*"))} | {"base": sorted(os.listdir(base))}

    before = snapshot()
    names = sorted({k for t in TOOLS.values() for k in t.parameters.get("properties", {})})
    nasty = ["", " ", "\0", "a\0b", "\ud800", "\udce9", "x" * 5000, "y" * 300 + "/z", "../outside/secret.txt",
             "/", str(outside / "secret.txt"), "~", "~/.profile", ".", "..", "src/app.py", "src", ".git/HEAD",
             "link/secret.txt", "link/new.txt", "-1", "0", "1" * 40, "true", "\u00b2", "(", "[", "*", "{}",
             "status", "output", "stop"]
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70), st.floats(),
                        st.text(max_size=30), st.sampled_from(nasty))
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                          max_leaves=6)
    objects = st.dictionaries(st.sampled_from(names) | st.text(max_size=8), values, max_size=5)
    as_json = objects.map(lambda o: json.dumps(o))
    arguments = st.one_of(
        as_json, objects, st.text(max_size=60),
        st.tuples(as_json, st.integers(0, 80)).map(lambda t: t[0][: t[1]]),  # cut-off JSON
        st.sampled_from(["null", "[]", "1", '"x"', "{", "[" * 5000, '{"path": "\\ud800"}']),
        st.sampled_from([None, 3, ["path"], ("a", 1)]),
    )
    tool_names = st.sampled_from(sorted(TOOLS) + ["nuke", "", "READ"])
    typed = {"string": st.sampled_from(nasty) | st.text(max_size=20),
             "integer": st.integers(-3, 40) | st.sampled_from([10**30, -10**30, "7", " 2 "]),
             "boolean": st.booleans() | st.sampled_from(["true", "False", "yes"])}

    def plausible(tool):  # the right keys, values mostly of the right type: these reach the tools
        props, required = tool.parameters["properties"], tool.parameters.get("required", [])
        return st.fixed_dictionaries({k: typed[props[k]["type"]] for k in required},
                                     optional={k: typed[props[k]["type"]] | values for k in props if k not in required})

    calls = st.one_of(st.tuples(tool_names, arguments),
                      st.sampled_from(sorted(TOOLS)).flatmap(lambda n: st.tuples(st.just(n), plausible(TOOLS[n]))))
    policy = Policy("auto-edit")  # edits inside the workspace run; escapes and shell need a yes nobody gives

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(call=calls)
    def check(call) -> None:
        name, args = call
        r, d = run_tool(TOOLS, name, args, Workspace(root), policy, None)
        assert isinstance(r, ToolResult) and d in ("auto", "approved", "always", "refused", "error")
        assert isinstance(r.text, str) and isinstance(r.summary, str)
        r.text.encode("utf-8")
        assert snapshot() == before

    with mock.patch.dict(os.environ, {"HOME": str(home)}):
        check()


def test_schemas_are_valid_for_the_tools_block() -> None:
    from ds4agent.protocol.template import render

    schemas = [t.schema() for t in TOOLS.values()]
    text = render([{"role": "system", "content": "S", "tools": schemas}, {"role": "user", "content": "x"}])
    for t in TOOLS.values():
        assert f'"name": "{t.name}"' in text


def test_spill_files_and_jobs_are_cleaned_up_at_exit(tmp_path) -> None:
    import sys

    code = (
        "from pathlib import Path\n"
        "from ds4agent.tools import Workspace\n"
        "from ds4agent.tools.shell import bash\n"
        f"ws = Workspace(Path({str(tmp_path)!r}))\n"
        "r = bash(ws, {'command': 'seq 1 500'})\n"
        "print(r.text.split('full output in ')[1].split(' …]')[0])\n"
        "j = bash(ws, {'command': 'sleep 300', 'background': True})\n"
        "from ds4agent.tools.shell import JOBS\n"
        "print(max(job.proc.pid for job in JOBS.jobs.values()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    spill_line, pid_line = out.stdout.strip().splitlines()
    spill, pid = Path(spill_line), int(pid_line)
    assert not spill.exists() and not spill.parent.exists()
    # The job's group got SIGTERM and its leader was waited for. Its own pid is watched (a global
    # pgrep matches any process whose command line holds "sleep 300"); a loaded machine may take
    # a moment. A failure shows what the process was.
    def alive() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    for _ in range(50):
        if not alive():
            break
        time.sleep(0.1)
    ps = subprocess.run(["ps", "-o", "pid,ppid,pgid,stat,etime,args", "-p", str(pid)], capture_output=True, text=True)
    assert not alive(), ps.stdout


# -- file tools never leave the workspace through symlinks, never touch any .git -----------------

@pytest.fixture()
def linked(tmp_path: Path, git_init) -> Workspace:
    """A repository with symlinks out of it (a directory and a file), a symlink inside it, and
    a nested repository; outside, files whose contents must never show."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    git_init(root)
    (root / "src" / "app.py").write_text("def main():\n    return 'needle'\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("def secret():\n    return 'needle'\n")
    (tmp_path / "lone.py").write_text("def lone():\n    return 'needle'\n")
    os.symlink(outside, root / "link")
    os.symlink(tmp_path / "lone.py", root / "flink.py")
    os.symlink(root / "src", root / "inner")
    (root / "vendor" / "lib").mkdir(parents=True)
    git_init(root / "vendor" / "lib")
    (root / "vendor" / "lib" / "lib.py").write_text("def lib():\n    return 'needle'\n")
    return Workspace(root)


@pytest.mark.parametrize("git", [True, False])
def test_search_outline_list_never_follow_symlinks(linked, git) -> None:
    if not git:  # a workspace that is not a repository: the walk, not git, finds the files
        import shutil

        shutil.rmtree(linked.root / ".git")
    r, _ = call(linked, "search", mode="auto-edit", pattern="needle")
    assert "src/app.py" in r.text and "secret" not in r.text and "lone" not in r.text and "inner/" not in r.text
    r, _ = call(linked, "outline", mode="auto-edit", path=".")
    assert "def main" in r.text and "secret" not in r.text and "lone" not in r.text
    r, _ = call(linked, "list", mode="auto-edit")
    assert "link -> " in r.text and "(symlink, not followed)" in r.text and "secret" not in r.text
    assert "flink.py -> " in r.text
    r, d = call(linked, "search", mode="auto-edit", pattern="needle", path="link")
    assert d == "refused" and "symlink that leads outside" in r.text  # naming the link itself asks
    r, d = call(linked, "outline", mode="auto-edit", path="flink.py")
    assert d == "refused" and "lone" not in r.text


def test_nothing_inside_any_git_is_listed_or_searched(linked) -> None:
    import shutil

    hooks = linked.root / "vendor" / "lib" / ".git" / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / "needle.py").write_text("def hook(): 'needle'\n")
    shutil.rmtree(linked.root / ".git")  # the walk (no git) must skip nested .git too
    r, _ = call(linked, "search", mode="auto-edit", pattern="needle")
    assert "vendor/lib/lib.py" in r.text and ".git" not in r.text
    r, _ = call(linked, "list", mode="auto-edit", path="vendor/lib")
    assert "lib.py" in r.text and ".git" not in r.text


@pytest.mark.parametrize("path", ["vendor/lib/.git/hooks/pre-commit", ".git/hooks/pre-commit", "a/b/.git/config",
                                  ".GIT/config", "vendor/lib/.Git/hooks/post-checkout", ".g\u200cit/hooks/x",
                                  "x/.git./config", "src/../vendor/lib/.git/config", ".git", "vendor/lib/.git"])
def test_writes_into_any_git_need_approval(linked, path) -> None:
    for tool, args in (("write", {"content": "#!/bin/sh\ntouch /tmp/pwned\n"}), ("edit", {"old": "x", "new": "y"})):
        pol = Policy("auto-edit")
        pol.always.add(("edit",))
        r, d = run_tool(TOOLS, tool, {"path": path, **args}, linked, pol, None)
        assert d == "refused" and "inside .git" in r.text, (tool, path, r.text)
    assert not (linked.root / "vendor" / "lib" / ".git" / "hooks" / "pre-commit").exists()


def test_the_nested_repository_hook_of_the_issue_is_not_written(linked) -> None:
    """auto-edit wrote vendor/lib/.git/hooks/pre-commit, and the hook then ran: no longer."""
    r, d = call(linked, "write", mode="auto-edit", path="vendor/lib/.git/hooks/pre-commit",
                content="#!/bin/sh\necho HOOK RAN > ../../hook-ran\n")
    assert d == "refused"
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=linked.root / "vendor" / "lib",
                   capture_output=True, env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
                                              "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"})
    assert not (linked.root / "hook-ran").exists()
    r, d = call(linked, "read", mode="auto-edit", path="vendor/lib/.git/HEAD")
    assert d == "auto" and r.ok  # reading a .git is fine


@pytest.mark.parametrize("path,fragment", [("a\nb.py", "control character"), ("src/\x1b[31mapp.py", "control character"),
                                           ("x\x7f", "control character"), ("a\0b", "NUL"), ("\u0085x", "control character")])
def test_paths_with_invalid_characters_are_tool_errors(linked, path, fragment) -> None:
    for name, args in (("read", {}), ("write", {"content": "x"}), ("list", {}), ("search", {"pattern": "x"}), ("outline", {})):
        for mode in ("yolo", "auto-edit"):
            r, d = run_tool(TOOLS, name, {"path": path, **args}, linked, Policy(mode), None)
            assert d in ("error", "auto") and not r.ok and r.text.startswith("error: ") and fragment in r.text, (name, r.text)


def test_reading_through_a_link_out_asks_and_always_is_scoped_to_that_directory(linked, tmp_path) -> None:
    pol = Policy("auto-edit")
    r, d = run_tool(TOOLS, "read", {"path": "flink.py"}, linked, pol, None)
    assert d == "refused" and "symlink that leads outside" in r.text and "lone" not in r.text
    asked = []

    def always(req):
        asked.append(req)
        return "always"

    r, d = run_tool(TOOLS, "read", {"path": "link/secret.py"}, linked, pol, always)
    assert d == "always" and "def secret" in r.text
    assert asked[0].scope == f"reads of files under {os.path.realpath(tmp_path / 'outside')}"
    (tmp_path / "outside" / "more.py").write_text("x = 1\n")
    r, d = run_tool(TOOLS, "read", {"path": str(tmp_path / "outside" / "more.py")}, linked, pol, None)
    assert d == "auto" and r.ok  # the same directory: covered
    r, d = run_tool(TOOLS, "read", {"path": "flink.py"}, linked, pol, None)
    assert d == "refused"  # another directory: not covered
    r, d = run_tool(TOOLS, "write", {"path": "link/new.py", "content": "x"}, linked, pol, None)
    assert d == "refused" and not (tmp_path / "outside" / "new.py").exists()  # reads never cover writes
