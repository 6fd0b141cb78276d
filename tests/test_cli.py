"""`ds4` front door: --help/--version, inspect, demo, model choice, one-line errors."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import copy_model, patch_metadata

from ds4agent.cli import main
from ds4agent.modelfile.demo import default_demo_path


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4agent", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_help_and_version() -> None:
    r = run("--help")
    assert r.returncode == 0 and "inspect" in r.stdout and "demo" in r.stdout and "DS4_MODEL" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("ds4agent ")
    exe = shutil.which("ds4")
    if exe:  # the console script, when the package is installed
        assert subprocess.run([exe, "--version"], capture_output=True, text=True).returncode == 0


def test_bad_flag_one_line() -> None:
    r = run("inspect", "--frobnicate")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "unrecognized arguments: --frobnicate" in r.stderr
    assert "Traceback" not in r.stderr


def test_inspect_demo(demo_path: Path, capsys) -> None:
    assert main(["inspect", str(demo_path)]) == 0
    out = capsys.readouterr().out
    assert "not the published Flash" in out and "layout consistent" in out
    assert "6: 2 window-only, 2 ratio-4 + indexer, 2 ratio-128; hash-routed 3" in out
    assert "129280 tokens, 127741 merges, 1283 added tokens" in out
    assert "bos 0, eos 1, user 128803, assistant 128804" in out
    for t in ("F16", "Q8_0", "IQ2_XXS", "Q2_K", "F32", "I32"):
        assert f"\n              {t} " in out
    assert "blk.0.attn_q_a.weight" not in out
    assert main(["inspect", str(demo_path), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "blk.5.ffn_down_exps.weight" in out and "Q2_K" in out


def test_inspect_flash_layout(flash_header_path: Path, capsys) -> None:
    assert main(["inspect", str(flash_header_path)]) == 0
    out = capsys.readouterr().out
    assert "the published DeepSeek V4 Flash layout" in out
    assert "43: 2 window-only, 21 ratio-4 + indexer, 20 ratio-128" in out
    assert "80.764 GiB" in out


def test_inspect_flash_with_one_wrong_value(flash_header_path: Path, tmp_path: Path, capsys) -> None:
    p = copy_model(flash_header_path, tmp_path / "bad.gguf")
    patch_metadata(p, "deepseek4.expert_used_count", struct.pack("<I", 6), struct.pack("<I", 8))
    assert main(["inspect", str(p)]) == 1
    out = capsys.readouterr().out
    assert "claims the DeepSeek V4 Flash shape but differs" in out
    assert "deepseek4.expert_used_count = 8, expected 6" in out


def test_inspect_demo_with_wrong_value(demo_path: Path, tmp_path: Path, capsys) -> None:
    p = copy_model(demo_path, tmp_path / "bad.gguf")
    patch_metadata(p, "deepseek4.expert_feed_forward_length", struct.pack("<I", 256), struct.pack("<I", 512))
    assert main(["inspect", str(p)]) == 1
    out = capsys.readouterr().out
    assert "inconsistent tensor layout" in out
    assert "blk.0.ffn_gate_exps.weight has dims [256, 256, 16], expected [256, 512, 16]" in out


def test_inspect_wrong_architecture(demo_path: Path, tmp_path: Path) -> None:
    p = copy_model(demo_path, tmp_path / "arch.gguf")
    patch_metadata(p, "general.architecture", b"deepseek4", b"llama\0\0\0\0")
    r = run("inspect", str(p))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert "general.architecture is 'llama\\x00\\x00\\x00\\x00', not 'deepseek4'" in r.stderr


@pytest.mark.parametrize("content,fragment", [
    (None, "no such file"),
    (b"not a model at all", "not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00\x01", "truncated GGUF header"),
])
def test_inspect_bad_files(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    p = tmp_path / "m.gguf"
    if content is not None:
        p.write_bytes(content)
    r = run("inspect", str(p))
    assert r.returncode == 1
    assert r.stderr.startswith("ds4: error: ") and fragment in r.stderr and str(p) in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_demo_command(tmp_path: Path, capsys) -> None:
    out = tmp_path / "d.gguf"
    assert main(["demo", "--out", str(out), "--preset", "q4", "--seed", "3"]) == 0
    assert out.exists() and "preset q4, seed 3" in capsys.readouterr().out
    before = out.stat().st_mtime_ns
    assert main(["demo", "--out", str(out)]) == 2  # never silently overwrite
    assert "already exists" in capsys.readouterr().err
    assert out.stat().st_mtime_ns == before
    assert main(["demo", "--out", str(tmp_path / "nodir" / "d.gguf")]) == 2


def test_model_choice_order(demo_path: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from ds4agent.modelfile.choice import resolve_model
    from ds4agent.settings import config_path

    other = copy_model(demo_path, tmp_path / "other.gguf")
    assert resolve_model(str(demo_path)).source == "-m"
    monkeypatch.setenv("DS4_MODEL", str(other))
    assert resolve_model(None).path == other and resolve_model(None).source == "DS4_MODEL"
    assert resolve_model(str(demo_path)).path == demo_path  # the flag wins
    monkeypatch.delenv("DS4_MODEL")
    cfg = config_path()
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'model = "{other}"\n')
    try:
        assert resolve_model(None).source == "config" and resolve_model(None).path == other
        cfg.write_text(f'model = "{tmp_path / "gone.gguf"}"\n')
        assert main(["inspect"]) == 1
        assert f"gone.gguf: no such model file (from {cfg})" in capsys.readouterr().err
        cfg.write_text("model = [1, 2\n")
        assert main(["inspect"]) == 1
        assert "cannot read configuration" in capsys.readouterr().err
    finally:
        cfg.unlink()
    monkeypatch.setenv("DS4_MODEL", str(tmp_path / "missing.gguf"))
    assert main([]) == 1
    assert "missing.gguf: no such model file (from DS4_MODEL)" in capsys.readouterr().err


def test_plain_ds4_uses_demo_model(capsys, monkeypatch) -> None:
    """With nothing configured, `ds4` builds (once) and uses the demo model, and says so."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal, no prompts: the chat ends at once
    path = default_demo_path()
    assert main([]) == 0
    err = capsys.readouterr().err
    assert "demo model" in err and "tiny" in err and "-m" in err
    assert path.exists()
    mtime = path.stat().st_mtime_ns
    monkeypatch.setattr("sys.stdin", io.StringIO("/stats\n"))
    assert main(["-m", str(path)]) == 0
    assert "context" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == mtime  # cached, not rebuilt


