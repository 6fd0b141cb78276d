"""Shell commands as bash reads them: a tree-sitter bash parse turned into simple commands.

``parse(text)`` returns a ``Script``: every simple command anywhere in the text (inside
pipelines, lists, subshells, groups, if/while/for/case bodies, function bodies, command and
process substitutions, heredoc bodies that the shell expands, assignments and test
expressions), each with its words after quote removal, its redirections and where its standard
input comes from. Nothing here decides what is allowed; ``classify`` does that.

Each command also carries ``cwd``: the possible histories of ``cd``/``pushd``/``popd`` commands
run before it in its shell, followed through ``;``, ``&&``, ``||``, conditionals, loops (twice,
to a fixpoint), subshells, pipeline stages, background jobs and substitutions (whose changes do
not leak out). A classifier resolves them into the directories the command may run in.

A word's value is known only when it is static: quotes are removed and escapes decoded
(``'rm'``, ``r\\m``, ``"r"m`` and ``$'\\x72m'`` are all ``rm``), but anything the shell would
compute (``$X``, ``${IFS}``, ``$(...)``, ``<(...)``, ``$((...))``, brace expansion) leaves the
value unknown (``None``). Unquoted glob characters are flagged, since pathname expansion can
turn them into any file name, options included. What the grammar cannot read (a syntax error,
an unfinished quote) is reported in ``Script.problems``.

bash joins a backslash-newline inside a word (``r\\<newline>m`` is ``rm``); the grammar does
not. ``parse`` therefore reads such text twice, as written and with the continuations joined,
and keeps the commands of both readings: a classifier then sees the worse of the two.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

MAX_DEPTH = 200  # nesting of the syntax tree; deeper text is refused, not walked
MAX_HISTORIES = 32  # possible cd histories kept per point; more make the directory unknown
UNKNOWN_DIR = "?"  # a history element: the directory cannot be followed from here
CD_NAMES = ("cd", "pushd", "popd")


@dataclass
class Word:
    value: str | None  # after quote removal; None when the shell computes it
    source: str  # as written
    glob: bool = False  # unquoted * ? [ : pathname expansion applies
    subst: list["Command"] = field(default_factory=list)  # commands of $(...) / <(...) inside
    procsub: str = ""  # "<" or ">" when the whole word is a process substitution

    @property
    def static(self) -> bool:
        return self.value is not None


@dataclass
class Redirect:
    op: str  # > >> < <> >| &> &>> >& <& << <<- <<<
    fd: int | None
    target: Word | None  # the file (None for a heredoc)
    text: str | None = None  # heredoc / here-string text when static
    dup: bool = False  # >&2, <&0: duplicates a descriptor, opens nothing
    cwd: frozenset = frozenset({()})  # cd histories before it (see Command.cwd)


@dataclass(eq=False)  # compared and hashed by identity: cd histories hold them
class Command:
    """One simple command. ``words[0]`` is the program as written (after quote removal)."""

    words: list[Word]
    assigns: list[tuple[str, Word]] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    # Where standard input comes from: "" (inherited), "pipe" (an earlier pipeline stage or
    # the command writing into a >(...)), "heredoc", "herestring", "file", "procsub".
    stdin: str = ""
    stdin_text: str | None = None  # static heredoc / here-string text fed to it
    upstream: list["Command"] = field(default_factory=list)  # what writes into that pipe
    source: str = ""
    function: str | None = None  # the function whose body this command is in
    kind: str = "simple"  # simple | declaration (export/declare/local/readonly/typeset) | assignment
    # The possible histories of cd/pushd/popd commands (tuples of Commands, or UNKNOWN_DIR)
    # that ran before this one in its shell; () is "still in the starting directory".
    cwd: frozenset = frozenset({()})

    @property
    def name(self) -> str | None:
        return self.words[0].value if self.words else None


@dataclass
class Script:
    text: str
    commands: list[Command] = field(default_factory=list)
    redirects: list[tuple[Redirect, Command | None]] = field(default_factory=list)  # every one, with its command
    problems: list[str] = field(default_factory=list)
    functions: dict[str, list[Command]] = field(default_factory=dict)


@lru_cache(maxsize=1)
def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


_CONTINUATION = re.compile(r"\\\n")
# `coproc NAME { ...; }` / `coproc ( ... )`: the grammar reads the compound as words of a
# command named coproc; a second reading without the keyword sees the commands inside.
_COPROC = re.compile(r"\bcoproc(\s+[A-Za-z_][A-Za-z0-9_]*)?\s+(?=[{(])")


def parse(text: str) -> Script:
    script = _parse_one(text)
    readings = {_CONTINUATION.sub("", text), _COPROC.sub("", text), _COPROC.sub("", _CONTINUATION.sub("", text))}
    for other_text in sorted(readings - {text}):
        other = _parse_one(other_text)
        script.commands += other.commands
        script.redirects += other.redirects
        script.problems += other.problems
        for name, body in other.functions.items():
            script.functions.setdefault(name, []).extend(body)
    return script


def _parse_one(text: str) -> Script:
    data = text.encode("utf-8", "surrogatepass")
    tree = _parser().parse(data)
    script = Script(text)
    try:
        _Walker(script, data).statement(tree.root_node, 0)
    except UnicodeDecodeError:
        # A lone surrogate (text that is not Unicode) outside quotes: the grammar may split its
        # three bytes across nodes, and such a node has no text. Nothing then says what runs.
        script.problems.append("the command holds text that is not valid Unicode outside quotes")
    if tree.root_node.has_error and not script.problems:
        script.problems.append("the command is not valid bash (a syntax error or an unfinished quote)")
    return script


# -- words -------------------------------------------------------------------------------------

_GLOB = set("*?[")
_ANSI = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
         "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _ansi_c(body: str) -> str:
    """The value of $'...' (bash's escapes)."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out.append(c)
            i += 1
            continue
        n = body[i + 1]
        if n in _ANSI:
            out.append(_ANSI[n])
            i += 2
        elif n in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            out.append(chr(int(m.group(0), 8) & 0xFF))
            i += 1 + len(m.group(0))
        elif n == "x":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2:])
            if m:
                out.append(chr(int(m.group(0), 16)))
                i += 2 + len(m.group(0))
            else:
                out.append("\\x")
                i += 2
        elif n in "uU":
            m = re.match(r"[0-9a-fA-F]{1,%d}" % (4 if n == "u" else 8), body[i + 2:])
            if m:
                try:
                    out.append(chr(int(m.group(0), 16)))
                except (ValueError, OverflowError):
                    out.append("\ufffd")
                i += 2 + len(m.group(0))
            else:
                out.append("\\" + n)
                i += 2
        elif n == "c" and i + 2 < len(body):
            out.append(chr(ord(body[i + 2]) & 0x1F))
            i += 3
        else:
            out.append("\\" + n)
            i += 2
    return "".join(out)


