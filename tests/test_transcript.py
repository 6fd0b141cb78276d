"""The append-only transcript: text equals the official rendering, tokens only grow."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ds4agent.protocol.template import render
from ds4agent.protocol.transcript import Transcript

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def _sampled(tok, text: str) -> list[int]:
    """A non-canonical tokenisation of text (byte-level pieces), as a model might sample."""
    ids = []
    for ch in text:
        t = tok.token_id(ch) if ch in ("<", ">") else None
        ids += [t] if t is not None else tok.encode_rendered(ch)
    return ids


@pytest.mark.parametrize("mode", ["chat", "thinking"])
def test_agentic_conversation_is_append_only(demo_tokenizer, mode: str) -> None:
    tok = demo_tokenizer
    t = Transcript(tok, mode)
    convo = [{"role": "system", "content": "You are terse.", "tools": TOOLS}, {"role": "user", "content": "list files"}]
    prev = list(t.append(*convo))
    block = ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
             '<｜DSML｜parameter name="command" string="true">ls -la | head</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
    a1 = {"role": "assistant", "content": "Looking.", "dsml": block,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls -la | head"})}}]}
    if mode == "thinking":
        a1["reasoning_content"] = "Use ls."
    think = "Use ls.</think>" if mode == "thinking" else ""
    sampled = _sampled(tok, think + "Looking.\n\n" + block) + [tok.eos_id]
    assert t.append_sampled(a1, sampled)
    assert t.tokens[: len(prev)] == prev and t.tokens[len(prev):] == sampled
    convo.append(a1)
    prev = list(t.tokens)
    t.append({"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"})
    convo.append({"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"})
    assert t.tokens[: len(prev)] == prev
    a2 = {"role": "assistant", "content": "Two files.", "reasoning_content": "Done." if mode == "thinking" else None}
    text2 = ("Done.</think>" if mode == "thinking" else "") + "Two files.<｜end▁of▁sentence｜>"
    assert t.append_sampled(a2, tok.encode_rendered(text2))
    convo.append(a2)
    t.append({"role": "user", "content": "thanks"})
    convo.append({"role": "user", "content": "thanks"})
    full = render(convo, mode, drop_thinking=False)
    assert t.text == full
    assert tok.decode(t.tokens) == full


def test_interrupted_answer_is_retokenised(demo_tokenizer) -> None:
    t = Transcript(demo_tokenizer, "chat")
    t.append({"role": "user", "content": "hi"})
    before = list(t.tokens)
    partial = demo_tokenizer.encode("Hel")  # stopped early: no EOS sampled
    assert not t.append_sampled({"role": "assistant", "content": "Hel"}, partial)
    assert t.tokens[: len(before)] == before
    assert t.text.endswith("Hel<｜end▁of▁sentence｜>") and demo_tokenizer.decode(t.tokens) == t.text


def test_think_max_only_at_the_start_and_rerender(demo_tokenizer) -> None:
    t = Transcript(demo_tokenizer, "thinking", "max")
    t.append({"role": "user", "content": "prove"})
    assert t.text.startswith("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum")
    t.append_sampled({"role": "assistant", "reasoning_content": "r", "content": "a"}, [])
    t.append({"role": "user", "content": "again"})
    assert t.text.count("Reasoning Effort") == 1
    t.rerender("thinking", None)
    assert "Reasoning Effort" not in t.text and demo_tokenizer.decode(t.tokens) == t.text


def test_session_prefills_only_the_new_turn(demo_path, demo_tokenizer) -> None:
    from ds4agent.engine import Engine, SamplingParams

    with Engine.open(demo_path, backend="cpu", ctx=2048) as e:
        t = Transcript(e.tokenizer, "chat")
        s = e.session()
        t.append({"role": "user", "content": "Hello there"})
        assert s.sync(t.tokens) == len(t.tokens)
        sampled = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=6)]
        if sampled[-1] != e.tokenizer.eos_id:
            sampled.append(e.tokenizer.eos_id)  # the turn ends at EOS in the transcript
        text = e.tokenizer.decode(sampled[:-1])
        assert t.append_sampled({"role": "assistant", "content": text}, sampled)
        added = t.append({"role": "user", "content": "And then?"})
        live = s.tokens
        assert t.tokens[: len(live)] == live  # the KV state is a prefix of the transcript
        # Only what the KV lacks: the sampled tail not yet evaluated (the last token, and EOS),
        # then the new user turn.
        assert s.sync(t.tokens) == len(t.tokens) - len(live) <= 2 + len(added)
        assert np.isfinite(s.logits).all()


def test_supplied_text_never_becomes_control_tokens(demo_tokenizer) -> None:
    tok = demo_tokenizer
    src = 'EOS = "<｜end▁of▁sentence｜>"\nUSER = "<｜User｜>"  # and <think>'
    for mode in ("chat", "thinking"):
        t = Transcript(tok, mode)
        t.append({"role": "system", "content": "S"}, {"role": "user", "content": src})
        t.append_sampled({"role": "assistant", "content": "ok", "reasoning_content": "r" if mode == "thinking" else None},
                         tok.encode_rendered(("r</think>" if mode == "thinking" else "") + "ok<｜end▁of▁sentence｜>"))
        t.append({"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": src}]})
        full = render(t.messages, mode, drop_thinking=False)
        assert t.text == full and tok.decode(t.tokens) == full
        specials = [i for i in t.tokens if i in tok.added_ids]
        # Only the protocol's own markers: BOS, User x2, Assistant x2, think markers, one EOS.
        assert specials.count(tok.eos_id) == 1
        assert specials.count(tok.special["user"]) == 2
