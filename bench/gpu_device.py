"""What the GPU path does on a real device, measured in one run: prefill and decode speed of each
kernel set side by side, their logits against the first set's, and what is resident on the
device against the plan said at open (engine/kernels/resident.py).

    python bench/gpu_device.py MODEL.gguf --backend cuda --kernels cuda,reference [--prompts 2048,16384]
        [--gen 32] [--only-first-beyond 2048] [--json FILE]

A kernel set written ``cuda@1G`` streams the routed experts through an expert pool of that
budget in device memory (docs/streaming.md); its line adds the pool's counters.

For each kernel set and prompt length: a fresh engine, the prompt (random token ids, the same
for every set) prefilled in the kernels' own chunk size, then ``--gen`` greedy tokens. Reported:
prefill and decode tokens per second, the largest difference of the prompt's logits relative
to the first set's largest (the first set is the baseline: put the reference first to compare
with it), whether the greedy tokens agree, MLX's active and peak memory after the run, and the
plan's line. Prompts longer than ``--only-first-beyond`` run only the first set (the reference
path is slow at long prompts; measure it where it is cheap). bench/gpu_check.sh and
bench/mac_check.sh run this on a shape model (real dimensions, few layers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(path: str, backend: str, kernels: str, prompt: list[int], gen: int) -> dict:
    """One kernel set (``KERNELS`` or ``KERNELS@BUDGET``: routed experts streamed through an
    expert pool of BUDGET bytes, engine/expertpool.py) on one prompt."""
    import mlx.core as mx

    from ds4agent.engine import Engine, SamplingParams

    kernels, _, budget = kernels.partition("@")
    mx.reset_peak_memory()
    t = time.perf_counter()
    with Engine.open(path, backend=backend, kernels=kernels, ctx=len(prompt) + gen + 8, qat_sim=False,
                     memory_budget=budget or None) as e:
        opened = time.perf_counter() - t
        s = e.session()
        t = time.perf_counter()
        s.sync(prompt)
        prefill = len(prompt) / (time.perf_counter() - t)
        logits = np.array(s.logits, dtype=np.float32)
        t = time.perf_counter()
        toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=gen, stop_at_eos=False)]
        decode = len(toks) / (time.perf_counter() - t)
        return {"kernels": e.info.kernels, "asked": kernels, "prompt": len(prompt), "chunk": s.prefill_chunk,
                "open_s": round(opened, 2), "prefill_tps": round(prefill, 1), "decode_tps": round(decode, 2),
                "tokens": toks, "logits": logits, "active_gib": round(mx.get_active_memory() / 2**30, 2),
                "peak_gib": round(mx.get_peak_memory() / 2**30, 2), "plan": list(e.info.devices),
                "note": e.info.kernel_note, "pool": e.streaming()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--kernels", default="auto,reference",
                    help="kernel sets, comma-separated (the first is the baseline)")
    ap.add_argument("--prompts", default="2048,16384", help="prompt lengths, comma-separated")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--only-first-beyond", type=int, default=2048, metavar="N",
                    help="prompts longer than N run only the first kernel set")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = ap.parse_args()
    sets = a.kernels.split(",")
    rows = []
    for n in (int(x) for x in a.prompts.split(",")):
        prompt = np.random.default_rng(n).integers(1000, 120000, n).tolist()
        base = None
        for k in sets if n <= a.only_first_beyond else sets[:1]:
            r = measure(a.model, a.backend, k, prompt, a.gen)
            if base is None:
                base = r
            r["logit_err"] = float(np.abs(r["logits"] - base["logits"]).max() / np.abs(base["logits"]).max())
            r["same_tokens"] = r["tokens"] == base["tokens"]
            rows.append(r)
            print(f"{k:>10} ({r['kernels']}) prompt {n:>6} (chunks of {r['chunk']}): "
                  f"prefill {r['prefill_tps']:8.1f} t/s, "
                  f"decode {r['decode_tps']:7.2f} t/s, logits vs {sets[0]} {r['logit_err']:.1e}, same tokens "
                  f"{r['same_tokens']}, memory active {r['active_gib']} GiB peak {r['peak_gib']} GiB, open "
                  f"{r['open_s']} s", flush=True)
            pool = [f"pool: {r['pool']}"] if r["pool"] else []
            for line in r["plan"] + ([f"note: {r['note']}"] if r["note"] else []) + pool:
                print(f"{'':>12}{line}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "logits"} for r in rows], indent=1))


if __name__ == "__main__":
    main()
