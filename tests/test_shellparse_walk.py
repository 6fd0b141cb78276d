"""More exact parses of shellparse.py: words walked as statements (test operands, for lists, case words), loops, declarations,
heredocs, dup targets, the cwd of redirections, brace expansion and glob flags (their depth
edges joined the table in test_shellparse_words.py).

Each expected value follows from bash's rules and the walker's code, worked out by hand."""

from __future__ import annotations

import pytest
from test_shellparse_words import names, words

from ds4agent.tools.shellparse import UNKNOWN_DIR, parse

# -- loops and substitutions inside words ---------------------------------------------------------


def test_while_loop_that_changes_directory() -> None:
    # guards against a while loop being walked as a plain sequence (no "any number of cds")
    s = parse("while :; do cd x; done; ls")
    colon, cd, ls = s.commands
    assert names(s) == [[":"], ["cd", "x"], ["ls"]]
    assert colon.cwd == frozenset({(), (UNKNOWN_DIR,)})
    assert cd.cwd == frozenset({(), (UNKNOWN_DIR,)})
    assert ls.cwd == frozenset({(), (cd,), (UNKNOWN_DIR,)})


@pytest.mark.parametrize(
    "operand",
    ['"$(cd x)"', "a$(cd x)", "${a:-$(cd x)}", "$(( $(cd x) ))"],
)
def test_cd_in_a_substitution_inside_a_test_operand_does_not_leak(operand: str) -> None:
    # guards against a string/concatenation/expansion/arithmetic operand being walked part by
    # part as statements, which runs the $(cd x) in the outer shell instead of a subshell
    s = parse(f"[[ {operand} ]]; ls")
    assert names(s) == [["cd", "x"], ["ls"]]
    assert s.commands[1].cwd == frozenset({()})


# -- declarations ---------------------------------------------------------------------------------


def test_declaration_records_the_directory_it_runs_in() -> None:
    # guards against a declaration command losing its cd histories
    s = parse("cd x; export A=1")
    cd, export = s.commands
    assert export.kind == "declaration"
    assert export.cwd == frozenset({(cd,)})


def test_declaration_as_a_later_pipeline_stage() -> None:
    # guards against declaration() not returning its command (the pipeline then holds None)
    s = parse("cat | export A")
    cat, export = s.commands
    assert words(export) == ["export", "A"]
    assert (export.stdin, export.upstream) == ("pipe", [cat])


def test_redirected_declaration() -> None:
    # guards against declaration() not returning its command (the redirection loop then fails)
    s = parse("export A=1 >f")
    (cmd,) = s.commands
    assert (cmd.kind, words(cmd), [(n, w.value) for n, w in cmd.assigns]) == ("declaration", ["export"], [("A", "1")])
    assert [(r.op, r.fd, r.target.value, c) for r, c in s.redirects] == [(">", None, "f", None)]


# -- simple commands ------------------------------------------------------------------------------


def test_lone_dollar_word_keeps_its_source() -> None:
    # guards against the literal `$` word getting a wrong source text
    (cmd,) = parse("echo $ x").commands
    assert [(w.value, w.source) for w in cmd.words] == [("echo", "echo"), ("$", "$"), ("x", "x")]


def test_comment_inside_a_command_is_skipped_not_a_word() -> None:
    # The grammar makes `x=1 >f # c` and the next line one command node with the comment as a
    # child. guards against the comment becoming a word or ending the walk of the children.
    s = parse("x=1 >f # c\nb")
    (cmd,) = s.commands
    assert words(cmd) == ["b"]
    assert [(n, w.value) for n, w in cmd.assigns] == [("x", "1")]
    assert [(r.op, r.target.value) for r in cmd.redirects] == [(">", "f")]


# -- redirections ---------------------------------------------------------------------------------


def test_tab_stripped_heredoc_keeps_other_leading_characters() -> None:
    # guards against <<- stripping more than leading tabs from each line
    (cmd,) = parse("cat <<-EOF\n\tXa\n\t\tb\nEOF\n").commands
    assert (cmd.stdin, cmd.stdin_text) == ("heredoc", "Xa\nb\n")


def test_dup_to_a_separate_dash_closes_not_opens() -> None:
    # `<& -` (with a space) closes standard input: a dup, so not a file feeding the command.
    # guards against "-" not being recognised as a dup target
    (cmd,) = parse("cat <& -").commands
    assert [(r.op, r.fd, r.target.value, r.dup) for r in cmd.redirects] == [("<&", None, "-", True)]
    assert cmd.stdin == ""


def test_redirection_records_the_directory_it_opens_in() -> None:
    # guards against a file redirection losing its cd histories (f is opened inside x)
    s = parse("cd x; ls >f")
    cd, ls = s.commands
    (r,) = ls.redirects
    assert (r.op, r.target.value) == (">", "f")
    assert r.cwd == frozenset({(cd,)})


# -- words ----------------------------------------------------------------------------------------


def test_brace_expansion_with_a_leading_comma() -> None:
    # {,a} is "" and "a" (two words); guards against skipping the first character in braces
    (cmd,) = parse("echo {,a} x{,y} {a}").commands
    assert words(cmd) == ["echo", None, None, "{a}"]


def test_glob_flag_of_computed_words_sees_only_unquoted_text() -> None:
    # guards against the quoted * of a computed word ("$X*", '*'$X) being taken for a glob
    (cmd,) = parse("echo \"$X*\" '*'$X *$X").commands
    assert [(w.value, w.glob) for w in cmd.words] == [("echo", False), (None, False), (None, False), (None, True)]


def test_heredoc_on_descriptor_one_does_not_feed_standard_input() -> None:
    # guards against a heredoc on another descriptor (1<<EOF) being taken as standard input
    (cmd,) = parse("cat 1<<EOF\nx\nEOF\n").commands
    assert [(r.op, r.fd, r.text) for r in cmd.redirects] == [("<<", 1, "x\n")]
    assert (cmd.stdin, cmd.stdin_text) == ("", None)


def test_file_read_on_descriptor_one_does_not_feed_standard_input() -> None:
    # guards against `1<f` (opening f on descriptor 1) being taken as standard input
    (cmd,) = parse("cat 1<f").commands
    assert [(r.op, r.fd, r.target.value) for r in cmd.redirects] == [("<", 1, "f")]
    assert cmd.stdin == ""


@pytest.mark.parametrize("test", ['[[ "$(echo a)" == b ]]', "[[ a$(echo a) ]]", "[[ $(echo ls)a ]]",
                                  "[[ ${x:-$(echo ls)} ]]", "case a$(echo ls) in x) ;; esac"])
def test_a_substitution_in_a_test_word_feeds_no_pipe(test: str) -> None:
    # guards against a quoted or concatenated test word being walked as statements: its
    # substitution's echo then became what the pipe carries, and bash "ran" its text
    s = parse(test + " | bash")
    echo, bash = s.commands
    assert echo.name == "echo" and bash.name == "bash"
    assert (bash.stdin, bash.upstream) == ("pipe", [])
