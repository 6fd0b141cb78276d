"""`ds4 bench`: prefill and generation speed at growing context frontiers, in ds4-bench's CSV.

For each frontier: prefill only the new interval (timed), snapshot (not timed), greedy decode of
exactly ``gen_tokens`` with the end-of-sentence token excluded (timed), restore the snapshot,
continue. Also reports the bytes of weights one decoded token reads and the bandwidth that
implies, which is what bounds decoding a mixture of experts, against the machine's read
bandwidth (``read_probe``: every core reading the model's own mapping, measured first) on the
CPU backend.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import IO, Callable

import numpy as np

from ..engine import Engine

CSV_HEADER = "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"


@dataclass
class Row:
    ctx: int
    prefill_tokens: int
    prefill_tps: float
    gen_tokens: int
    gen_tps: float
    kv_bytes: int

    def csv(self) -> str:
        return (f"{self.ctx},{self.prefill_tokens},{self.prefill_tps:.2f},{self.gen_tokens},{self.gen_tps:.2f},"
                f"{self.kv_bytes}")


def frontiers(start: int, stop: int, incr: int, mul: float | None) -> list[int]:
    out, n = [], start
    while n <= stop:
        out.append(n)
        n = int(math.ceil(n * mul)) if mul else n + incr
    return out


def bytes_per_token(engine: Engine) -> int:
    """Weight bytes one decoded token reads: every dense tensor, one embedding row, and the
    selected experts' share of each expert tensor."""
    cfg = engine.info.config
    total = 0
    for t in engine.file.tensors.values():
        if t.name == "token_embd.weight":
            total += t.row_bytes
        elif "_exps." in t.name:
            total += t.nbytes * cfg.n_expert_used // cfg.n_expert
        elif t.name.endswith("tid2eid.weight"):
            total += t.row_bytes
        else:
            total += t.nbytes
    return total


def read_probe(engine: Engine) -> float | None:
    """Bytes per second at which every core reads the model's mapping (its largest tensor, up
    to 1 GiB, paged in first; cpu.read_bandwidth), on the CPU backend: what decoding can reach
    at best there. None on a GPU backend, or without the CPU kernels' library."""
    if engine.info.backend != "cpu":
        return None
    try:
        from ..kernels import cpu
        from ..kernels.cpu_build import BuildError

        big = max(engine.file.tensors.values(), key=lambda t: t.nbytes)
        return cpu.read_bandwidth(engine.file.array(big.name).view(np.uint8).reshape(-1)[: 1 << 30])
    except (ImportError, BuildError, OSError):
        return None


def prefetch_note(engine: Engine) -> str | None:
    """How far ahead the CPU kernels prefetch and where that came from (kernels/cpu_tune.py),
    once a forward pass has settled it; None elsewhere."""
    if engine.info.backend != "cpu" or engine.info.kernels not in ("cpu", "cpu-exact"):
        return None
    from ..kernels import cpu_tune

    p = cpu_tune.current()
    return p.describe() if p else None


def streaming_note(engine: Engine, decoded: int) -> str | None:
    """With experts streaming: how the pool did over the whole run (hit rate, reads ahead used
    and wasted, bytes read, time waited); None when nothing streams."""
    s = engine.streaming()
    if s is None:
        return None
    per = ""
    if decoded:
        per = f" ({s['bytes_read'] / decoded / 2**20:.0f} MiB per decoded token, prefill included)"
    return (f"expert pool: {s['slots']} of {s['experts']} experts resident, {100 * s['hit_rate']:.1f}% of those "
            f"asked for found, {s['bytes_read'] / 2**30:.2f} GiB read{per} "
            f"{'past' if s['direct'] else 'through'} the page cache, reads ahead {s['prefetch_used']} used "
            f"and {s['wasted']} wasted of {s['prefetched']}, {s['stall_s']:.1f} s waited for reads")


def run(engine: Engine, ids: list[int], points: list[int], gen_tokens: int,
        progress: Callable[[int, int, Row], None] | None = None, drafts: dict | None = None) -> list[Row]:
    """The rows; ``drafts`` (when given) gets the session's drafter counters (proposed and
    kept tokens: the decode goes through Session.generate, speculating as the engine does)."""
    from ..params import SamplingParams

    s = engine.session()
    rows = []
    prev = 0
    for k, ctx in enumerate(points):
        t = time.perf_counter()
        n = s.sync(ids[:ctx])
        prefill = time.perf_counter() - t
        blob = s.snapshot()
        t = time.perf_counter()
        # gen_tokens tokens evaluated (the last one sampled is not), greedy, an end of sentence
        # taken as any token: exactly gen_tokens steps whatever the model says.
        for _ in s.generate(SamplingParams(temperature=0), max_tokens=gen_tokens + 1, stop_at_eos=False):
            pass
        gen = time.perf_counter() - t
        s.restore(blob)
        row = Row(ctx, n if n else ctx - prev, n / prefill if prefill > 0 else 0.0, gen_tokens,
                  gen_tokens / gen if gen > 0 else 0.0, len(blob))
        rows.append(row)
        prev = ctx
        if progress:
            progress(k + 1, len(points), row)
    stats = getattr(s.drafter, "stats", None)
    if drafts is not None and stats is not None:
        drafts.update(stats())
    return rows


@dataclass
class StreamsRow:
    """Decode of ``streams`` sessions advancing together (engine/batch.py): ``gen`` tokens each."""

    streams: int
    gen: int
    seconds: float

    @property
    def aggregate_tps(self) -> float:
        return self.streams * self.gen / self.seconds

    @property
    def stream_tps(self) -> float:
        return self.gen / self.seconds


def widths(most: int) -> list[int]:
    """1, 2, 4, ... up to ``most`` (and ``most`` itself)."""
    out, n = [], 1
    while n < most:
        out.append(n)
        n *= 2
    return out + [most]


def parallel(engine: Engine, ids: list[int], streams: list[int], prompt: int, gen: int, repeat: int = 1,
             progress: Callable[[StreamsRow], None] | None = None) -> list[StreamsRow]:
    """Greedy decode of ``gen`` tokens by 1, 2, ... sessions at once, each after its own
    ``prompt``-token prefill (different windows of ``ids``, not timed); the widths alternate
    ``repeat`` times and each row is the median run. Sessions of one width advance in one
    batched pass per step (Session.advance_together), as a server's slots do."""
    from ..session import Session

    runs: dict[int, list[float]] = {w: [] for w in streams}
    for _ in range(repeat):
        for w in streams:
            sessions = [engine.session() for _ in range(w)]
            for k, s in enumerate(sessions):
                at = (k * 97) % max(1, len(ids) - prompt)
                s.sync(ids[at : at + prompt])
            t = time.perf_counter()
            for _ in range(gen):
                Session.advance_together(sessions, [int(np.argmax(s.logits)) for s in sessions])
            runs[w].append(time.perf_counter() - t)
            if progress:
                progress(StreamsRow(w, gen, runs[w][-1]))
    return [StreamsRow(w, gen, float(np.median(runs[w]))) for w in streams]


def plot(rows: list[Row], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    x = [r.ctx for r in rows]
    ax[0].plot(x, [r.prefill_tps for r in rows], marker="o")
    ax[0].set(title="prefill", xlabel="context tokens", ylabel="tokens/s")
    ax[1].plot(x, [r.gen_tps for r in rows], marker="o", color="tab:orange")
    ax[1].set(title="generation", xlabel="context tokens", ylabel="tokens/s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(rows: list[Row], out: IO[str]) -> None:
    out.write(CSV_HEADER + "\n")
    for r in rows:
        out.write(r.csv() + "\n")
