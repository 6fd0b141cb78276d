"""The conversation layer's own edges (conversation/turns.py).

The front-end tests see the conversation through the chat and the agent; these pin what the
module itself promises: the counters in ``Stats``, when Think Max applies and when a mode switch
re-renders, reset/mark/restore, where the system message goes, the context check, how prefill is
chunked and reported, how a finished, tool-calling, malformed, interrupted or withdrawn turn is
recorded, and reading a loaded session back.

Generation is scripted where the exact tokens and timings matter (``_script`` replaces the
session's ``generate``: the model itself is the demo model, whose output is noise); prefill
runs the real demo model.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import ds4agent.conversation.turns as turns
from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.session import Step
from ds4agent.protocol import THINK_MAX_MIN_CTX, Transcript, render

EOS_TEXT = "<｜end▁of▁sentence｜>"
TOOL = {"type": "function", "function": {"name": "write", "description": "Write a file.",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
BLOCK = ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="write">\n'
         '<｜DSML｜parameter name="path" string="true">a.txt</｜DSML｜parameter>\n'
         '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


def _conv(engine, mode: str = "chat", **kw) -> turns.Conversation:
    return turns.Conversation(engine, mode=mode, sampling=SamplingParams(temperature=0), max_tokens=kw.pop("max_tokens", 200), **kw)


def _script(conv: turns.Conversation, completion: str, seconds: list[float] | None = None,
            finish_last: str | None = None) -> list[int]:
    """Make the session "sample" the ids of ``completion`` (rendered text: control strings are
    their tokens), each step taking ``seconds[i]``. Returns the ids."""
    tok = conv.tok
    ids = tok.encode_rendered(completion)
    secs = seconds if seconds is not None else [0.0] * len(ids)

    def generate(params, max_tokens=50000):
        for i, t in enumerate(ids[:max_tokens]):
            finish = "eos" if t == tok.eos_id else ("length" if i + 1 == max_tokens else None)
            if finish is None and i + 1 == len(ids):
                finish = finish_last
            yield Step(t, i, secs[i], finish)
            if finish:
                return

    conv.session.generate = generate
    return ids


def _clock(monkeypatch, *values: float) -> None:
    """turns.py's perf_counter (prefill timing) reads these values in turn."""
    it = iter(values)
    monkeypatch.setattr(turns, "time", SimpleNamespace(perf_counter=lambda: next(it)))


def _prompt_len(tok, mode: str, *messages: dict) -> int:
    t = Transcript(tok, mode)
    t.append(*messages)
    return len(t.tokens)


# -- state --------------------------------------------------------------------------------------

def test_a_new_conversation_starts_with_zero_stats_and_clean(engine) -> None:
    conv = _conv(engine)
    assert dataclasses.astuple(conv.stats) == (0, 0, 0.0, 0, 0.0, 0, 0)
    assert conv.dirty is False
    assert conv.messages == [] and conv.transcript.tokens == [] and conv.transcript.text == ""


def _render_mode(engine, mode: str, ctx: int) -> tuple[str, str | None]:
    conv = _conv(engine, mode)
    conv.session = SimpleNamespace(ctx=ctx)  # _render_mode reads only the context size
    return conv._render_mode()


def test_think_max_needs_the_minimum_context_exactly(engine) -> None:
    assert THINK_MAX_MIN_CTX == 393216
    assert _render_mode(engine, "max", 393216) == ("thinking", "max")
    assert _render_mode(engine, "max", 393215) == ("thinking", None)  # falls back to thinking
    assert _render_mode(engine, "thinking", 393216) == ("thinking", None)
    assert _render_mode(engine, "chat", 393216) == ("chat", None)
    assert _render_mode(engine, "chat", 4096) == ("chat", None)


