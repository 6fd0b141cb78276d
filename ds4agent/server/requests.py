"""Each API's request body -> one prompt specification (docs/server.md §1).

OpenAI chat messages, Anthropic messages and Responses input items are all turned into the
message list the chat template renders (OpenAI shape: role, content, reasoning_content,
tool_calls with JSON-text arguments, tool messages with tool_call_id), so tool memory,
rendering and the cache see one form. Problems raise ApiError with the API's own wording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..engine import SamplingParams
from ..protocol import THINK_MAX_MIN_CTX


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, extra: dict | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.extra = extra or {}
        self.headers = headers or {}


@dataclass
class Defaults:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 32768
    mode: str = "thinking"  # "thinking" | "chat" | "max": when the request does not say
    ctx: int = 32768
    system: str | None = None  # --prefix-file: the system text of requests that bring none


@dataclass
class Spec:
    api: str
    messages: list[dict] | None  # None for /v1/completions (``prompt`` is the raw text)
    prompt: str | None
    mode: str  # "thinking" | "chat"
    effort: str | None  # None | "max"
    sampling: SamplingParams
    max_tokens: int
    stream: bool
    model: str
    stop: list[str]
    include_usage: bool = False
    summary: bool = False  # Responses: reasoning output requested
    # ds4's extra field "dir_steering": {"ffn": F, "attn": F} (scales of the server's steering
    # file for this request), "off", or absent (the server's own scales)
    steering: dict | str | None = None


def _check(cond: bool, message: str, param: str | None = None) -> None:
    if not cond:
        raise ApiError(400, message, param=param)


def _num(body: dict, key: str, kind: type, lo: float | None = None, hi: float | None = None) -> Any:
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else \
        isinstance(v, int) and not isinstance(v, bool)
    _check(ok, f"{key} must be a {'number' if kind is float else 'integer'}", key)
    _check((lo is None or v >= lo) and (hi is None or v <= hi), f"{key} is out of range", key)
    return v


def sampling_of(body: dict, d: Defaults,
                keys: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "seed")) -> SamplingParams:
    base = d.sampling
    t = _num(body, "temperature", float, 0, 100) if "temperature" in keys else None
    p = _num(body, "top_p", float, 0, 1) if "top_p" in keys else None
    k = _num(body, "top_k", int, 0, 1 << 30) if "top_k" in keys else None
    mp = _num(body, "min_p", float, 0, 1) if "min_p" in keys else None
    seed = _num(body, "seed", int) if "seed" in keys else None
    return SamplingParams(
        temperature=base.temperature if t is None else float(t),
        top_p=base.top_p if p is None or p == 0 else float(p),  # top_p 0 means "unset" to some clients
        min_p=base.min_p if mp is None else float(mp),
        top_k=base.top_k if k is None else min(int(k), 1024),
        seed=base.seed if seed is None else int(seed),
    )


def _max_tokens(body: dict, d: Defaults, *keys: str) -> int:
    for k in keys:
        v = _num(body, k, int, 0)
        if v is not None:
            return v
    return d.max_tokens


def _stop(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    _check(isinstance(value, list) and all(isinstance(s, str) for s in value),
           f"{key} must be a string or an array of strings", key)
    return list(value)


def thinking_of(body: dict, d: Defaults, effort_value: Any = None) -> tuple[str, str | None]:
    """(render mode, effort) from whichever field the API uses (docs/server.md §1.1)."""
    mode: str | None = None
    th = body.get("thinking")
    if isinstance(th, bool):
        mode = "thinking" if th else "chat"
    elif isinstance(th, dict):
        kind = th.get("type")
        mode = "chat" if kind == "disabled" else "thinking" if kind in ("enabled", "adaptive") else None
    if isinstance(body.get("think"), bool):
        mode = "thinking" if body["think"] else "chat"
    effort = effort_value if effort_value is not None else body.get("reasoning_effort")
    max_effort = False
    if isinstance(effort, str):
        e = effort.lower()
        if e == "none":
            mode = "chat"
        elif e in ("max", "xhigh") and mode != "chat":
            mode, max_effort = "thinking", e == "max"
        elif e in ("high", "medium", "low", "minimal") and mode != "chat":
            mode = "thinking"
    model = str(body.get("model") or "")
    if mode is None:
        if model == "deepseek-chat":
            mode = "chat"
        elif model == "deepseek-reasoner":
            mode = "thinking"
        else:
            mode = "chat" if d.mode == "chat" else "thinking"
            max_effort = d.mode == "max"
    if mode == "thinking" and max_effort and d.ctx >= THINK_MAX_MIN_CTX:
        return "thinking", "max"
    return mode, None


def _text(content: Any, where: str, allowed: tuple[str, ...] = ("text", "input_text", "output_text")) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    _check(isinstance(content, list), f"{where}: content must be a string or an array of parts")
    parts = []
    for p in content:
        if isinstance(p, str):
            parts.append(p)
        elif isinstance(p, dict) and (p.get("type") in allowed or ("text" in p and "type" not in p)):
            _check(isinstance(p.get("text", ""), str), f"{where}: text must be a string")
            parts.append(p.get("text", ""))
        elif isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image", "document", "input_file",
                                                        "input_audio"):
            raise ApiError(400, f"{where}: content of type {p.get('type')!r} is not supported (text only)")
        else:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise ApiError(400, f"{where}: content part of type {kind!r} is not supported")
    return "".join(parts)


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def _tools_openai(tools: Any) -> list[dict]:
    if tools is None:
        return []
    _check(isinstance(tools, list), "tools must be an array", "tools")
    out = []
    for t in tools:
        _check(isinstance(t, dict), "each tool must be an object", "tools")
        fn = t.get("function") if t.get("type", "function") == "function" and "function" in t else None
        if fn is None and t.get("type") == "function" and "name" in t:  # Responses API flat form
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        if fn is None:
            if t.get("type") not in (None, "function"):
                continue  # hosted tools (web search...) are not ours to run
            raise ApiError(400, "each tool needs a function with a name", "tools")
        _check(isinstance(fn.get("name"), str) and fn["name"], "each tool needs a name", "tools")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}})
    return out


def _with_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    if not tools:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": tools}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": tools}, *messages]


def _base(api: str, body: dict, d: Defaults, messages: list[dict] | None, prompt: str | None, mode: str,
          effort: str | None, sampling: SamplingParams, max_tokens: int, stop: list[str]) -> Spec:
    stream = body.get("stream", False)
    _check(isinstance(stream, bool) or stream is None, "stream must be a boolean", "stream")
    model = body.get("model") or "deepseek-v4-flash"
    _check(isinstance(model, str), "model must be a string", "model")
    if messages is not None and d.system:  # the server's default system text, where the client gave none
        if messages and messages[0]["role"] == "system":
            if not messages[0].get("content"):
                messages = [{**messages[0], "content": d.system}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": d.system}, *messages]
    spec = Spec(api, messages, prompt, mode, effort, sampling, max_tokens, bool(stream), model, stop)
    spec.steering = _steering(body)
    return spec


def _steering(body: dict) -> dict | str | None:
    """The request's "dir_steering": "off", or the scales it sets ({"ffn": F, "attn": F}, either)."""
    v = body.get("dir_steering")
    if v is None:
        return None
    if v == "off":
        return "off"
    _check(isinstance(v, dict) and v and set(v) <= {"ffn", "attn"},
           'dir_steering must be "off" or an object with "ffn" and/or "attn" scales', "dir_steering")
    for k, x in v.items():
        _check(isinstance(x, (int, float)) and not isinstance(x, bool) and -100 <= x <= 100,
               f"dir_steering.{k} must be a number in -100..100", "dir_steering")
    return {k: float(x) for k, x in v.items()}


