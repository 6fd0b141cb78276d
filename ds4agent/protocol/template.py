"""The chat protocol of DeepSeek V4: the official encoding (`encoding_dsv4.py` of the model
repository), re-implemented from its documented behaviour and checked byte for byte against
cases the official encoder produced (tests/test_template.py).

* ``render(messages, ...)`` turns a message list into the exact prompt text the model was
  trained on (tokenise it with ``Tokenizer.encode_rendered``).
* ``parse(text, thinking_mode)`` splits a completion into reasoning, content and DSML tool
  calls, returning a structured error for malformed text instead of raising.

An assistant message may carry ``dsml``: the tool block exactly as the model sampled it (from
``<｜DSML｜tool_calls>`` to its closing tag). It is replayed verbatim instead of re-rendering the
calls canonically, so a transcript's text stays identical to what the model produced.

Where the official encoder only crashes on an input shape (user content given as a list of
parts, Anthropic blocks, tools given without the OpenAI ``function`` wrapper), we normalise the
input first; everything the official encoder accepts renders identically.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..modelfile import ASSISTANT, BOS, DSML, EOS, THINK_CLOSE, THINK_OPEN, USER

LATEST_REMINDER = "<｜latest_reminder｜>"
TASK_TOKENS = {name: f"<｜{name}｜>" for name in ("action", "query", "authority", "domain", "title", "read_url")}
MODES = ("chat", "thinking")
EFFORTS = (None, "high", "max")

# Protocol constant of the official encoding (476 bytes, ends with a blank line), inserted right
# after BOS when reasoning effort is "max". Reproduced byte for byte because the model was trained
# on it; tests check its SHA-256.
THINK_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
# The model card recommends Think Max only with at least 384K tokens of context.
THINK_MAX_MIN_CTX = 393216

# Protocol constant: the official tools block, with the schema lines between head and tail.
TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    f'"<{DSML}tool_calls>" block like the following:\n\n'
    f"<{DSML}tool_calls>\n"
    f'<{DSML}invoke name="$TOOL_NAME">\n'
    f'<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}parameter>\n'
    "...\n"
    f"</{DSML}invoke>\n"
    f'<{DSML}invoke name="$TOOL_NAME2">\n'
    "...\n"
    f"</{DSML}invoke>\n"
    f"</{DSML}tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
    'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK_OPEN}), you MUST output your complete reasoning inside "
    f"{THINK_OPEN}...{THINK_CLOSE} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_CLOSE} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
RESPONSE_FORMAT_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

TOOL_CALLS_OPEN = f"<{DSML}tool_calls>"
TOOL_CALLS_CLOSE = f"</{DSML}tool_calls>"
INVOKE_OPEN = f"<{DSML}invoke"
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAM_OPEN = f"<{DSML}parameter"
PARAM_CLOSE = f"</{DSML}parameter>"
# A tool block must follow the content after exactly one blank line.
BLOCK_START = "\n\n" + TOOL_CALLS_OPEN[:-1]


class TemplateError(ValueError):
    """Messages the protocol cannot express; one line."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- input normalisation ----------------------------------------------------------------------

def _text_of(content: Any, role: str) -> Any:
    """OpenAI text parts and Anthropic text blocks -> one string; strings and None pass."""
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
                parts.append(p.get("text", ""))
            else:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise TemplateError(f"{role} message: content part of type {kind!r} cannot be rendered")
        return "".join(parts)
    return content


def _tool_call(tc: dict) -> dict:
    """OpenAI {id, function: {name, arguments}} or a bare {id, name, arguments}."""
    fn = tc.get("function", tc)
    if not isinstance(fn, dict) or "name" not in fn:
        raise TemplateError("tool call without a function name")
    return {"id": tc.get("id") or fn.get("id") or "", "name": fn["name"], "arguments": fn.get("arguments", "")}


def _tool_schema(tool: dict) -> dict:
    if "function" in tool:
        return tool["function"]
    if "input_schema" in tool:  # Anthropic tool definition
        out = {k: v for k, v in tool.items() if k not in ("input_schema", "type", "cache_control")}
        out["parameters"] = tool["input_schema"]
        return out
    if "name" in tool:
        return tool
    raise TemplateError("tool definition without a function")