@pytest.fixture()
def rerenders(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    real = Transcript.rerender

    def spy(self, thinking_mode=None, reasoning_effort=None):
        calls.append((thinking_mode, reasoning_effort))
        return real(self, thinking_mode, reasoning_effort)

    monkeypatch.setattr(Transcript, "rerender", spy)
    return calls


def test_set_mode_rerenders_only_when_the_effort_changes_and_there_are_messages(engine, monkeypatch, rerenders) -> None:
    monkeypatch.setattr(turns, "THINK_MAX_MIN_CTX", 4096)  # so the demo context qualifies for Think Max
    empty = _conv(engine, "thinking")
    empty.set_mode("max")
    assert rerenders == []  # nothing rendered yet: the first turn renders with the new effort
    assert (empty.transcript.thinking_mode, empty.transcript.reasoning_effort) == ("thinking", "max")

    conv = _conv(engine, "thinking")
    _script(conv, "hmm</think>hello" + EOS_TEXT)
    list(conv.turn("hi"))
    conv.set_mode("max")
    assert rerenders == [("thinking", "max")]
    assert conv.transcript.text == render(conv.messages, "thinking", "max", drop_thinking=False)
    assert conv.transcript.reasoning_effort == "max"
    conv.set_mode("thinking")
    assert rerenders == [("thinking", "max"), ("thinking", None)]
    assert conv.transcript.text == render(conv.messages, "thinking", None, drop_thinking=False)
    conv.set_mode("chat")  # the effort stays None: no re-render, the next turns render as chat
    assert rerenders == [("thinking", "max"), ("thinking", None)]
    assert (conv.transcript.thinking_mode, conv.transcript.reasoning_effort) == ("chat", None)


def test_reset_empties_the_kv_and_the_transcript_and_is_clean(engine) -> None:
    conv = _conv(engine, system="old")
    _script(conv, "hello" + EOS_TEXT)
    list(conv.turn("hi"))
    assert conv.dirty is True and conv.session.tokens != []
    conv.reset("new")
    assert conv.session.tokens == [] and conv.dirty is False
    assert conv.messages == [] and conv.transcript.tokens == [] and conv.transcript.text == ""
    _script(conv, "ok" + EOS_TEXT)
    list(conv.turn("hi"))
    assert conv.messages[0] == {"role": "system", "content": "new"}


def test_restore_returns_to_the_mark(engine) -> None:
    conv = _conv(engine, system="sys", tools=[TOOL])
    _script(conv, "hello" + EOS_TEXT)
    list(conv.turn("hi"))
    conv.dirty = False  # as after a save
    t = conv.transcript
    before = (list(t.messages), list(t.tokens), t.text, list(conv.session.tokens))
    m = conv.mark()
    assert (m.n_messages, m.n_tokens, m.dirty, m.system, m.tools) == (3, len(t.tokens), False, "sys", [TOOL])
    _script(conv, "again" + EOS_TEXT)
    list(conv.turn("more"))
    conv.system, conv.tools = "other", None
    assert len(conv.session.tokens) > len(before[3])
    conv.restore(m)
    t = conv.transcript
    assert (t.messages, t.tokens, t.text, conv.session.tokens) == before
    assert (conv.dirty, conv.system, conv.tools, conv._turn) == (False, "sys", [TOOL], None)
    # A transcript replaced since the mark (reset) is put back too.
    conv.reset()
    conv.restore(m)
    assert conv.transcript is t and (t.messages, t.tokens, t.text) == before[:3]
    assert conv.session.tokens == before[3]


# -- a turn --------------------------------------------------------------------------------------

def test_the_system_message_and_its_tools_open_the_first_turn_only(engine) -> None:
    conv = _conv(engine, system="Be brief.", tools=[TOOL])
    _script(conv, "ok" + EOS_TEXT)
    list(conv.turn("hi"))
    assert conv.messages[:2] == [{"role": "system", "content": "Be brief.", "tools": [TOOL]},
                                 {"role": "user", "content": "hi"}]
    _script(conv, "ok" + EOS_TEXT)
    list(conv.turn("again"))
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant"]

    plain = _conv(engine, system="Be brief.")
    _script(plain, "ok" + EOS_TEXT)
    list(plain.turn("hi"))
    assert plain.messages[0] == {"role": "system", "content": "Be brief."}  # no "tools" key

    none = _conv(engine)
    _script(none, "ok" + EOS_TEXT)
    list(none.turn("hi"))
    assert [m["role"] for m in none.messages] == ["user", "assistant"]


def test_a_finished_chat_turn(engine) -> None:
    conv = _conv(engine)
    conv.session.prefill_chunk = 256
    ids = _script(conv, "hello" + EOS_TEXT, [0.25, 0.25])
    conv.dirty = False
    events = list(conv.turn("hi"))
    assert [(e.kind, e.text, e.finish) for e in events if e.kind != "prefill"] == [("content", "hello", ""), ("done", "", "eos")]
    assert conv.dirty is True
    assert conv.messages[-1] == {"role": "assistant", "content": "hello", "tool_calls": []}
    # "<BOS><User>hi<Assistant></think>" is 5 ids; the sampled ids (ending in EOS) are kept as they are.
    assert conv.stats.prompt_tokens == 5
    assert conv.transcript.tokens[5:] == ids and len(ids) == 2
    st = conv.stats
    assert (st.gen_tokens, st.gen_tps, st.turns, st.total_generated) == (2, 4.0, 1, 2)  # 2 tokens in 0.5 s
    # A second turn: counters add up, the per-turn ones start again.
    _script(conv, "a b c" + EOS_TEXT, [0.5, 0.5, 0.5, 0.5])
    # the per-turn counters follow the reply as it streams (a status line reads them mid-turn)
    live = [conv.stats.gen_tokens for e in conv.turn("more") if e.kind == "content"]
    assert live == [1, 2, 3]
    st = conv.stats
    assert (st.gen_tokens, st.gen_tps, st.turns, st.total_generated) == (4, 2.0, 2, 6)
    # A turn with a limit of 0 tokens: no step at all, finish "length", per-turn counters zero.
    conv.max_tokens = 0
    events = list(conv.turn("nothing"))
    assert events[-1].kind == "done" and events[-1].finish == "length"
    assert (conv.stats.gen_tokens, conv.stats.gen_tps, conv.stats.turns) == (0, 0.0, 3)


def test_generation_without_measured_time_reports_zero_speed(engine) -> None:
    conv = _conv(engine)
    _script(conv, "hello" + EOS_TEXT, [0.0, 0.0])
    list(conv.turn("hi"))
    assert (conv.stats.gen_tokens, conv.stats.gen_tps) == (2, 0.0)


def test_a_finished_thinking_turn_keeps_the_reasoning(engine) -> None:
    conv = _conv(engine, "thinking")
    ids = _script(conv, "let me see</think>hello" + EOS_TEXT)
    events = list(conv.turn("hi"))
    assert "".join(e.text for e in events if e.kind == "reasoning") == "let me see"
    assert "".join(e.text for e in events if e.kind == "content") == "hello"
    assert conv.messages[-1] == {"role": "assistant", "content": "hello", "tool_calls": [], "reasoning_content": "let me see"}
    assert conv.transcript.tokens[5:] == ids
    # Already closed: closing or settling it again changes nothing.
    tokens, messages = list(conv.transcript.tokens), list(conv.messages)
    conv._close_turn()
    assert conv.interrupted() == "kept"
    assert (conv.transcript.tokens, conv.messages, conv.stats.turns) == (tokens, messages, 1)


@pytest.fixture()
def kept(monkeypatch) -> list[bool]:
    """What each append_sampled returned: True when the sampled ids were kept as they are (a
    wrong EOS count would make the ids differ from the rendering and get re-tokenised)."""
    out: list[bool] = []
    real = Transcript.append_sampled

    def spy(self, message, sampled):
        out.append(real(self, message, sampled))
        return out[-1]

    monkeypatch.setattr(Transcript, "append_sampled", spy)
    return out


def test_a_tool_call_turn_cut_before_its_end_of_sentence(engine, kept) -> None:
    conv = _conv(engine, "thinking")
    ids = _script(conv, "ok</think>\n\n" + BLOCK, finish_last="length")
    events = list(conv.turn("write it"))
    assert "".join(e.text for e in events if e.kind == "reasoning") == "ok"
    assert "".join(e.text for e in events if e.kind == "content") == ""
    assert [(e.kind, e.text) for e in events if e.kind not in ("prefill", "reasoning", "content")] == [
        ("call_start", "write"), ("call", 'write {"path": "a.txt"}'), ("done", "")]
    assert events[-1].finish == "length"
    assert conv.messages[-1] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "write", "arguments": '{"path": "a.txt"}'}}],
        "reasoning_content": "ok", "dsml": BLOCK}
    assert ids[-1] != conv.tok.eos_id
    assert conv.transcript.tokens[conv.stats.prompt_tokens:] == ids + [conv.tok.eos_id]  # closed with EOS
    assert kept == [True]


