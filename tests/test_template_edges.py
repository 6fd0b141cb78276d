"""The chat renderer's edges that the golden cases do not reach:
input normalisation (OpenAI parts, Anthropic blocks and tools), defaults of missing fields,
the exact error texts, parse errors with their offsets and snippets, one_shot_prompt, and
conversation_from_text as the inverse of rendering with drop_thinking=False.

Expected strings are written out by hand from docs/protocol.md §1.4-§1.8 and §2.1."""

from __future__ import annotations

import pytest

from ds4agent.modelfile import ASSISTANT, BOS, EOS, THINK_CLOSE, THINK_OPEN, USER
from ds4agent.protocol import template
from ds4agent.protocol.template import (
    THINK_MAX,
    TOOLS_HEAD,
    TOOLS_TAIL,
    TemplateError,
    _as_msg,
    _normalise,
    _scan,
    _system_message,
    conversation_from_text,
    one_shot_prompt,
    parse,
    render,
    tool_calls_dsml,
)

TC_OPEN, TC_CLOSE = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
INV_CLOSE = "</｜DSML｜invoke>"
REMINDER = "<｜latest_reminder｜>"


def _user_turn(text: str, think: bool = True) -> str:
    return USER + text + ASSISTANT + (THINK_OPEN if think else THINK_CLOSE)


# -- constants --------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["action", "query", "authority", "domain", "title", "read_url"])
def test_every_task_token_of_the_official_encoding_renders(task: str) -> None:
    got = render([{"role": "user", "content": "q", "task": task}], "chat")
    if task == "action":  # action opens the assistant turn before its token
        assert got == BOS + USER + "q" + ASSISTANT + THINK_CLOSE + "<｜action｜>"
    else:
        assert got == BOS + USER + "q" + f"<｜{task}｜>"


def test_think_max_needs_384k_tokens_of_context() -> None:
    # Read through the module: the name is what ui/oneshot.py and the conversation import.
    assert template.THINK_MAX_MIN_CTX == 384 * 1024 == 393216  # the model card's figure (protocol.md §1.3)


# -- OpenAI text parts -------------------------------------------------------------------------

def test_every_text_part_kind_joins_into_the_user_text() -> None:
    content = ["a", {"type": "text", "text": "b"}, {"type": "input_text", "text": "c"},
               {"type": "output_text", "text": "d"}, {"type": "text"}]
    assert render([{"role": "user", "content": content}]) == BOS + _user_turn("abcd")


def test_assistant_text_parts_are_plain_content() -> None:
    # Parts without Anthropic tool_use/thinking blocks are text parts, not blocks to expand.
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": ["x", {"type": "output_text", "text": "y"}]}]
    assert render(msgs, "chat") == BOS + _user_turn("hi", False) + "xy" + EOS


def test_a_user_turn_of_plain_string_parts_is_text() -> None:
    assert render([{"role": "user", "content": ["one ", "two"]}], "chat") == BOS + _user_turn("one two", False)


# -- tool calls and tool definitions -------------------------------------------------------------

def test_tool_call_fields_and_their_defaults() -> None:
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"id": "in_fn", "name": "a", "arguments": "{}"}},
        {"name": "b", "arguments": '{"x": 1}'},
        {"id": "outer", "function": {"id": "inner", "name": "c"}},
    ]}]
    assert _normalise(msgs)[0]["tool_calls"] == [
        {"id": "in_fn", "name": "a", "arguments": "{}"},
        {"id": "", "name": "b", "arguments": '{"x": 1}'},
        {"id": "outer", "name": "c", "arguments": ""},
    ]


def test_missing_arguments_render_as_one_empty_string_parameter() -> None:
    # "" is not JSON: it is passed on as the parameter `arguments` (protocol.md §1.6).
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "now"}}]}]
    block = (TC_OPEN + '\n<｜DSML｜invoke name="now">\n'
             '<｜DSML｜parameter name="arguments" string="true"></｜DSML｜parameter>\n' + INV_CLOSE + "\n" + TC_CLOSE)
    assert render(msgs, "chat") == BOS + _user_turn("go", False) + "\n\n" + block + EOS


