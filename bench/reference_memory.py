"""Peak memory of the reference kernels (the path a refused GPU kernel falls back to) on a
real-dimension shape model, and what that means for the published 43-layer model.

Usage:
  python bench/reference_memory.py [--layers N] [--model PATH] [--prompt P] [--gen G]

Builds (or reuses) `ds4 demo --preset shape --layers N` (real Flash dimensions: hidden 4096,
256 experts of width 2048, the real output head and embedding; about 5 GB for N=2), then runs a
P-token prefill (one 256-token chunk by default) and G greedy tokens with `--kernels reference`
in a fresh process, sampling /proc/self/status every 2 ms: the peak of the anonymous memory
(what must fit: MLX buffers, numpy arrays) and of the file-backed pages of the mmap (the
experts read in place: clean pages the OS drops under pressure), with MLX's own peak.

Then it extrapolates to the published layout (tests' Flash header: every tensor of the
81 GiB file, no data): the dense tensors the reference materialises, computed exactly from
Weights.get's rules (checked against what this run materialised), replace this model's; the
transients (one layer's temporaries, one expert's dequantised matrices at a time) stay; the
KV state grows with the layers and the context. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GiB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def materialised_bytes(f, names) -> int:
    """What Weights.get holds for these tensors: F32 as float32, F16 as float16, a Q8_0 matrix
    as MLX 8-bit (one byte a weight plus float32 scale and bias per 32), the rest float32."""
    total = 0
    for n in names:
        t = f.tensors[n]
        elems = 1
        for d in t.shape:
            elems *= d
        if t.type_name == "F16":
            total += 2 * elems
        elif t.type_name == "Q8_0" and len(t.shape) == 2:
            total += elems + 8 * (elems // 32)
        else:
            total += 4 * elems
    return total


def dense_names(f) -> list[str]:
    """Every tensor the reference path may materialise (all but the routed experts, the
    embedding and the hash table, which are read from the mmap row by row)."""
    return [n for n in f.tensors if "_exps." not in n and n != "token_embd.weight" and "tid2eid" not in n]


def child(a: argparse.Namespace) -> None:
    """The measured run (a fresh process: its peaks are this run's alone)."""
    peaks = {"anon": 0, "file": 0, "rss": 0}
    stop = threading.Event()

    def status() -> dict[str, int]:
        out = {}
        with open("/proc/self/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
        return out

    def sample() -> None:
        while not stop.is_set():
            s = status()
            peaks["anon"] = max(peaks["anon"], s["RssAnon"])
            peaks["file"] = max(peaks["file"], s["RssFile"])
            peaks["rss"] = max(peaks["rss"], s["VmRSS"])
            time.sleep(0.002)

    threading.Thread(target=sample, daemon=True).start()
    import mlx.core as mx
    import numpy as np

    from ds4agent.engine import Engine, SamplingParams

    base = status()["RssAnon"]
    stages = {}
    t0 = time.perf_counter()
    e = Engine.open(a.model, backend="cpu", kernels="reference", ctx=max(1024, a.prompt + a.gen + 8))
    s = e.session()
    ids = np.random.default_rng(0).integers(1000, 120000, a.prompt).tolist()
    t = time.perf_counter()
    s.sync(ids)
    stages["prefill_s"] = time.perf_counter() - t
    stages["anon_after_prefill"] = status()["RssAnon"]
    t = time.perf_counter()
    n = sum(1 for _ in s.generate(SamplingParams(temperature=0), max_tokens=a.gen, stop_at_eos=False))
    stages["decode_s"] = time.perf_counter() - t
    time.sleep(0.01)
    stop.set()
    w = e.model.w
    state_bytes = sum(x.nbytes for x in s._live.state.arrays())
    out = {
        "layers": e.info.config.n_layer, "prompt": a.prompt, "gen": n, "file": e.file.file_size,
        "baseline_anon": base, "peak_anon": peaks["anon"], "peak_file": peaks["file"], "peak_rss": peaks["rss"],
        "vm_hwm": status()["VmHWM"], "mlx_peak": mx.get_peak_memory(), "materialised": w.materialised_bytes(),
        "materialised_est": materialised_bytes(e.file, list(w._cache)), "touched": sorted(w._cache),
        "dense_all_est": materialised_bytes(e.file, dense_names(e.file)), "state_bytes": state_bytes,
        "total_s": time.perf_counter() - t0, **stages,
    }
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--model", help="an existing shape model (default: generate one under --dir)")
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ds4-shape"))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=4)
    ap.add_argument("--ctx", type=int, nargs="+", default=[32768, 1048576],
                    help="contexts for the extrapolated KV state and attention (default 32768 1048576)")
    ap.add_argument("--save", metavar="FILE", help="also write the measurements as JSON")
    ap.add_argument("--load", metavar="FILE", help="report earlier measurements (--save) without running")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.load:
        return report(json.loads(Path(a.load).read_text()), a.ctx)
    if a.model is None:
        a.model = os.path.join(a.dir, f"shape{a.layers}.gguf")
        if not os.path.exists(a.model):
            os.makedirs(a.dir, exist_ok=True)
            print(f"writing {a.model} (real dimensions, {a.layers} layers) ...", flush=True)
            subprocess.run([sys.executable, "-m", "ds4agent", "demo", "--preset", "shape", "--layers", str(a.layers),
                            "--out", a.model], check=True, cwd=ROOT)
    r = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "--prompt", str(a.prompt),
                        "--gen", str(a.gen)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    m = json.loads(r.stdout.strip().splitlines()[-1])
    if a.save:
        Path(a.save).write_text(json.dumps(m))
    report(m, a.ctx)


def report(m: dict, contexts: list[int]) -> None:
    from ds4agent.engine.kernels.reference import ATTEND_BLOCK_BYTES
    from ds4agent.engine.state import payload_size
    from ds4agent.modelfile.config import FLASH, config_from_gguf
    from ds4agent.modelfile.demo import write_model
    from ds4agent.modelfile.gguf import GGUFFile

    with tempfile.TemporaryDirectory() as tmp:
        flash = write_model(Path(tmp) / "flash.gguf", FLASH, "tiny", with_data=False)
        with GGUFFile(flash) as f:
            cfg = config_from_gguf(f)
            dense43 = materialised_bytes(f, dense_names(f))
            experts43 = sum(t.nbytes for n, t in f.tensors.items() if "_exps." in n)
            file43 = f.file_size
    transient = m["peak_anon"] - m["baseline_anon"] - m["materialised"]
    print(f"measured  {m['layers']}-layer shape model ({m['file'] / GiB:.2f} GiB), --kernels reference, "
          f"{m['prompt']}-token prefill ({m['prefill_s']:.0f} s) + {m['gen']} tokens ({m['decode_s']:.0f} s)")
    print(f"          peak anonymous memory {m['peak_anon'] / GiB:.2f} GiB "
          f"(process baseline {m['baseline_anon'] / GiB:.2f}), "
          f"peak mmap pages resident {m['peak_file'] / GiB:.2f} GiB, peak RSS {m['peak_rss'] / GiB:.2f} GiB "
          f"(VmHWM {m['vm_hwm'] / GiB:.2f}), MLX peak {m['mlx_peak'] / GiB:.2f} GiB")
    print(f"          dense weights materialised {m['materialised'] / GiB:.3f} GiB (Weights.get's rules give "
          f"{m['materialised_est'] / GiB:.3f}: "
          f"{'equal' if m['materialised'] == m['materialised_est'] else 'DIFFERENT'}); "
          f"transients on top {transient / GiB:.2f} GiB")
    print(f"published model, 43 layers ({file43 / GiB:.1f} GiB, "
          f"routed experts {experts43 / GiB:.1f} GiB in the mmap):")
    print(f"          dense weights the reference materialises: {dense43 / GiB:.2f} GiB "
          "(computed exactly from the layout)")
    for ctx in contexts:
        state = payload_size(cfg, ctx)
        # Reference attention of a 256-token chunk at this context: three (H, rows, keys) float32
        # arrays (scores, masked, exponentials) over every key row of a ratio-4 layer (window,
        # chunk, ctx/4 compressed rows), queries in blocks of at most ATTEND_BLOCK_BYTES.
        keys = cfg.sliding_window + 256 + ctx // 4
        rows = min(256, max(1, ATTEND_BLOCK_BYTES // (4 * cfg.n_head * keys)))
        attn = 3 * 4 * cfg.n_head * rows * keys
        est = m["baseline_anon"] + dense43 + max(transient, attn) + state
        print(f"  at {ctx:>7} tokens: KV state {state / GiB:.2f} GiB, attention temporaries about {attn / GiB:.2f} GiB "
              f"(computed); extrapolated peak anonymous memory {est / GiB:.1f} GiB (baseline + dense + the larger of "
              f"the measured transients and the attention's + KV); the experts stay file-backed pages: "
              + ("all of them fit beside it in 128 GiB" if est + experts43 <= 128 * GiB else
                 f"{max(0, 128 * GiB - est) / GiB:.0f} of their {experts43 / GiB:.1f} GiB stay resident in 128 GiB"))


if __name__ == "__main__":
    main()
