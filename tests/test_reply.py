"""The reply pipeline (conversation/reply.py): the one generation loop of chat, agent, `ds4 -p`
and the server, driven here by scripted completions (server/scripted.py) sampled token by token:
events, stop strings held across tokens, tool blocks, malformed blocks under both rules, raw
text, cancellation, and every finish reason."""

from __future__ import annotations

import threading
from dataclasses import astuple

import pytest

from ds4agent.conversation.reply import FINISHES, Reply, ReplyEvent, StopStrings
from ds4agent.engine import SamplingParams
from ds4agent.server import ScriptedEngine

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
BLOCK = (f'\n\n<{D}tool_calls>\n<{D}invoke name="read">\n<{D}parameter name="path" string="true">a.py'
         f'</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>')


def _reply(tok, completion: str, mode: str = "thinking", max_tokens: int = 200, **kw) -> tuple[Reply, list[ReplyEvent]]:
    session = ScriptedEngine(tok, [completion]).session()
    reply = Reply(session, tok, SamplingParams(temperature=0), mode, max_tokens, **kw)
    return reply, list(reply)


def _text(events: list[ReplyEvent], kind: str) -> str:
    return "".join(e.text for e in events if e.kind == kind)


def test_reasoning_content_and_the_end_of_sentence(demo_tokenizer) -> None:
    reply, events = _reply(demo_tokenizer, "let me see</think>The answer." + EOS)
    assert _text(events, "reasoning") == "let me see" and _text(events, "content") == "The answer."
    assert astuple(events[-1]) == ("done", "", -1, "", "", "eos", len(reply.sampled), reply.seconds)
    assert reply.finish == "eos" and events[-1].tokens == 8  # its usage
    session = ScriptedEngine(demo_tokenizer, ["ab" + EOS], token_seconds=0.01).session()
    done = list(Reply(session, demo_tokenizer, SamplingParams(), "chat", 10))[-1]
    assert (done.tokens, done.seconds) == (2, pytest.approx(0.02))
    assert demo_tokenizer.decode(reply.sampled) == "let me see</think>The answer." + EOS
    # text events belong to no call: index -1, no name, no arguments, no finish
    assert astuple(next(e for e in events if e.kind == "content")) == ("content", "The", -1, "", "", "", 0, 0.0)
    # the end of sentence is no text, and the final parse needs it handed over (parse_eos)
    assert reply.result()["error"]["kind"] == "missing_eos"
    reply, _ = _reply(demo_tokenizer, "let me see</think>The answer." + EOS, parse_eos=True)
    assert reply.result() == {"role": "assistant", "content": "The answer.", "reasoning_content": "let me see",
                              "tool_calls": []}


def test_a_tool_block_streams_its_call_and_may_end_the_reply(demo_tokenizer) -> None:
    reply, events = _reply(demo_tokenizer, "ok</think>" + BLOCK + EOS, parse_eos=True)
    kinds = [e.kind for e in events]
    assert kinds.index("call_start") < kinds.index("param_start") < kinds.index("param_end") < kinds.index("call")
    call = next(e for e in events if e.kind == "call")
    assert (call.name, call.arguments) == ("read", '{"path": "a.py"}')
    assert next(e for e in events if e.kind == "tool_block").text == BLOCK.lstrip("\n")
    assert reply.finish == "eos" and reply.result()["tool_calls"][0]["function"]["name"] == "read"
    reply, events = _reply(demo_tokenizer, "ok</think>" + BLOCK + EOS, stop_at_tools=True)
    assert events[-2].kind == "tool_block" and reply.finish == "tool_calls"
    assert reply.sampled[-1] != demo_tokenizer.eos_id  # stopped before the end of sentence
    # text held for a stop string that the tool block cut short goes out before the call
    reply, events = _reply(demo_tokenizer, "ok</think>see ab" + BLOCK + EOS, stops=["abc"], stop_at_tools=True)
    assert _text(events, "content") == "see ab" and reply.finish == "tool_calls"
    assert [e.kind for e in events].index("call_start") > max(i for i, e in enumerate(events) if e.kind == "content")


def test_stop_strings_are_held_across_tokens_and_cut_the_reply(demo_tokenizer) -> None:
    reply, events = _reply(demo_tokenizer, "x</think>one two three" + EOS, stops=["two"])
    assert _text(events, "content") == "one " and reply.finish == "stop_sequence" and reply.stop_matched == "two"
    # a partial match at the end is given back when the reply ends otherwise
    reply, events = _reply(demo_tokenizer, "x</think>one tw" + EOS, stops=["two"])
    assert _text(events, "content") == "one tw" and reply.finish == "eos" and reply.stop_matched is None
    s = StopStrings(["abc"])
    assert s.feed("xa") == ("x", False) and s.feed("b") == ("", False) and s.feed("d") == ("abd", False)
    assert s.feed("zab") == ("z", False) and s.feed("c!") == ("", True) and s.matched == "abc"
    assert s.flush() == ""  # nothing after a match is kept
    s = StopStrings(["b", "a"])  # the earliest match wins, whatever the order of the stops
    assert s.feed("xab") == ("x", True) and s.matched == "a"
    s = StopStrings(["aab"])  # the longest tail that could begin a stop is held
    assert s.feed("xaa") == ("x", False) and s.feed("b") == ("", True)
    s = StopStrings(["abc"])
    assert s.feed("ab") == ("", False) and s.flush() == "ab" and s.flush() == ""


