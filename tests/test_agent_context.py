"""The agent's context, exactly (conversation/agent.py): the system prompt and priming, the
instructions found while working, the journal, call arguments as events show them, @mentions,
stops in the middle of a turn, and taking over a loaded session.

The model is scripted (its completions are fixed text); the template, streaming parser,
transcript, KV, tools and policy are the product's own. Expected values are worked out from
the code's contract (docstrings, event docs), not copied from a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4agent.conversation import agent as agent_mod
from ds4agent.conversation.agent import Agent, _arguments, attach_mentions, system_prompt
from ds4agent.conversation.instructions import Instructions
from ds4agent.sessions import SessionStore
from ds4agent.tools import Policy

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
