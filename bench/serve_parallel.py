"""`ds4 serve --parallel`: what slots that decode together give, measured through the real server
on loopback with the official openai SDK (docs/batching.md). Not a timed test: run it by hand.

    .venv/bin/python bench/serve_parallel.py -m MODEL [--slots 8] [--streams 1,2,4,8] [--tokens 32]
        [--long 16384] [--repeat 2]

1. Aggregate decode: k clients at once (k in --streams; runs alternate, --repeat times, medians),
   each streaming a greedy answer of --tokens tokens to a short question of its own, on a server
   of --slots slots. Reported: completion tokens per second summed over the clients, counted from
   the moment every client has its first token to the last token (prefill excluded), and per
   client; and the ratio to one client.
2. Short requests while a long prompt prefills: one client sends a --long-token prompt; once
   its prefill has started, another sends short questions one after another, 2 s apart, until
   it is done. Reported: the short requests' time to first token (median, most), and the long
   one's.
Requests lost (errors of any kind) are counted throughout and must be 0.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from ds4agent.engine import Engine, SamplingParams  # noqa: E402
from ds4agent.modelfile import resolve_model  # noqa: E402
from ds4agent.server import ServerOptions  # noqa: E402
from ds4agent.server.requests import Defaults  # noqa: E402
from ds4agent.server.run import ServerThread  # noqa: E402

QUESTIONS = ["Explain how a hash map handles collisions.", "Write a short poem about the sea.",
             "What is the difference between TCP and UDP?", "Summarise the plot of Hamlet.",
             "How do I reverse a linked list?", "Why do leaves change colour in autumn?",
             "List the planets of the solar system.", "What does a compiler's register allocator do?"]


class Client:
    def __init__(self, url: str) -> None:
        self.c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=3600)

    def stream(self, content: str, tokens: int) -> tuple[float, float, float, int]:
        """(start, first token, end, completion tokens) of one streamed greedy answer."""
        t0 = time.perf_counter()
        first, n = None, 0
        for ch in self.c.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                                 max_tokens=tokens, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}):
            if first is None and ch.choices and (ch.choices[0].delta.content or
                                                 getattr(ch.choices[0].delta, "reasoning_content", None)):
                first = time.perf_counter()
            if ch.usage:
                n = ch.usage.completion_tokens
        return t0, first or time.perf_counter(), time.perf_counter(), n


def together(url: str, k: int, tokens: int, lost: list[str]) -> tuple[float, float]:
    """k clients at once: (aggregate decode t/s, per-client decode t/s)."""
    out: list = [None] * k

    def run(i: int) -> None:
        try:
            out[i] = Client(url).stream(QUESTIONS[i % len(QUESTIONS)] + f" ({i})", tokens)
        except Exception as e:  # counted, not raised: the benchmark goes on
            lost.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in out if r is not None]
    start, end = max(r[1] for r in done), max(r[2] for r in done)
    # Tokens after every client's first: each client's share of its tokens in that window.
    n = sum(r[3] * max(0.0, r[2] - start) / max(r[2] - r[1], 1e-9) for r in done)
    agg = n / max(end - start, 1e-9)
    per = statistics.median(r[3] / max(r[2] - r[1], 1e-9) for r in done)
    return agg, per


def long_and_short(url: str, long_tokens: int, lost: list[str]) -> tuple[list[float], float]:
    """(the short requests' times to first token, the long prompt's) in seconds: short requests
    one after another, 2 s apart, for as long as the long prompt prefills."""
    words = " ".join(f"word{i % 997}" for i in range(long_tokens // 2))
    result: dict[str, tuple] = {}

    def run(name: str, content: str, tokens: int) -> None:
        try:
            result[name] = Client(url).stream(content, tokens)
        except Exception as e:
            lost.append(f"{name}: {type(e).__name__}: {e}")

    long = threading.Thread(target=run, args=("long", "Summarise: " + words, 4))
    long.start()
    time.sleep(3.0)  # its prefill is under way
    shorts = []
    while long.is_alive():
        run("short", f"Say hello {len(shorts)}.", 4)
        if "short" in result:
            shorts.append(result.pop("short"))
        time.sleep(2.0)
    long.join()
    lg = result.get("long")
    return [r[1] - r[0] for r in shorts], (lg[1] - lg[0]) if lg else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--long", type=int, default=16384, help="tokens of the long prompt (0: skip part 2)")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    path = resolve_model(a.model).path
    ctx = max(2048, a.long + 512)
    streams = [int(x) for x in a.streams.split(",")]
    lost: list[str] = []
    with Engine.open(path, backend=a.backend, ctx=ctx) as engine:
        print(f"model {Path(path).name}, {a.backend} backend, {engine.info.kernels} kernels, ctx {ctx}, "
              f"{a.slots} slots, {a.tokens} tokens per answer", flush=True)
        opts = ServerOptions(Defaults(SamplingParams(temperature=0), a.tokens, "chat", ctx), parallel=a.slots,
                             max_queue=64)
        with ServerThread(engine, opts) as st:
            together(st.url, 1, 4, lost)  # warm up
            runs: dict[int, list[tuple[float, float]]] = {k: [] for k in streams}
            for _ in range(a.repeat):
                for k in streams:
                    runs[k].append(together(st.url, k, a.tokens, lost))
                    agg, per = runs[k][-1]
                    print(f"  {k} stream(s): {agg:.2f} t/s aggregate, {per:.2f} t/s per stream", flush=True)
            one = statistics.median(r[0] for r in runs[streams[0]])
            print("streams,aggregate_tps,stream_tps,vs_one_stream")
            for k in streams:
                agg = statistics.median(r[0] for r in runs[k])
                per = statistics.median(r[1] for r in runs[k])
                print(f"{k},{agg:.2f},{per:.2f},{agg / one:.2f}", flush=True)
            if a.long:
                ttft, prefill = long_and_short(st.url, a.long, lost)
                print(f"{len(ttft)} short requests while a {a.long}-token prompt prefilled (its first token after "
                      f"{prefill:.1f} s): first token after median {statistics.median(ttft):.2f} s, at most "
                      f"{max(ttft):.2f} s", flush=True)
            stats = st.worker.batcher.stats.as_dict() if st.worker.batcher else {}
    print(f"requests lost: {len(lost)}" + (f" ({lost[:3]})" if lost else ""))
    print(f"batcher: {stats}")


if __name__ == "__main__":
    main()