def test_a_call_id_given_inside_the_function_orders_the_results() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"id": "p", "name": "f", "arguments": "{}"}},
                {"function": {"id": "q", "name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "q", "content": "Q"},
            {"role": "tool", "tool_call_id": "p", "content": "P"}]
    assert render(msgs, "chat").endswith(EOS + USER + "<tool_result>P</tool_result>\n\n<tool_result>Q</tool_result>"
                                          + ASSISTANT + THINK_CLOSE)


def test_tool_call_without_a_name_is_refused() -> None:
    with pytest.raises(TemplateError, match="^tool call without a function name$"):
        render([{"role": "assistant", "content": "", "tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}])


def test_anthropic_tool_definitions_lose_their_type_and_cache_control() -> None:
    schema = {"type": "object", "properties": {"k": {"type": "string"}}}
    anthropic = {"type": "custom", "name": "get", "description": "Get it", "input_schema": schema,
                 "cache_control": {"type": "ephemeral"}}
    got = render([{"role": "system", "content": "S", "tools": [anthropic]}, {"role": "user", "content": "u"}], "chat")
    line = ('{"name": "get", "description": "Get it", "parameters": {"type": "object", '
            '"properties": {"k": {"type": "string"}}}}')
    assert got == BOS + "S\n\n" + TOOLS_HEAD + line + TOOLS_TAIL + _user_turn("u", False)


def test_a_bare_tool_definition_is_its_own_schema() -> None:
    got = render([{"role": "system", "content": "", "tools": [{"name": "ls", "description": "list"}]}], "chat")
    assert got == BOS + "\n\n" + TOOLS_HEAD + '{"name": "ls", "description": "list"}' + TOOLS_TAIL


def test_a_tool_definition_without_a_name_is_refused() -> None:
    with pytest.raises(TemplateError, match="^tool definition without a function$"):
        render([{"role": "system", "content": "S", "tools": [{"description": "nameless"}]}])


@pytest.mark.parametrize("bad", [{"content": "no role"}, "just text"])
def test_a_message_needs_to_be_a_dict_with_a_role(bad) -> None:
    with pytest.raises(TemplateError, match="^every message must be a dict with a role$"):
        render([bad])


# -- Anthropic assistant blocks -----------------------------------------------------------------

def test_tool_use_blocks_alone_become_calls() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get", "input": {"k": "v"}}]}]
    block = (TC_OPEN + '\n<｜DSML｜invoke name="get">\n<｜DSML｜parameter name="k" string="true">v</｜DSML｜parameter>\n'
             + INV_CLOSE + "\n" + TC_CLOSE)
    assert render(msgs, "chat") == BOS + _user_turn("go", False) + "\n\n" + block + EOS


def test_thinking_blocks_alone_become_the_reasoning() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan "},
                                              {"type": "thinking", "thinking": "more"},
                                              {"type": "text", "text": "done"}]}]
    assert render(msgs, drop_thinking=False) == BOS + _user_turn("go") + "plan more" + THINK_CLOSE + "done" + EOS


def test_anthropic_blocks_normalise_to_the_openai_shape() -> None:
    msgs = [{"role": "assistant", "name": "kept",
             "tool_calls": [{"id": "pre", "function": {"name": "first", "arguments": "{}"}}],
             "content": [{"type": "text", "text": "a"}, {"type": "text"}, {"type": "text", "text": "b"},
                         {"type": "thinking"}, {"type": "redacted_thinking", "data": "opaque"},
                         {"type": "tool_use", "name": "second"}]}]
    assert _normalise(msgs) == [{
        "role": "assistant", "name": "kept", "content": "ab", "reasoning_content": "",
        "tool_calls": [{"id": "pre", "name": "first", "arguments": "{}"}, {"id": "", "name": "second", "arguments": "{}"}],
    }]


def test_text_blocks_alone_add_no_reasoning_field() -> None:
    assert _normalise([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "i",
                                                                                      "name": "n", "input": {}}]}]) == [
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "i", "name": "n", "arguments": "{}"}]}]


def test_reasoning_content_wins_over_thinking_blocks() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "reasoning_content": "given", "content": [{"type": "thinking", "thinking": "block"},
                                                                           {"type": "text", "text": "ok"}]}]
    assert render(msgs, drop_thinking=False) == BOS + _user_turn("go") + "given" + THINK_CLOSE + "ok" + EOS


