"""Switching to a saved session vs prefilling the same text, side by side in one run.

Usage: python bench/session_switch.py [MODEL.gguf] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", type=int, default=2000)
    a = ap.parse_args()

    from ds4agent.engine import Engine
    from ds4agent.modelfile.demo import ensure_demo
    from ds4agent.sessions.store import SessionStore

    engine = Engine.open(a.model or str(ensure_demo()), backend="auto", ctx=max(4096, a.tokens + 8))
    ids = np.random.default_rng(0).integers(0, 128000, a.tokens).tolist()
    warm = engine.session()
    warm.sync(ids[:16])  # materialise weights outside the timings
    with tempfile.TemporaryDirectory() as d:
        store = SessionStore(d)
        s = engine.session()
        t = time.perf_counter()
        s.sync(ids)
        prefill = time.perf_counter() - t
        sha = store.save(s, "cold")
        size = store.path(sha).stat().st_size
        r = engine.session()
        t = time.perf_counter()
        store.load(sha, r)
        switch = time.perf_counter() - t
        assert r.tokens == s.tokens and np.array_equal(r.logits, s.logits)
    print(f"{a.tokens} tokens: prefill {prefill:.3f} s, switch (load from disk) {switch:.3f} s, "
          f"ratio {switch / prefill:.2%}, file {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
