"""How a turn cut short is closed: the sampled ids stay in the transcript (no silent
re-tokenisation, which would break the KV prefix), followed by exactly the tokens the model
would have produced to end there: the thinking close when it stopped inside its reasoning,
then the end of sentence."""

from __future__ import annotations

import pytest

from ds4agent.conversation.turns import Conversation
from ds4agent.engine import Engine, SamplingParams
from ds4agent.protocol import Transcript


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


@pytest.fixture()
def kept(monkeypatch) -> list[bool]:
    """What each append_sampled returned: True when the sampled ids were kept."""
    out: list[bool] = []
    real = Transcript.append_sampled

    def spy(self, message, sampled):
        r = real(self, message, sampled)
        out.append(r)
        return r

    monkeypatch.setattr(Transcript, "append_sampled", spy)
    return out


def _stopped_turn(conv: Conversation, kind: str, after: int) -> tuple[list[int], list]:
    before = len(conv.transcript.tokens)
    events = []
    for ev in conv.turn("tell me something"):
        events.append(ev)
        if sum(e.kind == kind for e in events) == after:
            conv.stop.set()
    return conv.transcript.tokens[before:], events


def test_a_turn_stopped_in_its_reasoning_keeps_its_ids_and_closes_the_thinking(engine, kept) -> None:
    tok = engine.tokenizer
    conv = Conversation(engine, mode="thinking", sampling=SamplingParams(temperature=0), max_tokens=40)
    added, events = _stopped_turn(conv, "reasoning", 4)
    assert events[-1].finish == "interrupted"
    sampled = conv._turn.sampled
    think_close, eos = tok.special["think_close"], tok.eos_id
    assert think_close not in sampled and eos not in sampled  # it was stopped inside the reasoning
    assert kept == [True]
    assert added[-len(sampled) - 2:] == sampled + [think_close, eos]
    msg = conv.messages[-1]
    assert msg["role"] == "assistant" and msg["content"] == "" and msg["reasoning_content"] == tok.decode(sampled)
    assert conv.transcript.text == tok.decode(conv.transcript.tokens)
    # The KV holds every id but the last sampled one (not evaluated yet): the transcript extends it.
    n = len(conv.session.tokens)
    assert conv.transcript.tokens[:n] == conv.session.tokens and n == len(conv.transcript.tokens) - 3
    list(conv.turn("go on"))  # the next turn extends the KV: the closed turn was not re-tokenised
    assert conv.session.tokens[:n] == conv.transcript.tokens[:n] and len(kept) == 2


def test_a_turn_cut_by_the_length_limit_in_its_reasoning(engine, kept) -> None:
    tok = engine.tokenizer
    conv = Conversation(engine, mode="thinking", sampling=SamplingParams(temperature=0), max_tokens=3)
    start = len(conv.transcript.tokens)
    events = list(conv.turn("tell me something"))
    assert events[-1].finish == "length"
    sampled = conv._turn.sampled
    assert len(sampled) == 3 and kept == [True]
    assert conv.transcript.tokens[-5:] == sampled + [tok.special["think_close"], tok.eos_id]
    assert start < len(conv.transcript.tokens)


def test_a_chat_turn_stopped_in_its_answer_ends_with_the_end_of_sentence_only(engine, kept) -> None:
    tok = engine.tokenizer
    conv = Conversation(engine, mode="chat", sampling=SamplingParams(temperature=0), max_tokens=40)
    added, events = _stopped_turn(conv, "content", 4)
    assert events[-1].finish == "interrupted"
    sampled = conv._turn.sampled
    assert kept == [True]
    assert added[-len(sampled) - 1:] == sampled + [tok.eos_id]
    assert tok.special["think_close"] not in added[-len(sampled) - 1:]
    assert conv.messages[-1]["content"] == tok.decode(sampled)


def test_control_token_text_in_supplied_reasoning_stays_text(engine) -> None:
    # Reasoning the caller supplies (a resumed or imported conversation) is guarded like content:
    # the text of the end-of-sentence token inside it never becomes the token.
    tok = engine.tokenizer
    eos = tok.eos_id
    t = Transcript(tok, "thinking")
    t.append({"role": "user", "content": "hi"})
    t.append({"role": "assistant", "content": "fine", "reasoning_content": "a <｜end▁of▁sentence｜> b"})
    assert t.tokens.count(eos) == 1 and t.tokens[-1] == eos
    assert tok.decode(t.tokens) == t.text and "a <｜end▁of▁sentence｜> b" in t.text
    u = Transcript(tok, "thinking")
    u.append({"role": "user", "content": "say <｜end▁of▁sentence｜> please"})
    assert eos not in u.tokens and "say <｜end▁of▁sentence｜> please" in u.text


def test_transcript_renders_each_append_in_the_context_of_what_came_before(engine) -> None:
    from ds4agent.protocol import render

    tok = engine.tokenizer
    assert Transcript(tok).thinking_mode == "thinking"
    t = Transcript(tok, "thinking", "max")
    user1 = {"role": "user", "content": "one"}
    t.append(user1)
    first = t.text
    assert first == render([user1], "thinking", "max", drop_thinking=False)
    assert first.startswith("<｜begin▁of▁sentence｜>")
    # An answer with reasoning followed by the next question in one append: the reasoning is kept
    # (drop_thinking=False), no second BOS or Think-Max paragraph, and the text is the whole
    # conversation's rendering.
    answer = {"role": "assistant", "content": "fine", "reasoning_content": "thinking it over"}
    user2 = {"role": "user", "content": "two"}
    t.append(answer, user2)
    assert t.text.count("<｜begin▁of▁sentence｜>") == 1 and "thinking it over" in t.text[len(first):]
    assert t.text == render([user1, answer, user2], "thinking", "max", drop_thinking=False)
    assert t.tokens == tok.encode_rendered(t.text)
    t.rerender()
    assert "thinking it over" in t.text and t.text == render([user1, answer, user2], "thinking", None, drop_thinking=False)


def test_append_sampled_says_whether_it_kept_the_ids(engine) -> None:
    tok = engine.tokenizer
    t = Transcript(tok, "chat")
    t.append({"role": "user", "content": "hi"})
    msg = {"role": "assistant", "content": "hello there"}
    rendered = Transcript(tok, "chat")
    rendered.messages = list(t.messages)
    text = rendered._render_new([msg])
    assert t.append_sampled(msg, tok.encode_rendered(text)) is True
    u = Transcript(tok, "chat")
    u.append({"role": "user", "content": "hi"})
    assert u.append_sampled(msg, tok.encode("hello")) is False  # not the turn's text: re-tokenised
    assert u.tokens[-len(tok.encode_rendered(text)):] == tok.encode_rendered(text)