def _dquote(body: str) -> str:
    """Inside double quotes a backslash escapes only $ ` " \\ and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), body)


class _Walker:
    def __init__(self, script: Script, data: bytes) -> None:
        self.script = script
        self.data = data
        self.function: str | None = None
        self.state: frozenset = frozenset({()})  # cd histories at this point

    def merge(self, *states: frozenset) -> frozenset:
        out = frozenset().union(*states)
        return out if len(out) <= MAX_HISTORIES else frozenset({(UNKNOWN_DIR,)})

    def isolated(self, fn, *a):
        """Run ``fn`` in a subshell: its cd commands do not change the state after it."""
        saved = self.state
        try:
            return fn(*a)
        finally:
            self.state = saved

    def changed_dir(self, cmd: "Command") -> None:
        if cmd.words and cmd.words[0].value in CD_NAMES:
            self.state = self.merge(frozenset(h + (cmd,) for h in self.state))
        elif cmd.words and cmd.words[0].value in ("builtin", "command") and len(cmd.words) > 1 and \
                cmd.words[1].value in CD_NAMES:
            self.state = self.merge(frozenset(h + (UNKNOWN_DIR,) for h in self.state))

    def text(self, node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", "surrogatepass")

    def problem(self, why: str) -> None:
        if why not in self.script.problems:
            self.script.problems.append(why)

    # A word: (value or None, parts), with a mask of which characters were quoted, so that
    # globs, braces and a leading ~ are only seen where the shell sees them.
    def word(self, node, depth: int) -> Word:
        subst: list[Command] = []
        parts = self._pieces(node, depth, subst)
        source = self.text(node)
        if node.type == "string" and _translated(node):
            source = "$" + source  # the `$` is the string's sibling in the grammar
        w = Word(None, source, subst=subst)
        if node.type == "process_substitution":
            w.procsub = "<" if source.startswith("<") else ">"
        if parts is None:
            # Still say whether unquoted glob characters are there (``*$X``).
            w.glob = any(c in _GLOB for c in _unquoted_chars(node, self))
            return w
        value = "".join(t for t, _ in parts)
        unquoted = "".join(t if not q else "\0" * len(t) for t, q in parts)
        w.glob = any(c in _GLOB for c in unquoted)
        if _has_brace_expansion(unquoted):
            return w  # {a,b} and {1..3} make several words: not one static value
        if unquoted.startswith("~"):
            end = unquoted.find("/") if "/" in unquoted else len(unquoted)
            if "\0" not in unquoted[:end]:
                expanded = os.path.expanduser(value[:end])
                if expanded == value[:end]:  # ~nobody-known: the shell would leave it, but be careful
                    return w
                value = expanded + value[end:]
        w.value = value
        return w

    def _pieces(self, node, depth: int, subst: list[Command]) -> list[tuple[str, bool]] | None:
        """(text, quoted) pieces of a static word, or None (after collecting substitutions)."""
        if depth > MAX_DEPTH:
            self.problem("the command is nested too deeply to check")
            return None
        t = node.type
        if t in ("word", "number", "command_name", "extglob_pattern", "special_variable_name", "variable_name",
                 "test_operator", "regex", "file_descriptor"):
            if t == "command_name":
                if node.named_child_count == 1:
                    return self._pieces(node.named_children[0], depth + 1, subst)
                pieces: list[tuple[str, bool]] = []
                ok = True
                for c in node.named_children:
                    p = self._pieces(c, depth + 1, subst)
                    ok = ok and p is not None
                    pieces += p or []
                return pieces if ok else None
            raw = self.text(node)
            out: list[tuple[str, bool]] = []
            i = 0
            while i < len(raw):
                if raw[i] == "\\" and i + 1 < len(raw):
                    if raw[i + 1] != "\n":
                        out.append((raw[i + 1], True))
                    i += 2
                else:
                    out.append((raw[i], False))
                    i += 1
            return out
        if t == "raw_string":
            return [(self.text(node)[1:-1], True)]
        if t == "ansi_c_string":
            return [(_ansi_c(self.text(node)[2:-1]), True)]
        if t == "string" and _translated(node):
            # $"..." is looked up in the locale's message catalogue (TEXTDOMAIN): its text could
            # become anything, so it is computed, whether the grammar hangs the `$` over the
            # string (translated_string, in an assignment) or beside it (an argument).
            self._collect(node, depth + 1, subst)
            return None
        if t == "string":
            ok = True
            for c in node.named_children:
                if c.type != "string_content":
                    self._collect(c, depth + 1, subst)
                    ok = False
            if not ok:
                return None
            return [(_dquote(self.text(node)[1:-1]), True)]
        if t == "concatenation":
            pieces = []
            ok = True
            for c in node.children:
                if not c.is_named:
                    pieces.append((self.text(c), False))
                    continue
                p = self._pieces(c, depth + 1, subst)
                if p is None:
                    ok = False
                else:
                    pieces += p
            return pieces if ok else None
        # Everything else is computed by the shell: expansions, substitutions, arithmetic,
        # brace expressions, arrays. Commands inside still count.
        self._collect(node, depth + 1, subst)
        return None

    def _substitution(self, node, depth: int) -> None:
        for c in node.named_children:
            self.statement(c, depth + 1)

    def _collect(self, node, depth: int, subst: list[Command]) -> None:
        """Walk what the shell runs inside a computed word part."""
        if node.type in ("command_substitution", "process_substitution"):
            before = len(self.script.commands)
            self.isolated(self._substitution, node, depth)
            inner = self.script.commands[before:]
            subst += inner
            if node.type == "process_substitution" and self.text(node).startswith(">"):
                for c in inner:  # >(cmd): cmd reads what the outer command writes
                    if not c.stdin:
                        c.stdin = "pipe"
            return
        for c in node.named_children:
            self._collect(c, depth + 1, subst)

    # -- statements ---------------------------------------------------------------------------
    def statement(self, node, depth: int, redirects: list[Redirect] | None = None) -> list[Command]:
        """Walk a statement; returns the simple commands it contains (for pipelines)."""
        if depth > MAX_DEPTH:
            self.problem("the command is nested too deeply to check")
            return []
        t = node.type
        if t == "ERROR" or node.is_missing:
            self.problem(f"the command is not valid bash near {self.text(node)[:40]!r}")
        if t == "command":
            return [self.command(node, depth, redirects or [])]
        if t == "declaration_command" or t == "unset_command":
            return [self.declaration(node, depth)]
        if t == "variable_assignment" or t == "variable_assignments":
            assigns = self.assignments(node, depth)
            cmd = Command([], assigns, source=self.text(node), function=self.function, kind="assignment",
                          cwd=self.state)
            self.script.commands.append(cmd)
            return [cmd]
        if t == "redirected_statement":
            reds: list[Redirect] = []
            extra: list[Word] = []
            for i, c in enumerate(node.children):
                if node.field_name_for_child(i) == "redirect" or c.type.endswith("_redirect"):
                    r, more = self.redirect(c, depth)
                    if r is not None:
                        reds.append(r)
                    extra += more
            body = node.child_by_field_name("body")
            if body is None:
                cmd = Command(extra, redirects=reds, source=self.text(node), function=self.function, cwd=self.state)
                self.script.commands.append(cmd)
                self._feed(cmd, reds)
                for r in reds:
                    self.script.redirects.append((r, cmd))
                return [cmd]
            inner = self.statement(body, depth + 1, reds if body.type == "command" else None)
            if body.type == "command" and inner:
                inner[0].words += extra  # `ls >f more args`: the words after the target are arguments
            elif extra:
                self.problem("words after a redirection of a compound command")
            if body.type != "command":
                # The grammar hangs `a && b > f` and `a | b > f` on the whole list or pipeline;
                # bash gives the redirection to b alone. Either way it may happen in any
                # directory the body passes through, and may feed any of its commands.
                for r in reds:
                    r.cwd = self.merge(r.cwd, self.state, *(c.cwd for c in inner))
                    self.script.redirects.append((r, None))
                    for c in inner:
                        self._feed(c, [r])
            return inner
        if t == "pipeline":
            stages: list[list[Command]] = []
            for c in node.named_children:  # each stage runs in a subshell
                stages.append(self.isolated(self.statement, c, depth + 1))
            seen: list[Command] = []
            for i, stage in enumerate(stages):
                if i:
                    for cmd in stage:
                        if not cmd.stdin:
                            cmd.stdin = "pipe"
                        cmd.upstream += seen
                seen = seen + stage
            return [c for s in stages for c in s]
        if t == "function_definition":
            name_node = node.child_by_field_name("name")
            name = self.text(name_node) if name_node is not None else ""
            outer, self.function = self.function, name
            before = len(self.script.commands)
            saved = self.state
            self.state = frozenset({(UNKNOWN_DIR,)})  # it runs when called, from wherever that is
            for c in node.named_children:
                if c is not name_node:
                    self.statement(c, depth + 1)
            self.function = outer
            body = self.script.commands[before:]
            self.state = saved
            if any(c.words and c.words[0].value in CD_NAMES for c in body):
                self.state = self.merge(self.state, frozenset({(UNKNOWN_DIR,)}))  # calls may change directory
            self.script.functions.setdefault(name, []).extend(body)
            return []
        if t == "subshell":
            return self.isolated(self._sequence, node, depth)
        if t == "list":
            kids = [c for c in node.children if c.is_named or c.type == "ERROR"]
            op = next((self.text(c) for c in node.children if not c.is_named and self.text(c) in ("&&", "||")), "&&")
            before = self.state
            out = self.statement(kids[0], depth + 1) if kids else []
            after_left = self.state
            if op == "||":
                self.state = self.merge(before, after_left)  # the right side runs when the left failed
            for k in kids[1:]:
                out += self.statement(k, depth + 1)
            self.state = self.merge(after_left, self.state)
            return out
        if t in ("if_statement", "case_statement"):
            # Each branch starts where the condition (or the case word) left off; afterwards the
            # shell is in any branch's end state, or still at the start when none ran.
            out = []
            ends: list[frozenset] = []
            start: frozenset | None = None
            in_then = False
            for i, c in enumerate(node.children):
                if not (c.is_named or c.type == "ERROR"):
                    continue
                if node.field_name_for_child(i) in ("condition", "value"):
                    out += self.statement(c, depth + 1)
                    continue
                if start is None:
                    start = self.state
                if c.type in ("elif_clause", "else_clause", "case_item"):
                    if in_then:
                        ends.append(self.state)
                        in_then = False
                    self.state = start
                    out += self.statement(c, depth + 1)
                    ends.append(self.state)
                else:  # a statement of the then-body
                    in_then = True
                    out += self.statement(c, depth + 1)
            if in_then:
                ends.append(self.state)
            start = self.state if start is None else start
            self.state = self.merge(start, *ends)
            return out
        if t in ("while_statement", "for_statement", "c_style_for_statement"):
            # A loop that changes directory may do so any number of times: from there on the
            # directory is unknown (for the loop's own commands too).
            first = self.state
            n, r = len(self.script.commands), len(self.script.redirects)
            out = self._sequence(node, depth)
            if self.state != first:
                lost = frozenset({(UNKNOWN_DIR,)})
                for c in self.script.commands[n:]:
                    c.cwd = self.merge(c.cwd, lost)
                for red, _ in self.script.redirects[r:]:
                    red.cwd = self.merge(red.cwd, lost)
                self.state = self.merge(first, self.state, lost)
            return out
        if t in ("word", "string", "raw_string", "concatenation", "simple_expansion", "expansion",
                 "command_substitution", "process_substitution", "arithmetic_expansion", "number", "array",
                 "ansi_c_string", "translated_string", "brace_expression", "extglob_pattern"):
            # A word in a for list, a case value, a test: only what it runs matters.
            if t in ("command_substitution", "process_substitution"):
                # a subshell, as everywhere else: `[[ $(cd /tmp) ]]; ls` lists where it started
                def inside() -> list[Command]:
                    out: list[Command] = []
                    for c in node.named_children:
                        out += self.statement(c, depth + 1)
                    return out
                return self.isolated(inside)
            self.word(node, depth + 1)
            return []
        # Programs, groups, do-groups, clauses, tests, arithmetic: walk all parts in order. (A
        # comment has no parts; heredoc nodes only come under a heredoc_redirect, see redirect().)
        return self._sequence(node, depth)

    def _sequence(self, node, depth: int) -> list[Command]:
        """The statements of ``node`` in order; one followed by ``&`` runs in the background
        (a subshell)."""
        out: list[Command] = []
        kids = list(node.children)
        for i, c in enumerate(kids):
            if not (c.is_named or c.type == "ERROR"):
                continue
            background = i + 1 < len(kids) and not kids[i + 1].is_named and self.text(kids[i + 1]) == "&"
            if background:
                out += self.isolated(self.statement, c, depth + 1)
            else:
                out += self.statement(c, depth + 1)
        return out

    def assignments(self, node, depth: int) -> list[tuple[str, Word]]:
        if node.type == "variable_assignments":
            return [a for c in node.named_children for a in self.assignments(c, depth + 1)]
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        name = self.text(name_node) if name_node is not None else "?"
        if value is None:
            return [(name, Word("", ""))]
        return [(name, self.word(value, depth + 1))]

    def declaration(self, node, depth: int) -> Command:
        words = [Word(self.text(node.children[0]), self.text(node.children[0]))]
        assigns: list[tuple[str, Word]] = []
        for c in node.named_children:
            if c.type == "variable_assignment":
                assigns += self.assignments(c, depth + 1)
            else:
                words.append(self.word(c, depth + 1))
        cmd = Command(words, assigns, source=self.text(node), function=self.function, kind="declaration",
                      cwd=self.state)
        self.script.commands.append(cmd)
        return cmd

    def command(self, node, depth: int, outer: list[Redirect]) -> Command:
        words: list[Word] = []
        assigns: list[tuple[str, Word]] = []
        reds: list[Redirect] = []
        for c in node.children:
            if not c.is_named:
                # A lone `$` (echo $ x) is the grammar's only unnamed argument: a literal
                # word. Right before a string it is the $"..." prefix, which word() reads.
                nxt = c.next_sibling
                if c.type == "$" and not (nxt is not None and nxt.type == "string" and _translated(nxt)):
                    words.append(Word("$", "$"))
                continue
            if c.type == "variable_assignment":  # a=1 b=2 cmd: one node each, never a list
                assigns += self.assignments(c, depth + 1)
            elif c.type.endswith("_redirect"):
                r, more = self.redirect(c, depth + 1)
                if r is not None:
                    reds.append(r)
                words += more
            elif c.type == "comment":
                continue
            else:
                if self.text(c).startswith("\n"):
                    # `x=1` NEWLINE `\rm -rf d`: the grammar glues the next line's escaped name
                    # onto the assignment's command; bash runs it as a command of its own.
                    self.problem("a command the parser joined across a line break")
                words.append(self.word(c, depth + 1))
        cmd = Command(words, assigns, reds + outer, source=self.text(node), function=self.function, cwd=self.state)
        self.script.commands.append(cmd)
        self.changed_dir(cmd)
        self._feed(cmd, cmd.redirects)
        for r in reds:
            self.script.redirects.append((r, cmd))
        for r in outer:
            self.script.redirects.append((r, cmd))
        return cmd

    def _feed(self, cmd: Command, reds: list[Redirect]) -> None:
        """Standard input from a redirection: a file, a heredoc, a here-string, <(...)."""
        for r in reds:
            if r.op in ("<<", "<<-", "<<<") and (r.fd in (None, 0)):
                cmd.stdin = "heredoc" if r.op != "<<<" else "herestring"
                cmd.stdin_text = r.text
            elif r.op in ("<", "<>") and r.fd in (None, 0) and r.target is not None:
                if r.target.procsub:
                    cmd.stdin = "procsub"
                    cmd.upstream += r.target.subst
                else:
                    cmd.stdin = "file"
            elif r.op == "<&" and r.fd in (None, 0) and not r.dup:
                cmd.stdin = "file"

    def redirect(self, node, depth: int) -> tuple[Redirect | None, list[Word]]:
        fd_node = node.child_by_field_name("descriptor")
        fd = None
        if fd_node is not None:
            try:
                fd = int(self.text(fd_node))
            except ValueError:
                fd = None
        op = next((self.text(c) for c in node.children if not c.is_named and self.text(c).strip()), "")
        if node.type == "heredoc_redirect":
            start = next((c for c in node.named_children if c.type == "heredoc_start"), None)
            body = next((c for c in node.named_children if c.type == "heredoc_body"), None)
            quoted = start is not None and any(q in self.text(start) for q in "'\"\\")
            text: str | None = ""
            extra: list[Word] = []
            nested: list[Redirect] = []
            if body is not None:
                dynamic = [c for c in body.named_children if c.type != "heredoc_content"]
                # The grammar starts the body node after the first line's leading blanks (and then
                # sees no $(...) there): the body really starts at that line's beginning.
                begin = self.data.rfind(b"\n", 0, body.start_byte) + 1
                if self.data[begin:body.start_byte].strip(b" \t"):
                    begin = body.start_byte
                if not quoted and _unseen_substitution(self.data, begin, body.end_byte, dynamic):
                    # `cmd` or an indented $(cmd) runs, but the grammar left it as text
                    self.problem("a heredoc runs a command substitution the checker cannot follow")
                    text = None
                elif dynamic and not quoted:
                    subst: list[Command] = []
                    for c in dynamic:
                        self._collect(c, depth + 1, subst)
                    text = None
                else:
                    raw = self.data[begin:body.end_byte].decode("utf-8", "surrogatepass")
                    text = raw if quoted else re.sub(r"\\([$`\\\n])",
                                                     lambda m: "" if m.group(1) == "\n" else m.group(1), raw)
                if text is not None and op == "<<-":
                    text = "\n".join(line.lstrip("\t") for line in text.split("\n"))
            for c in node.named_children:  # `cat <<EOF > f`: the grammar nests the next redirect
                if c.type.endswith("_redirect"):
                    r, more = self.redirect(c, depth + 1)
                    if r is not None:
                        nested.append(r)
                    extra += more
            red = Redirect(op or "<<", fd, None, text)
            if nested:
                # Hand the nested ones back through the extra channel of the caller: simplest is
                # to record them now, attached to no command (their targets are still checked).
                for r in nested:
                    self.script.redirects.append((r, None))
            return red, extra
        if node.type == "herestring_redirect":
            target = node.named_children[-1] if node.named_children else None
            w = self.word(target, depth + 1) if target is not None else Word("", "")
            return Redirect("<<<", fd, None, None if w.value is None else w.value + "\n"), []
        dests = [c for i, c in enumerate(node.children) if node.field_name_for_child(i) == "destination"]
        if not dests:  # 3>&-, <&-: the grammar has no destination (the only named child is the descriptor)
            self.problem(f"a redirection without a target ({self.text(node)[:40]!r})")
            return None, []
        target = self.word(dests[0], depth + 1)
        extra = [self.word(d, depth + 1) for d in dests[1:]]
        # A dup names a descriptor (2>&1, <&-); a computed target (`>&$X`) may be a file.
        dup = op in (">&", "<&") and target.value is not None and (target.value.isdigit() or target.value == "-")
        return Redirect(op, fd, target, dup=dup, cwd=self.state), extra


def _has_brace_expansion(unquoted: str) -> bool:
    depth, start = 0, -1
    for i, c in enumerate(unquoted):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                inner = unquoted[start + 1:i]
                if "," in inner or ".." in inner:
                    return True
    return False


_SUBST_OPEN = re.compile(rb"\\.|`|\$\(", re.S)  # an escaped character, or what opens a substitution


def _unseen_substitution(data: bytes, begin: int, end: int, dynamic: list) -> bool:
    """Whether an unquoted heredoc body holds a backquote or ``$(`` outside the parts the grammar
    parsed (``\\`` escapes the next character, as bash reads a heredoc)."""
    return any(not m.group().startswith(b"\\") and not any(c.start_byte <= m.start() < c.end_byte for c in dynamic)
               for m in _SUBST_OPEN.finditer(data, begin, end))


def _translated(node) -> bool:
    """Whether a string node is the body of $"...": a `$` right before it, with no gap."""
    prev = node.prev_sibling
    return prev is not None and prev.type == "$" and prev.end_byte == node.start_byte


def _unquoted_chars(node, walker: _Walker) -> str:
    if node.type in ("word",):
        return walker.text(node)
    if node.type == "concatenation":
        return "".join(_unquoted_chars(c, walker) for c in node.named_children)
    return ""
