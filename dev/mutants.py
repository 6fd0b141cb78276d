"""The mutants of a module (dev/mutate.py runs them, docs/testing.md): each one small,
plausible bug (a comparison's boundary, an operator, a constant, a dropped call or keyword
argument, a negated condition ...) proposed from the module's syntax tree, with the exact span
of source it replaces and a stable key for dev/mutation.toml.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Mutant:
    n: int  # 1-based position in the module
    line: int  # first line of the mutated node
    stmt_line: int  # line of the statement that contains it (what coverage records)
    scope: str  # qualname of the function whose code changes, or "<module>"
    target: str | None  # qualname of the live function to patch (None: re-execute a statement)
    top_index: int  # index of the enclosing top-level statement
    old: str  # the first changed line, before and after
    new: str
    start: int = 0  # byte offsets of the replaced span in the source
    end: int = 0
    text: str = ""  # the replacement
    key: str = ""  # stable name for mutation.toml: "scope | old => new" (+ " #k")


_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
             ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
             ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr}
_NAME_SWAP = {"min": "max", "max": "min", "any": "all", "all": "any"}
_MESSAGE_SUFFIXES = ("Error", "Exception", "Warning")


class _Finder(ast.NodeVisitor):
    """Walks a module and proposes (node, replacement text) pairs with their context."""

    def __init__(self, source: bytes, tree: ast.Module) -> None:
        self.src = source
        self.lines = source.split(b"\n")
        self.offsets = [0]
        for ln in self.lines:
            self.offsets.append(self.offsets[-1] + len(ln) + 1)
        self.found: list[tuple[int, int, str, int, str, str | None, int]] = []
        self.scope: list[str] = []  # qualname parts
        self.target: str | None = None  # outermost live function whose body we are in
        self.stmt_line = 0
        self.top_index = 0
        self.parents: list[ast.AST] = []
        self.tree = tree

    def qualname(self) -> str:
        q = ".".join(self.scope)
        return q.removesuffix(".<locals>") or "<module>"

    # -- positions
    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offsets[node.lineno - 1] + node.col_offset,
                self.offsets[node.end_lineno - 1] + node.end_col_offset)

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.src[a:b].decode()

    def add(self, node: ast.AST, text: str, paren: bool = True) -> None:
        a, b = self.span(node)
        if paren:
            text = f"({text})"
        scope = self.qualname()
        self.found.append((a, b, text, node.lineno, scope, self.target, self.stmt_line))

    def add_between(self, left: ast.AST, right: ast.AST, old: str, new: str) -> bool:
        """Replace the operator token between two operands (keeps the rest of the text as is)."""
        a = self.span(left)[1]
        b = self.span(right)[0]
        mid = self.src[a:b].decode()
        import re

        pat = re.compile(r"(?<![\w<>=!])" + re.escape(old) + r"(?![\w<>=])" if old[0].isalpha() else
                         r"(?<![<>=!*/+\-&|^%])" + re.escape(old) + r"(?![<>=*/])")
        hits = [m for m in pat.finditer(mid) if "#" not in mid[: m.start()]]
        if len(hits) != 1:
            return False
        m = hits[0]
        scope = self.qualname()
        lineno = self.src[: a + m.start()].count(b"\n") + 1
        self.found.append((a + len(mid[: m.start()].encode()), a + len(mid[: m.end()].encode()), new, lineno, scope,
                           self.target, self.stmt_line))
        return True

    # -- traversal
    def generic_visit(self, node: ast.AST) -> None:
        self.parents.append(node)
        super().generic_visit(node)
        self.parents.pop()

    def visit_Module(self, node: ast.Module) -> None:
        for i, stmt in enumerate(node.body):
            self.top_index = i
            self.visit_body_stmt(stmt, first=(i == 0))

    def visit_body_stmt(self, stmt: ast.stmt, first: bool = False) -> None:
        docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
            and isinstance(stmt.value.value, str)
        if first and docstring:
            return  # docstring
        if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            return
        old = self.stmt_line
        self.stmt_line = stmt.lineno
        self.visit(stmt)
        self.stmt_line = old

    def _body(self, stmts: list[ast.stmt]) -> None:
        for i, s in enumerate(stmts):
            self.visit_body_stmt(s, first=(i == 0))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)
        self.scope.append(node.name)
        old_target = self.target
        if self.target is None:  # reachable from the module through classes: a live function
            self.target = self.qualname()
        self.scope.append("<locals>")
        self.parents.append(node)
        self._body(node.body)
        self.parents.pop()
        self.scope.pop()
        self.scope.pop()
        self.target = old_target

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(d)
        self.scope.append(node.name)
        self.parents.append(node)
        self._body(node.body)
        self.parents.pop()
        self.scope.pop()

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for d in node.args.defaults:
            self.visit(d)
        self.parents.append(node)
        self.visit(node.body)
        self.parents.pop()

    def _visit_stmts_in(self, node: ast.AST) -> None:
        # Compound statements: their headers are visited with this line, bodies per statement.
        self.parents.append(node)
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                self._body(value)
            elif isinstance(value, list):
                for v in value:
                    if isinstance(v, ast.AST):
                        self.visit(v)
            elif isinstance(value, ast.AST):
                self.visit(value)
        self.parents.pop()

    def visit_If(self, node: ast.If) -> None:
        self._cond(node.test)
        self._visit_stmts_in(node)

    def visit_While(self, node: ast.While) -> None:
        self._cond(node.test)
        self._visit_stmts_in(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._cond(node.test)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self._cond(node.test)
        self.visit(node.test)  # the message is not mutated

    def _cond(self, test: ast.expr) -> None:
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        if not isinstance(test, (ast.Compare, ast.BoolOp)) and not negated:
            self.add(test, f"not {self.seg(test)}")

    visit_For = visit_AsyncFor = visit_With = visit_AsyncWith = visit_Try = _visit_stmts_in
    visit_TryStar = visit_Match = visit_match_case = visit_ExceptHandler = _visit_stmts_in

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_arg(self, node: ast.arg) -> None:  # annotations
        return

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                self.visit(v.value)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, (ast.Call, ast.Await)):
            self.add(node, "pass", paren=False)
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.add(node, "pass", paren=False)
        if node.exc is not None and isinstance(node.exc, ast.Call):
            self.visit(node.exc.func)  # the message text is not mutated

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            self.add(node, "return None", paren=False)
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self.add(node, "continue", paren=False)

    def visit_Continue(self, node: ast.Continue) -> None:
        self.add(node, "break", paren=False)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name):
            name = node.func.id
        else:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        message = name.endswith(_MESSAGE_SUFFIXES)
        if isinstance(node.func, ast.Name) and node.func.id in _NAME_SWAP:
            self.add(node.func, _NAME_SWAP[node.func.id], paren=False)
        else:
            self.visit(node.func)
        for a in node.args:
            if message and isinstance(a, ast.Constant) and isinstance(a.value, str):
                continue
            self.visit(a)
        for k in node.keywords:
            if k.arg is not None:
                a, b = self.span(k)
                scope = self.qualname()
                # Drop the keyword (and the comma before or after it).
                src = self.src
                left = a
                while left > 0 and src[left - 1:left] in b" \t\n":
                    left -= 1
                right = b
                while right < len(src) and src[right:right + 1] in b" \t\n":
                    right += 1
                if src[left - 1:left] == b",":
                    self.found.append((left - 1, b, "", k.lineno, scope, self.target, self.stmt_line))
                elif src[right:right + 1] == b",":
                    self.found.append((a, right + 1, "", k.lineno, scope, self.target, self.stmt_line))
            self.visit(k.value)

    def visit_Compare(self, node: ast.Compare) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            new = _CMP_SWAP.get(type(op))
            if new is not None:
                if not self.add_between(left, right, _op_text(op), _op_text(new())):
                    self.add(node, ast.unparse(_swap_one(node, op, new())))
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        new = _BIN_SWAP.get(type(node.op))
        if new is not None and not _is_str_format(node):
            if not self.add_between(node.left, node.right, _op_text(node.op), _op_text(new())):
                self.add(node, ast.unparse(ast.BinOp(node.left, new(), node.right)))
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        new = _BIN_SWAP.get(type(node.op))
        if new is not None:
            if not self.add_between(node.target, node.value, _op_text(node.op) + "=", _op_text(new()) + "="):
                self.add(node, ast.unparse(ast.AugAssign(node.target, new(), node.value)), paren=False)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        new = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self.add(node, ast.unparse(ast.BoolOp(new, node.values)))
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.Not, ast.Invert)):
            self.add(node, self.seg(node.operand))
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            self.add(node, self.seg(node.operand))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        if isinstance(v, bool):
            self.add(node, repr(not v), paren=False)
        elif isinstance(v, int):
            self.add(node, repr(v + 1))
        elif isinstance(v, float):
            self.add(node, repr(v + 1.0))
        elif isinstance(v, (str, bytes)):
            if self.parents and isinstance(self.parents[-1], ast.JoinedStr):
                return
            mark = "XX" if isinstance(v, str) else b"XX"
            self.add(node, repr(mark + v + mark), paren=False)

    def visit_Slice(self, node: ast.Slice) -> None:
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_str_format(node: ast.BinOp) -> bool:
    return isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)


def _op_text(op: ast.AST) -> str:
    return {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
            ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
            ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>",
            ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}[type(op)]


def _swap_one(node: ast.Compare, op: ast.cmpop, new: ast.cmpop) -> ast.Compare:
    ops = [new if o is op else o for o in node.ops]
    return ast.Compare(node.left, ops, node.comparators)


def find_mutants(path: Path) -> list[Mutant]:
    """Every mutant of one module, in source order, each one compiling."""
    source = path.read_bytes()
    tree = ast.parse(source)
    f = _Finder(source, tree)
    f.visit(tree)
    out: list[Mutant] = []
    seen: dict[str, int] = {}
    text_lines = source.decode().split("\n")
    # A statement starts at its first decorator (a decorator's mutant belongs to its class).
    top_starts = [min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])]) for s in tree.body]
    base_dumps = [ast.dump(s) for s in tree.body]
    line_offsets = [0]
    for ln in source.split(b"\n"):
        line_offsets.append(line_offsets[-1] + len(ln) + 1)
    # Byte span of each top-level statement: a mutant inside one is judged by parsing that
    # statement alone. Parsing the whole module per mutant made listing classify.py's 4300
    # mutants take five minutes (the start of every run); one statement takes milliseconds.
    spans = [(line_offsets[top_starts[i] - 1], line_offsets[s.end_lineno]) for i, s in enumerate(tree.body)]

    def unchanged(a: int, b: int, text: str) -> bool | None:
        """Whether the mutant leaves the module's tree as it was; None when it does not parse or
        changes the number of top-level statements."""
        inside = [i for i, (lo, hi) in enumerate(spans) if lo <= a and b <= hi]
        if inside:
            i = inside[0]
            lo, hi = spans[i]
            try:
                body = ast.parse(source[lo:a] + text.encode() + source[b:hi]).body
            except SyntaxError:
                return None
            return None if len(body) != 1 else ast.dump(body[0]) == base_dumps[i]
        try:
            new_tree = ast.parse(source[:a] + text.encode() + source[b:])
        except SyntaxError:
            return None
        if len(new_tree.body) != len(tree.body):
            return None
        return all(ast.dump(x) == y for x, y in zip(new_tree.body, base_dumps))

    for a, b, text, line, scope, target, stmt_line in sorted(set(f.found), key=lambda t: (t[0], t[1], t[2])):
        same = unchanged(a, b, text)
        if same is None or same:
            continue
        mutated = source[:a] + text.encode() + source[b:]
        top = max(i for i, s in enumerate(top_starts) if s <= line) if line >= top_starts[0] else 0
        first = source[:a].count(b"\n")
        new_lines = mutated.decode().split("\n")
        old = text_lines[first].strip()
        new = new_lines[first].strip() if first < len(new_lines) else ""
        if old == new:  # the change is on a later line of a multi-line node
            for i in range(first, len(text_lines)):
                if i >= len(new_lines) or text_lines[i] != new_lines[i]:
                    old, new = text_lines[i].strip(), (new_lines[i].strip() if i < len(new_lines) else "")
                    break
        key = f"{scope} | {old} => {new}"
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            key = f"{key} #{seen[key]}"
        out.append(Mutant(len(out) + 1, line, stmt_line, scope, target, top, old, new, a, b, text, key))
    return out
