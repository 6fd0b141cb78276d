"""DeepSeek V4 tokenizer built from GGUF metadata (byte-level BPE on HF `tokenizers`).

Two entry points, because the chat layer needs both (docs/protocol.md §1.2):
* ``encode(text)``: plain text. Control strings such as ``<｜User｜>`` typed by a user stay
  ordinary text and are BPE'd, so user input can never forge a turn marker.
* ``encode_rendered(text)``: text produced by our chat renderer. Every added token of the
  official vocabulary (BOS, EOS, turn markers, ``<think>``, ``｜DSML｜``, ...) becomes its single
  id, found leftmost-longest exactly as the official ``tokenizer.json`` does.

Which ids are "added" is derived from the vocabulary itself rather than from
``tokenizer.ggml.token_type`` (ds4 does not read that key, so files may not carry it reliably):
byte-level BPE can only produce single byte-symbols and the results of merges, so any other
string in the table is an added token. On the official vocabulary this yields exactly the
1 283 added tokens of ``tokenizer.json`` (checked in tests/test_tokenizer.py).
"""

from __future__ import annotations

import codecs
import os
import re
from functools import cached_property
from typing import Iterable, Sequence

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .gguf import GGUFError, GGUFFile, ValueType
from .specials import ASSISTANT, BOS, DSML, EOS, REQUIRED_SPECIALS, THINK_CLOSE, THINK_OPEN, USER  # noqa: F401


