"""Which model file to run: `-m PATH`, then $DS4_MODEL, then the configured default
(`model = "..."` in ~/.ds4agent/config.toml), then the built-in demo model."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .engine.demo import ds4_home, ensure_demo


class ModelChoiceError(ValueError):
    """A model path the user named that cannot be used; one line."""


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    source: str  # "-m", "DS4_MODEL", "config", "demo"

    @property
    def is_demo(self) -> bool:
        return self.source == "demo"


DEMO_BANNER = (
    "Using the built-in demo model: a tiny DeepSeek V4 with random weights (it produces noise). "
    "For the real model, pass -m PATH/TO/DeepSeek-V4-Flash-*.gguf or set DS4_MODEL."
)


def config_path() -> Path:
    return ds4_home() / "config.toml"


def _checked(path: str, source: str, where: str | None = None) -> ModelChoice:
    p = Path(path).expanduser()
    where = where or source
    if not p.exists():
        raise ModelChoiceError(f"{p}: no such model file (from {where})")
    if p.is_dir():
        raise ModelChoiceError(f"{p}: is a directory, expected a .gguf file (from {where})")
    return ModelChoice(p, source)


def configured_model() -> str | None:
    cfg = config_path()
    if not cfg.exists():
        return None
    try:
        data = tomllib.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ModelChoiceError(f"{cfg}: cannot read configuration: {e}") from None
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ModelChoiceError(f"{cfg}: 'model' must be a path string")
    return model


def resolve_model(flag: str | None) -> ModelChoice:
    if flag:
        return _checked(flag, "-m")
    env = os.environ.get("DS4_MODEL")
    if env:
        return _checked(env, "DS4_MODEL")
    configured = configured_model()
    if configured:
        return _checked(configured, "config", str(config_path()))
    return ModelChoice(ensure_demo(), "demo")
