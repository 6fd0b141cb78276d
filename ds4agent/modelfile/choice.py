"""Which model file to run: `-m PATH`, then $DS4_MODEL, then the configured default
(`model = "..."` in ~/.ds4agent/config.toml, read by settings.py), then the built-in demo model
(generated on first use)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..settings import ModelChoiceError, config_path, configured_model

__all__ = ["DEMO_BANNER", "ModelChoice", "ModelChoiceError", "resolve_model"]


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


def _checked(path: str, source: str, where: str | None = None) -> ModelChoice:
    p = Path(path).expanduser()
    where = where or source
    if not p.exists():
        raise ModelChoiceError(f"{p}: no such model file (from {where})")
    if p.is_dir():
        raise ModelChoiceError(f"{p}: is a directory, expected a .gguf file (from {where})")
    return ModelChoice(p, source)


def resolve_model(flag: str | None) -> ModelChoice:
    # An empty value was meant to name a model (an unset shell variable, say): running the
    # demo model instead would look like a broken model, so it is an error.
    if flag is not None:
        if not flag.strip():
            raise ModelChoiceError("-m needs a model path, got an empty one")
        return _checked(flag, "-m")
    env = os.environ.get("DS4_MODEL")
    if env is not None:
        if not env.strip():
            raise ModelChoiceError("DS4_MODEL is set but empty; give a model path or unset it")
        return _checked(env, "DS4_MODEL")
    configured = configured_model()
    if configured:
        return _checked(configured, "config", str(config_path()))
    from .demo import ensure_demo  # numpy and gguf: only when the demo is needed

    return ModelChoice(ensure_demo(), "demo")
