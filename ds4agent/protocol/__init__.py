"""The chat protocol: the official DeepSeek V4 encoding (render a message list, parse a
completion), the append-only transcript that keeps a conversation's exact token ids, and the
streaming DSML parser (docs/protocol.md). Pure text and ids: no tensors, no files."""

from __future__ import annotations

from .streamparse import StreamParser
from .template import THINK_MAX_MIN_CTX, TemplateError, conversation_from_text, one_shot_prompt, parse, render
from .transcript import Transcript, encode_guarded

__all__ = ["THINK_MAX_MIN_CTX", "StreamParser", "TemplateError", "Transcript", "conversation_from_text",
           "encode_guarded", "one_shot_prompt", "parse", "render"]
