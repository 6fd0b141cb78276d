"""Several sessions' forward passes on one thread, their decode steps as one batched pass
(docs/batching.md).

A session given a ``Batcher`` (Session.batcher) hands every forward pass to it instead of
running it: ``run`` blocks the calling thread (one per session: a server slot) until the
batcher's thread has run it. The batcher gathers the single tokens that sessions in a
generation loop post for their next step and runs them together (Session.advance_together:
dense weights and shared experts read once for all, routed experts grouped by expert, each
session's attention over its own KV), and runs a prefill chunk between two decode steps, so a
long prompt delays the others by one chunk at a time and never stalls them for its whole
length. Each session's results are the bits it gets running alone.

Who is decoding: a session inside ``decoding(session)`` is expected to post its next token
soon (it is sampling, or its consumer is reading the last one); a step waits at most
``wait_s`` for all of them before it runs with those that have posted. A session outside it
is never waited for. All passes run on the batcher's thread, in order: MLX and the kernels see
one thread, as they do without a batcher.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence


class Advancing(Protocol):
    """What the batcher asks of a session (engine/session.py Session)."""

    def advance(self, ids: Sequence[int]) -> None: ...

    @staticmethod
    def advance_together(sessions: Sequence["Advancing"], tokens: Sequence[int]) -> None: ...


@dataclass
class _Ask:
    session: "Advancing | None"
    ids: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    call: Callable[[], Any] | None = None  # instead of ids: a function to run on the thread
    result: Any = None

    @property
    def single(self) -> bool:
        return self.call is None and len(self.ids) == 1


@dataclass
class BatchStats:
    steps: int = 0  # decode passes run
    tokens: int = 0  # tokens they advanced (the batch sizes summed)
    widest: int = 0  # the largest batch
    chunks: int = 0  # prefill chunks run
    waited_s: float = 0.0  # time steps waited for sessions still sampling

    def as_dict(self) -> dict[str, float]:
        return {"steps": self.steps, "tokens": self.tokens, "widest": self.widest, "chunks": self.chunks,
                "mean_batch": round(self.tokens / self.steps, 2) if self.steps else 0.0,
                "waited_s": round(self.waited_s, 3)}


class Batcher:
    """Runs sessions' forward passes on its own thread (see the module's docstring)."""

    def __init__(self, wait_s: float = 0.005) -> None:
        self.wait_s = wait_s
        self.stats = BatchStats()
        self._cv = threading.Condition()
        self._asks: list[_Ask] = []  # in arrival order
        self._decoding: dict[int, int] = {}  # id(session) -> nesting count of decoding()
        self._closing = False
        self._prefill_next = False  # alternate: a decode step, then a prefill chunk
        self._thread = threading.Thread(target=self._loop, name="ds4-batch", daemon=True)
        self._thread.start()

    # -- what sessions call --------------------------------------------------------------------
    def run(self, session: "Advancing", ids: Sequence[int]) -> None:
        """Evaluate ``ids`` after ``session``'s live tokens (Session.advance), on the batcher's
        thread; returns when it is committed, raises what it raised."""
        self._wait(_Ask(session, [int(i) for i in ids]))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the batcher's thread between two passes (a session's verification
        of proposed tokens: engine/session.py speculate) and return what it returned."""
        return self._wait(_Ask(None, [], call=fn)).result

    def _wait(self, ask: _Ask) -> _Ask:
        """Queue ``ask`` and block until the thread has run it; raises what it raised."""
        with self._cv:
            if self._closing:
                raise RuntimeError("the batcher is closed")
            self._asks.append(ask)
            self._cv.notify_all()
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        return ask

    def alone(self, session: "Advancing") -> bool:
        """Whether ``session`` is the only one generating (its steps would be a batch of one:
        it may as well verify proposed tokens)."""
        with self._cv:
            return all(k == id(session) for k in self._decoding)

    @contextmanager
    def decoding(self, session: "Advancing") -> Iterator[None]:
        """While inside, ``session`` is generating: steps wait (briefly) for its next token."""
        key = id(session)
        with self._cv:
            self._decoding[key] = self._decoding.get(key, 0) + 1
        try:
            yield
        finally:
            with self._cv:
                self._decoding[key] -= 1
                if not self._decoding[key]:
                    del self._decoding[key]
                self._cv.notify_all()

    def close(self) -> None:
        """Finish what was asked, then stop the thread; later asks raise."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()

    # -- the thread ----------------------------------------------------------------------------
    def _next(self) -> list[_Ask] | None:
        """The next pass to run (several single tokens, or one chunk), or None to stop. Waits
        (under the lock) for asks, and up to wait_s for decoding sessions that have not posted."""
        first_decode = None
        while True:
            if not self._asks:
                if self._closing:
                    return None
                first_decode = None
                self._cv.wait()
                continue
            single = [a for a in self._asks if a.single]
            chunks = [a for a in self._asks if not a.single]  # prefill chunks and calls: alone
            if chunks and (not single or self._prefill_next):
                self._prefill_next = False
                self._asks.remove(chunks[0])
                return [chunks[0]]
            posted = {id(a.session) for a in self._asks if a.session is not None}
            missing = [k for k in self._decoding if k not in posted]
            now = time.perf_counter()
            first_decode = first_decode or now
            left = self.wait_s - (now - first_decode)
            if missing and left > 0 and not self._closing:
                self._cv.wait(left)
                continue
            self.stats.waited_s += now - first_decode
            self._prefill_next = bool(chunks)
            for a in single:
                self._asks.remove(a)
            return single

    def _loop(self) -> None:
        while True:
            with self._cv:
                asks = self._next()
            if asks is None:
                return
            try:
                if asks[0].call is not None:
                    asks[0].result = asks[0].call()
                elif len(asks[0].ids) > 1:
                    self.stats.chunks += 1
                    asks[0].session.advance(asks[0].ids)
                else:
                    self.stats.steps += 1
                    self.stats.tokens += len(asks)
                    self.stats.widest = max(self.stats.widest, len(asks))
                    asks[0].session.advance_together([a.session for a in asks], [a.ids[0] for a in asks])
            except BaseException as e:  # handed to every caller of this pass: no session committed
                for a in asks:
                    a.error = e
            for a in asks:
                a.done.set()