def test_an_unknown_assistant_block_is_refused() -> None:
    msgs = [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "image", "source": {}}]}]
    with pytest.raises(TemplateError, match=r"^assistant message: block of type 'image' cannot be rendered$"):
        render(msgs)


# -- Anthropic tool results inside a user turn ------------------------------------------------------

def test_a_user_turn_of_one_tool_result_is_a_tool_message() -> None:
    got = _normalise([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "R"}]}])
    assert got == [{"role": "tool", "tool_call_id": "t9", "content": "R"}]


def test_tool_results_split_the_user_text_around_them() -> None:
    content = [{"type": "text", "text": "a"}, "b", {"type": "tool_result", "tool_use_id": "t1", "content": "R"},
               {"type": "text", "text": "c"}, {"type": "input_text", "text": "d"}, {"type": "tool_result"}]
    assert _normalise([{"role": "user", "name": "me", "content": content},
                       {"role": "user", "content": "after"}]) == [
        {"role": "user", "name": "me", "content": "ab"},
        {"role": "tool", "tool_call_id": "t1", "content": "R"},
        {"role": "user", "name": "me", "content": "cd"},
        {"role": "tool", "tool_call_id": "", "content": ""},
        {"role": "user", "content": "after"},
    ]


def test_rendered_tool_results_with_text_on_both_sides() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
               {"type": "tool_result", "tool_use_id": "t1"},
               {"type": "text", "text": "c"}, {"type": "text", "text": "d"}]
    got = render([{"role": "user", "content": content}, {"role": "user", "content": "e"}], "chat")
    assert got == BOS + _user_turn("ab\n\n<tool_result></tool_result>\n\ncd\n\ne", False)


# -- defaults of missing fields -------------------------------------------------------------------

def test_missing_contents_render_as_empty_text() -> None:
    msgs = [{"role": "user"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c"}]
    block = TC_OPEN + '\n<｜DSML｜invoke name="f">\n\n' + INV_CLOSE + "\n" + TC_CLOSE
    assert render(msgs, "chat") == (BOS + _user_turn("", False) + "\n\n" + block + EOS
                                    + _user_turn("<tool_result></tool_result>", False))


def test_a_tool_message_without_an_id_answers_no_call() -> None:
    assert _as_msg({"role": "tool", "content": "x"}).call_id == ""
    assert _as_msg({"role": "tool", "tool_call_id": None, "content": "x"}).call_id == ""


@pytest.mark.parametrize("content,shown", [
    ([{"type": "text"}, {"type": "text", "text": "A"}], "\n\nA"),
    (["x", 5], "x\n\n5"),
    ([{"type": "image"}], "[Unsupported image]"),
    (42, "42"),
])
def test_tool_result_contents_that_are_not_text(content, shown: str) -> None:
    got = render([{"role": "tool", "tool_call_id": "c", "content": content}], "chat")
    assert got == BOS + _user_turn(f"<tool_result>{shown}</tool_result>", False)


def test_user_content_that_is_not_text_is_refused() -> None:
    with pytest.raises(TemplateError, match="^user message content must be text$"):
        render([{"role": "user", "content": 7}])


def test_a_latest_reminder_without_content_is_its_token_alone() -> None:
    msgs = [{"role": "user", "content": "u"}, {"role": "latest_reminder"}]
    # The reminder goes after the hand-over (a user turn followed by a reminder opens the answer).
    assert render(msgs, "chat") == BOS + _user_turn("u", False) + REMINDER


@pytest.mark.parametrize("content", ["", None, ["", ""]])
def test_a_developer_message_needs_text(content) -> None:
    with pytest.raises(TemplateError, match="^developer message needs non-empty text content$"):
        render([{"role": "developer", "content": content}])


# -- which reasoning is kept (protocol.md §1.7) ------------------------------------------------------

def test_reasoning_and_developer_turns_before_the_last_developer_message_are_dropped() -> None:
    msgs = [{"role": "user", "content": "u1"}, {"role": "assistant", "reasoning_content": "R1", "content": "a1"},
            {"role": "developer", "content": "d1"}, {"role": "developer", "content": "d2"}]
    assert render(msgs) == BOS + _user_turn("u1", False) + "a1" + EOS + _user_turn("d2")


def test_reasoning_before_the_last_user_message_is_dropped_by_default() -> None:
    msgs = [{"role": "user", "content": "u1"}, {"role": "assistant", "reasoning_content": "R1", "content": "a1"},
            {"role": "user", "content": "u2"}]
    assert render(msgs) == BOS + _user_turn("u1", False) + "a1" + EOS + _user_turn("u2")
    kept = render(msgs, drop_thinking=False)
    assert kept == BOS + _user_turn("u1") + "R1" + THINK_CLOSE + "a1" + EOS + _user_turn("u2")


def test_a_conversation_may_open_with_an_assistant_turn() -> None:
    msgs = [{"role": "assistant", "reasoning_content": "R0", "content": "a0"}, {"role": "user", "content": "u"}]
    assert render(msgs) == BOS + "a0" + EOS + _user_turn("u")


def test_a_first_assistant_turn_keeps_its_reasoning_before_a_task_turn() -> None:
    # msgs[i - 1] for i == 0 is the last message: only a real predecessor with a task counts.
    msgs = [{"role": "assistant", "reasoning_content": "R0", "content": "a0"},
            {"role": "user", "content": "q", "task": "query"}]
    assert render(msgs, drop_thinking=False) == BOS + "R0" + THINK_CLOSE + "a0" + EOS + USER + "q<｜query｜>"


def test_results_follow_the_latest_assistant_turn_that_made_calls() -> None:
    calls = [{"id": i, "function": {"name": "f", "arguments": "{}"}} for i in ("a", "b")]
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "assistant", "content": "still working"},
            {"role": "tool", "tool_call_id": "b", "content": "B"}, {"role": "tool", "tool_call_id": "a", "content": "A"}]
    assert render(msgs, "chat").endswith("still working" + EOS + USER + "<tool_result>A</tool_result>\n\n"
                                         "<tool_result>B</tool_result>" + ASSISTANT + THINK_CLOSE)


