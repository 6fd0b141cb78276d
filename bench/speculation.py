"""What verifying proposed tokens costs and gains (docs/speculation.md). Not a timed test.

    .venv/bin/python bench/speculation.py -m MODEL [--prompt 256] [--gen 48] [--repeat 3]

1. The cost of one verification pass of k = 1..6 proposed tokens (k + 1 positions, each to the
   bits of a step alone) against one plain decode step, medians of alternating runs; from it,
   on paper, the speedup at per-token acceptance rates 0.3 .. 0.9 (a pass yields the kept
   drafts plus one token; a rejection costs a second pass over the kept ones).
2. End to end, greedy decode t/s side by side: plain; with proposals that are the true
   continuation (a scripted drafter replaying a plain run: what a continuation that repeats
   the context gives, and a random-weight model never repeats on its own); the same with every
   third proposal wrong at its second token; and the n-gram drafter on this model's own output,
   which never repeats (its overhead). Every run's tokens are checked equal to plain decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds4agent.engine import Engine, SamplingParams  # noqa: E402
from ds4agent.engine.drafts import NgramDrafter  # noqa: E402

GREEDY = SamplingParams(temperature=0)


class Replay:
    """Proposes the continuation of a plain run (k tokens), every ``spoil``-th proposal changed
    at its second token (0: never)."""

    name = "replay"

    def __init__(self, truth: list[int], start: int, k: int, spoil: int = 0) -> None:
        self.truth, self.start, self.k, self.spoil, self.calls = truth, start, k, spoil, 0

    def propose(self, history, n: int, token: int, most: int) -> list[int]:
        at = n + 1 - self.start
        out = list(self.truth[at : at + min(self.k, most)])
        self.calls += 1
        if self.spoil and self.calls % self.spoil == 0 and len(out) > 1:
            out[1] = (out[1] + 1) % 1000 + 5
        return out

    def feedback(self, proposed: int, kept: int) -> None:
        pass


def pass_costs(e: Engine, prompt: list[int], repeat: int) -> dict[int, float]:
    """Seconds of a pass of k + 1 positions (k = 0: a plain step), median of ``repeat``."""
    m = e.model
    s = e.session()
    s.sync(prompt)
    base = s.checkpoint()
    times: dict[int, list[float]] = {k: [] for k in range(7)}
    ids = np.random.default_rng(1).integers(1000, 100000, 7)
    for _ in range(repeat):
        for k in range(7):
            s.rollback(base)
            state = s._live.state.fork()  # noqa: SLF001  (a bench measuring the model alone)
            t = time.perf_counter()
            out = m.forward(ids[: k + 1], state, all_logits=k > 0, alone=True)
            np.asarray(out)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def on_paper(costs: dict[int, float]) -> None:
    step = costs[0]
    print("acceptance,best_k,tokens_per_pass,speedup")
    for a in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
        best = (1.0, 0, 1.0)
        for k in range(1, 7):
            # j drafts kept with probability a^j (1 - a) (j < k) or a^k; a pass yields j + 1
            # tokens; a rejection (j < k) adds a pass over the j + 1 kept positions.
            exp_tokens = exp_cost = 0.0
            for j in range(k + 1):
                pj = a**j * (1 - a) if j < k else a**k
                exp_tokens += pj * (j + 1)
                exp_cost += pj * (costs[k] + (costs[j] if j < k else 0.0))
            speed = exp_tokens / (exp_cost / step)
            if speed > best[0]:
                best = (speed, k, exp_tokens)
        print(f"{a},{best[1]},{best[2]:.2f},{best[0]:.2f}")


def decode(e: Engine, prompt: list[int], n: int, drafter) -> tuple[float, list[int], bytes, float]:
    s = e.session()
    s.sync(prompt)
    s.drafter = drafter
    t = time.perf_counter()
    toks = [st.token for st in s.generate(GREEDY, max_tokens=n, stop_at_eos=False)]
    return (len(toks) - 1) / (time.perf_counter() - t), toks, s.snapshot(), 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with Engine.open(a.model, backend=a.backend, ctx=a.prompt + a.gen + 64) as e:
        prompt = np.random.default_rng(0).integers(1000, 100000, a.prompt).tolist()
        print(f"model {Path(a.model).name}, {e.info.kernels} kernels, prompt {a.prompt}, {a.gen} greedy tokens")
        costs = pass_costs(e, prompt, a.repeat)
        print("positions,seconds,vs_step")
        for k, c in costs.items():
            print(f"{k + 1},{c:.4f},{c / costs[0]:.2f}")
        on_paper(costs)
        _, truth, blob, _ = decode(e, prompt, a.gen, None)
        runs: dict[str, list[float]] = {}
        for _ in range(a.repeat):
            for name, make in (("plain", lambda: None), ("replay k=4", lambda: Replay(truth, len(prompt), 4)),
                               ("replay k=4, 1 in 3 wrong", lambda: Replay(truth, len(prompt), 4, 3)),
                               ("ngram (never repeats)", NgramDrafter)):
                tps, toks, snap, _ = decode(e, prompt, a.gen, make())
                assert toks == truth and snap == blob, name
                runs.setdefault(name, []).append(tps)
        plain = statistics.median(runs["plain"])
        print("drafts,decode_tps,vs_plain")
        for name, v in runs.items():
            print(f"{name},{statistics.median(v):.2f},{statistics.median(v) / plain:.3f}")


if __name__ == "__main__":
    main()
