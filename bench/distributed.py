"""Several processes with mx.distributed: what each split reads, sends and gains (docs/distributed.md).

Usage: python bench/distributed.py [MODEL.gguf] [--ranks 2,3] [--prompt N] [--chunk N] [--gen N]
                                   [--mem-gbs 400] [--link-gbps 10] [--latency-us 100]

1. Measured on this machine (loopback, ring backend, every rank on the same CPU cores): prefill
   and decode speed of each split against one process (a pipeline's prefill both with its
   chunks in flight on several stages and one after another), and the bytes each rank sent and
   summed per decoded token (the Link's counters: arrays only, no TCP framing).
2. On paper, for the published Flash layout (a header-only file of the real tensor sizes):
   bytes of weights each rank reads per decoded token (engine/split.read_per_token: what it
   computes; routed experts as k/n of them on average), bytes communicated per token, and the
   expected decode speed on two or three machines from those volumes, each machine's memory
   bandwidth, the link's bandwidth and its latency per message.

Loopback speed says little about two machines (the ranks share this CPU and memory); the
paper estimate is what the measured volumes predict there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


def worker(path: str, split: str, prompt: int, gen: int, out: str, kernels: str | None, chunk: int) -> int:
    """One rank (under mlx.launch): rank 0 times prefill and decode; every rank writes what it
    sent and summed in each decode step (one token) to out.rankR.json."""
    from ds4agent.engine.group.distributed import follow, open_engine

    engine = open_engine(path, split, backend="cpu", ctx=prompt + gen + 16, kernels=kernels)
    dist = engine.model
    link = dist.link
    # The Link's counters as each step begins: from one one-token step to the next is what a
    # decoded token moved on this rank (its step, and the next command passed on round the ring).
    marks: list[tuple[int, tuple[int, int, int]]] = []
    hooked = "forward" if dist.rank == 0 else "_step"  # rank 0 sends the command before its step
    real = getattr(dist, hooked)

    def mark(ids, *args, **kw):
        marks.append((len(ids), (link.sent, link.reduced, link.messages)))
        return real(ids, *args, **kw)

    setattr(dist, hooked, mark)
    if dist.rank == 0:
        ids = np.random.default_rng(0).integers(100, 120000, prompt).tolist()
        s = engine.session()
        s.sync(ids[:8])  # warm-up: dense weights materialised on every rank
        pre = {}
        for name, window in (("prefill_sequential", 1), ("prefill", dist.pipeline_window)):
            dist.pipeline_window = window  # only rank 0 decides how many chunks are in flight
            s = engine.session()
            s.prefill_chunk = chunk
            t = time.perf_counter()
            s.sync(ids)
            pre[name] = prompt / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(gen):
            s.eval(int(np.argmax(s.logits)))
        dec = time.perf_counter() - t
        code = 0
        engine.close()
        with open(out, "w") as f:
            json.dump({**pre, "decode_tps": gen / dec, "chunk": s.prefill_chunk}, f)
    else:
        code = follow(engine)
    steps = [np.subtract(b, a) for (n, a), (_, b) in zip(marks, marks[1:]) if n == 1]
    per = np.mean(np.array(steps, dtype=np.float64), axis=0) if steps else np.zeros(3)
    with open(f"{out}.rank{dist.rank}.json", "w") as f:
        json.dump({"sent": per[0], "reduced": per[1], "messages": per[2]}, f)
    return code


def single(path: str, prompt: int, gen: int, kernels: str | None, chunk: int) -> dict:
    from ds4agent.engine import Engine

    e = Engine.open(path, backend="cpu", ctx=prompt + gen + 16, kernels=kernels)
    ids = np.random.default_rng(0).integers(100, 120000, prompt).tolist()
    s = e.session()
    s.sync(ids[:8])
    s = e.session()
    s.prefill_chunk = chunk
    t = time.perf_counter()
    s.sync(ids)
    pre = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(gen):
        s.eval(int(np.argmax(s.logits)))
    dec = time.perf_counter() - t
    e.close()
    return {"prefill_tps": prompt / pre, "decode_tps": gen / dec}


def measured(path: str, ranks: list[int], prompt: int, gen: int, kernels: str | None, chunk: int) -> None:
    one = single(path, prompt, gen, kernels, chunk)
    print(f"## measured on loopback ({path}, {prompt}-token prompt, {gen} decoded tokens, kernels {kernels or 'auto'})")
    print(f"one process: prefill {one['prefill_tps']:.1f} t/s, decode {one['decode_tps']:.2f} t/s")
    print(f"(the ranks share this machine's {os.cpu_count()} cores: each gets cores / N kernel threads, DS4_THREADS)")
    cores = os.cpu_count() or 1
    for split in ("pipeline", "experts"):
        for n in ranks:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "r.json")
                argv = [str(HERE), path, "--worker", split, "--prompt", str(prompt), "--gen", str(gen),
                        "--chunk", str(chunk), "--out", out] + (["--kernels", kernels] if kernels else [])
                m, err = _run_ranks(n, d, argv, threads=max(1, cores // n))
                if m is None:
                    print(f"{split} x{n}: failed\n{err[-2000:]}")
                    continue
                ranks_ = [json.load(open(f"{out}.rank{r}.json")) for r in range(n)]
            seq = ""
            if split == "pipeline":
                seq = (f" (chunks of {m['chunk']} one after another: {m['prefill_sequential']:.1f} t/s, "
                       f"{m['prefill_sequential'] / one['prefill_tps']:.2f}x)")
            print(f"{split:8s} x{n}: prefill {m['prefill']:.1f} t/s ({m['prefill'] / one['prefill_tps']:.2f}x){seq}, "
                  f"decode {m['decode_tps']:.2f} t/s ({m['decode_tps'] / one['decode_tps']:.2f}x)")
            for r, c in enumerate(ranks_):
                print(f"    rank {r} per decoded token: sent {c['sent'] / 1024:.1f} KiB, summed/gathered "
                      f"{c['reduced'] / 1024:.1f} KiB, {c['messages']:.0f} messages")


def _run_ranks(n: int, d: str, args: list[str], threads: int) -> tuple[dict | None, str]:
    """Start n ranks on loopback the way mlx.launch does (MLX_RANK, and the ring backend's
    hostfile in MLX_HOSTFILE), each with ``threads`` kernel threads: ranks sharing one
    machine's cores would otherwise each start a thread per core and spin against each other
    (and mlx.launch's own output loop polls without sleeping, taking a core of its own)."""
    base = 41000 + 10 * n + (os.getpid() % 50) * 40
    hostfile = os.path.join(d, "hosts.json")
    with open(hostfile, "w") as f:
        json.dump([[f"127.0.0.1:{base + r}"] for r in range(n)], f)
    procs = []
    for r in range(n):
        env = {**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": hostfile,
               "DS4_THREADS": str(threads)}
        procs.append(subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=1800)[1] for p in procs]
    out = args[args.index("--out") + 1]
    if any(p.returncode for p in procs) or not os.path.exists(out):
        return None, "\n".join(errs)
    return json.load(open(out)), ""