def _normalise(messages: Iterable[dict]) -> list[dict]:
    """Copy messages into the official encoder's input shape, expanding Anthropic blocks."""
    out: list[dict] = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise TemplateError("every message must be a dict with a role")
        m = copy.deepcopy(m)
        role = m["role"]
        content = m.get("content")
        blocks = content if isinstance(content, list) else None
        anthropic_turn = blocks and any(isinstance(b, dict) and b.get("type") in ("tool_use", "thinking")
                                        for b in blocks)
        if role == "assistant" and anthropic_turn:
            text, calls, thinking = [], list(m.get("tool_calls") or []), []
            for b in blocks:
                kind = b.get("type")
                if kind == "text":
                    text.append(b.get("text", ""))
                elif kind == "thinking":
                    thinking.append(b.get("thinking", ""))
                elif kind == "tool_use":
                    function = {"name": b["name"], "arguments": _dumps(b.get("input", {}))}
                    calls.append({"id": b.get("id", ""), "function": function})
                elif kind != "redacted_thinking":
                    raise TemplateError(f"assistant message: block of type {kind!r} cannot be rendered")
            m["content"] = "".join(text)
            if thinking and not m.get("reasoning_content"):
                m["reasoning_content"] = "".join(thinking)
            m["tool_calls"] = calls
        elif role == "user" and blocks and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
            # Anthropic puts tool results inside a user turn: make them tool messages.
            pending_text: list[str] = []
            for b in blocks:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    if pending_text:
                        out.append({**{k: v for k, v in m.items() if k != "content"}, "content": "".join(pending_text)})
                        pending_text = []
                    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                                "content": b.get("content", "")})
                else:
                    pending_text.append(_text_of([b], role))
            if pending_text:
                out.append({**{k: v for k, v in m.items() if k != "content"}, "content": "".join(pending_text)})
            continue
        elif role != "tool":
            m["content"] = _text_of(content, role)
        if m.get("tool_calls"):
            m["tool_calls"] = [_tool_call(tc) for tc in m["tool_calls"]]
        if m.get("tools"):
            m["tools"] = [_tool_schema(t) for t in m["tools"]]
        out.append(m)
    return out


# -- turns ----------------------------------------------------------------------------------

@dataclass
class _Msg:
    role: str
    content: Any = None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    response_format: Any = None
    task: str | None = None
    wo_eos: bool = False
    blocks: list[tuple] | None = None  # user turns: ("text", s) | ("result", call_id, content)
    call_id: str = ""
    dsml: str | None = None  # the tool block exactly as sampled, replayed instead of re-rendering


def _as_msg(m: dict) -> _Msg:
    return _Msg(m["role"], m.get("content"), m.get("reasoning_content"), list(m.get("tool_calls") or []),
                m.get("tools"), m.get("response_format"), m.get("task"), bool(m.get("wo_eos")),
                call_id=m.get("tool_call_id") or "", dsml=m.get("dsml"))


def _merge(msgs: list[_Msg]) -> list[_Msg]:
    """Tool results become blocks of a user turn; consecutive user texts join that turn."""
    out: list[_Msg] = []
    for m in msgs:
        if m.role == "tool":
            block = ("result", m.call_id, "" if m.content is None else m.content)
            if out and out[-1].role == "user":
                out[-1].blocks.append(block)
            else:
                out.append(_Msg("user", blocks=[block]))
        elif m.role == "user":
            text = "" if m.content is None else m.content
            if not isinstance(text, str):
                raise TemplateError("user message content must be text")
            if out and out[-1].role == "user" and out[-1].task is None:
                out[-1].blocks.append(("text", text))
            else:
                out.append(_Msg("user", task=m.task, wo_eos=m.wo_eos, blocks=[("text", text)]))
        else:
            out.append(m)
    return out


