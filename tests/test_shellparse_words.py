"""Exact parses of shellparse.py: words' values and flags,
assignments, the extra readings (continuations, coproc), ANSI-C escapes, cd histories and
their limit, the problem messages, and the MAX_DEPTH boundary along each walker edge.

Every expected value is worked out by hand from bash's rules and the walker's counting (see
the comments), never copied from a run."""

from __future__ import annotations

import pytest

from ds4agent.tools import shellparse
from ds4agent.tools.shellparse import UNKNOWN_DIR, parse

TOO_DEEP = "the command is nested too deeply to check"


def words(cmd) -> list:
    return [w.value for w in cmd.words]


def names(script) -> list:
    return [words(c) for c in script.commands]


# -- MAX_DEPTH -----------------------------------------------------------------------------------
# How the walker counts: parse() starts statement(program, 0); "program" falls through to
# _sequence(program, 0), which walks each child at depth + 1. A subshell is isolated(_sequence,
# node, depth), so in "( " * n + X + " )" * n the k-th subshell is walked at depth k and the
# top node of X at depth n + 1 (D below). statement() and _pieces() refuse a node whose depth
# is > MAX_DEPTH (200) with TOO_DEEP; _collect() checks nothing itself. For a simple command
# `a` at D: command(D) -> word(command_name, D+1) -> _pieces(command_name, D+1) ->
# _pieces(word, D+2). So X's deepest check is at n + k for a k per construct (worked out below),
# and the text is accepted for n = 200 - k and refused for n = 201 - k.


def nest(n: int, inner: str) -> str:
    return "( " * n + inner + " )" * n


def test_depth_boundary_of_a_plain_command() -> None:
    # `a`: deepest check _pieces(word) at D + 2 = n + 3.
    ok = parse(nest(197, "a"))
    assert ok.problems == []
    assert names(ok) == [["a"]]
    # n = 198: the word's _pieces is at 201: the command is kept, its name unknown.
    word_deep = parse(nest(198, "a"))
    assert word_deep.problems == [TOO_DEEP]
    assert names(word_deep) == [[None]]
    # n = 199: _pieces(command_name) itself at 201: the same outcome.
    assert names(parse(nest(199, "a"))) == [[None]]
    # n = 200: the command's statement() is at 201: refused, no command at all.
    refused = parse(nest(200, "a"))
    assert refused.problems == [TOO_DEEP]
    assert refused.commands == []


