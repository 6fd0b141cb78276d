"""Project instructions (conversation/instructions.py): AGENTS.md and CLAUDE.md from the user's
home folder, the workspace root and the directories down to where the agent started, in the
system prompt general to specific; those of directories touched later in the tool result; the
banner lists what was loaded."""

from __future__ import annotations

from pathlib import Path

from ds4agent.conversation.agent_setup import AgentSetup
from ds4agent.conversation.instructions import Instructions
from ds4agent.ui.agent_ui import banner_lines


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    home, root = tmp_path / "home", tmp_path / "repo"
    (root / "src" / "api").mkdir(parents=True)
    (root / "docs").mkdir()
    home.mkdir()
    (home / "AGENTS.md").write_text("user: answer briefly\n")
    (root / "AGENTS.md").write_text("root: use tabs\n")
    (root / "CLAUDE.md").write_text("root claude: run make test\n")
    (root / "src" / "CLAUDE.md").write_text("src: use spaces\n")
    (root / "src" / "api" / "AGENTS.md").write_text("api: keep the schema stable\n")
    (root / "docs" / "AGENTS.md").write_text("docs: British spelling\n")
    return home, root


def test_files_at_start_general_to_specific(tmp_path) -> None:
    home, root = _tree(tmp_path)
    ins = Instructions(root, root / "src", home)
    assert [f.label for f in ins.files][1:] == ["AGENTS.md", "CLAUDE.md", "src/CLAUDE.md"]
    assert ins.files[0].label.endswith("home/AGENTS.md")
    prompt = ins.prompt()
    order = [prompt.index(t) for t in ("answer briefly", "use tabs", "run make test", "use spaces")]
    assert order == sorted(order) and "nearer) one wins" in prompt
    assert "keep the schema" not in prompt and "British" not in prompt  # not where the agent started


def test_directories_touched_later_add_theirs_once(tmp_path) -> None:
    home, root = _tree(tmp_path)
    ins = Instructions(root, root, home)
    found = ins.for_path(root / "src" / "api" / "handlers.py")
    assert [f.label for f in found] == ["src/CLAUDE.md", "src/api/AGENTS.md"]
    assert "take precedence" in Instructions.as_result(found) and "schema stable" in Instructions.as_result(found)
    assert ins.for_path(root / "src" / "api") == []  # read once
    assert [f.label for f in ins.for_path(root / "docs")] == ["docs/AGENTS.md"]


def test_a_linked_or_copied_claude_md_is_read_once(tmp_path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "AGENTS.md").write_text("same rules\n")
    (root / "CLAUDE.md").symlink_to("AGENTS.md")
    assert [f.label for f in Instructions(root).files] == ["AGENTS.md"]


def test_the_banner_lists_what_was_loaded(tmp_path) -> None:
    home, root = _tree(tmp_path)
    lines = banner_lines(AgentSetup(instructions=Instructions(root, root / "src", home)))
    assert lines[0].startswith("instructions: ") and "AGENTS.md, CLAUDE.md, src/CLAUDE.md" in lines[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert banner_lines(AgentSetup(instructions=Instructions(empty)))[0].startswith("instructions: none")
