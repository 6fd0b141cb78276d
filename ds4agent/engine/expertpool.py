"""The expert pool: routed experts read from the model file into a fixed number of slots, for
models larger than the memory given to them (docs/streaming.md).

Every token reads the dense weights, so they stay resident; of the routed experts (nine tenths
of the file) a token reads 6 per layer. The pool keeps whole experts (gate, up and down of one
expert of one layer) in slots of memory it owns, one anonymous mapping allocated at open and
never grown: the budget is a number of slots, and nothing the routing does can make it larger.
A miss is read into a free or evicted slot past the page cache where the OS allows it (O_DIRECT:
the disk writes the slot, the CPU copies nothing and no page-cache page is made for a memory
limit to charge and reclaim), else with pread through the page cache, whose pages are then
dropped; either way the bytes are not held twice (with plain mmap the page cache holds every
expert a token touched, and under a memory limit evicts the dense weights that the next token
needs first).

The kernels read experts through ``ExpertRows``: one address per expert for each of the three
matrices. Over the mapped file every address is there (the resident case); from the pool only
those of the experts a call holds. The same kernels serve both, and a layer whose experts do not
all fit at once runs in several calls over ascending ranges of experts, which the CPU kernel
adds up in the same order as one call (cpu_layers.c, add_in_expert_order): the logits are the
same bits whatever the budget.

Reads run on a few threads: the misses of one call together, and prefetches issued ahead (the
hash-routed layers' experts from the token ids, the next layer's likely experts from its router
applied early) while the current layer computes. ``stats`` counts hits, misses, prefetches
used and wasted, bytes read and the time a call waited.

Calls that hold experts come from one thread at a time (a forward pass is not re-entrant);
prefetches and reads may come from any.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..modelfile.config import ModelConfig
from ..modelfile.gguf import DIRECT_ALIGN, GGUFFile

GiB = 1 << 30
PAGE = mmap.PAGESIZE
MLOCK_ONFAULT = 1  # linux/mman.h
POLICIES = ("lru", "lfu")
# lfu's counts are halved every AGE_EVERY x (slots) uses: about every hundred decoded tokens
# where a pool holds a third to two thirds of the experts, long enough to tell a popular expert
# from a lucky one (most experts are used a few times per hundred tokens), short enough to
# follow a conversation that moves to other experts. (Skewed 4-layer model, 373 slots, second
# half of 300 greedy steps: 2 -> 5.6 experts read per token, 8 -> 5.3, 32 -> 5.25.)
AGE_EVERY = 8
# Reads ahead on a guess (the next layer's router applied early) are issued only while enough
# of them turn out right: a wrong guess costs a whole expert's read that a real miss may wait
# behind. Below this share of the guessed reads used by the call they were made for, a layer
# stops guessing, and tries again every PROBE_EVERY calls to see whether that changed.
# (Measured on the skewed 4-layer shape model under a 50% memory cap: bench/expert_pool.py.)
GUESS_FLOOR = 0.5
PROBE_EVERY = 8
# What a prefill chunk's temporaries take on the CPU path beside the weights, the pool and the
# KV (queries, scores, the expert kernels' buffers; glibc keeps freed blocks, engine/kernels/
# cpu.py): measured as peak RSS above those on the 4-layer shape model, 256-token chunks
# (bench/expert_pool.py prints it), with room to spare.
HOST_WORKING = 768 << 20


class PoolError(ValueError):
    """A budget or file the pool cannot work with; one line."""


@dataclass(frozen=True)
class ExpertRows:
    """Where one layer's routed experts are, for the expert kernels: per matrix (gate, up,
    down) one address per expert, its first row (uint64, n_expert entries; 0 for an expert a
    pool call does not hold), with the matrices' types and row lengths."""

    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    gu_type: int
    gu_row_bytes: int
    d_type: int
    d_row_bytes: int
    F: int  # rows of gate and up (the expert's hidden width)
    keep: object = None  # what the addresses point into, kept alive as long as these are
    # From the pool: the slot of each expert a call holds (int32, n_expert entries, -1 for the
    # others), for kernels that address the pool's memory by slot rather than by address.
    slots: np.ndarray | None = None

    @classmethod
    def over(cls, gate: np.ndarray, up: np.ndarray, gu_type: int, down: np.ndarray, d_type: int) -> "ExpertRows":
        """Every expert of tensors (n_expert, rows, row_bytes) in memory (the mapped file)."""
        def firsts(t: np.ndarray) -> np.ndarray:
            if t.ndim != 3 or t.strides[2] != 1 or t.strides[1] != t.shape[2]:
                raise ValueError("expert rows must be contiguous within each expert")
            return np.uint64(t.ctypes.data) + np.arange(t.shape[0], dtype=np.uint64) * np.uint64(t.strides[0])
        return cls(firsts(gate), firsts(up), firsts(down), int(gu_type), gate.shape[2], int(d_type), down.shape[2],
                   gate.shape[1], (gate, up, down))


