"""Chat protocol text of the official DeepSeek V4 encoding.

For now this holds the one-shot prompt (one optional system text, one user message, an open
assistant turn), which is what `ds4 -p` needs. The full renderer and parser follow.
"""

from __future__ import annotations

from .tokenizer import ASSISTANT, BOS, THINK_CLOSE, THINK_OPEN, USER

# Protocol constant of the official encoding (476 bytes, ends with a blank line), inserted right
# after BOS when reasoning effort is "max". Reproduced byte for byte because the model was trained
# on it; tests check its SHA-256.
THINK_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
# The model card recommends Think Max only with at least 384K tokens of context.
THINK_MAX_MIN_CTX = 393216

MODES = ("chat", "thinking", "max")


def one_shot_prompt(user: str, system: str | None = None, mode: str = "thinking") -> str:
    """BOS [Think-Max] [system] <｜User｜>user<｜Assistant｜> then <think> (thinking, max) or
    </think> (chat): the official rendering of a single user turn."""
    if mode not in MODES:
        raise ValueError(f"unknown thinking mode {mode!r}")
    head = BOS + (THINK_MAX if mode == "max" else "") + (system or "")
    return head + USER + user + ASSISTANT + (THINK_CLOSE if mode == "chat" else THINK_OPEN)
