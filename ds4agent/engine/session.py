"""A conversation's live KV state: prefill what extends it, decode, generate.

`sync(ids)` is the only way prompts enter: when the live tokens are a prefix of ``ids`` only the
suffix is evaluated (chat turns and agent steps append, so each turn costs its own length);
anything else resets and prefills from scratch. Prefill runs in chunks; chunk boundaries do not
change the mathematics (the model reproduces token-by-token semantics inside a batch).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from .drafts import Pace
from .errors import ContextFullError
from .sampler import Sampler, SamplingParams
from .state import ModelState, payload_size, read_payload, write_payload

if TYPE_CHECKING:
    from ..modelfile.tokenizer import Tokenizer
    from .batch import Batcher
    from .drafts import Drafter
    from .info import EngineInfo
    from .model import Model
    from .steering import Steering

Progress = Callable[[int, int], None]  # (tokens done, tokens to do)


def batches(model: object) -> bool:
    """Whether ``model`` advances several sessions in one pass (Model without a distributed
    part; the Ascend module and a distributed group run one session at a time)."""
    return hasattr(model, "forward_batch") and getattr(model, "part", None) is None


@dataclass(frozen=True)
class Step:
    token: int
    index: int  # 0-based count of generated tokens
    seconds: float  # time spent producing this token: decoding the previous one, then sampling
    finish: str | None = None  # "eos", "length", "context" on the last step


@dataclass
class PrefillStats:
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class _Live:
    """Everything a session holds, bound to one attribute so that it changes in one store.

    A step builds a new record and commits it last; an exception raised anywhere inside the
    step (a KeyboardInterrupt included) leaves the previous record, so the token list and the
    KV state never disagree. ``tokens`` is a list shared by successive records of one session
    and only ever grown at its end: a record owns ``tokens[:n]``, and entries beyond the live
    record's n are leftovers of a step that did not commit."""

    state: ModelState
    tokens: list[int]
    n: int
    logits: np.ndarray | None


class Checkpoint:
    """An opaque, O(1) capture of a session's state (see Session.checkpoint)."""

    __slots__ = ("_live", "_ctx")

    def __init__(self, live: _Live, ctx: int) -> None:
        self._live, self._ctx = live, ctx


