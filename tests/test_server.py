"""ds4 serve on a scripted engine: the official openai and anthropic SDKs on a real loopback
socket, every API streamed and not, tool calls over several turns, the prefix cache, errors,
queueing and cancellation (docs/server.md)."""

from __future__ import annotations

import json
import threading
import time

import anthropic

try:
    import httpx2 as httpx  # what the openai and anthropic SDKs of this venv use
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest

from ds4agent.server import ScriptedEngine, ServerOptions
from ds4agent.server.run import ServerThread

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"


def block(*calls: tuple[str, dict]) -> str:
    """A DSML tool block as the model writes it (string params as is, others as JSON)."""
    out = f"\n\n<{D}tool_calls>\n"
    for name, args in calls:
        out += f'<{D}invoke name="{name}">\n'
        for k, v in args.items():
            is_str = isinstance(v, str)
            out += f'<{D}parameter name="{k}" string="{"true" if is_str else "false"}">{v if is_str else json.dumps(v)}</{D}parameter>\n'
        out += f"</{D}invoke>\n"
    return out + f"</{D}tool_calls>"


READ = ("read", {"path": 'src/a "quoted".py', "limit": 40, "flags": {"raw": True, "list": [1, 2]}})
GREP = ("grep", {"pattern": "def \\w+\n", "path": "."})
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}} for n in ("read", "grep", "shell")]
SYSTEM = "You are a coding agent. " * 60


def script_turns() -> list[str]:
    return [
        "I should read the file." "</think>Reading it." + block(READ),
        "Now search." "</think>" + block(READ, GREP),
        "Done.</think>The function is **f**." + EOS,
    ]


@pytest.fixture
def served(demo_tokenizer):
    made = []

    def make(script, **opts):
        engine = ScriptedEngine(demo_tokenizer, script, ctx=opts.pop("ctx", 16384),
                                token_seconds=opts.pop("token_seconds", 0.0),
                                prefill_seconds=opts.pop("prefill_seconds", 0.0))
        st = ServerThread(engine, ServerOptions(**opts)).__enter__()
        made.append(st)
        return engine, st

    yield make
    for st in made:
        st.stop(save=False)


def oai(st) -> openai.OpenAI:
    return openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=20)


def ant(st) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=st.url, api_key="k", max_retries=0, timeout=20)


def test_chat_tool_calls_streamed_and_not_equal_the_script(served) -> None:
    engine, st = served(script_turns())
    c = oai(st)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "find f"}]
    r = c.chat.completions.create(model="deepseek-v4-flash", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.reasoning_content == "I should read the file." and m.content == "Reading it."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls] == [READ]
    assert m.tool_calls[0].id.startswith("call_") and len(m.tool_calls[0].id) == 29
    # Arguments are compact JSON.
    assert m.tool_calls[0].function.arguments == json.dumps(READ[1], separators=(",", ":"))
    msgs += [{"role": "assistant", "content": m.content, "tool_calls": [t.model_dump() for t in m.tool_calls]},
             {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "def f(): pass"}]
    # Streamed: arguments arrive as deltas that add up to the same JSON.
    stream = c.chat.completions.create(model="x", messages=msgs, tools=TOOLS, stream=True,
                                       stream_options={"include_usage": True})
    reasoning, content, calls, finish, usage = "", "", {}, None, None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            d = choice.delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and reasoning == "Now search." and content == ""
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == [READ, GREP]
    assert all(v["id"].startswith("call_") for v in calls.values())
    assert DSML_FREE(reasoning + content)
    # The replayed call matched the sampled block: everything but the new tool result was cached.
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 30
    assert st.worker.memory.lookup([m.tool_calls[0].id]) is not None


def DSML_FREE(text: str) -> bool:
    return D not in text and "</think>" not in text and EOS not in text


