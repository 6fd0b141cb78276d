"""One reply of the model as a stream of events: the one generation loop of every front end.

Chat and agent turns (turns.py), `ds4 -p` (ui/oneshot.py) and the server (server/worker.py)
all sample through ``Reply``. It runs Session.generate from the session's current logits, parses
the completion as it streams (protocol/streamparse.py) or decodes it as plain text, applies stop
strings, cancellation and the token limit, and says why the reply ended. What a front end does
with the events (show them, keep the turn in a transcript, turn them into an API's chunks, give
tool calls their ids) stays with it; where front ends need different rules, the rule is a
parameter here, named for what it decides.

Events (``ReplyEvent.kind``):
  reasoning, content            text as it streams (content after the stop strings' hold-back)
  call_start                    a tool call's name (index), as soon as it is known
  param_start / param_text / param_end
                                one parameter of the call (name = the key; param_start's text is
                                "true" for a string value), as the parser gives them
  call                          the call complete (name, arguments as JSON text)
  tool_block                    the tool-call block's exact sampled text, for a byte-exact replay
  malformed                     a tool block broke the grammar (text: the parser's message); with
                                malformed="text" the block's text follows as content
  done                          the last event; ``finish`` says why (FINISHES), ``tokens`` and
                                ``seconds`` are the reply's usage (tokens sampled, time spent)
"""

from __future__ import annotations

import codecs
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from ..engine import SamplingParams
from ..protocol import StreamParser

if TYPE_CHECKING:
    from ..engine import Session
    from ..modelfile import Tokenizer

# Why a reply ended: the model ended it (eos), the token limit (length), the context is full
# (context), a stop string matched (stop_sequence), a tool block ended with stop_at_tools
# (tool_calls), ``cancel`` was set (cancelled; the last sampled token is kept, not evaluated),
# or the model ended inside a tool block (error).
FINISHES = ("eos", "length", "context", "stop_sequence", "tool_calls", "cancelled", "error")


@dataclass(frozen=True)
class ReplyEvent:
    kind: str
    text: str = ""
    index: int = -1
    name: str = ""
    arguments: str = ""
    finish: str = ""
    tokens: int = 0  # done: how many tokens the reply sampled
    seconds: float = 0.0  # done: the time spent producing them


class StopStrings:
    """Holds back text that could still be the start of a stop string; cuts at a match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that can go out now, and whether a stop string matched (nothing after it
        goes out)."""
        if not self.stops:
            return text, False
        self.buf += text
        hits = [(self.buf.find(s), s) for s in self.stops if s in self.buf]
        if hits:
            at, s = min(hits)
            out, self.buf, self.matched = self.buf[:at], "", s
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if self.buf.endswith(s[:k]):
                    hold = k
                    break
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