# -- OpenAI chat -----------------------------------------------------------------------------

def chat(body: dict, d: Defaults) -> Spec:
    msgs = body.get("messages")
    _check(msgs is not None, "missing messages", "messages")
    _check(isinstance(msgs, list) and msgs, "messages must be a non-empty array", "messages")
    out: list[dict] = []
    for i, m in enumerate(msgs):
        _check(isinstance(m, dict) and isinstance(m.get("role"), str), f"messages[{i}] needs a role", "messages")
        role = m["role"]
        where = f"messages[{i}]"
        if role in ("system", "developer"):
            out.append({"role": "system", "content": _text(m.get("content"), where)})
        elif role == "user":
            out.append({"role": "user", "content": _text(m.get("content"), where)})
        elif role == "assistant":
            a: dict = {"role": "assistant", "content": _text(m.get("content"), where)}
            if isinstance(m.get("reasoning_content"), str):
                a["reasoning_content"] = m["reasoning_content"]
            calls = m.get("tool_calls") or []
            _check(isinstance(calls, list), f"{where}: tool_calls must be an array", "messages")
            a["tool_calls"] = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                _check(isinstance(fn, dict) and isinstance(fn.get("name"), str),
                       f"{where}: tool call without a function name",
                       "messages")
                a["tool_calls"].append({"id": c.get("id") or "", "type": "function",
                                        "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"))}})
            out.append(a)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id") or "",
                        "content": _text(m.get("content"), where)})
        else:
            raise ApiError(400, f"{where}: unknown role {role!r}", param="messages")
    tools = _tools_openai(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = []
    mode, effort = thinking_of(body, d)
    spec = _base("chat", body, d, _with_tools(out, tools), None, mode, effort, sampling_of(body, d),
                 _max_tokens(body, d, "max_completion_tokens", "max_tokens"), _stop(body.get("stop"), "stop"))
    so = body.get("stream_options")
    spec.include_usage = isinstance(so, dict) and bool(so.get("include_usage"))
    return spec


# -- OpenAI completions ----------------------------------------------------------------------

def completions(body: dict, d: Defaults) -> Spec:
    prompt = body.get("prompt")
    _check(prompt is not None, "missing prompt", "prompt")
    if isinstance(prompt, list):
        _check(all(isinstance(p, str) for p in prompt), "prompt must be a string or an array of strings", "prompt")
        prompt = "".join(prompt)
    _check(isinstance(prompt, str), "prompt must be a string or an array of strings", "prompt")
    spec = _base("completions", body, d, None, prompt, "raw", None, sampling_of(body, d),
                 _max_tokens(body, d, "max_tokens"), _stop(body.get("stop"), "stop"))
    so = body.get("stream_options")
    spec.include_usage = isinstance(so, dict) and bool(so.get("include_usage"))
    return spec


# -- Anthropic messages ----------------------------------------------------------------------

def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    _check(isinstance(system, list), "system must be a string or an array of text blocks", "system")
    out = ""
    for b in system:
        _check(isinstance(b, dict) and isinstance(b.get("text", ""), str), "system blocks must be text blocks",
               "system")
        text = b.get("text", "")
        # Claude Code puts a per-request billing header first ("x-anthropic-billing-header: ...");
        # it changes with every request and would make the whole prompt a cache miss.
        if text.startswith("x-anthropic-"):
            continue
        if out and not out.endswith("\n"):
            out += "\n"
        out += text
    return out


def _tool_result(content: Any) -> Any:
    if isinstance(content, list):
        parts = []
        for b in content:
            if isinstance(b, dict) and b.get("type") == "text":
                parts.append(b.get("text", ""))
            elif isinstance(b, dict):
                parts.append(f"[{b.get('type')} omitted]")
        return "\n\n".join(parts)
    return "" if content is None else content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def anthropic_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    _check(msgs is not None, "messages: Field required", "messages")
    _check(isinstance(msgs, list), "messages: Input should be a valid list", "messages")
    out: list[dict] = []
    system = _system_text(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        _check(isinstance(m, dict) and m.get("role") in ("user", "assistant", "system"),
               f"{where}.role: must be user, assistant or system", "messages")
        content = m.get("content")
        if m["role"] == "system":
            # Claude Code sends system messages between turns (agent lists, reminders). The
            # template has no system turn there: the text joins the user turn it stands in.
            text = _system_text(content)
            if not out:
                out.append({"role": "system", "content": text})
            elif text:
                out.append({"role": "user", "content": text})
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        _check(isinstance(blocks, list), f"{where}.content: must be a string or an array of blocks", "messages")
        if m["role"] == "assistant":
            a: dict = {"role": "assistant", "content": "", "tool_calls": []}
            thinking = []
            for b in blocks:
                _check(isinstance(b, dict), f"{where}.content: blocks must be objects", "messages")
                kind = b.get("type")
                if kind == "text":
                    a["content"] += b.get("text", "")
                elif kind == "thinking":
                    thinking.append(b.get("thinking", ""))
                elif kind == "tool_use":
                    _check(isinstance(b.get("name"), str), f"{where}: tool_use without a name", "messages")
                    a["tool_calls"].append({"id": b.get("id") or "", "type": "function",
                                            "function": {"name": b["name"], "arguments": _arguments(b.get("input"))}})
                elif kind != "redacted_thinking":
                    raise ApiError(400, f"{where}: block of type {kind!r} is not supported")
            if thinking:
                a["reasoning_content"] = "".join(thinking)
            out.append(a)
        else:
            text: list[str] = []
            for b in blocks:
                _check(isinstance(b, dict), f"{where}.content: blocks must be objects", "messages")
                if b.get("type") == "tool_result":
                    if text:
                        out.append({"role": "user", "content": "".join(text)})
                        text = []
                    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id") or "",
                                "content": _tool_result(b.get("content"))})
                else:
                    text.append(_text([b], where))
            if text or not blocks:
                out.append({"role": "user", "content": "".join(text)})
    return out