def run_agent(c: openai.OpenAI, msgs: list, turns: int, stream: bool) -> list:
    """Drive a coding-agent loop as clients do: the whole history each time, tool results
    appended, reasoning never sent back. Returns the usage of each request."""
    usages = []
    for _ in range(turns):
        if stream:
            s = c.chat.completions.create(model="x", messages=msgs, tools=TOOLS, stream=True,
                                          stream_options={"include_usage": True})
            content, calls, usage = "", {}, None
            for ch in s:
                usage = ch.usage or usage
                for choice in ch.choices:
                    content += choice.delta.content or ""
                    for tc in choice.delta.tool_calls or []:
                        slot = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                           "function": {"name": "", "arguments": ""}})
                        slot["function"]["name"] += tc.function.name or ""
                        slot["function"]["arguments"] += tc.function.arguments or ""
            tool_calls = [calls[i] for i in sorted(calls)]
        else:
            r = c.chat.completions.create(model="x", messages=msgs, tools=TOOLS)
            usage, content = r.usage, r.choices[0].message.content
            tool_calls = [t.model_dump() for t in r.choices[0].message.tool_calls or []]
        usages.append(usage)
        msgs.append({"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})})
        for t in tool_calls:
            msgs.append({"role": "tool", "tool_call_id": t["id"], "content": f"output of {t['function']['name']}\n" * 20})
        if not tool_calls:
            msgs.append({"role": "user", "content": "Now do the next thing."})
    return usages


@pytest.mark.parametrize("stream", [False, True])
def test_recorded_agent_conversation_is_served_from_cache(served, stream: bool) -> None:
    engine, st = served(script_turns() * 4)
    engine.script = script_turns() * 4
    # Coding agents send a long system prompt and tool schemas (Claude Code's are ~15k tokens).
    msgs = [{"role": "system", "content": SYSTEM * 6}, {"role": "user", "content": "find f"}]
    usages = run_agent(oai(st), msgs, 12, stream)
    # What was not cached is the new text of each turn: the tool results and the hand-over.
    for u, new in zip(usages[1:], [2, 3, 1] * 4):
        assert u.prompt_tokens - u.prompt_tokens_details.cached_tokens <= 100 * new, usages
    later = usages[1:]
    cached = sum(u.prompt_tokens_details.cached_tokens for u in later)
    total = sum(u.prompt_tokens for u in later)
    assert cached / total >= 0.95, (cached, total)
    # The engine evaluated little more than the new text of each turn.
    assert engine.evaluated < usages[0].prompt_tokens + (total - cached) + sum(u.completion_tokens for u in usages) + 5


def test_edit_and_regenerate_reuse_everything_before(served) -> None:
    engine, st = served(["Hm.</think>One." + EOS])
    c = oai(st)
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"}]
    r1 = c.chat.completions.create(model="x", messages=base + [{"role": "user", "content": "second question"}])
    # Regenerate: the same request again reuses the whole prompt.
    r2 = c.chat.completions.create(model="x", messages=base + [{"role": "user", "content": "second question"}])
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens == r1.usage.prompt_tokens
    # Edited last message: everything up to it is reused.
    r3 = c.chat.completions.create(model="x", messages=base + [{"role": "user", "content": "an edited, longer question"}])
    n_before = len(st.worker.tok.encode_rendered(
        "<｜begin▁of▁sentence｜>" + SYSTEM + "<｜User｜>first question<｜Assistant｜></think>first answer" + EOS))
    assert r3.usage.prompt_tokens_details.cached_tokens == n_before
    # A client that drops the last turn: the shorter prompt is a checkpoint too.
    r4 = c.chat.completions.create(model="x", messages=base + [{"role": "user", "content": "second question"}])
    assert r4.usage.prompt_tokens_details.cached_tokens == r4.usage.prompt_tokens


def test_anthropic_messages_tool_use_streamed_and_not(served) -> None:
    engine, st = served(script_turns())
    a = ant(st)
    tools = [{"name": t["function"]["name"], "description": "x", "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
              {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "find f"}]}]
    r = a.messages.create(model="claude-x", max_tokens=500, system=system, messages=msgs, tools=tools)
    kinds = [b.type for b in r.content]
    assert kinds == ["thinking", "text", "tool_use"] and r.stop_reason == "tool_use"
    assert r.content[0].thinking == "I should read the file." and r.content[1].text == "Reading it."
    assert (r.content[2].name, r.content[2].input) == READ and r.content[2].id.startswith("toolu_")
    assert r.model == "claude-x"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[2].id,
                                           "content": [{"type": "text", "text": "def f(): pass"}]}]}]
    # A new billing header (it changes per request) must not cost a re-prefill.
    system[0]["text"] = "x-anthropic-billing-header: cc_version=1; cch=def"
    with a.messages.stream(model="claude-x", max_tokens=500, system=system, messages=msgs, tools=tools) as s:
        events = [e.type for e in s]
        final = s.get_final_message()
    assert "content_block_start" in events and "message_stop" in events
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [READ, GREP]
    assert final.stop_reason == "tool_use"
    assert final.usage.cache_read_input_tokens > 0
    n = a.messages.count_tokens(model="x", system=system, messages=msgs, tools=tools).input_tokens
    assert n == final.usage.cache_read_input_tokens + final.usage.cache_creation_input_tokens
    assert final.usage.cache_creation_input_tokens < 40  # the tool result and the turn hand-over
    # The third turn ends the conversation with text.
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                                          for b in final.content if b.type == "tool_use"]}]
    r3 = a.messages.create(model="claude-x", max_tokens=500, system=system, messages=msgs, tools=tools)
    assert r3.stop_reason == "end_turn" and r3.content[-1].text == "The function is **f**."
    assert r3.usage.cache_creation_input_tokens < 40


