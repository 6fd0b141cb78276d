"""`ds4 -p`, --dump-tokens, --dump-logprobs on the demo model (real entry point, subprocesses)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds4agent.protocol.template import THINK_MAX, one_shot_prompt


def ds4(*args: str, model: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DS4_MODEL": str(model)}
    return subprocess.run([sys.executable, "-m", "ds4agent", *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=300)


def test_think_max_constant() -> None:
    data = THINK_MAX.encode()
    assert len(data) == 476 and data.endswith(b"\n\n")
    assert hashlib.sha256(data).hexdigest() == "f7a24f3b3050d4a83781e9b755b316aae2ec1d9dc87562541d90bcb04d7350f7"


def test_one_shot_prompt_matches_official_cases() -> None:
    golden = Path(__file__).resolve().parent / "data" / "template_cases.json"
    cases = {c["id"]: c for c in json.loads(golden.read_text(encoding="utf-8"))["cases"]}
    c = cases["chat_user_only"]
    assert one_shot_prompt("Hello", None, "chat") == c["rendered"]
    c = cases["thinking_system_user"]
    assert one_shot_prompt(c["messages"][1]["content"], c["messages"][0]["content"], "thinking") == c["rendered"]
    c = cases["effort_max_user_first"]
    assert one_shot_prompt(c["messages"][0]["content"], None, "max") == c["rendered"]


def test_greedy_one_shot_is_deterministic(demo_path: Path) -> None:
    a = ds4("-p", "Hello", "--temp", "0", "-n", "12", "--nothink", "--ctx", "512", model=demo_path)
    b = ds4("-p", "Hello", "--temp", "0", "-n", "12", "--nothink", "--ctx", "512", model=demo_path)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "\x1b[" not in a.stdout  # plain text in a pipe
    last = a.stderr.strip().splitlines()[-1]
    assert last.startswith("ds4: prefill: ") and ", generation: " in last and last.endswith(" t/s")
    assert float(last.split(", generation: ")[1].split()[0]) > 0  # 12 tokens took some time
    seeded = [ds4("-p", "Hi", "--seed", "7", "-n", "8", "--ctx", "512", model=demo_path).stdout for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_prompt_from_stdin_and_file(demo_path: Path, tmp_path: Path) -> None:
    a = ds4("-p", "-", "--temp", "0", "-n", "6", "--ctx", "512", model=demo_path, stdin="Hello")
    f = tmp_path / "prompt.txt"
    f.write_text("Hello", encoding="utf-8")
    b = ds4("--prompt-file", str(f), "--temp", "0", "-n", "6", "--ctx", "512", model=demo_path)
    c = ds4("-p", "Hello", "--temp", "0", "-n", "6", "--ctx", "512", model=demo_path)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout == c.stdout


def test_dump_tokens(demo_path: Path) -> None:
    r = ds4("-p", "<｜User｜>hi there", "--dump-tokens", model=demo_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    ids = json.loads(lines[0])
    assert ids[0] == 128803 and len(lines) == 1 + len(ids)
    assert lines[1] == "128803  <｜User｜>" and lines[-1].endswith("Ġthere")


def test_dump_logprobs(demo_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "lp.json"
    r = ds4("-p", "Hello", "--nothink", "-n", "4", "--ctx", "512", "--dump-logprobs", str(out),
            "--logprobs-top-k", "5", model=demo_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    text = out.read_text(encoding="utf-8")
    assert text.startswith('{\n  "source":"ds4agent",\n  "prompt_tokens":')
    assert text.endswith("\n  ]\n}\n")
    doc = json.loads(text)
    assert doc["top_k"] == 5 and doc["ctx"] == 512 and len(doc["steps"]) == 4
    from ds4agent.modelfile import Tokenizer

    tok = Tokenizer.from_gguf(demo_path)
    for i, st in enumerate(doc["steps"]):
        assert st["step"] == i
        tops = st["top_logprobs"]
        assert len(tops) == 5 and st["selected"]["id"] == tops[0]["token"]["id"]  # greedy
        lps = [t["logprob"] for t in tops]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        # Each candidate names its token by id and by that token's exact bytes; the selected
        # token is the top one; the candidates are part of a distribution.
        for t in tops:
            assert bytes(t["token"]["bytes"]) == tok.token_bytes(t["token"]["id"])
            raw = bytes(t["token"]["bytes"])
            try:
                want = raw.decode("utf-8")
            except UnicodeDecodeError:  # a piece of a character: its bytes as code points
                want = raw.decode("latin-1")
            assert t["token"]["text"] == want
        assert len({t["token"]["id"] for t in tops}) == 5
        assert st["selected"] == tops[0]["token"] and sum(math.exp(lp) for lp in lps) <= 1 + 1e-6
        # logit - logprob is the step's log-normaliser: the same for every candidate.
        norms = [t["logit"] - t["logprob"] for t in tops]
        assert max(norms) - min(norms) < 1e-4
    # Greedy steps agree with a plain greedy run of the same prompt.
    plain = ds4("-p", "Hello", "--nothink", "-n", "4", "--ctx", "512", "--temp", "0", model=demo_path)
    assert plain.stdout.rstrip("\n") == tok.decode([s["selected"]["id"] for s in doc["steps"]]).rstrip("\n")


@pytest.mark.parametrize("args,fragment", [
    (["-p", "x", "--temp", "-1"], "temperature must be >= 0"),
    (["-p", "x", "--top-k", "5000"], "top_k must be in 0..1024"),
    (["-p", "x", "-n", "0"], "-n must be at least 1"),
    (["-p", "x", "--nothink", "--think-max"], "not allowed with argument"),
    (["--dump-tokens"], "need a prompt"),
    (["-p", "x", "--logprobs-top-k", "500", "--dump-logprobs", "f.json"], "--logprobs-top-k must be in 1..128"),
    (["-p", "x", "--prompt-file", "y"], "either -p or --prompt-file"),
    (["-p", "x", "--backend", "metal"], "metal backend is not available"),
    (["-p", "x", "--ctx", "abc"], "invalid int value"),
])
def test_bad_flags(demo_path: Path, args: list[str], fragment: str) -> None:
    r = ds4(*args, model=demo_path)
    assert r.returncode in (1, 2), r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("ds4: error: ")


def test_prompt_too_long_for_context(demo_path: Path) -> None:
    r = ds4("-p", "word " * 100, "--ctx", "32", model=demo_path)
    assert r.returncode == 1 and "does not fit a context of 32" in r.stderr


def test_think_max_downgrades_below_384k(demo_path: Path) -> None:
    r = ds4("-p", "x", "--think-max", "-n", "2", "--ctx", "512", model=demo_path)
    assert r.returncode == 0
    assert "--think-max needs --ctx >= 393216; ctx=512 uses normal thinking instead" in r.stderr