def test_a_tool_call_turn_with_its_end_of_sentence_gets_no_second_one(engine, kept) -> None:
    conv = _conv(engine, "chat")
    ids = _script(conv, "\n\n" + BLOCK + EOS_TEXT)
    events = list(conv.turn("write it"))
    assert events[-1].finish == "eos"
    assert conv.messages[-1]["dsml"] == BLOCK and "reasoning_content" not in conv.messages[-1]
    assert conv.transcript.tokens[conv.stats.prompt_tokens:] == ids
    assert kept == [True]  # one EOS: the ids are exactly the rendering


def test_a_malformed_tool_block_is_reported_and_kept_as_text(engine) -> None:
    conv = _conv(engine, "chat")
    bad = "\n\n<｜DSML｜tool_calls> \nx"
    _script(conv, bad + EOS_TEXT)
    events = list(conv.turn("write it"))
    assert [(e.kind, e.text) for e in events if e.kind not in ("prefill", "content")] == [
        ("dsml_error", "expected '>' and a newline between DSML tags"), ("done", "")]
    assert events[-1].finish == "eos"
    assert conv.messages[-1] == {"role": "assistant", "content": bad}  # EOS stripped, then closed again
    assert conv.transcript.tokens[-1] == conv.tok.eos_id
    assert conv.tok.decode(conv.transcript.tokens[conv.stats.prompt_tokens:]) == bad + EOS_TEXT


