"""Terminal front ends: the chat, the agent, one-shot runs (docs/architecture.md)."""
