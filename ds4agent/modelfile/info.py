"""What a GGUF file is, without loading weights: shape, quant mix, vocabulary, layout checks.

Backs `ds4 inspect` and `Engine.info`. Reads only the header (the mmap is never touched past
the tensor directory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .config import ModelConfig, check_tensors, claims_flash, config_from_gguf, validate_flash
from .gguf import GGUFFile, TensorInfo
from .tokenizer import Tokenizer


@dataclass
class QuantRow:
    type_name: str
    tensors: int
    nbytes: int


@dataclass
class ModelReport:
    path: str
    file_size: int
    config: ModelConfig
    tensors: list[TensorInfo]
    quant_mix: list[QuantRow]
    vocab_size: int
    n_merges: int
    n_added: int
    special_ids: dict[str, int]
    claims_flash: bool
    problems: list[str] = field(default_factory=list)  # layout errors or differences from Flash

    @property
    def is_flash(self) -> bool:
        return self.claims_flash and not self.problems

    @property
    def usable(self) -> bool:
        """False when the file cannot be run: a broken layout, or a Flash claim that fails."""
        return not self.problems


def describe(path: str | os.PathLike[str]) -> ModelReport:
    with GGUFFile(path) as f:
        cfg = config_from_gguf(f)
        tok = Tokenizer.from_gguf(f)
        flash = claims_flash(cfg)
        problems = validate_flash(f, cfg) if flash else check_tensors(f, cfg)
        if tok.vocab_size != cfg.n_vocab:
            problems.append(f"tokenizer.ggml.tokens has {tok.vocab_size} entries but vocab_size is {cfg.n_vocab}")
        mix: dict[str, QuantRow] = {}
        for t in f.tensors.values():
            row = mix.setdefault(t.type_name, QuantRow(t.type_name, 0, 0))
            row.tensors += 1
            row.nbytes += t.nbytes
        return ModelReport(
            path=f.path,
            file_size=f.file_size,
            config=cfg,
            tensors=list(f.tensors.values()),
            quant_mix=sorted(mix.values(), key=lambda r: -r.nbytes),
            vocab_size=tok.vocab_size,
            n_merges=len(f.metadata.get("tokenizer.ggml.merges", [])),
            n_added=len(tok.added_ids),
            special_ids=dict(tok.special),
            claims_flash=flash,
            problems=problems,
        )