def test_a_turn_the_model_ends_inside_a_tool_block_ends_at_its_end_of_sentence(engine) -> None:
    conv = _conv(engine, "chat")
    open_block = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="write">\n<｜DSML｜parameter name="path" string="true">a.t'
    _script(conv, open_block + EOS_TEXT)
    events = list(conv.turn("write it"))
    # the reply says "error" (the block never closed); the turn ends at the end of sentence
    # and keeps the unfinished block as text
    assert [e.kind for e in events if e.kind != "prefill"] == ["call_start", "done"] and events[-1].finish == "eos"
    assert conv.messages[-1] == {"role": "assistant", "content": open_block}
    assert conv.tok.decode(conv.transcript.tokens[conv.stats.prompt_tokens:]) == open_block + EOS_TEXT


def test_a_turn_that_fails_mid_reply_counts_every_token_it_sampled(engine) -> None:
    conv = _conv(engine, "chat")
    ids = conv.tok.encode_rendered("hello\n\n")  # the blank line is held back: a tool block may follow

    def generate(params, max_tokens=50000):
        for i, t in enumerate(ids):
            yield Step(t, i, 0.1, None)
        raise RuntimeError("device lost")

    conv.session.generate = generate
    seen = []
    with pytest.raises(RuntimeError, match="device lost"):
        for ev in conv.turn("hi"):
            seen.append(ev.kind)
    assert "content" in seen and len(ids) > 1
    # the held-back token gave no event, and still counts
    assert (conv.stats.gen_tokens, conv.stats.gen_tps) == (len(ids), pytest.approx(10.0))


def test_a_turn_left_suspended_is_settled_by_interrupted(engine) -> None:
    conv = _conv(engine, "chat")
    ids = _script(conv, "hello there friend" + EOS_TEXT)
    gen = conv.turn("hi")
    for ev in gen:
        if ev.kind == "content":
            break  # as if Ctrl+C landed while the first piece of the answer was shown
    assert conv._turn.sampled == ids[:1]
    assert conv.interrupted() == "kept"
    gen.close()
    assert conv.messages[-1] == {"role": "assistant", "content": conv.tok.decode(ids[:1])}
    assert conv.transcript.tokens[5:] == [ids[0], conv.tok.eos_id]
    assert (conv.stats.turns, conv.stats.total_generated) == (1, 1)


def test_interrupted_without_a_turn_keeps_everything(engine) -> None:
    conv = _conv(engine)
    assert conv.interrupted() == "kept"
    conv._close_turn()
    assert conv.messages == [] and conv.stats.turns == 0


def test_a_conversation_that_does_not_fit_is_refused_and_withdrawn(engine) -> None:
    tok = engine.tokenizer
    n = _prompt_len(tok, "chat", {"role": "user", "content": "hi"})
    assert n == 5
    conv = _conv(engine, "chat")
    conv.set_context(n + 1)  # the prompt and one answer token must fit below the context size
    with pytest.raises(turns.ContextError) as err:
        list(conv.turn("hi"))
    assert str(err.value) == "the conversation (5 tokens) does not fit the context of 6; use /new or /ctx N"
    assert conv.messages == [] and conv.transcript.tokens == [] and conv.transcript.text == ""
    assert conv.interrupted() == "kept"  # the withdrawn turn is settled
    conv.set_context(n + 2)
    _script(conv, "ok" + EOS_TEXT)
    events = list(conv.turn("hi"))
    assert events[-1].kind == "done" and conv.messages[0] == {"role": "user", "content": "hi"}


def test_a_stop_during_prefill_withdraws_the_turn(engine) -> None:
    conv = _conv(engine, "chat")
    conv.session.prefill_chunk = 2
    events = []
    for ev in conv.turn("hi"):
        events.append(ev)
        if ev.kind == "prefill":
            conv.stop.set()
    assert [(e.kind, e.done, e.total, e.finish) for e in events] == [("prefill", 2, 5, ""), ("done", 0, 0, "withdrawn")]
    assert conv.messages == [] and conv.transcript.tokens == [] and conv.transcript.text == ""
    assert conv.session.tokens == []  # back to the KV from before the turn
    assert conv.interrupted() == "kept"
    assert conv.stats.turns == 0


