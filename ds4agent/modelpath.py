"""Which model file to run: `-m PATH`, then $DS4_MODEL, then the configured default
(`model = "..."` in ~/.ds4agent/config.toml), then the built-in demo model."""

from __future__ import annotations

import difflib
import os
import sys
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


# The keys config.toml may hold. Anything else is most likely a typo, which would otherwise be
# ignored without a word (a mistyped "model" silently runs the demo model).
CONFIG_KEYS = ("model",)


def config_path() -> Path:
    return ds4_home() / "config.toml"


def _warn_unknown_keys(cfg: Path, data: dict) -> None:
    for key in data:
        if key in CONFIG_KEYS:
            continue
        close = difflib.get_close_matches(key, CONFIG_KEYS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"ds4: warning: {cfg}: unknown key '{key}'{hint}; known keys: {', '.join(CONFIG_KEYS)}", file=sys.stderr)


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
    _warn_unknown_keys(cfg, data)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise ModelChoiceError(f"{cfg}: 'model' must be a path string")
    if model is not None and not model.strip():
        raise ModelChoiceError(f"{cfg}: 'model' is empty; give a model path or remove the line")
    return model


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
    return ModelChoice(ensure_demo(), "demo")
