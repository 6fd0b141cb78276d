"""The interactive agent in a real pty (pexpect), the model's answers dictated
(tests/agent_script.py): the diff is on screen before the approval question, one key answers it
(no Enter), a command's output tail shows under it and Ctrl+O shows all of it, /undo reverts the
step, and the banner lists the instruction files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_agent import EOS, call


def test_approve_with_one_key_see_output_and_undo(demo_path, tmp_path) -> None:
    import pexpect  # the test extra

    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "AGENTS.md").write_text("Run the tests.\n")
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps([
        "fix</think>" + call("edit", path="calc.py", old="a - b", new="a + b"), "ok</think>Fixed." + EOS,
        "run</think>" + call("bash", command="seq 1 12"), "ok</think>Ran it." + EOS]))
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path / "home"),
           "DS4_SESSIONS": str(tmp_path / "sessions"), "TERM": "xterm-256color"}
    child = pexpect.spawn(sys.executable, [str(Path(__file__).with_name("agent_script.py")), str(answers), "agent",
                                           "--ctx", "4096"], cwd=str(root), env=env, encoding="utf-8", timeout=120,
                          dimensions=(50, 150))
    try:
        child.expect("instructions: AGENTS.md")
        child.expect("ds4 agent>")
        child.send("fix add\r")
        child.expect(r"⚠ edit calc\.py")
        child.expect(r"Allow\? y yes · n no · a always · Esc no")
        shown = child.before
        assert "-    return a - b" in shown and "+    return a + b" in shown  # the diff before the question
        assert (root / "calc.py").read_text().endswith("a - b\n")
        child.send("y")  # one key, no Enter
        child.expect(r"→ yes")
        child.expect(r"changed calc\.py \(/undo reverts this step\)")
        child.expect("ds4 agent>")
        assert (root / "calc.py").read_text().endswith("a + b\n")
        child.send("count\r")
        child.expect(r"\$ seq 1 12")
        child.expect("in " + str(root))  # where it runs, before the question
        child.expect("Allow\\?")
        child.send("y")
        child.expect(r"7 earlier lines \(Ctrl\+O or /output shows all\)")
        child.expect("│ 12")
        child.expect("ds4 agent>")
        child.sendcontrol("o")
        child.expect("── output of")
        child.expect(r"\r\n1\r\n2\r\n3\r\n")
        child.expect("── end of output")
        child.send("/undo\r")
        child.expect(r"undid step 1 \(fix add\): reverted calc\.py")
        child.expect("ds4 agent>")
        assert (root / "calc.py").read_text().endswith("a - b\n")
        child.sendcontrol("d")
        if child.expect([r"\[Y/n\]", pexpect.EOF]) == 0:
            child.send("n\r")
            child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
