"""More exact parses of shellparse.py: word sources, escapes in raw word text, ANSI-C quoting, unnamed concatenation parts, the
bodiless redirected statement, bare assignments, a list whose operator sits in an ERROR node,
and the length of a quoted ERROR text (its depth edges joined the table in test_shellparse_words.py).

Expected values follow from bash's rules and the walker's counting, worked out by hand."""

from __future__ import annotations

import pytest
from test_shellparse_words import names, words  # shared helpers

from ds4agent.tools.shellparse import parse

# -- word sources ----------------------------------------------------------------------------------


def test_a_plain_double_quoted_word_keeps_its_own_source() -> None:
    # Guards against prefixing `$` to every string's source instead of only to $"...".
    script = parse('echo "a" $"b"')
    (cmd,) = script.commands
    assert [w.source for w in cmd.words] == ["echo", '"a"', '$"b"']
    assert words(cmd) == ["echo", "a", None]


# -- backslashes inside raw word text ---------------------------------------------------------------


def test_a_backslash_newline_inside_a_word_is_dropped() -> None:
    # Guards against keeping the newline of a continuation the grammar left inside `{\<nl>}`
    # (testing the wrong neighbour of the backslash, or never matching the newline).
    script = parse("echo {\\\n}")
    # First reading as written, then the one with the continuation joined: both give `{}`.
    assert names(script) == [["echo", "{}"], ["echo", "{}"]]
    assert script.commands[0].words[1].source == "{\\\n}"
    assert script.problems == []


def test_a_backslash_newline_inside_a_redirection_target_is_dropped() -> None:
    # Guards against the same slip in a redirection target the grammar reads as one word.
    script = parse("a >}\\\n]")
    assert [[r.target.value for r in c.redirects] for c in script.commands] == [["}]"], ["}]"]]


@pytest.mark.parametrize(
    "text, problems",
    [
        # The case pattern `)\` ends in a lone backslash (an extglob_pattern node).
        ("case x in )\\) ;; esac", []),
        # The ERROR word `,\` ends in a lone backslash.
        ("(( |,\\$a ))", ["the command is not valid bash near '|,\\\\'"]),
    ],
)
def test_a_lone_backslash_at_the_end_of_a_word_does_not_crash(text: str, problems: list) -> None:
    # Guards against reading past the end of the word after a final backslash (IndexError).
    assert parse(text).problems == problems


# -- ANSI-C quoting --------------------------------------------------------------------------------


def test_ansi_c_quoted_text_is_quoted() -> None:
    # Guards against treating $'...' text as unquoted: no glob, no brace expansion.
    (cmd,) = parse("echo $'*' $'{a,b}'").commands
    assert words(cmd) == ["echo", "*", "{a,b}"]
    assert [w.glob for w in cmd.words] == [False, False, False]


# -- unnamed parts of a concatenation ---------------------------------------------------------------


def test_a_trailing_dollar_is_part_of_the_word() -> None:
    # Guards against dropping the grammar's unnamed `$` part of `a$` (the value would be `a`).
    (cmd,) = parse("echo a$ *$").commands
    assert words(cmd) == ["echo", "a$", "*$"]
    assert [w.glob for w in cmd.words] == [False, False, True]


def test_a_trailing_dollar_is_unquoted_for_the_tilde() -> None:
    # Guards against marking the unnamed `$` as quoted: `~$` names a user `$` (unknown), so the
    # value stays unknown; were `$` quoted, the word would be taken literally as `~$`.
    (cmd,) = parse("echo ~$").commands
    assert words(cmd) == ["echo", None]
    assert cmd.words[1].source == "~$"


# -- a redirection with no command ------------------------------------------------------------------


def test_a_bare_input_redirection_is_a_command_reading_a_file() -> None:
    # Guards against losing the source of `<f`, or not feeding its standard input from the file.
    (cmd,) = parse("<f").commands
    assert cmd.words == []
    assert cmd.source == "<f"
    assert cmd.stdin == "file"
    assert [(r.op, r.fd, r.target.value, r.dup) for r in cmd.redirects] == [("<", None, "f", False)]


def test_a_bare_redirection_inside_a_function_names_the_function() -> None:
    # Guards against dropping function= from the bodiless redirected statement.
    script = parse("f() { >x; }")
    (cmd,) = script.commands
    assert cmd.function == "f"
    assert cmd.source == ">x"
    assert script.functions == {"f": [cmd]}


def test_a_bare_redirection_after_cd_keeps_the_history() -> None:
    # Guards against dropping cwd= from the bodiless redirected statement.
    cd, red = parse("cd /; >f").commands
    assert red.cwd == frozenset({(cd,)})
    assert red.redirects[0].cwd == frozenset({(cd,)})


# -- bare assignments -------------------------------------------------------------------------------


def test_a_bare_assignment_inside_a_function_names_the_function() -> None:
    # Guards against dropping function= from an assignment-only statement.
    (cmd,) = parse("f() { x=1; }").commands
    assert cmd.kind == "assignment"
    assert cmd.function == "f"
    assert [(n, w.value) for n, w in cmd.assigns] == [("x", "1")]


def test_a_bare_assignment_after_cd_keeps_the_history() -> None:
    # Guards against dropping cwd= from an assignment-only statement.
    cd, assign = parse("cd /; x=1").commands
    assert assign.kind == "assignment"
    assert assign.cwd == frozenset({(cd,)})


# -- list operators ---------------------------------------------------------------------------------


def test_an_error_node_holding_and_is_not_the_lists_operator() -> None:
    # Guards against taking any child whose text is && (here an ERROR node) as the operator:
    # the grammar reads `cd && \ || b` as cd, ERROR(&&), ||, b, so b runs when cd failed too.
    script = parse("cd && \\ || b")
    cd, b = script.commands
    assert names(script) == [["cd"], ["b"]]
    assert b.cwd == frozenset({(), (cd,)})
    assert script.problems == ["the command is not valid bash near '&&'"]


# -- ERROR text length ------------------------------------------------------------------------------


def test_an_error_text_is_quoted_to_40_characters() -> None:
    # Guards against quoting 41 characters of an ERROR node (an unfinished quote here).
    script = parse('echo "0123456789012345678901234567890123456789X')
    assert script.problems == [
        "the command is not valid bash near '\"012345678901234567890123456789012345678'"
    ]


