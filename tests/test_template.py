"""The chat protocol against the official DeepSeek V4 encoder, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.protocol.template import TemplateError, parse, render, tool_calls_dsml

HERE = Path(__file__).resolve().parent
# Produced by the official encoder (copied once from the workspace's shared golden data; see
# tests/data/README.md). A missing file is an error, never a skip.
GOLDEN = HERE / "data" / "template_cases.json"
EXTRA = HERE / "data" / "template_extra_cases.json"


def _cases(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cases"]


CASES = _cases(GOLDEN) + _cases(EXTRA)


def test_case_files_present() -> None:
    assert len(_cases(EXTRA)) >= 60
    assert len(_cases(GOLDEN)) >= 46


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_official_case(case: dict) -> None:
    if case["kind"] == "encode":
        if "error" in case:
            with pytest.raises(TemplateError):
                render(case["messages"], **case["kwargs"])
        else:
            assert render(case["messages"], **case["kwargs"]) == case["rendered"]
    else:
        got = parse(case["completion"], case["thinking_mode"])
        if "error" in case:
            err = got["error"]
            assert set(err) == {"kind", "offset", "snippet", "message"}
            assert 0 <= err["offset"] <= len(case["completion"].encode("utf-8"))
        else:
            assert got == case["parsed"]


def _official(messages, **kw):
    return render(messages, **kw)


def test_openai_text_parts_render_like_strings() -> None:
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert render(parts) == render(plain)


def test_anthropic_blocks_render_like_openai() -> None:
    tools_a = [{"name": "get", "description": "Get it", "input_schema": {"type": "object", "properties": {"k": {"type": "string"}}}}]
    tools_o = [{"type": "function", "function": {"name": "get", "description": "Get it", "parameters": {"type": "object", "properties": {"k": {"type": "string"}}}}}]
    anthropic = [
        {"role": "system", "content": "S", "tools": tools_a},
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan"}, {"type": "text", "text": "ok"},
                                          {"type": "tool_use", "id": "t1", "name": "get", "input": {"k": "v", "n": [1, 2]}},
                                          {"type": "tool_use", "id": "t2", "name": "get", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "B"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "A"}]},
                                     {"type": "text", "text": "and?"}]},
    ]
    openai = [
        {"role": "system", "content": "S", "tools": tools_o},
        {"role": "user", "content": "go"},
        {"role": "assistant", "reasoning_content": "plan", "content": "ok", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get", "arguments": '{"k": "v", "n": [1, 2]}'}},
            {"id": "t2", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t2", "content": "B"},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "A"}]},
        {"role": "user", "content": "and?"},
    ]
    for mode in ("chat", "thinking"):
        assert render(anthropic, mode) == render(openai, mode)
    text = render(openai, "thinking")
    assert text.index("<tool_result>A</tool_result>") < text.index("<tool_result>B</tool_result>")  # call order


@pytest.mark.parametrize("bad,fragment", [
    (dict(thinking_mode="deep"), "thinking_mode"),
    (dict(reasoning_effort="low"), "reasoning_effort"),
])
def test_option_errors(bad: dict, fragment: str) -> None:
    with pytest.raises(TemplateError, match=fragment):
        render([{"role": "user", "content": "x"}], **bad)


def test_unrenderable_parts_are_refused() -> None:
    with pytest.raises(TemplateError, match="image"):
        render([{"role": "user", "content": [{"type": "image", "url": "x"}]}])


def test_error_offsets_are_utf8_bytes() -> None:
    text = "思考</think>答え<｜end▁of▁sentence｜>tail"
    err = parse(text, "thinking")["error"]
    assert err["kind"] == "content_after_eos"
    assert err["offset"] == len(text.encode()) - len(b"tail")


# -- property: what render writes, parse reads back ------------------------------------------

_names = st.text(st.characters(blacklist_characters='"\n', blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: "｜" not in s and "<" not in s and ">" not in s)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                       st.floats(allow_nan=False, allow_infinity=False, width=64), st.text(max_size=20))
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)), max_leaves=8)
# String values are inserted raw, so they must not contain the closing marker of a parameter.
_str_value = st.text(max_size=40).filter(lambda s: "/｜DSML｜parameter" not in s and not s.endswith("<"))
_args = st.dictionaries(_names, st.one_of(_str_value, _json.filter(lambda v: not isinstance(v, str))), max_size=4)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.tuples(_names, _args), min_size=1, max_size=3),
       content=st.text(max_size=30).filter(lambda s: all(t not in s for t in ("｜", "<think>", "</think>")) and "\n\n<" not in s),
       thinking=st.booleans())
def test_parse_render_roundtrip(calls, content: str, thinking: bool) -> None:
    msgs = [{"role": "system", "content": "S", "tools": [{"type": "function", "function": {"name": "f"}}]},
            {"role": "user", "content": "go"},
            {"role": "assistant", "reasoning_content": "why" if thinking else None, "content": content,
             "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                            for i, (n, a) in enumerate(calls)]}]
    mode = "thinking" if thinking else "chat"
    prompt = render(msgs[:2], mode)
    full = render(msgs, mode)
    assert full.startswith(prompt)
    got = parse(full[len(prompt):], mode)
    assert "error" not in got, got
    assert got["content"] == content
    assert [c["function"]["name"] for c in got["tool_calls"]] == [n for n, _ in calls]
    for parsed, (_, args) in zip(got["tool_calls"], calls):
        assert json.loads(parsed["function"]["arguments"]) == args


def test_dsml_block_shape() -> None:
    block = tool_calls_dsml([{"name": "now", "arguments": "{}"}, {"name": "w", "arguments": '{"a": "x", "b": 2}'}])
    assert block == ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="now">\n\n</｜DSML｜invoke>\n<｜DSML｜invoke name="w">\n'
                     '<｜DSML｜parameter name="a" string="true">x</｜DSML｜parameter>\n'
                     '<｜DSML｜parameter name="b" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
