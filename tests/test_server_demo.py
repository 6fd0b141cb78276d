"""ds4 serve on the real engine (the demo model): every API parses with the official SDKs, and
the on-disk cache with its tool-id map survives a restart (docs/server.md §4)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from ds4agent.engine import Engine, SamplingParams
from ds4agent.protocol.template import DSML
from ds4agent.server import ServerOptions
from ds4agent.server.requests import Defaults
from ds4agent.server.run import ServerThread
from ds4agent.server.toolmemory import SampledBlock
from ds4agent.sessions import SessionStore


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=2048) as e:
        yield e


def test_every_api_on_the_demo_model(engine) -> None:
    with ServerThread(engine, ServerOptions(Defaults(max_tokens=6))) as st:
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=60)
        msgs = [{"role": "user", "content": "Hello there"}]
        r = c.chat.completions.create(model="deepseek-v4-flash", messages=msgs, max_tokens=3, temperature=0)
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason in ("length", "stop")
        chunks = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=3, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == chunks[-1].usage.prompt_tokens  # regenerate
        text = "".join((getattr(ch.choices[0].delta, "reasoning_content", None) or "") + (ch.choices[0].delta.content or "")
                       for ch in chunks if ch.choices)
        # Greedy: the same answer streamed as whole.
        assert text == (r.choices[0].message.reasoning_content or "") + r.choices[0].message.content
        a = anthropic.Anthropic(base_url=st.url, api_key="k", max_retries=0, timeout=60)
        with a.messages.stream(model="m", max_tokens=3, messages=msgs) as s:
            final = s.get_final_message()
        assert final.usage.output_tokens == 3
        rr = c.responses.create(model="m", input="Hello there", max_output_tokens=2)
        assert rr.usage.output_tokens == 2 and rr.status == "incomplete"
        # (The SDK's stream helper accepts only response.completed; a cut answer ends with
        # response.incomplete, as OpenAI's own server sends it.)
        events = list(c.responses.create(model="m", input="Hello there", max_output_tokens=2, stream=True))
        assert events[-1].type == "response.incomplete" and events[-1].response.usage.output_tokens == 2
        cr = c.completions.create(model="m", prompt="Once upon a time", max_tokens=2)
        assert cr.usage.completion_tokens == 2


def test_restart_resumes_from_disk_with_exact_tool_replay(engine, tmp_path) -> None:
    store_dir = tmp_path / "kv"
    # A tool call "the model sampled" with its parameters in an order no canonical rendering
    # gives: only the tool memory can reproduce these bytes from the client's JSON.
    dsml = (f'<{DSML}tool_calls>\n<{DSML}invoke name="read">\n'
            f'<{DSML}parameter name="limit" string="false">10</{DSML}parameter>\n'
            f'<{DSML}parameter name="path" string="true">a.py</{DSML}parameter>\n'
            f'</{DSML}invoke>\n</{DSML}tool_calls>')
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "read a.py"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "call_fixed", "type": "function",
                "function": {"name": "read", "arguments": json.dumps({"path": "a.py", "limit": 10})}}]},
               {"role": "tool", "tool_call_id": "call_fixed", "content": "print(1)"}]
    opts = dict(defaults=Defaults(SamplingParams(temperature=0), 3, "chat"), min_save_tokens=1)
    with ServerThread(engine, ServerOptions(store=SessionStore(store_dir), **opts)) as st:
        st.worker.memory.remember(["call_fixed"], SampledBlock(dsml, None, (("read", {"limit": 10, "path": "a.py"}),)))
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=60)
        r1 = c.chat.completions.create(model="m", messages=history, tools=tools)
        first_prompt = r1.usage.prompt_tokens
        assert dsml in engine.tokenizer.decode(st.worker.session.tokens)
    # Stopped: the live session was saved with the id map. A new server reads both back.
    saved = [i for i in SessionStore(store_dir).list() if i.reason == "shutdown"]
    assert saved and saved[0].tokens >= first_prompt
    with ServerThread(engine, ServerOptions(store=SessionStore(store_dir), **opts)) as st:
        block = st.worker.memory.lookup(["call_fixed"])
        assert block is not None and block.dsml == dsml
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=60)
        more = history + [{"role": "assistant", "content": r1.choices[0].message.content},
                          {"role": "user", "content": "thanks"}]
        r2 = c.chat.completions.create(model="m", messages=more, tools=tools)
        # Everything through the first prompt came from the file, none of it prefilled again.
        assert r2.usage.prompt_tokens_details.cached_tokens >= first_prompt


def test_ds4_serve_command_ctrl_c_saves(demo_path, tmp_path) -> None:
    """The real command: serves on the demo model, Ctrl+C (SIGINT) exits 0 after saving the
    live session as a 'shutdown' file."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS4_HOME": str(tmp_path / "home")}
    p = subprocess.Popen([sys.executable, "-m", "ds4agent", "serve", "-m", str(demo_path), "--port", str(port),
                          "--ctx", "1024", "--sessions", str(tmp_path / "kv"), "--cache-min-tokens", "1", "-n", "2"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                c.models.list()
                break
            except openai.APIConnectionError:
                assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
                time.sleep(0.2)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens == 2
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "chat prompt=" in err and "reason=shutdown" in err
    assert "shutdown" in [i.reason for i in SessionStore(tmp_path / "kv").list()]
    # A non-loopback address without a key is warned about.
    r = subprocess.run([sys.executable, "-m", "ds4agent", "serve", "--host", "0.0.0.0", "-m", str(tmp_path / "none.gguf")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert "without --api-key" in r.stderr and r.returncode != 0 and "Traceback" not in r.stderr