def _sort_results(msgs: list[_Msg]) -> None:
    """Order each turn's tool results by the position of their call in the latest assistant
    turn that made calls (unknown ids first, stable)."""
    order: dict[str, int] = {}
    for m in msgs:
        if m.role == "assistant" and m.tool_calls:
            order = {tc["id"]: i for i, tc in enumerate(m.tool_calls) if tc["id"]}
        elif m.role == "user" and m.blocks:
            slots = [i for i, b in enumerate(m.blocks) if b[0] == "result"]
            if len(slots) > 1 and order:
                results = sorted((m.blocks[i] for i in slots), key=lambda b: order.get(b[1], 0))
                for i, b in zip(slots, results):
                    m.blocks[i] = b


def _drop_old_thinking(msgs: list[_Msg]) -> list[_Msg]:
    """Before the last user/developer turn: reasoning is removed from assistant turns and
    developer turns disappear."""
    last = max((i for i, m in enumerate(msgs) if m.role in ("user", "developer")), default=-1)
    out = []
    for i, m in enumerate(msgs):
        if i >= last or m.role in ("user", "system", "tool", "latest_reminder"):
            out.append(m)
        elif m.role == "assistant":
            out.append(copy.copy(m))
            out[-1].reasoning = None
    return out


# -- rendering ------------------------------------------------------------------------------

def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                parts.append(item.get("text", ""))
            elif isinstance(item, dict):
                parts.append(f"[Unsupported {item.get('type')}]")
            else:
                parts.append(str(item))
        return "\n\n".join(parts)
    return str(content)


def _arguments_dsml(arguments: Any) -> str:
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        args = {"arguments": arguments}  # not JSON text: passed on as one parameter
    if not isinstance(args, dict):
        raise TemplateError(f"tool call arguments must be a JSON object, got {type(args).__name__}")
    params = []
    for key, value in args.items():
        is_str = isinstance(value, str)
        text = value if is_str else _dumps(value)
        params.append(f'{PARAM_OPEN} name="{key}" string="{"true" if is_str else "false"}">{text}{PARAM_CLOSE}')
    return "\n".join(params)


def tool_calls_dsml(calls: list[dict]) -> str:
    """The canonical DSML block for calls [{name, arguments}], without the leading blank line."""
    invokes = [f'{INVOKE_OPEN} name="{c["name"]}">\n{_arguments_dsml(c["arguments"])}\n{INVOKE_CLOSE}' for c in calls]
    return f"{TOOL_CALLS_OPEN}\n" + "\n".join(invokes) + f"\n{TOOL_CALLS_CLOSE}"


def tools_block(tools: list[dict]) -> str:
    return TOOLS_HEAD + "\n".join(_dumps(t) for t in tools) + TOOLS_TAIL


def _suffixes(m: _Msg) -> str:
    out = ""
    if m.tools:
        out += "\n\n" + tools_block(m.tools)
    if m.response_format:
        out += "\n\n" + RESPONSE_FORMAT_HEAD + _dumps(m.response_format)
    return out


def _render_one(i: int, msgs: list[_Msg], thinking: bool, drop: bool, effort: str | None) -> str:
    m = msgs[i]
    last_user = max((j for j, x in enumerate(msgs) if x.role in ("user", "developer")), default=-1)
    out = THINK_MAX if i == 0 and thinking and effort == "max" else ""
    if m.role == "system":
        out += (m.content or "") + _suffixes(m)
    elif m.role == "developer":
        if not isinstance(m.content, str) or not m.content:
            raise TemplateError("developer message needs non-empty text content")
        out += USER + m.content + _suffixes(m)
    elif m.role == "user":
        out += USER + "\n\n".join(
            b[1] if b[0] == "text" else f"<tool_result>{_tool_result_text(b[2])}</tool_result>" for b in m.blocks
        )
    elif m.role == "latest_reminder":
        out += LATEST_REMINDER + ("" if m.content is None else str(m.content))
    elif m.role == "assistant":
        if thinking and not (i > 0 and msgs[i - 1].task is not None) and (not drop or i > last_user):
            out += (m.reasoning or "") + THINK_CLOSE  # the opening <think> ends the user turn
        out += m.content or ""
        if m.dsml:
            out += "\n\n" + m.dsml
        elif m.tool_calls:
            out += "\n\n" + tool_calls_dsml(m.tool_calls)
        if not m.wo_eos:
            out += EOS
    else:
        raise TemplateError(f"unknown message role {m.role!r}")

    # The turn hand-over, when the next message is the model's (or there is none).
    if i + 1 < len(msgs) and msgs[i + 1].role not in ("assistant", "latest_reminder"):
        return out
    if m.task is not None:
        if m.task not in TASK_TOKENS:
            raise TemplateError(f"unknown task {m.task!r} (known: {', '.join(TASK_TOKENS)})")
        if m.task == "action":
            return out + ASSISTANT + (THINK_OPEN if thinking else THINK_CLOSE) + TASK_TOKENS["action"]
        return out + TASK_TOKENS[m.task]
    if m.role in ("user", "developer"):
        open_think = thinking and (not drop or i >= last_user)
        out += ASSISTANT + (THINK_OPEN if open_think else THINK_CLOSE)
    return out


