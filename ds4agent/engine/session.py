"""A conversation's live KV state: prefill what extends it, decode, generate.

`sync(ids)` is the only way prompts enter: when the live tokens are a prefix of ``ids`` only the
suffix is evaluated (chat turns and agent steps append, so each turn costs its own length);
anything else resets and prefills from scratch. Prefill runs in chunks; chunk boundaries do not
change the mathematics (the model reproduces token-by-token semantics inside a batch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from .sampler import Sampler, SamplingParams
from .state import ModelState, read_payload, write_payload

if TYPE_CHECKING:
    from .engine import Engine

Progress = Callable[[int, int], None]  # (tokens done, tokens to do)


class ContextFullError(ValueError):
    pass


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


class Session:
    prefill_chunk = 256

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self._model = engine._model
        self.ctx = engine.ctx
        self.last_prefill = PrefillStats()
        self.reset()

    @property
    def engine(self) -> "Engine":
        return self._engine

    def reset(self) -> None:
        self._state = ModelState.empty(self._model.cfg)
        self._tokens: list[int] = []
        self._logits: np.ndarray | None = None

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def logits(self) -> np.ndarray:
        """Next-token logits (float32, vocabulary-sized) after the last token."""
        if self._logits is None:
            raise RuntimeError("no logits yet: sync or eval a token first")
        return self._logits

    def _run(self, ids: Sequence[int]) -> None:
        out = self._model.forward(np.asarray(ids, dtype=np.int64), self._state)
        self._logits = np.array(out, dtype=np.float32)
        self._tokens.extend(int(i) for i in ids)

    def sync(self, ids: Sequence[int], progress: Progress | None = None) -> int:
        """Make the live tokens equal ``ids``; returns how many tokens were evaluated."""
        ids = [int(i) for i in ids]
        if len(ids) >= self.ctx:
            raise ContextFullError(f"prompt of {len(ids)} tokens does not fit a context of {self.ctx}")
        vocab = self._model.cfg.n_vocab
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError("token id out of the vocabulary range")
        n = len(self._tokens)
        if n > len(ids) or ids[:n] != self._tokens:
            self.reset()
            n = 0
        todo = ids[n:]
        start = time.perf_counter()
        for off in range(0, len(todo), self.prefill_chunk):
            self._run(todo[off : off + self.prefill_chunk])
            if progress:
                progress(min(off + self.prefill_chunk, len(todo)), len(todo))
        if todo:
            self.last_prefill = PrefillStats(len(todo), time.perf_counter() - start)
        return len(todo)

    def snapshot(self) -> bytes:
        """The live state as a DSV4 session payload (spec/model.md §6.1)."""
        if self._logits is None:
            raise RuntimeError("nothing to snapshot: the session holds no tokens")
        return write_payload(self._model.cfg, self.ctx, self._state, self._tokens, self._logits)

    def restore(self, blob: bytes | memoryview) -> None:
        """Replace the live state by a snapshot; runs no model evaluation. On any mismatch
        (PayloadError) the session is left as it was."""
        state, tokens, logits = read_payload(self._model.cfg, self.ctx, blob, f16_rows=self._model.opt.qat_sim)
        self._state, self._tokens, self._logits = state, tokens, logits

    def eval(self, token: int) -> None:
        if len(self._tokens) + 1 >= self.ctx:
            raise ContextFullError(f"context of {self.ctx} tokens is full")
        self._run([int(token)])

    def generate(self, params: SamplingParams = SamplingParams(), max_tokens: int = 50000,
                 stop_at_eos: bool = True) -> Iterator[Step]:
        """Sample from the current logits, yield the token, evaluate it, repeat.

        Stops after EOS (which is yielded but not evaluated: a transcript appends it, and the next
        sync prefills it), after ``max_tokens``, or when the context has one slot left."""
        sampler = Sampler(params)
        eos = self._engine.tokenizer.eos_id
        t = time.perf_counter()
        for index in range(max_tokens):
            token = sampler(self.logits)
            now = time.perf_counter()
            finish = None
            if stop_at_eos and token == eos:
                finish = "eos"
            elif index + 1 == max_tokens:
                finish = "length"
            elif len(self._tokens) + 2 >= self.ctx:
                finish = "context"
            yield Step(token, index, now - t, finish)
            if finish:
                return
            t = time.perf_counter()  # the consumer's time between steps is not ours
            self.eval(token)
