"""File tools: read (numbered chunks), write (whole file), edit (guarded line ranges or a unique
replacement), list (a directory, respecting .gitignore; symlinks shown, never followed)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from .base import Tool, ToolError, ToolResult, Workspace, arg

MAX_FILE = 64 * 1024 * 1024  # beyond this a file is not read into memory at all
DEFAULT_LINES = 400
MAX_LINE = 2000  # characters shown of one line (minified files)
SNIFF = 8192


def _text_of(p: Path, ws: Workspace) -> str:
    if not p.exists():
        raise ToolError(f"{ws.rel(p)}: no such file")
    if p.is_dir():
        raise ToolError(f"{ws.rel(p)}: is a directory (use list)")
    if not p.is_file():  # a FIFO blocks forever on open, /dev/zero never ends
        raise ToolError(f"{ws.rel(p)}: not a regular file; not read")
    size = p.stat().st_size
    if size > MAX_FILE:
        raise ToolError(f"{ws.rel(p)}: {size / 2**20:.0f} MiB is too large to read (limit {MAX_FILE // 2**20} MiB); "
                        "use search, or bash with head/sed")
    data = p.read_bytes()
    if b"\0" in data[:SNIFF]:
        raise ToolError(f"{ws.rel(p)}: binary file ({size} bytes); not shown")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace")


def read(ws: Workspace, args: dict) -> ToolResult:
    p = ws.resolve(arg(args, "path", str, required=True))
    start = arg(args, "start", int, 1)
    count = arg(args, "lines", int, DEFAULT_LINES)
    if start < 1 or count < 1:
        raise ToolError("start and lines must be positive")
    text = _text_of(p, ws)
    ws.remember(p, text)
    lines = text.splitlines()
    total = len(lines)
    end = min(total, start - 1 + count)
    if start > max(total, 1):
        raise ToolError(f"{ws.rel(p)} has {total} lines; start {start} is past the end")
    width = len(str(end))
    shown = []
    for i in range(start - 1, end):
        line = lines[i]
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + f" … [{len(line) - MAX_LINE} more characters]"
        shown.append(f"{i + 1:>{width}}\t{line}")
    body = "\n".join(shown)
    if end < total:
        tail = f"\n[lines {start}-{end} of {total}; continue with start={end + 1}]"
    else:
        tail = f"\n[lines {start}-{end} of {total}; end of file]" if total else "[empty file]"
    span = "whole file" if start == 1 and end == total else f"{start}:{end}"
    return ToolResult(body + tail, f"read {ws.rel(p)} ({span})")


def _diff(ws: Workspace, p: Path, old: str, new: str) -> str:
    rel = ws.rel(p)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}", n=2))


def _write_text(ws: Workspace, p: Path, text: str) -> None:
    """Write ``p`` atomically (keeping its mode); the workspace's journal, when it keeps one,
    records the file's content before and after, for /undo."""
    journal = ws.journal
    if journal is not None:
        journal.before_write(p)  # before anything is created: the directories made count too
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.ds4tmp")
    tmp.write_text(text, encoding="utf-8")
    if p.exists():
        os.chmod(tmp, p.stat().st_mode & 0o7777)
    os.replace(tmp, p)
    if journal is not None:
        journal.after_write(p)