def _joyai_pretokenizer() -> pre_tokenizers.PreTokenizer:
    """The "joyai-llm" split (docs/model.md §1.2), as three isolating passes then byte mapping.

    This must reproduce the official tokenizer's piece boundaries exactly, because merges never
    cross a piece boundary. Two details the spec's prose gets wrong and the official file settles:
    digits are any Unicode number (\\p{N}, so "²" or Arabic-Indic digits group too), and the
    "letters" rule takes combining marks (\\p{M}) along with letters.
    """
    cjk_kana = f"[{chr(0x4E00)}-{chr(0x9FA5)}{chr(0x3040)}-{chr(0x309F)}{chr(0x30A0)}-{chr(0x30FF)}]+"
    ascii_punct = r"[!-/:-@\[-`{-~]"  # the 32 ASCII punctuation/symbol characters
    words = "|".join([
        ascii_punct + r"[A-Za-z]+",  # ".foo", "_bar": one symbol glued to ASCII letters
        r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+",  # a word with at most one leading non-letter
        r" ?[\p{P}\p{S}]+[\r\n]*",  # punctuation run, optional leading space, trailing newlines
        r"\s*[\r\n]+",  # whitespace through the last newline
        r"\s+(?!\S)",  # spaces not followed by text: the last one joins the next word
        r"\s+",
    ])
    isolate = lambda rx: pre_tokenizers.Split(Regex(rx), behavior="isolated")  # noqa: E731
    return pre_tokenizers.Sequence([
        isolate(r"\p{N}{1,3}"),
        isolate(cjk_kana),
        isolate(words),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _byte_decoder() -> dict[int, int]:
    """GPT-2 printable code point -> byte (the inverse of the byte-level alphabet)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = b
        else:
            table[0x100 + extra] = b
            extra += 1
    return table


class Tokenizer:
    def __init__(self, tokens: Sequence[str], merges: Sequence[str], source: str = "<memory>") -> None:
        self.source = source
        self.tokens = list(tokens)
        self.vocab_size = len(self.tokens)
        self._id = {s: i for i, s in enumerate(self.tokens)}
        if len(self._id) != self.vocab_size:
            raise GGUFError(f"{source}: tokenizer.ggml.tokens contains duplicate strings")
        pairs = []
        vocab = self._id
        for rank, m in enumerate(merges):
            left, sep, right = m.partition(" ")
            if not sep or not left or not right:
                raise GGUFError(f"{source}: tokenizer.ggml.merges entry {rank} is not 'left right': {m!r}")
            # A merge's halves and its result must all be tokens. Checked here because the
            # tokenizers library reports a violation as a bare Exception or, for a missing
            # result, as a Rust panic that also prints a backtrace on stderr.
            for piece in (left, right, left + right):
                if piece not in vocab:
                    raise GGUFError(f"{source}: damaged vocabulary: tokenizer.ggml.merges entry {rank} ({m!r}): "
                                    f"{piece!r} is not in tokenizer.ggml.tokens")
            pairs.append((left, right))
        try:
            bpe = models.BPE(self._id, pairs, fuse_unk=False, byte_fallback=False)
            self._hf = HFTokenizer(bpe)
            self._hf.pre_tokenizer = _joyai_pretokenizer()
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as e:
            # Anything else the library refuses is still a damaged vocabulary. BaseException,
            # because a Rust panic arrives as pyo3's PanicException, which is not an Exception.
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise GGUFError(f"{source}: damaged vocabulary: the tokenizer library rejects it ({why})") from None

        byte_syms = {chr(c) for c in _byte_decoder()}
        produced = {a + b for a, b in pairs}
        self.added_ids = frozenset(
            i for i, s in enumerate(self.tokens) if not (s in produced or (len(s) == 1 and s in byte_syms))
        )
        self.special: dict[str, int] = {}
        for role, text in REQUIRED_SPECIALS.items():
            if text not in self._id:
                raise GGUFError(f"{source}: vocabulary lacks the special token {text}")
            self.special[role] = self._id[text]
        self.bos_id = self.special["bos"]
        self.eos_id = self.special["eos"]
        added = sorted((self.tokens[i] for i in self.added_ids), key=len, reverse=True)
        # Longest first so the alternation is leftmost-longest, like the official matcher.
        self._added_re = re.compile("|".join(re.escape(s) for s in added))
        self._to_latin1 = str.maketrans({chr(cp): chr(b) for cp, b in _byte_decoder().items()})

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str] | GGUFFile) -> "Tokenizer":
        f = path if isinstance(path, GGUFFile) else GGUFFile(path)
        try:
            tokens = f.metadata.get("tokenizer.ggml.tokens")
            merges = f.metadata.get("tokenizer.ggml.merges")
            if not isinstance(tokens, list) or not tokens:
                raise GGUFError(f"{f.path}: missing required metadata key tokenizer.ggml.tokens")
            if not isinstance(merges, list):
                raise GGUFError(f"{f.path}: missing required metadata key tokenizer.ggml.merges")
            for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
                # A damaged type byte turns the strings into numbers, which nothing below expects.
                sub = f.value_types[key][1]  # both are lists here, so arrays
                if sub != ValueType.STRING:
                    raise GGUFError(f"{f.path}: {key} must be an array of strings, "
                                    f"found an array of {ValueType(sub).name}")
            model = f.metadata.get("tokenizer.ggml.model", "gpt2")
            if model != "gpt2":
                raise GGUFError(f"{f.path}: tokenizer.ggml.model is {model!r}; "
                                "DeepSeek V4 uses byte-level BPE ('gpt2')")
            return cls(tokens, merges, source=f.path)
        finally:
            if f is not path:
                f.close()

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Plain text -> ids; control strings inside ``text`` are ordinary text."""
        if not text:
            return []
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_rendered(self, text: str) -> list[int]:
        """Rendered chat text -> ids; every added-token string becomes its single id."""
        ids: list[int] = []
        pos = 0
        pieces: list[str] = []
        marks: list[int] = []
        for m in self._added_re.finditer(text):
            pieces.append(text[pos : m.start()])
            marks.append(self._id[m.group()])
            pos = m.end()
        pieces.append(text[pos:])
        encoded = self._hf.encode_batch([p for p in pieces if p], add_special_tokens=False)
        it = iter(encoded)
        for i, piece in enumerate(pieces):
            if piece:
                ids.extend(next(it).ids)
            if i < len(marks):
                ids.append(marks[i])
        return ids

    def contains_added(self, text: str) -> bool:
        """Whether ``text`` holds the string of any control/added token."""
        return self._added_re.search(text) is not None

    # -- decoding -----------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """Exact bytes of one token: added tokens literally, others through the byte table."""
        return self._bytes_table[token_id]

    @cached_property
    def _bytes_table(self) -> list[bytes]:
        added = self.added_ids
        return [
            s.encode("utf-8") if i in added else s.translate(self._to_latin1).encode("latin-1")
            for i, s in enumerate(self.tokens)
        ]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self._bytes_table
        return b"".join(table[i] for i in ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary spelling (e.g. 'Ġ' for a leading space), for --dump-tokens."""
        return self.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        return self._id.get(text)

    def stream(self) -> "StreamDecoder":
        return StreamDecoder(self)


class StreamDecoder:
    """Incremental detokenizer: feed ids as they are sampled, get text that never ends in the
    middle of a UTF-8 sequence (an incomplete tail is held until the next token completes it;
    bytes that can never form a character come out as U+FFFD)."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
