"""Incremental parser for a completion as it is sampled (the streaming twin of template.parse).

Feed decoded text (or raw bytes; they are decoded incrementally, so a character split across
tokens is never emitted half) and get events:

* ``reasoning`` / ``content`` deltas, with any suffix that could still begin a marker
  (``</think>``, the end-of-sentence token, the blank line + ``<｜DSML｜tool_calls``) held back
  until the next text decides;
* ``call_start`` (index, name), ``call_args`` (index, JSON text delta), ``call`` (index, name,
  complete arguments) for each DSML invoke, and ``tool_block`` with the block's exact sampled
  text, so a transcript can replay it byte for byte;
* per parameter of an invoke: ``param_start`` (index, name = the key, text = "true" for a
  string value, "false" for JSON), ``param_text`` (raw value deltas, held like the value's
  closing tag) and ``param_end`` (the whole raw value), for front ends that re-encode the
  arguments themselves while they stream (the server's compact JSON);
* ``dsml_in_reasoning``: DSML markup inside the thinking section is reported, never executed;
* ``done`` at end of sentence, or ``error`` (kind, message) when the DSML breaks the grammar.

``finish()`` flushes held text and returns the final events, including ``result`` with the
authoritative ``template.parse`` of the whole completion.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field

from .template import (
    BLOCK_START,
    DSML,
    EOS,
    INVOKE_CLOSE,
    INVOKE_OPEN,
    PARAM_CLOSE,
    PARAM_OPEN,
    THINK_CLOSE,
    TOOL_CALLS_CLOSE,
    parse,
)

_PARAM_HEAD = re.compile(r' name="(.*?)" string="(true|false)">', re.DOTALL)
_PARAM_END = PARAM_CLOSE[1:-1]  # the official grammar ends a value at "/｜DSML｜parameter"


@dataclass
class ParseEvent:
    kind: str
    text: str = ""
    index: int = -1
    name: str = ""
    arguments: str = ""
    result: dict | None = None


def _held(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of the markers."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:k]):
                best = k
                break
    return best


@dataclass
class _Call:
    name: str
    params: dict[str, tuple[bool, str]] = field(default_factory=dict)
    sent: str = ""  # argument text already emitted


class StreamParser:
    def __init__(self, thinking_mode: str = "thinking") -> None:
        self.thinking_mode = thinking_mode
        self.phase = "reasoning" if thinking_mode == "thinking" else "content"
        self.text = ""  # everything fed so far (decoded)
        self.pos = 0  # start of the unconsumed part of self.text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._calls: list[_Call] = []
        self._block_start = -1
        self._state = "gap"  # inside a tool block: gap | header | param_head | value | after_value
        self._value_start = 0
        self._value_sent = 0  # end of the value text already handed out as param_text
        self._param: tuple[str, bool] | None = None
        self.tool_blocks: list[str] = []
        self.failed = False

    # -- input ----------------------------------------------------------------------------
    def feed(self, data: str | bytes) -> list[ParseEvent]:
        if isinstance(data, bytes):
            data = self._decoder.decode(data)
        self.text += data
        return self._advance(final=False)

    def finish(self) -> list[ParseEvent]:
        self.text += self._decoder.decode(b"", final=True)
        events = self._advance(final=True)
        events.append(ParseEvent("result", result=parse(self.text, self.thinking_mode)))
        return events

    def malformed_text(self) -> str:
        """After a tool block broke the grammar (an ``error`` event): the block's text, from the
        blank line before it to the end of what was fed, without the end of sentence, so that a
        front end can pass the failed block on as the answer's text. Empty if no block began."""
        if self._block_start < 0:
            return ""
        return self.text[self._block_start - 2 :].replace(EOS, "")

    # -- the state machine ------------------------------------------------------------------
    def _emit_text(self, kind: str, upto: int, events: list[ParseEvent]) -> None:
        if upto > self.pos:
            chunk = self.text[self.pos : upto]
            events.append(ParseEvent(kind, chunk))
            if kind == "reasoning" and DSML in chunk:
                events.append(ParseEvent("dsml_in_reasoning", chunk))
            self.pos = upto

    def _advance(self, final: bool) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        progressed = True
        while progressed and not self.failed:
            progressed = False
            if self.phase == "reasoning":
                k = self.text.find(THINK_CLOSE, self.pos)
                if k >= 0:
                    self._emit_text("reasoning", k, events)
                    self.pos = k + len(THINK_CLOSE)
                    self.phase = "content"
                    progressed = True
                else:
                    hold = 0 if final else _held(self.text[self.pos :], (THINK_CLOSE,))
                    self._emit_text("reasoning", len(self.text) - hold, events)
            elif self.phase == "content":
                e, b = self.text.find(EOS, self.pos), self.text.find(BLOCK_START, self.pos)
                if b >= 0 and (e < 0 or b < e):
                    self._emit_text("content", b, events)
                    self._block_start = b + 2  # the block's own text starts at "<"
                    self.pos = b + len(BLOCK_START)
                    self.phase = "tools"
                    self._state = "gap"
                    progressed = True
                elif e >= 0:
                    self._emit_text("content", e, events)
                    self.pos = e + len(EOS)
                    self.phase = "end"
                    events.append(ParseEvent("done"))
                    progressed = True
                else:
                    hold = 0 if final else _held(self.text[self.pos :], (EOS, BLOCK_START))
                    self._emit_text("content", len(self.text) - hold, events)
            elif self.phase == "tools":
                progressed = self._tools_step(events, final)
            elif self.phase == "after_tools":
                rest = self.text[self.pos :]
                if rest.startswith(EOS):
                    self.pos += len(EOS)
                    self.phase = "end"
                    events.append(ParseEvent("done"))
                    progressed = True
                elif rest and not EOS.startswith(rest):
                    self._fail(events, "content_after_tool_calls", "text after the tool block")
            elif self.phase == "end" and len(self.text) > self.pos:
                self._fail(events, "content_after_eos", "text after the end-of-sentence token")
        return events

    def _fail(self, events: list[ParseEvent], kind: str, message: str) -> None:
        self.failed = True
        events.append(ParseEvent("error", message, name=kind))

    def _tools_step(self, events: list[ParseEvent], final: bool) -> bool:
        t, p = self.text, self.pos
        if self._state == "gap":  # expecting ">\n" then an invoke or the block's end
            if len(t) - p < 2:
                return False
            if t[p : p + 2] != ">\n":
                self._fail(events, "dsml_layout", "expected '>' and a newline between DSML tags")
                return False
            rest = t[p + 2 :]
            if rest.startswith(TOOL_CALLS_CLOSE):
                end = p + 2 + len(TOOL_CALLS_CLOSE)
                self.tool_blocks.append(t[self._block_start : end])
                events.append(ParseEvent("tool_block", t[self._block_start : end]))
                self.pos = end
                self.phase = "after_tools"
                return True
            if rest.startswith(INVOKE_OPEN):
                self.pos = p + 2 + len(INVOKE_OPEN)
                self._state = "header"
                return True
            if not (TOOL_CALLS_CLOSE.startswith(rest) or INVOKE_OPEN.startswith(rest)):
                self._fail(events, "dsml_layout", "expected an invoke or the end of the tool block")
            return False
        if self._state == "header":  # ' name="X">\n' then a parameter or the invoke's end
            m = re.match(r'\s*name="(.*?)">\n', t[p:], re.DOTALL)
            if not m:
                return False
            nxt = p + m.end()
            rest = t[nxt:]
            # A parameterless invoke renders an empty line before its end.
            follow = {PARAM_OPEN: "param", INVOKE_CLOSE[:-1]: "end", "\n" + INVOKE_CLOSE[:-1]: "end"}
            hit = next((f for f in follow if rest.startswith(f)), None)
            if hit is None:
                if not any(f.startswith(rest) for f in follow):
                    self._fail(events, "dsml_invoke", "malformed invoke header")
                return False
            call = _Call(m.group(1))
            self._calls.append(call)
            events.append(ParseEvent("call_start", index=len(self._calls) - 1, name=call.name))
            self.pos = nxt + len(hit)
            if follow[hit] == "param":
                self._state = "param_head"
            else:
                self._finish_call(events)
            return True
        call = self._calls[-1]
        if self._state == "param_head":
            m = _PARAM_HEAD.match(t, p)
            if not m:
                if len(t) - p > 4096 or ">" in t[p:]:
                    self._fail(events, "dsml_parameter",
                               'malformed parameter (expected name="..." string="true|false")')
                return False
            key, is_str = m.group(1), m.group(2) == "true"
            if key in call.params:
                self._fail(events, "dsml_duplicate_parameter", f"parameter {key!r} given twice")
                return False
            self._param = (key, is_str)
            call.params[key] = (is_str, "")
            events.append(ParseEvent("param_start", "true" if is_str else "false", index=len(self._calls) - 1,
                                     name=key))
            self._send_args(events, call, partial=True)
            self.pos = m.end()
            self._value_start = self._value_sent = self.pos
            self._state = "value"
            return True
        if self._state == "value":
            k = t.find(_PARAM_END, p)
            key, is_str = self._param
            if k < 0:
                hold = _held(t[self._value_start :], ("<" + _PARAM_END,))
                end = max(self._value_start, len(t) - hold)
                call.params[key] = (is_str, t[self._value_start : end])
                self._send_value(events, key, end)
                self._send_args(events, call, partial=True)
                return False
            if k == 0 or t[k - 1] != "<":
                self._fail(events, "dsml_parameter", "parameter value not closed by </｜DSML｜parameter>")
                return False
            call.params[key] = (is_str, t[self._value_start : k - 1])
            self._send_value(events, key, k - 1)
            events.append(ParseEvent("param_end", t[self._value_start : k - 1], index=len(self._calls) - 1, name=key))
            self.pos = k + len(_PARAM_END)
            self._state = "after_value"
            return True
        if self._state == "after_value":  # ">\n" then another parameter or the invoke's end
            rest = t[p:]
            if rest.startswith(">\n" + PARAM_OPEN):
                self.pos = p + 2 + len(PARAM_OPEN)
                self._state = "param_head"
                return True
            if rest.startswith(">\n" + INVOKE_CLOSE[:-1]):
                self.pos = p + 2 + len(INVOKE_CLOSE) - 1
                self._finish_call(events)
                return True
            if not ((">\n" + PARAM_OPEN).startswith(rest) or (">\n" + INVOKE_CLOSE[:-1]).startswith(rest)):
                self._fail(events, "dsml_layout", "expected '>' and a newline after a parameter")
            return False
        return False

    def _send_value(self, events: list[ParseEvent], key: str, end: int) -> None:
        if end > self._value_sent:
            events.append(ParseEvent("param_text", self.text[self._value_sent : end], index=len(self._calls) - 1,
                                     name=key))
            self._value_sent = end

    def _args_text(self, call: _Call, partial: bool) -> str:
        parts = []
        for i, (k, (is_str, v)) in enumerate(call.params.items()):
            open_value = partial and i == len(call.params) - 1
            if is_str:
                enc = json.dumps(v, ensure_ascii=False)
                parts.append(f"{json.dumps(k, ensure_ascii=False)}: {enc[:-1] if open_value else enc}")
            else:
                parts.append(f"{json.dumps(k, ensure_ascii=False)}: {v}")
        return "{" + ", ".join(parts) + ("" if partial else "}")

    def _send_args(self, events: list[ParseEvent], call: _Call, partial: bool) -> None:
        text = self._args_text(call, partial)
        if text.startswith(call.sent) and len(text) > len(call.sent):
            events.append(ParseEvent("call_args", text[len(call.sent) :], index=len(self._calls) - 1))
            call.sent = text

    def _finish_call(self, events: list[ParseEvent]) -> None:
        call = self._calls[-1]
        final = self._args_text(call, partial=False)
        self._send_args(events, call, partial=False)
        events.append(ParseEvent("call", index=len(self._calls) - 1, name=call.name, arguments=final))
        self._state = "gap"  # pos is at the ">" of the invoke's closing tag
        self._param = None


def events_text(events: list[ParseEvent], kind: str) -> str:
    return "".join(e.text for e in events if e.kind == kind)
