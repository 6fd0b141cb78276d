"""What the server remembers about the tool calls the model sampled, so that a client sending
the call back in its history gets the exact bytes the model wrote (docs/server.md §3).

A client replays a tool call as JSON (`tool_calls`, `tool_use`, `function_call`): rendering that
JSON canonically gives DSML that may differ from what the model sampled (parameter order,
spacing, how a number was written), and the KV cache holds the sampled bytes. For each sampled
tool block the memory keeps its exact text, the reasoning that preceded it (most OpenAI-style
clients do not send `reasoning_content` back, yet with tools declared the official encoding
keeps it in the prompt) and the calls it parsed to, under the ids handed to the client.

An assistant message is replayed exactly only when every id it carries maps to the same block
and its calls still mean what the model wrote (same names, same decoded arguments, same
order); a client that edited a call gets the canonical rendering of its edit.

The map survives restarts in the session files (kvfile's tool-id map: id -> block bytes); the
reasoning and calls are read back from the file's text around the block.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..modelfile import ASSISTANT, DSML, EOS, THINK_CLOSE, THINK_OPEN
from ..protocol import parse

if TYPE_CHECKING:
    from ..sessions import SessionStore

BLOCK_OPEN = f"<{DSML}tool_calls>"
BLOCK_CLOSE = f"</{DSML}tool_calls>"
MAX_IDS = 100_000
MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class SampledBlock:
    dsml: str  # the block exactly as sampled, from <｜DSML｜tool_calls> to its closing tag
    reasoning: str | None  # the reasoning before it (thinking mode), None when unknown
    calls: tuple[tuple[str, object], ...]  # (name, decoded arguments) in order


def decode_arguments(arguments: object) -> object:
    """A call's arguments as a comparable value: JSON text decoded, anything else as given."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments


def calls_of_block(dsml: str) -> tuple[tuple[str, object], ...] | None:
    """The calls a sampled block parses to, or None when it does not parse."""
    parsed = parse("\n\n" + dsml, "chat")
    if "error" in parsed:
        return None
    return tuple((c["function"]["name"], decode_arguments(c["function"]["arguments"])) for c in parsed["tool_calls"])


class ToolMemory:
    """Thread-safe: requests are rendered outside the engine's worker thread."""

    def __init__(self, max_ids: int = MAX_IDS, max_bytes: int = MAX_BYTES) -> None:
        self.max_ids, self.max_bytes = max_ids, max_bytes
        self._by_id: OrderedDict[str, SampledBlock] = OrderedDict()
        self._by_dsml: dict[str, set[str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def new_ids(self, prefix: str, n: int) -> list[str]:
        """``n`` fresh ids (``prefix`` + 24 random hex digits), unique against the memory."""
        out: list[str] = []
        with self._lock:
            while len(out) < n:
                ident = prefix + secrets.token_hex(12)
                if ident not in self._by_id and ident not in out:
                    out.append(ident)
        return out

    def remember(self, ids: Iterable[str], block: SampledBlock) -> None:
        with self._lock:
            for ident in ids:
                self._drop(ident)
                self._by_id[ident] = block
                self._by_dsml.setdefault(block.dsml, set()).add(ident)
                self._bytes += len(ident) + len(block.dsml) + len(block.reasoning or "")
            while self._by_id and (len(self._by_id) > self.max_ids or self._bytes > self.max_bytes):
                self._drop(next(iter(self._by_id)))

    def _drop(self, ident: str) -> None:
        block = self._by_id.pop(ident, None)
        if block is None:
            return
        self._bytes -= len(ident) + len(block.dsml) + len(block.reasoning or "")
        ids = self._by_dsml.get(block.dsml)
        if ids is not None:
            ids.discard(ident)
            if not ids:
                del self._by_dsml[block.dsml]

    def lookup(self, ids: list[str]) -> SampledBlock | None:
        """The block all of ``ids`` map to, or None (an unknown id, or ids of different blocks)."""
        with self._lock:
            blocks = {id(self._by_id[i]): self._by_id[i] for i in ids if i in self._by_id}
            if not ids or len(blocks) != 1 or any(i not in self._by_id for i in ids):
                return None
            for i in ids:
                self._by_id.move_to_end(i)
            return next(iter(blocks.values()))

    def replay(self, messages: list[dict], thinking: bool) -> tuple[list[dict], dict[str, int]]:
        """Messages with each replayable assistant turn given its sampled block (``dsml``) and,
        when the client left it out and the prompt renders reasoning, its reasoning. Returns the
        new list (inputs are not changed) and counts: exact, canonical (calls sent back that the
        memory does not know, or that were edited)."""
        out, stats = [], {"exact": 0, "canonical": 0}
        for m in messages:
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            if not calls:
                out.append(m)
                continue
            ids = [c.get("id") or "" for c in calls]
            block = self.lookup(ids)
            theirs = tuple((c["function"]["name"], decode_arguments(c["function"].get("arguments", "")))
                           for c in calls)
            if block is None or block.calls != theirs:
                stats["canonical"] += 1
                out.append(m)
                continue
            m = {**m, "dsml": block.dsml}
            if thinking and not m.get("reasoning_content") and block.reasoning:
                m["reasoning_content"] = block.reasoning
            stats["exact"] += 1
            out.append(m)
        return out, stats

    def map_for_text(self, text: str) -> dict[str, bytes]:
        """id -> block bytes for every remembered block that occurs in ``text`` (what a session
        file of that text should carry)."""
        out: dict[str, bytes] = {}
        with self._lock:
            for dsml in _blocks_in(text):
                for ident in self._by_dsml.get(dsml, ()):
                    out[ident] = dsml.encode("utf-8")
        return out

    def learn_from_text(self, tool_map: dict[str, bytes], text: str) -> int:
        """Take the entries of a session file's tool map back in, with each block's reasoning
        read from the file's text. Returns how many ids were learnt."""
        n = 0
        for ident, raw in tool_map.items():
            try:
                dsml = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            at = text.find("\n\n" + dsml)
            calls = calls_of_block(dsml) if at >= 0 else None
            if calls is None:
                continue
            self.remember([ident], SampledBlock(dsml, reasoning_before(text, at), calls))
            n += 1
        return n

    def load(self, store: "SessionStore") -> int:
        """Learn the tool maps of every session file in ``store`` (at start-up)."""
        n = 0
        for tool_map, text in store.tool_maps():
            n += self.learn_from_text(tool_map, text)
        return n


def reasoning_before(text: str, at: int) -> str | None:
    """The reasoning of the assistant turn whose content runs up to ``at``: the text between
    that turn's ``<｜Assistant｜><think>`` and its ``</think>``; None when the turn has none."""
    close = text.rfind(THINK_CLOSE, 0, at)
    start = text.rfind(ASSISTANT, 0, at)
    if close < 0 or start < 0 or close < start or EOS in text[start:at]:
        return None
    head = start + len(ASSISTANT)
    if not text.startswith(THINK_OPEN, head):
        return None
    return text[head + len(THINK_OPEN) : close]


def _blocks_in(text: str) -> list[str]:
    out, pos = [], 0
    while True:
        a = text.find(BLOCK_OPEN, pos)
        if a < 0:
            return out
        b = text.find(BLOCK_CLOSE, a)
        if b < 0:
            return out
        out.append(text[a : b + len(BLOCK_CLOSE)])
        pos = b + len(BLOCK_CLOSE)
