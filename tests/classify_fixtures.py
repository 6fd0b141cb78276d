"""Fixtures shared by the classify.py test files (imported by name into each)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ds4agent.tools.classify as classify


@pytest.fixture(autouse=True)
def _no_temp_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workspace lives under the temporary directory: here it must not count as "tmp".
    monkeypatch.setattr(classify, "temp_dirs", lambda: ())


@pytest.fixture()
def root(tmp_path: Path, git_init) -> Path:
    """A git-initialised workspace holding src/app.py."""
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    git_init(r)
    (r / "src" / "app.py").write_text("x\n")
    return r


# The real temp_dirs, taken at import, before the autouse fixture above replaces it.
REAL_TEMP_DIRS = classify.temp_dirs
