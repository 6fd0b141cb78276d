"""The HTTP server front end (`ds4 serve`): OpenAI and Anthropic APIs on the engine, beside the
terminal front ends in ui/ (docs/server.md). Like them it never imports MLX: it reaches the
engine through the Engine/Session surface only, so a scripted engine can stand in for tests.
"""

from __future__ import annotations

from .. import lazy

_EXPORTS = {
    "create_app": ".app", "ServerOptions": ".app", "Defaults": ".requests", "ScriptedEngine": ".scripted",
    "serve": ".run",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy.exports(__name__, _EXPORTS)
