"""The scripted agent the agent-loop tests share (test_agent_loop.py, test_agent_context.py): a
real engine and workspace, the model's completions fixed text, helpers to read what happened."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import scripted_steps

from ds4agent.conversation import agent as agent_mod
from ds4agent.conversation.agent import Agent
from ds4agent.engine import Engine
from ds4agent.sessions import SessionStore
from ds4agent.tools import Policy, Workspace

EOS = "<｜end▁of▁sentence｜>"
READ_APP = "1\tdef main():\n2\t    return 1\n[lines 1-2 of 2; end of file]"  # read of src/app.py


def _invoke(name: str, params: dict) -> str:
    body = "\n".join(f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{v}'
                     f'</｜DSML｜parameter>' for k, v in params.items())
    return f'<｜DSML｜invoke name="{name}">\n{body}\n</｜DSML｜invoke>'


def calls(*invokes: tuple[str, dict]) -> str:
    """One tool block holding the given calls, ending the turn."""
    inner = "\n".join(_invoke(n, p) for n, p in invokes)
    return f"\n\n<｜DSML｜tool_calls>\n{inner}\n</｜DSML｜tool_calls>{EOS}"


def call(name: str, **params) -> str:
    return calls((name, params))


class Script:
    """Sampling replaced by fixed completions, one per model turn; ``finish`` overrides the
    last step's finish reason of a turn (e.g. "context": the session ran out of room)."""

    def __init__(self, agent: Agent, completions: list[str | tuple[str, str]]) -> None:
        self.agent, self.completions = agent, list(completions)
        self.asked: list[dict] = []  # the last message of each turn's prompt
        agent.conv.session.generate = self.generate

    def generate(self, params, max_tokens=50000, stop_at_eos=True):
        self.asked.append(dict(self.agent.conv.messages[-1]))
        item = self.completions.pop(0)
        text, forced = item if isinstance(item, tuple) else (item, None)
        yield from scripted_steps(self.agent.conv.tok, text, max_tokens, forced or "length")


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=8192) as e:
        yield e


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mutagent") / "repo"
    (root / "src").mkdir(parents=True)
    (root / "sub").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "AGENTS.md").write_text("Always run pytest.\n")
    (root / "sub" / "AGENTS.md").write_text("In sub, use tabs.\n")
    (root / "sub" / "x.py").write_text("x = 1\n")
    return root


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> SessionStore:
    return SessionStore(tmp_path_factory.mktemp("mutagent-sys"))


@pytest.fixture()
def ws(repo: Path) -> Workspace:
    (repo / "src" / "app.py").write_text("def main():\n    return 1\n")
    return Workspace(repo)


@pytest.fixture()
def make(engine, ws, store):
    def _make(mode: str = "yolo", approve=None, **kw) -> Agent:
        a = Agent(engine, ws, Policy(mode), approve, max_tokens=kw.pop("max_tokens", 400), **kw)
        a.prime(store)
        return a
    return _make


def _quiet(events) -> list:
    """The events a front end acts on (not the streamed text or prefill progress)."""
    return [e for e in events if e.kind not in ("prefill", "reasoning", "content", "call_start")]


def _roles(agent: Agent) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in agent.conv.messages]


def _result(gen):
    """Run a generator to its end: (events, return value)."""
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            return events, stop.value


LONG = "a long explanation " * 60


class FakeTurns:
    """The conversation's turns replaced (for the loop alone, without the model's cost): each
    turn records the messages it was given and answers with the next scripted tool calls, as
    parsed calls with ids, or with ``None`` a plain answer."""

    def __init__(self, agent: Agent, answers: list, finish: str | None = "eos",
                 stats: tuple[int, int, int] | None = None) -> None:
        self.agent, self.answers, self.given = agent, list(answers), []
        self.n, self.finish, self.stats = 0, finish, stats
        agent.conv.turn_with = self.turn_with

    def turn_with(self, *messages: dict):
        import json

        from ds4agent.conversation import Event

        self.given.append(list(messages))
        answer = self.answers.pop(0)
        msg = {"role": "assistant", "content": "" if answer else "Answer."}
        if answer:
            msg["tool_calls"] = []
            for name, args in answer:
                msg["tool_calls"].append({"id": f"call_{self.n}", "type": "function",
                                          "function": {"name": name, "arguments": json.dumps(args)}})
                self.n += 1
        self.agent.conv.transcript.messages.append(msg)
        if self.stats is not None:  # (prompt, prefilled, generated) tokens of this turn
            st = self.agent.conv.stats
            st.prompt_tokens, st.prefill_tokens, st.gen_tokens = self.stats
        if self.finish is not None:  # None: a turn that ends without saying why
            yield Event("done", finish=self.finish)


def _stop_after_tools(monkeypatch, agent: Agent, after: int = 1) -> list[str]:
    """Set the stop flag when the ``after``-th tool call has run (as Ctrl+C during it would)."""
    ran: list[str] = []
    real = agent_mod.run_tool

    def run_tool(tools, name, arguments, *rest):
        ran.append(name)
        out = real(tools, name, arguments, *rest)
        if len(ran) == after:
            agent.conv.stop.set()
        return out

    monkeypatch.setattr(agent_mod, "run_tool", run_tool)
    return ran


def _exchanges(a: Agent, n: int = 3) -> None:
    for i in range(n):
        Script(a, ["ok</think>" + f"Answer {i}: " + LONG + EOS])
        list(a.run(f"question {i}"))


def _stop_at_step(a: Agent, script: Script, n: int) -> None:
    """Set the stop flag as the script's ``n``-th sampled step goes out (Ctrl+C while it writes)."""
    real = script.generate

    def stopping(*args, **kw):
        for i, step in enumerate(real(*args, **kw)):
            if i == n:
                a.conv.stop.set()
            yield step

    a.conv.session.generate = stopping