# -- prefill ----------------------------------------------------------------------------------------

def _syncs(conv: turns.Conversation) -> list[int]:
    lengths: list[int] = []
    real = conv.session.sync

    def spy(ids, progress=None):
        lengths.append(len(ids))
        return real(ids, progress)

    conv.session.sync = spy
    return lengths


def test_prefill_goes_chunk_by_chunk_from_what_the_kv_holds(engine, monkeypatch) -> None:
    conv = _conv(engine, "chat")
    conv.session.prefill_chunk = 2
    syncs = _syncs(conv)
    _clock(monkeypatch, 10.0, 10.5)
    _script(conv, "hello" + EOS_TEXT)
    events = list(conv.turn("hi"))
    assert [(e.done, e.total) for e in events if e.kind == "prefill"] == [(2, 5), (4, 5), (5, 5)]
    assert syncs == [2, 4, 5]
    assert (conv.stats.prefill_tokens, conv.stats.prefill_tps) == (5, 10.0)  # 5 tokens in 0.5 s
    # The KV holds the 5 prompt ids (the sampled ones are not evaluated); the transcript is now
    # 5 + 2 answer ids + 4 for "<User>again<Assistant></think>": 6 to prefill, from 5.
    assert len(conv.session.tokens) == 5
    _clock(monkeypatch, 3.0, 5.0)
    _script(conv, "ok" + EOS_TEXT)
    events = list(conv.turn("again"))
    assert conv.stats.prompt_tokens == 11
    assert [(e.done, e.total) for e in events if e.kind == "prefill"] == [(2, 6), (4, 6), (6, 6)]
    assert syncs[3:] == [7, 9, 11]
    assert (conv.stats.prefill_tokens, conv.stats.prefill_tps) == (6, 3.0)


def test_prefill_starts_over_when_the_kv_is_not_a_prefix(engine, monkeypatch) -> None:
    conv = _conv(engine, "chat")
    conv.session.prefill_chunk = 2
    conv.session.sync(engine.tokenizer.encode("some other words"))
    _clock(monkeypatch, 1.0, 1.0)  # no measurable time: the speed is reported as 0
    _script(conv, "hello" + EOS_TEXT)
    events = list(conv.turn("hi"))
    assert [(e.done, e.total) for e in events if e.kind == "prefill"] == [(2, 5), (4, 5), (5, 5)]
    assert conv.session.tokens == conv.transcript.tokens[:5]
    assert (conv.stats.prefill_tokens, conv.stats.prefill_tps) == (5, 0.0)


def test_prefill_of_nothing_or_one_token(engine, monkeypatch) -> None:
    conv = _conv(engine, "chat")
    _script(conv, "hello" + EOS_TEXT)
    list(conv.turn("hi"))
    live = list(conv.session.tokens)
    assert conv.stats.prefill_tokens == 5
    assert list(conv._prefill(live)) == []  # nothing the KV lacks
    assert conv.stats.prefill_tokens == 0 and conv.session.tokens == live
    _clock(monkeypatch, 0.0, 0.25)
    one = live + [conv.transcript.tokens[5]]
    assert [(e.kind, e.done, e.total) for e in conv._prefill(one)] == [("prefill", 1, 1)]
    assert conv.session.tokens == one
    assert (conv.stats.prefill_tokens, conv.stats.prefill_tps) == (1, 4.0)


# -- loading ------------------------------------------------------------------------------------

def test_adopt_session_reads_mode_system_and_tools_back(engine) -> None:
    tok = engine.tokenizer
    t = Transcript(tok, "thinking", "max")
    t.append({"role": "system", "content": "Be brief.", "tools": [TOOL]}, {"role": "user", "content": "hi"})
    conv = _conv(engine, "chat")
    conv.session.sync(t.tokens)
    conv.dirty = True
    conv.adopt_session()
    assert (conv.mode, conv.system, conv.tools, conv.dirty) == ("max", "Be brief.", [TOOL], False)
    assert conv.transcript.tokens == t.tokens and conv.transcript.text == t.text

    u = Transcript(tok, "thinking")
    u.append({"role": "user", "content": "hi"})
    other = _conv(engine, "chat", system="stale", tools=[TOOL])
    other.session.sync(u.tokens)
    other.adopt_session()
    assert (other.mode, other.system, other.tools) == ("thinking", None, None)


def test_split_partial() -> None:
    assert turns._split_partial("a</think>b", False) == ("a", "b")
    assert turns._split_partial("plain", False) == ("", "plain")
    assert turns._split_partial("still</think>thinking", True) == ("still</think>thinking", "")