@dataclass(frozen=True)
class _Layer:
    """One layer's expert tensors in the file: where expert 0 of each matrix starts, how many
    bytes one expert of it takes, where its region in a slot starts.

    Each matrix has a region of whole DIRECT_ALIGN pages with one page to spare, so that a direct
    read (GGUFFile.read_direct, whole pages of the file) lands the matrix in its region at the
    offset it has within its first page, wherever the file puts it; a read through the page
    cache (over memory the pool was given) lands it at the region's start."""

    starts: tuple[int, int, int]  # absolute file offsets of expert 0: gate, up, down
    sizes: tuple[int, int, int]  # bytes per expert
    at: tuple[int, int, int]  # offsets of the regions within a slot
    gu_type: int
    gu_row_bytes: int
    d_type: int
    d_row_bytes: int
    F: int

    @property
    def slot_bytes(self) -> int:
        return self.at[2] + _region(self.sizes[2])


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def _region(size: int) -> int:
    """A matrix's region in a slot: what a direct read of ``size`` bytes may fill."""
    return _up(size, DIRECT_ALIGN) + DIRECT_ALIGN


def _layers(f: GGUFFile, cfg: ModelConfig) -> list[_Layer]:
    out = []
    for i in range(cfg.n_layer):
        ts = [f.tensors[f"blk.{i}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")]
        if (ts[0].type, ts[0].dims) != (ts[1].type, ts[1].dims):  # the kernels read both with one type
            raise PoolError(f"layer {i}: gate and up experts differ ({ts[0].type_name} {ts[0].dims}, "
                            f"{ts[1].type_name} {ts[1].dims})")
        sizes = tuple(t.nbytes // cfg.n_expert for t in ts)
        gate_at = 0
        up_at = _region(sizes[0])
        down_at = up_at + _region(sizes[1])
        out.append(_Layer(tuple(t.offset for t in ts), sizes, (gate_at, up_at, down_at), ts[0].type,
                          ts[0].row_bytes, ts[2].type, ts[2].row_bytes, ts[0].shape[1]))
    return out


def expert_bytes(f: GGUFFile, cfg: ModelConfig) -> int:
    """Bytes of every routed expert in the file."""
    return sum(t.nbytes for name, t in f.tensors.items() if "_exps." in name)


def slots_for(f: GGUFFile, cfg: ModelConfig, budget: int) -> int:
    """How many slots ``budget`` bytes make (never more than there are experts)."""
    return min(budget // slot_bytes(f, cfg), cfg.n_layer * cfg.n_expert)


def slot_bytes(f: GGUFFile, cfg: ModelConfig) -> int:
    """Bytes one slot takes: the largest expert of any layer (layers may differ in type), whole
    pages so that every slot starts on a page."""
    return _up(max(lay.slot_bytes for lay in _layers(f, cfg)), PAGE)


@dataclass
class PoolStats:
    hits: int = 0  # experts a call found in the pool
    misses: int = 0  # experts a call had to read (or wait for: counted in stall)
    prefetched: int = 0  # reads issued ahead of a call
    guesses_skipped: int = 0  # guesses not read ahead: that layer's guesses were mostly wrong
    prefetch_used: int = 0  # of those, found by a call before being evicted
    wasted: int = 0  # of those, evicted unused
    bytes_read: int = 0
    stall_s: float = 0.0  # time calls waited for reads (misses and unfinished prefetches)
    read_s: float = 0.0  # time the readers spent reading (all threads together)
    calls: int = 0

    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def as_dict(self) -> dict[str, float]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["hit_rate"] = round(self.hit_rate(), 4)
        return d


@dataclass
class _Slot:
    loading: Future | None = None
    pins: int = 0


class ExpertPool:
    """``budget`` bytes of slots over the routed experts of ``f``; ``policy`` "lru" (evict the
    least recently used) or "lfu" (the least often used, of those the least recently: counted
    per expert, not per slot, so that an expert read again comes back with the uses it had,
    and halved every AGE_EVERY x slots uses, so that yesterday's favourites age out); ``readers``
    threads read. ``allocate`` (bytes -> (a writable uint8 view of that many bytes, the object
    that owns them)) gives the slots' memory when it must be elsewhere than in an anonymous
    mapping of the process: the GPU kernels' device memory (kernels/resident.py
    device_buffer), which the reads fill directly and the kernels read in place.

    ``direct``: the pool's own memory is filled by direct reads where the OS and file system
    allow them (GGUFFile.read_direct), else, and always in given memory, by pread through the
    page cache, whose pages are then dropped. Under a memory limit the direct reads decode
    faster: no copy by the CPU, and no page-cache pages for the limit to charge and reclaim
    (docs/streaming.md)."""

    def __init__(self, f: GGUFFile, cfg: ModelConfig, budget: int, policy: str = "lru", readers: int = 4,
                 allocate: Callable[[int], tuple[np.ndarray, object]] | None = None, direct: bool = True) -> None:
        if policy not in POLICIES:
            raise PoolError(f"unknown eviction policy {policy!r} (choose from {', '.join(POLICIES)})")
        self.file, self.cfg, self.policy = f, cfg, policy
        self._layers = _layers(f, cfg)
        self.slot_bytes = slot_bytes(f, cfg)
        self.slots = slots_for(f, cfg, budget)
        if self.slots < 1:
            raise PoolError(f"a memory budget of {size_text(budget)} holds no routed expert (one takes "
                            f"{size_text(self.slot_bytes)})")
        self.budget = budget
        size = self.slots * self.slot_bytes
        if allocate is None:
            self._mem: object = mmap.mmap(-1, size)  # anonymous: page-aligned, ours
            self._buf = np.frombuffer(self._mem, dtype=np.uint8)
        else:
            view, self._mem = allocate(size)
            if view.dtype != np.uint8 or view.ndim != 1 or view.size < size or not view.flags.writeable \
                    or not view.flags.c_contiguous:
                raise PoolError(f"the memory given for the slots is not {size_text(size)} of writable bytes")
            self._buf = view[:size]
        self._base = self._buf.ctypes.data
        # Reads go past the page cache while they can (off for given memory: device memory may
        # not take a direct read, and the GPU kernels address a matrix at its region's start).
        self.direct = direct and allocate is None
        self._skip = np.zeros((self.slots, 3), dtype=np.int64)  # each matrix's offset in its region
        self._slot = [_Slot() for _ in range(self.slots)]
        self._where: dict[int, int] = {}  # key -> slot
        self._busy = np.zeros(self.slots, dtype=bool)  # held by a call, or being read
        self._last = np.full(self.slots, -1.0)  # tick of the last use (-1: empty, taken first)
        self._freq = np.zeros(cfg.n_layer * cfg.n_expert)  # aged use counts per expert (lfu)
        self._keys = np.full(self.slots, -1)  # each slot's key: layer * n_expert + expert, -1 empty
        self._fresh = np.zeros(self.slots, dtype=bool)  # read ahead and not used yet
        self._tick = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a read finished
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="ds4-experts")
        self.stats = PoolStats()
        # How often calls asked for each expert (not reads ahead): the popularity profile.
        self.uses = np.zeros((cfg.n_layer, cfg.n_expert), dtype=np.int64)
        # Per layer: the experts read ahead on a guess for its next call, the moving share of
        # such reads that call used, and how many guesses were offered.
        self._guessed: list[set[int]] = [set() for _ in range(cfg.n_layer)]
        self._guess_share = np.ones(cfg.n_layer)
        self._guesses = np.zeros(cfg.n_layer, dtype=np.int64)

    # -- what the kernels call -----------------------------------------------------------------
    @property
    def allocated(self) -> int:
        """Bytes the pool holds: fixed at open."""
        return self.slots * self.slot_bytes

    @property
    def address(self) -> int:
        """Where the slots start in this process's memory."""
        return self._base

    @property
    def memory(self) -> np.ndarray:
        """The slots' bytes (slot s at s · slot_bytes), as the host sees them."""
        return self._buf

    @property
    def backing(self) -> object:
        """What owns the slots' memory: the object ``allocate`` returned (a device array), or
        the pool's own mapping."""
        return self._mem

    def offsets(self, layer: int) -> tuple[int, int, int]:
        """Where gate, up and down of ``layer``'s experts start within a slot of a pool over given
        memory (read through the page cache: every matrix at its region's start)."""
        if self.direct:
            raise ValueError("a pool read directly places each expert at its own offset: address it by ExpertRows")
        return self._layers[layer].at

    def spans(self, experts: np.ndarray) -> list[np.ndarray]:
        """The distinct ``experts`` (ascending) cut into runs that fit the pool at once."""
        chosen = np.unique(np.asarray(experts).reshape(-1))
        chosen = chosen[chosen >= 0]
        return [chosen[i : i + self.slots] for i in range(0, len(chosen), self.slots)]

    @contextmanager
    def holding(self, layer: int, experts: np.ndarray) -> Iterator[ExpertRows]:
        """The addresses of ``experts`` (distinct, at most ``slots``) of ``layer``, read first
        where missing; they stay in their slots until the block ends."""
        experts = [int(e) for e in experts]
        if len(experts) > self.slots:
            raise ValueError(f"{len(experts)} experts at once in a pool of {self.slots} slots")
        lay = self._layers[layer]
        n = self.cfg.n_expert
        held: list[int] = []
        try:
            t0 = time.perf_counter()
            waits: list[Future] = []
            with self._lock:
                self.stats.calls += 1
                guessed = self._guessed[layer]
                if guessed:  # how many of the guessed reads this call uses
                    share = len(guessed.intersection(experts)) / len(guessed)
                    self._guess_share[layer] = 0.7 * self._guess_share[layer] + 0.3 * share
                    guessed.clear()
                for e in experts:
                    s = self._take(layer * n + e)
                    held.append(s)
                    slot = self._slot[s]
                    if slot.loading is not None:
                        waits.append(slot.loading)
            for fut in waits:
                fut.result()  # a read error is raised here, in the caller
            self.stats.stall_s += time.perf_counter() - t0 if waits else 0.0
            tables = [np.zeros(n, dtype=np.uint64) for _ in range(3)]
            slots = np.full(n, -1, dtype=np.int32)
            for e, s in zip(experts, held):
                slots[e] = s
                for table, at, skip in zip(tables, lay.at, self._skip[s].tolist()):
                    table[e] = self._base + s * self.slot_bytes + at + skip
            yield ExpertRows(*tables, lay.gu_type, lay.gu_row_bytes, lay.d_type, lay.d_row_bytes, lay.F, self._buf,
                             slots)
        finally:
            with self._lock:
                for s in held:
                    slot = self._slot[s]
                    slot.pins -= 1
                    self._busy[s] = slot.pins > 0 or slot.loading is not None
                self._changed.notify_all()

    def prefetch(self, layer: int, experts: np.ndarray | Callable[[], np.ndarray], guess: bool = False) -> int:
        """Start reading ``experts`` of ``layer`` (most wanted first) into slots that nothing
        holds, without waiting: as many as fit beside what calls hold, at most half the pool
        (the rest keeps what is in use). ``guess``: the experts are a prediction (not known
        from the token ids), read only while that layer's predictions mostly come true (see
        GUESS_FLOOR); ``experts`` may then be a function that makes the prediction, called only
        when it will be read. Returns how many reads it started."""
        n = self.cfg.n_expert
        started = 0
        if guess:
            with self._lock:
                self._guesses[layer] += 1
                if self._guess_share[layer] < GUESS_FLOOR and self._guesses[layer] % PROBE_EVERY:
                    self.stats.guesses_skipped += 1
                    return 0
        if callable(experts):
            experts = experts()
        with self._lock:
            room = self.slots // 2
            for e in experts:
                key = layer * n + int(e)
                if started >= room:
                    break
                if key in self._where:
                    continue
                s = self._victim()
                if s is None:
                    break
                self._load(s, key, prefetch=True)
                started += 1
                if guess:
                    self._guessed[layer].add(int(e))
            self.stats.prefetched += started
        return started

    def preload(self, uses: np.ndarray) -> int:
        """Start reading the most used experts of a popularity profile (``uses``: counts per
        layer and expert, as ``self.uses``) into the empty slots, most used first, without
        waiting. Returns how many reads it started."""
        if uses.shape != self.uses.shape:
            raise PoolError(f"a profile of {uses.shape[0]} layers x {uses.shape[1]} experts for a model of "
                            f"{self.uses.shape[0]} x {self.uses.shape[1]}")
        flat = uses.reshape(-1)
        order = np.argsort(-flat, kind="stable")
        started = 0
        with self._lock:
            for key in order[: self.slots].tolist():
                if flat[key] <= 0:
                    break
                free = np.flatnonzero(self._last < 0)
                if not len(free):
                    break
                if key not in self._where:
                    self._load(int(free[0]), key, prefetch=True)
                    started += 1
            self.stats.prefetched += started
        return started

    def settle(self) -> None:
        """Wait until no read is in flight (what a measurement or a test of the slots' state
        needs: reads ahead finish on the readers' own time)."""
        with self._lock:
            while any(slot.loading is not None for slot in self._slot):
                self._changed.wait()

    def close(self) -> None:
        self._readers.shutdown(wait=True)
        self._buf = None  # our own view of the mapping, which would keep it open
        if isinstance(self._mem, mmap.mmap):
            try:
                self._mem.close()
            except BufferError:  # a caller still holds ExpertRows over it; freed when dropped
                pass
        self._mem = None  # given memory is freed when its owner's last reference goes

    def resident(self) -> list[tuple[int, int]]:
        """(layer, expert) of every filled slot."""
        n = self.cfg.n_expert
        with self._lock:
            return sorted(divmod(k, n) for k in self._where)

    # -- slots ---------------------------------------------------------------------------------
    def _take(self, key: int) -> int:
        """The slot of ``key``, read into a victim if missing; pinned. Under the lock; waits
        (releasing it) while every slot is held or being read."""
        s = self._where.get(key)
        slot = self._slot[s] if s is not None else None
        if slot is not None:
            self.stats.hits += 1
            if self._fresh[s]:
                self._fresh[s] = False
                self.stats.prefetch_used += 1
        else:
            self.stats.misses += 1
            s = self._victim()
            while s is None:  # every slot held by this call or being read: wait for a read
                self._changed.wait()
                s = self._where.get(key)
                if s is not None:
                    break
                s = self._victim()
            if self._keys[s] != key:
                self._load(s, key, prefetch=False)
            slot = self._slot[s]
        slot.pins += 1
        self._busy[s] = True
        self._use(s, key)
        self.uses.reshape(-1)[key] += 1
        return s

    def _use(self, s: int, key: int) -> None:
        self._tick += 1
        self._last[s] = self._tick
        self._freq[key] += 1.0
        if self.policy == "lfu" and self._tick % (AGE_EVERY * self.slots) == 0:
            self._freq *= 0.5

    def _victim(self) -> int | None:
        """A slot nothing holds or reads: an empty one first, then by the policy."""
        if self._busy.all():
            return None
        if self.policy == "lru":
            score = np.where(self._busy, np.inf, self._last)
            return int(np.argmin(score))
        # A read ahead not used yet goes after every used slot: its expert is wanted soon.
        keys = self._keys
        uses = np.where(keys >= 0, self._freq[keys], -1.0) + np.where(self._fresh, np.inf, 0.0)
        uses = np.where(self._busy, np.nan, uses)  # not all busy: checked above
        low = np.flatnonzero(uses == np.nanmin(uses))
        return int(low[np.argmin(self._last[low])])  # the least used; of those the oldest

    def _load(self, s: int, key: int, prefetch: bool) -> None:
        """Slot ``s`` now stands for ``key`` and is being read. Under the lock."""
        slot = self._slot[s]
        if self._keys[s] >= 0:
            del self._where[int(self._keys[s])]
            if self._fresh[s]:
                self.stats.wasted += 1
        self._keys[s], self._fresh[s] = key, prefetch
        self._where[key] = s
        self._busy[s] = True
        if prefetch:  # as if used now, so that lru does not take it next (lfu: see _victim)
            self._last[s] = self._tick
        slot.loading = self._readers.submit(self._read, s, key)

    def _read(self, s: int, key: int) -> None:
        layer, e = divmod(key, self.cfg.n_expert)
        lay = self._layers[layer]
        t0 = time.perf_counter()
        base = s * self.slot_bytes
        skips = [0, 0, 0]
        try:
            for part, (start, size, at) in enumerate(zip(lay.starts, lay.sizes, lay.at)):
                offset = start + e * size
                region = self._buf[base + at : base + at + _region(size)]
                skip = self.file.read_direct(offset, size, region) if self.direct else None
                if skip is None:  # given memory, or the OS or file system reads no other way
                    self.direct = False
                    self.file.read_into(offset, region[:size])
                    self.file.drop_cached(offset, size)
                    skip = 0
                skips[part] = skip
        except BaseException:
            with self._lock:  # the slot holds nothing usable: forget it
                slot = self._slot[s]
                if self._where.get(int(self._keys[s])) == s:
                    del self._where[int(self._keys[s])]
                slot.loading = None
                self._keys[s], self._fresh[s] = -1, False
                self._last[s] = -1.0
                self._busy[s] = slot.pins > 0
                self._changed.notify_all()
            raise
        with self._lock:
            self.stats.bytes_read += sum(lay.sizes)
            self.stats.read_s += time.perf_counter() - t0
            self._skip[s] = skips
            slot = self._slot[s]
            slot.loading = None
            self._busy[s] = slot.pins > 0
            self._changed.notify_all()


# -- the popularity profile ---------------------------------------------------------------------
PROFILE_FORMAT = 1


def save_profile(path: str | os.PathLike[str], uses: np.ndarray, fingerprint: int) -> None:
    """Write a popularity profile (JSON: the model's fingerprint and the use counts per layer and
    expert), atomically: a file being replaced is never left half-written."""
    doc = {"ds4agent_expert_profile": PROFILE_FORMAT, "fingerprint": int(fingerprint),
           "layers": int(uses.shape[0]), "experts": int(uses.shape[1]), "uses": uses.astype(int).tolist()}
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise PoolError(f"{path}: cannot write the expert profile: {e.strerror or e}") from None


def load_profile(path: str | os.PathLike[str], fingerprint: int, shape: tuple[int, int]) -> np.ndarray:
    """The use counts of a profile saved for this model (same fingerprint and shape)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as e:
        raise PoolError(f"{path}: cannot read the expert profile: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError):
        raise PoolError(f"{path}: not an expert profile (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("ds4agent_expert_profile") != PROFILE_FORMAT:
        raise PoolError(f"{path}: not an expert profile of this version")
    if doc.get("fingerprint") != fingerprint:
        raise PoolError(f"{path}: the expert profile was made with another model file")
    try:
        uses = np.array(doc["uses"], dtype=np.int64)
    except (KeyError, TypeError, ValueError, OverflowError):
        raise PoolError(f"{path}: the expert profile's counts are damaged") from None
    if uses.shape != shape or (uses < 0).any():
        raise PoolError(f"{path}: the expert profile's counts are damaged")
    return uses


# -- the budget ---------------------------------------------------------------------------------
def available_memory() -> tuple[int | None, str]:
    """(bytes this process may still take, what the number is): on Linux the kernel's
    MemAvailable, or less where a memory cgroup (v1 or v2, this process's or an ancestor's)
    leaves less room under its limit; elsewhere three quarters of the physical memory."""
    avail: int | None = None
    what = ""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail, what = int(line.split()[1]) * 1024, "available memory"
    except (OSError, ValueError, IndexError):
        pass
    room = _cgroup_room()
    if room is not None and (avail is None or room < avail):
        avail, what = room, "room under the memory cgroup's limit"
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4
            what = "three quarters of physical memory"
        except (OSError, ValueError, AttributeError):
            return None, ""
    return avail, what


def _cgroup_room(root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int | None:
    """The least room (limit minus what is used, page cache not counted: the kernel reclaims it)
    of this process's memory cgroup and its ancestors; None when none has a limit."""
    try:
        with open(own) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # v2
            base, files = root, ("memory.max", "memory.current", "file")
        elif "memory" in parts[1].split(","):  # v1
            base, files = os.path.join(root, "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                          "total_cache")
        else:
            continue
        path = parts[2]
        while True:
            room = _room_at(os.path.join(base, path.lstrip("/")), *files)
            if room is not None and (best is None or room < best):
                best = room
            if path in ("/", ""):
                break
            path = os.path.dirname(path)
    return best


def _room_at(folder: str, limit_file: str, usage_file: str, cache_key: str) -> int | None:
    try:
        with open(os.path.join(folder, limit_file)) as fh:
            text = fh.read().strip()
        if text == "max" or int(text) >= 1 << 60:  # v1 writes "no limit" as a huge number
            return None
        limit = int(text)
        with open(os.path.join(folder, usage_file)) as fh:
            used = int(fh.read().strip())
        cache = 0
        with open(os.path.join(folder, "memory.stat")) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == cache_key:
                    cache = int(value)
        return max(0, limit - max(0, used - cache))
    except (OSError, ValueError):
        return None


def lock_dense(f: GGUFFile) -> str:
    """Lock the dense weights' pages of the mapped file in memory as they are first read (every
    token reads them; under pressure the OS would otherwise evict them before anything else).
    Linux's mlock2(MLOCK_ONFAULT) locks each page when it faults in, so opening still reads
    nothing; where it is missing (macOS, old kernels) or refused (RLIMIT_MEMLOCK, ``ulimit -l``)
    the weights stay mapped but unlocked, and the returned text, said at open, says so."""
    try:
        mlock2 = ctypes.CDLL(None, use_errno=True).mlock2
    except (OSError, AttributeError):
        return "not locked (this system has no mlock2 to lock them as they are read)"
    mlock2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    total = 0
    for name, t in f.tensors.items():
        if not is_dense(name):
            continue
        addr = f.array(name).ctypes.data
        start = addr // PAGE * PAGE
        if mlock2(start, addr + t.nbytes - start, MLOCK_ONFAULT) != 0:
            err = ctypes.get_errno()
            return (f"not locked ({os.strerror(err)}; raise 'ulimit -l' to lock them): the OS may evict them "
                    "under memory pressure")
        total += t.nbytes
    return f"locked in memory as they are read ({size_text(total)})"


def is_dense(name: str) -> bool:
    """A tensor every token reads whole: not a routed expert, not the embedding or the hash
    tables (rows of those are gathered per token)."""
    return "_exps." not in name and name != "token_embd.weight" and "_tid2eid." not in name


def size_text(n: int) -> str:
    """Bytes for a person: GiB, or MiB below a tenth of one."""
    return f"{n / GiB:.2f} GiB" if n >= GiB // 10 else f"{n / 2**20:.1f} MiB"