def test_responses_function_calls_over_turns(served) -> None:
    engine, st = served(script_turns())
    c = oai(st)
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in TOOLS]
    items: list = [{"role": "user", "content": "find f"}]
    r = c.responses.create(model="m", instructions=SYSTEM, input=items, tools=tools)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in calls] == [READ] and r.status == "completed"
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output_text == "Reading it."
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items += [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "def f(): pass"}]
    with c.responses.stream(model="m", instructions=SYSTEM, input=items, tools=tools) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert [(o.name, json.loads(o.arguments)) for o in final.output if o.type == "function_call"] == [READ, GREP]
    assert final.usage.input_tokens_details.cached_tokens >= final.usage.input_tokens - 30


def test_completions_and_stop_sequences(served) -> None:
    engine, st = served(["alpha beta STOP gamma" + EOS])
    c = oai(st)
    r = c.completions.create(model="m", prompt="Say:", max_tokens=50, stop=["STOP"])
    assert r.choices[0].text == "alpha beta " and r.choices[0].finish_reason == "stop"
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="m", prompt="Say:", max_tokens=50, stream=True)
                   if ch.choices)
    assert text == "alpha beta STOP gamma"
    engine.script = ["x</think>one two three" + EOS]
    engine.calls = 0
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stop="two", max_tokens=50)
    assert r.choices[0].message.content == "one " and r.choices[0].finish_reason == "stop"
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    a = ant(st)
    m = a.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "q"}], stop_sequences=["three"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "three" and m.content[-1].text == "one two "


def test_a_malformed_tool_block_goes_out_as_text(served) -> None:
    """A tool block that breaks the DSML grammar is no call: its text, and what the model says
    after it, is the answer's content (streamed and not), with no tool calls."""
    bad = f"\n\n<{D}tool_calls> \nnot a call"
    engine, st = served(["x</think>before" + bad + " and after" + EOS])
    c = oai(st)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    assert r.choices[0].message.content == "before" + bad + " and after"
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], tools=TOOLS,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "before" + bad + " and after"
    assert not any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)


def test_thinking_off_and_models(served) -> None:
    engine, st = served(["plain answer" + EOS])
    c = oai(st)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], reasoning_effort="none")
    assert r.choices[0].message.content == "plain answer"
    assert engine.prompts[-1][-1] == engine.tokenizer.special["think_close"]
    a = ant(st)
    m = a.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "q"}],
                          thinking={"type": "disabled"})
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "plain answer"
    assert [x.id for x in c.models.list()] == ["deepseek-v4-flash"]
    assert httpx.get(st.url + "/health").json()["status"] == "ok"


def test_errors_in_each_apis_shape(served) -> None:
    engine, st = served(["a" + EOS], ctx=600, max_body=4096, api_key="sekret")
    good = {"authorization": "Bearer sekret"}
    c = openai.OpenAI(base_url=st.url + "/v1", api_key="sekret", max_retries=0, timeout=20)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=st.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=st.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "q"}])
    ok = anthropic.Anthropic(base_url=st.url, api_key="sekret", max_retries=0)
    assert ok.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "q"}]).content[0].thinking == "a"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 700}])
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["n_ctx"] == 600 and err["n_prompt_tokens"] >= 600
    with pytest.raises(anthropic.BadRequestError) as ea:
        ok.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "word " * 700}])
    assert "configured context size is 600" in str(ea.value)
    cases = [
        ("/v1/chat/completions", b"{not json", 400, "invalid JSON request"),
        ("/v1/chat/completions", b"{}", 400, "missing messages"),
        ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages must be"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "q"}], "temperature": "hot"}', 400,
         "temperature must be"),
        ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "q"}]}', 400, "unknown role"),
        ("/v1/responses", b'{"input": "q", "previous_response_id": "resp_1"}', 400, "previous_response_id"),
        ("/v1/completions", b"[]", 400, "JSON object"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}', 413, "over"),
        ("/v1/nowhere", b"{}", 404, "unknown endpoint"),
    ]
    for path, body, status, text in cases:
        r = httpx.post(st.url + path, content=body, headers=good)
        assert r.status_code == status, (path, r.text)
        assert text in r.json()["error"]["message"], r.text
    r = httpx.post(st.url + "/v1/messages", content=b"{}", headers={"x-api-key": "sekret"})
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(st.url + "/v1/messages/nowhere").json()["type"] == "error"
    # Nothing above disturbed the engine.
    assert c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}]).choices[0].message.reasoning_content == "a"


