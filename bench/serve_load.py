"""Load benchmark for `ds4 serve` (docs/server.md): concurrent clients on loopback, each running
a multi-turn conversation through the official openai SDK (streamed), against the server
in-process on a real engine. Not a timed test: run it by hand.

    .venv/bin/python bench/serve_load.py [-m MODEL] [--clients 4] [--turns 3] [--tokens 32]

Reports requests lost (must be 0; a 503 is retried after its Retry-After and is not lost),
latency percentiles (whole request and first token), cache hit rate (cached / prompt tokens
after each conversation's first turn), and generation speed through the server against the
engine's own generation speed on the same model and prompt (the `ds4 bench` measurement:
sync, then timed greedy decoding), with their ratio (goal: at least 95%).
"""

from __future__ import annotations

import argparse
import logging
import re
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

SYSTEM = "You are a helpful assistant that answers briefly. " * 20


def engine_speed(engine: Engine, tokens: int) -> float:
    """engine_in_thread's speed measured in a thread of its own. Seen here (MLX 0.32, CPU):
    once the main thread has run the model, a forward pass in another thread is ~40% slower,
    while threads that never follow the main thread's use are not; the server's worker is a
    thread, so measuring on the main thread would both flatter the engine and slow the server."""
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(engine_in_thread(engine, tokens)))
    t.start()
    t.join()
    return out[0]


def engine_in_thread(engine: Engine, tokens: int) -> float:
    """Greedy decoding speed of the engine alone, after a short prompt (what ds4 bench times)."""
    s = engine.session()
    s.sync(engine.tokenizer.encode_rendered(f"<｜begin▁of▁sentence｜>{SYSTEM}<｜User｜>Hello<｜Assistant｜></think>"))
    n, t0 = 0, time.perf_counter()
    for _ in s.generate(SamplingParams(temperature=0), max_tokens=tokens, stop_at_eos=False):
        n += 1
    return n / (time.perf_counter() - t0)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: the model ds4 would run, else the demo)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="max tokens per answer")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--time-limit", type=float, default=600.0, help="give up after this many seconds")
    args = ap.parse_args()
    if not 1 <= args.clients <= 32 or not 1 <= args.turns <= 20:
        ap.error("--clients must be in 1..32 and --turns in 1..20")

    choice = resolve_model(args.model)
    engine = Engine.open(choice.path, ctx=args.ctx)
    print(f"model {choice.path} ({engine.info.backend}, {engine.info.kernels} kernels)", flush=True)
    engine_speed(engine, 4)  # first use: kernels built, weights paged in
    direct = engine_speed(engine, args.tokens)  # in a thread, as the server's worker runs it

    lock = threading.Lock()
    latencies: list[float] = []
    first_token: list[float] = []
    gen_speeds: list[float] = []
    cached = prompt = 0
    lost: list[str] = []
    retried = 0
    deadline = time.monotonic() + args.time_limit
    opts = ServerOptions(Defaults(SamplingParams(temperature=0), args.tokens, "chat", args.ctx),
                         max_queue=max(1, args.clients // 2))

    # The server's own measure of each generation (its log line): client-side timing of streamed
    # deltas would count how the event loop batches them, not the engine.
    worker_speeds: list[float] = []

    class Speeds(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            m = re.search(r" gen=(\d+) ([0-9.]+) t/s", record.getMessage())
            if m and int(m.group(1)) > 1:
                worker_speeds.append(float(m.group(2)))

    logging.getLogger("ds4agent.server").addHandler(Speeds())
    logging.getLogger("ds4agent.server").setLevel(logging.INFO)

    with ServerThread(engine, opts) as st:
        def client(k: int) -> None:
            nonlocal cached, prompt, retried
            c = openai.OpenAI(base_url=st.url + "/v1", api_key="bench", max_retries=0, timeout=args.time_limit)
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Client {k}: tell me a story."}]
            for turn in range(args.turns):
                while time.monotonic() < deadline:
                    t0 = time.perf_counter()
                    try:
                        stream = c.chat.completions.create(model="m", messages=msgs, stream=True,
                                                           max_tokens=args.tokens,
                                                           stream_options={"include_usage": True})
                        text, usage, t_first, t_last = "", None, None, None
                        for ch in stream:
                            usage = ch.usage or usage
                            for choice in ch.choices:
                                if choice.delta.content or getattr(choice.delta, "reasoning_content", None):
                                    t_first = t_first or time.perf_counter()
                                    t_last = time.perf_counter()
                                text += choice.delta.content or ""
                    except openai.APIStatusError as e:
                        if e.status_code == 503:
                            with lock:
                                retried += 1
                            time.sleep(float(e.response.headers.get("retry-after", "1")))
                            continue
                        with lock:
                            lost.append(f"client {k} turn {turn}: {e}")
                        return
                    except Exception as e:  # noqa: BLE001 - every failure counts as lost
                        with lock:
                            lost.append(f"client {k} turn {turn}: {e}")
                        return
                    with lock:
                        latencies.append(time.perf_counter() - t0)
                        if t_first:
                            first_token.append(t_first - t0)
                        if t_first and t_last and usage and usage.completion_tokens > 1 and t_last > t_first:
                            gen_speeds.append((usage.completion_tokens - 1) / (t_last - t_first))
                        if turn > 0 and usage:
                            cached += usage.prompt_tokens_details.cached_tokens
                            prompt += usage.prompt_tokens
                    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
                    break
                else:
                    with lock:
                        lost.append(f"client {k} turn {turn}: time limit")
                    return

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, deadline - time.monotonic()))
        wall = time.perf_counter() - t0

    # Measured again after the load: on a shared machine the speed drifts; the better one counts.
    direct = max(direct, engine_speed(engine, args.tokens))
    expected = args.clients * args.turns
    served = statistics.median(worker_speeds) if worker_speeds else float("nan")
    streamed = statistics.median(gen_speeds) if gen_speeds else float("nan")
    print(f"requests: {len(latencies)}/{expected} served, lost {expected - len(latencies)}"
          f" ({retried} retries after 503), {wall:.1f}s wall")
    for line in lost[:10]:
        print(f"  lost: {line}")
    print(f"latency s: p50 {percentile(latencies, 0.5):.2f} p90 {percentile(latencies, 0.9):.2f} "
          f"p99 {percentile(latencies, 0.99):.2f}; first token p50 {percentile(first_token, 0.5):.2f} "
          f"p90 {percentile(first_token, 0.9):.2f}")
    print(f"cache: {cached}/{prompt} prompt tokens after the first turn ({100 * cached / max(prompt, 1):.1f}%)")
    print(f"generation: {served:.2f} t/s through the server (median per request, the worker's timing; "
          f"{streamed:.2f} t/s as the clients saw the deltas), "
          f"{direct:.2f} t/s engine alone ({100 * served / direct:.0f}%)")
    return 0 if len(latencies) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
