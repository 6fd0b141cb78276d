"""Where one decoded token's time goes on the CPU kernels, product by product, against the
machine's read bandwidth.

    python bench/cpu_bandwidth.py MODEL.gguf [--layer L] [--repeat N] [--threads N] [--exact]

First the read-bandwidth probe (cpu.read_bandwidth) on the model's own mapping (its largest
tensor, paged in first), then each product a decode step makes, at one token, on the model's real
tensors, with the caches flushed before each call: the Q8_0 matrices (output head, attention,
shared expert), the fused products of one layer (linears), the grouped output projection, the F16
matrices (router, hyper-connection mixes, compressors), the routed experts of one layer (six
experts chosen at random, a different six each call, as decode reads them). Each is timed
``--repeat`` times (median), alternating with the probe reading the same bytes (cache-cold both);
reported: the bytes of weights it reads, the median time, the GB/s that is, the probe's GB/s on
those bytes, and the product's share of it. Then the sum over a whole decode step's products, as
the engine makes them, against the measured time of a real decode step. The activations are
random; the arithmetic is what decode runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--layer", type=int, default=None, help="layer whose products are timed (default: the last)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--exact", action="store_true", help="the cpu-exact kernels (float32 activations)")
    a = ap.parse_args()
    if a.threads:
        os.environ["DS4_THREADS"] = str(a.threads)
    from ds4agent.engine import Engine
    from ds4agent.engine.kernels import cpu
    from ds4agent.engine.reports.bench import bytes_per_token

    with Engine.open(a.model, backend="cpu", kernels="cpu-exact" if a.exact else "cpu", ctx=4096) as e:
        k, f, cfg = e.model.k, e.file, e.info.config
        layer = cfg.n_layer - 1 if a.layer is None else a.layer
        big = max(f.tensors.values(), key=lambda t: t.nbytes)
        probe = cpu.read_bandwidth(f.array(big.name).view(np.uint8).reshape(-1)[: 1 << 30])
        print(f"{Path(a.model).name}: {e.info.kernels} kernels, {cpu.threads()} threads; read probe on the mapping "
              f"({big.name}, first GiB): {probe / 1e9:.1f} GB/s")
        rng = np.random.default_rng(0)

        # Between timed calls a buffer four times the last-level cache is read, so no call
        # finds its weights still cached by the one before: in a decode step each matrix is read
        # once and the rest of the model passes through the caches before it is read again.
        # Each product is timed against the probe reading the very bytes it reads, the two
        # alternating (this kind of machine's memory speed moves by 2x from minute to minute):
        # the share is the ratio of the two medians.
        flush = np.ones(256 << 20, np.uint8)
        lib = cpu.library()

        def cold() -> None:
            lib.ds4_read(flush.ctypes.data, flush.size)

        def timed(label: str, views: list[np.ndarray], fn) -> tuple[str, int, float]:
            nbytes = sum(v.size for v in views)
            fn()
            times, reads = [], []
            for _ in range(a.repeat):
                cold()
                t = time.perf_counter()
                for v in views:
                    lib.ds4_read(v.ctypes.data, v.size)
                reads.append(time.perf_counter() - t)
                cold()
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            med, read = statistics.median(times), statistics.median(reads)
            print(f"  {label:<52} {nbytes / 1e6:8.1f} MB {med * 1e3:8.3f} ms {nbytes / med / 1e9:6.1f} GB/s "
                  f"(probe {nbytes / read / 1e9:5.1f}) {100 * read / med:5.1f}%")
            return label, nbytes, med

        def raw(name: str) -> np.ndarray:
            return f.array(name).view(np.uint8).reshape(-1)

        def x(n: int) -> np.ndarray:
            return rng.standard_normal((1, n)).astype(np.float32)

        p = f"blk.{layer}."
        rows = []
        print(f"products at one token (layer {layer} where per layer), median of {a.repeat}:")
        for name in ["output.weight", p + "attn_q_b.weight", p + "attn_output_b.weight", p + "ffn_down_shexp.weight",
                     p + "ffn_gate_inp.weight", p + "hc_attn_fn.weight"]:
            t = f.tensors[name]
            xi = x(t.shape[1])
            rows.append(timed(f"linear {name} ({t.type_name} {t.shape[0]}x{t.shape[1]})", [raw(name)],
                              lambda name=name, xi=xi: k.linear(xi, name)))
        r = cfg.ratio(layer)
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if r else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if r == 4 else []
        names = tuple(p + n + ".weight" for n in names)
        xa = x(cfg.n_embd)
        rows.append(timed(f"linears {len(names)} matrices of layer {layer} (attention input)",
                          [raw(n) for n in names], lambda: k.linears(xa, names)))
        ffn = tuple(p + n + ".weight" for n in ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp"))
        rows.append(timed("linears router + shared gate/up", [raw(n) for n in ffn], lambda: k.linears(xa, ffn)))
        out_a = p + "attn_output_a.weight"
        G = cfg.n_out_group
        xg = rng.standard_normal((1, G, f.tensors[out_a].shape[1])).astype(np.float32)
        rows.append(timed(f"grouped {out_a}", [raw(out_a)], lambda: k.grouped(xg, out_a)))
        route = np.full((1, cfg.n_expert_used), 0.3, np.float32)
        sel = rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False)
        slices = [f.array(p + n + "_exps.weight")[e].view(np.uint8).reshape(-1)
                  for e in sel for n in ("ffn_gate", "ffn_up", "ffn_down")]
        rows.append(timed(f"experts of layer {layer} ({cfg.n_expert_used} of {cfg.n_expert})", slices,
                          lambda: k.experts(layer, xa, sel[None], route, float(cfg.swiglu_clamp[layer]))))

        s = e.session()
        s.sync(rng.integers(1000, 120000, 64).tolist())
        steps = []
        for _ in range(8):
            tok = int(np.argmax(s.logits))
            t = time.perf_counter()
            s.eval(tok)
            steps.append(time.perf_counter() - t)
        step, per_token = statistics.median(steps), bytes_per_token(e)
        probe = cpu.read_bandwidth(f.array(big.name).view(np.uint8).reshape(-1)[: 1 << 30])
        print(f"a decode step: {step * 1e3:.1f} ms for {per_token / 1e9:.2f} GB of weights = "
              f"{per_token / step / 1e9:.1f} GB/s, {100 * per_token / step / probe:.0f}% of the probe just after "
              f"({probe / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