def test_a_sampled_tool_block_is_replayed_verbatim() -> None:
    sampled = TC_OPEN + '\n<｜DSML｜invoke  name="f">\n' + INV_CLOSE + "\n" + TC_CLOSE  # not the canonical layout
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "c", "dsml": sampled,
             "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{}"}}]}]
    assert render(msgs, "chat") == BOS + _user_turn("go", False) + "c\n\n" + sampled + EOS


# -- one_shot_prompt ------------------------------------------------------------------------------

def test_one_shot_prompt_modes() -> None:
    assert one_shot_prompt("hi") == BOS + _user_turn("hi")
    assert one_shot_prompt("hi", mode="chat") == BOS + _user_turn("hi", False)
    assert one_shot_prompt("hi", "Be brief.", "thinking") == BOS + "Be brief." + _user_turn("hi")
    assert one_shot_prompt("hi", "", "chat") == BOS + _user_turn("hi", False)  # empty system text: none
    assert one_shot_prompt("hi", "S", "max") == BOS + THINK_MAX + "S" + _user_turn("hi")


# -- parse: defaults, errors with their exact offsets and snippets -------------------------------------

def test_parse_defaults_to_thinking_mode() -> None:
    assert parse("r" + THINK_CLOSE + "c" + EOS) == {"role": "assistant", "content": "c", "reasoning_content": "r",
                                                    "tool_calls": []}


def test_scan_takes_the_earliest_stop_and_the_first_listed_on_a_tie() -> None:
    assert _scan("xxab", 1, ("ab", "a")) == (4, "x", "ab")
    assert _scan("xxab", 0, ("a", "ab")) == (3, "xx", "a")
    assert _scan("xxab", 0, ("b", "xa")) == (3, "x", "xa")
    assert _scan("xxab", 0, ("z",)) == (4, "xxab", None)


