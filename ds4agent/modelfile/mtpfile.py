"""The MTP support file: DeepSeek's multi-token-prediction block in its own GGUF (docs/model.md
§7.1), and the view that lets the engine run it as a model of one layer.

The published file (``DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf``) holds one transformer block
under ``mtp.0.`` (the per-layer tensors of a window-only, top-k-routed layer, with the router's
bias required), the two input projections and norms (``e_proj``/``enorm`` for the token,
``h_proj``/``hnorm`` for the target's hidden streams), and its own hyper-connection collapse
and final norm (``hc_head_*``, ``norm``). It has no embedding and no output head: it shares the
target's. Its metadata is not read; every shape comes from the target's config.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from .config import F16, F32, Q8_0, ModelConfig, TensorSpec, expected_tensors
from .gguf import GGUFError, GGUFFile, TensorInfo, type_name

PREFIX = "mtp.0."

# The one-layer model's names of the block's own head (Model._head reads these) and the MTP
# file's names for them.
HEAD_NAMES = {
    "output_hc_base.weight": PREFIX + "hc_head_base.weight",
    "output_hc_fn.weight": PREFIX + "hc_head_fn.weight",
    "output_hc_scale.weight": PREFIX + "hc_head_scale.weight",
    "output_norm.weight": PREFIX + "norm.weight",
}
SHARED = ("token_embd.weight", "output.weight")  # the target's, read from its file


def mtp_config(c: ModelConfig) -> ModelConfig:
    """The block as a model of one layer: window-only attention (ratio 0: no compressor, no
    indexer, RoPE without YaRN), routed by its router (no hash table), the target's last
    layer's SwiGLU clamp."""
    return replace(c, n_layer=1, compress_ratios=(0,), n_hash_layer=0, swiglu_clamp=(c.swiglu_clamp[-1],),
                   name=f"{c.name} MTP block")


