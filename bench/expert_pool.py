"""Expert streaming under a memory limit: the expert pool against plain mmap (docs/streaming.md).

  python bench/expert_pool.py --model shape4.gguf [--skew 1.0] [--caps 0,0.5,0.25] [--prompt 64] [--gen 12]

For each model (the given one, with uniform routing, and with --skew a copy whose routing is
skewed: modelfile/demo.write_skewed_copy, the same bytes `ds4 demo --skew` writes) and each cap
(a fraction of the file's size; 0 = no cap), two runs in a child process inside a fresh memory
cgroup (v1 or v2; needs root, or a delegated cgroup) with the file's pages dropped from the
page cache first:

- mmap: every expert read through the mapped file (--memory-budget set to the file's size);
- pool: --memory-budget auto, which the child reads from its cgroup's room.

Each run prefills a prompt of random token ids, then decodes greedily, 2 threads (DS4_THREADS),
and reports prefill and decode t/s, the pool's hit rate, reads ahead used and wasted, the
bytes read from the file per decoded token, what decode made the OS fetch from storage per
token (/proc/self/io: the pool's reads, or mmap's page faults), the time decode waited for reads, the peak memory
of the cgroup and how often it hit its limit. Also prints how unevenly each layer routed (the
share of the most chosen tenth of its experts). Runs alternate mmap/pool per cap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(a: argparse.Namespace) -> None:
    import numpy as np

    from ds4agent.engine import Engine, SamplingParams

    t0 = time.perf_counter()
    budget = "auto" if a.mode.startswith("pool") else str(Path(a.model).stat().st_size)
    counts: dict[int, np.ndarray] = {}
    with Engine.open(a.model, backend="cpu", ctx=a.prompt + a.gen + 8, memory_budget=budget) as e:
        opened = time.perf_counter() - t0
        k = e.model.k
        real = k.experts

        def counting(layer, x, sel, w, clamp):
            c = counts.setdefault(layer, np.zeros(e.info.config.n_expert, np.int64))
            np.add.at(c, np.asarray(sel).reshape(-1), 1)
            return real(layer, x, sel, w, clamp)

        k.experts = counting
        ids = np.random.default_rng(a.seed).integers(1000, 100000, a.prompt).tolist()
        s = e.session()
        t = time.perf_counter()
        s.sync(ids)
        prefill = a.prompt / (time.perf_counter() - t)
        after_prefill = e.streaming() or {}
        io0 = _storage_read()
        t = time.perf_counter()
        n, stamps, read = 0, [], []
        for _ in s.generate(SamplingParams(temperature=0), max_tokens=a.gen, stop_at_eos=False):
            n += 1
            stamps.append(time.perf_counter())
            read.append((e.streaming() or {}).get("bytes_read", 0))  # the pool's reads so far
        decode = (n - 1) / (stamps[-1] - t)  # the first token was sampled from the prefill
        # What decode made the OS fetch from storage (pool reads and mmap page faults alike).
        storage = (_storage_read() - io0) / max(1, n - 1)
        # Whether the rate holds: t/s over each quarter of the decoded tokens.
        cuts = np.linspace(0, n - 1, 5).round().astype(int)
        quarters = [round((b - a_) / (stamps[b] - stamps[a_]), 2) for a_, b in zip(cuts[:-1], cuts[1:]) if b > a_]
        # and the pool's reads per token over each quarter (a policy's steady state is the last)
        read_quarters = [round((read[b] - read[a_]) / (b - a_) / 2**20, 1) for a_, b in zip(cuts[:-1], cuts[1:])
                         if b > a_]
        pool = e.streaming() or {}
        lines = list(e.info.devices)
    tenth = {}
    for layer, c in counts.items():
        top = np.sort(c)[::-1][: max(1, len(c) // 10)]
        tenth[layer] = round(float(top.sum() / max(1, c.sum())), 3)
    out = {"prefill_tps": prefill, "decode_tps": decode, "open_s": opened, "lines": lines, "tenth": tenth,
           "maxrss": _maxrss(), "quarters": quarters, "storage_per_token": storage}
    if pool:
        out["pool"], out["read_quarters"] = pool, read_quarters
        d = {key: pool[key] - after_prefill.get(key, 0) for key in ("bytes_read", "stall_s", "hits", "misses")}
        out["decode_bytes_per_token"] = d["bytes_read"] / max(1, n - 1)
        out["decode_stall_s"] = d["stall_s"]
        out["decode_hit_rate"] = d["hits"] / max(1, d["hits"] + d["misses"])
    print("RESULT " + json.dumps(out))


def _storage_read() -> int:
    """Bytes this process has caused to be read from storage (/proc/self/io read_bytes)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cgroup_dir() -> tuple[Path, str] | None:
    """A folder where a child memory cgroup can be made, and its version."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hier, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "v1"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/"), "v2"
    return None


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_one(model: str, mode: str, cap: int, a: argparse.Namespace) -> dict:
    _drop_cache(model)
    argv = [sys.executable, __file__, "--child", "--mode", mode, "--model", model, "--prompt", str(a.prompt),
            "--gen", str(a.gen), "--seed", str(a.seed)]
    env = dict(os.environ, DS4_THREADS=str(a.threads))
    if mode.startswith("pool-"):
        policy, _, reads = mode[5:].partition("-")
        env["DS4_POOL_POLICY"] = policy
        if reads == "cached":
            env["DS4_POOL_DIRECT"] = "0"
    group = None
    if cap:
        where = _cgroup_dir()
        if where is None:
            raise SystemExit("no memory cgroup to make a child in")
        base, version = where
        group = base / f"ds4bench{os.getpid()}"
        group.mkdir()
        (group / ("memory.limit_in_bytes" if version == "v1" else "memory.max")).write_text(str(cap))
        argv = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *argv]
    try:
        t = time.perf_counter()
        p = subprocess.run(argv, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        result = next((json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")), None)
        if result is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            result = {"error": f"exit {p.returncode}: {' | '.join(tail)}"}
        result["wall_s"] = wall
        if group is not None:
            for key, name in (("peak", "memory.max_usage_in_bytes"), ("limit_hits", "memory.failcnt"),
                              ("peak", "memory.peak")):
                f = group / name
                if f.exists():
                    result[key] = int(f.read_text().split()[0])
            events = group / "memory.events"
            if events.exists():
                result["limit_hits"] = dict(line.split() for line in events.read_text().splitlines()).get("max")
        return result
    finally:
        if group is not None:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--skew", type=float, default=0.0, help="also a copy with this routing skew (beside --model)")
    ap.add_argument("--caps", default="0,0.5,0.25", help="memory caps as fractions of the file size (0: none)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="mmap,pool", help="mmap, pool (DS4_POOL_POLICY's), pool-lru, pool-lfu; "
                    "-cached after the policy: reads through the page cache (DS4_POOL_DIRECT=0)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each mode, alternating; medians reported")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="pool", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    models = [a.model]
    if a.skew:
        from ds4agent.modelfile.demo import write_skewed_copy

        skewed = Path(a.model).with_name(f"{Path(a.model).stem}-skew{a.skew:g}.gguf")
        if not skewed.exists():
            print(f"writing {skewed} (routing skew {a.skew:g})", flush=True)
            write_skewed_copy(a.model, skewed, a.skew)
        models.append(str(skewed))
    size = Path(a.model).stat().st_size
    print(f"model {a.model}: {size / 2**30:.2f} GiB; prompt {a.prompt}, {a.gen} greedy steps, {a.threads} threads")
    for model in models:
        for frac in [float(x) for x in a.caps.split(",")]:
            cap = int(size * frac)
            decode: dict[str, list[float]] = {}
            for mode in [m for _ in range(a.repeat) for m in a.modes.split(",")]:
                r = run_one(model, mode, cap, a)
                label = f"{Path(model).name} cap {'none' if not cap else f'{cap / 2**30:.2f} GiB'} {mode}"
                if "error" in r:
                    print(f"{label}: {r['error']}", flush=True)
                    continue
                line = (f"{label}: prefill {r['prefill_tps']:.1f} t/s, decode {r['decode_tps']:.2f} t/s "
                        f"(by quarter {' / '.join(map(str, r['quarters']))}), open {r['open_s']:.1f} s, wall "
                        f"{r['wall_s']:.0f} s; decode fetched {r['storage_per_token'] / 2**20:.0f} MiB per token "
                        f"from storage")
                if "pool" in r:
                    p = r["pool"]
                    line += (f"; pool {p['slots']} slots, decode hit rate {100 * r['decode_hit_rate']:.1f}%, "
                             f"{r['decode_bytes_per_token'] / 2**20:.0f} MiB read per token (by quarter "
                             f"{' / '.join(map(str, r['read_quarters']))}), decode waited "
                             f"{r['decode_stall_s']:.2f} s, read ahead {p['prefetch_used']} used / {p['wasted']} "
                             f"wasted of {p['prefetched']}")
                if "peak" in r:
                    line += f"; cgroup peak {r['peak'] / 2**30:.2f} GiB, limit hit {r.get('limit_hits')} times"
                line += f"; top tenth of experts took {r['tenth']}"
                print(line, flush=True)
                decode.setdefault(mode, []).append(r["decode_tps"])
            if a.repeat > 1:
                med = {m: statistics.median(v) for m, v in decode.items()}  # of an even count: the middle two's mean
                ratio = "".join(f", {m}/mmap {v / med['mmap']:.2f}" for m, v in med.items()
                                if m.startswith("pool") and "mmap" in med)
                print(f"{Path(model).name} cap {frac:g}: median decode " +
                      ", ".join(f"{m} {v:.2f} t/s" for m, v in med.items()) + ratio, flush=True)


if __name__ == "__main__":
    main()
