"""One model across the processes of an mx.distributed group (docs/distributed.md).

Rank 0 is the product: it owns the terminal, the HTTP socket and the session store, runs the
ordinary Session API and samples. Every other rank opens its own copy of the model file, keeps
its share of the weights and of the KV state, and follows rank 0's commands (``follow``) until
rank 0 closes the engine.

Commands travel round the ring, rank 0 -> 1 -> ... -> N-1, each process forwarding what it
reads before acting on it; pipeline activations travel the same way (stage s runs on rank
(s + 1) % N, so the last stage, with the output head, is rank 0 and the logits never travel).
Messages on one connection keep their order, so a command and the hidden state that follows
it never need tags.

The KV state on the followers mirrors rank 0's states by number: every ModelState rank 0
holds carries a ``remote`` handle naming the followers' copy (state 0 is the empty one). A
step says "from state a, make state b"; checkpoints and rollbacks on rank 0 keep using their
own handles, so the followers never have to be told about them; when rank 0 forgets a state
(the handle is garbage-collected) the next command tells the followers to forget theirs too.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from ... import __version__
from ..model import Model, Part
from ..session import Progress, Session
from ..state import ModelState, layer_bytes, layer_from_bytes, layer_nbytes
from . import split as splits
from .launch import launched
from .link import GroupError, Link, StderrFilter, init

if TYPE_CHECKING:
    from ..engine import Engine
    from ..info import EngineInfo

# Commands (the first field of a header). A header is HEADER int64 values:
# op, source state, new state, count (tokens or bytes), states to forget, flags, n_tokens, spare.
STEP, SNAPSHOT, RESTORE, QUIT = 1, 2, 3, 4
HEADER = 8
INFO_BYTES = 1024  # each rank's description at the handshake, JSON padded to a fixed size
_FILTER = None  # the process's StderrFilter, once it joined a group
JOIN_TIMEOUT = 60.0  # seconds for the group to form (a model file opens in seconds)


def backend_setting() -> str:
    """The mx.distributed backend this process was launched for."""
    if "MLX_JACCL_COORDINATOR" in os.environ:
        return "jaccl"
    if "MLX_WORLD_SIZE" in os.environ and "MLX_HOSTFILE" not in os.environ:
        return "nccl"
    return "ring"


class _Handle:
    """The followers' copy of one of rank 0's states. When rank 0 lets go of every state that
    refers to it, the followers are told to free theirs (with the next command)."""

    __slots__ = ("id", "__weakref__")

    def __init__(self, number: int, dropped: list[int]) -> None:
        self.id = number
        weakref.finalize(self, dropped.append, number)


@dataclass
class Counters:
    """What one rank moved, for the benchmarks (bytes of arrays, not of TCP framing)."""

    sent: int = 0
    reduced: int = 0
    messages: int = 0


class Distributed:
    """One rank's place in the group: its plan, its model, the link, the followers' states."""

    def __init__(self, model: Model, link: Link, plan: splits.Plan) -> None:
        self.model = model
        self.cfg = model.cfg
        self.opt = model.opt
        self.w = model.w
        self.link = link
        self.plan = plan
        self.rank, self.size = link.rank, link.size
        self.states: dict[int, ModelState] = {0: self.empty_state()}  # a follower's copies
        self._next = 1
        self._dropped: list[int] = []
        self.closed = False
        # Chunks of a prefill in flight at once: one per stage keeps every stage busy; more
        # would only queue hidden states (DS4_DIST_PIPELINE=1 turns it off, for comparison).
        self.pipeline_window = plan.size if os.environ.get("DS4_DIST_PIPELINE") != "1" else 1
        self.most_in_flight = 0  # the most chunks that were in flight at once (the tests look)
        if plan.split == "pipeline":
            self.lo, self.hi = plan.stages[plan.stage]

    # -- what Session and the engine use on rank 0 -------------------------------------------
    def empty_state(self) -> ModelState:
        return ModelState.empty(self.cfg, held=self.plan.layers)

    def forward(self, ids: np.ndarray, state: ModelState, all_logits: bool = False):
        ids = np.asarray(ids, dtype=np.int64)
        dst = self.issue(ids, state.remote, state.n_tokens, all_logits)
        return self.finish(ids, state, dst, all_logits)

    def issue(self, ids: np.ndarray, src: "_Handle | None", n_tokens: int, all_logits: bool = False) -> "_Handle":
        """Rank 0: send the command of a step from the followers' state ``src`` (None: the
        empty one) after ``n_tokens``; returns the handle of the state it makes. The step's
        own part on rank 0 is ``finish``; in between, more steps may be issued (a pipelined
        prefill), since every process takes its commands in order."""
        dst = self._new()
        try:
            self._command(STEP, 0 if src is None else src.id, dst.id, flags=int(all_logits), n_tokens=n_tokens,
                          data=np.asarray(ids).astype(np.int32))
        except GroupError:
            raise
        except BaseException as e:  # half a command sent: the next bytes would be misread
            raise self.link.fail(f"rank 0 stopped while sending a command ({type(e).__name__}); the group is "
                                 "stopped") from e
        return dst

    def finish(self, ids: np.ndarray, state: ModelState, dst: "_Handle", all_logits: bool = False):
        """Rank 0: its part of the oldest issued step (``state``: the live state forked)."""
        try:
            out = self._step(np.asarray(ids, dtype=np.int64), state, all_logits)
        except GroupError:
            raise
        except BaseException as e:
            # The others are inside this step (or have finished it): a half-done step cannot
            # be taken back on them, and what they send next would be read as the next
            # step's. Stop the group rather than go on out of step.
            raise self.link.fail(f"rank 0 stopped in the middle of a step ({type(e).__name__}); the group is "
                                 "stopped") from e
        state.remote = dst
        return out

    def discard(self, ids: np.ndarray) -> None:
        """Rank 0 of a pipeline: take the hidden state of an issued step it will not finish
        (a prefill interrupted with chunks in flight), so the next read is the next step's.
        The followers' state of that step is freed when its handle goes."""
        try:
            self.link.recv((len(ids), self.cfg.hc_count, self.cfg.n_embd), mx.float32, self.link.left,
                           self._deadline(len(ids)), "receiving the hidden state")
        except GroupError:
            raise
        except BaseException as e:
            raise self.link.fail(f"rank 0 stopped while ending a prefill ({type(e).__name__}); the group is "
                                 "stopped") from e

    def _deadline(self, n: int) -> float:
        """How long a hidden state of ``n`` tokens may take to come (or to be taken): the
        stages before compute it first, and in a pipelined prefill the receiver may still be
        busy with the chunk before."""
        return self.link.timeout * (1 + n / 64)

    def for_snapshot(self, state: ModelState) -> ModelState:
        """The whole state on rank 0: a pipeline gathers the other stages' layers (as their
        payload sections, so the bytes are exactly what each process holds)."""
        if self.plan.split == "experts":
            return state
        n = state.n_tokens
        self._command(SNAPSHOT, self._src(state), 0, n_tokens=n)
        before = range(0, self.plan.stages[-1][0])  # the followers' layers, stage 0 first
        blob = self._recv_bytes(sum(layer_nbytes(self.cfg, i, n) for i in before), "collecting the snapshot")
        out = state.fork()
        pos = 0
        for i in before:
            size = layer_nbytes(self.cfg, i, n)
            out.layers[i] = layer_from_bytes(self.cfg, i, n, blob[pos : pos + size])
            pos += size
        return out

    def from_snapshot(self, state: ModelState) -> ModelState:
        """Hand a whole state (a loaded snapshot) to the followers; returns rank 0's share."""
        n = state.n_tokens
        layers = range(self.cfg.n_layer) if self.plan.split == "experts" else range(0, self.plan.stages[-1][0])
        state.use(mx)
        blob = b"".join(layer_bytes(self.cfg, state.layers[i], n) for i in layers)
        dst = self._new()
        self._command(RESTORE, 0, dst.id, n_tokens=n, data=np.frombuffer(blob, dtype=np.uint8))
        mine = ModelState([st if i in self.plan.layers else None for i, st in enumerate(state.layers)], n,
                          state.xp, dst)
        return mine

    def close(self) -> None:
        """Tell the followers to exit (rank 0); later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        if self.rank == 0 and self.link.broken is None:
            try:
                self._command(QUIT, 0, 0)
            except GroupError:
                pass
        self.link.close()

    # -- commands -------------------------------------------------------------------------------
    def _new(self) -> _Handle:
        h = _Handle(self._next, self._dropped)
        self._next += 1
        return h

    @staticmethod
    def _src(state: ModelState) -> int:
        return 0 if state.remote is None else state.remote.id

    def _command(self, op: int, src: int, dst: int, flags: int = 0, n_tokens: int = 0,
                 data: np.ndarray | None = None) -> None:
        """Rank 0: send a command to rank 1 (which passes it on), with the states to forget."""
        drop = np.array(self._dropped, dtype=np.int64)
        del self._dropped[: len(drop)]
        data = np.zeros(0, np.uint8) if data is None else data
        hdr = np.array([op, src, dst, data.size, drop.size, flags, n_tokens, 0], dtype=np.int64)
        t = self.link.timeout
        self.link.send(hdr, 1, t, "sending a command")
        if drop.size:
            self.link.send(drop, 1, t, "sending a command")
        if data.size:
            self.link.send(data, 1, t, "sending a command")

    def _recv_bytes(self, n: int, what: str) -> memoryview:
        if not n:
            return memoryview(b"")
        a = self.link.recv((n,), mx.uint8, self.link.left, self.link.timeout, what)
        return memoryview(a.tobytes())

    def follow(self) -> None:
        """A follower's life: read commands from the left, pass them on, do this rank's part."""
        link, last = self.link, self.rank + 1 == self.size
        while True:
            hdr = link.recv((HEADER,), mx.int64, link.left, None, "waiting for a command")  # idle: no deadline
            op, src, dst, count, ndrop, flags, n_tokens, _ = (int(v) for v in hdr)
            t = link.timeout
            drop = link.recv((ndrop,), mx.int64, link.left, t) if ndrop else np.zeros(0, np.int64)
            dtype = mx.int32 if op == STEP else mx.uint8
            data = link.recv((count,), dtype, link.left, t) if count else np.zeros(0, np.int32)
            if not last:
                link.send(hdr, link.right, t, "passing a command on")
                if ndrop:
                    link.send(drop, link.right, t, "passing a command on")
                if count:
                    link.send(data, link.right, t, "passing a command on")
            for d in drop:
                self.states.pop(int(d), None)
            if op == QUIT:
                return
            if op == STEP:
                state = self.states[src].fork()
                self._step(data.astype(np.int64), state, bool(flags))
                self.states[dst] = state
            elif op == SNAPSHOT:
                self._give_snapshot(self.states[src], n_tokens)
            elif op == RESTORE:
                self.states[dst] = self._take_restore(data, n_tokens)
            else:
                raise link.fail(f"unknown command {op} from rank 0 (different ds4agent versions?)")

    # -- one step, this rank's part -----------------------------------------------------------
    def _step(self, ids: np.ndarray, state: ModelState, all_logits: bool):
        m, plan = self.model, self.plan
        if plan.split == "experts":  # every rank runs every layer on its share; sums inside
            return m.forward(ids, state, all_logits)
        link, T = self.link, len(ids)
        stage = plan.stage
        if stage == 0:
            X = m.embed(ids)
        else:
            shape = (T, self.cfg.hc_count, self.cfg.n_embd)
            X = link.recv(shape, mx.float32, link.left, self._deadline(T), "receiving the hidden state",
                          numpy=m.xp is not mx)
        X = m.layers(X, ids, state, range(self.lo, self.hi))
        m.advance(state, T)
        if stage == plan.size - 1:
            return m.head(X, all_logits)
        link.send(X, link.right, self._deadline(T), "handing on the hidden state")
        return None

    def _give_snapshot(self, state: ModelState, n: int) -> None:
        link, plan = self.link, self.plan
        if plan.split == "experts":
            return  # rank 0 holds the whole state
        cfg = self.cfg
        state.use(mx)
        before = range(0, self.lo)
        got = bytes(self._recv_bytes(sum(layer_nbytes(cfg, i, n) for i in before), "collecting the snapshot"))
        mine = b"".join(layer_bytes(cfg, state.layers[i], n) for i in range(self.lo, self.hi))
        link.send(np.frombuffer(got + mine, dtype=np.uint8), link.right, link.timeout, "sending the snapshot")

    def _take_restore(self, data: np.ndarray, n: int) -> ModelState:
        cfg = self.cfg
        state = ModelState.empty(cfg, held=self.plan.layers)
        buf = memoryview(np.ascontiguousarray(data, dtype=np.uint8).tobytes())
        pos = 0
        for i in range(0, self.plan.layers.stop):
            size = layer_nbytes(cfg, i, n)
            if i in self.plan.layers:
                state.layers[i] = layer_from_bytes(cfg, i, n, buf[pos : pos + size])
            pos += size
        state.n_tokens = n
        return state


class DistributedSession(Session):
    """A Session on rank 0 whose state is spread over the group (the model's for_snapshot and
    from_snapshot gather and hand out the other processes' layers) and whose pipelined prefill
    keeps a chunk per stage in flight."""

    def _prefill(self, todo: list[int], progress: Progress | None) -> None:
        """A pipeline keeps up to one chunk per stage in flight: while rank 0 runs the last
        stage of chunk k, the stage before runs chunk k + 1, and so on up the ring. The
        commands go out ahead (every process takes them in order, so nothing else changes);
        each chunk still commits on its own, in order. Interrupted between chunks (``progress``
        raised), the chunks already in flight are received and dropped: the session holds the
        chunks committed so far, as in one process."""
        dist = self._model
        c = self.prefill_chunk
        chunks = [np.asarray(todo[off : off + c], dtype=np.int64) for off in range(0, len(todo), c)]
        window = dist.pipeline_window
        if dist.plan.split != "pipeline" or window < 2 or len(chunks) < 2:
            return super()._prefill(todo, progress)
        flight: deque[tuple[np.ndarray, _Handle]] = deque()
        src, n = self._live.state.remote, self._live.n
        issued = 0
        try:
            for k, ids in enumerate(chunks):
                while issued < len(chunks) and issued < k + window:
                    src = dist.issue(chunks[issued], src, n)
                    n += len(chunks[issued])
                    flight.append((chunks[issued], src))
                    issued += 1
                    dist.most_in_flight = max(dist.most_in_flight, len(flight))
                state = self._live.state.fork()
                _, dst = flight.popleft()
                self._commit(ids, state, dist.finish(ids, state, dst))
                if progress:
                    progress(min((k + 1) * c, len(todo)), len(todo))
        except GroupError:
            raise
        except BaseException:
            for ids, _ in flight:
                dist.discard(ids)
            raise


# -- opening ------------------------------------------------------------------------------------

def _describe(engine_info: "EngineInfo", split: str) -> bytes:
    info = {"host": socket.gethostname(), "version": __version__, "fingerprint": engine_info.fingerprint,
            "path": str(engine_info.path), "split": split, "layers": engine_info.config.n_layer}
    raw = json.dumps(info).encode()[:INFO_BYTES]
    return raw + b" " * (INFO_BYTES - len(raw))


def _check_group(infos: list[dict], names: list[str]) -> None:
    """The same ds4agent, the same model file and the same split everywhere, or one message
    naming the first process that differs."""
    ref = infos[0]
    for r, info in enumerate(infos[1:], 1):
        who = f"rank {r} ({names[r]})"
        if info.get("version") != ref.get("version"):
            raise GroupError(f"{who} runs ds4agent {info.get('version')}, rank 0 ({names[0]}) runs "
                             f"{ref.get('version')}: install the same version everywhere")
        if info.get("fingerprint") != ref.get("fingerprint"):
            raise GroupError(f"{who} has a different model file ({info.get('path')}, fingerprint "
                             f"{info.get('fingerprint'):08x}; rank 0 has {ref.get('path')}, "
                             f"{ref.get('fingerprint'):08x}): copy the same file to every host")
        if info.get("split") != ref.get("split"):
            raise GroupError(f"{who} was started with --split {info.get('split')}, rank 0 with {ref.get('split')}")


def open_engine(path, split: str, backend: str = "auto", ctx: int = 32768, kernels: str | None = None,
                group=None, timeout: float | None = None, alive=lambda: None) -> "Engine":
    """Join the group this process was launched into and open the model as its share of
    ``split`` ("pipeline" or "experts"). Rank 0 gets an Engine whose sessions span the group;
    another rank gets one to call ``follow`` on. Problems are GroupError/EngineError, one line."""
    from ..engine import Engine, EngineError, open_parts

    if split not in splits.SPLITS:
        raise EngineError(f"unknown split {split!r} (choose from {', '.join(splits.SPLITS)})")
    if group is None:
        try:
            group = init(backend_setting(), JOIN_TIMEOUT, alive)
        except GroupError as e:
            raise EngineError(str(e)) from None
    rank, size = group.rank(), group.size()
    global _FILTER
    if _FILTER is None and os.environ.get("DS4_DIST_VERBOSE") != "1":
        _FILTER = StderrFilter()  # MLX's ring backend says a closed socket ten times; we say it once
        atexit.register(_FILTER.close)  # everything written to stderr reaches it before exit
    # Names are what the user wrote in the hostfile where we know it, else this host's name.
    report = None if _FILTER is None else (lambda msg: _FILTER.write(f"ds4: error: {msg}\n"))
    link = Link(group, [f"rank {r}" for r in range(size)], timeout, report)
    try:
        parts = open_parts(path, backend=backend, ctx=ctx, kernels=kernels)
    except Exception as e:  # noqa: BLE001 - the others must hear about it, not hang at the handshake
        link.fail(f"rank {rank} ({socket.gethostname()}) could not open the model: {e}", say=True)
        link.close()
        raise
    try:
        mine = np.frombuffer(_describe(parts.info, split), dtype=np.uint8)
        rows = link.all_gather(mine, JOIN_TIMEOUT, "comparing the processes")
        infos = [json.loads(bytes(r).decode().strip() or "{}") for r in rows]
        names = [i.get("host", "?") for i in infos]
        link.names = names
        _check_group(infos, names)
        f = parts.file
        shared_block = splits.block_width(f.tensors["blk.0.ffn_down_shexp.weight"].type)
        out_block = splits.block_width(f.tensors["blk.0.attn_output_b.weight"].type)
        if parts.info.config.o_lora_rank % out_block:
            raise GroupError(f"attn_output_b's blocks of {out_block} do not divide its groups; use --split pipeline")
        sizes = {name: t.nbytes for name, t in f.tensors.items()}
        plan = splits.plan(parts.info.config, sizes, split, size, rank, shared_block)
    except (GroupError, splits.SplitError) as e:
        parts.file.close()
        link.close()
        raise EngineError(str(e)) from None
    except Exception:
        parts.file.close()
        link.close()
        raise
    base: Model = parts.model
    if split == "experts":
        part = Part(plan.groups, plan.shared, plan.experts, plan.vocab,
                    lambda a: link.all_sum(a, link.timeout, "summing a layer's outputs"),
                    _gatherer(link, plan, parts.info.config.n_vocab))
        base = Model(base.w, base.opt, base.k, part)
    dist = Distributed(base, link, plan)
    if rank == 0:
        atexit.register(dist.close)  # an exit without close still lets the followers go quietly
    # this process's Engine: its share of the model in the group, the group told on close
    return Engine(replace(parts, model=dist, session_class=DistributedSession, on_close=dist.close))


def _gatherer(link: Link, plan: splits.Plan, vocab: int):
    """The output head's rows of every rank, side by side: all_gather needs one shape, so
    each share is padded to the largest and cut after."""
    shares = [splits.even(vocab, plan.size, r) for r in range(plan.size)]
    width = max(hi - lo for lo, hi in shares)

    def gather(a):
        xp = np if isinstance(a, np.ndarray) else mx
        pad = width - a.shape[-1]
        if pad:
            a = xp.concatenate([a, xp.zeros((*a.shape[:-1], pad), dtype=xp.float32)], axis=-1)
        rows = link.all_gather(a, link.timeout, "gathering the logits")  # (size, T, width)
        return xp.concatenate([rows[r][..., : hi - lo] for r, (lo, hi) in enumerate(shares)], axis=-1)

    return gather


def follow(engine: "Engine") -> int:
    """Run a follower until rank 0 closes the group; the exit status for the process."""
    dist = engine.model
    if not isinstance(dist, Distributed):
        raise TypeError("follow() needs an Engine from open_engine")
    try:
        dist.follow()
    except GroupError:
        return 1  # the link printed the one message
    except Exception as e:  # noqa: BLE001 - any failure here must stop the group, not hang it
        dist.link.fail(f"rank {dist.rank} ({socket.gethostname()}) failed: {e}", say=True)
        return 1
    finally:
        dist.closed = True
        dist.link.close()
        engine.close()
    return 0


__all__ = ["open_engine", "follow", "launched", "Distributed", "DistributedSession", "GroupError", "StderrFilter"]