def render(messages: Iterable[dict], thinking_mode: str = "thinking", reasoning_effort: str | None = None,
           drop_thinking: bool = True, add_default_bos_token: bool = True,
           context: Iterable[dict] | None = None) -> str:
    """Render ``messages`` as the official DeepSeek V4 prompt text.

    ``context``: messages already in the prompt (rendered earlier); only ``messages`` are
    rendered, but decisions that look back (tool-result order, which reasoning is dropped) see
    the whole conversation, and no BOS is added."""
    if thinking_mode not in MODES:
        raise TemplateError(f"thinking_mode must be 'chat' or 'thinking', got {thinking_mode!r}")
    if reasoning_effort not in EFFORTS:
        raise TemplateError(f"reasoning_effort must be None, 'high' or 'max', got {reasoning_effort!r}")
    thinking = thinking_mode == "thinking"
    raw_context = [_as_msg(m) for m in _normalise(context or [])]
    msgs = _merge([_as_msg(m) for m in _normalise(messages)])
    _sort_results(raw_context + msgs)  # sorts msgs in place; the calls may live in the context
    ctx = _merge(raw_context)
    _sort_results(ctx)
    full = ctx + msgs
    out = BOS if add_default_bos_token and not ctx else ""
    drop = drop_thinking and not any(m.tools for m in full)
    if thinking and drop:
        full = _drop_old_thinking(full)
        n = len(full) - len(_drop_old_thinking(ctx))
        start = len(full) - n
    else:
        n, start = len(msgs), len(ctx)
    for i in range(start, start + n):
        out += _render_one(i, full, thinking, drop, reasoning_effort)
    return out


def one_shot_prompt(user: str, system: str | None = None, mode: str = "thinking") -> str:
    """A single user turn (with optional system text) opened for the answer; ``mode`` is
    "chat", "thinking" or "max" (thinking with maximum reasoning effort)."""
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    if mode == "max":
        return render(msgs, "thinking", reasoning_effort="max")
    return render(msgs, mode)


# -- parsing --------------------------------------------------------------------------------

class _ParseFailure(Exception):
    def __init__(self, kind: str, pos: int, message: str) -> None:
        super().__init__(message)
        self.kind, self.pos, self.message = kind, pos, message


def _scan(text: str, pos: int, stops: tuple[str, ...]) -> tuple[int, str, str | None]:
    """Earliest stop at or after pos (first listed wins a tie): (end of stop, text before, stop)."""
    best, which = -1, None
    for s in stops:
        k = text.find(s, pos)
        if k >= 0 and (best < 0 or k < best):
            best, which = k, s
    if which is None:
        return len(text), text[pos:], None
    return best + len(which), text[pos:best], which


_INVOKE_HEAD = re.compile(r'^\s*name="(.*?)">\n$', re.DOTALL)
_PARAM = re.compile(r'^ name="(.*?)" string="(true|false)">(.*?)<$', re.DOTALL)
_FORBIDDEN = (BOS, EOS, THINK_OPEN, THINK_CLOSE, DSML)