def test_what_is_held_back_comes_out_when_the_reply_ends(demo_tokenizer) -> None:
    # the parser holds a trailing blank line (a tool block could follow) until the end
    reply, events = _reply(demo_tokenizer, "x</think>line\n\n" + EOS)
    assert _text(events, "content") == "line\n\n" and events[-2] == ReplyEvent("content", "\n\n")
    # ... and a reasoning tail that could still be </think>
    reply, events = _reply(demo_tokenizer, "let me </thi" + EOS, max_tokens=4)
    assert _text(events, "reasoning") == "let me </thi" and reply.finish == "length"
    # raw text cut inside a character ends with U+FFFD rather than losing the bytes
    reply, events = _reply(demo_tokenizer, "\U0001F600" + EOS, mode="raw", max_tokens=1)
    assert _text(events, "content") == "\ufffd" and len(reply.sampled) == 1
    # a stop string ends the reply there: text the parser held after it never comes out
    reply, events = _reply(demo_tokenizer, f"x</think>Done.\n\n<{D}tool_calls>" + EOS, stops=["."])
    assert _text(events, "content") == "Done" and reply.finish == "stop_sequence"


@pytest.mark.parametrize("rule", ["report", "text"])
def test_a_malformed_block_is_reported_and_under_text_goes_on_as_content(demo_tokenizer, rule: str) -> None:
    bad = f"\n\n<{D}tool_calls> \nnot a call"
    reply, events = _reply(demo_tokenizer, "x</think>before" + bad + " after" + EOS, malformed=rule)
    assert [e.text for e in events if e.kind == "malformed"] == ["expected '>' and a newline between DSML tags"]
    assert _text(events, "content") == ("before" + bad + " after" if rule == "text" else "before")
    assert reply.finish == "eos" and not any(e.kind == "call_start" for e in events)


def test_raw_mode_is_plain_text(demo_tokenizer) -> None:
    reply, events = _reply(demo_tokenizer, "no </think> parsing here" + EOS, mode="raw")
    assert _text(events, "content") == "no </think> parsing here" and reply.parser is None
    assert reply.finish == "eos" and reply.result() is None


def test_finish_reasons(demo_tokenizer) -> None:
    reply, events = _reply(demo_tokenizer, "x</think>a b c d e f" + EOS, max_tokens=3)
    assert reply.finish == "length" and len(reply.sampled) == 3
    reply = Reply(ScriptedEngine(demo_tokenizer, ["x" + EOS]).session(), demo_tokenizer, SamplingParams(), "chat", 1)
    assert reply.finish == ""  # until the reply has ended
    assert [e.kind for e in reply] == ["content", "done"] and reply.finish == "length" and len(reply.sampled) == 1
    reply, events = _reply(demo_tokenizer, "x</think>a" + EOS, max_tokens=0)
    assert events == [ReplyEvent("done", finish="length")] and reply.sampled == []
    unclosed = f'\n\n<{D}tool_calls>\n<{D}invoke name="read">\n'
    reply, _ = _reply(demo_tokenizer, "x</think>a" + unclosed + EOS)
    assert reply.finish == "error"  # the model ended inside its tool block
    session = ScriptedEngine(demo_tokenizer, ["x</think>" + "word " * 50 + EOS], ctx=12).session()
    reply = Reply(session, demo_tokenizer, SamplingParams(), "thinking", 200)
    list(reply)
    assert reply.finish == "context"
    assert set(FINISHES) >= {"eos", "length", "context", "stop_sequence", "tool_calls", "cancelled", "error"}


def test_cancel_ends_after_the_token_it_sees(demo_tokenizer) -> None:
    cancel = threading.Event()
    session = ScriptedEngine(demo_tokenizer, ["x</think>" + "word " * 20 + EOS]).session()
    reply = Reply(session, demo_tokenizer, SamplingParams(), "thinking", 200, cancel=cancel)
    seen = []
    for ev in reply:
        seen.append(ev)
        if ev.kind == "content" and not cancel.is_set():
            cancel.set()
    assert reply.finish == "cancelled" and seen[-1].finish == "cancelled"
    assert len(reply.sampled) < 20 and reply.sampled[-1] != demo_tokenizer.eos_id


def test_bad_arguments_are_refused(demo_tokenizer) -> None:
    session = ScriptedEngine(demo_tokenizer, ["a" + EOS]).session()
    with pytest.raises(ValueError, match="reply mode"):
        Reply(session, demo_tokenizer, SamplingParams(), "json", 5)
    with pytest.raises(ValueError, match="malformed-block rule"):
        Reply(session, demo_tokenizer, SamplingParams(), "chat", 5, malformed="ignore")
