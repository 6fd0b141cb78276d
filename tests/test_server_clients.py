"""Real clients against ds4 serve on a scripted engine: Claude Code (Anthropic API), Codex CLI
(Responses API, custom provider) and aider (chat completions), each one turn with a tool call
or an edit, as their users run them. Each test skips when its client is not installed (put
`claude`, `codex` or `aider` on PATH, or name a folder holding them in DS4_TEST_CLIENTS)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ds4agent.server import ScriptedEngine, ServerOptions
from ds4agent.server.run import ServerThread

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"


def find(name: str) -> str | None:
    extra = os.environ.get("DS4_TEST_CLIENTS")
    path = os.pathsep.join(p for p in (extra, os.environ.get("PATH", "")) if p)
    return shutil.which(name, path=path)


def tool(name: str, **params: str) -> str:
    body = "".join(f'<{D}parameter name="{k}" string="true">{v}</{D}parameter>\n' for k, v in params.items())
    return f"I will run it.</think>\n\n<{D}tool_calls>\n<{D}invoke name=\"{name}\">\n{body}</{D}invoke>\n</{D}tool_calls>"


def run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=150,
                          stdin=subprocess.DEVNULL)


def test_claude_code_runs_a_tool_turn(demo_tokenizer, tmp_path) -> None:
    exe = find("claude")
    if exe is None:
        pytest.skip("Claude Code (claude) is not installed")
    engine = ScriptedEngine(demo_tokenizer, [tool("Bash", command="echo ds4-ok", description="Print a marker"),
                                             "It printed.</think>The command printed ds4-ok." + EOS], ctx=200000)
    with ServerThread(engine, ServerOptions()) as st:
        r = run([exe, "-p", "run echo", "--model", "deepseek-v4-flash", "--allowedTools", "Bash(echo:*)"], tmp_path,
                {"ANTHROPIC_BASE_URL": st.url, "ANTHROPIC_API_KEY": "local", "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg"),
                 "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    assert r.returncode == 0 and "The command printed ds4-ok." in r.stdout, r.stdout + r.stderr
    assert engine.calls == 2  # the tool ran and its result came back as the second request


def test_codex_runs_a_tool_turn(demo_tokenizer, tmp_path) -> None:
    exe = find("codex")
    if exe is None:
        pytest.skip("Codex CLI (codex) is not installed")
    engine = ScriptedEngine(demo_tokenizer, [tool("exec_command", cmd="echo ds4-ok"),
                                             "It printed.</think>The command printed ds4-ok." + EOS], ctx=200000)
    home = tmp_path / "codex"
    home.mkdir()
    with ServerThread(engine, ServerOptions()) as st:
        (home / "config.toml").write_text(
            'model = "deepseek-v4-flash"\nmodel_provider = "ds4"\n\n[model_providers.ds4]\nname = "ds4 serve"\n'
            f'base_url = "{st.url}/v1"\nwire_api = "responses"\n')
        r = run([exe, "exec", "--skip-git-repo-check", "run echo ds4-ok"], tmp_path, {"CODEX_HOME": str(home)})
    assert r.returncode == 0 and "The command printed ds4-ok." in r.stdout, r.stdout + r.stderr
    assert engine.calls == 2


def test_aider_applies_an_edit(demo_tokenizer, tmp_path) -> None:
    exe = find("aider")
    if exe is None:
        pytest.skip("aider is not installed")
    (tmp_path / "a.py").write_text("print(1)\n")
    engine = ScriptedEngine(demo_tokenizer, ["Change it.</think>a.py\n```python\nprint(2)\n```\n" + EOS])
    with ServerThread(engine, ServerOptions()) as st:
        r = run([exe, "--model", "openai/deepseek-v4-flash", "--no-check-update", "--no-show-model-warnings",
                 "--yes-always", "--no-auto-commits", "--no-analytics", "--no-gitignore", "--no-git",
                 "--message", "make it print 2", "a.py"], tmp_path,
                {"OPENAI_API_BASE": st.url + "/v1", "OPENAI_API_KEY": "local", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "a.py").read_text() == "print(2)\n"
