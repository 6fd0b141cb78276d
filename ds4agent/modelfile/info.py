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
    def variant(self) -> str:
        """Which published kind of file this is, from its expert types layer by layer, its
        shape and its name (docs/model.md §2.3); and what runs what it holds."""
        return variant_of(self.config, {t.name: t.type_name for t in self.tensors}, os.path.basename(self.path))

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


def _ranges(layers: list[int]) -> str:
    """0, 1, 2, 5 -> "0-2, 5"."""
    out: list[str] = []
    for i in layers:
        if out and int(out[-1].rsplit("-", 1)[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def variant_of(cfg: ModelConfig, types: dict[str, str], name: str) -> str:
    """The variant words of ``ds4 inspect`` (see ModelReport.variant)."""
    per_layer = [(types.get(f"blk.{i}.ffn_gate_exps.weight"), types.get(f"blk.{i}.ffn_down_exps.weight"))
                 for i in range(cfg.n_layer)]
    kinds = {k for k in per_layer}
    if kinds == {("IQ2_XXS", "Q2_K")}:
        words = "q2: 2-bit experts (IQ2_XXS gate/up, Q2_K down)"
    elif kinds == {("Q4_K", "Q4_K")}:
        words = "q4: Q4_K experts"
    elif kinds == {("MXFP4", "MXFP4")}:
        words = ("MXFP4 experts (DeepSeek's own, not requantised); the CPU kernels take them with float "
                 "activations")
    elif kinds <= {("IQ2_XXS", "Q2_K"), ("Q4_K", "Q4_K")}:
        q4 = [i for i, k in enumerate(per_layer) if k == ("Q4_K", "Q4_K")]
        words = f"mixed: Q4_K experts in layers {_ranges(q4)}, 2-bit elsewhere"
    else:
        words = "experts " + ", ".join(sorted(f"{g}/{d}" for g, d in kinds if g and d))
    extra = [w for w, key in (("imatrix", "imatrix"), ("0731 checkpoint", "0731")) if key in name]
    if cfg.n_embd > 4096 or cfg.n_layer > 43:
        extra.append(f"a larger shape than Flash ({cfg.n_layer} layers, hidden {cfg.n_embd}: "
                     "V4 Pro's files are of this kind)")
    return words + "".join(f"; {w}" for w in extra)
