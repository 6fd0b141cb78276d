"""`ds4 agent -p --output-format stream-json | json`: the lines Claude Code writes, so that
scripts written for `claude -p` read ds4 agent's runs unchanged. docs/agent.md lists every field.

stream-json: one JSON object per line: a ``system``/``init`` line first; an ``assistant``
message after each model turn (thinking, text and tool_use blocks); a ``user`` message with one
``tool_result`` block after each tool call; a ``system``/``compact_boundary`` line where the
conversation was compacted; a ``result`` line last (final text, stop reason, usage, duration,
permission denials). json: that ``result`` object alone. ds4's own notes go to stderr.

Tool-use ids are ours ("toolu_ds4_..."), stable within a run; ``session_id`` names the run.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..conversation import Event

# ds4's approval modes as Claude Code's permission modes.
PERMISSION_MODES = {"ask": "default", "auto-edit": "acceptEdits", "yolo": "bypassPermissions"}
# How a model turn ended (Event.finish) as an Anthropic stop_reason.
TURN_STOP = {"eos": "end_turn", "length": "max_tokens", "context": "model_context_window_exceeded",
             "interrupted": None}
# A run's stop (agent.STOP_REASONS) as the result's subtype.
RESULT_SUBTYPE = {"end_turn": "success", "refused": "success", "max_tokens": "success",
                  "context": "error_during_execution",
                  "error": "error_during_execution", "interrupted": "error_during_execution"}


def _usage(u: dict) -> dict:
    return {"input_tokens": u.get("input_tokens", 0), "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.get("cache_read_input_tokens", 0), "output_tokens": u.get("output_tokens", 0)}


class ClaudeStream:
    """Turns one agent run's events into Claude Code's stream-json messages."""

    def __init__(self, model: str, cwd: str, tools: list[str], permission_mode: str,
                 mcp_servers: list[tuple[str, bool]] = (), version: str = "") -> None:
        self.model, self.cwd, self.tools = model, cwd, tools
        self.permission_mode = PERMISSION_MODES.get(permission_mode, "default")
        self.mcp_servers = list(mcp_servers)
        self.version = version
        self.session_id = str(uuid.uuid4())
        self.started = time.perf_counter()
        self._ids: list[str] = []  # tool_use ids of the last assistant turn's calls, in order
        self._calls = 0
        self.denials: list[dict] = []
        self.last_text = ""
        self.last_stop: str | None = None
        self.errors: list[str] = []

    def _line(self, d: dict) -> dict:
        d.setdefault("session_id", self.session_id)
        d["uuid"] = str(uuid.uuid4())
        return d

    def init(self) -> dict:
        return self._line({"type": "system", "subtype": "init", "cwd": self.cwd, "session_id": self.session_id,
                           "tools": self.tools, "mcp_servers": [{"name": n, "status": "connected" if ok else "failed"}
                                                                for n, ok in self.mcp_servers],
                           "model": self.model, "permissionMode": self.permission_mode, "slash_commands": [],
                           "apiKeySource": "none", "output_style": "default", "ds4agent_version": self.version})

    def event(self, ev: Event) -> list[dict]:
        """The lines for one event (most events have none: they stream inside a turn)."""
        data = ev.data or {}
        if ev.kind == "turn":
            return [self._assistant(data)]
        if ev.kind in ("tool", "refused") and "index" in data:
            i = data["index"]
            ident = self._ids[i] if i < len(self._ids) else self._new_id()
            if data.get("denied"):
                self.denials.append({"tool_name": data.get("name", ""), "tool_use_id": ident,
                                     "tool_input": data.get("input") if isinstance(data.get("input"), dict) else {}})
            block = {"tool_use_id": ident, "type": "tool_result", "content": data.get("result", ev.text),
                     "is_error": not ev.ok}
            return [self._line({"type": "user", "message": {"role": "user", "content": [block]},
                                "parent_tool_use_id": None})]
        if ev.kind == "compacted":
            return [self._line({"type": "system", "subtype": "compact_boundary",
                                "compact_metadata": {"trigger": "auto", "pre_tokens": 0}})]
        if ev.kind == "error":
            self.errors.append(ev.text)
        return []

    def _new_id(self) -> str:
        self._calls += 1
        return f"toolu_ds4_{self.session_id[:8]}_{self._calls:04d}"

    def _assistant(self, data: dict) -> dict:
        m = data.get("message") or {}
        content: list[dict[str, Any]] = []
        if (m.get("reasoning_content") or "").strip():
            content.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
        text = m.get("content") or ""
        if text.strip():
            content.append({"type": "text", "text": text})
        self._ids = []
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            ident = self._new_id()
            self._ids.append(ident)
            content.append({"type": "tool_use", "id": ident, "name": fn.get("name", ""),
                            "input": _input(fn.get("arguments"))})
        stop = "tool_use" if self._ids else TURN_STOP.get(data.get("finish", ""), None)
        self.last_text, self.last_stop = text, stop
        return self._line({"type": "assistant", "message": {
            "id": f"msg_ds4_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": _usage(data.get("usage") or {})},
            "parent_tool_use_id": None})

    def result(self, stop: str, usage: dict, context: int, stop_text: str = "") -> dict:
        """The last line: how the run ended (``stop``: agent.STOP_REASONS)."""
        subtype = RESULT_SUBTYPE.get(stop, "error_during_execution")
        u = _usage(usage)
        d = {"type": "result", "subtype": subtype, "is_error": subtype != "success",
             "duration_ms": int((time.perf_counter() - self.started) * 1000),
             "duration_api_ms": int(usage.get("model_seconds", 0.0) * 1000), "num_turns": usage.get("turns", 0),
             "result": self.last_text, "stop_reason": self.last_stop, "session_id": self.session_id,
             "total_cost_usd": 0,
             "usage": {**u, "server_tool_use": {"web_search_requests": 0}, "service_tier": "standard"},
             "modelUsage": {self.model: {"inputTokens": u["input_tokens"], "outputTokens": u["output_tokens"],
                                         "cacheReadInputTokens": u["cache_read_input_tokens"],
                                         "cacheCreationInputTokens": 0, "webSearchRequests": 0, "costUSD": 0,
                                         "contextWindow": context}},
             "permission_denials": self.denials, "ds4_stop_reason": stop}
        if subtype != "success":
            d["errors"] = self.errors + ([stop_text] if stop_text else []) or [stop]
        return self._line(d)


def _input(arguments: Any) -> Any:
    if isinstance(arguments, str):
        import json

        try:
            value = json.loads(arguments)
        except ValueError:
            return {"_raw": arguments}
        return value if isinstance(value, dict) else {"_value": value}
    return arguments if isinstance(arguments, dict) else {}
