"""The code is lint clean: ruff with the rules in pyproject.toml ([tool.ruff]) over the whole
repository — pyflakes' findings, import order, the pycodestyle errors and 120-column lines.
Run it here rather than as a separate CI step so that README's one test command checks it too."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    from ruff.__main__ import find_ruff_bin  # the test extra pins ruff

    r = subprocess.run([find_ruff_bin(), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_reads_the_project_settings() -> None:
    # a line over 120 columns in a package module must be found, so the settings are in force
    from ruff.__main__ import find_ruff_bin

    long_line = "x = " + "1 + " * 40 + "1\n"
    r = subprocess.run([find_ruff_bin(), "check", "--no-cache", "--stdin-filename", "ds4agent/example.py", "-"],
                       cwd=ROOT, input=long_line, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "E501" in r.stdout, r.stdout + r.stderr