@pytest.mark.parametrize(
    "inner, k",
    [
        # x=a"b": assignment at D -> word(value) at D+1 -> _pieces(concatenation) D+1 ->
        # _pieces of its parts (word a, string) at D+2. Deepest n + 3.
        ('x=a"b"', 3),
        # x=$(a): word(value) D+1 -> _pieces(command_substitution) D+1 -> _collect at D+2 ->
        # _substitution at D+2 -> statement(a) D+3 -> _pieces(command_name) D+4 -> word D+5.
        ("x=$(a)", 6),
        # a >f: redirected_statement at D; its body at D+1 -> word of the name at D+3; the
        # target: redirect(D) -> word(f) D+1 -> _pieces D+1. Deepest n + 4.
        ("a >f", 4),
        # a | b: pipeline D -> each stage at D+1 -> name word at D+3. Deepest n + 4.
        ("a | b", 4),
        # f() { a; }: function_definition D -> compound_statement D+1 -> a at D+2 -> D+4.
        ("f() { a; }", 5),
        # ( a ) && b: list D -> first kid (subshell) D+1 -> a at D+2 -> word D+4; the second
        # kid b at D+1 -> word D+3. Deepest n + 5 (through the first kid).
        ("( a ) && b", 5),
        # if a; then b; fi: condition a and then-body b both at D+1 -> words at D+3.
        ("if a; then b; fi", 4),
        # The same with the condition, then the body, one subshell deeper: D+1 -> a at D+2 ->
        # word D+4 (each edge on its own decides the deepest check).
        ("if ( a ); then b; fi", 5),
        ("if a; then ( b ); fi", 5),
        # [[ $(a) ]]: test_command D -> _sequence -> statement(command_substitution) D+1 ->
        # statement(a) D+2 -> word D+4.
        ("[[ $(a) ]]", 5),
        # [[ b ]]: test_command D -> statement(word) D+1 -> self.word(D+2) -> _pieces D+2.
        ("[[ b ]]", 3),
        # [[ 1 ]]: the same with a number node.
        ("[[ 1 ]]", 3),
        # case x in @(a)) ;; esac: case_item at D+1 -> _sequence -> statement(extglob_pattern)
        # D+2 -> word at D+3 -> _pieces D+3 (the case word x only reaches D+2).
        ("case x in @(a)) ;; esac", 4),
        # export x=a: declaration D -> assignments(D+1) -> word(value) D+2 -> _pieces D+2
        # (the export word is made directly, without _pieces).
        ("export x=a", 3),
        # >$(b) a: the redirect is a child of the command: redirect(D+1) -> word($(b)) D+2 ->
        # _collect D+3 -> statement(b) D+4 -> word D+6 (the name a only reaches D+2).
        (">$(b) a", 7),
        # a >f $(b): $(b) is a second destination of the redirect (an extra word): redirect(D)
        # -> word D+1 -> _collect D+2 -> statement(b) D+3 -> word D+5 (the body a: D+3).
        ("a >f $(b)", 6),
        # A heredoc body's $(a): redirect(D) -> _collect D+1 -> statement(a) D+2 -> word D+4.
        # (The text ends in a newline so that the closing " )" of nest() is not on the EOF line.)
        ("cat <<EOF\n$(a)\nEOF\n", 5),
        # x=a y=$(b): variable_assignments D -> assignments(y=..., D+1) -> word D+2 -> _collect
        # D+3 -> statement(b) D+4 -> word D+6 (one more than x=$(a): the list is a level).
        ("x=a y=$(b)", 7),
        # cat <<<$(b): the here-string is the command's child: redirect(D+1) -> word D+2 ->
        # _collect D+3 -> statement(b) D+4 -> word D+6.
        ("cat <<<$(b)", 7),
        # cat <<EOF >$(b): the grammar nests >$(b) in the heredoc redirect: redirect(D) ->
        # redirect(D+1) -> word D+2 -> _collect D+3 -> statement(b) D+4 -> word D+6.
        ("cat <<EOF >$(b)\nEOF\n", 7),
        # echo "$(a)": command D -> word(string) D+1 -> _pieces D+1 -> _collect($(a)) D+2 ->
        # statement(a) D+3 -> _pieces(command_name) D+4 -> _pieces(word) D+5: deepest n + 6.
        ('echo "$(a)"', 6),
        # echo $"$(a)": _pieces(string) D+1 sees $"..." -> _collect(string) D+2 ->
        # _collect($(a)) D+3 -> statement(a) D+4 -> word D+6: deepest n + 7.
        ('echo $"$(a)"', 7),
        # echo ${x:-$(a)}: _pieces(expansion) D+1 -> _collect(expansion) D+2 -> its named
        # child $(a) D+3 -> statement(a) D+4 -> word D+6: deepest n + 7.
        ("echo ${x:-$(a)}", 7),
        # a && ( b ): list D -> second kid (subshell) D+1 -> b at D+2 -> word D+4: n + 5.
        ("a && ( b )", 5),
        # [[ 'a' ]]: test_command D -> statement(raw_string) D+1 -> word D+2 -> _pieces D+2.
        ("[[ 'a' ]]", 3),
        # [[ $'a' ]]: the same path for an ansi_c_string.
        ("[[ $'a' ]]", 3),
        # [[ $"a" ]]: the same path for a translated_string.
        ('[[ $"a" ]]', 3),
        # [[ $((1)) ]]: statement(arithmetic_expansion) D+1 -> word D+2 -> _pieces D+2 (its
        # parts are only _collect-ed, which checks nothing).
        ("[[ $((1)) ]]", 3),
        # [[ {1..3} ]]: statement(brace_expression) D+1 -> word D+2 -> _pieces D+2.
        ("[[ {1..3} ]]", 3),
        # [[ <(a) ]]: statement(process_substitution) D+1 -> statement(a) D+2 -> name word D+4.
        ("[[ <(a) ]]", 5),
        # for i in <(a): for_statement D -> _sequence -> process_substitution D+1 -> a at D+2.
        ("for i in <(a); do :; done", 5),
        # a &: a background statement of _sequence is walked at D+1 like any other.
        ("a &", 3),
        ("{ a & }", 4),
        # export a: declaration D -> word(a) D+1 -> _pieces D+1 (export itself is made directly).
        ("export a", 2),
        # x=a"b" c: command D -> assignments D+1 -> word(value) D+2 -> _pieces(concatenation)
        # D+2 -> its parts D+3 (deeper than the name c at D+2).
        ('x=a"b" c', 4),
        # x=$(a) b: assignments D+1 -> word D+2 -> _collect D+3 -> statement(a) D+4 -> D+6.
        ("x=$(a) b", 7),
    ],
)
def test_depth_boundary_along_each_edge(inner: str, k: int) -> None:
    assert parse(nest(200 - k, inner)).problems == []
    assert parse(nest(201 - k, inner)).problems == [TOO_DEEP]