class Reply:
    """Iterate for the events of one reply (see the module's docstring).

    mode: "thinking" or "chat" parse the completion as that rendering mode's answer; "raw"
      decodes it as plain text (a prompt given fully rendered, /v1/completions).
    max_tokens: at most this many sampled tokens (0: none, finish "length").
    stops: strings that end the reply where they appear in the content (not themselves sent).
    cancel: checked after each token; when set the reply ends (finish "cancelled").
    stop_at_tools: end at the end of a tool block (finish "tool_calls") instead of sampling on
      to the end of sentence that follows it.
    malformed: what a tool block that breaks the grammar becomes: "report" (a malformed event;
      the parser reads no further) or "text" (a malformed event, then the block's text and the
      rest of the reply as content).
    parse_eos: hand the end-of-sentence token to the parser like any text, so that the final
      parse (``result``) sees the whole completion (a transcript needs it); otherwise it is
      never text, in any phase.

    After iteration (or while it runs): ``sampled`` (every token sampled, the last one not yet
    evaluated), ``seconds`` (time spent producing them), ``finish``, ``parser`` (None in raw
    mode), ``stop_matched``; ``result()`` gives the parser's final parse of the completion.
    """

    def __init__(self, session: "Session", tokenizer: "Tokenizer", sampling: SamplingParams, mode: str,
                 max_tokens: int, *, stops: Sequence[str] = (), cancel: threading.Event | None = None,
                 stop_at_tools: bool = False, malformed: str = "report", parse_eos: bool = False) -> None:
        if mode not in ("thinking", "chat", "raw"):
            raise ValueError(f"unknown reply mode {mode!r}")
        if malformed not in ("report", "text"):
            raise ValueError(f"unknown malformed-block rule {malformed!r}")
        self.session, self.tok = session, tokenizer
        self.sampling, self.mode, self.max_tokens = sampling, mode, max_tokens
        self.cancel = cancel
        self.stop_at_tools, self.malformed, self.parse_eos = stop_at_tools, malformed, parse_eos
        self.parser = StreamParser(mode) if mode != "raw" else None
        self.sampled: list[int] = []
        self.seconds = 0.0
        self.finish = ""
        self._stops = StopStrings(stops)
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # raw mode, and after a bad block
        self._as_text = mode == "raw"
        self._final: tuple[list, dict | None] | None = None

    @property
    def stop_matched(self) -> str | None:
        return self._stops.matched

    def __iter__(self) -> Iterator[ReplyEvent]:
        eos = self.tok.eos_id
        finish = "length"
        steps = self.session.generate(self.sampling, max_tokens=self.max_tokens) if self.max_tokens > 0 else iter(())
        for step in steps:
            self.sampled.append(step.token)
            self.seconds += step.seconds
            ended = ""
            for ev in self._feed(step.token, step.token == eos):
                if ev.kind == "done":  # a stop string or the end of a tool block
                    ended = ev.finish
                    break
                yield ev
            if ended:
                finish = ended
                break
            if step.finish:
                finish = step.finish
                p = self.parser
                if step.finish == "eos" and p is not None and p.phase == "tools" and not p.failed and not self._as_text:
                    finish = "error"  # a tool block that never closed (one already reported stays "eos")
                break
            if self.cancel is not None and self.cancel.is_set():
                finish = "cancelled"
                break
        if hasattr(steps, "close"):
            steps.close()  # the session is no longer generating (a batcher stops waiting for it)
        self.finish = finish
        if finish not in ("tool_calls", "stop_sequence"):
            yield from self._flush()
        yield ReplyEvent("done", finish=finish, tokens=len(self.sampled), seconds=self.seconds)

    def _feed(self, token: int, is_eos: bool) -> Iterator[ReplyEvent]:
        """The events of one sampled token; a "done" event here ends the reply (its finish)."""
        if self._as_text:
            if not is_eos:
                yield from self._content(self._text.decode(self.tok.token_bytes(token)))
            return
        if is_eos and not self.parse_eos:
            return
        for ev in self.parser.feed(self.tok.token_bytes(token)):
            k = ev.kind
            if k == "content":
                yield from self._content(ev.text)
            elif k in ("reasoning", "call_start", "param_start", "param_text", "param_end"):
                if k == "call_start":
                    # the content is over once a tool block begins: what the stop strings held
                    # can no longer become a match, and goes out before the call
                    rest = self._stops.flush()
                    if rest:
                        yield ReplyEvent("content", rest)
                yield ReplyEvent(k, ev.text, ev.index, ev.name)
            elif k == "call":
                yield ReplyEvent("call", index=ev.index, name=ev.name, arguments=ev.arguments)
            elif k == "tool_block":
                yield ReplyEvent("tool_block", ev.text)
                if self.stop_at_tools:
                    yield ReplyEvent("done", finish="tool_calls")
                    return
            elif k == "error":
                yield ReplyEvent("malformed", ev.text)
                if self.malformed == "text":
                    self._as_text = True
                    yield from self._content(self.parser.malformed_text())
                    return

    def _content(self, text: str) -> Iterator[ReplyEvent]:
        out, hit = self._stops.feed(text)
        if out:
            yield ReplyEvent("content", out)
        if hit:
            yield ReplyEvent("done", finish="stop_sequence")

    def _flush(self) -> Iterator[ReplyEvent]:
        """What was held back when the reply ends: the parser's last text (unless a bad block
        turned the reply into text), the decoder's, the stop strings'."""
        if self._as_text:
            tail = self._text.decode(b"", final=True)
            if tail:
                yield from (e for e in self._content(tail) if e.kind == "content")
        else:
            for ev in self._finish_parse()[0]:
                if ev.kind == "content":
                    yield from (e for e in self._content(ev.text) if e.kind == "content")
                elif ev.kind == "reasoning":
                    yield ReplyEvent("reasoning", ev.text)
        rest = self._stops.flush()
        if rest:
            yield ReplyEvent("content", rest)

    def _finish_parse(self) -> tuple[list, dict | None]:
        if self._final is None:
            tail = self.parser.finish() if self.parser is not None else []
            self._final = (tail, next((e.result for e in tail if e.kind == "result"), None))
        return self._final

    def result(self) -> dict | None:
        """The parser's final parse of the whole completion (template.parse: the message, or
        {"error": ...}); None in raw mode. Also for a reply left before its end."""
        return self._finish_parse()[1]
