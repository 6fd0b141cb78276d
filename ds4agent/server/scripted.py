"""A scripted engine: the Engine/Session surface the server uses, replaying fixed completions
instead of running a model (docs/server.md §6).

Tests and the load benchmark drive the real server with it: each ``generate`` call samples the
next completion of the script (reasoning, text, DSML tool calls, written as the model would)
token by token, so the whole path from sampled tokens to each API's JSON and SSE events is the
one a real model goes through. It also counts what the cache had to prefill (``evaluated``),
which is how the cache's behaviour is checked without timing anything.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from ..engine import SamplingParams
from ..engine.errors import ContextFullError


@dataclass(frozen=True)
class ScriptStep:
    token: int
    index: int
    seconds: float
    finish: str | None = None


@dataclass(frozen=True)
class ScriptInfo:
    name: str = "scripted"
    backend: str = "scripted"
    kernels: str = "scripted"


class ScriptedEngine:
    """``completions``: texts in the rendered form (``<think>`` already open in thinking mode,
    so they start with the reasoning and ``</think>``; end them with the end-of-sentence token
    or a tool block). Each request takes the next one; the last repeats."""

    def __init__(self, tokenizer: object, completions: Sequence[str], ctx: int = 16384,
                 token_seconds: float = 0.0, prefill_seconds: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.ctx = ctx
        self.info = ScriptInfo()
        self.script = list(completions)
        self.token_seconds, self.prefill_seconds = token_seconds, prefill_seconds
        self.calls = 0
        self.evaluated = 0  # tokens prefilled, over all sessions
        self.prompts: list[list[int]] = []  # the tokens in the KV when each generation started
        self.generated: list[int] = []  # tokens sampled by each generation (a cancelled one stops short)
        self._lock = threading.Lock()

    def next_completion(self) -> str:
        with self._lock:
            text = self.script[min(self.calls, len(self.script) - 1)]
            self.calls += 1
            return text

    def session(self, ctx: int | None = None) -> "ScriptedSession":
        return ScriptedSession(self, self.ctx if ctx is None else ctx)

    def streaming(self) -> None:
        """No expert pool: nothing streams (Engine.streaming)."""
        return None

    def close(self) -> None:
        pass


class _Checkpoint:
    __slots__ = ("tokens",)

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens


class ScriptedSession:
    prefill_chunk = 64

    def __init__(self, engine: ScriptedEngine, ctx: int) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.info = engine.info
        self.ctx = ctx
        self._tokens: list[int] = []

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def n_tokens(self) -> int:
        return len(self._tokens)

    def reset(self) -> None:
        self._tokens = []

    def checkpoint(self) -> _Checkpoint:
        return _Checkpoint(list(self._tokens))

    def rollback(self, cp: _Checkpoint) -> None:
        self._tokens = list(cp.tokens)

    def sync(self, ids: Sequence[int], progress: object = None) -> int:
        ids = [int(i) for i in ids]
        if len(ids) >= self.ctx:
            raise ContextFullError(f"prompt of {len(ids)} tokens does not fit a context of {self.ctx}")
        n = len(self._tokens)
        if n > len(ids) or ids[:n] != self._tokens:
            self._tokens, n = [], 0
        todo = len(ids) - n
        if todo and self.engine.prefill_seconds:
            time.sleep(self.engine.prefill_seconds * todo)
        self.engine.evaluated += todo
        self._tokens = ids
        return todo

    def eval(self, token: int) -> None:
        if len(self._tokens) + 1 >= self.ctx:
            raise ContextFullError(f"context of {self.ctx} tokens is full")
        self._tokens.append(int(token))
        self.engine.evaluated += 1

    def generate(self, params: SamplingParams = SamplingParams(), max_tokens: int = 50000,
                 stop_at_eos: bool = True) -> Iterator[ScriptStep]:
        self.engine.prompts.append(list(self._tokens))
        ids = self.tokenizer.encode_rendered(self.engine.next_completion())
        eos = self.tokenizer.eos_id
        self.engine.generated.append(0)
        for index, token in enumerate(ids[:max_tokens]):
            self.engine.generated[-1] += 1
            if self.engine.token_seconds:
                time.sleep(self.engine.token_seconds)
            finish = None
            if stop_at_eos and token == eos:
                finish = "eos"
            elif index + 1 == max_tokens:
                finish = "length"
            elif len(self._tokens) + 2 >= self.ctx:
                finish = "context"
            yield ScriptStep(token, index, self.engine.token_seconds, finish)
            if finish:
                return
            self.eval(token)