# -- MAX_HISTORIES -------------------------------------------------------------------------------
# A case statement with m items, each `cd dI`, ends in one of m histories (dI,) or still at
# the start () when no item matched: m + 1 histories. merge() keeps up to 32 and makes more
# than 32 the single unknown history (UNKNOWN_DIR,).


def _case_of_cds(m: int) -> str:
    items = " ".join(f"p{i}) cd d{i};;" for i in range(m))
    return f"case x in {items} esac; ls"


def test_thirty_two_histories_are_kept() -> None:
    s = parse(_case_of_cds(31))
    ls = s.commands[-1]
    assert words(ls) == ["ls"]
    cds = [c for c in s.commands if c.name == "cd"]
    assert [words(c) for c in cds] == [["cd", f"d{i}"] for i in range(31)]
    assert ls.cwd == frozenset({()} | {(c,) for c in cds})
    assert len(ls.cwd) == 32


def test_thirty_three_histories_become_unknown() -> None:
    s = parse(_case_of_cds(32))
    assert s.commands[-1].cwd == frozenset({(UNKNOWN_DIR,)})


def test_builtin_cd_without_an_argument_changes_directory() -> None:
    # `builtin cd` (two words) goes home: the directory after it cannot be followed.
    s = parse("builtin cd; ls")
    assert names(s) == [["builtin", "cd"], ["ls"]]
    assert s.commands[1].cwd == frozenset({(UNKNOWN_DIR,)})


def test_c_style_for_loop_that_changes_directory() -> None:
    # A loop with a cd: its commands and those after it may be anywhere (UNKNOWN_DIR added).
    # The loop's own commands: the assignment i=0 (a Command of kind "assignment") and cd x.
    s = parse("for ((i=0; i<3; i++)); do cd x; done; ls")
    init, cd, ls = s.commands
    assert init.kind == "assignment" and [n for n, _ in init.assigns] == ["i"]
    assert words(cd) == ["cd", "x"] and words(ls) == ["ls"]
    assert init.cwd == frozenset({(), (UNKNOWN_DIR,)})
    assert cd.cwd == frozenset({(), (UNKNOWN_DIR,)})
    assert ls.cwd == frozenset({(), (cd,), (UNKNOWN_DIR,)})


# -- problems -------------------------------------------------------------------------------------


def test_an_error_node_is_named_with_its_text() -> None:
    s = parse('echo "abc')
    assert s.problems == ["the command is not valid bash near '\"abc'"]
    assert names(s) == [["echo"]]


