"""The streaming parser's exact events (protocol/streamparse.py).

Every expected list below is written out by hand from the grammar (docs of the module), not
copied from a run: each event is compared whole (kind, text, index, name, arguments), so a
wrong default, index, kind, error name or message shows.
"""

from __future__ import annotations

from ds4agent.protocol.streamparse import ParseEvent, StreamParser

EOS = "<｜end▁of▁sentence｜>"
OPEN = "<｜DSML｜tool_calls>"
CLOSE = "</｜DSML｜tool_calls>"
INV = "<｜DSML｜invoke"
INV_END = "</｜DSML｜invoke>"
PAR = "<｜DSML｜parameter"
PAR_END = "</｜DSML｜parameter>"

Row = tuple[str, str, int, str, str]


def rows(events: list[ParseEvent]) -> list[Row]:
    """Events as comparable tuples; the result dict is checked apart."""
    return [(e.kind, e.text, e.index, e.name, e.arguments) for e in events]


def ev(kind: str, text: str = "", index: int = -1, name: str = "", arguments: str = "") -> Row:
    return (kind, text, index, name, arguments)


def whole(text: str, mode: str) -> tuple[list[ParseEvent], list[ParseEvent]]:
    sp = StreamParser(mode)
    return sp.feed(text), sp.finish()


# A completion with reasoning, content and two calls: one with a string and a JSON parameter,
# one parameterless (rendered with the empty line before its end).
BLOCK = (f'{OPEN}\n'
         f'{INV} name="f">\n'
         f'{PAR} name="a" string="true">x "y"{PAR_END}\n'
         f'{PAR} name="n" string="false">5{PAR_END}\n'
         f'{INV_END}\n'
         f'{INV} name="g">\n\n{INV_END}\n'
         f'{CLOSE}')
TEXT = "plan</think>Sure.\n\n" + BLOCK + EOS
ARGS_F = '{"a": "x \\"y\\"", "n": 5}'
RESULT = {"role": "assistant", "content": "Sure.", "reasoning_content": "plan",
          "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": ARGS_F}},
                         {"type": "function", "function": {"name": "g", "arguments": "{}"}}]}
STRUCTURE = [  # the events that are not deltas, in order
    ev("call_start", index=0, name="f"),
    ev("param_start", "true", 0, "a"),
    ev("param_end", 'x "y"', 0, "a"),
    ev("param_start", "false", 0, "n"),
    ev("param_end", "5", 0, "n"),
    ev("call", index=0, name="f", arguments=ARGS_F),
    ev("call_start", index=1, name="g"),
    ev("call", index=1, name="g", arguments="{}"),
    ev("tool_block", BLOCK),
    ev("done"),
]
DELTAS = ("reasoning", "content", "call_args", "param_text")


def test_whole_completion_in_one_feed_gives_every_event_at_once() -> None:
    sp = StreamParser("thinking")
    fed = sp.feed(TEXT)
    assert rows(fed) == [
        ev("reasoning", "plan"),
        ev("content", "Sure."),
        ev("call_start", index=0, name="f"),
        ev("param_start", "true", 0, "a"),
        ev("call_args", '{"a": "', 0),  # the opened string value, sent at its start
        ev("param_text", 'x "y"', 0, "a"),
        ev("param_end", 'x "y"', 0, "a"),
        ev("param_start", "false", 0, "n"),
        ev("call_args", 'x \\"y\\"", "n": ', 0),
        ev("param_text", "5", 0, "n"),
        ev("param_end", "5", 0, "n"),
        ev("call_args", "5}", 0),
        ev("call", index=0, name="f", arguments=ARGS_F),
        ev("call_start", index=1, name="g"),
        ev("call_args", "{}", 1),
        ev("call", index=1, name="g", arguments="{}"),
        ev("tool_block", BLOCK),
        ev("done"),
    ]
    assert sp.tool_blocks == [BLOCK]
    end = sp.finish()
    assert rows(end) == [ev("result")]
    assert end[0].result == RESULT


def _feed_pieces(pieces: list[str] | list[bytes]) -> list[ParseEvent]:
    sp = StreamParser("thinking")
    out: list[ParseEvent] = []
    for piece in pieces:
        out += sp.feed(piece)
    return out + sp.finish()


