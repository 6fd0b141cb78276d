"""The worker's events in each API's own shapes: one JSON body, or SSE events (docs/server.md §1).

Every format accumulates the whole answer (for the non-streamed body and for the final events
that carry it) and, when streaming, turns each event into that API's deltas as it comes.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from .requests import Spec
from .worker import JobEvent


def _dumps(d: Any) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def data(d: Any) -> str:
    return f"data: {_dumps(d)}\n\n"


class Base:
    id_prefix = "chatcmpl-"

    def __init__(self, spec: Spec, n: int, prompt_tokens: int) -> None:
        self.spec = spec
        self.id = f"{self.id_prefix}{n}"
        self.created = int(time.time())
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict] = []  # {"id", "name", "arguments"}
        self.finish = "stop"
        self.usage: dict = {"prompt_tokens": prompt_tokens, "cached_tokens": 0, "completion_tokens": 0}
        self.stop_sequence: str | None = None

    def head(self) -> list[str]:
        return []

    def tail(self) -> list[str]:
        return []

    def error(self, message: str) -> str:
        return f"event: error\ndata: {_dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"

    def take(self, ev: JobEvent) -> None:
        if ev.kind == "start":
            self.usage.update(ev.data or {})
        elif ev.kind == "reasoning":
            self.reasoning += ev.text
        elif ev.kind == "content":
            self.content += ev.text
        elif ev.kind == "tool_start":
            self.calls.append({"id": ev.id, "name": ev.name, "arguments": ""})
        elif ev.kind == "tool_args":
            self.calls[-1]["arguments"] += ev.text
        elif ev.kind == "done":
            self.finish = ev.text
            self.usage.update(ev.data or {})
            self.stop_sequence = (ev.data or {}).get("stop_sequence")

    def event(self, ev: JobEvent) -> list[str]:
        self.take(ev)
        return self.stream(ev) if self.spec.stream else []

    def stream(self, ev: JobEvent) -> list[str]:
        return []

    @property
    def cached(self) -> int:
        return int(self.usage.get("cached_tokens", 0))

    def openai_usage(self) -> dict:
        p, c = self.usage["prompt_tokens"], self.usage["completion_tokens"]
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": self.cached},
                "completion_tokens_details": {"reasoning_tokens": 0}}

    def openai_finish(self) -> str:
        return {"length": "length", "tool_calls": "tool_calls"}.get(self.finish, "stop")


# -- OpenAI chat -------------------------------------------------------------------------------

class ChatFormat(Base):
    def chunk(self, delta: dict, finish: str | None = None) -> str:
        return data({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                     "model": self.spec.model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    def head(self) -> list[str]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def stream(self, ev: JobEvent) -> list[str]:
        if ev.kind == "reasoning" and ev.text:
            return [self.chunk({"reasoning_content": ev.text})]
        if ev.kind == "content" and ev.text:
            return [self.chunk({"content": ev.text})]
        if ev.kind == "tool_start":
            return [self.chunk({"tool_calls": [{"index": len(self.calls) - 1, "id": ev.id, "type": "function",
                                                "function": {"name": ev.name, "arguments": ""}}]})]
        if ev.kind == "tool_args" and ev.text:
            return [self.chunk({"tool_calls": [{"index": len(self.calls) - 1, "function": {"arguments": ev.text}}]})]
        if ev.kind == "done":
            out = [self.chunk({}, self.openai_finish())]
            if self.spec.include_usage:
                out.append(data({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                  "model": self.spec.model, "choices": [], "usage": self.openai_usage()}))
            return out + ["data: [DONE]\n\n"]
        return []

    def final(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in self.calls]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.spec.model,
                "choices": [{"index": 0, "message": msg, "finish_reason": self.openai_finish(), "logprobs": None}],
                "usage": self.openai_usage()}


# -- OpenAI completions ------------------------------------------------------------------------

class CompletionFormat(Base):
    id_prefix = "cmpl-"

    def chunk(self, text: str, finish: str | None = None) -> str:
        return data({"id": self.id, "object": "text_completion", "created": self.created, "model": self.spec.model,
                     "choices": [{"text": text, "index": 0, "finish_reason": finish, "logprobs": None}]})

    def stream(self, ev: JobEvent) -> list[str]:
        if ev.kind == "content" and ev.text:
            return [self.chunk(ev.text)]
        if ev.kind == "done":
            out = [self.chunk("", self.openai_finish())]
            if self.spec.include_usage:
                out.append(data({"id": self.id, "object": "text_completion", "created": self.created,
                                  "model": self.spec.model, "choices": [], "usage": self.openai_usage()}))
            return out + ["data: [DONE]\n\n"]
        return []

    def final(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.spec.model,
                "choices": [{"text": self.content, "index": 0, "finish_reason": self.openai_finish(),
                             "logprobs": None}],
                "usage": self.openai_usage()}


# -- Anthropic messages ------------------------------------------------------------------------

class MessagesFormat(Base):
    id_prefix = "msg_"

    def __init__(self, spec: Spec, n: int, prompt_tokens: int) -> None:
        super().__init__(spec, n, prompt_tokens)
        self.id = "msg_" + secrets.token_hex(12)
        self.block: str | None = None  # the open content block's type
        self.index = -1
        self.started = False

    def ev(self, name: str, d: dict) -> str:
        return f"event: {name}\ndata: {_dumps({'type': name, **d})}\n\n"

    def error(self, message: str) -> str:
        return self.ev("error", {"error": {"type": "api_error", "message": message}})

    def anthropic_usage(self, output: int | None = None) -> dict:
        p = self.usage["prompt_tokens"]
        cached = self.cached
        written = p - cached
        return {"input_tokens": 0, "cache_read_input_tokens": cached, "cache_creation_input_tokens": written,
                "output_tokens": self.usage["completion_tokens"] if output is None else output}

    def stop_reason(self) -> str:
        reasons = {"length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}
        return reasons.get(self.finish, "end_turn")

    def _open(self, kind: str, block: dict) -> list[str]:
        out = self._close()
        self.index += 1
        self.block = kind
        return out + [self.ev("content_block_start", {"index": self.index, "content_block": block})]

    def _close(self) -> list[str]:
        if self.block is None:
            return []
        out = []
        if self.block == "thinking":
            out.append(self.ev("content_block_delta", {"index": self.index,
                                                       "delta": {"type": "signature_delta", "signature": self.id}}))
        self.block = None
        return out + [self.ev("content_block_stop", {"index": self.index})]

    def stream(self, ev: JobEvent) -> list[str]:
        out: list[str] = []
        if ev.kind == "start":
            msg = {"id": self.id, "type": "message", "role": "assistant", "model": self.spec.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": self.anthropic_usage(0)}
            return [self.ev("message_start", {"message": msg})]
        if ev.kind == "reasoning" and ev.text:
            if self.block != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self.ev("content_block_delta", {"index": self.index,
                                                       "delta": {"type": "thinking_delta", "thinking": ev.text}}))
        elif ev.kind == "content" and ev.text:
            if self.block != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self.ev("content_block_delta",
                               {"index": self.index, "delta": {"type": "text_delta", "text": ev.text}}))
        elif ev.kind == "tool_start":
            out += self._open("tool_use", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
        elif ev.kind == "tool_args" and ev.text:
            out.append(self.ev("content_block_delta", {"index": self.index,
                                                       "delta": {"type": "input_json_delta", "partial_json": ev.text}}))
        elif ev.kind == "done":
            if self.index < 0 or (not self.content and not self.calls):
                out += self._open("text", {"type": "text", "text": ""})
            out += self._close()
            out.append(self.ev("message_delta", {"delta": {"stop_reason": self.stop_reason(),
                                                           "stop_sequence": self.stop_sequence},
                                                 "usage": self.anthropic_usage()}))
            out.append(self.ev("message_stop", {}))
        return out

    def final(self) -> dict:
        content: list[dict] = []
        if self.reasoning:
            content.append({"type": "thinking", "thinking": self.reasoning, "signature": self.id})
        if self.content or not self.calls:
            content.append({"type": "text", "text": self.content})
        for c in self.calls:
            try:
                args = json.loads(c["arguments"])
            except (ValueError, RecursionError):
                args = {"arguments": c["arguments"]}
            content.append({"type": "tool_use", "id": c["id"], "name": c["name"], "input": args})
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.spec.model, "content": content,
                "stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence, "usage": self.anthropic_usage()}


# -- OpenAI Responses --------------------------------------------------------------------------

class ResponsesFormat(Base):
    def __init__(self, spec: Spec, n: int, prompt_tokens: int) -> None:
        super().__init__(spec, n, prompt_tokens)
        self.id = "resp_" + secrets.token_hex(12)
        self.seq = 0
        self.items: list[dict] = []  # output items, finished or open
        self.open: dict | None = None

    def ev(self, kind: str, d: dict) -> str:
        self.seq += 1
        return data({"type": kind, "sequence_number": self.seq - 1, **d})

    def error(self, message: str) -> str:
        return self.ev("error", {"code": "server_error", "message": message, "param": None})

    def status(self) -> str:
        return "completed" if self.finish in ("stop", "stop_sequence", "tool_calls") else \
            "incomplete" if self.finish in ("length", "cancelled") else "failed"

    def response(self, status: str) -> dict:
        p, c = self.usage["prompt_tokens"], self.usage["completion_tokens"]
        r = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
             "model": self.spec.model,
             "output": self.items, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
             "error": None, "incomplete_details": None,
             "usage": {"input_tokens": p, "input_tokens_details": {"cached_tokens": self.cached},
                       "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": p + c}}
        if status == "incomplete":
            r["incomplete_details"] = {"reason": "max_output_tokens"}
        if status == "failed":
            r["error"] = {"code": "server_error", "message": "generation failed"}
        return r

    def head(self) -> list[str]:
        r = self.response("in_progress")
        return [self.ev("response.created", {"response": r}), self.ev("response.in_progress", {"response": r})]

    def _item_index(self) -> int:
        return len(self.items) - 1

    def _close(self) -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        i = self._item_index()
        out = []
        if item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            out.append(self.ev("response.reasoning_summary_text.done", {"item_id": item["id"], "output_index": i,
                                                                        "summary_index": 0, "text": text}))
            out.append(self.ev("response.reasoning_summary_part.done", {"item_id": item["id"], "output_index": i,
                                                                        "summary_index": 0,
                                                                        "part": item["summary"][0]}))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self.ev("response.output_text.done",
                               {"item_id": item["id"], "output_index": i, "content_index": 0,
                                                             "text": part["text"], "logprobs": []}))
            out.append(self.ev("response.content_part.done", {"item_id": item["id"], "output_index": i,
                                                              "content_index": 0, "part": part}))
        elif item["type"] == "function_call":
            out.append(self.ev("response.function_call_arguments.done", {"item_id": item["id"], "output_index": i,
                                                                         "name": item["name"],
                                                                         "arguments": item["arguments"]}))
        item["status"] = "completed"
        out.append(self.ev("response.output_item.done", {"output_index": i, "item": item}))
        return out

    def _open(self, item: dict) -> list[str]:
        out = self._close()
        self.items.append(item)
        self.open = item
        return out + [self.ev("response.output_item.added", {"output_index": self._item_index(), "item": item})]

    def take(self, ev: JobEvent) -> None:
        super().take(ev)
        # Non-streamed bodies build the same items as the stream.
        if ev.kind == "reasoning" and ev.text:
            if self.open is None or self.open["type"] != "reasoning":
                self._new("reasoning")
            self.open["summary"][0]["text"] += ev.text
        elif ev.kind == "content" and ev.text:
            if self.open is None or self.open["type"] != "message":
                self._new("message")
            self.open["content"][0]["text"] += ev.text
        elif ev.kind == "tool_start":
            self._new("function_call", ev)
        elif ev.kind == "tool_args":
            self.open["arguments"] += ev.text

    def _new(self, kind: str, ev: JobEvent | None = None) -> None:
        if kind == "reasoning":
            item = {"id": "rs_" + secrets.token_hex(12), "type": "reasoning", "status": "in_progress",
                    "summary": [{"type": "summary_text", "text": ""}]}
        elif kind == "message":
            item = {"id": "msg_" + secrets.token_hex(12), "type": "message", "status": "in_progress",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": []}]}
        else:
            item = {"id": "fc_" + secrets.token_hex(12), "type": "function_call", "status": "in_progress",
                    "name": ev.name, "call_id": ev.id, "arguments": ""}
        self._pending_open = item
        if not self.spec.stream:
            if self.open is not None:
                self.open["status"] = "completed"
            self.items.append(item)
            self.open = item

    def event(self, ev: JobEvent) -> list[str]:
        if not self.spec.stream:
            self.take(ev)
            if ev.kind == "done" and self.open is not None:
                self.open["status"] = "completed"
            return []
        Base.take(self, ev)
        out: list[str] = []
        if ev.kind == "reasoning" and ev.text:
            if self.open is None or self.open["type"] != "reasoning":
                self._new("reasoning")
                out += self._open(self._pending_open)
                out.append(self.ev("response.reasoning_summary_part.added", {
                    "item_id": self.open["id"], "output_index": self._item_index(), "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""}}))
            self.open["summary"][0]["text"] += ev.text
            out.append(self.ev("response.reasoning_summary_text.delta", {
                "item_id": self.open["id"], "output_index": self._item_index(), "summary_index": 0, "delta": ev.text}))
        elif ev.kind == "content" and ev.text:
            if self.open is None or self.open["type"] != "message":
                self._new("message")
                out += self._open(self._pending_open)
                out.append(self.ev("response.content_part.added", {
                    "item_id": self.open["id"], "output_index": self._item_index(), "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}))
            self.open["content"][0]["text"] += ev.text
            out.append(self.ev("response.output_text.delta", {
                "item_id": self.open["id"], "output_index": self._item_index(), "content_index": 0, "delta": ev.text,
                "logprobs": []}))
        elif ev.kind == "tool_start":
            self._new("function_call", ev)
            out += self._open(self._pending_open)
        elif ev.kind == "tool_args" and ev.text:
            self.open["arguments"] += ev.text
            out.append(self.ev("response.function_call_arguments.delta", {
                "item_id": self.open["id"], "output_index": self._item_index(), "delta": ev.text}))
        elif ev.kind == "done":
            out += self._close()
            status = self.status()
            names = {"completed": "response.completed", "incomplete": "response.incomplete"}
            name = names.get(status, "response.failed")
            out.append(self.ev(name, {"response": self.response(status)}))
        return out

    def final(self) -> dict:
        return self.response(self.status())