def _parse_block(text: str, pos: int) -> tuple[list[dict], int]:
    calls = []
    while pos < len(text):
        start = pos
        pos, gap, stop = _scan(text, pos, (INVOKE_OPEN, TOOL_CALLS_CLOSE))
        if gap != ">\n":
            raise _ParseFailure("dsml_layout", start, "expected '>' and a newline between DSML tags")
        if stop == TOOL_CALLS_CLOSE:
            return calls, pos
        if stop is None:
            raise _ParseFailure("dsml_truncated", start, "tool block ends without an invoke or its closing tag")
        head_at = pos
        pos, head, stop = _scan(text, pos, (PARAM_OPEN, INVOKE_CLOSE[:-1]))
        m = _INVOKE_HEAD.match(head)
        if not m:
            raise _ParseFailure("dsml_invoke", head_at, "malformed invoke header (expected name=\"...\")")
        name, params = m.group(1), {}
        while stop == PARAM_OPEN:
            p_at = pos
            pos, body, _ = _scan(text, pos, (PARAM_CLOSE[1:-1],))  # "/｜DSML｜parameter"
            pm = _PARAM.match(body)
            if not pm:
                raise _ParseFailure("dsml_parameter", p_at,
                                    'malformed parameter (expected name="..." string="true|false")')
            key, is_str, value = pm.group(1), pm.group(2) == "true", pm.group(3)
            if key in params:
                raise _ParseFailure("dsml_duplicate_parameter", p_at, f"parameter {key!r} given twice")
            params[key] = (is_str, value)
            gap_at = pos
            pos, gap, stop = _scan(text, pos, (PARAM_OPEN, INVOKE_CLOSE[:-1]))
            if gap != ">\n":
                raise _ParseFailure("dsml_layout", gap_at, "expected '>' and a newline after a parameter")
        # String values are JSON-encoded; others are pasted as the model wrote them.
        args = ", ".join(f"{_dumps(k)}: {_dumps(v) if s else v}" for k, (s, v) in params.items())
        calls.append({"type": "function", "function": {"name": name, "arguments": "{" + args + "}"}})
    return calls, pos


def parse(text: str, thinking_mode: str = "thinking") -> dict:
    """Parse a completion (the text generated after the prompt).

    Returns {"role", "content", "reasoning_content", "tool_calls"} like the official parser, or
    {"error": {"kind", "offset", "snippet", "message"}} for malformed text (offset in UTF-8 bytes)."""
    try:
        return _parse(text, thinking_mode)
    except _ParseFailure as f:
        offset = len(text[: f.pos].encode("utf-8"))
        return {"error": {"kind": f.kind, "offset": offset, "snippet": text[max(0, f.pos - 20) : f.pos + 40],
                          "message": f.message}}


def _parse(text: str, thinking_mode: str) -> dict:
    pos, reasoning = 0, ""
    if thinking_mode == "thinking":
        pos, reasoning, stop = _scan(text, 0, (THINK_CLOSE, BLOCK_START))
        if stop != THINK_CLOSE:
            raise _ParseFailure("missing_think_close", len(text) if stop is None else pos - len(stop),
                                "thinking-mode output without </think>")
    content_at = pos
    pos, content, stop = _scan(text, pos, (EOS, BLOCK_START))
    calls: list[dict] = []
    if stop == BLOCK_START:
        calls, pos = _parse_block(text, pos)
        tail_at = pos
        pos, tail, stop = _scan(text, pos, (EOS,))
        if tail:
            raise _ParseFailure("content_after_tool_calls", tail_at, "text after the tool block")
    elif stop is None:
        raise _ParseFailure("missing_eos", len(text), "output does not end with the end-of-sentence token")
    if pos != len(text) or stop not in (EOS, None):
        raise _ParseFailure("content_after_eos", pos, "text after the end-of-sentence token")
    for part, at in ((content, content_at), (reasoning, 0)):
        for tok in _FORBIDDEN:
            k = part.find(tok)
            if k >= 0:
                raise _ParseFailure("special_token_in_text", at + k, f"unexpected {tok} in the output text")
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


# -- reading a rendered conversation back -----------------------------------------------------

