"""Fixtures shared by the classify test files (imported by name into each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds4agent.tools.classify import places


@pytest.fixture(autouse=True)
def _no_temp_dirs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workspace lives under the temporary directory: here it must not count as "tmp".
    monkeypatch.setattr(places, "temp_dirs", lambda: ())  # what Places asks


@pytest.fixture()
def root(tmp_path: Path, git_init) -> Path:
    """A git-initialised workspace holding src/app.py."""
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    git_init(r)
    (r / "src" / "app.py").write_text("x\n")
    return r


# The real temp_dirs, taken at import, before the autouse fixture above replaces it.
REAL_TEMP_DIRS = places.temp_dirs
