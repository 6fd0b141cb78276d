"""ds4 eval (verify/extract.py, suites.py, evaluate.py): the extractors pass their self-tests
(and a broken one is caught); every case is sound (its right answer grades as passing, a wrong
one as failing, the tool cases' checks pass on a repository fixed by hand and fail otherwise,
the recall prompts hold the asked fact once); the command lists cases without a model, runs
cases on the demo model into a trace and a JSON report, and regrades the trace without it."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from ds4agent.cli import main
from ds4agent.engine import Engine, SamplingParams
from ds4agent.verify import evaluate as ev
from ds4agent.verify import extract
from ds4agent.verify.suites import cases

SOLUTIONS = {
    "palindrome": "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
    "fizzbuzz": "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' "
                "if i % 5 == 0 else str(i) for i in range(1, n + 1)]\n",
    "merge-intervals": "def merge(iv):\n    out = []\n    for a, b in sorted(iv):\n        if out and a <= out[-1][1]:\n"
                       "            out[-1] = (out[-1][0], max(out[-1][1], b))\n        else:\n            out.append((a, b))\n"
                       "    return out\n",
    "roman": "def roman_to_int(s):\n    v = dict(I=1, V=5, X=10, L=50, C=100, D=500, M=1000)\n    t = 0\n"
             "    for i, c in enumerate(s):\n        t += -v[c] if i + 1 < len(s) and v[s[i + 1]] > v[c] else v[c]\n"
             "    return t\n",
}
FIXES = {
    "fix-failing-test": {"calc.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"},
    "add-function": {"textutil.py": "def shout(text):\n    return text.upper() + '!'\n\n\n"
                                    "def word_count(text):\n    return len(text.split())\n"},
}


def test_the_extractors_pass_their_self_tests_and_a_broken_one_is_caught(monkeypatch) -> None:
    assert extract.self_test() == []
    monkeypatch.setitem(extract.EXTRACT, "integer", lambda text: (extract.conclusion(text).split() or [None])[0])
    assert any(line.startswith("integer:") for line in extract.self_test())


def test_every_case_grades_its_answer_right_and_a_wrong_one_wrong() -> None:
    for c in cases():
        if c.kind == "test":
            right = {"answer": f"Here it is.\n```python\n{SOLUTIONS[c.id]}```"}
            wrong = {"answer": "```python\ndef unrelated():\n    pass\n```"}
        elif c.kind == "check":
            right, wrong = {"check_ok": True}, {"check_ok": False, "check_output": "AssertionError"}
        elif c.kind == "lines":
            right = {"answer": "Answer:\n" + "\n".join(c.expect.split(","))}
            wrong = {"answer": "Answer:\n11\n13"}
        else:
            right = {"answer": f"Some working.\n\n**Answer:** {c.expect}"}
            wrong = {"answer": "Answer: 0" if c.kind != "choice" else "Answer: E"}
        assert ev.grade(c, right).passed, c.id
        assert not ev.grade(c, wrong).passed, c.id


def test_the_tool_cases_checks_pass_only_on_a_fixed_repository() -> None:
    for c in [c for c in cases() if c.kind == "check"]:
        for files, want in ((c.files, False), ({**c.files, **FIXES[c.id]}, True)):
            with tempfile.TemporaryDirectory() as tmp:
                for name, text in files.items():
                    Path(tmp, name).write_text(text)
                assert ev._run_check(Path(tmp), c.check)[0] is want, c.id  # noqa: SLF001
    fix = next(c for c in cases() if c.id == "fix-failing-test")
    with tempfile.TemporaryDirectory() as tmp:  # passing by editing the test is not passing
        Path(tmp, "calc.py").write_text(fix.files["calc.py"])
        Path(tmp, "test_calc.py").write_text("print('ok')\n")
        assert not ev._run_check(Path(tmp), fix.check)[0]  # noqa: SLF001


def test_the_recall_prompts_hold_the_asked_fact_once() -> None:
    for c in [c for c in cases() if c.suite == "recall"]:
        question = c.prompt.rsplit("\n", 1)[-1]
        vault = question.split("code of the ")[1].split("?")[0]  # "<colour> vault in the <place>"
        assert c.prompt.count(f"The {vault} opens with the code") == 1
        assert f"The {vault} opens with the code {c.expect}." in c.prompt


def test_cases_run_on_the_demo_model_and_the_trace_regrades(demo_path, tmp_path, capsys) -> None:
    """The demo model's answers are noise: every case fails, and says so; the trace holds what
    it wrote, and a trace whose answer is then right regrades as passing."""
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        small = {c.id: replace(c, budget=48) for c in cases() if c.id in ("product", "fix-failing-test")}
        for c in small.values():
            rec = ev.run_case(e, c, "thinking", SamplingParams(temperature=0))
            assert rec["tokens"] > 0 and rec["finish"] and not ev.grade(c, rec).passed
            if c.kind == "check":
                assert rec["check_ok"] is False and "check_output" in rec
    trace, report = tmp_path / "t.jsonl", tmp_path / "r.json"
    base = ["eval", "-m", str(demo_path), "--ctx", "4096", "--case", "product", "-n", "256"]
    assert main(base + ["--trace", str(trace), "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "FAIL reasoning/product" in out and "all          0/1" in out and "(256 tokens" in out
    r = json.loads(report.read_text())
    assert r["cases"] == 1 and r["passed"] == 0 and r["results"][0]["id"] == "product" and r["mode"] == "thinking"
    assert main(base + ["--trace", str(trace)]) == 2  # a trace is never overwritten
    assert "already exists" in capsys.readouterr().err
    assert main(["eval", "--regrade", str(trace)]) == 1
    head, records = ev.read_trace(trace)
    records[0]["answer"] = "37 x 43 = 1591\nAnswer: 1591"
    ev.write_trace(trace, head, records)
    assert main(["eval", "--regrade", str(trace)]) == 0
    assert "PASS reasoning/product: '1591'" in capsys.readouterr().out


def test_the_command_without_a_model(tmp_path, capsys) -> None:
    assert main(["eval", "--list-cases", "--suite", "code"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 4 and "palindrome" in out
    assert main(["eval", "--suite", "poetry"]) == 2
    assert "no suite 'poetry'" in capsys.readouterr().err
    assert main(["eval", "--self-test"]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert main(["eval", "--regrade", str(bad)]) == 2
    assert "not a trace of ds4 eval" in capsys.readouterr().err
