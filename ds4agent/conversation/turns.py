"""A conversation with the model: transcript + KV session + streaming parse, no terminal code.

The chat front end and the agent drive it: ``turn(text)`` yields events while the answer
streams. Each turn prefills only its own suffix (the transcript is append-only).

Stopping a turn: a front end sets ``stop`` (a threading.Event; key and signal handlers may set
it from anywhere) and the turn ends at the next token or prefill-chunk boundary, never inside a
model step. Before the first sampled token the user turn is withdrawn and the KV returns to its
checkpoint from before the turn (no re-prefill); after it, the partial answer stays and is
closed with an end of sentence, exactly as if the model had stopped there. A KeyboardInterrupt
that still lands inside a turn (pipe mode has no handler) is settled the same way by
``interrupted()``; the session's steps are atomic, so it cannot leave the KV and the token list
disagreeing either.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ..engine import SamplingParams
from ..protocol import THINK_MAX_MIN_CTX, Transcript, conversation_from_text
from .events import Event
from .reply import Reply

if TYPE_CHECKING:
    from ..engine import Engine  # the runtime (MLX) is not imported by this layer


@dataclass
class Stats:
    prompt_tokens: int = 0  # the last turn's prompt: the transcript before its answer
    prefill_tokens: int = 0
    prefill_tps: float = 0.0
    gen_tokens: int = 0
    gen_tps: float = 0.0
    turns: int = 0
    total_generated: int = 0


@dataclass
class _Turn:
    start_tokens: int  # transcript length before the user message
    start_messages: int
    checkpoint: object  # the session before the turn (Session.checkpoint), for a withdrawal
    reply: Reply | None = None  # the answer being sampled (its tokens, its parse)
    finished: bool = False

    @property
    def sampled(self) -> list[int]:
        return self.reply.sampled if self.reply is not None else []


class Conversation:
    def __init__(self, engine: "Engine", mode: str = "thinking", system: str | None = None,
                 sampling: SamplingParams = SamplingParams(), max_tokens: int = 50000,
                 tools: list[dict] | None = None) -> None:
        self.engine = engine
        self.tools = tools  # tool schemas announced in the system message
        self.tok = engine.tokenizer
        self.session = engine.session()
        self.system = system
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.mode = mode  # "chat" | "thinking" | "max"
        self.stats = Stats()
        self._system_blob: bytes | None = None  # KV snapshot of the system prompt (see prime)
        self.dirty = False  # changed since the last save or load
        self.stop = threading.Event()  # set to end the running turn at the next token boundary
        self._turn: _Turn | None = None
        self._new_transcript()

    # -- state ------------------------------------------------------------------------------
    @property
    def ctx(self) -> int:
        return self.session.ctx

    def _render_mode(self) -> tuple[str, str | None]:
        if self.mode == "max" and self.ctx >= THINK_MAX_MIN_CTX:
            return "thinking", "max"
        return ("chat", None) if self.mode == "chat" else ("thinking", None)

    def _new_transcript(self) -> None:
        mode, effort = self._render_mode()
        self.transcript = Transcript(self.tok, mode, effort)

    @property
    def messages(self) -> list[dict]:
        return self.transcript.messages

    def set_mode(self, mode: str) -> None:
        """Thinking mode for the following turns. Think Max changes the very start of the
        prompt, so toggling it re-renders the conversation (the next turn prefills it all)."""
        old_effort = self._render_mode()[1]
        self.mode = mode
        render_mode, effort = self._render_mode()
        self.transcript.thinking_mode = render_mode
        if effort != old_effort and self.transcript.messages:
            self.transcript.rerender(render_mode, effort)
        self.transcript.reasoning_effort = effort

    def reset(self, system: str | None = None) -> None:
        if system != self.system:
            self._system_blob = None  # another system prompt: the primed KV is not its
        self.system = system
        self.session.reset()
        self._new_transcript()
        self.dirty = False

    # -- a system prompt evaluated once ----------------------------------------------------------
    def _system_message(self) -> dict:
        return {"role": "system", "content": self.system, **({"tools": self.tools} if self.tools else {})}

    @property
    def primed(self) -> bool:
        """Whether ``prime`` holds the system prompt's KV (restart starts from it)."""
        return self._system_blob is not None

    def prime(self, store=None) -> int:
        """Evaluate the system prompt (the system text and the tools it announces) once: from
        the session store when it holds it (no prefill), else by prefilling it and saving it
        there as a shared start ("agent-system": the store keeps it whatever else it drops).
        Conversations after it (``restart``) start from a copy of its KV. Returns the number of
        tokens prefilled; 0 and nothing held when there is no system prompt."""
        from ..sessions import StoreError

        self.reset(system=self.system)
        if not self.system and not self.tools:
            return 0
        self.transcript.append(self._system_message())
        tokens = self.transcript.tokens
        prefilled = 0
        loaded = False
        sha = store.saved(self.tok.decode_bytes(tokens)) if store is not None else None
        if sha is not None:
            try:
                store.load(sha, self.session)
                loaded = self.session.tokens == tokens
            except StoreError:  # a damaged cache file: prefill instead
                loaded = False
        if not loaded:
            prefilled = self.session.sync(tokens)
            if store is not None:
                try:
                    store.save(self.session, "agent-system")
                except StoreError:
                    pass  # caching is an optimisation; the conversation works without it
        self._system_blob = self.session.snapshot()
        self.dirty = False
        return prefilled

    def restart(self) -> None:
        """A new conversation: back to the primed system prompt (its KV restored, no prefill),
        or to nothing when none was primed."""
        self.reset(system=self.system)
        if self._system_blob is not None:
            self.transcript.append(self._system_message())
            self.session.restore(self._system_blob)

    def set_context(self, ctx: int) -> None:
        """New context size: the KV is dropped, the transcript kept (the next turn re-prefills);
        the steering in force stays."""
        steering = self.session.steering
        self.session = self.engine.session(ctx=ctx)
        self.session.set_steering(steering)
        self._system_blob = None  # a snapshot is of one context size

    def mark(self) -> "Mark":
        """Capture the conversation (transcript, KV, settings) so that ``restore`` can undo
        whatever follows, e.g. a compaction that produced nothing usable. O(1) in the KV."""
        t = self.transcript
        return Mark(t, len(t.messages), len(t.tokens), t.text, self.session.checkpoint(), self.dirty,
                    self.system, self.tools)

    def restore(self, mark: "Mark") -> None:
        """Return to ``mark``. The transcript then was append-only since (turns, or a new
        transcript object replacing it), so truncating the old object restores it."""
        t = self.transcript = mark.transcript
        del t.messages[mark.n_messages :]
        del t.tokens[mark.n_tokens :]
        t.text = mark.text
        self.session.rollback(mark.session)
        self.dirty, self.system, self.tools = mark.dirty, mark.system, mark.tools
        self._turn = None

    # -- a turn -----------------------------------------------------------------------------
    def turn(self, text: str) -> Iterator[Event]:
        """A user message and the model's answer."""
        self.stop.clear()  # a stop asked for before this turn is not meant for it
        return self.turn_with({"role": "user", "content": text})

    def turn_with(self, *messages: dict) -> Iterator[Event]:
        """Append ``messages`` (a user message, or tool results) and generate the answer."""
        t = self.transcript
        # ``stop`` is not cleared here: an agent request runs several turns, and a stop asked
        # for during its tool calls is meant for the next one (turn() and Agent.run clear it).
        self._turn = turn = _Turn(len(t.tokens), len(t.messages), self.session.checkpoint())
        new = list(messages)
        if not t.messages and self.system:
            new.insert(0, {"role": "system", "content": self.system, **({"tools": self.tools} if self.tools else {})})
        t.append(*new)
        self.dirty = True
        self.stats.prompt_tokens = len(t.tokens)
        if len(t.tokens) + 1 >= self.ctx:
            n = len(t.tokens)  # counted before the rollback takes the new messages away
            self._rollback()
            raise ContextError(f"the conversation ({n} tokens) does not fit the context of {self.ctx}; "
                               "use /new or /ctx N")
        yield from self._prefill(t.tokens)
        if self.stop.is_set():
            self._rollback()
            yield Event("done", finish="withdrawn")
            return
        render_mode, _ = self._render_mode()
        # The whole completion, end of sentence included, goes to the parser: the transcript
        # keeps its final parse. A stop keeps the sampled token (not evaluated, as after any turn).
        turn.reply = reply = Reply(self.session, self.tok, self.sampling, render_mode, self.max_tokens,
                                   cancel=self.stop, parse_eos=True)
        try:
            for ev in reply:
                self._count(reply)  # as they come, so that an interrupted turn reports what it produced
                if ev.kind in ("reasoning", "content"):
                    yield Event(ev.kind, ev.text)
                elif ev.kind == "call_start":
                    yield Event("call_start", ev.name)
                elif ev.kind == "call":
                    yield Event("call", f"{ev.name} {ev.arguments}")
                elif ev.kind == "malformed":
                    yield Event("dsml_error", ev.text)
                elif ev.kind == "done":  # always the reply's last event
                    # a turn says "interrupted" for a stop, and ended at its end of sentence
                    # even inside an unclosed tool block (the parse reports that block)
                    finish = {"cancelled": "interrupted", "error": "eos"}.get(ev.finish, ev.finish)
        finally:
            self._count(reply)
        self._close_turn()
        yield Event("done", finish=finish)

    def _count(self, reply: Reply) -> None:
        self.stats.gen_tokens = len(reply.sampled)
        self.stats.gen_tps = len(reply.sampled) / reply.seconds if reply.seconds > 0 else 0.0

    def _prefill(self, ids: list[int]) -> Iterator[Event]:
        """Prefill what the KV lacks, chunk by chunk, yielding progress between chunks (each
        chunk extends the live tokens, so nothing is evaluated twice)."""
        live = self.session.tokens
        start = len(live) if ids[: len(live)] == live else 0
        total = len(ids) - start
        if total <= 0:
            self.stats.prefill_tokens = 0
            return
        chunk = self.session.prefill_chunk
        t0 = time.perf_counter()
        for end in range(start + chunk, len(ids) + chunk, chunk):
            self.session.sync(ids[: min(end, len(ids))])
            yield Event("prefill", done=min(end, len(ids)) - start, total=total)
            if self.stop.is_set():
                return
        seconds = time.perf_counter() - t0
        self.stats.prefill_tokens, self.stats.prefill_tps = total, total / seconds if seconds > 0 else 0.0

    def _close_turn(self) -> None:
        turn = self._turn
        if turn is None or turn.finished:
            return
        parser = turn.reply.parser if turn.reply is not None else None
        result = turn.reply.result() if turn.reply is not None else None
        sampled = list(turn.sampled)
        eos, think_close = self.tok.eos_id, self.tok.special["think_close"]
        if result and "error" not in result:
            message = {"role": "assistant", "content": result["content"], "tool_calls": result["tool_calls"]}
            if self._render_mode()[0] == "thinking":
                message["reasoning_content"] = result["reasoning_content"]
            if parser.tool_blocks:
                message["dsml"] = parser.tool_blocks[0]  # replayed byte for byte
            if not sampled or sampled[-1] != eos:
                sampled.append(eos)  # a tool block may end the turn without EOS
        else:
            # Stopped early (interrupt, length limit) or unparseable: keep what was said and
            # close the turn the way the model would have.
            in_reasoning = parser is not None and parser.phase == "reasoning"
            if sampled and sampled[-1] == eos:
                sampled = sampled[:-1]
            reasoning, content = _split_partial(self.tok.decode(sampled), in_reasoning)
            message = {"role": "assistant", "content": content}
            if self._render_mode()[0] == "thinking":
                message["reasoning_content"] = reasoning
            sampled += ([think_close] if in_reasoning else []) + [eos]
        self.transcript.append_sampled(message, sampled)
        turn.finished = True  # only now: an interrupt before this point settles the turn again
        self.stats.turns += 1
        self.stats.total_generated += len(turn.sampled)

    def interrupted(self) -> str:
        """Settle a turn cut short by Ctrl+C; returns "rolled back" or "kept"."""
        turn = self._turn
        if turn is None or turn.finished:
            return "kept"
        if not turn.sampled:
            self._rollback()
            return "rolled back"
        self._close_turn()
        return "kept"

    def _rollback(self) -> None:
        turn = self._turn
        if turn is None:
            return
        turn.finished = True
        t = self.transcript
        del t.messages[turn.start_messages :]
        del t.tokens[turn.start_tokens :]
        t.text = self.tok.decode(t.tokens) if t.tokens else ""
        # Back to the KV from before the turn: the withdrawn prompt may have been partly
        # prefilled, and the next turn should extend the old state, not prefill everything.
        self.session.rollback(turn.checkpoint)

    # -- sessions ---------------------------------------------------------------------------
    def sync_for_save(self) -> None:
        """Bring the KV to exactly the transcript (the last sampled token and EOS are not
        evaluated yet after a turn) so the saved file names the whole conversation."""
        if self.transcript.tokens:
            self.session.sync(self.transcript.tokens)

    def adopt_session(self) -> None:
        """After a session was loaded into ``self.session``: rebuild the transcript from its text."""
        text = self.tok.decode(self.session.tokens)
        messages, mode, effort = conversation_from_text(text)
        self.transcript = Transcript(self.tok, mode, effort)
        self.transcript.messages = messages
        self.transcript.tokens = list(self.session.tokens)
        self.transcript.text = text
        self.mode = "max" if effort == "max" else mode
        system = next((m for m in messages if m["role"] == "system"), None)
        self.system = system["content"] if system else None
        self.tools = system.get("tools") if system else None
        self.dirty = False


class ContextError(ValueError):
    pass


@dataclass(frozen=True)
class Mark:
    transcript: Transcript
    n_messages: int
    n_tokens: int
    text: str
    session: object  # Session.checkpoint()
    dirty: bool
    system: str | None
    tools: list[dict] | None


def _split_partial(text: str, in_reasoning: bool) -> tuple[str, str]:
    if in_reasoning:
        return text, ""
    reasoning, sep, content = text.partition("</think>")
    return (reasoning, content) if sep else ("", text)
