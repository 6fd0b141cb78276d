"""What --power does to the generation rate (docs/steering.md's neighbour in README, "Power").
Not a timed test.

    .venv/bin/python bench/power.py [-m MODEL] [--levels 100,50,25] [--gen 64] [--repeat 3]

Greedy decode t/s at each level, levels alternating within each repeat (medians), and the
ratio to level 100: expected about P/100 where the threads' share does not change the speed
(one thread or a memory-bound machine); the CPU kernels also run with P% of their threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds4agent.engine import Engine, SamplingParams  # noqa: E402
from ds4agent.modelfile import ensure_demo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--levels", default="100,50,25")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    path = a.model or ensure_demo()
    with Engine.open(path, backend="cpu", ctx=1024) as e:
        runs: dict[int, list[float]] = {p: [] for p in levels}
        for _ in range(a.repeat):
            for p in levels:
                e.set_power(p)
                s = e.session()
                s.drafter = None
                s.sync(list(range(1000, 1064)))
                t = time.perf_counter()
                n = sum(1 for _ in s.generate(SamplingParams(temperature=0), max_tokens=a.gen, stop_at_eos=False))
                runs[p].append((n - 1) / (time.perf_counter() - t))
        full = statistics.median(runs[100]) if 100 in runs else None
        print(f"model {Path(path).name}, {e.info.kernels} kernels")
        print("power,decode_tps,vs_100")
        for p, v in runs.items():
            m = statistics.median(v)
            print(f"{p},{m:.2f},{m / full:.3f}" if full else f"{p},{m:.2f},")


if __name__ == "__main__":
    main()
