"""The engine: the only package that knows tensors.

Public names are resolved lazily so that front ends importing e.g. the tokenizer do not pay for
(or depend on) the MLX import.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# public name -> module (relative to this package) that defines it
_EXPORTS = {
    "Engine": "engine", "EngineError": "engine", "Session": "session", "ContextFullError": "session",
    "SamplingParams": "sampler", "Tokenizer": "tokenizer", "GGUFError": "gguf", "ConfigError": "config",
    "ModelConfig": "config", "render": "template", "parse": "template", "Transcript": "transcript",
    "StreamParser": "streamparse", "describe": "info",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