def paper(mem_gbs: float, link_gbps: float, latency_us: float, ranks: list[int]) -> None:
    from ds4agent.engine.group import split as splits
    from ds4agent.modelfile.config import FLASH
    from ds4agent.modelfile.demo import write_model
    from ds4agent.modelfile.gguf import GGUFFile

    with tempfile.TemporaryDirectory() as d:
        path = write_model(os.path.join(d, "flash.gguf"), FLASH, "tiny", with_data=False)
        with GGUFFile(path) as f:
            infos = [splits.TensorSize(t.name, t.nbytes, t.nbytes // t.shape[0],
                                       t.shape[0]) for t in f.tensors.values()]
            sizes = {t.name: t.nbytes for t in f.tensors.values()}
            block = splits.block_width(f.tensors["blk.0.ffn_down_shexp.weight"].type)
    c = FLASH
    one = splits.read_per_token(c, infos, splits.plan(c, sizes, "experts", 1, 0, block))
    bw, link, lat = mem_gbs * 1e9, link_gbps * 1e9 / 8, latency_us * 1e-6
    t_one = one / bw
    print(f"\n## on paper: DeepSeek V4 Flash q2 ({sum(sizes.values()) / 2**30:.1f} GiB), memory {mem_gbs:.0f} GB/s per "
          f"machine, link {link_gbps:.0f} Gb/s and {latency_us:.0f} us per message")
    print(f"one machine: reads {one / 2**30:.2f} GiB per decoded token -> at most {1 / t_one:.1f} t/s")
    hidden = c.hc_count * c.n_embd * 4  # the hyper-connection streams of one token, float32
    for n in ranks:
        for split in ("pipeline", "experts"):
            reads = [splits.read_per_token(c, infos, splits.plan(c, sizes, split, n, r, block)) for r in range(n)]
            if split == "pipeline":
                # Decode runs the stages one after another: the reads add up, plus one hop per boundary.
                comm = (n - 1) * hidden + 8 * 8 + 4  # hidden state per boundary, the command
                t = sum(reads) / bw + (n - 1) * (lat + hidden / link) + lat
                note = "decode no faster (stages run in turn); it fits a model one machine cannot hold"
            else:
                # Every rank reads its share at once; two ring all_sums per layer and the logits gather.
                per_sum = c.n_embd * 4
                sums = 2 * c.n_layer
                share = -(-c.n_vocab // n) * 4
                ring = 2 * (n - 1) / n  # a ring all_sum moves this fraction of the array per rank, each way
                comm = sums * per_sum * ring + (n - 1) * share
                t = (max(reads) / bw + sums * (2 * (n - 1) * lat + per_sum * ring / link)
                     + (n - 1) * (lat + share / link) + lat)
                note = "decode faster when the link's latency is small next to the reads saved"
            print(f"{split:8s} x{n}: reads per rank {', '.join(f'{r / 2**30:.2f}' for r in reads)} GiB/token; "
                  f"sent per rank per token {comm / 1024:.0f} KiB; expected {1 / t:.1f} t/s ({t_one / t:.2f}x); {note}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--ranks", default="2,3")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk (several, so a pipeline overlaps them)")
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--mem-gbs", type=float, default=400.0, help="memory bandwidth of one machine (GB/s)")
    ap.add_argument("--link-gbps", type=float, default=10.0, help="link bandwidth (Gb/s)")
    ap.add_argument("--latency-us", type=float, default=100.0,
                    help="latency of one message (us): ~100 ring/TCP, ~10 JACCL")
    ap.add_argument("--paper-only", action="store_true")
    ap.add_argument("--worker", choices=("pipeline", "experts"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    from ds4agent.modelfile.demo import ensure_demo

    path = a.model or str(ensure_demo())
    if a.worker:
        return worker(path, a.worker, a.prompt, a.gen, a.out, a.kernels, a.chunk)
    ranks = [int(r) for r in a.ranks.split(",")]
    if not a.paper_only:
        measured(path, ranks, a.prompt, a.gen, a.kernels, a.chunk)
    paper(a.mem_gbs, a.link_gbps, a.latency_us, ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
