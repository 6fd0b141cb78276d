"""search: literal or regex over the workspace's files, with a glob filter and context lines.
Files git ignores are skipped (git decides, when the workspace is a repository)."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

from .base import Tool, ToolError, ToolResult, Workspace, arg

MAX_MATCHES = 200
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache"}


def workspace_files(ws: Workspace, under: Path) -> list[Path]:
    """Files below ``under``: git's view (tracked + untracked, not ignored) in a repository,
    otherwise a walk that skips the usual build and tool directories. Symlinks are never
    followed and nothing inside a .git (at any depth) is listed: see ``walk``."""
    return walk(ws, under)[0]


def walk(ws: Workspace, under: Path) -> tuple[list[Path], list[Path]]:
    """(files, symlinks) below ``under``. A symlink is reported, never followed, and nothing
    is listed that lies below a symlinked directory, resolves outside ``under`` or is inside a
    .git directory (a nested repository's included)."""
    from .classify import in_git_dir

    candidates: list[Path] | None = None
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
                             cwd=under, capture_output=True, timeout=30)
        if out.returncode == 0:
            candidates = sorted(under / Path(os.fsdecode(f)) for f in out.stdout.split(b"\0") if f)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if candidates is None:
        candidates = []
        for dirpath, dirnames, filenames in os.walk(under):  # never descends into symlinked directories
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not in_git_dir(Path(d)))
            candidates += [Path(dirpath) / f for f in sorted(filenames)]
            candidates += [Path(dirpath) / d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
    base = Path(os.path.realpath(under))
    files: list[Path] = []
    links: list[Path] = []
    for f in candidates:
        try:
            rel = f.relative_to(under)
        except ValueError:
            continue
        if in_git_dir(rel):
            continue
        parent_real = Path(os.path.realpath(f.parent))
        if parent_real != base and base not in parent_real.parents:
            continue  # below a symlinked directory that leads elsewhere
        if in_git_dir(parent_real.relative_to(base)) if parent_real != base else False:
            continue
        if f.is_symlink():
            links.append(f)
        elif f.exists() or f.is_symlink():
            files.append(f)
    return files, links


def search(ws: Workspace, args: dict) -> ToolResult:
    pattern = arg(args, "pattern", str, required=True)
    is_regex = arg(args, "regex", bool, False)
    glob = arg(args, "glob", str, None)
    context = max(0, min(arg(args, "context", int, 0), 10))
    where = ws.resolve(arg(args, "path", str, "."))
    if not pattern:
        raise ToolError("pattern is empty")
    try:
        rx = re.compile(pattern if is_regex else re.escape(pattern))
    except re.error as e:
        raise ToolError(f"invalid regular expression: {e}") from None
    except (OverflowError, RecursionError):  # "a{99999999999}", thousands of nested groups
        raise ToolError("regular expression too large or nested too deeply; simplify it") from None
    if not where.exists():
        raise ToolError(f"{ws.rel(where)}: no such file or directory")
    files = [where] if where.is_file() else workspace_files(ws, where)
    out, matches, hit_files = [], 0, 0
    for f in files:
        rel = ws.rel(f)
        if glob and not (fnmatch.fnmatch(rel, glob) or fnmatch.fnmatch(f.name, glob)):
            continue
        if not f.is_file():  # a FIFO in the tree would block the search forever
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        lines = data.decode("utf-8", errors="replace").splitlines()
        hits = [i for i, line in enumerate(lines) if rx.search(line)]
        if not hits:
            continue
        hit_files += 1
        shown: set[int] = set()
        for i in hits:
            if matches >= MAX_MATCHES:
                break
            matches += 1
            lo, hi = max(0, i - context), min(len(lines), i + context + 1)
            if context and shown and lo > max(shown) + 1:
                out.append("--")
            for j in range(lo, hi):
                if j in shown:
                    continue
                shown.add(j)
                sep = ":" if j == i else "-"
                out.append(f"{rel}{sep}{j + 1}{sep}{lines[j][:500]}")
        if matches >= MAX_MATCHES:
            break
    if not out:
        return ToolResult(f"no matches for {pattern!r}", f"search {pattern!r}: no matches")
    more = f"\n[stopped at {MAX_MATCHES} matches; narrow the pattern or the path]" if matches >= MAX_MATCHES else ""
    return ToolResult("\n".join(out) + more, f"search {pattern!r}: {matches} matches in {hit_files} files")


TOOLS = [
    Tool("search", "Search file contents in the workspace (literal text by default, or a regular expression). "
         "Output lines are path:line:text; with context, neighbouring lines use '-'.",
         {"type": "object", "properties": {
             "pattern": {"type": "string"}, "regex": {"type": "boolean", "description": "treat pattern as a regex"},
             "path": {"type": "string", "description": "file or directory to search (default: the root)"},
             "glob": {"type": "string", "description": "only files matching this glob, e.g. *.py"},
             "context": {"type": "integer", "description": "lines of context around each match (0-10)"}},
          "required": ["pattern"]}, search),
]