def test_queue_bound_disconnect_and_keepalive(served) -> None:
    long = "r</think>" + "word " * 400 + EOS
    engine, st = served([long], max_queue=1, token_seconds=0.01, prefill_seconds=0.002, keepalive_s=0.05)
    body = {"model": "m", "messages": [{"role": "user", "content": "q " * 100}], "stream": True}
    lines: list[str] = []
    leave = threading.Event()

    def reader() -> None:
        with httpx.Client(timeout=20).stream("POST", st.url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                lines.append(line)
                if leave.is_set():
                    return  # leaving the stream closes the connection: the client is gone

    first = threading.Thread(target=reader)
    first.start()
    deadline = time.monotonic() + 10
    while not any('"content":"' in x and "word" in x for x in lines) and time.monotonic() < deadline:
        time.sleep(0.01)
    # While this one generates, one more may wait; the next is refused with Retry-After.
    waiting = threading.Thread(target=lambda: httpx.post(st.url + "/v1/chat/completions", timeout=30,
                                                         json={**body, "stream": False, "max_tokens": 2}))
    waiting.start()
    while st.worker.waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = httpx.post(st.url + "/v1/chat/completions", json={**body, "stream": False})
    assert busy.status_code == 503 and busy.headers["retry-after"]
    with pytest.raises(openai.APIStatusError) as e:
        openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0).chat.completions.create(
            model="m", messages=body["messages"])
    assert e.value.status_code == 503
    # The client leaves mid-answer: generation stops at the next token, long before its 400 words.
    leave.set()
    first.join(10)
    waiting.join(20)
    assert not waiting.is_alive() and not first.is_alive()
    assert any(line.startswith(": keep-alive") for line in lines)  # sent during the slow prefill
    assert engine.calls == 2  # the cancelled one and the waiting one
    assert engine.generated[0] < 200
    r = oai(st).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], max_tokens=3)
    assert r.choices[0].finish_reason == "length"


def test_anthropic_system_messages_between_turns(served) -> None:
    """Claude Code sends role "system" messages inside ``messages``: they join the user turn."""
    engine, st = served(["plain answer" + EOS])
    a = ant(st)
    m = a.messages.create(model="m", max_tokens=20, thinking={"type": "disabled"}, system="Be brief.",
                          messages=[{"role": "user", "content": "q"}, {"role": "system", "content": "Agents: none."}])
    assert m.content[-1].text == "plain answer"
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert prompt.endswith("Be brief.<｜User｜>q\n\nAgents: none.<｜Assistant｜></think>")


def test_parameter_events_rebuild_compact_arguments_at_any_split() -> None:
    """The stream parser's param_start/param_text/param_end events, fed in pieces of any size,
    give the server arguments equal to the whole block's parse, as compact JSON."""
    from ds4agent.protocol import StreamParser, parse
    from ds4agent.server.worker import _Args

    text = "r</think>ok" + block(READ, ("w", {"text": 'a</b> "c" \\ </｜DSML｜param', "n": -1.5e3}))
    expected = [json.loads(c["function"]["arguments"]) for c in parse(text, "thinking")["tool_calls"]]
    for size in (1, 2, 3, 7, 50, len(text)):
        p = StreamParser("thinking")
        args: dict[int, _Args] = {}
        out: dict[int, str] = {}
        for i in range(0, len(text), size):
            for ev in p.feed(text[i : i + size].encode()):
                if ev.kind == "call_start":
                    args[ev.index] = _Args()
                elif ev.kind.startswith("param_"):
                    args[ev.index].feed(ev.kind, ev.text, ev.name)
                elif ev.kind == "call":
                    args[ev.index].close()
                    out[ev.index] = args[ev.index].text
        assert [json.loads(out[i]) for i in sorted(out)] == expected, size
        assert all(out[i] == json.dumps(json.loads(out[i]), ensure_ascii=False, separators=(",", ":")) for i in out)
