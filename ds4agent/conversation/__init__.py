"""The conversation layer every front end shares: a conversation with the model (transcript,
KV session, streamed events), the coding agent's loop on top of it, and the one event type they
hand up. No terminal or HTTP code here, and no MLX or numpy: the engine is reached through its
public names.
"""

from __future__ import annotations

from .. import lazy

_EXPORTS = {
    "Event": ".events", "event_json": ".events",
    "Conversation": ".turns", "ContextError": ".turns", "Stats": ".turns",
    "Agent": ".agent", "STOP_REASONS": ".agent",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy.exports(__name__, _EXPORTS)
