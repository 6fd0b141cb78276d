"""How far ahead the CPU kernels prefetch weights, measured once per machine and cached.

A decode step streams every dense matrix and the chosen experts' rows from memory once. How
much a software prefetch ahead of the demand loads helps depends on the machine: on 2 cores
of an AMD EPYC VM the few-token Q8_0 kernel ran best with none (the hardware prefetchers kept
up), on 2 cores of an Intel Xeon VM (AVX-512, AMX) 2 KB ahead took the Flash output head
from 26 to 29 GB/s, and the expert kernels there ran best 1-2 rows ahead, a third slower at
4. So the distances are measured on the machine, on the model's own tensors, at the first
forward pass of a large enough model (about a second, once: opening a model reads no weights),
and cached beside the compiled kernels, keyed by the CPU. ``DS4_PREFETCH=BYTES[,ROWS]`` sets
them by hand (``auto``: measure or use the cache).

The measurement alternates the candidates, reads 256 MiB of other memory before each timed
product so that it starts from DRAM as a decode step's products do, and keeps the median of
each. It changes no result, only speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from ... import settings
from ...modelfile.gguf import GGUFFile
from .cpu_build import cpu_identity

Q8_CANDIDATES = (0, 512, 1024, 2048, 4096)  # bytes ahead in the few-token Q8_0 kernel
ROW_CANDIDATES = (1, 2, 4, 8)  # rows ahead in the expert kernels
REPEAT = 5
REGION = 32 << 20  # bytes of the Q8_0 matrix one timed product reads
FLUSH = 256 << 20
# A model too small for the measurement (its matrices stay in the caches) keeps these.
DEFAULT_Q8, DEFAULT_ROWS = 0, 2


@dataclass(frozen=True)
class Prefetch:
    q8_bytes: int
    expert_rows: int
    source: str  # "measured", "cached", "DS4_PREFETCH" or "default"

    def describe(self) -> str:
        return (f"Q8_0 products {self.q8_bytes} bytes ahead, experts {self.expert_rows} "
                f"row{'s' if self.expert_rows != 1 else ''} ahead ({self.source})")


_current: Prefetch | None = None


def current() -> Prefetch | None:
    """The distances in force (None before any CPU kernels were made)."""
    return _current


def cache_path() -> Path:
    key = hashlib.sha1(cpu_identity().encode()).hexdigest()[:16]
    return settings.kernels_dir() / f"prefetch-{key}.json"


def parse(value: str) -> tuple[int, int] | None:
    """``BYTES`` or ``BYTES,ROWS`` (non-negative integers; rows at least 1) or None for auto.
    Raises ValueError naming what is wrong."""
    value = value.strip()
    if value in ("", "auto"):
        return None
    parts = value.split(",")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"DS4_PREFETCH={value!r}: expected BYTES or BYTES,ROWS (e.g. 2048,2) or auto")
    q8 = int(parts[0])
    rows = int(parts[1]) if len(parts) == 2 else DEFAULT_ROWS
    if rows < 1:
        raise ValueError(f"DS4_PREFETCH={value!r}: the expert rows ahead must be at least 1")
    return q8, rows


def _read_cache() -> Prefetch | None:
    try:
        data = json.loads(cache_path().read_text())
        q8, rows = int(data["q8_bytes"]), int(data["expert_rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Prefetch(q8, rows, "cached") if q8 >= 0 and rows >= 1 else None


def _write_cache(p: Prefetch) -> None:
    try:
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"q8_bytes": p.q8_bytes, "expert_rows": p.expert_rows,
                                   "measured": time.strftime("%Y-%m-%d")}))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable home: measured again next time


def subjects(f: GGUFFile) -> tuple[str, str] | None:
    """The largest Q8_0 matrix (the output head) and the last layer's gate experts, where both
    are large enough to measure streaming from memory; else None."""
    q8 = [t for t in f.tensors.values() if t.type == Q.Q8_0 and len(t.shape) == 2]
    gates = [t for t in f.tensors.values() if t.name.endswith("ffn_gate_exps.weight")]
    if not q8 or not gates:
        return None
    head, gate = max(q8, key=lambda t: t.nbytes), gates[-1]
    if head.nbytes < 8 * REGION or gate.nbytes < 16 * REGION:
        return None
    return head.name, gate.name


def measure(f: GGUFFile, lib, names: tuple[str, str], matmul_raw: Callable) -> Prefetch:
    """Time the candidates on the model's own matrices (see the module's docstring), with
    ``matmul_raw`` the kernels' product (cpu.matmul_raw)."""
    head_t, gate_t = (f.tensors[n] for n in names)
    head = f.array(head_t.name).view(np.uint8).reshape(head_t.shape[0], -1)
    gate = f.array(gate_t.name).view(np.uint8)
    gate = gate.reshape(-1, gate.shape[-1])  # all experts' rows, one after another
    flush = np.ones(FLUSH, np.uint8)
    rng = np.random.default_rng(0)
    x_head = rng.standard_normal((1, head_t.shape[-1])).astype(np.float32)
    x_gate = rng.standard_normal((1, gate_t.shape[-1])).astype(np.float32)

    def regions(raw: np.ndarray) -> list[np.ndarray]:
        rows = max(1, REGION // raw.shape[1])
        return [raw[i : i + rows] for i in range(0, raw.shape[0] - rows + 1, rows)]

    def best(candidates: tuple[int, ...], t, raw: np.ndarray, x: np.ndarray, setter) -> int:
        """The candidate whose products ran fastest (medians), each product on another region
        of ``raw`` read from memory."""
        pieces = regions(raw)
        times: dict[int, list[float]] = {c: [] for c in candidates}
        i = 0
        for rep in range(REPEAT):
            for c in candidates[rep % len(candidates):] + candidates[: rep % len(candidates)]:
                setter(c)
                lib.ds4_read(flush.ctypes.data, flush.size)
                start = time.perf_counter()
                matmul_raw(pieces[i % len(pieces)], t.type, t.shape[-1], x)
                times[c].append(time.perf_counter() - start)
                i += 1
        return min(candidates, key=lambda c: statistics.median(times[c]))

    for raw in (head, gate):  # map in the pages the timed products read (not timed)
        lib.ds4_read(raw.ctypes.data, min(raw.nbytes, REGION * REPEAT * len(Q8_CANDIDATES)))
    q8 = best(Q8_CANDIDATES, head_t, head, x_head, lambda c: lib.ds4_set_prefetch(c, DEFAULT_ROWS))
    rows = best(ROW_CANDIDATES, gate_t, gate, x_gate, lambda c: lib.ds4_set_prefetch(q8, c))
    return Prefetch(q8, rows, "measured")


def _apply(lib, p: Prefetch) -> Prefetch:
    global _current
    lib.ds4_set_prefetch(p.q8_bytes, p.expert_rows)
    _current = p
    return p


def choose(lib) -> Prefetch:
    """The distances for this machine without reading any weights: DS4_PREFETCH, else the
    cache, else the defaults (source "default": measure_once may then measure); set in the
    kernel library."""
    try:
        manual = parse(os.environ.get("DS4_PREFETCH", ""))
    except ValueError as e:
        print(f"ds4: warning: {e}; using the measured distances", file=sys.stderr)
        manual = None
    if manual is not None:
        return _apply(lib, Prefetch(manual[0], manual[1], "DS4_PREFETCH"))
    return _apply(lib, _read_cache() or Prefetch(DEFAULT_Q8, DEFAULT_ROWS, "default"))


def measure_once(f: GGUFFile, lib, matmul_raw: Callable) -> Prefetch:
    """Where choose() found nothing and ``f`` is large enough: measure on it, cache and set
    the result, with one line on stderr before and after. Otherwise the distances in force."""
    p = _current or choose(lib)
    if p.source != "default":
        return p
    names = subjects(f)
    if names is None:
        return p
    print("ds4: measuring how far ahead the CPU kernels should read on this machine (once, about a second)",
          file=sys.stderr, flush=True)
    p = measure(f, lib, names, matmul_raw)
    _write_cache(p)
    print(f"ds4: prefetch: {p.describe()}", file=sys.stderr, flush=True)
    return _apply(lib, p)
