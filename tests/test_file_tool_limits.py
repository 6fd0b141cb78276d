"""File tools: their limits and edge cases, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds4agent.tools import Policy, Workspace, all_tools, files, run_tool
from ds4agent.tools.base import ToolError

TOOLS = all_tools()
MIB = 1024 * 1024


@pytest.fixture()
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "repo"
    root.mkdir()
    return Workspace(root)


def call(ws, name, **args):
    result, _ = run_tool(TOOLS, name, json.dumps(args), ws, Policy("yolo"), None)
    return result


def test_the_read_limit_is_exactly_64_mib(ws) -> None:
    # The limit the error message names: a file of 64 MiB is read (here: all NULs, so it is
    # reported as binary), one byte more is refused without being read.
    for size, fragment in ((64 * MIB, "binary file"), (64 * MIB + 1, "too large to read (limit 64 MiB)")):
        with open(ws.root / "big.bin", "wb") as f:
            f.truncate(size)  # sparse
        r = call(ws, "read", path="big.bin")
        assert not r.ok and fragment in r.text, (size, r.text)


def test_a_read_shows_400_lines_by_default(ws) -> None:
    (ws.root / "long.txt").write_text("".join(f"l{i}\n" for i in range(1, 1001)))
    r = call(ws, "read", path="long.txt")
    body = r.text.splitlines()
    assert body[0] == "  1\tl1" and body[399] == "400\tl400" and len(body) == 401
    assert body[-1] == "[lines 1-400 of 1000; continue with start=401]"


def test_a_file_that_is_not_utf8_is_read_with_replacement_characters(ws) -> None:
    (ws.root / "latin.txt").write_bytes(b"caf\xe9\nok\n")
    r = call(ws, "read", path="latin.txt")
    assert r.ok and r.text.splitlines()[:2] == ["1\tcaf\ufffd", "2\tok"]


def test_read_arguments_and_edges(ws) -> None:
    (ws.root / "f.txt").write_text("".join(f"l{i}\n" for i in range(1, 11)))
    (ws.root / "empty.txt").write_text("")
    r = call(ws, "read")
    assert not r.ok and "missing required parameter 'path'" in r.text
    for bad in (dict(start=0), dict(lines=0), dict(start=0, lines=5), dict(start=3, lines=-1)):
        r = call(ws, "read", path="f.txt", **bad)  # the schema's minimum refuses it first
        assert not r.ok and "must be at least 1" in r.text, bad
        with pytest.raises(ToolError, match="start and lines must be positive"):  # and read() itself
            files.read(ws, {"path": "f.txt", **bad})
    assert files.read(ws, {"path": "f.txt", "lines": 1}).text == "1\tl1\n[lines 1-1 of 10; continue with start=2]"
    r = call(ws, "read", path="f.txt", start=3, lines=1)  # one line is a valid chunk
    assert r.ok and r.text == "3\tl3\n[lines 3-3 of 10; continue with start=4]" and r.summary == "read f.txt (3:3)"
    r = call(ws, "read", path="f.txt")
    assert r.summary == "read f.txt (whole file)" and r.text.endswith("\n[lines 1-10 of 10; end of file]")
    r = call(ws, "read", path="f.txt", start=2)
    assert r.summary == "read f.txt (2:10)"
    r = call(ws, "read", path="f.txt", lines=4)
    assert r.summary == "read f.txt (1:4)"
    r = call(ws, "read", path="f.txt", start=10)
    assert r.ok and r.text.startswith("10\tl10")
    r = call(ws, "read", path="f.txt", start=11)
    assert not r.ok and "f.txt has 10 lines; start 11 is past the end" in r.text
    # An empty file: start 1 shows it is empty, start 2 is past its end.
    r = call(ws, "read", path="empty.txt")
    assert r.ok and r.text == "[empty file]"
    r = call(ws, "read", path="empty.txt", start=2)
    assert not r.ok and "past the end" in r.text


def test_a_line_of_exactly_the_limit_is_shown_whole(ws) -> None:
    (ws.root / "w.txt").write_text("y" * 2000 + "\n" + "z" * 2001 + "\n")
    lines = call(ws, "read", path="w.txt").text.splitlines()
    assert lines[0] == "1\t" + "y" * 2000
    assert lines[1] == "2\t" + "z" * 2000 + " … [1 more characters]"


def test_an_edit_shows_the_exact_unified_diff(ws) -> None:
    (ws.root / "f.txt").write_text("a\nb\nc\nd\ne\nf\ng\n")
    r = call(ws, "edit", path="f.txt", old="d\n", new="D\n")
    want = "--- a/f.txt\n+++ b/f.txt\n@@ -2,5 +2,5 @@\n b\n c\n-d\n+D\n e\n f\n"
    assert r.ok and r.detail == want and r.text == "edited f.txt:\n" + want and r.summary == "edit f.txt (+1 -1)"
    r = call(ws, "write", path="f.txt", content="a\nb\n")
    assert r.detail == "--- a/f.txt\n+++ b/f.txt\n@@ -1,7 +1,2 @@\n a\n b\n-c\n-D\n-e\n-f\n-g\n"
    assert r.text == "rewrote f.txt (2 lines)"


def test_writes_are_journaled_before_and_after(ws) -> None:
    # The undo journal (tools/undo.py) must see the file before anything changes and after.
    seen: list[tuple[str, str | None]] = []

    class Journal:
        def before_write(self, p: Path) -> None:
            seen.append(("before", p.read_text() if p.exists() else None))

        def after_write(self, p: Path) -> None:
            seen.append(("after", p.read_text()))

    ws.journal = Journal()
    assert call(ws, "write", path="sub/new.txt", content="one\n").ok
    assert call(ws, "edit", path="sub/new.txt", old="one", new="two").ok
    assert seen == [("before", None), ("after", "one\n"), ("before", "one\n"), ("after", "two\n")]


def test_a_write_makes_missing_folders_and_keeps_the_files_mode(ws) -> None:
    assert call(ws, "write", path="a/b/c/new.txt", content="x\n").ok
    assert (ws.root / "a" / "b" / "c" / "new.txt").read_text() == "x\n"
    script = ws.root / "run.sh"
    script.write_text("echo 1\n")
    script.chmod(0o750)
    assert call(ws, "edit", path="run.sh", old="1", new="2").ok
    assert script.read_text() == "echo 2\n" and script.stat().st_mode & 0o7777 == 0o750
    assert not [p.name for p in ws.root.iterdir() if p.name.endswith(".ds4tmp")]


@pytest.mark.parametrize("content,n", [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("a\n\n", 2)])
def test_a_write_counts_its_lines(ws, content: str, n: int) -> None:
    r = call(ws, "write", path="c.txt", content=content)
    count = "1 line" if n == 1 else f"{n} lines"
    assert r.text == f"created c.txt ({count})" and r.summary == f"write c.txt ({count})"


@pytest.mark.parametrize("fn,args,name", [
    ("read", {}, "path"), ("write", {"content": "x"}, "path"), ("write", {"path": "a.txt"}, "content"),
    ("edit", {"new": "x", "old": "y"}, "path"), ("edit", {"path": "a.txt", "old": "y"}, "new"),
])
def test_required_arguments_are_checked_by_the_tools_themselves(ws, fn, args, name) -> None:
    (ws.root / "a.txt").write_text("y\n")
    with pytest.raises(ToolError, match=f"missing required parameter '{name}'"):
        getattr(files, fn)(ws, args)
    assert (ws.root / "a.txt").read_text() == "y\n"


def test_write_refuses_directories_and_special_files(ws) -> None:
    import os

    (ws.root / "d").mkdir()
    os.mkfifo(ws.root / "pipe")
    r = call(ws, "write", path="d", content="x")
    assert not r.ok and "d: is a directory" in r.text
    r = call(ws, "write", path="pipe", content="x")
    assert not r.ok and "pipe: not a regular file; not written" in r.text
    r = call(ws, "edit", path="d", old="a", new="b")
    assert not r.ok


def test_new_file_preview_and_write_preview(ws) -> None:
    content = "".join(f"line {i}\n" for i in range(1, 26))
    head = "\n".join(f"line {i}" for i in range(1, 21))
    assert files.new_file_preview("n.txt", content) == f"new file n.txt: 25 lines, {len(content)} bytes\n{head}\n… 5 more lines"
    twenty = "".join(f"line {i}\n" for i in range(1, 21))
    assert files.new_file_preview("n.txt", twenty) == f"new file n.txt: 20 lines, {len(twenty)} bytes\n{head}"
    assert files.preview_write(ws, {"path": "n.txt", "content": "a\n"}) == "new file n.txt: 1 line, 2 bytes\na"
    (ws.root / "n.txt").write_text("a\n")
    assert files.preview_write(ws, {"path": "n.txt", "content": "a\n"}) == "n.txt: unchanged (the new content is the same)"
    assert files.preview_write(ws, {"path": "n.txt", "content": "b\n"}) == "--- a/n.txt\n+++ b/n.txt\n@@ -1 +1 @@\n-a\n+b\n"
    assert files.preview_edit(ws, {"path": "n.txt", "old": "a", "new": "a"}) == "n.txt: unchanged (the replacement is the same text)"


def test_a_new_file_write_and_a_write_over_undecodable_bytes(ws) -> None:
    r = call(ws, "write", path="c.txt", content="a\n")
    assert r.detail == "--- a/c.txt\n+++ b/c.txt\n@@ -0,0 +1 @@\n+a\n"
    # What the model wrote is what it knows: a line edit needs no read first.
    r = call(ws, "edit", path="c.txt", start=1, new="b")
    assert r.ok and (ws.root / "c.txt").read_text() == "b\n"
    (ws.root / "l.txt").write_bytes(b"caf\xe9\n")
    r = call(ws, "write", path="l.txt", content="cafe\n")
    assert r.ok and "-caf\ufffd\n+cafe\n" in r.detail


def test_edit_refuses_an_empty_old_text(ws) -> None:
    (ws.root / "e.txt").write_text("abc\n")
    r = call(ws, "edit", path="e.txt", old="", new="x")
    assert not r.ok and "'old' is empty" in r.text and (ws.root / "e.txt").read_text() == "abc\n"


def test_edit_needs_old_or_start_and_counts_its_lines(ws) -> None:
    (ws.root / "e.txt").write_text("a\nb\nc\n")
    r = call(ws, "edit", path="e.txt", new="x")
    assert not r.ok and "give either 'old' (text to replace) or 'start' (and 'end') line numbers" in r.text
    r = call(ws, "edit", path="e.txt", old="b\n", new="x\ny\n")
    assert r.ok and r.summary == "edit e.txt (+2 -1)" and (ws.root / "e.txt").read_text() == "a\nx\ny\nc\n"
    r = call(ws, "edit", path="e.txt", old="x\ny\nc\n", new="")
    assert r.ok and r.summary == "edit e.txt (+0 -3)"


def test_edit_counts_lines_whose_text_looks_like_diff_headers(ws) -> None:
    # A changed line whose text starts with "++" or "--" reads "+++..."/"---..." in the diff
    # body; only the diff's first two lines are file headers.
    (ws.root / "c.txt").write_text("i++;\n--x;\nk\n")
    r = call(ws, "edit", path="c.txt", old="i++;\n--x;\n", new="++i;\n---\n")
    assert r.ok and r.summary == "edit c.txt (+2 -2)"


def test_write_summary_says_line_or_lines(ws) -> None:
    assert call(ws, "write", path="one.txt", content="a\n").summary == "write one.txt (1 line)"
    assert call(ws, "write", path="two.txt", content="a\nb").summary == "write two.txt (2 lines)"


def test_list_shows_files_folders_with_counts_and_errors(ws) -> None:
    (ws.root / "a.txt").write_text("x")
    (ws.root / "sub" / "deep").mkdir(parents=True)
    (ws.root / "sub" / "one.txt").write_text("1")
    (ws.root / "sub" / "deep" / "two.txt").write_text("2")
    (ws.root / "empty").mkdir()
    r = call(ws, "list")
    assert r.ok and r.text == "a.txt\nsub/  (2 files)" and r.summary == "list . (2 entries)"
    assert call(ws, "list", path="empty").text == "[empty]"
    r = call(ws, "list", path="nope")
    assert not r.ok and "nope: no such directory" in r.text
    r = call(ws, "list", path="a.txt")
    assert not r.ok and "a.txt: is a file (use read)" in r.text


def test_a_line_edit_whose_text_ends_with_a_newline_adds_no_blank_line(ws) -> None:
    (ws.root / "n.txt").write_text("a\nb\nc\n")
    call(ws, "read", path="n.txt")
    assert call(ws, "edit", path="n.txt", start=2, new="B\n").ok
    assert (ws.root / "n.txt").read_text() == "a\nB\nc\n"
    assert call(ws, "edit", path="n.txt", start=2, new="").ok  # empty: the line is deleted
    assert (ws.root / "n.txt").read_text() == "a\nc\n"


def test_new_file_preview_keeps_trailing_text_and_ends_an_empty_file_cleanly() -> None:
    # Only newlines are stripped from the end (an empty file's preview would end with one):
    # a last line ending in other characters, here 'X', stays whole.
    assert files.new_file_preview("e.txt", "") == "new file e.txt: 0 lines, 0 bytes"
    assert files.new_file_preview("m.py", "LIMIT = MAX\n") == "new file m.py: 1 line, 12 bytes\nLIMIT = MAX"


def test_list_shows_a_folder_that_holds_only_a_symlink_and_an_unreadable_link(ws, monkeypatch) -> None:
    (ws.root / "a.txt").write_text("x")
    (ws.root / "only_link").mkdir()
    (ws.root / "only_link" / "to_a").symlink_to("../a.txt")
    (ws.root / "top").symlink_to("a.txt")
    # A folder whose only entry is a symlink is listed with 0 files (the link is not followed).
    assert call(ws, "list").text == "a.txt\nonly_link/  (0 files)\ntop -> a.txt  (symlink, not followed)"
    real = files.os.readlink

    def failing(path, *a, **k):
        if Path(path).name == "top":
            raise PermissionError(13, "denied")
        return real(path, *a, **k)

    monkeypatch.setattr(files.os, "readlink", failing)
    # A link whose target cannot be read is still shown, its target as '?'.
    assert call(ws, "list").text == "a.txt\nonly_link/  (0 files)\ntop -> ?  (symlink, not followed)"
