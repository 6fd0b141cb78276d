"""`ds4 eval`: the suites of suites.py run on the user's model and machine, graded, written as a
trace that can be graded again without the model.

A question case is one user turn through the conversation layer (the chat's own pipeline, with
the case's token budget); a tool case is one agent request in a throwaway repository, the agent
free to edit and run commands there (approvals "yolo", in the workspace-write sandbox, no
network), after which the case's check script decides. Code answers run with their tests in
the same sandbox. Each case's record (prompt, reasoning, answer, finish, tokens, seconds; for a
tool case what the agent did and the check's outcome) is what grading reads, so `--regrade`
of a trace grades exactly what the model wrote, with the extractors as they are now (a tool
case's check ran on a repository that no longer exists: its recorded outcome stands).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..engine import SamplingParams
from . import extract
from .suites import SUITES, Case, cases

if TYPE_CHECKING:
    from ..engine import Engine

TRACE_FORMAT = "ds4-eval-trace-1"
CHECK_SECONDS = 60  # a code answer's tests or a tool case's check


class TraceError(ValueError):
    """A trace that cannot be read or graded; one line."""


@dataclass
class Graded:
    id: str
    suite: str
    kind: str
    passed: bool
    got: str | None  # what the extractor found (or the check's last line)
    expect: str
    tokens: int
    seconds: float
    finish: str


def select(suites: Iterable[str] | None = None, ids: Iterable[str] | None = None) -> list[Case]:
    """The cases of ``suites`` (all when None) and of ``ids``; ValueError naming an unknown one."""
    every = cases()
    suites, ids = list(suites or []), list(ids or [])
    for s in suites:
        if s not in SUITES:
            raise ValueError(f"no suite {s!r} (suites: {', '.join(SUITES)})")
    known = {c.id for c in every}
    for i in ids:
        if i not in known:
            raise ValueError(f"no case {i!r} (ds4 eval --list-cases lists them)")
    if not suites and not ids:
        return every
    return [c for c in every if c.suite in suites or c.id in ids]


# -- running ------------------------------------------------------------------------------------

def run_case(engine: "Engine", case: Case, mode: str, sampling: SamplingParams) -> dict:
    """One case on the engine: its trace record."""
    t0 = time.perf_counter()
    record: dict[str, Any] = {"id": case.id, "suite": case.suite, "kind": case.kind, "prompt": case.prompt}
    if case.kind == "check":
        record.update(_agent_case(engine, case, mode, sampling))
    else:
        record.update(_question(engine, case, mode, sampling))
    record["seconds"] = round(time.perf_counter() - t0, 3)
    return record


def _question(engine: "Engine", case: Case, mode: str, sampling: SamplingParams) -> dict:
    from ..conversation import ContextError, Conversation

    conv = Conversation(engine, mode=mode, sampling=sampling, max_tokens=case.budget)
    reasoning, answer, finish = [], [], ""
    try:
        for ev in conv.turn(case.prompt):
            if ev.kind == "reasoning":
                reasoning.append(ev.text)
            elif ev.kind == "content":
                answer.append(ev.text)
            elif ev.kind == "done":
                finish = ev.finish
    except ContextError as e:
        return {"reasoning": "", "answer": "", "finish": "context", "tokens": 0, "error": str(e)}
    return {"reasoning": "".join(reasoning), "answer": "".join(answer), "finish": finish,
            "tokens": conv.stats.total_generated}


def _agent_case(engine: "Engine", case: Case, mode: str, sampling: SamplingParams) -> dict:
    from ..conversation import Agent
    from ..tools import Policy, Workspace

    with tempfile.TemporaryDirectory(prefix="ds4-eval-") as tmp:
        root = Path(tmp)
        for name, text in case.files.items():
            (root / name).write_text(text, encoding="utf-8")
        policy = Policy("yolo", sandbox="workspace-write", network=False)
        agent = Agent(engine, Workspace(root), policy, None, sampling=sampling, max_tokens=case.budget, mode=mode)
        actions, answer, stop = [], [], ""
        for ev in agent.run(case.prompt):
            if ev.kind in ("tool", "refused"):
                actions.append(("" if ev.ok else "failed: ") + ev.text)
            elif ev.kind == "content":
                answer.append(ev.text)
            elif ev.kind == "done":
                stop = ev.stop
        ok, output = _run_check(root, case.check)
        return {"reasoning": "", "answer": "".join(answer), "actions": actions, "finish": stop,
                "tokens": int(agent.usage.get("output_tokens", 0)), "check_ok": ok, "check_output": output[-2000:]}


def _run_check(root: Path, script: str) -> tuple[bool, str]:
    """Our own check script in the repository, outside the sandbox (it is ours, not the model's)."""
    try:
        r = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                           timeout=CHECK_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"the check ran past {CHECK_SECONDS} s"
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def run_code(code: str, tests: str) -> tuple[bool, str]:
    """The model's code followed by the case's tests, run in a temporary folder in the agent's
    sandbox (writes there only, no network): (passed, the output's last line)."""
    from ..tools import Policy, Workspace, all_tools, run_tool

    with tempfile.TemporaryDirectory(prefix="ds4-eval-code-") as tmp:
        Path(tmp, "answer.py").write_text(code + "\n\n" + tests, encoding="utf-8")
        ws = Workspace(Path(tmp))
        command = f"{shlex.quote(sys.executable)} answer.py"
        result, _ = run_tool(all_tools(), "bash", {"command": command, "timeout": CHECK_SECONDS}, ws,
                             Policy("yolo", sandbox="workspace-write", network=False), None)
    lines = [ln for ln in result.text.splitlines() if ln.strip()]
    return result.ok, lines[-2] if len(lines) > 1 else (lines[-1] if lines else "")


# -- grading ------------------------------------------------------------------------------------

def grade(case: Case, record: dict) -> Graded:
    answer = record.get("answer", "")
    if case.kind == "check":
        ok = bool(record.get("check_ok"))
        out = str(record.get("check_output", "")).strip().splitlines()
        got = "the check passed" if ok else (out[-1] if out else "the check failed")
    elif case.kind == "test":
        body = extract.code(answer)
        if body is None:
            ok, got = False, None
        else:
            ok, last = run_code(body, case.tests)
            got = "its tests passed" if ok else f"its tests failed: {last}"
    else:
        got = extract.EXTRACT[case.kind](answer)
        ok = got is not None and got == case.expect
    return Graded(case.id, case.suite, case.kind, ok, got, case.expect, int(record.get("tokens", 0)),
                  float(record.get("seconds", 0.0)), str(record.get("finish", "")))


# -- traces and reports -------------------------------------------------------------------------

def write_trace(path: str | os.PathLike[str], head: dict, records: list[dict]) -> None:
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"format": TRACE_FORMAT, **head}, ensure_ascii=False) + "\n")
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_trace(path: str | os.PathLike[str]) -> tuple[dict, list[dict]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: {e}") from None
    try:
        rows = [json.loads(ln) for ln in lines if ln.strip()]
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not a trace of ds4 eval (line {e.lineno + 1}: {e.msg})") from None
    if not rows or not isinstance(rows[0], dict) or rows[0].get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}: not a trace of ds4 eval (its first line names no {TRACE_FORMAT})")
    if any(not isinstance(r, dict) or "id" not in r for r in rows[1:]):
        raise TraceError(f"{path}: a record without a case id")
    return rows[0], rows[1:]


