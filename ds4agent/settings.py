"""Paths and settings: where ds4agent keeps its files, what the environment and config.toml say,
and which model file to run. Imports nothing heavy (every layer may use it, including the
session store and the front ends, without loading numpy, gguf or MLX).

Environment: DS4_HOME (the home folder, default ~/.ds4agent), DS4_SESSIONS (the session
store), DS4_MODEL (the model file), DS4_KERNELS (kernel implementation), DS4_KERNEL_CHECK=0
(skip the GPU kernels' self-check), DS4_THREADS and DS4_AMX=0 (CPU kernel tuning; DS4_PREFETCH is
read by engine/kernels/cpu_tune.py, which parses and reports it).

The configured default model (`model = "..."` in ~/.ds4agent/config.toml) is read here; which
model file runs is decided in modelfile/choice.py.
"""

from __future__ import annotations

import difflib
import os
import sys
import tomllib
from pathlib import Path


def ds4_home() -> Path:
    return Path(os.environ.get("DS4_HOME") or Path.home() / ".ds4agent")


def sessions_dir() -> Path:
    env = os.environ.get("DS4_SESSIONS")
    return Path(env).expanduser() if env else ds4_home() / "sessions"


def models_dir() -> Path:
    """Where generated demo models are cached."""
    return ds4_home() / "models"


def kernels_dir() -> Path:
    """Where the compiled CPU kernels (and the host builds of the GPU kernels) are cached."""
    return ds4_home() / "kernels"


def chat_history_file() -> Path:
    return ds4_home() / "chat_history"


def kernels_choice() -> str:
    """$DS4_KERNELS, or "auto"."""
    return os.environ.get("DS4_KERNELS") or "auto"


def kernel_check_enabled() -> bool:
    return os.environ.get("DS4_KERNEL_CHECK", "1").strip() != "0"


def cpu_threads() -> int | None:
    value = os.environ.get("DS4_THREADS", "")
    return int(value) if value.isdigit() else None


def amx_disabled() -> bool:
    return os.environ.get("DS4_AMX") == "0"


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(text: str) -> int | str:
    """A memory budget as the user writes it: "auto", or bytes with an optional K/M/G/T
    (powers of 1024; "GB" and "GiB" both mean 2**30), e.g. 8G, 12.5GiB, 512M."""
    t = text.strip().lower()
    if t == "auto":
        return "auto"
    for suffix in ("ib", "b"):
        if t.endswith(suffix) and len(t) > len(suffix) and t[-len(suffix) - 1] in "kmgt":
            t = t[: -len(suffix)]
            break
    unit = t[-1:] if t[-1:] in "kmgt" else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        raise SettingsError(f"memory budget {text!r}: give bytes (8G, 512M, 12.5GiB) or auto") from None
    if not value > 0 or value != value or value == float("inf"):
        raise SettingsError(f"memory budget {text!r} must be more than zero")
    return int(value * _UNITS[unit])


def pool_policy() -> str:
    """$DS4_POOL_POLICY: how the expert pool evicts ("lru", the default, or "lfu")."""
    return os.environ.get("DS4_POOL_POLICY") or "lru"


def pool_direct() -> bool:
    """$DS4_POOL_DIRECT: "0" makes the expert pool read through the page cache even where direct
    reads work (a comparison; direct is the default)."""
    return os.environ.get("DS4_POOL_DIRECT", "1") != "0"


def memory_budget_choice() -> int | str:
    """$DS4_MEMORY_BUDGET, else 'memory_budget' in config.toml, else "auto"."""
    text = os.environ.get("DS4_MEMORY_BUDGET")
    if not text:
        data = read_settings(config_path(), CONFIG_KEYS)
        value = data.get("memory_budget")
        if value is None:
            return "auto"
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise SettingsError(f"{config_path()}: 'memory_budget' must be bytes (a number or \"8G\") or \"auto\"")
        text = str(value)
    return parse_budget(text)


SPECULATE = ("off", "ngram", "mtp", "dspark")


def speculate_choice(mtp: bool = False) -> str:
    """$DS4_SPECULATE, else 'speculate' in config.toml, else "mtp" when an MTP file is named
    (``mtp``), else "ngram" (docs/speculation.md)."""
    value = os.environ.get("DS4_SPECULATE")
    if not value:
        value = read_settings(config_path(), CONFIG_KEYS).get("speculate", "mtp" if mtp else "ngram")
    if value not in SPECULATE:
        raise SettingsError(f"speculate must be one of {', '.join(SPECULATE)}, got {value!r}")
    return str(value)