def test_a_missing_token_gives_the_general_syntax_problem() -> None:
    # The grammar inserts a missing `)`: an anonymous node the walker does not visit, so
    # only the tree's has_error flag tells.
    s = parse("echo $(ls")
    assert s.problems == ["the command is not valid bash (a syntax error or an unfinished quote)"]
    assert names(s) == [["ls"], ["echo", None]]


def test_valid_text_has_no_problem() -> None:
    assert parse("echo hi").problems == []


# -- words ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, value",
    [
        (r"\u0041b", "Ab"),  # \u with up to 4 hex digits
        (r"\X41", r"\X41"),  # not an escape: kept as written
        (r"\cAb", "\x01b"),  # control-A, then b
        (r"\qab", r"\qab"),  # unknown escape kept, the rest unchanged
    ],
)
def test_ansi_c_escapes(body: str, value: str) -> None:
    s = parse(f"echo $'{body}'")
    assert words(s.commands[0]) == ["echo", value]


def test_backslash_escape_keeps_the_rest_of_the_word() -> None:
    assert words(parse(r"echo a\bc").commands[0]) == ["echo", "abc"]


def test_translated_string_is_not_static() -> None:
    # $"abc" is looked up in the locale's catalogue: the grammar reads it as `$` over a string
    # node, so its value is unknown (a message catalogue could turn it into anything).
    (cmd,) = parse('x=$"abc"').commands
    assert cmd.kind == "assignment"
    assert [(n, w.value, w.source) for n, w in cmd.assigns] == [("x", None, '$"abc"')]


def test_declaration_name_word_is_not_a_glob() -> None:
    (cmd,) = parse("export A=1").commands
    assert [(w.value, w.source, w.glob) for w in cmd.words] == [("export", "export", False)]
    assert [(n, w.value) for n, w in cmd.assigns] == [("A", "1")]


def test_unset_names_are_static_words() -> None:
    (cmd,) = parse("unset PATH").commands
    assert cmd.kind == "declaration"
    assert words(cmd) == ["unset", "PATH"]


def test_number_argument_is_static() -> None:
    assert words(parse("exit 12").commands[0]) == ["exit", "12"]


def test_sequence_brace_expansion_is_not_static() -> None:
    # {1..3} is a brace_expression node; {a..c} is three plain words whose characters are
    # joined into one text in which ".." is seen (bash makes "a b c" of it).
    (cmd,) = parse("echo {1..3} {a..c} {a.c}").commands
    assert words(cmd) == ["echo", None, None, "{a.c}"]


def test_tilde_followed_by_a_quoted_part(monkeypatch) -> None:
    # `~/"ab"`: the ~ and / are unquoted, so ~ expands; the quoted part follows the slash.
    monkeypatch.setenv("HOME", "/home/tester")
    (cmd,) = parse('ls ~/"ab"').commands
    assert words(cmd) == ["ls", "/home/tester/ab"]


def test_surrogate_inside_a_quoted_word_survives() -> None:
    # The text is encoded with surrogatepass (a lone surrogate becomes its 3 bytes) and each
    # node decoded the same way: a string holding all three bytes decodes back to the surrogate.
    (cmd,) = parse('echo "\udcff"').commands
    assert words(cmd) == ["echo", "\udcff"]
    assert cmd.source == 'echo "\udcff"'


def test_surrogate_in_a_comment_is_encoded_and_ignored() -> None:
    # Only the encoding of the whole text sees the comment's surrogate; no node text is decoded.
    s = parse("echo a # \udcff")
    assert names(s) == [["echo", "a"]]
    assert s.problems == []


