"""ds4 serve with several slots (server/worker.py, --parallel): concurrent requests under the
official SDK stream together and each answers exactly what it answers on a server of one slot;
a continued conversation goes to the slot that holds its start; the queue holds what the slots
cannot take yet."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest

from ds4agent.engine import Engine, SamplingParams
from ds4agent.server import ServerOptions
from ds4agent.server.requests import Defaults
from ds4agent.server.run import ServerThread

QUESTIONS = ["Hello there", "What is the capital of France? Answer briefly.", "Write a haiku about rust",
             "List three prime numbers", "Why is the sky blue?", "Say nothing"]


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=1024) as e:
        yield e


def _ask(url: str, question: str, n: int, seed: int) -> tuple[str, int]:
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120)
    text, usage = "", None
    for ch in c.chat.completions.create(model="m", messages=[{"role": "user", "content": question}], max_tokens=n,
                                        temperature=0.8, seed=seed, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.choices:
            d = ch.choices[0].delta
            text += (getattr(d, "reasoning_content", None) or "") + (d.content or "")
        if ch.usage:
            usage = ch.usage
    return text, usage.completion_tokens


def _options(parallel: int) -> ServerOptions:
    return ServerOptions(Defaults(SamplingParams(temperature=0), 8, "chat"), parallel=parallel)


def test_concurrent_streams_answer_as_on_one_slot(engine) -> None:
    """Six streamed requests at once (different prompts, token limits and seeded sampling) on
    three slots: each answer is the one a one-slot server gives, and decode steps batched."""
    jobs = [(q, 4 + 3 * k, 100 + k) for k, q in enumerate(QUESTIONS)]
    with ServerThread(engine, _options(1)) as st:
        want = [_ask(st.url, *j) for j in jobs]
    with ServerThread(engine, _options(3)) as st:
        got: list = [None] * len(jobs)

        def run(k: int) -> None:
            got[k] = _ask(st.url, *jobs[k])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        stats = st.worker.batcher.stats
    assert got == want
    assert stats.widest >= 2 and stats.steps < sum(n for _, n in want)


def test_a_conversation_continues_in_the_slot_that_holds_it(engine) -> None:
    with ServerThread(engine, _options(3)) as st:
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=120)
        convs = [[{"role": "user", "content": q}] for q in QUESTIONS[:3]]
        for m in convs:
            r = c.chat.completions.create(model="m", messages=m, max_tokens=4)
            m.append({"role": "assistant", "content": r.choices[0].message.content})
            m.append({"role": "user", "content": "and then?"})
        for m in reversed(convs):  # in another order: each must find its own slot's cache
            r = c.chat.completions.create(model="m", messages=m, max_tokens=2)
            assert r.usage.prompt_tokens_details.cached_tokens > 0.5 * r.usage.prompt_tokens
        assert {len(sl.session.tokens) > 0 for sl in st.worker.slots} == {True}


def test_hostile_bodies_get_the_api_error_shape_at_once(engine) -> None:
    """A body nested 5 000 deep and a 12 MB prompt: 400 in the API's error shape, the prompt
    refused before it is tokenised (no request waits behind it)."""
    import time

    with ServerThread(engine, _options(2)) as st:
        deep = b'{"model":"m","max_tokens":1,"messages":' + b"[" * 5000 + b"]" * 5000 + b"}"
        status, body = _post(st.url + "/v1/chat/completions", deep)
        assert status == 400 and "nested" in body["error"]["message"]
        status, body = _post(st.url + "/v1/messages", deep)
        assert status == 400 and body["type"] == "error"
        big = "word " * ((12 << 20) // 5)
        t = time.perf_counter()
        status, body = _post(st.url + "/v1/chat/completions", json.dumps(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": big}]}).encode())
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert time.perf_counter() - t < 5  # (tokenising it takes tens of seconds)
        status, _ = _post(st.url + "/v1/chat/completions", json.dumps(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode())
        assert status == 200


def _post(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_parallel_flag_is_checked(demo_path, capsys) -> None:
    from ds4agent.cli import main

    assert main(["serve", "-m", str(demo_path), "--parallel", "0"]) == 2
    assert "--parallel takes a whole number of at least 1 or 'auto'" in capsys.readouterr().err


def test_auto_slots_are_what_memory_holds_up_to_eight(engine, monkeypatch) -> None:
    """`--parallel auto`: as many slots as the memory left beside the model holds at the
    context size, at most 8 (one pass of the batched products), at least 1, and 1 where the
    available memory cannot be told."""
    from ds4agent.engine import expertpool

    kv = engine.session_room()[1]
    model = engine.file.file_size
    cases = [(model + 100 * kv, 8), (model + 3 * kv + kv // 2, 3), (model, 1), (None, 1)]
    for available, slots in cases:
        monkeypatch.setattr(expertpool, "available_memory", lambda a=available: (a, "test"))
        assert engine.session_room() == (slots, kv), available