def regrade(records: list[dict]) -> list[Graded]:
    by_id = {c.id: c for c in cases()}
    missing = [r["id"] for r in records if r["id"] not in by_id]
    if missing:
        raise TraceError(f"the trace has cases this version does not know: {', '.join(missing[:5])}")
    return [grade(by_id[r["id"]], r) for r in records]


def result_line(g: Graded) -> str:
    word = "PASS" if g.passed else "FAIL"
    got = "nothing to grade" if g.got is None else repr(g.got) if g.kind not in ("test", "check") else g.got
    want = f", expected {g.expect!r}" if not g.passed and g.kind not in ("test", "check") else ""
    return f"{word} {g.suite}/{g.id}: {got}{want} ({g.tokens} tokens, {g.seconds:.1f} s, {g.finish or 'no finish'})"


def summary(graded: list[Graded]) -> list[str]:
    rows = [f"{'suite':10} {'passed':>7} {'tokens':>8} {'seconds':>8}"]
    for s in SUITES:
        mine = [g for g in graded if g.suite == s]
        if mine:
            rows.append(f"{s:10} {sum(g.passed for g in mine):>3}/{len(mine):<3} {sum(g.tokens for g in mine):>8} "
                        f"{sum(g.seconds for g in mine):>8.1f}")
    rows.append(f"{'all':10} {sum(g.passed for g in graded):>3}/{len(graded):<3} {sum(g.tokens for g in graded):>8} "
                f"{sum(g.seconds for g in graded):>8.1f}")
    return rows


def report(head: dict, graded: list[Graded]) -> dict:
    """The JSON report: what ran, each case's grade, the counts per suite."""
    suites = {s: {"passed": sum(g.passed for g in graded if g.suite == s), "cases": sum(g.suite == s for g in graded)}
              for s in SUITES if any(g.suite == s for g in graded)}
    return {**head, "passed": sum(g.passed for g in graded), "cases": len(graded), "suites": suites,
            "results": [asdict(g) for g in graded]}


def self_test_lines() -> list[str]:
    """The extractors' self-tests: one line per failure (none: all pass)."""
    return extract.self_test()