# -- configuration mistakes are said, not ignored -------------------------------------------------

def test_unknown_config_key_warns_with_a_close_match(demo_path: Path, capsys, monkeypatch) -> None:
    from ds4agent.settings import config_path, configured_model

    cfg = config_path()
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'modle = "{demo_path}"\ncolour = "blue"\n')
    try:
        assert configured_model() is None
        err = capsys.readouterr().err
        assert f"ds4: warning: {cfg}: unknown key 'modle' (did you mean 'model'?); known keys: model, mcp_servers, git_commit" in err
        assert "unknown key 'colour'; known keys: model, mcp_servers, git_commit" in err
        assert err.count("\n") == 2
        cfg.write_text(f'model = "{demo_path}"\n')
        assert configured_model() == str(demo_path) and capsys.readouterr().err == ""
        cfg.write_text('model = ""\n')
        assert main(["inspect"]) == 1
        assert "'model' is empty" in capsys.readouterr().err
    finally:
        cfg.unlink()


def test_empty_model_path_is_an_error(demo_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DS4_MODEL", "")
    assert main(["inspect"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ds4: error: ") and "DS4_MODEL is set but empty" in err and err.count("\n") == 1
    monkeypatch.setenv("DS4_MODEL", "  ")
    assert main(["-p", "hi"]) == 1 and "DS4_MODEL is set but empty" in capsys.readouterr().err
    monkeypatch.delenv("DS4_MODEL")
    assert main(["-m", "", "-p", "hi"]) == 1
    assert "-m needs a model path" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["-p", "hi"], ["agent", "-p", "hi"]])
def test_ctx_beyond_the_trained_context_is_refused(demo_path: Path, capsys, argv: list[str]) -> None:
    assert main([*argv, "-m", str(demo_path), "--ctx", "2000000", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ds4: error: --ctx 2000000 is more than this model was trained for (1048576 tokens")
    assert err.count("\n") == 1


# -- the front door shows the flags people use ----------------------------------------------------

def test_top_level_help_shows_the_common_flags() -> None:
    r = run("--help")
    assert r.returncode == 0
    for flag in ("-p TEXT", "-m PATH", "--ctx N", "--nothink", "-n N", "--temp T", "--think-max", "--json"):
        assert flag in r.stdout, flag
    assert "ds4 chat --help" in r.stdout and "ds4 agent --help" in r.stdout


def test_generation_flags_are_declared_once() -> None:
    from ds4agent.cli import build_parser

    p = build_parser()
    subs = next(a for a in p._actions if a.dest == "command").choices
    for name in ("chat", "agent"):
        helps = {a.dest: a.help for a in subs[name]._actions}
        for dest in ("temp", "top_p", "min_p", "top_k", "seed", "tokens", "ctx", "backend", "kernels"):
            assert helps.get(dest), (name, dest)  # every one explained, in both
    assert subs["agent"].parse_args(["--temp", "0.5"]).temp == 0.5
    assert subs["chat"].parse_args([]).tokens == 50000 and subs["agent"].parse_args([]).tokens == 16384
    assert subs["chat"].parse_args([]).ctx == 32768 and subs["agent"].parse_args([]).ctx == 65536
