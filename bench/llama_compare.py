"""ds4agent against llama.cpp (llama-cpp-python) on the same GGUF, same threads, one run.

Usage: python bench/llama_compare.py MODEL.gguf [--prompt 256] [--gen 32] [--threads N] [--repeat 3]

The whole file is read once first, so that the page cache holds it for both engines (a prefill
touches every expert: whichever engine ran first would otherwise pay the disk reads). Each
engine then runs in its own subprocess (one at a time, so they never share cores), warms up on
a short prompt, prefills the same random prompt and decodes greedily. With --repeat N the
two engines alternate N times (ours, llama.cpp, ours, ...) and the medians are compared: on a
shared machine a single pair of runs can swing either engine by 40%. Prints both engines'
prefill and decode t/s (median, and the range over the runs), their ratios, and whether the
two agree on the first greedy token. Needs `pip install llama-cpp-python`; not
part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def _prompt(n: int) -> list[int]:
    return np.random.default_rng(0).integers(1000, 128000, n).tolist()


def run_ours(path: str, n_prompt: int, n_gen: int, threads: int) -> dict:
    os.environ["DS4_THREADS"] = str(threads)
    from ds4agent.engine import Engine, SamplingParams

    engine = Engine.open(path, backend="cpu", ctx=n_prompt + n_gen + 64)
    ids = _prompt(n_prompt)
    engine.session().sync(ids[:16])  # warm-up: page in and materialise what a token touches
    s = engine.session()  # our default prefill chunk (256 tokens)
    t = time.perf_counter()
    s.sync(ids)
    prefill = n_prompt / (time.perf_counter() - t)
    first = int(np.argmax(s.logits))
    t = time.perf_counter()
    n = sum(1 for _ in s.generate(SamplingParams(temperature=0), max_tokens=n_gen, stop_at_eos=False))
    decode = n / (time.perf_counter() - t)
    return {"prefill_tps": prefill, "decode_tps": decode, "first": first, "kernels": engine.info.kernels}


def run_llama(path: str, n_prompt: int, n_gen: int, threads: int) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_prompt + n_gen + 64,
                n_batch=512, n_ubatch=512, verbose=False)
    vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(llm.model))

    def argmax() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        return int(np.argmax(logits))

    ids = _prompt(n_prompt)
    llm.eval(ids[:16])
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    prefill = n_prompt / (time.perf_counter() - t)
    tok = first = argmax()
    t = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([tok])
        tok = argmax()
    decode = n_gen / (time.perf_counter() - t)
    return {"prefill_tps": prefill, "decode_tps": decode, "first": first,
            "version": getattr(llama_cpp, "__version__", "?")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs per engine; medians are compared")
    ap.add_argument("--llama-python", default=sys.executable,
                    help="the Python whose llama-cpp-python to run (default: this one). On CPUs with AMX, "
                         "llama.cpp 0.3.36 built with GGML_NATIVE stops on a scheduler assertion for this "
                         "model; build it into another venv with AMX off (see the README's Speed section)")
    ap.add_argument("--only", choices=["ours", "llama"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        fn = run_ours if a.only == "ours" else run_llama
        print(json.dumps(fn(a.model, a.prompt, a.gen, a.threads)))
        return
    with open(a.model, "rb") as f:  # into the page cache (see the module docstring)
        while f.read(64 << 20):
            pass
    runs: dict[str, list[dict]] = {"ours": [], "llama": []}
    for _ in range(max(1, a.repeat)):
        for which in ("ours", "llama"):
            python = a.llama_python if which == "llama" else sys.executable
            cmd = [python, __file__, a.model, "--prompt", str(a.prompt), "--gen", str(a.gen),
                   "--threads", str(a.threads), "--only", which]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode or not lines:
                tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
                sys.exit(f"{which}: failed (exit {out.returncode}): {tail}")
            runs[which].append(json.loads(lines[-1]))

    def med(which: str, key: str) -> float:
        return float(np.median([r[key] for r in runs[which]]))

    def span(which: str, key: str) -> str:
        v = [r[key] for r in runs[which]]
        return f"{min(v):.1f}-{max(v):.1f}"

    o, ll = runs["ours"][-1], runs["llama"][-1]
    print(f"model {a.model}: prompt {a.prompt}, gen {a.gen}, threads {a.threads}, {len(runs['ours'])} runs each")
    print(f"{'':10}{'prefill t/s':>12}{'decode t/s':>12}   (median; range prefill / decode)")
    for name, which, extra in (("ds4agent", "ours", f"kernels {o['kernels']}"),
                               ("llama.cpp", "llama", f"llama-cpp-python {ll['version']}")):
        print(f"{name:10}{med(which, 'prefill_tps'):12.1f}{med(which, 'decode_tps'):12.2f}   "
              f"({span(which, 'prefill_tps')} / {span(which, 'decode_tps')}) {extra}")
    print(f"{'ratio':10}{med('ours', 'prefill_tps') / med('llama', 'prefill_tps'):12.2f}"
          f"{med('ours', 'decode_tps') / med('llama', 'decode_tps'):12.2f}")
    print(f"first greedy token: ds4agent {o['first']}, llama.cpp {ll['first']}"
          f" ({'same' if o['first'] == ll['first'] else 'different'})")


if __name__ == "__main__":
    main()
