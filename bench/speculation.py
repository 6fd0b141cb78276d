"""What verifying proposed tokens costs and gains (docs/speculation.md). Not a timed test.

    .venv/bin/python bench/speculation.py -m MODEL [--mtp FILE] [--prompt 256] [--gen 48] [--repeat 3]

1. The cost of one verification pass of k = 1..6 proposed tokens (k + 1 positions, each to the
   bits of a step alone) against one plain decode step, medians of alternating runs; from it,
   on paper, the speedup at per-token acceptance rates 0.3 .. 0.9 (a pass yields the kept
   drafts plus one token; a rejection costs nothing more: the state is cut back from the
   pass's own rows).
   With --mtp FILE: the cost of the MTP block's drafts (the first: the pairs the last pass
   committed, 1 or 2, and the head; each chained one: one pair and the head), and on paper
   the speedup of k = 1..3 MTP drafts at first-draft acceptance 0.5 .. 0.8, each further draft
   kept with the same probability (an assumption: published figures give the first only).
2. On paper, for the published q2 file on a machine where decode is bound by memory bandwidth
   (a GPU, a Mac; not this CPU, where a pass of several positions is bound by arithmetic):
   the bytes a pass of n positions reads (every tensor but the routed experts once, plus each
   layer's distinct experts: E(1 - (1 - k/E)^n) under uniform routing, which overlaps less
   than real routing does, so it overstates the cost), the bytes of an MTP draft (the block's
   tensors, its k experts, the output matrix again), and from them the speedup of MTP drafts
   and of proposals kept at a per-token rate. With --routing FILE (a model whose routing stands
   for the real one's, such as the skewed shape model), again with the distinct experts that
   n consecutive greedy tokens of FILE chose, per layer, in place of uniform routing's.
3. End to end, greedy decode t/s side by side: plain; with proposals that are the true
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


def _speedup(a: float, k: int, cost: float) -> tuple[float, float]:
    """(tokens per step-equivalent, tokens per pass) of passes of ``k`` drafts costing ``cost``
    steps each, a draft kept with probability ``a`` while the ones before it were: j drafts are
    kept with probability a^j (1 - a) (j < k) or a^k, and a pass yields j + 1 tokens."""
    tokens = sum((a**j * (1 - a) if j < k else a**k) * (j + 1) for j in range(k + 1))
    return tokens / cost, tokens


def mtp_costs(e: Engine, mtp: str, prompt: list[int], repeat: int) -> tuple[float, float]:
    """Seconds of the MTP block's first draft after a pass that committed 1 and 2 tokens (its
    pairs and the head); medians. A chained draft is one pair and the head: the first of one."""
    from ds4agent.engine.mtp import MtpBlock

    block = MtpBlock.open(e.model, mtp)
    try:
        cfg = block.cfg
        rng = np.random.default_rng(2)
        ids = rng.integers(1000, 100000, len(prompt))
        streams = rng.standard_normal((len(prompt), cfg.hc_count, cfg.n_embd), dtype=np.float32)
        base = block.empty_state()
        block.run(ids[:-3], streams[:-3], base, logits=False)  # a window of earlier pairs
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeat):
            for n in (1, 2):
                state = base.fork()
                t = time.perf_counter()
                block.run(ids[-n:], streams[-n:], state)
                times[n].append(time.perf_counter() - t)
        return statistics.median(times[1]), statistics.median(times[2])
    finally:
        block.close()


def mtp_on_paper(costs: dict[int, float], first1: float, first2: float) -> None:
    chained = first1
    step = costs[0]
    print("mtp_first_acceptance,drafts,tokens_per_pass,pass_vs_step,speedup")
    for a in (0.5, 0.6, 0.7, 0.8):
        for k in (1, 2, 3):
            # the first draft runs the pairs of what the last pass committed (1 + the drafts
            # kept), each pair past the first costing first2 - first1
            _, tokens = _speedup(a, k, 1.0)
            first = first1 + (first2 - first1) * (tokens - 1)
            cost = (costs[k] + first + (k - 1) * chained) / step
            speed, tokens = _speedup(a, k, cost)
            print(f"{a},{k},{tokens:.2f},{cost:.3f},{speed:.2f}")


def routing_distinct(path: str, steps: int) -> dict[bool, list[float]]:
    """Per kind of layer (hash-routed or not): the mean number of distinct routed experts that
    n = 1..7 consecutive tokens choose, over ``steps`` greedy steps of the model at ``path``
    after a 64-token prompt (each step's choice recorded from the expert call)."""
    chosen: dict[int, list[set[int]]] = {}
    with Engine.open(path, backend="cpu", ctx=steps + 96) as e:
        k = e.model.k
        experts = k.experts

        def recording(layer, x, sel, *args, **kw):
            sel = np.asarray(sel)
            if sel.shape[0] == 1:  # decode steps only (the prompt's chunk is one call of 64)
                chosen.setdefault(layer, []).append(set(sel.reshape(-1).tolist()))
            return experts(layer, x, sel, *args, **kw)

        k.experts = recording
        s = e.session()
        s.sync(np.random.default_rng(1).integers(1000, 100000, 64).tolist())
        for _ in s.generate(GREEDY, max_tokens=steps, stop_at_eos=False):
            pass
        cfg = e.info.config
    kinds: dict[bool, list[list[float]]] = {}
    for layer, sets in chosen.items():
        kinds.setdefault(cfg.is_hash_layer(layer), []).append(
            [float(np.mean([len(set().union(*sets[i : i + n])) for i in range(len(sets) - n + 1)]))
             for n in range(1, 8)])
    return {hashed: list(np.mean(rows, axis=0)) for hashed, rows in kinds.items()}


def bandwidth_on_paper(routing: dict[bool, list[float]] | None = None, source: str = "") -> None:
    """Section 2 of the module's docstring; ``routing``: routing_distinct's result, which
    replaces uniform routing's distinct experts (Flash's hash layers take the hash layers'
    figures, the others the learned-routing layers')."""
    from gguf.constants import GGMLQuantizationType as Q

    from ds4agent.modelfile.config import FLASH, expected_tensors
    from ds4agent.modelfile.gguf import tensor_nbytes
    from ds4agent.modelfile.mtpfile import mtp_tensors

    def q2(name: str, types) -> int:
        if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            return Q.IQ2_XXS
        if name.endswith("ffn_down_exps.weight"):
            return Q.Q2_K
        return Q.F32 if Q.F32 in types else min(types)

    def mtp_type(name: str, types) -> int:
        return Q.Q4_K if "_exps." in name else (Q.F32 if Q.F32 in types else min(types))

    c = FLASH
    dense = expert = 0
    for name, spec in expected_tensors(c).items():
        size = tensor_nbytes(q2(name, spec.types), spec.dims)
        if "_exps." in name:
            expert += size // c.n_expert  # one expert of one layer, summed over layers
        elif name != "token_embd.weight" and "tid2eid" not in name:
            dense += size
    head = tensor_nbytes(Q.Q8_0, (c.n_embd, c.n_vocab))
    block = sum(tensor_nbytes(mtp_type(n, sp.types), sp.dims) // (c.n_expert if "_exps." in n else 1)
                * (c.n_expert_used if "_exps." in n else 1) for n, sp in mtp_tensors(c).items())
    draft = block + head

    def distinct(n: int) -> float:  # per layer, averaged over Flash's layers
        if routing is None:
            return c.n_expert * (1 - (1 - c.n_expert_used / c.n_expert) ** n)
        hashed = sum(c.is_hash_layer(i) for i in range(c.n_layer))
        learned = routing.get(False, routing.get(True))
        return (hashed * routing.get(True, learned)[n - 1] + (c.n_layer - hashed) * learned[n - 1]) / c.n_layer

    def pass_bytes(n: int) -> float:  # expert: the bytes of one expert of every layer
        return dense + expert * distinct(n)

    step = pass_bytes(1)
    gib = 2**30
    if routing is not None:
        print(f"q2 on paper with the routing of {source}: consecutive tokens share "
              f"{2 * distinct(1) - distinct(2):.2f} of {distinct(1):.2f} experts per layer")
    print(f"q2 on paper: a step reads {step / gib:.2f} GiB (dense {dense / gib:.2f}, experts "
          f"{(step - dense) / gib:.2f}); an MTP draft {draft / gib:.3f} GiB ({draft / step:.3f} step)")
    print("positions,bytes_vs_step")
    print(",".join(f"{n}:{pass_bytes(n) / step:.3f}" for n in range(1, 8)))
    print("mtp_first_acceptance,drafts,tokens_per_pass,pass_vs_step,speedup")
    for a in (0.5, 0.6, 0.7, 0.8):
        for k in (1, 2, 3):
            cost = (pass_bytes(k + 1) + k * draft) / step
            speed, tokens = _speedup(a, k, cost)
            print(f"{a},{k},{tokens:.2f},{cost:.3f},{speed:.2f}")
    print("acceptance,best_k,tokens_per_pass,speedup (proposals that cost nothing to make: n-gram)")
    for a in (0.5, 0.6, 0.7, 0.8, 0.9):
        best = max((_speedup(a, k, pass_bytes(k + 1) / step) + (k,) for k in range(1, 7)), key=lambda r: r[0])
        print(f"{a},{best[2]},{best[1]:.2f},{best[0]:.2f}")
    # How much must consecutive tokens share their experts (per layer, of the k they choose) for
    # one MTP draft at first-draft acceptance 0.6 to give 1.3x? (uniform routing shares k^2/E)
    per_expert = expert  # bytes of one chosen expert in every layer
    _, tokens = _speedup(0.6, 1, 1.0)
    room = (tokens / 1.3 - draft / step) * step - step  # bytes the second position may add
    shared = c.n_expert_used - room / per_expert
    print(f"mtp at 0.6 reaches 1.3x when two consecutive tokens share >= {shared:.2f} of their {c.n_expert_used} "
          f"experts per layer (here: {2 * distinct(1) - distinct(2):.2f})")
    # DSpark: a mean accepted length of 2.7 at 5 drafts (the drafts kept per pass), its own
    # draft cost unknown here: the verification side alone.
    print(f"dspark (2.7 kept of 5, verification only): {(1 + 2.7) / (pass_bytes(6) / step):.2f}x")


def on_paper(costs: dict[int, float]) -> None:
    step = costs[0]
    print("acceptance,best_k,tokens_per_pass,speedup")
    for a in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9):
        best = (1.0, 0, 1.0)
        for k in range(1, 7):
            # j drafts kept with probability a^j (1 - a) (j < k) or a^k; a pass yields j + 1
            # tokens; a rejection (j < k) adds a pass over the j + 1 kept positions.
            speed, exp_tokens = _speedup(a, k, costs[k] / step)
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
    ap.add_argument("--mtp", metavar="FILE", help="an MTP file for the model: its draft cost, and it drafting")
    ap.add_argument("--routing", metavar="FILE", help="on paper also with this model's routing (section 2)")
    ap.add_argument("--routing-steps", type=int, default=150)
    a = ap.parse_args()
    bandwidth_on_paper()
    if a.routing:
        bandwidth_on_paper(routing_distinct(a.routing, a.routing_steps), Path(a.routing).name)
    with Engine.open(a.model, backend=a.backend, ctx=a.prompt + a.gen + 64) as e:
        prompt = np.random.default_rng(0).integers(1000, 100000, a.prompt).tolist()
        print(f"model {Path(a.model).name}, {e.info.kernels} kernels, prompt {a.prompt}, {a.gen} greedy tokens")
        costs = pass_costs(e, prompt, a.repeat)
        print("positions,seconds,vs_step")
        for k, c in costs.items():
            print(f"{k + 1},{c:.4f},{c / costs[0]:.2f}")
        on_paper(costs)
        drafters = [("plain", lambda: None), ("replay k=4", lambda: Replay(truth, len(prompt), 4)),
                    ("replay k=4, 1 in 3 wrong", lambda: Replay(truth, len(prompt), 4, 3)),
                    ("ngram (never repeats)", NgramDrafter)]
        if a.mtp:
            first1, first2 = mtp_costs(e, a.mtp, prompt, a.repeat)
            print(f"mtp draft seconds: first after 1 committed {first1:.4f} ({first1 / costs[0]:.3f} step), after 2 "
                  f"{first2:.4f}, chained {first1:.4f}")
            mtp_on_paper(costs, first1, first2)
            e.set_speculation("mtp", mtp=a.mtp)
            drafters.append(("mtp (random weights: its overhead)", lambda: e.session().drafter))
        _, truth, blob, _ = decode(e, prompt, a.gen, None)
        runs: dict[str, list[float]] = {}
        for _ in range(a.repeat):
            for name, make in drafters:
                tps, toks, snap, _ = decode(e, prompt, a.gen, make())
                assert toks == truth and snap == blob, name
                runs.setdefault(name, []).append(tps)
        plain = statistics.median(runs["plain"])
        print("drafts,decode_tps,vs_plain")
        for name, v in runs.items():
            print(f"{name},{statistics.median(v):.2f},{statistics.median(v) / plain:.3f}")


if __name__ == "__main__":
    main()
