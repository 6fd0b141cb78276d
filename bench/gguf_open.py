"""Open a GGUF file with our reader and with gguf.GGUFReader, side by side in one run.

Reports wall time to parse the header plus the vocabulary strings, and resident-memory growth.
Usage: python bench/gguf_open.py [MODEL.gguf]   (default: the demo model)
"""

from __future__ import annotations

import gc
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def ours(path: str) -> tuple[float, int]:
    from ds4agent.modelfile.gguf import GGUFFile

    t = time.perf_counter()
    f = GGUFFile(path)
    n = len(f.metadata["tokenizer.ggml.tokens"]) + len(f.metadata["tokenizer.ggml.merges"])
    return time.perf_counter() - t, n


def reference(path: str) -> tuple[float, int]:
    import gguf

    t = time.perf_counter()
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"]
    merges = r.fields["tokenizer.ggml.merges"]
    strings = [str(bytes(fld.parts[i]), "utf-8") for fld in (toks, merges) for i in fld.data]
    return time.perf_counter() - t, len(strings)


def main() -> None:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from ds4agent.modelfile.demo import ensure_demo

        path = str(ensure_demo())
    import gguf  # noqa: F401  (import cost is not part of the measurement)

    for name, fn in (("ds4agent", ours), ("gguf.GGUFReader", reference)):
        gc.collect()
        before = rss_mib()
        secs, n = fn(path)
        print(f"{name:<16} {secs:7.3f} s  {n} strings  rss +{rss_mib() - before:.0f} MiB")


if __name__ == "__main__":
    main()
