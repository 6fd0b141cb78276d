"""Sessions on disk: the KV snapshot of a conversation, named by the SHA-1 of its text."""

from .store import SessionInfo, SessionStore, StoreError, steering_words

__all__ = ["SessionInfo", "SessionStore", "StoreError", "steering_words"]
