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


def kernel_report(path: str | os.PathLike[str], backend: str = "auto", kernels: str | None = None) -> list[str]:
    """`ds4 inspect --kernels`: open the model with these kernels and print their self-check
    (kernels/check.py): each probe case, its result, its error against the reference on the
    same device, its time. The metal/cuda kernels were checked when the engine opened (the
    report shown is that check, refusals included) unless DS4_KERNEL_CHECK=0; any other set
    (cpu, cpu-exact) is checked now. Loads the weights the probes touch."""
    from .engine import Engine
    from .kernels.check import self_check
    from .kernels.reference import ReferenceKernels

    with Engine.open(path, backend=backend, kernels=kernels) as e:
        info, k = e.info, e._model.k
        lines = []
        if info.kernel_note:
            lines.append(f"              note: {info.kernel_note}")
        if info.kernels == "reference":
            return [f"kernels       reference on {info.backend}: the definition the others are checked against; "
                    "nothing to check"] + lines
        report = info.kernel_check
        when = "at open"
        if report is None:
            report = self_check(k, ReferenceKernels(e._model.w), e._model.w)
            when = "now"
        refused = report.refused
        lines.insert(0, f"kernels       {info.kernels} on {info.backend}: self-check {when} against the MLX reference on "
                        f"the same device, {len(report.results)} cases in {report.seconds:.2f} s, "
                        + (f"{len(refused)} operations refused (the reference runs them)" if refused else "nothing refused"))
        if report.inherited:
            lines.append("              the reference's own (not checked): " + ", ".join(report.inherited))
        w = max([len(r.case) for r in report.results] + [4]) + 2
        lines.append(f"              {'operation':<14}{'case':<{w}}{'result':<8}{'rel. error':>11}{'time':>11}")
        for r in report.results:
            err = f"{r.err:.1e}" if r.err is not None else "-"
            lines.append(f"              {r.op:<14}{r.case:<{w}}{'ok' if r.ok else 'REFUSED':<8}{err:>11}"
                         f"{r.seconds * 1e3:>8.1f} ms")
            if r.why:
                lines.append(f"              {'':<14}  {r.why}")
        return lines