def test_an_unquoted_surrogate_is_a_problem_not_a_crash(tmp_path) -> None:
    # Unquoted, the grammar splits the surrogate's three bytes across nodes: a node's text does
    # not decode. The command is then one whose programs are unknown (asked), never an exception
    # out of the policy (dangerous() and analyze() are called without run_tool's text check).
    from ds4agent.tools import classify, policy

    assert parse("echo \udcff").problems == ["the command holds text that is not valid Unicode outside quotes"]
    a = classify.analyze("echo \udcff", tmp_path)
    assert a.level == classify.UNKNOWN
    assert a.reasons(classify.UNKNOWN) == ["the command holds text that is not valid Unicode outside quotes"]
    assert policy.dangerous("echo \udcff", tmp_path) is None


# -- extra readings -----------------------------------------------------------------------------


def test_coproc_is_read_again_without_the_keyword() -> None:
    # As written, the grammar sees `coproc { rm x` as one command and `}` as another; the
    # second reading "{ rm x; }" has the real command.
    s = parse("coproc { rm x; }")
    assert names(s) == [["coproc", "{", "rm", "x"], ["}"], ["rm", "x"]]


def test_coproc_with_a_continuation_is_read_with_both_fixes() -> None:
    # Readings besides the text: joined "coproc { rm x; }", without coproc "{ r\\\nm x; }",
    # and both "{ rm x; }"; they are parsed after the text itself, in sorted order ("c" < "{",
    # and a backslash sorts before "m"). Unjoined, r and m are two words.
    s = parse("coproc { r\\\nm x; }")
    assert names(s) == [
        ["coproc", "{", "r", "m", "x"], ["}"],  # as written
        ["coproc", "{", "rm", "x"], ["}"],  # joined
        ["r", "m", "x"],  # without coproc
        ["rm", "x"],  # both
    ]


def test_functions_of_every_reading_are_kept() -> None:
    # "f() { r\\\nm x; }" as written: the grammar does not join the continuation, so it
    # reads the words r and m (the backslash-newline separates them); the joined reading gives
    # rm. The function's body holds the commands of both readings, in that order.
    s = parse("f() { r\\\nm x; }")
    assert [words(c) for c in s.functions["f"]] == [["r", "m", "x"], ["rm", "x"]]


def test_here_string_of_a_loop_feeds_its_commands() -> None:
    # The grammar nests `while ...; done <<<x` (its here-string child has no field name)
    # inside the redirected statement of `>f`. The here-string text is "x" plus the newline
    # bash appends; it reaches every command of the loop. Neither redirection is any one
    # command's: both are recorded with None.
    s = parse("while :; do :; done <<<x >f")
    assert s.problems == []
    assert [(words(c), c.stdin, c.stdin_text, c.redirects) for c in s.commands] == [
        ([":"], "herestring", "x\n", []),
        ([":"], "herestring", "x\n", []),
    ]
    assert [(r.op, r.fd, r.target.value if r.target else None, r.text, c) for r, c in s.redirects] == [
        ("<<<", None, None, "x\n", None),
        (">", None, "f", None, None),
    ]


def test_assignment_without_value_is_the_empty_word() -> None:
    (cmd,) = parse("x=").commands
    assert [(n, w.value, w.source) for n, w in cmd.assigns] == [("x", "", "")]


def test_several_assignments_alone() -> None:
    (cmd,) = parse("a=1 b=2").commands
    assert (cmd.kind, cmd.words) == ("assignment", [])
    assert [(n, w.value) for n, w in cmd.assigns] == [("a", "1"), ("b", "2")]


def test_declaration_inside_a_function_names_the_function() -> None:
    s = parse("f() { export A=1; }")
    (cmd,) = s.functions["f"]
    assert (cmd.kind, cmd.function, words(cmd)) == ("declaration", "f", ["export"])


def test_missing_closing_token_is_not_walked_as_a_statement() -> None:
    # `( a`: the grammar adds a missing anonymous ")"; only named nodes are statements, so
    # the general message is the one problem.
    s = parse("( a")
    assert s.problems == ["the command is not valid bash (a syntax error or an unfinished quote)"]
    assert names(s) == [["a"]]


