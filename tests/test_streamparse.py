"""The streaming parser agrees with template.parse however the text is chunked."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ds4agent.protocol.streamparse import StreamParser, events_text
from ds4agent.protocol.template import parse

HERE = Path(__file__).resolve().parent
CASES = []
for path in (HERE / "data" / "template_cases.json", HERE / "data" / "template_extra_cases.json"):
    CASES += [c for c in json.loads(path.read_text(encoding="utf-8"))["cases"] if c["kind"] == "parse"]


def _run(text: str, mode: str, rng: random.Random, as_bytes: bool):
    sp = StreamParser(mode)
    data = text.encode("utf-8") if as_bytes else text
    events, i = [], 0
    while i < len(data):
        n = rng.randint(1, 7)
        events += sp.feed(data[i : i + n])
        i += n
    events += sp.finish()
    return sp, events


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_chunked_stream_matches_parse(case: dict) -> None:
    text, mode = case["completion"], case["thinking_mode"]
    ref = parse(text, mode)
    for seed in range(6):
        sp, events = _run(text, mode, random.Random(seed), as_bytes=seed % 2 == 1)
        assert events[-1].kind == "result" and events[-1].result == ref
        if "error" in ref:
            continue
        assert events_text(events, "reasoning") == ref["reasoning_content"]
        assert events_text(events, "content") == ref["content"]
        calls = [(e.name, e.arguments) for e in events if e.kind == "call"]
        expected = [(c["function"]["name"], c["function"]["arguments"]) for c in ref["tool_calls"]]
        if case["id"] != "unclosed_tool_calls_lenient":  # truncated: only the final parse knows
            assert calls == expected
            assert not [e for e in events if e.kind == "error"]
        for idx, (_, args) in enumerate(calls):
            assert "".join(e.text for e in events if e.kind == "call_args" and e.index == idx) == args
        starts = [(e.index, e.name) for e in events if e.kind == "call_start"]
        assert [n for _, n in starts][: len(calls)] == [n for n, _ in calls]
        for block in sp.tool_blocks:
            assert block.startswith("<｜DSML｜tool_calls>") and block.endswith("</｜DSML｜tool_calls>")
            assert "\n\n" + block in text


@pytest.mark.parametrize("cid", ["err_duplicate_param", "err_param_no_newline_after", "xp_err_invokes_not_separated",
                                 "xp_err_blank_line_between", "xp_err_text_after_block", "err_content_after_eos",
                                 "xp_err_missing_string_attr"])
def test_grammar_errors_are_events(cid: str) -> None:
    case = next(c for c in CASES if c["id"] == cid)
    _, events = _run(case["completion"], case["thinking_mode"], random.Random(1), as_bytes=False)
    assert any(e.kind == "error" for e in events)
    assert "error" in events[-1].result


def test_markers_are_held_back_until_decided() -> None:
    sp = StreamParser("chat")
    out = []
    for ch in "Hello\n\n<｜DS":
        out += sp.feed(ch)
    assert events_text(out, "content") == "Hello"
    out += sp.feed("x")  # not a tool block after all
    assert events_text(out, "content") == "Hello\n\n<｜DSx"
    sp = StreamParser("thinking")
    out = sp.feed("plan</thi")
    assert events_text(out, "reasoning") == "plan"
    out += sp.feed("nk>answer<｜end▁of")
    assert events_text(out, "content") == "answer"
    out += sp.feed("▁sentence｜>")
    assert out[-1].kind == "done"


def test_dsml_in_reasoning_is_reported_not_run() -> None:
    text = 'let me <｜DSML｜invoke name="rm">\n</think>ok<｜end▁of▁sentence｜>'
    sp = StreamParser("thinking")
    events = sp.feed(text) + sp.finish()
    assert any(e.kind == "dsml_in_reasoning" for e in events)
    assert not any(e.kind in ("call_start", "call") for e in events)
    assert events[-1].result["error"]["kind"] == "special_token_in_text"  # parse refuses it too


def test_utf8_split_across_feeds() -> None:
    data = "思考中🎉</think>答え<｜end▁of▁sentence｜>".encode()
    sp = StreamParser("thinking")
    events = []
    for i in range(len(data)):
        events += sp.feed(data[i : i + 1])
    events += sp.finish()
    assert events_text(events, "reasoning") == "思考中🎉"
    assert events_text(events, "content") == "答え"
    assert all("\ufffd" not in e.text for e in events)


def test_argument_deltas_stream_before_the_call_ends() -> None:
    text = ('</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="write">\n'
            '<｜DSML｜parameter name="text" string="true">line "one"\nline two</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>')
    sp = StreamParser("thinking")
    cut = text.index("line two")
    early = sp.feed(text[:cut])
    assert any(e.kind == "call_start" and e.name == "write" for e in early)
    assert "".join(e.text for e in early if e.kind == "call_args").startswith('{"text": "line \\"one\\"\\n')
    rest = sp.feed(text[cut:]) + sp.finish()
    call = next(e for e in rest if e.kind == "call")
    assert json.loads(call.arguments) == {"text": 'line "one"\nline two'}