def test_char_token_and_whole_feeding_agree() -> None:
    data = TEXT.encode("utf-8")
    cuts = [0, 3, 9, 14, 20, 21, 40, 55, 56, 80, 120, 121, 150, 190, 230, 260, len(TEXT)]
    ways = {
        "whole": [TEXT],
        "chars": list(TEXT),
        "bytes": [data[i : i + 1] for i in range(len(data))],
        "tokens": [TEXT[a:b] for a, b in zip(cuts, cuts[1:])],
    }
    for how, pieces in ways.items():
        events = _feed_pieces(pieces)
        assert events[-1].result == RESULT, how
        assert rows([e for e in events[:-1] if e.kind not in DELTAS]) == STRUCTURE, how
        # A delta is never empty (a held character sends nothing until it is decided).
        assert [e for e in events if e.kind in DELTAS and not e.text] == [], how

        def joined(kind: str, index: int = -1, name: str = "") -> str:
            return "".join(e.text for e in events if e.kind == kind and e.index == index and e.name == name)

        assert joined("reasoning") == "plan", how
        assert joined("content") == "Sure.", how
        assert joined("call_args", 0) == ARGS_F, how
        assert joined("call_args", 1) == "{}", how
        assert joined("param_text", 0, "a") == 'x "y"', how
        assert joined("param_text", 0, "n") == "5", how


def test_a_value_streams_before_its_closing_tag() -> None:
    cut = TEXT.index("ameter>\n" + PAR)  # inside the first value's closing tag
    sp = StreamParser("thinking")
    first = sp.feed(TEXT[:cut])
    assert rows(first) == [
        ev("reasoning", "plan"),
        ev("content", "Sure."),
        ev("call_start", index=0, name="f"),
        ev("param_start", "true", 0, "a"),
        ev("call_args", '{"a": "', 0),
        ev("param_text", 'x "y"', 0, "a"),  # the value so far; "</｜DSML｜par" is held
        ev("call_args", 'x \\"y\\"', 0),
    ]
    second = sp.feed(TEXT[cut:])
    assert rows(second)[:4] == [
        ev("param_end", 'x "y"', 0, "a"),  # no empty param_text: the value was all sent
        ev("param_start", "false", 0, "n"),
        ev("call_args", '", "n": ', 0),
        ev("param_text", "5", 0, "n"),
    ]


def test_an_empty_value_sends_no_text() -> None:
    block = f'{OPEN}\n{INV} name="f">\n{PAR} name="s" string="true">{PAR_END}\n{INV_END}\n{CLOSE}'
    fed, end = whole("\n\n" + block + EOS, "chat")
    assert rows(fed) == [
        ev("call_start", index=0, name="f"),
        ev("param_start", "true", 0, "s"),
        ev("call_args", '{"s": "', 0),
        ev("param_end", "", 0, "s"),
        ev("call_args", '"}', 0),
        ev("call", index=0, name="f", arguments='{"s": ""}'),
        ev("tool_block", block),
        ev("done"),
    ]
    assert end[0].result["tool_calls"][0]["function"]["arguments"] == '{"s": ""}'


def test_a_json_parameter_keeps_a_non_ascii_key() -> None:
    block = f'{OPEN}\n{INV} name="f">\n{PAR} name="ключ" string="false">[1]{PAR_END}\n{INV_END}\n{CLOSE}'
    fed, end = whole("\n\n" + block + EOS, "chat")
    calls = [r for r in rows(fed) if r[0] == "call"]
    assert calls == [ev("call", index=0, name="f", arguments='{"ключ": [1]}')]
    assert "".join(e.text for e in fed if e.kind == "call_args") == '{"ключ": [1]}'
    assert end[0].result["tool_calls"][0]["function"]["arguments"] == '{"ключ": [1]}'


def test_parameterless_invokes_with_and_without_the_empty_line() -> None:
    # The renderer writes an empty line before a parameterless invoke's end; parse accepts
    # both, and a header with no space before name= (parse's \s* allows none).
    for head, gap in ((' name="f">\n', "\n"), (' name="f">\n', ""), ('name="f">\n', "\n")):
        block = f"{OPEN}\n{INV}{head}{gap}{INV_END}\n{CLOSE}"
        for pieces in ([block + EOS], list(block + EOS)):
            sp = StreamParser("chat")
            events = [e for p in ["\n\n"] + pieces for e in sp.feed(p)]
            assert rows(events) == [
                ev("call_start", index=0, name="f"),
                ev("call_args", "{}", 0),
                ev("call", index=0, name="f", arguments="{}"),
                ev("tool_block", block),
                ev("done"),
            ], (head, gap, len(pieces))
            assert sp.tool_blocks == [block]


def test_an_end_of_sentence_token_alone() -> None:
    fed, end = whole(EOS, "chat")
    assert rows(fed) == [ev("done")]
    assert end[0].result == {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []}


