"""outline: the definitions (classes, functions, methods, types) of a file or a directory,
found with tree-sitter, one per line with its line number and nesting."""

from __future__ import annotations

import importlib
from functools import lru_cache

from .base import Tool, ToolError, ToolResult, Workspace, arg

# suffix -> (grammar module, function returning the language)
LANGUAGES = {
    ".py": ("tree_sitter_python", "language"), ".pyi": ("tree_sitter_python", "language"),
    ".js": ("tree_sitter_javascript", "language"), ".mjs": ("tree_sitter_javascript", "language"),
    ".cjs": ("tree_sitter_javascript", "language"), ".jsx": ("tree_sitter_javascript", "language"),
    ".ts": ("tree_sitter_typescript", "language_typescript"), ".tsx": ("tree_sitter_typescript", "language_tsx"),
    ".go": ("tree_sitter_go", "language"), ".rs": ("tree_sitter_rust", "language"),
    ".c": ("tree_sitter_c", "language"), ".h": ("tree_sitter_cpp", "language"),
    ".cc": ("tree_sitter_cpp", "language"), ".cpp": ("tree_sitter_cpp", "language"),
    ".cxx": ("tree_sitter_cpp", "language"), ".hpp": ("tree_sitter_cpp", "language"),
    ".hh": ("tree_sitter_cpp", "language"), ".java": ("tree_sitter_java", "language"),
}

# node type -> the word shown for it
KINDS = {
    "class_definition": "class", "function_definition": "def", "decorated_definition": None,
    "function_declaration": "function", "generator_function_declaration": "function", "class_declaration": "class",
    "method_definition": "method", "interface_declaration": "interface", "type_alias_declaration": "type",
    "enum_declaration": "enum", "abstract_class_declaration": "class",
    "method_declaration": "method", "type_spec": "type", "constructor_declaration": "constructor",
    "function_item": "fn", "struct_item": "struct", "enum_item": "enum", "trait_item": "trait", "impl_item": "impl",
    "mod_item": "mod", "struct_specifier": "struct", "class_specifier": "class", "namespace_definition": "namespace",
    "enum_specifier": "enum", "record_declaration": "record",
}
MAX_FILES = 400
MAX_BYTES = 2 * 1024 * 1024


@lru_cache(maxsize=None)
def _parser(suffix: str):
    import tree_sitter

    module, fn = LANGUAGES[suffix]
    lang = tree_sitter.Language(getattr(importlib.import_module(module), fn)())
    return tree_sitter.Parser(lang)


def _name(node) -> str | None:
    child = node.child_by_field_name("name")
    if child is not None:
        return child.text.decode("utf-8", errors="replace")
    decl = node.child_by_field_name("declarator")  # C/C++ functions: dig to the identifier
    while decl is not None:
        if decl.type in ("identifier", "field_identifier", "qualified_identifier", "destructor_name", "operator_name"):
            return decl.text.decode("utf-8", errors="replace")
        decl = decl.child_by_field_name("declarator") or (decl.named_children[0] if decl.named_children else None)
    child = node.child_by_field_name("type")  # Rust impl blocks are named by their type
    return child.text.decode("utf-8", errors="replace") if child is not None else None


def outline_source(source: bytes, suffix: str) -> list[tuple[int, int, str, str]]:
    """(line, depth, kind, name) for each definition, in file order."""
    tree = _parser(suffix).parse(source)
    out: list[tuple[int, int, str, str]] = []

    def walk(node, depth: int) -> None:
        for child in node.named_children:
            if KINDS.get(child.type):
                name = _name(child)
                # A C/C++ "struct foo" without a body is a use, not a definition.
                defines = not child.type.endswith("_specifier") or child.child_by_field_name("body") is not None
                if name and defines:
                    out.append((child.start_point[0] + 1, depth, KINDS[child.type], name))
                    walk(child, depth + 1)
                    continue
            walk(child, depth)

    walk(tree.root_node, 0)
    return out


def outline(ws: Workspace, args: dict) -> ToolResult:
    p = ws.resolve(arg(args, "path", str, "."))
    if not p.exists():
        raise ToolError(f"{ws.rel(p)}: no such file or directory")
    if p.is_file():
        if p.suffix not in LANGUAGES:
            raise ToolError(f"{ws.rel(p)}: no outline for {p.suffix or 'files without a suffix'} "
                            f"(supported: {', '.join(sorted(set(LANGUAGES)))})")
        files = [p]
    else:
        from .search import workspace_files

        files = [f for f in workspace_files(ws, p) if f.suffix in LANGUAGES][:MAX_FILES]
    lines, n_defs = [], 0
    for f in files:
        try:
            if not f.is_file():  # a FIFO would block forever
                continue
            data = f.read_bytes()
        except OSError:
            continue
        if len(data) > MAX_BYTES:
            lines.append(f"{ws.rel(f)}: skipped ({len(data) // 1024} KiB)")
            continue
        try:
            defs = outline_source(data, f.suffix)
        except ImportError as e:  # a grammar package missing from this installation
            raise ToolError(f"outline is not available for {f.suffix} files here ({e})") from None
        except RecursionError:  # the tree walk recurses once per nesting level
            lines.append(f"{ws.rel(f)}: skipped (nested too deeply)")
            continue
        if not defs:
            continue
        lines.append(f"{ws.rel(f)}:")
        for line, depth, kind, name in defs:
            lines.append(f"  {line:>5}  {'  ' * depth}{kind} {name}")
        n_defs += len(defs)
    if not lines:
        return ToolResult("no definitions found", f"outline {ws.rel(p)}: nothing")
    return ToolResult("\n".join(lines), f"outline {ws.rel(p)} ({n_defs} definitions in {len(files)} files)")


TOOLS = [
    Tool("outline", "List the definitions (classes, functions, methods, types) of a source file or of every source "
         "file in a directory, with line numbers. Python, JavaScript/TypeScript, Go, Rust, C/C++, Java.",
         {"type": "object",
          "properties": {"path": {"type": "string", "description": "file or directory (default: the root)"}}},
         outline),
]
