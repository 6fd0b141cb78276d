"""The agent loop's own edges, exactly (issue 22: mutation testing of conversation/agent.py).

The model is scripted (its completions are fixed text); the template, streaming parser,
transcript, KV, tools and policy are the product's own. Expected values are worked out from
the code's contract (docstrings, event docs), not copied from a run.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from helpers import scripted_steps

from ds4agent.conversation import agent as agent_mod
from ds4agent.conversation.agent import (
    Agent,
    _arguments,
    attach_mentions,
    system_prompt,
)
from ds4agent.conversation.instructions import Instructions
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


# -- stop reasons -------------------------------------------------------------------------------

def test_the_stop_reasons_are_the_six_documented_ones() -> None:
    from ds4agent.ui.agent_ui import EXIT_CODES

    assert agent_mod.STOP_REASONS == ("end_turn", "max_tokens", "context", "refused", "error", "interrupted")
    assert set(EXIT_CODES) == set(agent_mod.STOP_REASONS)  # every stop has an exit status


def test_an_answer_ends_the_turn_with_its_events_in_order(make) -> None:
    a = make()
    sys_len = len(a.conv.transcript.tokens)  # the system prompt, primed: read from the KV
    completion = "Thinking.</think>Hello." + EOS
    out_len = len(a.conv.tok.encode_rendered(completion))
    Script(a, [completion])
    t0 = time.perf_counter()
    events = list(a.run("hi"))
    elapsed = time.perf_counter() - t0
    quiet = _quiet(events)
    assert [e.kind for e in quiet] == ["turn", "done"]
    turn, done = quiet
    assert (done.stop, done.text, done.ok) == ("end_turn", "", True)
    assert turn.data["message"] is a.conv.messages[-1] and turn.data["message"]["content"] == "Hello."
    assert turn.data["finish"] == "eos"
    # The prompt is the system prompt (in the KV already) plus the user turn (prefilled).
    prompt = a.conv.stats.prompt_tokens
    assert prompt > sys_len
    usage = {"input_tokens": prompt - sys_len, "cache_read_input_tokens": sys_len, "output_tokens": out_len}
    assert turn.data["usage"] == usage
    assert set(a.usage) == {"input_tokens", "cache_read_input_tokens", "output_tokens", "turns", "model_seconds"}
    assert {k: a.usage[k] for k in usage} == usage and a.usage["turns"] == 1
    assert 0.0 < a.usage["model_seconds"] <= elapsed
    assert not any(e.kind == "call" for e in events)


def test_usage_starts_at_zero_and_each_run_counts_its_own_turns(make) -> None:
    a = make()
    assert a.usage == {"input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0, "turns": 0,
                       "model_seconds": 0.0}
    Script(a, ["r</think>" + call("read", path="src/app.py"), "ok</think>Done." + EOS])
    events = list(a.run("read it"))
    turns = [e for e in events if e.kind == "turn"]
    assert [t.data["finish"] for t in turns] == ["eos", "eos"]
    for k in ("input_tokens", "cache_read_input_tokens", "output_tokens"):
        assert a.usage[k] == sum(t.data["usage"][k] for t in turns)
    assert a.usage["turns"] == 2
    # The second turn's prompt is the whole first step: only the tool result was new.
    second = turns[1].data["usage"]
    assert second["cache_read_input_tokens"] > turns[0].data["usage"]["cache_read_input_tokens"]
    Script(a, ["ok</think>Again." + EOS])
    list(a.run("again"))
    assert a.usage["turns"] == 1  # a new run starts from zero


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


def test_max_steps_without_an_answer_is_an_error(make) -> None:
    a = make()
    paths = ["src/app.py", "sub/x.py"]  # alternated: never the same call twice in a row
    answers: list = [[("read", {"path": paths[i % 2]})] for i in range(60)]
    answers.append(None)  # an answer, reached only with a 61st step
    fake = FakeTurns(a, answers)
    events = list(a.run("loop"))
    quiet = _quiet(events)
    assert [e.kind for e in quiet if e.kind == "tool"] == ["tool"] * 60
    error, done = quiet[-2:]
    assert (error.kind, error.text, error.ok) == ("error", "stopped after 60 tool steps without a final answer", False)
    assert (done.kind, done.stop, done.text) == ("done", "error", "")
    assert len(fake.answers) == 1 and a.usage["turns"] == 60
    # Each step sent the previous step's result, answering its call by id.
    assert fake.given[0] == [{"role": "user", "content": "loop"}]
    assert [m["tool_call_id"] for g in fake.given[1:] for m in g] == [f"call_{i}" for i in range(59)]
    assert fake.given[1][0]["content"] == READ_APP and all(len(g) == 1 for g in fake.given)


def test_calls_without_an_id_are_answered_with_an_empty_id(make) -> None:
    """The streaming parser gives calls no id: the results then carry "" (the template pairs
    them with the calls by position)."""
    a = make()
    Script(a, ["two</think>" + calls(("read", {"path": "src/app.py"}), ("list", {"path": "src"})),
               "ok</think>Done." + EOS])
    list(a.run("look"))
    assert [m["tool_call_id"] for m in a.conv.messages if m["role"] == "tool"] == ["", ""]


def test_a_turn_stopped_by_a_full_context_says_so(make) -> None:
    a = make()
    Script(a, [("ok</think>The answer goes on and", "context")])
    done = list(a.run("hi"))[-1]
    assert (done.stop, done.text) == ("context", "stopped: the context (8192 tokens, --ctx) is full")


def test_a_request_that_cannot_fit_is_an_error_then_a_context_stop(make) -> None:
    a = make()
    events = _quiet(a.run("word " * 9000))
    assert [e.kind for e in events] == ["error", "done"]
    assert events[0].ok is False and events[0].text.startswith("the conversation (")
    assert events[0].text.endswith(" tokens) does not fit the context of 8192; use /new or /ctx N")
    assert (events[1].stop, events[1].text) == ("context", "stopped: the context (8192 tokens, --ctx) is full")


def test_the_token_limit_says_whether_there_was_an_answer(make) -> None:
    a = make()
    Script(a, ["still thinking about it"])
    done = list(a.run("think"))[-1]
    assert done.stop == "max_tokens"
    assert done.text == ("stopped: the model reached the token limit (400 per turn, -n) before it finished; "
                         "it was still reasoning, so there is no answer")
    Script(a, ["thought</think>A partial answer"])
    done = list(a.run("answer"))[-1]
    assert a.conv.messages[-1]["content"] == "A partial answer"
    assert (done.stop, done.text) == ("max_tokens", "stopped: the model reached the token limit (400 per turn, -n) "
                                                    "before it finished")


# -- approvals ------------------------------------------------------------------------------------

NO_ONE = "; no one can approve it in this mode. Choose another way or ask the user."


def test_refused_for_want_of_an_approver(make) -> None:
    a = make("auto-edit", None)
    Script(a, ["run</think>" + call("bash", command="touch made-by-the-model"), "ok</think>Could not." + EOS])
    events = _quiet(a.run("run it"))
    kinds = [e.kind for e in events]
    assert kinds == ["turn", "refused", "turn", "done"]
    refused = events[1]
    assert refused.ok is False and refused.text.startswith("refused: $ touch made-by-the-model (")
    tool_msg = next(m for m in a.conv.messages if m["role"] == "tool")
    assert refused.data["result"] == tool_msg["content"]
    assert refused.data["result"].startswith("error: not run: ") and refused.data["result"].endswith(NO_ONE)
    assert refused.data == {"name": "bash", "input": {"command": "touch made-by-the-model"}, "index": 0,
                            "result": tool_msg["content"], "output": "", "denied": True}
    done = events[-1]
    assert (done.stop, done.text) == ("refused", "1 action needed an approval that no one can give here (see --approval)")
    assert not (a.ws.root / "made-by-the-model").exists()


def test_two_refusals_are_counted_and_said_in_the_plural(make) -> None:
    a = make("auto-edit", None)
    Script(a, ["run</think>" + calls(("bash", {"command": "touch one"}), ("bash", {"command": "touch two"})),
               "ok</think>Could not." + EOS])
    events = _quiet(a.run("run them"))
    refused = [e for e in events if e.kind == "refused"]
    assert [r.data["index"] for r in refused] == [0, 1]
    assert events[-1].text == "2 actions needed an approval that no one can give here (see --approval)"


def test_a_refusal_does_not_hide_another_stop(make) -> None:
    a = make("auto-edit", None)
    Script(a, ["run</think>" + call("bash", command="touch three"), "still thinking"])
    assert list(a.run("run"))[-1].stop == "max_tokens"


def test_a_user_who_declines_is_not_a_refused_stop(make) -> None:
    asked = []

    def approve(req):
        asked.append(req.summary)
        return "no"

    a = make("ask", approve)
    Script(a, ["edit</think>" + call("edit", path="src/app.py", old="return 1", new="return 2"),
               "ok</think>Left it." + EOS])
    events = _quiet(a.run("edit"))
    refused = next(e for e in events if e.kind == "refused")
    assert refused.data["denied"] is True and refused.ok is False
    assert refused.data["result"].endswith("; the user declined. Choose another way or ask the user.")
    assert events[-1].stop == "end_turn" and asked
    assert "return 1" in (a.ws.root / "src" / "app.py").read_text()


def test_a_tool_event_carries_the_call_and_its_result(make) -> None:
    a = make()
    Script(a, ["edit</think>" + call("edit", path="src/app.py", old="return 1", new="return 2"),
               "ok</think>Done." + EOS])
    events = _quiet(a.run("edit"))
    tool = next(e for e in events if e.kind == "tool")
    msg = next(m for m in a.conv.messages if m["role"] == "tool")
    assert tool.ok is True and "-    return 1" in tool.detail and "+    return 2" in tool.detail
    assert tool.data == {"name": "edit", "input": {"path": "src/app.py", "old": "return 1", "new": "return 2"},
                         "index": 0, "result": msg["content"], "output": "", "denied": False}  # (only commands print)
    assert "return 2" in (a.ws.root / "src" / "app.py").read_text()


def test_tool_results_answer_their_calls_by_id(make) -> None:
    a = make()
    Script(a, ["two</think>" + calls(("read", {"path": "src/app.py"}), ("list", {"path": "src"})),
               "ok</think>Done." + EOS])
    events = _quiet(a.run("look"))
    tools = [e for e in events if e.kind == "tool"]
    assert [(t.data["name"], t.data["index"]) for t in tools] == [("read", 0), ("list", 1)]
    results = [m for m in a.conv.messages if m["role"] == "tool"]
    assert results[0]["content"] == READ_APP and tools[0].data["result"] == READ_APP


def test_a_repeated_call_is_refused_and_not_run(make) -> None:
    a = make()
    same = call("read", path="src/app.py")
    Script(a, ["r</think>" + same, "r</think>" + same, "ok</think>Done." + EOS])
    events = _quiet(a.run("read twice"))
    assert [e.kind for e in events] == ["turn", "tool", "turn", "refused", "turn", "done"]
    refused = events[3]
    text = ("error: you just made this exact call and got its result; do not repeat it. "
            "Use the result you have, change the arguments, or answer.")
    assert (refused.text, refused.ok) == ("repeated call to read not run", False)
    assert refused.data == {"name": "read", "input": {"path": "src/app.py"}, "index": 0, "result": text}
    assert [m["content"] for m in a.conv.messages if m["role"] == "tool"] == [READ_APP, text]
    assert events[-1].stop == "end_turn"  # a repeat is not a refusal for want of approval


def test_a_malformed_call_is_reported_and_written_again(make) -> None:
    a = make()
    bad = ('oops</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read">\n'
           '<｜DSML｜parameter name="path">src/app.py</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>' + EOS)
    Script(a, [bad, "again</think>" + call("read", path="src/app.py"), "ok</think>Done." + EOS])
    events = _quiet(a.run("read it"))
    assert [e.kind for e in events] == ["error", "turn", "turn", "tool", "turn", "done"]
    error = events[0]
    assert error.ok is False and error.text.startswith("malformed tool call: ")
    why = error.text[len("malformed tool call: "):]
    retry = f"Your tool call could not be parsed ({why}). Write it again in the exact DSML format shown in the system prompt."
    users = [c for r, c in _roles(a) if r == "user"]
    assert users[-1] == retry
    assert events[-1].stop == "end_turn"


# -- interrupts -----------------------------------------------------------------------------------

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


def test_stopped_after_the_last_call_its_result_goes_with_the_next_request(make, monkeypatch) -> None:
    a = make()
    _stop_after_tools(monkeypatch, a)
    Script(a, ["r</think>" + call("read", path="src/app.py")])
    events = _quiet(a.run("read"))
    assert [e.kind for e in events] == ["turn", "tool", "interrupted", "done"]
    assert events[2].text == "interrupted" and (events[3].stop, events[3].text) == ("interrupted", "")
    assert a.conv.messages[-1]["role"] == "assistant"  # the result was not sent yet
    Script(a, ["ok</think>It returns 1." + EOS])
    assert list(a.run("go on"))[-1].stop == "end_turn"
    roles = _roles(a)
    assert roles[-4:-1] == [("assistant", ""), ("tool", READ_APP), ("user", "go on")]


def test_stopped_between_calls_the_rest_are_marked_not_run(make, monkeypatch) -> None:
    a = make()
    ran = _stop_after_tools(monkeypatch, a)
    Script(a, ["two</think>" + calls(("read", {"path": "src/app.py"}), ("list", {"path": "src"}))])
    events = _quiet(a.run("look"))
    assert [e.kind for e in events] == ["turn", "tool", "interrupted", "done"]
    assert ran == ["read"] and events[2].text == "interrupted" and events[-1].stop == "interrupted"
    Script(a, ["ok</think>Fine." + EOS])
    list(a.run("go on"))
    results = [m for m in a.conv.messages if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [
        ("", READ_APP), ("", "error: not run: the user interrupted the agent")]


def test_stopped_before_the_next_turn_answered_the_results_are_kept(make, monkeypatch) -> None:
    """Stopped during the prefill of the tool results: the turn is withdrawn (nothing of it
    stays in the conversation) and the results wait for the next request."""
    a = make()
    armed: list[bool] = []
    real_run = agent_mod.run_tool

    def run_tool(*args):
        armed.append(True)
        return real_run(*args)

    monkeypatch.setattr(agent_mod, "run_tool", run_tool)
    real_sync = a.conv.session.sync

    def sync(ids):
        out = real_sync(ids)
        if armed:
            armed.clear()
            a.conv.stop.set()
        return out

    a.conv.session.sync = sync
    Script(a, ["r</think>" + call("read", path="src/app.py")])
    events = _quiet(a.run("read"))
    assert [e.kind for e in events] == ["turn", "tool", "interrupted", "done"]  # no turn for the withdrawn one
    assert events[2].text == "withdrawn" and events[3].stop == "interrupted"
    assert a.conv.messages[-1]["role"] == "assistant" and a.usage["turns"] == 1
    Script(a, ["ok</think>It returns 1." + EOS])
    list(a.run("go on"))
    assert _roles(a)[-3:-1] == [("tool", READ_APP), ("user", "go on")]


def test_held_results_are_dropped_when_the_conversation_moved_on(make, monkeypatch) -> None:
    a = make()
    _stop_after_tools(monkeypatch, a)
    Script(a, ["r</think>" + call("read", path="src/app.py")])
    list(a.run("read"))
    a.new_conversation()
    assert a.conv.session.tokens == a.conv.transcript.tokens  # the system prompt's KV, restored
    Script(a, ["ok</think>Hello." + EOS])
    list(a.run("hello"))
    assert [r for r, _ in _roles(a)] == ["system", "user", "assistant"]


def test_a_stop_set_before_a_request_does_not_stop_it(make) -> None:
    a = make()
    a.conv.stop.set()
    Script(a, ["ok</think>Hi." + EOS])
    assert list(a.run("hi"))[-1].stop == "end_turn"


# -- compaction -----------------------------------------------------------------------------------

LONG = "a long explanation " * 60


def _exchanges(a: Agent, n: int = 3) -> None:
    for i in range(n):
        Script(a, ["ok</think>" + f"Answer {i}: " + LONG + EOS])
        list(a.run(f"question {i}"))


def test_compaction_keeps_the_last_four_messages_from_a_user_turn(make) -> None:
    a = make()
    _exchanges(a)
    a.conv.dirty = False  # as after a save: the compaction must mark the conversation changed
    Script(a, ["summing up</think>Three long answers." + EOS])
    events, done = _result(a.compact())
    assert done is True and [(e.kind, e.text) for e in events] == [("compacted", "Three long answers.")]
    assert _roles(a) == [("system", a.conv.system),
                         ("user", "Summary of the work so far:\nThree long answers."),
                         ("assistant", "Understood; continuing from that summary."),
                         ("user", "question 1"), ("assistant", "Answer 1: " + LONG),
                         ("user", "question 2"), ("assistant", "Answer 2: " + LONG)]
    assert a.conv.dirty is True
    assert a.conv.tok.decode(a.conv.transcript.tokens) == a.conv.transcript.text


def test_compaction_drops_a_tail_that_does_not_start_at_a_user_turn(make) -> None:
    """The last four messages are a call, two results and the answer: none is a user turn, so
    nothing is kept after the summary (the fifth from the end, the user's, is not reached)."""
    a = make()
    _exchanges(a, 1)
    Script(a, ["two</think>" + calls(("read", {"path": "src/app.py"}), ("list", {"path": "src"})),
               "ok</think>It returns 1." + EOS])
    list(a.run("look"))
    assert [r for r, _ in _roles(a)][-5:] == ["user", "assistant", "tool", "tool", "assistant"]
    Script(a, ["summing up</think>Read app.py." + EOS])
    events, done = _result(a.compact())
    assert done is True and [e.kind for e in events] == ["compacted"]
    assert _roles(a) == [("system", a.conv.system), ("user", "Summary of the work so far:\nRead app.py."),
                         ("assistant", "Understood; continuing from that summary.")]


def test_compaction_before_a_step_keeps_the_pending_message(make, monkeypatch) -> None:
    a = make()
    _exchanges(a)
    monkeypatch.setattr(agent_mod, "COMPACT_AT", 0.0)  # compact before every step
    Script(a, ["summing up</think>Three long answers." + EOS, "ok</think>Next." + EOS])
    events = _quiet(a.run("what next?"))
    assert [e.kind for e in events] == ["compacted", "turn", "done"]
    assert _roles(a)[1:] == [("user", "Summary of the work so far:\nThree long answers."),
                             ("assistant", "Understood; continuing from that summary."),
                             ("user", "question 1"), ("assistant", "Answer 1: " + LONG),
                             ("user", "question 2"), ("assistant", "Answer 2: " + LONG),
                             ("user", "what next?"), ("assistant", "Next.")]
    assert agent_mod.COMPACT_REQUEST not in a.conv.transcript.text  # the request went with the old conversation


def test_nothing_to_compact_before_the_first_answer(make) -> None:
    a = make()
    events, done = _result(a.compact())
    assert (events, done) == ([], False)
    assert [r for r, _ in _roles(a)] == ["system"]


@pytest.mark.parametrize("summary, why", [
    (("summary so far", "length"), "the summary reached the token limit (-n)"),
    (("summary so far", "context"), "the context is too full to write a summary"),
    ("only reasoning</think>" + EOS, "no summary was produced"),
    ("long</think>" + "The summary repeats everything and more. " * 100 + EOS,
     "the summary was not shorter than the conversation"),
])
def test_a_compaction_that_fails_says_why_and_changes_nothing(make, summary, why) -> None:
    a = make(max_tokens=2000)
    Script(a, ["ok</think>Short." + EOS])
    list(a.run("q"))
    before = (list(a.conv.transcript.tokens), _roles(a))
    Script(a, [summary])
    events, done = _result(a.compact())
    assert done is False
    assert [(e.kind, e.text, e.ok) for e in events] == [
        ("compact_failed", f"not compacted: {why}; the conversation is unchanged", False)]
    assert (a.conv.transcript.tokens, _roles(a)) == before


def _stop_at_step(a: Agent, script: Script, n: int) -> None:
    """Set the stop flag as the script's ``n``-th sampled step goes out (Ctrl+C while it writes)."""
    real = script.generate

    def stopping(*args, **kw):
        for i, step in enumerate(real(*args, **kw)):
            if i == n:
                a.conv.stop.set()
            yield step

    a.conv.session.generate = stopping


def test_a_compaction_stopped_by_the_user_says_so(make) -> None:
    a = make()
    _exchanges(a, 1)
    script = Script(a, ["summary so far: and more text follows" + EOS])
    _stop_at_step(a, script, 2)
    events, done = _result(a.compact())
    assert done is False and [e.text for e in events] == [
        "not compacted: the summary was interrupted; the conversation is unchanged"]


# -- the system prompt, prime, construction ---------------------------------------------------------

def test_prime_starts_the_conversation_again_from_the_system_prompt(make, engine, ws, tmp_path) -> None:
    a = make()
    Script(a, ["ok</think>Hi." + EOS])
    list(a.run("hello"))
    from ds4agent.sessions import StoreError

    store = SessionStore(tmp_path / "s")

    class Damaged:
        """A store whose copy of the system prompt cannot be loaded (a damaged file)."""

        def saved(self, text: bytes) -> str:
            return "0" * 40

        def load(self, sha: str, session) -> None:
            session.reset()
            raise StoreError("damaged")

        def save(self, session, reason: str):
            return store.save(session, reason)

    n = a.prime(Damaged())  # prefilled, as with no copy at all, and saved again
    system = {"role": "system", "content": a.conv.system, "tools": a.conv.tools}
    assert a.conv.messages == [system] and a.conv.dirty is False
    assert a.conv.session.tokens == a.conv.transcript.tokens and n == len(a.conv.transcript.tokens)
    assert [i.reason for i in store.list()] == ["agent-system"]
    b = Agent(engine, ws, Policy("yolo"), None)
    assert b.prime(store) == 0 and b.conv.session.tokens == a.conv.transcript.tokens
    assert b.conv.dirty is False


def test_the_agent_is_built_as_asked(engine, ws) -> None:
    from ds4agent.engine import SamplingParams
    from ds4agent.tools import Tool, ToolResult

    extra = Tool("weather", "The weather.", {"type": "object", "properties": {}}, lambda ws, **kw: ToolResult("sunny", "sunny"))
    clash = Tool("read", "Not the real read.", {"type": "object", "properties": {}}, lambda ws, **kw: ToolResult("x", "x"))
    inst = Instructions(ws.root)
    params = SamplingParams(temperature=0.3)
    a = Agent(engine, ws, Policy("yolo"), None, sampling=params, extra_tools=[extra, clash], instructions=inst)
    assert a.instructions is inst
    assert a.tools["weather"] is extra and a.tools["read"].description != "Not the real read."
    assert a.conv.tools == [t.schema() for t in a.tools.values()] and extra.schema() in a.conv.tools
    assert a.conv.system == system_prompt(ws, inst) and a.conv.sampling is params
    assert (a.conv.mode, a.conv.max_tokens) == ("thinking", 8192)
    b = Agent(engine, ws, Policy("yolo"), None, max_tokens=77, mode="chat")
    assert (b.conv.mode, b.conv.max_tokens) == ("chat", 77)


def test_the_system_prompt_reads_the_project_instructions(ws) -> None:
    text = system_prompt(ws)
    assert text.startswith(f"You are ds4agent, a coding assistant working inside the user's repository at {ws.root}.")
    assert text.endswith("\n\nInstructions from AGENTS.md:\nAlways run pytest.")
    assert system_prompt(ws, Instructions(ws.root / "src")) == agent_mod.SYSTEM_PROMPT.format(root=ws.root)


# -- instructions found while working --------------------------------------------------------------

@pytest.mark.parametrize("tool", ["read", "write", "edit", "list", "search", "outline"])
def test_a_path_tool_finds_the_instructions_of_its_directory(make, tool) -> None:
    a = make()
    found = a._instructions_for(tool, {"path": "sub/x.py"})
    assert [f.label for f in found] == [str(Path("sub") / "AGENTS.md")]
    assert a._instructions_for(tool, {"path": "sub/x.py"}) == []  # each file once


def test_other_calls_find_no_instructions(make) -> None:
    a = make()
    assert a._instructions_for("bash", {"path": "sub/x.py"}) == []
    assert a._instructions_for("read", "sub/x.py") == []  # arguments that were not an object
    assert a._instructions_for("read", {"path": "../elsewhere"}) == []  # outside the workspace
    assert a._instructions_for("read", {"path": "bad\0path"}) == []  # no path can hold it
    assert a._instructions_for("read", {"path": 3}) == []  # the root's were read at start
    assert a._instructions_for("list", {}) == []
    assert [f.label for f in a._instructions_for("read", {"path": "sub"})] == [str(Path("sub") / "AGENTS.md")]


def test_instructions_found_by_a_call_go_with_its_result(make) -> None:
    a = make()
    Script(a, ["r</think>" + call("read", path="sub/x.py"), "ok</think>Done." + EOS])
    events = _quiet(a.run("read sub"))
    assert [e.kind for e in events] == ["turn", "tool", "note", "turn", "done"]
    assert events[2].text == "read the project instructions in sub/AGENTS.md"
    result = next(m for m in a.conv.messages if m["role"] == "tool")["content"]
    assert result == ("1\tx = 1\n[lines 1-1 of 1; end of file]"
                      "\n\n[Project instructions from sub/AGENTS.md; they apply to files under sub/ and take "
                      "precedence over more general ones:\nIn sub, use tabs.\n]")
    assert events[1].data["result"] == result


def test_a_refused_call_finds_no_instructions(make) -> None:
    a = make("ask", lambda req: "no")
    Script(a, ["w</think>" + call("write", path="sub/new.py", content="y = 2\n"), "ok</think>Fine." + EOS])
    events = _quiet(a.run("write"))
    assert [e.kind for e in events] == ["turn", "refused", "turn", "done"]
    assert "In sub, use tabs." not in a.conv.transcript.text


# -- the journal (/undo) ----------------------------------------------------------------------------

def test_each_request_is_one_journal_step(make) -> None:
    class Journal:
        def __init__(self) -> None:
            self.calls: list = []

        def begin(self, task: str) -> None:
            self.calls.append(("begin", task))

        def end(self):
            self.calls.append(("end",))
            return "step-1"

    a = make()
    a.ws.journal = j = Journal()
    try:
        Script(a, ["ok</think>Hi." + EOS])
        list(a.run("say hi"))
    finally:
        a.ws.journal = None
    assert j.calls == [("begin", "say hi"), ("end",)] and a.last_step == "step-1"


# -- call arguments as shown in events ------------------------------------------------------------

def test_arguments_are_decoded_when_they_are_json() -> None:
    assert _arguments('{"path": "a.py"}') == {"path": "a.py"}
    assert _arguments("[1, 2]") == [1, 2]  # valid JSON, not an object: shown as decoded
    assert _arguments("{not json") == "{not json"
    deep = "[" * 100_000
    assert _arguments(deep) == deep  # too deep to decode: shown as written
    given = {"path": "b.py"}
    assert _arguments(given) is given


# -- @mentions ---------------------------------------------------------------------------------------

def test_mentions_each_file_once_and_in_order(ws) -> None:
    (ws.root / "README").write_text("read me\n")
    text, attached, notes = attach_mentions("see @... then @src/app.py, @src/app.py and @README", ws)
    assert attached == ["src/app.py", "README"] and notes == []
    assert text == ("see @... then @src/app.py, @src/app.py and @README\n\n"
                    "Content of src/app.py:\n```\ndef main():\n    return 1\n\n```\n\n"
                    "Content of README:\n```\nread me\n\n```")


def test_mentions_sniff_only_the_first_8192_bytes_and_attach_up_to_the_limit(ws) -> None:
    from ds4agent.conversation.agent import MENTION_MAX

    (ws.root / "late-nul.txt").write_bytes(b"a" * 8192 + b"\0")
    text, attached, notes = attach_mentions("@late-nul.txt", ws)
    assert attached == ["late-nul.txt"] and notes == []
    (ws.root / "early-nul.txt").write_bytes(b"a" * 8191 + b"\0")
    assert attach_mentions("@early-nul.txt", ws)[1:] == ([], ["@early-nul.txt: not a text file; not attached"])
    (ws.root / "exact.txt").write_text("y" * MENTION_MAX)
    text, attached, notes = attach_mentions("@exact.txt", ws)
    assert attached == ["exact.txt"] and notes == []
    assert text == "@exact.txt\n\nContent of exact.txt:\n```\n" + "y" * MENTION_MAX + "\n```"
    (ws.root / "over.txt").write_text("z" * (MENTION_MAX + 1))
    text, attached, notes = attach_mentions("@over.txt", ws)
    assert notes == [f"@over.txt: attached the first {MENTION_MAX} characters only (the file has {MENTION_MAX + 1} bytes)"]
    assert text.endswith("z" * MENTION_MAX + f"\n[truncated: the first {MENTION_MAX} characters of "
                         f"{MENTION_MAX + 1} bytes; use read for the rest]\n```")


# -- more of the loop, with the model's turns faked ------------------------------------------------

def test_a_turn_that_ends_without_a_finish_is_an_error(make) -> None:
    a = make()
    FakeTurns(a, [None], finish=None)
    events = _quiet(a.run("hi"))
    assert [e.kind for e in events] == ["turn", "done"]
    assert events[0].data["finish"] == "" and events[1].stop == "error"


def test_usage_of_a_turn_that_prefilled_its_whole_prompt(make) -> None:
    a = make()
    FakeTurns(a, [None], stats=(50, 50, 7))  # nothing came from the KV: no cache read
    events = _quiet(a.run("hi"))
    assert events[0].data["usage"] == {"input_tokens": 50, "cache_read_input_tokens": 0, "output_tokens": 7}
    FakeTurns(a, [None], stats=(50, 20, 7))
    events = _quiet(a.run("hi"))
    assert events[0].data["usage"] == {"input_tokens": 20, "cache_read_input_tokens": 30, "output_tokens": 7}


def test_calls_not_run_after_a_stop_answer_their_own_ids(make, monkeypatch) -> None:
    a = make()
    _stop_after_tools(monkeypatch, a)
    fake = FakeTurns(a, [[("read", {"path": "src/app.py"}), ("list", {"path": "src"}), ("read", {"path": "sub/x.py"})],
                         None])
    assert list(a.run("look"))[-1].stop == "interrupted"
    list(a.run("go on"))
    assert fake.given[1] == [
        {"role": "tool", "tool_call_id": "call_0", "content": READ_APP},
        {"role": "tool", "tool_call_id": "call_1", "content": "error: not run: the user interrupted the agent"},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: not run: the user interrupted the agent"},
        {"role": "user", "content": "go on"}]


def test_a_failed_tool_is_a_tool_event_that_is_not_ok(make) -> None:
    a = make()
    FakeTurns(a, [[("read", {"path": "no/such/file.py"})], None])
    tool = next(e for e in a.run("read") if e.kind == "tool")
    assert tool.ok is False and tool.data["result"].startswith("error:")


def test_near_full_is_past_four_fifths_of_the_context_with_history(make) -> None:
    a = make()
    a.conv.set_context(5000)  # four fifths: 4000 tokens
    tokens = a.conv.transcript.tokens
    real = list(tokens)
    try:
        tokens[:] = [0] * 4001
        assert a._near_full() is False  # only the system prompt: nothing to summarise
        Script(a, ["ok</think>Hi." + EOS])
        a.conv.transcript.messages.append({"role": "user", "content": "x"})
        a.conv.transcript.messages.append({"role": "assistant", "content": "Hi."})
        assert a._near_full() is True
        tokens[:] = [0] * 4000
        assert a._near_full() is False  # exactly four fifths is not past them
    finally:
        tokens[:] = real


def test_the_summary_is_asked_for_with_the_compact_request(make) -> None:
    a = make()
    _exchanges(a, 1)
    script = Script(a, ["summing up</think>One answer." + EOS])
    _result(a.compact())
    assert script.asked == [{"role": "user", "content": (
        "Summarise this conversation for your own future reference: the task, the files inspected or "
        "changed, commands run and what they showed, decisions taken, what remains to do. "
        "Be concrete and brief. Do not call tools.")}]


def test_a_summary_request_that_cannot_fit_changes_nothing(make) -> None:
    a = make()
    _exchanges(a, 1)
    before = (list(a.conv.transcript.tokens), _roles(a))
    events, done = _result(a.compact([{"role": "user", "content": "word " * 9000}]))
    assert done is False and [e.text for e in events] == [
        "not compacted: the context is too full to write a summary; the conversation is unchanged"]
    assert (a.conv.transcript.tokens, _roles(a)) == before


def test_a_malformed_call_cut_off_by_the_context_is_not_written_again(make) -> None:
    a = make()
    Script(a, [('x</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="read">\n<｜DSML｜parameter name="pa', "context")])
    events = _quiet(a.run("read"))
    assert events[-1].stop == "context"
    assert [r for r, _ in _roles(a)] == ["system", "user", "assistant"]


def test_a_mention_right_after_a_code_span_is_attached(ws) -> None:
    assert attach_mentions("see `x`@src/app.py", ws)[1] == ["src/app.py"]


def test_mention_notes_cut_long_names_to_80_characters(ws) -> None:
    name = "a" * 300
    assert attach_mentions("@" + name, ws)[2] == [
        "@" + "a" * 80 + ": file name too long in the path (a name has at most 255 bytes); not attached"]
    deep = "ab/" * 1360  # under 4096 characters, but longer than the OS takes under the root
    assert attach_mentions("@" + deep, ws)[2] == ["@" + deep[:80] + ": File name too long; not attached"]


# -- @mentions: the edge cases of issue 22's survivors ----------------------------------------------

def test_the_attach_limit_is_the_documented_100000_characters() -> None:
    from ds4agent.conversation.agent import MENTION_MAX

    assert MENTION_MAX == 100_000  # README: "up to 100 000 characters"


def test_a_trailing_dot_is_kept_when_the_file_has_it(ws) -> None:
    (ws.root / "v2.").write_text("two\n")
    assert attach_mentions("see @v2.", ws)[1:] == (["v2."], [])
    (ws.root / "src" / "BOX").write_text("box\n")  # only the sentence's dots go, not the name's letters
    assert attach_mentions("see @src/BOX.", ws)[1:] == (["src/BOX"], [])


def test_a_fifo_is_not_opened(ws) -> None:
    import os

    fifo = ws.root / "pipe"
    if not fifo.exists():
        os.mkfifo(fifo)
    # Opening a FIFO would block until a writer came: it is refused before any open.
    assert attach_mentions("read @pipe", ws)[1:] == ([], ["@pipe: not a regular file; not attached"])


def test_mentions_after_a_binary_file_are_still_attached(ws) -> None:
    (ws.root / "blob.bin").write_bytes(b"\0\1\2")
    text, attached, notes = attach_mentions("@blob.bin and @src/app.py", ws)
    assert attached == ["src/app.py"] and notes == ["@blob.bin: not a text file; not attached"]


@pytest.mark.skipif(__import__("sys").flags.utf8_mode, reason="in UTF-8 mode open() ignores the locale")
def test_mentions_are_read_as_utf8_whatever_the_locale(ws) -> None:
    import locale

    (ws.root / "cafe.txt").write_text("café\n", encoding="utf-8")
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale: open() without an encoding fails here
    try:
        text, attached, notes = attach_mentions("@cafe.txt", ws)
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert attached == ["cafe.txt"] and notes == [] and "café" in text


# -- stops in the middle of a turn --------------------------------------------------------------------

def test_stopped_while_the_model_writes_is_an_interrupted_stop(make) -> None:
    a = make()
    script = Script(a, ["thinking</think>An answer that goes on and on" + EOS])
    _stop_at_step(a, script, 2)
    events = _quiet(a.run("q"))
    assert [(e.kind, e.text) for e in events[-2:]] == [("interrupted", "interrupted"), ("done", "")]
    assert events[-1].stop == "interrupted"


def test_a_compaction_withdrawn_before_its_summary_says_it_was_interrupted(make) -> None:
    a = make()
    _exchanges(a, 1)
    before = (list(a.conv.transcript.tokens), _roles(a))
    real_sync = a.conv.session.sync

    def sync(ids):  # the stop arrives during the prefill of the summary request
        out = real_sync(ids)
        a.conv.stop.set()
        return out

    a.conv.session.sync = sync
    Script(a, ["never sampled" + EOS])
    events, done = _result(a.compact())
    assert done is False and [e.text for e in events] == [
        "not compacted: the summary was interrupted; the conversation is unchanged"]
    assert (a.conv.transcript.tokens, _roles(a)) == before


def test_a_summary_exactly_as_long_as_the_conversation_is_not_a_compaction(make) -> None:
    a = make(max_tokens=2000)
    _exchanges(a, 3)  # more than the kept tail: a short summary is shorter
    before = len(a.conv.transcript.tokens)
    mark = a.conv.mark()

    def compacted_length(summary: str) -> int | None:
        Script(a, ["s</think>" + summary + EOS])
        events, done = _result(a.compact())
        n = len(a.conv.transcript.tokens) if done else None
        a.conv.restore(mark)
        return n

    base = compacted_length("A")
    assert base is not None and base < before
    pad = before - base  # each " A" is one more token of the summary
    assert compacted_length("A" + " A" * (pad - 1)) == before - 1  # one token shorter: compacted
    Script(a, ["s</think>" + "A" + " A" * pad + EOS])
    events, done = _result(a.compact())
    assert done is False and [e.text for e in events] == [
        "not compacted: the summary was not shorter than the conversation; the conversation is unchanged"]


# -- taking over a loaded session -----------------------------------------------------------------

def test_a_cached_system_prompt_is_loaded_and_not_saved_again(make, engine, ws, store) -> None:
    make()  # the store now holds the system prompt's KV
    saves: list[str] = []

    class Watching:
        def saved(self, text: bytes):
            return store.saved(text)

        def load(self, sha: str, session) -> None:
            store.load(sha, session)

        def save(self, session, reason: str):
            saves.append(reason)
            return store.save(session, reason)

    b = Agent(engine, ws, Policy("yolo"), None)
    assert b.prime(Watching()) == 0 and saves == []  # a hit is neither prefilled nor written again


def test_an_agent_session_is_taken_over_as_it_is(make) -> None:
    a = make()
    Script(a, ["ok</think>Hi." + EOS])
    list(a.run("hello"))
    a.conv.session.sync(a.conv.transcript.tokens)  # as loading its saved file leaves the KV (the script sampled none)
    before = (list(a.conv.transcript.tokens), _roles(a), a.conv.system, a.conv.tools)
    a.conv.dirty = True
    assert a.adopt_session() == "agent"
    assert (a.conv.transcript.tokens, _roles(a), a.conv.system, a.conv.tools) == before
    assert a.conv.dirty is False  # just loaded: nothing to save


def test_a_chat_session_continues_under_the_agent_prompt_with_tools(make) -> None:
    from ds4agent.protocol.transcript import Transcript

    a = make()
    agent_system = {"role": "system", "content": a.conv.system, "tools": a.conv.tools}
    chat = Transcript(a.conv.tok, "thinking")
    chat.append({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"})
    a.conv.session.sync(chat.tokens)  # as loading the chat's file would leave the KV
    assert a.adopt_session() == "chat"
    assert a.conv.messages == [agent_system, {"role": "user", "content": "hi"}]  # the chat's system gives way
    assert (a.conv.system, a.conv.tools) == (agent_system["content"], agent_system["tools"])
    # The KV holds the agent's system prompt (from its snapshot); the chat's message is prefilled next.
    n = len(a.conv.session.tokens)
    assert 0 < n < len(a.conv.transcript.tokens) and a.conv.session.tokens == a.conv.transcript.tokens[:n]
    assert a.conv.dirty is True  # a new agent conversation, not the chat's saved file