def test_content_before_the_end_of_sentence_token_in_one_feed() -> None:
    fed, end = whole("Hi" + EOS, "chat")
    assert rows(fed) == [ev("content", "Hi"), ev("done")]
    assert rows(end) == [ev("result")]


def test_a_tool_block_after_the_end_of_sentence_token_is_not_run() -> None:
    sp = StreamParser("chat")
    fed = sp.feed(EOS + "\n\n" + OPEN + "\n" + CLOSE)
    assert rows(fed) == [ev("done"), ev("error", "text after the end-of-sentence token", name="content_after_eos")]


def test_reasoning_with_dsml_is_reported_exactly() -> None:
    fed, _ = whole(f'let me {INV} name="rm">\n</think>ok{EOS}', "thinking")
    said = f'let me {INV} name="rm">\n'
    assert rows(fed) == [ev("reasoning", said), ev("dsml_in_reasoning", said), ev("content", "ok"), ev("done")]
    # DSML in the content is not reasoning (parse refuses it as special_token_in_text).
    fed, _ = whole(f"see ｜DSML｜ here{EOS}", "chat")
    assert rows(fed) == [ev("content", "see ｜DSML｜ here"), ev("done")]


def test_an_immediate_think_close_sends_no_empty_reasoning() -> None:
    fed, _ = whole("</think>ok" + EOS, "thinking")
    assert rows(fed) == [ev("content", "ok"), ev("done")]


# -- finish(): held text and a character split across feeds ---------------------------------

def test_finish_flushes_a_held_think_close_prefix() -> None:
    sp = StreamParser("thinking")
    assert rows(sp.feed("ab</th")) == [ev("reasoning", "ab")]
    end = sp.finish()
    assert rows(end) == [ev("reasoning", "</th"), ev("result")]
    assert end[-1].result == {"error": {"kind": "missing_think_close", "offset": 6, "snippet": "ab</th",
                                        "message": "thinking-mode output without </think>"}}


def test_finish_flushes_a_held_end_of_sentence_prefix() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed("Hello<｜end")) == [ev("content", "Hello")]
    end = sp.finish()
    assert rows(end) == [ev("content", "<｜end"), ev("result")]
    assert end[-1].result["error"]["kind"] == "missing_eos"


def test_finish_flushes_plain_text_whole() -> None:
    sp = StreamParser("thinking")
    assert rows(sp.feed("abc")) == [ev("reasoning", "abc")]
    assert rows(sp.finish()) == [ev("result")]
    sp = StreamParser("thinking")
    sp.feed("a</think>b\n")  # "\n" could begin a tool block: held
    assert rows(sp.finish()) == [ev("content", "\n"), ev("result")]


def test_finish_replaces_a_truncated_character() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed("ok".encode() + "é".encode()[:1])) == [ev("content", "ok")]
    end = sp.finish()
    assert rows(end) == [ev("content", "\ufffd"), ev("result")]
    assert sp.text == "ok\ufffd"


def test_invalid_bytes_are_replaced_not_raised() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed(b"a\xffb" + EOS.encode())) == [ev("content", "a\ufffdb"), ev("done")]


# -- errors: kind in ParseEvent.name, message in ParseEvent.text; the parser stops after one ----------

def _error_then_silent(sp: StreamParser) -> None:
    assert sp.failed
    assert sp.feed("more text" + EOS) == []
    assert [e.kind for e in sp.finish()] == ["result"]


def test_text_after_the_end_of_sentence_token() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed("Hi" + EOS + "!")) == [
        ev("content", "Hi"), ev("done"), ev("error", "text after the end-of-sentence token", name="content_after_eos")]
    _error_then_silent(sp)


def test_text_after_the_tool_block() -> None:
    block = f"{OPEN}\n{CLOSE}"
    sp = StreamParser("chat")
    assert rows(sp.feed("\n\n" + block + "oops" + EOS)) == [
        ev("tool_block", block), ev("error", "text after the tool block", name="content_after_tool_calls")]
    _error_then_silent(sp)
    assert sp.tool_blocks == [block]


def test_text_after_the_end_following_a_tool_block() -> None:
    block = f"{OPEN}\n{CLOSE}"
    sp = StreamParser("chat")
    assert rows(sp.feed("\n\n" + block + EOS + "x")) == [
        ev("tool_block", block), ev("done"),
        ev("error", "text after the end-of-sentence token", name="content_after_eos")]
    _error_then_silent(sp)


def test_a_tool_block_waits_for_its_end_of_sentence_token() -> None:
    block = f"{OPEN}\n{CLOSE}"
    sp = StreamParser("chat")
    assert rows(sp.feed("\n\n" + block + "<｜end")) == [ev("tool_block", block)]
    assert rows(sp.feed("▁of▁sentence｜>")) == [ev("done")]
    assert rows(sp.finish()) == [ev("result")]