def mtp_tensors(c: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of an MTP file for target config ``c``, by its name in the file."""
    E, hc = c.n_embd, c.hc_count
    fn = frozenset({F16, F32})
    out: dict[str, TensorSpec] = {}
    for name, spec in expected_tensors(mtp_config(c)).items():
        if not name.startswith("blk.0."):
            continue
        short = name[len("blk.0."):]
        if short in ("hc_attn_fn.weight", "hc_ffn_fn.weight", "ffn_gate_inp.weight"):
            spec = replace(spec, types=fn)
        if short == "exp_probs_b.bias":
            spec = replace(spec, optional=False)
        out[PREFIX + short] = spec
    out.update({
        PREFIX + "hc_head_base.weight": TensorSpec((hc,), frozenset({F32})),
        PREFIX + "hc_head_fn.weight": TensorSpec((hc * E, hc), fn),
        PREFIX + "hc_head_scale.weight": TensorSpec((1,), frozenset({F32})),
        PREFIX + "e_proj.weight": TensorSpec((E, E), frozenset({Q8_0})),
        PREFIX + "h_proj.weight": TensorSpec((E, E), frozenset({Q8_0})),
        PREFIX + "enorm.weight": TensorSpec((E,), frozenset({F32})),
        PREFIX + "hnorm.weight": TensorSpec((E,), frozenset({F32})),
        PREFIX + "norm.weight": TensorSpec((E,), frozenset({F32})),
    })
    return out


def check_mtp(f: GGUFFile, c: ModelConfig) -> list[str]:
    """Problems of MTP file ``f`` as the draft block of a target of config ``c`` (empty: sound).
    Tensors of other names are ignored (a file may carry more than the block)."""
    problems = []
    for name, spec in mtp_tensors(c).items():
        t = f.tensors.get(name)
        if t is None:
            problems.append(f"missing tensor {name}")
        elif t.dims != spec.dims:
            problems.append(f"tensor {name} has dims {list(t.dims)}, expected {list(spec.dims)} for this model")
        elif t.type not in spec.types:
            want = "/".join(sorted(type_name(x) for x in spec.types))
            problems.append(f"tensor {name} has type {t.type_name}, expected {want}")
    g, u = f.tensors.get(PREFIX + "ffn_gate_exps.weight"), f.tensors.get(PREFIX + "ffn_up_exps.weight")
    if not problems and g is not None and u is not None and g.type != u.type:
        problems.append(f"expert gate is {g.type_name} but up is {u.type_name} (they must match)")
    return problems


def open_mtp(path: str | os.PathLike[str], c: ModelConfig) -> GGUFFile:
    """The MTP file at ``path``, checked against target config ``c``: ValueError, one line
    naming the file and the first problem, when it cannot draft for this model."""
    try:
        f = GGUFFile(path)
    except (GGUFError, OSError) as e:
        raise ValueError(f"MTP file {path}: {e}") from None
    problems = check_mtp(f, c)
    if problems:
        f.close()
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{path}: not an MTP block for this model: {problems[0]}{more}")
    return f


def mtp_summary(f: GGUFFile) -> list[str] | None:
    """What ``ds4 inspect`` says of an MTP file (None: ``f`` is not one): its block's tensors,
    their types and size, and how it is used; of DSpark's support file (stages mtp.0 .. mtp.2),
    that it is one. Which model it fits is checked when it is used
    (it has no shapes of its own to compare)."""
    if "token_embd.weight" in f.tensors or not any(n.startswith(PREFIX) for n in f.tensors):
        return None
    if any(n.startswith("mtp.1.") for n in f.tensors):  # several stages: DSpark's support file
        return [f"{f.path}: a DSpark support file ({len(f.tensors)} tensors; the 0731 checkpoint's drafter), which "
                "this build does not run (docs/speculation.md)"]
    mine = [t for n, t in f.tensors.items() if n.startswith(PREFIX)]
    mix: dict[str, int] = {}
    for t in mine:
        mix[t.type_name] = mix.get(t.type_name, 0) + t.nbytes
    experts = f.tensors.get(PREFIX + "ffn_gate_exps.weight")

    def size(n: int) -> str:
        return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

    return [f"{f.path}: an MTP support file (DeepSeek's multi-token-prediction block), {len(mine)} tensors, "
            f"{size(sum(mix.values()))}",
            "  types: " + ", ".join(f"{k} {size(v)}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])),
            f"  routed experts: {experts.shape[0] if experts is not None else '?'}, hidden size "
            f"{experts.shape[-1] if experts is not None else '?'}",
            "  use: ds4 chat -m MODEL --mtp FILE (drafts verified by the model: docs/speculation.md)"]


class MtpView:
    """The MTP file and the target's file seen as one model file of one layer: ``blk.0.*`` and
    the head's collapse and norm are the block's tensors, the embedding and the output matrix
    the target's, plus the block's own ``mtp.0.*`` names (its input projections). It offers
    what the kernels read of a model file, so the same kernels run the block over the same
    mapped bytes (nothing is copied; the target's head is not copied twice)."""

    def __init__(self, mtp: GGUFFile, target: GGUFFile) -> None:
        self.mtp, self.target = mtp, target
        self.path = mtp.path
        self._where: dict[str, tuple[GGUFFile, str]] = {}
        for name in mtp.tensors:
            if name.startswith(PREFIX):
                self._where[name] = (mtp, name)
                self._where["blk.0." + name[len(PREFIX):]] = (mtp, name)
        for mine, theirs in HEAD_NAMES.items():
            self._where[mine] = (mtp, theirs)
        for name in SHARED:
            self._where[name] = (target, name)
        self.tensors: dict[str, TensorInfo] = {n: f.tensors[src] for n, (f, src) in self._where.items()
                                               if src in f.tensors}

    def array(self, name: str) -> np.ndarray:
        f, src = self._where[name]
        return f.array(src)

    def raw(self, name: str) -> memoryview:
        f, src = self._where[name]
        return f.raw(src)

    def release_pages(self, name: str) -> None:
        f, src = self._where[name]
        f.release_pages(src)
