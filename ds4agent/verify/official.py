"""`ds4 check`: the user's model, on the user's machine, against DeepSeek's own outputs.

The official vectors (official_vectors/, MIT, captured from DeepSeek's API by the antirez/ds4
project) give, for five prompts, the tokens DeepSeek V4 Flash chose greedily in non-thinking
mode and their top log-probabilities. A case passes when, step by step, the local greedy token
has the official token's bytes and every official top token is among the local top 20 with a
log-probability within 4 of the official one (the API reports a greedy choice at 0 and the
rest at -9999, so in practice: the greedy bytes, and the chosen token not far below certain).
After each step the local greedy token is fed, as the API fed its own. The comparison is by
bytes: ids would hide a tokenizer that splits differently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..protocol import render

if TYPE_CHECKING:
    from ..engine import Engine

TOP_K = 20  # local tokens a official top token must be among
TOLERANCE = 4.0  # |local - official| log-probability allowed for each official top token


@dataclass(frozen=True)
class Step:
    token: bytes  # the official greedy token
    tops: tuple[tuple[bytes, float], ...]  # the official top tokens and log-probabilities


@dataclass(frozen=True)
class Case:
    id: str
    ctx: int  # the context size it was captured at (prefilled into a session of this size)
    prompt: str
    steps: tuple[Step, ...]


class VectorError(ValueError):
    """The vector file does not parse; one line."""


def _folder():
    return resources.files(__package__) / "official_vectors"


def load_cases() -> list[Case]:
    """The five cases of official_vectors/official.vec, with their prompts."""
    folder = _folder()
    lines = (folder / "official.vec").read_text(encoding="utf-8").splitlines()
    cases: list[Case] = []
    head: list[str] | None = None
    steps: list[Step] = []
    tops: list[tuple[bytes, float]] = []
    token = b""
    for n, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            if words[0] == "case":
                head, steps, tops = words, [], []
            elif words[0] == "step":
                if tops or token:
                    steps.append(Step(token, tuple(tops)))
                token, tops = bytes.fromhex(words[2]), []
            elif words[0] == "top":
                tops.append((bytes.fromhex(words[1]), float(words[2])))
            elif words[0] == "end" and head is not None:
                steps.append(Step(token, tuple(tops)))
                prompt = (folder / "prompts" / head[4].rsplit("/", 1)[-1]).read_text(encoding="utf-8")
                if len(steps) != int(head[3]):
                    raise ValueError(f"{len(steps)} steps, the case line says {head[3]}")
                cases.append(Case(head[1], int(head[2]), prompt, tuple(steps)))
                head, token, tops = None, b"", []
            else:
                raise ValueError(f"unexpected {words[0]!r}")
        except (ValueError, IndexError, OSError) as e:
            raise VectorError(f"official.vec line {n}: {e}") from None
    return cases


@dataclass
class Outcome:
    case: str
    steps: int  # official steps
    matched: int = 0  # steps whose greedy bytes and top tokens agreed, from the first
    divergence: str | None = None  # what differed first (None: passed)
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    got: list[bytes] = field(default_factory=list)  # the local greedy tokens

    @property
    def passed(self) -> bool:
        return self.divergence is None and self.matched == self.steps


def _shown(b: bytes) -> str:
    return repr(b.decode("utf-8", errors="backslashreplace"))


class Checker:
    """Runs cases on an engine (anything with ``tokenizer`` and ``session(ctx=...)`` giving a
    session with sync, logits, top_logprobs and eval: the engine, or a stand-in in tests)."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._ids: dict[bytes, int] | None = None

    def _id_of(self, token: bytes) -> int | None:
        if self._ids is None:
            tok = self.tokenizer
            self._ids = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
        return self._ids.get(token)

    def prompt_ids(self, case: Case) -> list[int]:
        """The prompt as one user turn in non-thinking mode: BOS, User, text, Assistant, </think>."""
        return self.tokenizer.encode_rendered(render([{"role": "user", "content": case.prompt}], thinking_mode="chat"))

    def run(self, case: Case, starting: Callable[[Case, int], None] | None = None) -> Outcome:
        """One case; ``starting(case, prompt tokens)`` is called before its prefill."""
        out = Outcome(case.id, len(case.steps))
        ids = self.prompt_ids(case)
        out.prompt_tokens = len(ids)
        if starting is not None:
            starting(case, len(ids))
        s = self.engine.session(ctx=max(case.ctx, len(ids) + len(case.steps) + 2))
        s.drafter = None  # the greedy token is read from the logits; nothing to propose
        t = time.perf_counter()
        s.sync(ids)
        out.prefill_s = time.perf_counter() - t
        t = time.perf_counter()
        for i, step in enumerate(case.steps):
            ranked = s.top_logprobs(TOP_K)  # most likely first, ties: the lower id
            greedy = ranked[0][0]
            got = self.tokenizer.token_bytes(greedy)
            out.got.append(got)
            if got != step.token:
                out.divergence = f"step {i}: greedy {_shown(got)}, official {_shown(step.token)}" + \
                    self._where(s.logits, ranked[0], step.token)
                break
            top = {self.tokenizer.token_bytes(t): lp for t, _, lp in ranked}
            for tb, lp in step.tops:
                if tb not in top:
                    out.divergence = f"step {i}: official top token {_shown(tb)} not in the local top {TOP_K}" + \
                        self._where(s.logits, ranked[0], tb)
                    break
                if abs(top[tb] - lp) > TOLERANCE:
                    out.divergence = (f"step {i}: {_shown(tb)} at log-probability {top[tb]:.2f}, official {lp:.2f} "
                                      f"(more than {TOLERANCE} apart)")
                    break
            if out.divergence:
                break
            out.matched += 1
            if i + 1 < len(case.steps):
                s.eval(greedy)
        out.decode_s = time.perf_counter() - t
        return out

    def _where(self, logits: Any, best: tuple[int, float, float], token: bytes) -> str:
        """Where the official token stands locally: its rank and log-probability (``best``:
        the local greedy token's (id, logit, log-probability), which give the normaliser)."""
        tid = self._id_of(token)
        if tid is None:
            return " (not a single token of this model's vocabulary)"
        log_z = best[1] - best[2]
        rank = int((logits > logits[tid]).sum()) + 1
        return f" (locally rank {rank}, log-probability {float(logits[tid]) - log_z:.2f})"

    def run_all(self, cases: list[Case], starting: Callable[[Case, int], None] | None = None) -> Iterator[Outcome]:
        for case in cases:
            yield self.run(case, starting)


def report_line(o: Outcome) -> str:
    """One line per case: PASS/FAIL, the steps that agreed, the first divergence."""
    tokens = " ".join(_shown(b) for b in o.got[: o.matched])
    if o.passed:
        return f"PASS {o.case}: {o.matched}/{o.steps} steps, the official tokens {tokens}"
    return f"FAIL {o.case}: {o.matched}/{o.steps} steps agreed; {o.divergence}"


def speed_line(outcomes: list[Outcome]) -> str:
    prompt = sum(o.prompt_tokens for o in outcomes)
    prefill = sum(o.prefill_s for o in outcomes)
    steps = sum(max(0, len(o.got) - 1) for o in outcomes)
    decode = sum(o.decode_s for o in outcomes)
    return (f"speed: prefill {prompt / prefill if prefill > 0 else 0:.1f} t/s over {prompt} prompt tokens, "
            f"decode {steps / decode if decode > 0 and steps else 0:.2f} t/s over {steps} steps")
