"""The engine: the only package that knows tensors.

Public names are resolved lazily so that front ends importing e.g. the tokenizer do not pay for
(or depend on) the MLX import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineError", "Session", "SamplingParams", "Tokenizer", "GGUFError", "ConfigError", "ModelConfig",
           "render", "parse", "Transcript", "StreamParser", "ContextFullError", "describe"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "EngineError"):
        from . import engine

        return getattr(engine, name)
    if name == "ContextFullError":
        from .session import ContextFullError

        return ContextFullError
    if name == "describe":
        from .info import describe

        return describe
    if name == "Session":
        from .session import Session

        return Session
    if name == "SamplingParams":
        from .sampler import SamplingParams

        return SamplingParams
    if name in ("render", "parse"):
        from . import template

        return getattr(template, name)
    if name == "Transcript":
        from .transcript import Transcript

        return Transcript
    if name == "StreamParser":
        from .streamparse import StreamParser

        return StreamParser
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    if name == "GGUFError":
        from .gguf import GGUFError

        return GGUFError
    if name in ("ConfigError", "ModelConfig"):
        from . import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
