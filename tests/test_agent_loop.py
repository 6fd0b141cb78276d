"""The agent loop's own edges, exactly (conversation/agent.py).

The model is scripted (its completions are fixed text); the template, streaming parser,
transcript, KV, tools and policy are the product's own. Expected values are worked out from
the code's contract (docstrings, event docs), not copied from a run.
"""

from __future__ import annotations

import time

import pytest

from ds4agent.conversation import agent as agent_mod

from agent_fixtures import (  # noqa: F401 (fixtures: engine, repo, store, ws, make)
    EOS,
    LONG,
    READ_APP,
    FakeTurns,
    Script,
    _exchanges,
    _quiet,
    _result,
    _roles,
    _stop_after_tools,
    _stop_at_step,
    call,
    calls,
    engine,
    make,
    repo,
    store,
    ws,
)

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




def test_a_compaction_stopped_by_the_user_says_so(make) -> None:
    a = make()
    _exchanges(a, 1)
    script = Script(a, ["summary so far: and more text follows" + EOS])
    _stop_at_step(a, script, 2)
    events, done = _result(a.compact())
    assert done is False and [e.text for e in events] == [
        "not compacted: the summary was interrupted; the conversation is unchanged"]