def test_malformed_invoke_header_error() -> None:
    text = ('Checking the files now.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nam="ls">\n' + INV_CLOSE + "\n"
            + TC_CLOSE + EOS)
    # The header starts at character 57 (25 ASCII + 17 + 2 + 13): four fullwidth bars of 3 bytes.
    assert parse(text, "chat") == {"error": {
        "kind": "dsml_invoke", "offset": 65,
        "snippet": 'calls>\n<｜DSML｜invoke nam="ls">\n</｜DSML｜invoke>\n</｜DSML｜tool_',
        "message": 'malformed invoke header (expected name="...")'}}


def test_truncated_tool_block_error() -> None:
    text = "\n\n" + TC_OPEN + "\n"
    assert parse(text, "chat") == {"error": {
        "kind": "dsml_truncated", "offset": 23, "snippet": text,
        "message": "tool block ends without an invoke or its closing tag"}}


def test_thinking_output_without_think_close() -> None:
    text = "plan" + EOS  # 4 + 19 characters, 4 + 27 bytes
    assert parse(text, "thinking") == {"error": {
        "kind": "missing_think_close", "offset": 31, "snippet": "n" + EOS,
        "message": "thinking-mode output without </think>"}}


def test_a_special_token_in_the_reasoning_is_found_at_its_offset() -> None:
    assert parse("a<think>b" + THINK_CLOSE + "c" + EOS, "thinking") == {"error": {
        "kind": "special_token_in_text", "offset": 1, "snippet": "a<think>b</think>c" + EOS,
        "message": "unexpected <think> in the output text"}}


# -- conversation_from_text: the inverse of render(..., drop_thinking=False) ------------------------------

def _call(i: int, name: str, args: str) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def _tool_def(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} it",
                                             "parameters": {"type": "object", "properties": {}}}}


def _round_trip(messages: list[dict], mode: str, effort: str | None = None) -> str:
    text = render(messages, mode, reasoning_effort=effort, drop_thinking=False)
    got, got_mode, got_effort = conversation_from_text(text)
    assert got == messages
    assert (got_mode, got_effort) == (mode, effort)
    assert render(got, mode, reasoning_effort=effort, drop_thinking=False) == text
    return text


def test_round_trip_of_an_agent_conversation_in_thinking_mode() -> None:
    c0, c1 = _call(0, "ls", '{"path": "src"}'), _call(1, "cat", '{"file": "a.py", "lines": 3}')
    c2 = _call(2, "ls", '{"path": "tests"}')
    msgs = [
        {"role": "system", "content": "You are terse.", "tools": [_tool_def("ls"), _tool_def("cat")]},
        {"role": "user", "content": "Look around."},
        {"role": "assistant", "content": "Listing.", "reasoning_content": "Start with ls.",
         "tool_calls": [c0, c1], "dsml": tool_calls_dsml([c0["function"], c1["function"]])},
        {"role": "tool", "tool_call_id": "call_0", "content": "a.py"},
        {"role": "tool", "tool_call_id": "call_1", "content": "1\n2\n3"},
        {"role": "user", "content": "Xmas? Also tests/X"},
        {"role": "assistant", "content": "", "reasoning_content": "",
         "tool_calls": [c2], "dsml": tool_calls_dsml([c2["function"]])},
        {"role": "tool", "tool_call_id": "call_2", "content": "t.py"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "All seen."},
    ]
    text = _round_trip(msgs, "thinking")
    assert text.startswith(BOS + "You are terse.\n\n" + TOOLS_HEAD)


def test_round_trip_keeps_a_sampled_tool_block() -> None:
    # The model wrote a list without spaces: replayed as sampled, not in the canonical `[1, 2]`.
    c0 = _call(0, "f", '{"n": [1,2]}')
    sampled = TC_OPEN + '\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n" string="false">[1,2]</｜DSML｜parameter>\n' \
        + INV_CLOSE + "\n" + TC_CLOSE
    assert sampled != tool_calls_dsml([c0["function"]])
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "ok", "tool_calls": [c0], "dsml": sampled},
            {"role": "tool", "tool_call_id": "call_0", "content": "done"}]
    text = _round_trip(msgs, "chat")
    assert text == BOS + _user_turn("go", False) + "ok\n\n" + sampled + EOS + _user_turn("<tool_result>done</tool_result>", False)


