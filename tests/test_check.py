"""ds4 check (verify/official.py): DeepSeek's official vectors read as shipped; a stand-in
engine that gives the official tokens passes every case, one that strays fails at the step it
strays with where the official token stood; the demo model runs to a plain failure report."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from ds4agent.cli import main
from ds4agent.engine import Engine
from ds4agent.verify.official import TOLERANCE, Checker, load_cases, report_line


def test_the_shipped_vectors_read_with_their_prompts_and_licence() -> None:
    cases = load_cases()
    folder = resources.files("ds4agent.verify") / "official_vectors"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [c.id for c in cases] == [p["id"] for p in manifest["prompts"]]
    for c, p in zip(cases, manifest["prompts"]):
        assert len(c.steps) == p["steps"] and len(c.prompt) == p["prompt_chars"]
        official = json.loads((folder / p["official_file"]).read_text())
        assert official  # the raw capture travels with the lines derived from it
    assert cases[0].steps[0].token == b"Ada" and cases[0].steps[0].tops == ((b"Ada", 0.0),)
    assert "MIT License, Copyright (c) 2026 The ds4.c authors" in (folder / "README.md").read_text()


class Scripted:
    """An engine stand-in whose sessions put a chosen token on top at every step: the official
    ones (``stray`` = None), or another token from step ``stray`` on; ``flat`` gives the top
    token barely more weight than the rest (a log-probability near -ln V)."""

    def __init__(self, tokenizer, stray: int | None = None, flat: bool = False) -> None:
        self.tokenizer, self.stray, self.flat = tokenizer, stray, flat
        self.ids = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
        self.by_prompt = {}
        checker = Checker(self)
        for case in load_cases():
            self.by_prompt[tuple(checker.prompt_ids(case))] = case
        self.fed: list[int] = []

    def session(self, ctx: int):
        return _Session(self)


class _Session:
    drafter = None

    def __init__(self, engine: Scripted) -> None:
        self.e, self.case, self.step = engine, None, 0

    def sync(self, ids) -> None:
        self.case = self.e.by_prompt[tuple(ids)]

    @property
    def logits(self) -> np.ndarray:
        V = self.e.tokenizer.vocab_size
        x = np.zeros(V, dtype=np.float32)
        token = self.e.ids[self.case.steps[self.step].token]
        if self.e.stray is not None and self.step >= self.e.stray:
            x[token] = 5.0  # the official token second
            token = (token + 1) % V
        x[token] = 0.01 if self.e.flat else 30.0
        return x

    def top_logprobs(self, k: int):
        x = self.logits.astype(np.float64)
        log_z = x.max() + np.log(np.exp(x - x.max()).sum())
        top = np.argsort(-x, kind="stable")[:k]
        return [(int(t), float(x[t]), float(x[t] - log_z)) for t in top]

    def eval(self, token: int) -> None:
        self.e.fed.append(token)
        self.step += 1


def test_official_tokens_pass_and_a_stray_token_fails_where_it_strays(demo_path) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=64) as e:
        tok = e.tokenizer
    cases = load_cases()
    good = Scripted(tok)
    outcomes = [Checker(good).run(c) for c in cases]
    assert all(o.passed for o in outcomes), [report_line(o) for o in outcomes]
    assert report_line(outcomes[0]) == "PASS short_italian_fact: 4/4 steps, the official tokens 'Ada' ' Lov' 'el' 'ace'"
    assert len(good.fed) == sum(len(c.steps) - 1 for c in cases)  # the last step is not fed
    o = Checker(Scripted(tok, stray=2)).run(cases[0])
    assert not o.passed and o.matched == 2
    assert "step 2: greedy" in o.divergence and "official 'el' (locally rank 2," in o.divergence
    o = Checker(Scripted(tok, flat=True)).run(cases[2])
    assert not o.passed and f"more than {TOLERANCE} apart" in o.divergence


def test_the_command_on_the_demo_model_and_without_one(demo_path, capsys) -> None:
    assert main(["check", "--list"]) == 0
    assert "long_code_audit" in capsys.readouterr().out
    assert main(["check", "-m", str(demo_path), "--case", "short_reasoning_plain", "--case", "short_italian_fact"]) == 1
    cap = capsys.readouterr()
    assert "generated (random weights): it cannot give DeepSeek's tokens" in cap.err
    assert cap.out.count("FAIL ") == 2 and "0 of 2 cases pass" in cap.out and "speed: prefill" in cap.out
    assert main(["check", "-m", str(demo_path), "--case", "nope"]) == 2
    assert "no case 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("line", ["step 0 zz 1", "case x 10 2 prompts/missing.txt\nstep 0 41 0\nend"])
def test_a_damaged_vector_file_is_one_line(monkeypatch, tmp_path, line: str) -> None:
    from ds4agent.verify import official

    folder = tmp_path / "official_vectors"
    (folder / "prompts").mkdir(parents=True)
    (folder / "official.vec").write_text(line + "\n")
    monkeypatch.setattr(official, "_folder", lambda: folder)
    with pytest.raises(official.VectorError, match="official.vec line"):
        load_cases()
