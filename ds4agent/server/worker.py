"""The engine's side of the server: a bounded queue of jobs in arrival order and ``parallel``
slots that run them (docs/server.md §2).

A job is a tokenised prompt plus its generation settings. A slot owns one session (one
context's KV) and runs one job at a time on its own thread: it finds the longest cached start
of the prompt (its live session, the checkpoints it kept at message boundaries, then the
on-disk session store), prefills only the rest, samples, and hands events back through the
job's ``emit`` callback (called on the slot's thread; the HTTP side hops them onto its event
loop). With more than one slot the sessions' forward passes go through one Batcher
(engine/batch.py): the slots' decode steps run as one batched pass, and a prefill chunk runs
between two steps, so a long prompt delays the others by a chunk at a time. Each job's tokens
are the bits it gets on a server of one slot.

A job waiting in the queue goes to an idle slot, the one whose cache holds the longest start of
its prompt (the conversation it continues, usually); jobs are admitted in arrival order.

Cache matching is by *text*, not by token ids (docs/server.md §4): the live KV holds the tokens
the model sampled, which need not be the tokens the canonical tokeniser gives the same text. A
candidate (tokens, their text) fits a prompt when its text is a byte prefix of the prompt's
text and a token of the prompt's canonical encoding starts exactly where that text ends; the
prompt then runs as ``candidate tokens + the canonical tokens from there``.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..conversation.reply import Reply
from ..engine import Batcher, SamplingParams
from ..sessions import StoreError
from .requests import ApiError
from .toolmemory import SampledBlock, ToolMemory, calls_of_block

if TYPE_CHECKING:
    from ..engine import Session
    from ..sessions import SessionStore

log = logging.getLogger("ds4agent.server")

MAX_CHECKPOINTS = 16  # in-memory message-boundary checkpoints (O(1) each: shared arrays)
SLOT_CHUNK_CPU = 64  # prefill chunk of a slot beside others, on the CPU kernels (see Slot)


@dataclass
class JobEvent:
    """One thing the worker hands back for a job (docs/server.md §2)."""

    kind: str  # start | prefill | reasoning | content | tool_start | tool_args | tool_end | done | error
    text: str = ""
    index: int = -1
    id: str = ""
    name: str = ""
    data: dict | None = None


@dataclass
class Job:
    api: str  # chat | completions | messages | responses (for the log line)
    ids: list[int]  # the prompt's canonical token ids
    text: bytes  # the prompt's text, exactly those ids decoded
    mode: str  # "thinking" | "chat": how the completion is parsed; "raw" for /v1/completions
    sampling: SamplingParams
    max_tokens: int
    emit: Callable[[JobEvent], None]
    stop: list[str] = field(default_factory=list)
    id_prefix: str = "call_"  # tool-call ids: call_ (OpenAI) or toolu_ (Anthropic)
    cancel: threading.Event = field(default_factory=threading.Event)
    replay: dict[str, int] | None = None  # tool-call replay counts, for the log
    # Directional steering other than the server's own (the request's "dir_steering"): a
    # Steering from the engine, or "off"; None: the server's. Such a job reuses no cached KV
    # and leaves none (the KV depends on the steering it was computed under).
    steering: Any = None


@dataclass
class _Cached:
    tokens: list[int]
    text: bytes
    checkpoint: object  # Session.checkpoint()
    used: float = 0.0


def first_turn_bytes(job: Job, tok: Any) -> int:
    """Bytes of ``job``'s prompt up to the end of its first user message (where the first
    assistant turn starts; the whole prompt when it has none)."""
    at = 0
    for t in job.ids:
        if t == tok.special["assistant"]:
            return at
        at += len(tok.token_bytes(t))
    return at


class QueueFull(Exception):
    pass


class Worker:
    def __init__(self, engine: Any, store: "SessionStore | None" = None, max_queue: int = 16,
                 min_save_tokens: int = 512, memory: ToolMemory | None = None, parallel: int = 1) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        self.engine = engine
        self.tok = engine.tokenizer
        steering = getattr(engine, "steering", None)
        if store is not None and steering is not None and steering.active:
            # KV computed under steering is no other configuration's: a folder of its own, so
            # that neither this server nor an unsteered one reuses the other's.
            from ..sessions import SessionStore

            store = SessionStore(store.dir / f"steered-{steering.digest}-ffn{steering.ffn:g}-attn{steering.attn:g}",
                                 store.budget_bytes)
        self.store = store
        self.memory = memory or ToolMemory()
        self.max_queue = max_queue
        self.min_save_tokens = min_save_tokens
        self.batcher = Batcher() if parallel > 1 else None
        self._jobs: collections.deque[Job] = collections.deque()
        self._floors: dict[int, int] = {}  # id of a waiting job -> first_turn_bytes of it
        self._cv = threading.Condition()
        self._closing = False
        # The session store and the tool memory are shared by the slots' threads (and the
        # memory by the HTTP side's replay): one lock each, so that a slow save to disk does
        # not hold up a request that only needs the memory.
        self.store_lock = threading.Lock()
        self.memory_lock = threading.Lock()
        self.requests = 0
        if store is not None:
            try:
                n = self.memory.load(store)
                if n:
                    log.info("tool memory: %d tool-call ids read back from the session files", n)
            except StoreError as e:
                log.warning("tool memory: %s", e)
        self.slots = [Slot(self, i) for i in range(parallel)]
        self._idle: list[Slot] = []
        for slot in self.slots:
            slot.start()

    def steering_for(self, asked: dict | str | None) -> Any:
        """A request's "dir_steering" as a job's ``steering``: None for the server's own, else
        "off" or the server's directions with the scales asked. ApiError (400) for scales on a
        server started without a steering file."""
        base = getattr(self.engine, "steering", None)
        if asked is None:
            return None
        if asked == "off":
            return "off" if base is not None and base.active else None
        if base is None:
            raise ApiError(400, "dir_steering: this server runs without a steering file (start it with "
                           "--dir-steering-file FILE)", param="dir_steering")
        st = base.scaled(**asked)
        return None if (st.attn, st.ffn) == (base.attn, base.ffn) else st

    def prime(self, ids: list[int]) -> bool:
        """--prefix-file: the default system prompt's KV (tokens ``ids``) in the disk cache as a
        shared start ("agent-system"), prefilled only when the cache does not hold it already,
        so requests that begin with it prefill only what follows. Whether it was prefilled now."""
        if self.store is None:
            return False
        text = self.tok.decode_bytes(ids)
        with self.store_lock:
            if self.store.saved(text) is not None:
                return False
            session = self.engine.session()
            session.sync(ids)
            try:
                self.store.save(session, "agent-system")
            except StoreError as e:
                log.warning("prefix: not kept in the cache: %s", e)
        log.info("prefix: %d tokens prefilled and kept in the cache", len(ids))
        return True

    @property
    def session(self) -> "Session":
        """The first slot's session (with one slot: the server's only one)."""
        return self.slots[0].session

    @property
    def ctx(self) -> int:
        return self.slots[0].ctx

    # -- queue -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cv:
            if self._closing:
                raise QueueFull("server shutting down")
            if len(self._jobs) >= self.max_queue:
                raise QueueFull(f"{len(self._jobs)} requests already wait for the engine")
            self._jobs.append(job)
            self._assign()

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def _assign(self) -> None:
        """Hand waiting jobs, oldest first, to idle slots: each to the idle slot whose cache
        holds the longest start of its prompt. Under the lock."""
        while self._jobs and self._idle:
            job = self._jobs[0]
            floor = self._floors.get(id(job))
            if floor is None:  # (once per job: a long prompt's tokens are walked once)
                floor = self._floors[id(job)] = first_turn_bytes(job, self.tok)
            slot = max(self._idle, key=lambda sl: sl.cached_for(job, floor))  # ties: the first idle slot
            have = slot.cached_for(job, floor)
            if any(sl.finishing and sl.cached_for(job, floor) > have for sl in self.slots):
                break  # a slot holding more of it is about to be idle: it goes there
            self._jobs.popleft()
            self._floors.pop(id(job), None)
            self._idle.remove(slot)
            slot.job = job
        self._cv.notify_all()

    def next_job(self, slot: "Slot") -> Job | None:
        """Block until a job is handed to ``slot``; None when the server closes."""
        with self._cv:
            slot.current = None
            slot.finishing = False
            self._idle.append(slot)
            self._assign()
            while slot.job is None and not self._closing:
                self._cv.wait()
            if slot in self._idle:
                self._idle.remove(slot)
            job, slot.job = slot.job, None
            slot.current = job
            if job is not None:
                self.requests += 1
            return job

    def close(self, save: bool = True, timeout: float = 30.0) -> None:
        """Stop taking jobs, cancel the running and the waiting ones, then save each slot's
        live session (reason "shutdown") when a store is configured."""
        with self._cv:
            self._closing = True
            pending = list(self._jobs) + [sl.job for sl in self.slots if sl.job is not None]
            self._jobs.clear()
            self._floors.clear()
            for sl in self.slots:
                sl.job = None
                if sl.current is not None:
                    sl.current.cancel.set()
            self._cv.notify_all()
        for job in pending:
            job.emit(JobEvent("error", "server shutting down", data={"status": 503}))
        for sl in self.slots:
            sl.join(timeout)
        if self.batcher is not None:
            self.batcher.close()
        if save:
            for sl in self.slots:
                sl.save("shutdown")


class Slot:
    """One session and the jobs it runs, on its own thread (see the module's docstring)."""

    def __init__(self, worker: Worker, index: int) -> None:
        self.worker = worker
        self.index = index
        self.tok = worker.tok
        self.session = worker.engine.session()
        self.session.batcher = worker.batcher
        if worker.batcher is not None and worker.engine.info.backend == "cpu":
            # A decode step of the other slots waits for one prefill chunk: on the CPU a chunk of
            # 256 tokens takes 2-4 s on a small machine, one of 64 about half a second (and runs
            # no slower per token there: the experts' few-token path is the faster one).
            self.session.prefill_chunk = min(self.session.prefill_chunk, SLOT_CHUNK_CPU)
        self.ctx = self.session.ctx
        self.job: Job | None = None  # handed to this slot, not yet taken (under the worker's lock)
        self.current: Job | None = None  # running
        self.finishing = False  # its job has answered; the slot is about to be idle
        self._cached: list[_Cached] = []
        self._saved_text: bytes | None = None  # text of the live session as last saved
        self._live_text = b""  # text of the live session after the last job
        self._steer_key: Any = None  # the steering the live KV and cached starts were made under (None: the server's)
        self._drafts_before: dict = {}  # the drafter's counters when the running job began
        self.special = {self.tok.special["user"], self.tok.eos_id}
        self._think_open = self.tok.special.get("think_open")
        self._thread = threading.Thread(target=self._loop, name=f"ds4-slot{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def cached_for(self, job: Job, floor: int) -> int:
        """Bytes of ``job``'s prompt this slot's cache holds (the live session or a checkpoint
        whose text starts the prompt), when they reach past its first user message (``floor``
        bytes, first_turn_bytes): the
        conversation it continues is here. A shorter start (the system prompt and tools, which
        many conversations share) counts as none, so that new conversations spread over the
        slots, the one idle longest first, rather than evict each other's live sessions (the
        shared start is on disk after a cold save)."""
        best = 0
        for text in [self._live_text] + [c.text for c in self._cached]:
            if len(text) > best and job.text.startswith(text):
                best = len(text)
        return best if best > floor else 0

    def _drafter_stats(self):
        """The counters of the session's drafter (engine/drafts.py), when it has one."""
        return getattr(getattr(self.session, "drafter", None), "stats", None)

    def _drafted(self) -> str:
        """The log's words on speculation for the job just run (proposed and kept tokens, their
        mean per pass), or nothing when no proposal was made."""
        stats = self._drafter_stats()
        if stats is None or not self._drafts_before:
            return ""
        now, before = stats(), self._drafts_before
        passes, drafted = now["proposals"] - before["proposals"], now["drafted"] - before["drafted"]
        if not passes:
            return ""
        kept = now["accepted"] - before["accepted"]
        return f" drafted={drafted} accepted={kept} ({kept / passes:.2f} per pass)"

    def _loop(self) -> None:
        while True:
            job = self.worker.next_job(self)
            if job is None:
                return
            try:
                stats = self._drafter_stats()
                self._drafts_before = stats() if stats is not None else {}
                self._run(job)
            except Exception as e:  # a bug must not take the server down; the session is consistent
                log.exception("request failed")
                job.emit(JobEvent("error", f"generation failed: {e}", data={"status": 500}))
            finally:
                if not self.finishing:  # (a job that answered said it already, in _finish)
                    self._live_text = self.tok.decode_bytes(self.session.tokens)

    # -- cache -----------------------------------------------------------------------------
    def _offsets(self, ids: list[int]) -> dict[int, int]:
        """byte offset where each token of ``ids`` starts -> its index (and the end -> len)."""
        out, pos = {}, 0
        for i, t in enumerate(ids):
            out[pos] = i
            pos += len(self.tok.token_bytes(t))
        out[pos] = len(ids)
        return out

    def _fit(self, tokens: list[int], text: bytes, job: Job, offsets: dict[int, int]) -> list[int] | None:
        if not tokens or not job.text.startswith(text):
            return None
        j = offsets.get(len(text))
        if j is None:
            return None
        return tokens + job.ids[j:]

    def _reuse(self, job: Job) -> tuple[list[int], int, str]:
        """Put the session at the longest cached start of the job's prompt. Returns the token
        ids to run, how many of them are already in the KV, and where they came from."""
        s = self.session
        offsets = self._offsets(job.ids)
        live_tokens = s.tokens
        live_text = self._live_text  # the session's text since the last job ended (only this slot changes it)
        best: tuple[int, str, Any, list[int]] | None = None
        ids = self._fit(live_tokens, live_text, job, offsets)
        if ids is not None:
            best = (len(live_tokens), "live", None, ids)
        for c in self._cached:
            if best is not None and len(c.tokens) <= best[0]:
                continue
            ids = self._fit(c.tokens, c.text, job, offsets)
            if ids is not None:
                best = (len(c.tokens), "memory", c, ids)
        if best is None or best[1] != "live":
            # The live state is about to be replaced: keep it on disk when it is worth it.
            self.save("evict")
        if self.worker.store is not None and self._steer_key is None and (best is None or best[0] < len(job.ids)):
            got = self._from_disk(job, offsets, best[0] if best else 0)
            if got is not None:
                return got, len(self.session.tokens), "disk"
        if best is None:
            s.reset()
            return list(job.ids), 0, "none"
        n, source, c, ids = best
        if c is not None:
            c.used = time.monotonic()
            s.rollback(c.checkpoint)
        return ids, n, source

    def _from_disk(self, job: Job, offsets: dict[int, int], better_than: int) -> list[int] | None:
        store = self.worker.store
        try:
            with self.worker.store_lock:
                sha = store.longest_prefix(job.text)
                if sha is None:
                    return None
                info = next((i for i in store.list() if i.sha == sha), None)
                if info is None or info.tokens <= better_than or info.tokens < 1:
                    return None
                cp = self.session.checkpoint()
                store.load(sha, self.session)
        except StoreError as e:
            log.warning("kv cache: %s", e)
            return None
        ids = self._fit(self.session.tokens, self.tok.decode_bytes(self.session.tokens), job, offsets)
        if ids is None:
            self.session.rollback(cp)
            return None
        self._saved_text = None
        return ids

    def _boundaries(self, ids: list[int], start: int) -> list[int]:
        """Where checkpoints go (docs/server.md §4): before each user turn, after each end of
        sentence, before the final <think> of the prompt, and at the prompt's end."""
        out = [i for i in range(max(start, 1), len(ids)) if ids[i] == self.tok.special["user"]]
        out += [i + 1 for i in range(max(start - 1, 0), len(ids) - 1) if ids[i] == self.tok.eos_id]
        if ids and ids[-1] == self._think_open and len(ids) - 1 > start:
            out.append(len(ids) - 1)
        out.append(len(ids))
        return sorted({b for b in out if b > start})

    def _remember(self, tokens: list[int]) -> None:
        text = self.tok.decode_bytes(tokens)
        for c in self._cached:
            if c.tokens == tokens:
                c.used = time.monotonic()
                return
        self._cached.append(_Cached(list(tokens), text, self.session.checkpoint(), time.monotonic()))
        if len(self._cached) > MAX_CHECKPOINTS:
            self._cached.remove(min(self._cached, key=lambda c: c.used))

    def save(self, reason: str) -> None:
        s = self.session
        store = self.worker.store
        if store is None or s.n_tokens < max(self.worker.min_save_tokens, 1) or self._steer_key is not None:
            return  # (KV made under a request's own steering is not the cache's to keep)
        text = self.tok.decode_bytes(s.tokens)
        if text == self._saved_text:
            return
        try:
            t0 = time.perf_counter()
            with self.worker.memory_lock:
                tool_map = self.worker.memory.map_for_text(text.decode("utf-8", "replace"))
            with self.worker.store_lock:
                sha = store.save(s, reason, tool_map=tool_map)
            self._saved_text = text
            log.info("kv cache stored tokens=%d reason=%s key=%s save=%.0f ms", s.n_tokens, reason, sha[:12],
                     (time.perf_counter() - t0) * 1000)
        except (StoreError, RuntimeError) as e:
            log.warning("kv cache: not saved (%s): %s", reason, e)

    # -- a job -----------------------------------------------------------------------------
    def _steer(self, job: Job) -> None:
        """Put the slot under the job's steering. KV made under other steering is not this
        job's: changing it drops the slot's live state and its cached starts (the server's own
        are saved first), and a job under its own steering reads and writes no disk cache."""
        key = None if job.steering is None else "off" if job.steering == "off" else job.steering.record()
        if key == self._steer_key:
            return
        if self._steer_key is None:
            self.save("evict")
        self._cached.clear()
        self.session.reset()
        self._live_text = b""
        default = getattr(self.worker.engine, "steering", None)
        self.session.set_steering(default if key is None else None if key == "off" else job.steering)
        self._steer_key = key

    def _run(self, job: Job) -> None:
        t0 = time.perf_counter()
        self._steer(job)
        ids, cached, source = self._reuse(job)
        if len(ids) >= self.ctx:
            job.emit(JobEvent("error",
                              f"Prompt has {len(ids)} tokens, but the configured context size is {self.ctx} tokens",
                         data={"status": 400, "code": "context_length_exceeded", "n_prompt_tokens": len(ids),
                               "n_ctx": self.ctx}))
            return
        usage = {"prompt_tokens": len(ids), "cached_tokens": cached, "source": source}
        job.emit(JobEvent("start", data=dict(usage)))
        s = self.session
        # Cold save: a request that reused nothing stores its shared start (system prompt and
        # tools, up to the first user turn) so other conversations with it skip that prefill.
        cold = next((i for i, t in enumerate(ids) if t == self.tok.special["user"]), 0) if cached == 0 else 0
        bounds = self._boundaries(ids, cached)
        done = cached
        tp = time.perf_counter()
        chunk = getattr(s, "prefill_chunk", 256)
        for b in bounds:
            while done < b:
                if job.cancel.is_set():
                    return self._finish(job, usage, "cancelled", t0, tp, time.perf_counter(), 0, 0.0, done - cached)
                done = min(b, done + chunk)
                s.sync(ids[:done])
                job.emit(JobEvent("prefill", data={"done": done - cached, "total": len(ids) - cached}))
            if done == cold and cold >= self.worker.min_save_tokens:
                self.save("cold")
            self._remember(ids[:done])
        prefill_s = time.perf_counter() - tp
        self._generate(job, usage, t0, tp, prefill_s, len(ids) - cached, len(ids))

    def _generate(self, job: Job, usage: dict, t0: float, tp: float, prefill_s: float, prefilled: int,
                  n_prompt: int) -> None:
        """Sample the answer through the reply pipeline (conversation/reply.py) and hand its
        events to the job as the APIs' pieces: tool calls get their ids here and their
        arguments as compact JSON deltas (_Args); a tool block ends the answer; a block that
        breaks the grammar goes out as text."""
        s = self.session
        max_tokens = max(0, min(job.max_tokens, self.ctx - n_prompt - 1))
        tg = time.perf_counter()
        reply = Reply(s, self.tok, job.sampling, job.mode, max_tokens, stops=job.stop, cancel=job.cancel,
                      stop_at_tools=True, malformed="text")
        calls: dict[int, _Args] = {}
        ids_of: dict[int, str] = {}
        reasoning: list[str] = []
        n_gen = 0
        for ev in reply:
            k = ev.kind
            if k == "done":
                n_gen = ev.tokens
            elif k == "reasoning":
                reasoning.append(ev.text)
                job.emit(JobEvent("reasoning", ev.text))
            elif k == "content":
                job.emit(JobEvent("content", ev.text))
            elif k == "call_start":
                with self.worker.memory_lock:
                    ident = self.worker.memory.new_ids(job.id_prefix, 1)[0]
                ids_of[ev.index] = ident
                calls[ev.index] = _Args()
                job.emit(JobEvent("tool_start", index=ev.index, id=ident, name=ev.name))
            elif k in ("param_start", "param_text", "param_end"):
                delta = calls[ev.index].feed(k, ev.text, ev.name)
                if delta:
                    job.emit(JobEvent("tool_args", delta, index=ev.index))
            elif k == "call":
                delta = calls[ev.index].close()
                job.emit(JobEvent("tool_args", delta, index=ev.index))
                job.emit(JobEvent("tool_end", calls[ev.index].text, index=ev.index, id=ids_of[ev.index], name=ev.name))
            elif k == "tool_block":
                parsed = calls_of_block(ev.text)
                if parsed is not None:
                    with self.worker.memory_lock:
                        self.worker.memory.remember([ids_of[i] for i in sorted(ids_of)],
                                         SampledBlock(ev.text, "".join(reasoning) if job.mode == "thinking" else None,
                                                      parsed))
            elif k == "malformed":  # not a call: the block's text goes on as the answer
                log.warning("malformed tool call: %s", ev.text)
                calls.clear()
                ids_of.clear()
        finish = {"eos": "stop", "context": "length"}.get(reply.finish, reply.finish)
        if finish in ("stop", "stop_sequence", "tool_calls", "length", "cancelled") and s.n_tokens:
            self._remember(s.tokens)
        gen_s = time.perf_counter() - tg
        usage.update(completion_tokens=n_gen, stop_sequence=reply.stop_matched)
        self._finish(job, usage, finish, t0, tp, tp + prefill_s, n_gen, gen_s, prefilled)

    def _finish(self, job: Job, usage: dict, finish: str, t0: float, tp: float, tp_end: float, n_gen: int,
                gen_s: float, prefilled: int) -> None:
        usage.setdefault("completion_tokens", n_gen)
        usage["prefilled_tokens"] = prefilled
        pre_s = max(tp_end - tp, 1e-9)
        replay = job.replay or {}
        log.info("%s prompt=%d cached=%d (%s) prefill=%d %.1f t/s gen=%d %.1f t/s%s tools replayed=%d canonical=%d "
                 "finish=%s %.2fs", job.api, usage["prompt_tokens"], usage["cached_tokens"], usage["source"],
                 prefilled, prefilled / pre_s if prefilled else 0.0, n_gen, n_gen / gen_s if gen_s > 0 else 0.0,
                 self._drafted(), replay.get("exact", 0), replay.get("canonical", 0), finish, time.perf_counter() - t0)
        # The client may send its next turn as soon as it has this: the slot says first what it
        # now holds, so that the turn waits for it rather than going elsewhere (Worker._assign).
        self._live_text = self.tok.decode_bytes(self.session.tokens)
        self.finishing = True
        job.emit(JobEvent("done", finish, data=usage))


class _Args:
    """A tool call's arguments as compact JSON, built from the parser's parameter events while
    they stream, so that every delta sent is final and the deltas add up to exactly the
    arguments of the finished call (docs/server.md §3)."""

    def __init__(self) -> None:
        self.text = ""
        self._is_str = False

    def feed(self, kind: str, text: str, key: str) -> str:
        if kind == "param_start":
            self._is_str = text == "true"
            delta = ("{" if not self.text else ",") + compact_json(key) + ":" + ('"' if self._is_str else "")
        elif kind == "param_text":
            # JSON escaping works character by character, so escaping each piece is exact; a
            # JSON value waits for its end to be re-encoded compactly.
            delta = compact_json(text)[1:-1] if self._is_str else ""
        elif self._is_str:  # param_end
            delta = '"'
        else:
            try:
                delta = compact_json(json.loads(text))
            except (ValueError, RecursionError):
                delta = text.strip() or "null"  # not JSON: passed on as written (parse() does the same)
        self.text += delta
        return delta

    def close(self) -> str:
        delta = "}" if self.text else "{}"
        self.text += delta
        return delta


def compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