def _tools_anthropic(tools: Any) -> list[dict]:
    if tools is None:
        return []
    _check(isinstance(tools, list), "tools: Input should be a valid list", "tools")
    out = []
    for t in tools:
        _check(isinstance(t, dict) and isinstance(t.get("name"), str), "tools: each tool needs a name", "tools")
        if "input_schema" not in t and t.get("type") not in (None, "custom"):
            continue  # server tools (web search, ...) are not ours to run
        fn = {"name": t["name"]}
        if t.get("description"):
            fn["description"] = t["description"]
        fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def messages(body: dict, d: Defaults) -> Spec:
    out = anthropic_messages(body)
    tools = _tools_anthropic(body.get("tools"))
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "none":
        tools = []
    oc = body.get("output_config")
    effort = oc.get("effort") if isinstance(oc, dict) else None
    mode, eff = thinking_of(body, d, effort)
    mt = body.get("max_tokens")
    _check(mt is None or (isinstance(mt, int) and not isinstance(mt, bool) and mt >= 0),
           "max_tokens: Input should be a valid integer", "max_tokens")
    return _base("messages", body, d, _with_tools(out, tools), None, mode, eff,
                 sampling_of(body, d, ("temperature", "top_p", "top_k")), _max_tokens(body, d, "max_tokens"),
                 _stop(body.get("stop_sequences"), "stop_sequences"))