_RESULT = re.compile(r"<tool_result>(.*?)</tool_result>", re.DOTALL)


def _system_message(text: str) -> dict:
    """System text, splitting off a tools block (and response format) we rendered."""
    msg: dict = {"role": "system", "content": text}
    head = "\n\n" + TOOLS_HEAD
    k = text.find(head)
    if k < 0 and text.startswith(TOOLS_HEAD):
        k, head = 0, TOOLS_HEAD
    if k >= 0:
        end = text.find(TOOLS_TAIL, k)
        if end >= 0:
            lines = text[k + len(head) : end].split("\n")
            try:
                msg["tools"] = [{"type": "function", "function": json.loads(line)} for line in lines if line]
                msg["content"] = text[:k]
            except ValueError:
                pass
    return msg


def conversation_from_text(text: str) -> tuple[list[dict], str, str | None]:
    """Messages, thinking mode and reasoning effort of a conversation rendered with
    drop_thinking=False (as transcripts are): the inverse of rendering, used to resume a saved
    session from its text. Tool calls get ids call_0, call_1, ... and results are matched to
    them by order (the order render puts them in)."""
    pos, effort, mode = 0, None, "chat"
    if text.startswith(BOS):
        pos = len(BOS)
    if text.startswith(THINK_MAX, pos):
        effort, mode = "max", "thinking"
        pos += len(THINK_MAX)
    messages: list[dict] = []
    call_ids: list[str] = []
    n_calls = 0
    while pos < len(text):
        k = text.find(USER, pos)
        if k != pos:  # system text (at the start, or after an assistant turn)
            end = len(text) if k < 0 else k
            messages.append(_system_message(text[pos:end]))
            pos = end
            continue
        pos += len(USER)
        end = text.find(ASSISTANT, pos)
        end = len(text) if end < 0 else end
        nxt = text.find(USER, pos)
        if 0 <= nxt < end:
            end = nxt  # a user turn directly followed by another (e.g. a developer message)
        body = text[pos:end]
        pos = end
        results = list(_RESULT.finditer(body))
        if results:
            for j, m in enumerate(results):
                ident = call_ids[j] if j < len(call_ids) else ""
                messages.append({"role": "tool", "tool_call_id": ident, "content": m.group(1)})
            rest = _RESULT.sub("", body).strip("\n")
            if rest:
                messages.append({"role": "user", "content": rest})
        else:
            messages.append({"role": "user", "content": body})
        if not text.startswith(ASSISTANT, pos):
            continue
        pos += len(ASSISTANT)
        turn_mode = "thinking" if text.startswith(THINK_OPEN, pos) else "chat"
        mode = turn_mode
        if turn_mode == "thinking":
            pos += len(THINK_OPEN)
        elif text.startswith(THINK_CLOSE, pos):
            pos += len(THINK_CLOSE)
        eos = text.find(EOS, pos)
        if eos < 0:
            break  # an open assistant turn: the conversation ends here
        completion = text[pos : eos + len(EOS)]
        parsed = parse(completion, turn_mode)
        pos = eos + len(EOS)
        if "error" in parsed:
            body = completion[: -len(EOS)]
            reasoning, sep, content = body.partition(THINK_CLOSE)
            parsed = {"content": content if sep else body, "reasoning_content": reasoning if sep else "",
                      "tool_calls": []}
        msg = {"role": "assistant", "content": parsed["content"]}
        if turn_mode == "thinking":
            msg["reasoning_content"] = parsed["reasoning_content"]
        if parsed["tool_calls"]:
            call_ids = []
            calls = []
            for c in parsed["tool_calls"]:
                call_ids.append(f"call_{n_calls}")
                calls.append({"id": f"call_{n_calls}", "type": "function", "function": c["function"]})
                n_calls += 1
            msg["tool_calls"] = calls
            start = completion.find(TOOL_CALLS_OPEN)
            close = completion.rfind(TOOL_CALLS_CLOSE)
            if start >= 0 and close >= 0:
                msg["dsml"] = completion[start : close + len(TOOL_CALLS_CLOSE)]
        messages.append(msg)
    return messages, mode, effort
