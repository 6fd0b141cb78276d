"""Prefill and decode speed and peak resident memory of the engine on one model, one run.

Usage: python bench/engine_speed.py [MODEL.gguf] [--prompt N] [--gen N] [--backend cpu] [--kernels K]
(default: the demo model, a 512-token prompt, 64 generated tokens, greedy).
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--kernels", default=None, help="reference, cpu, cpu-exact, ... (default: auto)")
    ap.add_argument("--no-qat", action="store_true")
    a = ap.parse_args()

    from ds4agent.engine import Engine, SamplingParams
    from ds4agent.modelfile.demo import ensure_demo

    path = a.model or str(ensure_demo())
    t = time.perf_counter()
    engine = Engine.open(path, backend=a.backend, ctx=max(4096, a.prompt + a.gen + 8), qat_sim=not a.no_qat,
                         kernels=a.kernels)
    open_s = time.perf_counter() - t
    rss_open = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ids = np.random.default_rng(0).integers(0, 128000, a.prompt).tolist()
    s = engine.session()
    s.sync(ids[:8])  # first use materialises the dense weights; keep that out of the timing
    s = engine.session()
    t = time.perf_counter()
    s.sync(ids)
    prefill = a.prompt / (time.perf_counter() - t)
    t = time.perf_counter()
    n = sum(1 for _ in s.generate(SamplingParams(temperature=0), max_tokens=a.gen, stop_at_eos=False))
    decode = n / (time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = engine.info
    print(f"model    {path} ({info.name}, backend {info.backend}, kernels {info.kernels}, qat_sim {info.qat_sim})")
    print(f"open     {open_s:.2f} s, peak RSS after open {rss_open:.0f} MiB")
    print(f"prefill  {prefill:.1f} t/s ({a.prompt} tokens)")
    print(f"decode   {decode:.1f} t/s ({n} tokens)")
    print(f"peak RSS {peak:.0f} MiB; weights materialised {engine.model.w.materialised_bytes() / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