def test_round_trip_of_think_max_with_tools_and_no_system_text() -> None:
    msgs = [{"role": "system", "content": "", "tools": [_tool_def("a"), _tool_def("b")]},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "A", "reasoning_content": "R"}]
    text = _round_trip(msgs, "thinking", "max")
    assert text.startswith(BOS + THINK_MAX + "\n\n" + TOOLS_HEAD)


def test_round_trip_of_a_chat_with_system_text_between_turns() -> None:
    msgs = [{"role": "system", "content": "S1"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "system", "content": "S2"},
            {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}]
    assert _round_trip(msgs, "chat") == (BOS + "S1" + _user_turn("u1", False) + "a1" + EOS + "S2"
                                         + _user_turn("u2", False) + "a2" + EOS)


def test_reading_text_without_bos_or_turns() -> None:
    assert conversation_from_text("Only system text.") == ([{"role": "system", "content": "Only system text."}], "chat", None)
    assert conversation_from_text(BOS) == ([], "chat", None)


def test_reading_a_developer_turn_then_a_user_turn() -> None:
    # Two user turns with no hand-over between them: each is its own message.
    text = BOS + USER + "dev" + USER + "usr" + ASSISTANT + THINK_OPEN
    assert conversation_from_text(text) == ([{"role": "user", "content": "dev"}, {"role": "user", "content": "usr"}],
                                            "thinking", None)


def test_reading_stops_at_an_open_assistant_turn() -> None:
    prompt = render([{"role": "user", "content": "hi"}])
    assert conversation_from_text(prompt + "partial reasoning") == ([{"role": "user", "content": "hi"}], "thinking", None)
    assert conversation_from_text(prompt + "r" + THINK_CLOSE + "done" + EOS + "Later system text.") == (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done", "reasoning_content": "r"},
         {"role": "system", "content": "Later system text."}], "thinking", None)


def test_reading_a_turn_that_does_not_parse_keeps_its_text() -> None:
    # Content holding </think> (and <think>) is not a valid completion: split at the first </think>.
    bad = [{"role": "user", "content": "u"},
           {"role": "assistant", "content": "x</think>y<think>", "reasoning_content": "R"}]
    text = render(bad, drop_thinking=False)
    assert conversation_from_text(text) == (bad, "thinking", None)
    # A thinking turn with no </think> at all: its text is the content.
    text = BOS + USER + "u" + ASSISTANT + THINK_OPEN + "no close" + EOS
    assert conversation_from_text(text) == (
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "no close", "reasoning_content": ""}],
        "thinking", None)


def test_reading_an_assistant_turn_without_a_think_tag() -> None:
    text = BOS + USER + "u" + ASSISTANT + "hello" + EOS
    assert conversation_from_text(text) == ([{"role": "user", "content": "u"}, {"role": "assistant", "content": "hello"}],
                                            "chat", None)


def test_results_beyond_the_calls_answer_no_call() -> None:
    text = BOS + USER + "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>" + ASSISTANT + THINK_CLOSE
    assert conversation_from_text(text) == ([{"role": "tool", "tool_call_id": "", "content": "A"},
                                             {"role": "tool", "tool_call_id": "", "content": "B"}], "chat", None)


def test_system_text_that_is_a_tools_block() -> None:
    block = TOOLS_HEAD + '{"name": "a"}\n{"name": "b"}' + TOOLS_TAIL
    assert _system_message(block) == {"role": "system", "content": "",
                                      "tools": [{"type": "function", "function": {"name": "a"}},
                                                {"type": "function", "function": {"name": "b"}}]}


@pytest.mark.parametrize("text", [
    "S\n\n" + TOOLS_HEAD + '{"name": "a"}',  # no tail
    "S\n\n" + TOOLS_HEAD + "not json" + TOOLS_TAIL,
    "S" + TOOLS_HEAD + '{"name": "a"}' + TOOLS_TAIL,  # not after a blank line and not at the start
])
def test_system_text_that_only_looks_like_a_tools_block_stays_text(text: str) -> None:
    assert _system_message(text) == {"role": "system", "content": text}


def test_think_max_alone_means_thinking_mode() -> None:
    # No assistant hand-over to read the mode from: the Think-Max paragraph implies thinking.
    assert conversation_from_text(BOS + THINK_MAX + "S") == ([{"role": "system", "content": "S"}], "thinking", "max")