def count_tokens_messages(body: dict, d: Defaults) -> Spec:
    return messages({**body, "stream": False}, d)


# -- OpenAI Responses ------------------------------------------------------------------------

def responses(body: dict, d: Defaults) -> Spec:
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise ApiError(400, f"{key} is not supported; replay the full input instead", param=key)
    items = body.get("input")
    _check(items is not None, "missing input", "input")
    out: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        _check(isinstance(instructions, str), "instructions must be a string", "instructions")
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    _check(isinstance(items, list), "input must be a string or an array of items", "input")
    reasoning: str | None = None
    for i, it in enumerate(items):
        where = f"input[{i}]"
        _check(isinstance(it, dict), f"{where} must be an object", "input")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            _check(role in ("user", "assistant", "system", "developer"), f"{where}: unknown role {role!r}", "input")
            text = _text(it.get("content"), where)
            if role == "assistant":
                a = {"role": "assistant", "content": text, "tool_calls": []}
                if reasoning is not None:
                    a["reasoning_content"], reasoning = reasoning, None
                out.append(a)
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            _check(isinstance(it.get("name"), str), f"{where}: function_call without a name", "input")
            if kind == "function_call":
                args = _arguments(it.get("arguments"))
            else:
                args = json.dumps({"input": it.get("input", "")})
            call = {"id": it.get("call_id") or "", "type": "function",
                    "function": {"name": it["name"], "arguments": args}}
            if out and out[-1]["role"] == "assistant" and (out[-1]["tool_calls"] or not out[-1].get("_closed")):
                out[-1]["tool_calls"].append(call)
            else:
                a = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    a["reasoning_content"], reasoning = reasoning, None
                out.append(a)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = it.get("output")
            out.append({"role": "tool", "tool_call_id": it.get("call_id") or "",
                        "content": output if isinstance(output, str) else _tool_result(output)})
        elif kind == "reasoning":
            parts = [s.get("text", "") for s in it.get("summary") or [] if isinstance(s, dict)]
            parts += [c.get("text", "") for c in it.get("content") or [] if isinstance(c, dict)]
            reasoning = (reasoning or "") + "".join(parts)
        # other item types (hosted tool calls, references) carry nothing the model can use
    # A text-only assistant message followed by function calls is one turn; no other merging.
    for m in out:
        m.pop("_closed", None)
    tools = _tools_openai(body.get("tools"))
    tc = body.get("tool_choice")
    if tc not in (None, "auto", "none", "required"):
        raise ApiError(400, "forced tool_choice is not supported", param="tool_choice")
    if tc == "none":
        tools = []
    r = body.get("reasoning")
    effort = r.get("effort") if isinstance(r, dict) else None
    mode, eff = thinking_of(body, d, effort)
    spec = _base("responses", body, d, _with_tools(out, tools), None, mode, eff,
                 sampling_of(body, d, ("temperature", "top_p")),
                 _max_tokens(body, d, "max_output_tokens", "max_tokens"),
                 [])
    spec.summary = True
    return spec
