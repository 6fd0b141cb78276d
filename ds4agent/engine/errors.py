"""The engine's errors a caller handles, importing nothing (front ends, the scripted engine of the
server's tests and the session store name them without loading numpy or MLX)."""

from __future__ import annotations


class EngineError(ValueError):
    """A model or backend that cannot be used; one line."""


class ContextFullError(ValueError):
    """A prompt or a step that does not fit the session's context."""
