"""An append-only token transcript of a conversation (chat and agent).

Each append renders only the new messages, with everything before them as the official
encoder's ``context``: the text is exactly what the official encoding produces turn by turn,
and tokens are only ever added at the end, so the KV session prefills just the new suffix. For
a conversation in one thinking mode this equals ``render(messages, drop_thinking=False)`` of
the whole conversation (consecutive user messages are the one exception: the official encoder
never merges across the context boundary, so they stay separate turns). Rendered suffixes
begin at a special token (a turn marker, the end of sentence, or the ``<think>`` an answer
follows), so tokenising them separately gives the ids of tokenising the whole text.

Assistant turns keep the token ids the model actually sampled (a model may pick a
non-canonical tokenisation; re-tokenising would break the KV prefix) whenever their text is
exactly the rendering of the parsed message; tool blocks replay byte for byte through the
message's ``dsml`` field.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Callable, Sequence

from .template import render

if TYPE_CHECKING:
    from ..modelfile import Tokenizer

# Stand-in for supplied text that contains control-token strings, while rendering. Private-use
# code points: no tokenizer piece and no real text is expected to contain this pattern.
_PLACEHOLDER = re.compile("\ue000ds4:(\\d+)\ue001")


def _guard(messages: list[dict], tok: Tokenizer) -> tuple[list[dict], list[str]]:
    """Replace supplied strings that contain control-token text by placeholders."""
    originals: list[str] = []

    def sub(value):
        if isinstance(value, str) and tok.contains_added(value):
            originals.append(value)
            return f"\ue000ds4:{len(originals) - 1}\ue001"
        if isinstance(value, list):
            return [{**p, "text": sub(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else sub(p)
                    for p in value]
        return value

    if not any(tok.contains_added(str(m.get(k, ""))) for m in messages for k in ("content", "reasoning_content")):
        return messages, originals
    out = []
    for m in messages:
        m = copy.copy(m)
        for key in ("content", "reasoning_content"):
            if key in m:
                m[key] = sub(m[key])
        out.append(m)
    return out, originals


def encode_guarded(tok: Tokenizer, messages: list[dict],
                   render_fn: Callable[[list[dict]], str]) -> tuple[str, list[int]]:
    """Render ``messages`` with ``render_fn`` and tokenise the result: rendered structure
    becomes control tokens, while a supplied string (content, reasoning) that contains the text
    of a control token is tokenised as plain text, so it can never forge one (docs/protocol.md
    §1.2). Returns the text and its ids; only when such a string occurs is the rendering
    tokenised piecewise, otherwise it is one canonical encode_rendered."""
    guarded, originals = _guard(list(messages), tok)
    text = render_fn(guarded)
    if not originals:
        return text, tok.encode_rendered(text)
    ids: list[int] = []
    parts = _PLACEHOLDER.split(text)
    for i, part in enumerate(parts):
        if i % 2 == 0:
            ids += tok.encode_rendered(part) if part else []
        else:
            ids += tok.encode(originals[int(part)])
    return _PLACEHOLDER.sub(lambda m: originals[int(m.group(1))], text), ids


class Transcript:
    def __init__(self, tokenizer: Tokenizer, thinking_mode: str = "thinking",
                 reasoning_effort: str | None = None) -> None:
        self.tok = tokenizer
        self.thinking_mode = thinking_mode
        self.reasoning_effort = reasoning_effort
        self.messages: list[dict] = []
        self.tokens: list[int] = []
        self.text = ""

    def _render_new(self, messages: list[dict]) -> str:
        first = not self.messages
        # Think-Max's paragraph sits right after BOS, so only the first render can place it.
        return render(messages, self.thinking_mode, self.reasoning_effort if first else None,
                      drop_thinking=False, add_default_bos_token=first, context=self.messages or None)

    def append(self, *messages: dict) -> list[int]:
        """Add messages (user, tool results, system, ...); returns the token ids added.

        Text that the user or a tool supplied is never turned into control tokens: a file that
        contains the string <｜end▁of▁sentence｜> stays text. Only when such a string occurs is
        the rendering tokenised piecewise; otherwise it is one canonical encode_rendered."""
        text, added = encode_guarded(self.tok, list(messages), self._render_new)
        self.messages.extend(messages)
        self.tokens.extend(added)
        self.text += text
        return added

    def append_sampled(self, message: dict, sampled: Sequence[int]) -> bool:
        """Add the assistant turn ``message`` that the model produced as ``sampled`` token ids.

        Returns True when the sampled ids were kept (their text is exactly the turn's rendering),
        False when the turn was re-tokenised from its rendering (an interrupted answer that gets
        an end-of-sentence appended, or output that did not parse)."""
        text = self._render_new([message])
        self.messages.append(message)
        self.text += text
        # Compare as decoded text: an answer cut in the middle of a character (or a model
        # emitting invalid UTF-8) renders U+FFFD there, while the ids keep the real bytes.
        if self.tok.decode(sampled) == text:
            self.tokens.extend(int(t) for t in sampled)
            return True
        self.tokens.extend(self.tok.encode_rendered(text))
        return False

    def rerender(self, thinking_mode: str | None = None, reasoning_effort: str | None = None) -> None:
        """Render the whole conversation again (e.g. Think Max toggled: its paragraph sits at
        the very start). The KV cache no longer matches; the next sync prefills everything."""
        if thinking_mode:
            self.thinking_mode = thinking_mode
        self.reasoning_effort = reasoning_effort
        self.text = render(self.messages, self.thinking_mode, self.reasoning_effort, drop_thinking=False)
        self.tokens = self.tok.encode_rendered(self.text)