def test_two_characters_that_are_not_the_tag_layout() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed("\n\n<｜DSML｜tool_calls" + ">x")) == [
        ev("error", "expected '>' and a newline between DSML tags", name="dsml_layout")]
    _error_then_silent(sp)


def test_neither_an_invoke_nor_the_block_end() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed(f"\n\n{OPEN}\nxyz")) == [
        ev("error", "expected an invoke or the end of the tool block", name="dsml_layout")]
    _error_then_silent(sp)


def test_a_malformed_invoke_header() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed(f'\n\n{OPEN}\n{INV} name="f">\nxyz')) == [
        ev("error", "malformed invoke header", name="dsml_invoke")]
    _error_then_silent(sp)


def test_a_malformed_parameter_head() -> None:
    sp = StreamParser("chat")
    assert rows(sp.feed(f'\n\n{OPEN}\n{INV} name="f">\n{PAR} name="a">v{PAR_END}')) == [
        ev("call_start", index=0, name="f"),
        ev("error", 'malformed parameter (expected name="..." string="true|false")', name="dsml_parameter")]
    _error_then_silent(sp)


def test_a_parameter_head_may_run_to_4096_characters_before_it_is_refused() -> None:
    head = f'\n\n{OPEN}\n{INV} name="f">\n{PAR}'
    sp = StreamParser("chat")
    # After "<｜DSML｜parameter": ' name="' (7 characters) and 4089 more: 4096, still undecided.
    assert rows(sp.feed(head + ' name="' + "a" * 4089)) == [ev("call_start", index=0, name="f")]
    assert not sp.failed
    assert rows(sp.feed("a")) == [  # the 4097th
        ev("error", 'malformed parameter (expected name="..." string="true|false")', name="dsml_parameter")]


def test_a_parameter_given_twice() -> None:
    sp = StreamParser("chat")
    text = (f'\n\n{OPEN}\n{INV} name="f">\n{PAR} name="a" string="false">1{PAR_END}\n'
            f'{PAR} name="a" string="false">2{PAR_END}\n{INV_END}\n{CLOSE}{EOS}')
    assert rows(sp.feed(text)) == [
        ev("call_start", index=0, name="f"),
        ev("param_start", "false", 0, "a"),
        ev("call_args", '{"a": ', 0),
        ev("param_text", "1", 0, "a"),
        ev("param_end", "1", 0, "a"),
        ev("error", "parameter 'a' given twice", name="dsml_duplicate_parameter")]
    _error_then_silent(sp)


def test_a_value_closed_without_its_angle_bracket() -> None:
    sp = StreamParser("chat")
    text = f'\n\n{OPEN}\n{INV} name="f">\n{PAR} name="a" string="true">x/｜DSML｜parameter>\n{INV_END}\n{CLOSE}{EOS}'
    assert rows(sp.feed(text)) == [
        ev("call_start", index=0, name="f"),
        ev("param_start", "true", 0, "a"),
        ev("call_args", '{"a": "', 0),
        ev("error", "parameter value not closed by </｜DSML｜parameter>", name="dsml_parameter")]
    _error_then_silent(sp)


def _after_value(tail: str) -> list[Row]:
    sp = StreamParser("chat")
    out = rows(sp.feed(f'\n\n{OPEN}\n{INV} name="f">\n{PAR} name="a" string="true">x{PAR_END}{tail}'))
    assert sp.failed
    return out


def test_text_after_a_parameter() -> None:
    start = [ev("call_start", index=0, name="f"), ev("param_start", "true", 0, "a"), ev("call_args", '{"a": "', 0),
             ev("param_text", "x", 0, "a"), ev("param_end", "x", 0, "a")]
    bad = ev("error", "expected '>' and a newline after a parameter", name="dsml_layout")
    assert _after_value("x") == start + [bad]
    # One letter short of the invoke's closing tag is not that tag.
    assert _after_value(f"\n</｜DSML｜invokX>\n{CLOSE}{EOS}") == start + [bad]


def test_malformed_text_is_the_failed_block_from_its_blank_line() -> None:
    p = StreamParser("chat")
    assert p.malformed_text() == ""  # no block began
    p.feed("answer")
    assert p.malformed_text() == ""
    bad = f"\n\n{OPEN} \nnot a call"
    events = p.feed(bad + " more" + EOS)
    assert [e.kind for e in events if e.kind == "error"] == ["error"]
    # from the blank line on, everything fed after it, without the end of sentence
    assert p.malformed_text() == bad + " more"
