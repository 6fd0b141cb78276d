"""--prefix-file (Conversation.prime, the server's Worker.prime): a system text evaluated once and
kept in the session store as a shared start: a second chat start with it prefills nothing of it
and answers the same; /new starts from it without prefill; the agent adds it to its own system
prompt; the server gives it to requests without a system message and starts them from its KV."""

from __future__ import annotations

import io
import sys

import openai

from ds4agent.cli import main
from ds4agent.conversation import Agent, Conversation
from ds4agent.engine import Engine, SamplingParams
from ds4agent.sessions import SessionStore

PREFIX = "You are a careful assistant for a team of engineers. Answer in one line, and name your sources.\n"


def test_the_chat_prefills_the_prefix_once_across_two_starts(demo_path, tmp_path, monkeypatch, capsys) -> None:
    f = tmp_path / "prefix.txt"
    f.write_text(PREFIX)
    args = ["-m", str(demo_path), "--prefix-file", str(f), "--sessions", str(tmp_path / "s"), "-n", "4", "--temp", "0"]
    outs = []
    for _ in range(2):
        monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
        assert main(args) == 0
        cap = capsys.readouterr()
        outs.append((cap.out, cap.err))
    assert "tokens prefilled and kept in" in outs[0][1]
    assert "its KV read from the session store (no prefill)" in outs[1][1]
    assert outs[0][0] == outs[1][0]  # the same answer from the stored KV
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(args + ["--system", "x"]) == 2
    assert "not both" in capsys.readouterr().err


def test_new_starts_from_the_primed_prefix_without_prefill(demo_path, tmp_path) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=512) as e:
        conv = Conversation(e, mode="chat", system=PREFIX, sampling=SamplingParams(temperature=0), max_tokens=3)
        assert conv.prime(SessionStore(tmp_path)) > 0 and conv.primed
        list(conv.turn("first question"))
        conv.restart()
        assert conv.session.n_tokens == len(conv.transcript.tokens) > 0  # the prefix, restored
        list(conv.turn("second question"))
        assert conv.messages[0] == {"role": "system", "content": PREFIX}
        assert conv.stats.prefill_tokens < len(conv.transcript.tokens) // 2  # only the question was prefilled
        conv.reset(system="another text")
        assert not conv.primed


def test_the_agent_adds_it_to_its_system_prompt(demo_path, tmp_path) -> None:
    from ds4agent.tools import Policy, Workspace

    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        agent = Agent(e, Workspace(tmp_path), Policy("ask"), None, prefix=PREFIX)
        assert agent.conv.system.endswith(PREFIX.strip()) and len(agent.conv.system) > len(PREFIX)


def test_the_server_starts_requests_from_the_prefix(demo_path, tmp_path) -> None:
    from ds4agent.server import ServerOptions
    from ds4agent.server.requests import Defaults
    from ds4agent.server.run import ServerThread

    def ask(st, msgs):
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="k", max_retries=0, timeout=120)
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0)
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens

    user = [{"role": "user", "content": "What is a diode?"}]
    with Engine.open(demo_path, backend="cpu", ctx=1024) as e:
        store = SessionStore(tmp_path / "kv")
        with ServerThread(e, ServerOptions(Defaults(SamplingParams(temperature=0), 5, "chat", 1024, PREFIX),
                                           store=store, min_save_tokens=1)) as st:
            assert [i.reason for i in store.list()] == ["agent-system"]
            got, cached = ask(st, user)
            assert cached > 0  # started from the prefix's KV
        with ServerThread(e, ServerOptions(Defaults(SamplingParams(temperature=0), 5, "chat", 1024),
                                           store=SessionStore(tmp_path / "other"))) as st:
            assert ask(st, [{"role": "system", "content": PREFIX}, *user])[0] == got  # as if the client sent it