def _lines(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def _count(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _changes(diff: str) -> tuple[int, int]:
    """Lines added and removed by a unified diff. Only the first two lines are file headers:
    a changed line whose own text starts with '++' or '--' reads '+++...' in the body and
    must still count."""
    body = diff.splitlines()[2:]
    return sum(ln.startswith("+") for ln in body), sum(ln.startswith("-") for ln in body)


def _plan_write(ws: Workspace, args: dict) -> tuple[Path, str | None, str]:
    """The file, its text now (None: it does not exist) and its text after the write."""
    p = ws.resolve(arg(args, "path", str, required=True))
    content = arg(args, "content", str, required=True)
    if p.is_dir():
        raise ToolError(f"{ws.rel(p)}: is a directory")
    if p.exists() and not p.is_file():
        raise ToolError(f"{ws.rel(p)}: not a regular file; not written")
    old = p.read_text(encoding="utf-8", errors="replace") if p.exists() else None
    return p, old, content


PREVIEW_HEAD = 20  # lines of a new file shown before approving it


def new_file_preview(rel: str, content: str) -> str:
    """A file about to be created: its size and first lines (a diff of a new file is all '+')."""
    lines = content.splitlines()
    head = "\n".join(lines[:PREVIEW_HEAD])
    more = f"\n… {len(lines) - PREVIEW_HEAD} more lines" if len(lines) > PREVIEW_HEAD else ""
    size = len(content.encode("utf-8"))
    return f"new file {rel}: {_count(_lines(content))}, {size} bytes\n{head}{more}".rstrip("\n")


def preview_write(ws: Workspace, args: dict) -> str:
    p, old, content = _plan_write(ws, args)
    if old is None:
        return new_file_preview(ws.rel(p), content)
    return _diff(ws, p, old, content) or f"{ws.rel(p)}: unchanged (the new content is the same)"


def write(ws: Workspace, args: dict) -> ToolResult:
    p, old, content = _plan_write(ws, args)
    _write_text(ws, p, content)
    ws.remember(p, content)
    n = _count(_lines(content))
    verb = "rewrote" if old else "created"
    return ToolResult(f"{verb} {ws.rel(p)} ({n})", f"write {ws.rel(p)} ({n})",
                      detail=_diff(ws, p, old or "", content))


def _plan_edit(ws: Workspace, args: dict) -> tuple[Path, str, str]:
    """The file, its text now and its text after the edit (raises ToolError when the edit
    cannot apply)."""
    p = ws.resolve(arg(args, "path", str, required=True))
    new = arg(args, "new", str, required=True)
    old_text = arg(args, "old", str)
    start, end = arg(args, "start", int), arg(args, "end", int)
    text = _text_of(p, ws)
    if old_text is not None:
        if not old_text:
            raise ToolError("'old' is empty; give the exact text to replace")
        count = text.count(old_text)
        if count == 0:
            raise ToolError(f"{ws.rel(p)}: 'old' text not found; read the file and copy the text exactly")
        if count > 1:
            raise ToolError(f"{ws.rel(p)}: 'old' text occurs {count} times; "
                            "include more surrounding lines to make it unique")
        updated = text.replace(old_text, new, 1)
    elif start is not None:
        seen = ws.seen.get(str(p))
        st = p.stat()
        if seen is None:
            raise ToolError(f"{ws.rel(p)}: read the file before editing lines of it")
        if (st.st_mtime_ns, st.st_size) != seen[:2] or seen[2] != text:
            raise ToolError(f"{ws.rel(p)}: changed since you last read it; read it again before a line edit")
        lines = text.splitlines(True)
        end = start if end is None else end
        if not (1 <= start <= end <= len(lines)):
            raise ToolError(f"{ws.rel(p)}: lines {start}-{end} are outside 1-{len(lines)}")
        replacement = new if new.endswith("\n") or not new else new + "\n"
        updated = "".join(lines[: start - 1]) + replacement + "".join(lines[end:])
    else:
        raise ToolError("give either 'old' (text to replace) or 'start' (and 'end') line numbers")
    return p, text, updated


def preview_edit(ws: Workspace, args: dict) -> str:
    p, text, updated = _plan_edit(ws, args)
    return _diff(ws, p, text, updated) or f"{ws.rel(p)}: unchanged (the replacement is the same text)"


def edit(ws: Workspace, args: dict) -> ToolResult:
    """Either replace ``old`` (which must occur exactly once) by ``new``, or replace lines
    ``start``..``end`` by ``new`` — the latter only on a file unchanged since the model read it."""
    p, text, updated = _plan_edit(ws, args)
    _write_text(ws, p, updated)
    ws.remember(p, updated)
    diff = _diff(ws, p, text, updated)
    added, removed = _changes(diff)
    return ToolResult(f"edited {ws.rel(p)}:\n{diff}", f"edit {ws.rel(p)} (+{added} -{removed})", detail=diff)


def list_dir(ws: Workspace, args: dict) -> ToolResult:
    from .search import walk

    p = ws.resolve(arg(args, "path", str, "."))
    if not p.exists():
        raise ToolError(f"{ws.rel(p)}: no such directory")
    if not p.is_dir():
        raise ToolError(f"{ws.rel(p)}: is a file (use read)")
    files, links = walk(ws, p)
    entries: dict[str, int] = {}
    for f in files:
        rel = f.relative_to(p)
        head = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        entries[head] = entries.get(head, 0) + 1
    shown_links: dict[str, str] = {}
    for f in links:
        rel = f.relative_to(p)
        if len(rel.parts) == 1:
            try:
                shown_links[rel.parts[0]] = os.readlink(f)
            except OSError:
                shown_links[rel.parts[0]] = "?"
        else:
            head = rel.parts[0] + "/"
            entries.setdefault(head, 0)
    lines = [f"{name}  ({n} files)" if name.endswith("/") else name for name, n in sorted(entries.items())]
    lines += [f"{name} -> {target}  (symlink, not followed)" for name, target in sorted(shown_links.items())]
    body = "\n".join(lines) if lines else "[empty]"
    return ToolResult(body, f"list {ws.rel(p)} ({len(lines)} entries)")


TOOLS = [
    Tool("read", "Read a text file with line numbers, in chunks. Returns where to continue.",
         {"type": "object", "properties": {
             "path": {"type": "string", "description": "file path, relative to the workspace root"},
             "start": {"type": "integer", "minimum": 1, "description": "first line (1-based, default 1)"},
             "lines": {"type": "integer", "minimum": 1, "description": f"how many lines (default {DEFAULT_LINES})"}},
          "required": ["path"]}, read),
    Tool("write", "Create a file or replace its whole content.",
         {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
          "required": ["path", "content"]}, write, kind="edit", preview=preview_write),
    Tool("edit", "Change part of a file: replace the unique text 'old' by 'new', or replace lines start..end "
         "(as numbered by your last read of the unchanged file) by 'new'.",
         {"type": "object", "properties": {
             "path": {"type": "string"},
             "old": {"type": "string", "description": "exact text to replace (must be unique)"},
             "new": {"type": "string", "description": "replacement text"},
             "start": {"type": "integer", "minimum": 1, "description": "first line to replace"},
             "end": {"type": "integer", "minimum": 1, "description": "last line to replace (default: start)"}},
          "required": ["path", "new"]}, edit, kind="edit", preview=preview_edit),
    Tool("list", "List a directory of the workspace (files ignored by git are left out).",
         {"type": "object", "properties": {"path": {"type": "string", "description": "directory (default: the root)"}}},
         list_dir),
]