def test_background_job_as_the_last_part_of_a_case_item() -> None:
    # The last case item may omit ";;": then "&" is the item's last child. `cd x &` runs in a
    # background subshell, so ls still runs in the starting directory.
    s = parse("case y in a) cd x &\nesac; ls")
    assert names(s) == [["cd", "x"], ["ls"]]
    assert s.commands[1].cwd == frozenset({()})


def test_braces_without_comma_after_a_comma_are_literal() -> None:
    # a,{b}: the only brace pair holds "b" (no comma, no ..): bash leaves the word as is.
    assert words(parse("echo a,{b}").commands[0]) == ["echo", "a,{b}"]


def test_a_translated_string_argument_is_computed_like_the_assigned_one() -> None:
    # $"..." goes through the locale's message catalogue, so its text is not static. As an
    # argument the grammar puts the `$` beside the string (not over it, as in x=$"abc"); the
    # walker once read it as the plain string "hello", and inside a word as a literal `$`.
    s = parse('echo $"hello" a$"b" $"" "$""c"')
    (cmd,) = s.commands
    assert [(w.value, w.source) for w in cmd.words] == [
        ("echo", "echo"), (None, '$"hello"'), (None, 'a$"b"'), (None, '$""'), ("$c", '"$""c"')]
    # what runs inside one still counts
    assert names(parse('echo $"$(rm -rf x)"')) == [["rm", "-rf", "x"], ["echo", None]]


def test_a_lone_dollar_is_a_literal_argument() -> None:
    # `echo $ x` prints "$ x": the grammar gives the `$` no named node, and the walker dropped it.
    assert names(parse("echo $ x")) == [["echo", "$", "x"]]
    assert names(parse("echo a $")) == [["echo", "a", "$"]]
    assert names(parse('echo $ "b"')) == [["echo", "$", "b"]]


def test_a_heredoc_delimiter_is_quoted_only_by_quotes_or_a_backslash() -> None:
    # Letters in the delimiter (X, Q) quote nothing: the body is expanded and $(...) runs.
    for delim in ("XEOF", "QX", "X_X"):
        s = parse(f"cat <<{delim}\n$(rm -rf x)\n{delim}\n")
        assert names(s) == [["rm", "-rf", "x"], ["cat"]], delim
        assert s.commands[1].stdin_text is None
    for delim in ("'XEOF'", '"X"', "\\X"):
        end = delim.strip("'\"\\")
        s = parse(f"cat <<{delim}\n$(rm -rf x)\n{end}\n")
        assert names(s) == [["cat"]], delim
        assert s.commands[0].stdin_text == "$(rm -rf x)\n"


def test_standard_input_from_a_computed_dup_target() -> None:
    # <&$X, 0<&$X: $X may name a file (not a descriptor), so it is read as standard input;
    # 1<&$X or 3<&$X give another descriptor and leave standard input alone.
    assert [parse(f"cat {r}").commands[0].stdin for r in ("<&$X", "0<&$X", "1<&$X", "3<&$X", "<&3", "0<&-")] == [
        "file", "file", "", "", "", ""]


@pytest.mark.parametrize("text", ["[[ $(cd /tmp) ]]; ls", "case $(cd /tmp) in a) :;; esac; ls",
                                  "for f in <(cd /tmp); do :; done; ls", "[[ -n $(cd /tmp) ]]; ls"])
def test_a_substitution_in_a_test_list_or_case_word_is_a_subshell(text: str) -> None:
    # Its cd stays inside: the last ls runs where the command started (it was placed in /tmp,
    # so `echo x > .git/hooks/pre-commit` after it looked like a write under /tmp).
    s = parse(text)
    assert s.commands[-1].words[0].value == "ls" and s.commands[-1].cwd == frozenset({()})
    # inside the substitution the cd still counts for what follows it there
    inner = parse("[[ $(cd x; ls) ]]").commands
    assert [c.name for c in inner] == ["cd", "ls"] and len(next(iter(inner[1].cwd))) == 1


