"""A small, fully valid deepseek4 file for fast robustness tests.

The demo model carries the real 129 280-token vocabulary (several MB of header, a second to
parse and tokenise); tests that damage a header hundreds of times need something cheaper. This
file has the demo's tiny dimensions, a byte-level vocabulary of 256 byte symbols, a few merges
and the seven special tokens, and its tensor data is a sparse hole: the header is a few KB, and
``ds4 inspect`` and ``Engine.open`` both accept it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from gguf.constants import GGMLQuantizationType as Q

from ds4agent.modelfile.config import ModelConfig, expected_tensors
from ds4agent.modelfile.demo import Vocab, _metadata, tiny_config
from ds4agent.modelfile.gguf import write_gguf
from ds4agent.modelfile.tokenizer import REQUIRED_SPECIALS, _byte_decoder

# Each merge's halves and result are in the vocabulary ("Ġ" is the byte symbol of a space). The
# letter pairs make a good share of the vocabulary merge-related, so that fuzzing its strings
# often reaches the tokenizer's own checks.
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
MERGES += [f"{a} {b}" for a in "abcfgijm" for b in "abcfgijm"]


def small_vocab() -> Vocab:
    tokens = list(REQUIRED_SPECIALS.values())
    tokens += [chr(cp) for cp in sorted(_byte_decoder())]
    for m in MERGES:
        left, right = m.split(" ")
        tokens.append(left + right)
    types = [3] * len(REQUIRED_SPECIALS) + [1] * (len(tokens) - len(REQUIRED_SPECIALS))
    return Vocab(tokens, types, list(MERGES))


def small_config() -> ModelConfig:
    return replace(tiny_config(), n_vocab=len(small_vocab().tokens), name="small test model")


def small_metadata(cfg: ModelConfig | None = None, vocab: Vocab | None = None) -> dict:
    return _metadata(cfg or small_config(), vocab or small_vocab(), "tiny", 0)


def write_small(path: Path, meta_edit: Callable[[dict], None] | None = None, cfg: ModelConfig | None = None,
                vocab: Vocab | None = None) -> Path:
    """Write the small model (header only, tensor data a hole); ``meta_edit`` may alter the
    metadata dict ({key: (ValueType, value)}) before it is written."""
    cfg = cfg or small_config()
    meta = small_metadata(cfg, vocab)
    if meta_edit:
        meta_edit(meta)
    tensors = []
    for name, spec in expected_tensors(cfg).items():
        if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            qtype = Q.IQ2_XXS
        elif name.endswith("ffn_down_exps.weight"):
            qtype = Q.Q2_K
        else:
            (qtype,) = spec.types
        tensors.append((name, int(qtype), spec.dims, None))
    write_gguf(path, meta, tensors)
    return Path(path)