class Session:
    # Tokens evaluated per forward pass of a prefill (each commits on its own). 256 suits the
    # CPU kernels, which are compute-bound; kernels may ask for another (``prefill_chunk`` on
    # the kernel object): on a GPU a chunk reads nearly every routed expert once, whatever its
    # size, so larger chunks spread that read over more tokens (bench/gpu_model.py).
    prefill_chunk = 256

    def __init__(self, model: "Model", tokenizer: "Tokenizer", info: "EngineInfo", ctx: int) -> None:
        """Made by Engine.session(ctx): the model to run, the tokenizer (its end-of-sentence id
        ends generation; the session store decodes the tokens with it) and the engine's info
        (what a saved session must match)."""
        if ctx < 2:
            raise ValueError(f"context size must be at least 2 tokens, got {ctx}")
        self._model = model
        self.tokenizer = tokenizer
        self.info = info
        self._ctx = ctx
        self.prefill_chunk = getattr(getattr(model, "k", None), "prefill_chunk", Session.prefill_chunk)
        self.pace = Pace()  # whether verification passes pay here (engine/drafts.py)
        self.last_prefill = PrefillStats()
        self.reset()

    @property
    def ctx(self) -> int:
        """The context size, fixed for the session's life (a snapshot records it)."""
        return self._ctx

    def payload_size(self, n_tokens: int) -> int:
        """Bytes of this model's snapshot after ``n_tokens`` (what a saved payload must hold)."""
        return payload_size(self._model.cfg, n_tokens)

    def reset(self) -> None:
        self._live = _Live(self._model.empty_state(), [], 0, None)

    @property
    def tokens(self) -> list[int]:
        live = self._live
        return live.tokens[: live.n]

    @property
    def n_tokens(self) -> int:
        return self._live.n

    @property
    def logits(self) -> np.ndarray:
        """Next-token logits (float32, vocabulary-sized, read-only) after the last token."""
        logits = self._live.logits
        if logits is None:
            raise RuntimeError("no logits yet: sync or eval a token first")
        return logits

    def top_logprobs(self, k: int) -> list[tuple[int, float, float]]:
        """The ``k`` most likely next tokens as (id, logit, log-probability), most likely first
        (ties: the lower id), computed in float64 (the --dump-logprobs layout)."""
        logits = self.logits.astype(np.float64)
        m = logits.max()
        logz = m + math.log(np.exp(logits - m).sum())
        top = np.argsort(-logits, kind="stable")[:k]
        return [(int(t), float(logits[t]), float(logits[t] - logz)) for t in top]

    def checkpoint(self) -> Checkpoint:
        """Capture the live state without copying it (arrays are shared, never written), so
        that ``rollback`` can return to it: undoing an interrupted turn, or a failed load,
        costs nothing and needs no prefill."""
        return Checkpoint(self._live, self.ctx)

    def rollback(self, cp: Checkpoint) -> None:
        """Return to a checkpoint of this session. Later checkpoints stay valid (the token
        list is copied here, so steps after the rollback never write into theirs)."""
        if cp._ctx != self.ctx:
            raise ValueError("checkpoint was taken with another context size")
        live = cp._live
        self._live = _Live(live.state, live.tokens[: live.n], live.n, live.logits)

    # Where this session's forward passes run: here (None), or through a Batcher
    # (engine/batch.py) that runs several sessions' decode steps as one pass.
    batcher: "Batcher | None" = None

    # The engine's duty-cycle cap (engine/power.py), shared by its sessions; None: none.
    power: Any = None

    def _run(self, ids: Sequence[int]) -> None:
        t = time.perf_counter()
        if self.batcher is not None:
            self.batcher.run(self, ids)
        else:
            self.advance(ids)
        if self.power is not None:
            self.power.after(time.perf_counter() - t, len(ids))

    def advance(self, ids: Sequence[int]) -> None:
        """Evaluate ``ids`` after the live tokens, on this thread, and commit (one chunk; no
        context check: sync and eval make it)."""
        state = self._live.state.fork()
        p0 = self._live.n
        if self._wants_hidden():
            logits, X = self._model.forward(np.asarray(ids, dtype=np.int64), state, hidden=True, **self._steer())
            self._commit(ids, state, logits)
            self.drafter.seen(p0, X)
        else:
            self._commit(ids, state, self._model.forward(np.asarray(ids, dtype=np.int64), state, **self._steer()))

    # Directional steering of this session's passes (engine/steering.py); None: none.
    steering: "Steering | None" = None

    def set_steering(self, steering: "Steering | None") -> None:
        """Steer this session's passes from now on (None: stop); the tokens already evaluated
        keep the KV they were evaluated with. ValueError for a model that cannot steer (the
        Ascend module, a distributed group)."""
        if steering is not None and steering.active and not batches(self._model):
            raise ValueError("directional steering runs with the MLX engine of one process")
        self.steering = steering

    def _steer(self) -> dict:
        """The steering keyword of a forward pass (nothing when none is in force, so models
        that cannot steer are called as before)."""
        st = self.steering
        return {"steer": st} if st is not None and st.active else {}

    def _wants_hidden(self) -> bool:
        """Whether the drafter drafts from the target's last-layer streams (an MTP block)."""
        return getattr(self.drafter, "needs_hidden", False) and batches(self._model)

    @staticmethod
    def advance_together(sessions: Sequence["Session"], tokens: Sequence[int]) -> None:
        """One token for each of several distinct sessions of one engine in a single forward
        pass (Model.forward_batch); each commits as ``advance([token])`` alone would, to the
        same bits (docs/batching.md). Models that run one session at a time (the Ascend
        module, a distributed group) advance them one after another."""
        if not sessions:
            return
        model = sessions[0]._model
        if any(s._model is not model for s in sessions) or len({id(s) for s in sessions}) != len(sessions):
            raise ValueError("a batch takes distinct sessions of one engine")
        if len(sessions) == 1 or not batches(model):
            for s, t in zip(sessions, tokens):
                s.advance([t])
            return
        states = [s._live.state.fork() for s in sessions]
        steers = [s._steer().get("steer") for s in sessions]
        more = {"steers": steers} if any(st is not None for st in steers) else {}
        out = np.asarray(model.forward_batch(np.asarray(tokens, dtype=np.int64), states, **more))
        for b, (s, t) in enumerate(zip(sessions, tokens)):
            s._commit([int(t)], states[b], out[b])

    def _commit(self, ids: Sequence[int], state: ModelState, out) -> None:
        """Make ``state`` (the live state forked, then advanced by ``ids``) the live one."""
        live = self._live
        logits = np.array(out, dtype=np.float32)
        logits.setflags(write=False)
        tokens = live.tokens
        del tokens[live.n :]  # leftovers of a step that raised before its commit
        tokens.extend(int(i) for i in ids)
        self._live = _Live(state, tokens, live.n + len(ids), logits)  # the commit: one store

    def sync(self, ids: Sequence[int], progress: Progress | None = None) -> int:
        """Make the live tokens equal ``ids``; returns how many tokens were evaluated.

        Each chunk commits on its own: interrupted between chunks, the session holds a prefix
        of ``ids`` (a consistent state that the next sync extends)."""
        ids = [int(i) for i in ids]
        if len(ids) >= self.ctx:
            raise ContextFullError(f"prompt of {len(ids)} tokens does not fit a context of {self.ctx}")
        vocab = self._model.cfg.n_vocab
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError("token id out of the vocabulary range")
        live = self._live
        n = live.n
        if n > len(ids) or ids[:n] != live.tokens[:n]:
            self.reset()
            n = 0
        todo = ids[n:]
        start = time.perf_counter()
        self._prefill(todo, progress)
        if todo:
            self.last_prefill = PrefillStats(len(todo), time.perf_counter() - start)
        return len(todo)

    def _prefill(self, todo: list[int], progress: Progress | None) -> None:
        """Evaluate ``todo`` after the live tokens, one committed chunk at a time."""
        for off in range(0, len(todo), self.prefill_chunk):
            self._run(todo[off : off + self.prefill_chunk])
            if progress:
                progress(min(off + self.prefill_chunk, len(todo)), len(todo))

    def snapshot(self) -> bytes:
        """The live state as a DSV4 session payload (docs/model.md §6.1). The model hands over
        its whole state as host arrays first (for_snapshot: its devices' tensors brought home,
        a distributed group's layers gathered), so every backend writes the same bytes."""
        live = self._live
        if live.logits is None:
            raise RuntimeError("nothing to snapshot: the session holds no tokens")
        state = self._model.for_snapshot(live.state)
        return write_payload(self._model.cfg, self.ctx, state, live.tokens[: live.n], live.logits)

    def restore(self, blob: bytes | memoryview) -> None:
        """Replace the live state by a snapshot; runs no model evaluation. On any mismatch
        (PayloadError) the session is left as it was. The model places the whole state in its
        own layout (from_snapshot: a distributed group hands the other processes theirs)."""
        state, tokens, logits = read_payload(self._model.cfg, self.ctx, blob, f16_rows=self._model.opt.qat_sim)
        logits.setflags(write=False)
        mine = self._model.from_snapshot(state)  # a PayloadError above leaves everything as it was
        self._live = _Live(mine, tokens, len(tokens), logits)

    def activations(self, ids: Sequence[int], last_only: bool = False) -> dict[str, np.ndarray]:
        """Each layer's attention and FFN outputs (as steered by this session's steering) and
        hidden streams for tokens ``ids`` evaluated from an empty state, without touching the
        live state: {"attn": (n_layer, T, E), "ffn": (n_layer, T, E), "hidden": (n_layer, T, hc, E)}
        (T = 1 with ``last_only``: the last token's rows). Runs in prefill chunks, where this
        session's passes run."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("no tokens to evaluate")
        if not batches(self._model):
            raise ValueError("activations are captured on the MLX engine of one process")

        def run() -> dict[str, np.ndarray]:
            state = self._model.empty_state()
            parts: dict[str, list] = {}
            for off in range(0, len(ids), self.prefill_chunk):
                chunk = ids[off : off + self.prefill_chunk]
                if last_only and off + len(chunk) < len(ids):
                    self._model.forward(np.asarray(chunk, dtype=np.int64), state, **self._steer())
                    continue
                cap: dict = {}
                self._model.forward(np.asarray(chunk, dtype=np.int64), state, capture=cap, **self._steer())
                for k, layers in cap.items():
                    rows = [np.array(a, dtype=np.float32)[-1:] if last_only else np.array(a, dtype=np.float32)
                            for a in layers]
                    parts.setdefault(k, []).append(np.stack(rows))
            return {k: np.concatenate(v, axis=1) for k, v in parts.items()}

        return self._on_engine(run)

    def eval(self, token: int) -> None:
        if self._live.n + 1 >= self.ctx:
            raise ContextFullError(f"context of {self.ctx} tokens is full")
        self._run([int(token)])

    # Proposes tokens to verify in one pass (engine/drafts.py; None: one token per pass).
    drafter: "Drafter | None" = None

    def generate(self, params: SamplingParams = SamplingParams(), max_tokens: int = 50000,
                 stop_at_eos: bool = True) -> Iterator[Step]:
        """Sample from the current logits, yield the token, evaluate it, repeat.

        Stops after EOS (which is yielded but not evaluated: a transcript appends it, and the next
        sync prefills it), after ``max_tokens``, or when the context has one slot left. With a
        ``drafter`` (a model of one process; under a batcher only while no other session
        generates) the tokens it proposes after each sampled one are verified in the same pass
        (``speculate``): the same tokens under greedy decoding, the same distribution under
        sampling, and the same saved session, in fewer passes; proposals pause while passes
        measure slower per token than plain steps (``pace``)."""
        with self.batcher.decoding(self) if self.batcher is not None else contextlib.nullcontext():
            yield from self._generate(params, max_tokens, stop_at_eos)

    def _generate(self, params: SamplingParams, max_tokens: int, stop_at_eos: bool) -> Iterator[Step]:
        sampler = Sampler(params)
        eos = self.tokenizer.eos_id
        # (a model that runs one position per pass exactly only (the Ascend module, a group)
        # does not verify proposals; a batcher's session does only while no other generates:
        # otherwise their steps batch instead)
        drafter = self.drafter if batches(self._model) else None
        t = time.perf_counter()
        index, pending = 0, None
        while index < max_tokens:
            token = sampler(self.logits) if pending is None else pending
            pending = None
            now = time.perf_counter()
            finish = None
            if stop_at_eos and token == eos:
                finish = "eos"
            elif index + 1 == max_tokens:
                finish = "length"
            elif self._live.n + 2 >= self.ctx:
                finish = "context"
            yield Step(token, index, now - t, finish)
            if finish:
                return
            t = time.perf_counter()  # the consumer's time between steps is not ours
            # Proposed tokens become steps only where a plain step would not have finished (and
            # then not been evaluated): before the token limit, the context's end, an EOS.
            room = min(max_tokens - 2 - index, self.ctx - 3 - self._live.n)
            live = self._live
            narrow = self.batcher is None or self.batcher.alone(self)
            timed = drafter is not None and narrow
            asked = timed and room > 0 and self.pace.allow()
            drafts = self._propose(drafter, live, token, room) if asked else []
            if eos in drafts:
                drafts = drafts[: drafts.index(eos)]
            if not drafts:
                self.eval(token)
                if timed:
                    self.pace.step(time.perf_counter() - t)
                index += 1
                continue
            kept, pending = self.speculate(token, drafts[:room], sampler)
            drafter.feedback(len(drafts[:room]), len(kept))
            self.pace.verified(time.perf_counter() - t, len(kept) + 1)
            index += 1
            spent = (time.perf_counter() - t) / (len(kept) + 1)
            for d in kept:
                yield Step(d, index, spent)
                index += 1
            t = time.perf_counter() - (spent if pending is not None else 0.0)

    def _propose(self, drafter: "Drafter", live: _Live, token: int, room: int) -> list[int]:
        """The drafter's proposal after ``token``; one that runs a model (an MTP block) runs
        where this session's passes run."""
        if getattr(drafter, "needs_hidden", False):
            return self._on_engine(lambda: drafter.propose(live.tokens, live.n, token, room))
        return drafter.propose(live.tokens, live.n, token, room)

    def speculate(self, token: int, drafts: Sequence[int], sampler: Sampler) -> tuple[list[int], int | None]:
        """Evaluate ``token`` and the ``drafts`` proposed after it in one pass, and keep the
        drafts the model agrees with (Sampler.check, position by position): returns (the drafts
        kept, the token sampled in place of the first rejected one, or None when all were
        kept). The session ends exactly as if ``token`` and the kept drafts had been evaluated
        one by one: the pass computes each position to the bits of a step alone
        (Model.forward's ``alone``), and when a draft was rejected the state is cut back to
        the kept ones from the rows the pass left (Model.cut), so the rejected ones leave no
        trace."""
        ids = [int(token), *(int(d) for d in drafts)]
        if self._live.n + len(ids) >= self.ctx:
            raise ContextFullError(f"context of {self.ctx} tokens is full")
        live = self._live
        hidden = self._wants_hidden()

        def verify() -> tuple[ModelState, np.ndarray, Any, list]:
            state = live.state.fork()
            trail: list = []
            out = self._model.forward(np.asarray(ids, dtype=np.int64), state, all_logits=True, alone=True,
                                      hidden=hidden, trail=trail, **self._steer())
            out, X = out if hidden else (out, None)
            return state, np.asarray(out, dtype=np.float32), X, trail

        t = time.perf_counter()
        state, logits, X, trail = self._on_engine(verify)
        if self.power is not None:
            self.power.after(time.perf_counter() - t, len(ids))
        kept: list[int] = []
        instead = None
        for i, d in enumerate(ids[1:]):
            instead = sampler.check(logits[i], d)
            if instead is not None:
                break
            kept.append(d)
        done = ids[: len(kept) + 1]
        if instead is not None:
            # The state after the kept tokens only, from the pass's own rows (Model.cut): the
            # bits of the kept tokens evaluated alone; their logits are the pass's.
            state = self._on_engine(lambda: self._model.cut(live.state, trail, len(done)))
        self._commit(done, state, logits[len(done) - 1])
        if hidden:  # (where the passes run: the drafter may join MLX arrays)
            self._on_engine(lambda: self.drafter.seen(live.n, X[: len(done)]))
        return kept, instead

    def _on_engine(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` where this session's passes run: here, or on its batcher's thread."""
        return fn() if self.batcher is None else self.batcher.call(fn)