def test_a_closed_descriptor_is_not_its_own_target() -> None:
    # 3>&- closes descriptor 3: the grammar gives no destination, and the descriptor node (a new
    # Python object on each access, so an identity test never matched) was taken for one.
    s = parse("cat 3>&-")
    assert [(r.op, r.fd, r.target) for r, _ in s.redirects] == []
    assert s.problems == ["a redirection without a target ('3>&-')"]


@pytest.mark.parametrize("body", ["`rm -rf x`", " $(rm -rf x)", "\t$(rm -rf x)", "a `rm -rf x` b"])
def test_a_heredoc_substitution_the_grammar_leaves_as_text_is_a_problem(body: str) -> None:
    # bash runs `...` and an indented $(...) in an unquoted heredoc; the grammar sees plain text.
    s = parse(f"cat <<EOF\n{body}\nEOF\n")
    assert s.problems == ["a heredoc runs a command substitution the checker cannot follow"]
    assert s.commands[-1].stdin_text is None
    # quoted, it is text
    q = parse(f"cat <<'EOF'\n{body}\nEOF\n")
    assert q.problems == [] and q.commands[0].stdin_text == body + "\n"


def test_a_heredoc_keeps_the_first_lines_leading_blanks() -> None:
    # The grammar's body node starts after them; the text bash feeds keeps them.
    assert parse("cat <<EOF\n  hello\n world\nEOF\n").commands[0].stdin_text == "  hello\n world\n"
    # a substitution the grammar did parse is walked as before, with nothing reported
    s = parse("cat <<EOF\na $(rm x) b\nEOF\n")
    assert names(s) == [["rm", "x"], ["cat"]] and s.problems == []


def test_a_problem_quotes_at_most_40_characters_of_the_redirection() -> None:
    # a descriptor of 45 digits then >&-: the message shows the first 40 characters of it
    assert parse("cat " + "1" * 45 + ">&-").problems == [f"a redirection without a target ({'1' * 40!r})"]


def test_a_name_glued_across_a_line_break_is_a_problem() -> None:
    # The grammar reads `x=1` NEWLINE `\rm -rf d` as one command named "\nrm" (bash runs rm).
    for text in ("x=\n\\rm -rf d", "x=1\n\\rm -rf d"):
        assert parse(text).problems == ["a command the parser joined across a line break"], text
    assert parse("x=1 \\\n  rm -rf d").problems == []  # a backslash-newline really joins the lines


def test_what_counts_as_an_unseen_heredoc_substitution() -> None:
    # a backquote or $( outside the parsed parts counts; an escaped one does not
    unseen = shellparse._unseen_substitution
    assert unseen(b"`a`", 0, 3, []) is True and unseen(b"x $(a)", 0, 6, []) is True
    assert unseen(b"abc $HOME", 0, 9, []) is False
    assert unseen(b"\\`a\\` \\$(b)", 0, 11, []) is False
    assert unseen(b"\\\\`a`", 0, 5, []) is True  # an escaped backslash, then a real backquote
    assert unseen(b"ab`", 0, 2, []) is False  # the range ends before it
    # a backquote inside a substitution the grammar parsed is that part's business
    assert names(parse("cat <<EOF\n$(echo `id`)\nEOF\n")) == [["id"], ["echo", None], ["cat"]]
    assert parse("cat <<EOF\n$(echo `id`)\nEOF\n").problems == []
    # an escaped backquote is text
    assert parse("cat <<EOF\n a\\`b\nEOF\n").commands[0].stdin_text == " a`b\n"


def test_a_backquote_right_after_a_parsed_substitution_is_unseen() -> None:
    # $(a) ends where the backquote starts, and $(c) where the closing one does: neither
    # backquote is part of them
    assert parse("cat <<EOF\n$(a)`b$(c)`\nEOF\n").problems == ["a heredoc runs a command substitution the checker cannot follow"]