def mtp_choice() -> str | None:
    """The MTP file that --speculate mtp drafts with when --mtp names none: $DS4_MTP, else
    'mtp' in config.toml, else None."""
    value = os.environ.get("DS4_MTP") or read_settings(config_path(), CONFIG_KEYS).get("mtp")
    if value is not None and not isinstance(value, str):
        raise SettingsError(f"{config_path()}: 'mtp' must be the path of an MTP file")
    return str(Path(value).expanduser()) if value else None


class ModelChoiceError(ValueError):
    """A model path the user named (flag, environment, config) that cannot be used; one line."""


# The keys config.toml may hold. Anything else is most likely a typo, which would otherwise be
# ignored without a word (a mistyped "model" silently runs the demo model).
# mcp_servers and git_commit are the agent's (tools/mcp.py, tools/undo.py); memory_budget,
# speculate and mtp the engine's (engine/expertpool.py, engine/drafts.py).
CONFIG_KEYS = ("model", "mcp_servers", "git_commit", "memory_budget", "speculate", "mtp")
# A workspace's own settings file, at its root: the agent's settings that belong to a project.
WORKSPACE_CONFIG = ".ds4agent.toml"
WORKSPACE_KEYS = ("mcp_servers", "git_commit")


class SettingsError(ValueError):
    """A settings file that cannot be read or holds a wrong value; one line."""


def undo_dir() -> Path:
    """The agent's change sets, per workspace (tools/undo.py)."""
    return ds4_home() / "undo"


def logs_dir() -> Path:
    """Where MCP servers' stderr goes."""
    return ds4_home() / "logs"


def mcp_trust_file() -> Path:
    """The workspaces' MCP servers the user allowed to start (tools/mcp.py)."""
    return ds4_home() / "mcp_trusted.json"


def user_instructions_dir() -> Path:
    """Where the user-level AGENTS.md (or CLAUDE.md) lives: the home folder."""
    return ds4_home()


def read_settings(path: Path, known: tuple[str, ...]) -> dict:
    """A TOML settings file ({} when there is none); unknown keys are warned about."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"{path}: cannot read configuration: {e}") from None
    _warn_unknown_keys(path, data, known)
    return data


def config_path() -> Path:
    return ds4_home() / "config.toml"


def _warn_unknown_keys(cfg: Path, data: dict, known: tuple[str, ...] = CONFIG_KEYS) -> None:
    for key in data:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"ds4: warning: {cfg}: unknown key '{key}'{hint}; known keys: {', '.join(known)}", file=sys.stderr)


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


def set_config_path(key: str, value: str) -> Path:
    """Set top-level string ``key`` of config.toml to ``value`` (a path), keeping every other
    line as it was: a ``key = ...`` line before the first table is replaced, else the line is
    added there (top-level keys must come before tables). Written whole to a temporary file
    and renamed, and only when the result still reads as TOML with the value in place.
    Returns the file. SettingsError for a file that does not read."""
    import json
    import re

    if key not in CONFIG_KEYS:
        raise ValueError(f"not a config key: {key}")
    cfg = config_path()
    text = cfg.read_text(encoding="utf-8") if cfg.exists() else ""
    if text:
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"{cfg}: cannot read configuration: {e}; not changed") from None
    line = f"{key} = {json.dumps(value, ensure_ascii=False)}"  # (JSON's escapes of " \\ and controls are TOML's)
    lines = text.splitlines()
    first_table = next((i for i, s in enumerate(lines) if s.lstrip().startswith("[")), len(lines))
    mine = [i for i in range(first_table) if re.match(rf"\s*{re.escape(key)}\s*=", lines[i])]
    if mine:
        lines[mine[0]] = line
    else:
        lines.insert(first_table, line)
    new = "\n".join(lines) + "\n"
    try:
        same = tomllib.loads(new).get(key) == value
    except tomllib.TOMLDecodeError:
        same = False
    if not same:
        raise SettingsError(f"{cfg}: could not set {key} without changing more (a multi-line value?); set it by hand")
    cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = cfg.with_name(cfg.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    os.replace(tmp, cfg)
    return cfg
