"""ModelConfig from `deepseek4.*` GGUF metadata, the tensor inventory it implies, and the
validator for files that claim to be the published DeepSeek V4 Flash (docs/model.md §1.1, §2).

One code path serves every shape: tiny generated models and the real 43-layer file differ only
in numbers. The real file is additionally checked value by value, type by type, because a
silently wrong constant (a ratio, a RoPE base) produces fluent garbage rather than an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGMLQuantizationType as Q

from .gguf import MAX_ARRAY_ITEMS, GGUFFile, ValueType, type_name

ARCH = "deepseek4"

_INTS = {ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
         ValueType.INT32, ValueType.UINT64, ValueType.INT64}
_FLOATS = _INTS | {ValueType.FLOAT32, ValueType.FLOAT64}


class ConfigError(ValueError):
    """Metadata that cannot describe a DeepSeek V4 model; one line naming file and key."""


@dataclass(frozen=True)
class ModelConfig:
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_head_kv: int
    head_dim: int  # attention.key_length: the shared K=V row width
    value_dim: int
    n_rot: int  # rotated tail dims of each head
    q_lora_rank: int
    o_lora_rank: int
    n_out_group: int
    sliding_window: int
    indexer_n_head: int
    indexer_head_dim: int
    indexer_top_k: int
    compress_ratios: tuple[int, ...]  # exactly n_layer entries (longer arrays are cut)
    compress_rope_base: float
    rms_eps: float
    rope_base: float
    rope_scaling_factor: float
    rope_orig_ctx: int
    yarn_beta_fast: float
    yarn_beta_slow: float
    n_expert: int
    n_expert_used: int
    expert_ff: int
    n_shared_expert: int
    expert_group_count: int
    expert_group_used: int
    expert_weights_scale: float
    expert_weights_norm: bool
    n_hash_layer: int
    swiglu_clamp: tuple[float, ...]  # exactly n_layer entries
    hc_count: int
    hc_sinkhorn_iters: int
    hc_eps: float
    context_length: int | None = None
    name: str = ""

    # -- derived ----------------------------------------------------------------------------
    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def is_hash_layer(self, layer: int) -> bool:
        return layer < self.n_hash_layer

    def compressor_width(self, layer: int) -> int:
        """Columns of a layer's attention compressor: ratio 4 keeps two overlapping lanes."""
        r = self.ratio(layer)
        return 2 * self.head_dim if r == 4 else self.head_dim

    @property
    def hc_mix(self) -> int:
        """Per-sublayer HC projection width: pre(hc) + post(hc) + comb(hc×hc)."""
        return (2 + self.hc_count) * self.hc_count


# key suffix -> (field, kind); kind is "int", "float", "bool" or "u64"
_REQUIRED: list[tuple[str, str, str]] = [
    ("block_count", "n_layer", "int"),
    ("embedding_length", "n_embd", "int"),
    ("vocab_size", "n_vocab", "int"),
    ("attention.head_count", "n_head", "int"),
    ("attention.head_count_kv", "n_head_kv", "int"),
    ("attention.key_length", "head_dim", "int"),
    ("attention.value_length", "value_dim", "int"),
    ("rope.dimension_count", "n_rot", "int"),
    ("attention.q_lora_rank", "q_lora_rank", "int"),
    ("attention.output_lora_rank", "o_lora_rank", "int"),
    ("attention.output_group_count", "n_out_group", "int"),
    ("attention.sliding_window", "sliding_window", "int"),
    ("attention.indexer.head_count", "indexer_n_head", "int"),
    ("attention.indexer.key_length", "indexer_head_dim", "int"),
    ("attention.indexer.top_k", "indexer_top_k", "int"),
    ("attention.compress_rope_freq_base", "compress_rope_base", "float"),
    ("attention.layer_norm_rms_epsilon", "rms_eps", "float"),
    ("rope.freq_base", "rope_base", "float"),
    ("rope.scaling.factor", "rope_scaling_factor", "float"),
    ("rope.scaling.original_context_length", "rope_orig_ctx", "u64"),
    ("rope.scaling.yarn_beta_fast", "yarn_beta_fast", "float"),
    ("rope.scaling.yarn_beta_slow", "yarn_beta_slow", "float"),
    ("expert_count", "n_expert", "int"),
    ("expert_used_count", "n_expert_used", "int"),
    ("expert_feed_forward_length", "expert_ff", "int"),
    ("expert_shared_count", "n_shared_expert", "int"),
    ("expert_weights_scale", "expert_weights_scale", "float"),
    ("expert_weights_norm", "expert_weights_norm", "bool"),
    ("hash_layer_count", "n_hash_layer", "int"),
    ("hyper_connection.count", "hc_count", "int"),
    ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters", "int"),
    ("hyper_connection.epsilon", "hc_eps", "float"),
]
_OPTIONAL_INT = [("expert_group_count", "expert_group_count"), ("expert_group_used_count", "expert_group_used")]

# The accepted range of every number the model computes with (published values in comments).
# The model takes logs of, divides by, loops over or allocates by these, so a zero, negative,
# NaN, infinite or absurd value must fail here, naming its key, rather than as a
# ZeroDivisionError or math domain error while building RoPE tables, as NaN logits, or as a loop
# or allocation sized by garbage. The bounds are generous sanity limits, not the Flash values
# (validate_flash checks those); relations between keys are in _check_consistency.
# Integers: key suffix -> (lowest, highest), inclusive.
_INT_RANGES: dict[str, tuple[int, int]] = {
    "block_count": (1, 1024),  # 43; every layer is a loop iteration and a set of tensors
    "embedding_length": (1, 1 << 20),  # 4096
    "vocab_size": (1, MAX_ARRAY_ITEMS),  # 129280; the vocabulary is one metadata array
    "attention.head_count": (1, 4096),  # 64
    "attention.head_count_kv": (1, 4096),  # 1
    "attention.key_length": (1, 1 << 16),  # 512
    "attention.value_length": (1, 1 << 16),  # 512
    "rope.dimension_count": (1, 1 << 16),  # 64; the RoPE exponents divide by it
    "attention.q_lora_rank": (1, 1 << 20),  # 1024
    "attention.output_lora_rank": (1, 1 << 20),  # 1024
    "attention.output_group_count": (1, 4096),  # 8; head_count is divided by it
    "attention.sliding_window": (1, 1 << 20),  # 128
    "attention.indexer.head_count": (1, 4096),  # 64
    "attention.indexer.key_length": (1, 1 << 16),  # 128
    "attention.indexer.top_k": (1, 1 << 20),  # 512
    "rope.scaling.original_context_length": (1, 1 << 40),  # 65536; YaRN takes its log
    "expert_count": (1, 1 << 16),  # 256
    "expert_used_count": (1, 1 << 16),  # 6
    "expert_feed_forward_length": (1, 1 << 20),  # 2048
    "expert_shared_count": (1, 64),  # 1
    "expert_group_count": (0, 1 << 16),  # 0 / absent
    "expert_group_used_count": (0, 1 << 16),  # 0 / absent
    "hash_layer_count": (0, 1024),  # 3
    "hyper_connection.count": (1, 64),  # 4
    "hyper_connection.sinkhorn_iterations": (1, 1000),  # 20; iterations run per sublayer per token
}
# Floats: key suffix -> (lowest, highest, lowest excluded), always finite.
_FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "attention.compress_rope_freq_base": (1.0, 1e12, True),  # 160000; YaRN divides by log(base)
    "rope.freq_base": (1.0, 1e12, True),  # 10000; at 1 every pair would turn at one frequency
    "rope.scaling.factor": (1.0, 1024.0, False),  # 16; YaRN divides by it (1 = no scaling)
    "rope.scaling.yarn_beta_fast": (0.0, 1e6, True),  # 32; YaRN takes log(ctx / (2π β))
    "rope.scaling.yarn_beta_slow": (0.0, 1e6, True),  # 1
    "attention.layer_norm_rms_epsilon": (0.0, 0.1, True),  # 1e-6; guards a division by the RMS
    "hyper_connection.epsilon": (0.0, 0.1, True),  # 1e-6; guards Sinkhorn's divisions
    "expert_weights_scale": (0.0, 1000.0, True),  # 1.5; 0 would switch the routed experts off
}
# Each layer's SwiGLU clamp (10.0): a positive, finite bound.
_CLAMP_RANGE = (0.0, 1e6, True)


def _float_range_text(lo: float, hi: float, lo_open: bool) -> str:
    return f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"


def _in_float_range(x: float, lo: float, hi: float, lo_open: bool) -> bool:
    return math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi


def _check_ranges(f: GGUFFile, values: dict[str, Any]) -> None:
    """Refuse any scalar outside its sane range: one line naming key, range and value."""
    fields = {suffix: field for suffix, field, _ in _REQUIRED} | dict(_OPTIONAL_INT)
    for suffix, (lo, hi) in _INT_RANGES.items():
        v = values[fields[suffix]]
        if not lo <= v <= hi:
            raise ConfigError(f"{f.path}: metadata key {ARCH}.{suffix} must be an integer in {lo}..{hi}, found {v}")
    for suffix, (lo, hi, lo_open) in _FLOAT_RANGES.items():
        v = values[fields[suffix]]
        if not _in_float_range(v, lo, hi, lo_open):
            raise ConfigError(f"{f.path}: metadata key {ARCH}.{suffix} must be "
                              f"{_float_range_text(lo, hi, lo_open)}, found {v!r}")


def _scalar(f: GGUFFile, key: str, kind: str) -> Any:
    if key not in f.metadata:
        raise ConfigError(f"{f.path}: missing required metadata key {key}")
    vtype, _ = f.value_types[key]
    value = f.metadata[key]
    ok = {"int": _INTS, "u64": _INTS, "float": _FLOATS, "bool": {ValueType.BOOL}}[kind]
    if vtype not in ok:
        raise ConfigError(f"{f.path}: metadata key {key} has type {ValueType(vtype).name}, expected {kind}")
    if kind == "bool":
        return bool(value)
    if kind == "float":
        return float(value)
    return int(value)


def _per_layer(f: GGUFFile, key: str, n_layer: int, kinds: set[int]) -> list[Any]:
    if key not in f.metadata:
        raise ConfigError(f"{f.path}: missing required metadata key {key}")
    vtype, sub = f.value_types[key]
    if vtype != ValueType.ARRAY or sub not in kinds:
        raise ConfigError(f"{f.path}: metadata key {key} must be a numeric array")
    values = f.metadata[key]
    if len(values) < n_layer:
        raise ConfigError(f"{f.path}: metadata key {key} has {len(values)} entries, "
                          f"need at least {n_layer} (one per layer)")
    # Longer arrays occur (entries for MTP layers); only the first n_layer describe this model.
    return list(values[:n_layer])


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """Build the config of any-shaped deepseek4 file; raise ConfigError naming the bad key."""
    arch = f.metadata.get("general.architecture")
    if arch is None:
        raise ConfigError(f"{f.path}: missing required metadata key general.architecture")
    if arch != ARCH:
        raise ConfigError(f"{f.path}: general.architecture is {arch!r}, not {ARCH!r}; "
                          "ds4agent runs DeepSeek V4 Flash only")
    values: dict[str, Any] = {}
    for suffix, field, kind in _REQUIRED:
        values[field] = _scalar(f, f"{ARCH}.{suffix}", kind)
    for suffix, field in _OPTIONAL_INT:
        key = f"{ARCH}.{suffix}"
        values[field] = _scalar(f, key, "int") if key in f.metadata else 0
    # Before the per-layer arrays: their expected length is block_count.
    _check_ranges(f, values)
    n = values["n_layer"]
    ratios = _per_layer(f, f"{ARCH}.attention.compress_ratios", n, _INTS)
    for i, r in enumerate(ratios):
        if r not in (0, 4, 128):
            raise ConfigError(f"{f.path}: metadata key {ARCH}.attention.compress_ratios: "
                              f"layer {i} has ratio {r} (0, 4 or 128 expected)")
    values["compress_ratios"] = tuple(int(r) for r in ratios)
    clamps = tuple(float(x) for x in _per_layer(f, f"{ARCH}.swiglu_clamp_exp", n, _FLOATS))
    for i, x in enumerate(clamps):
        if not _in_float_range(x, *_CLAMP_RANGE):
            raise ConfigError(f"{f.path}: metadata key {ARCH}.swiglu_clamp_exp: layer {i} must be "
                              f"{_float_range_text(*_CLAMP_RANGE)}, found {x!r}")
    values["swiglu_clamp"] = clamps
    # Informational only (nothing computes with it), so a value of another type is ignored
    # rather than refused.
    ctx_key = f"{ARCH}.context_length"
    ctx_ok = ctx_key in f.metadata and f.value_types[ctx_key][0] in _INTS
    values["context_length"] = int(f.metadata[ctx_key]) if ctx_ok else None
    values["name"] = str(f.metadata.get("general.name", ""))
    cfg = ModelConfig(**values)
    _check_consistency(f, cfg)
    return cfg


def _check_consistency(f: GGUFFile, c: ModelConfig) -> None:
    """Relations every V4 shape must satisfy, so later shape errors cannot happen mid-forward."""
    def need(cond: bool, key: str, why: str) -> None:
        if not cond:
            raise ConfigError(f"{f.path}: metadata key {ARCH}.{key}: {why}")

    need(c.n_head_kv == 1, "attention.head_count_kv", f"must be 1 (one shared latent KV head), found {c.n_head_kv}")
    need(c.value_dim == c.head_dim, "attention.value_length",
         f"must equal key_length {c.head_dim} (K = V), found {c.value_dim}")
    need(0 < c.n_rot <= c.head_dim and c.n_rot % 2 == 0, "rope.dimension_count",
         f"must be even and at most key_length, found {c.n_rot}")
    need(c.n_out_group > 0 and c.n_head % c.n_out_group == 0, "attention.output_group_count",
         f"must divide head_count {c.n_head}, found {c.n_out_group}")
    need(0 < c.n_expert_used <= c.n_expert, "expert_used_count", f"must be in 1..{c.n_expert}, found {c.n_expert_used}")
    need(c.n_shared_expert == 1, "expert_shared_count", f"must be 1, found {c.n_shared_expert}")
    need(0 <= c.n_hash_layer <= c.n_layer, "hash_layer_count", f"must be in 0..{c.n_layer}, found {c.n_hash_layer}")
    need(c.hc_count > 0, "hyper_connection.count", f"must be positive, found {c.hc_count}")
    need(c.sliding_window > 0, "attention.sliding_window", f"must be positive, found {c.sliding_window}")
    if 4 in c.compress_ratios:
        d = c.indexer_head_dim
        need(d > 0 and d & (d - 1) == 0, "attention.indexer.key_length",
             f"must be a power of two (Hadamard transform), found {d}")
        need(c.indexer_top_k > 0, "attention.indexer.top_k", f"must be positive, found {c.indexer_top_k}")


# -- tensor inventory ---------------------------------------------------------------------------

F32, F16, Q8_0, Q2_K, Q4_K, IQ2_XXS, I32, MXFP4 = Q.F32, Q.F16, Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.I32, Q.MXFP4
# Routed experts: the q2 files' IQ2_XXS/Q2_K, the q4 files' Q4_K (in every layer or some), the
# 0731 MXFP4 file's MXFP4 (DeepSeek's own experts, repacked without requantising).
EXPERT_GATE_UP_TYPES = frozenset({IQ2_XXS, Q4_K, MXFP4})
EXPERT_DOWN_TYPES = frozenset({Q2_K, Q4_K, MXFP4})


@dataclass(frozen=True)
class TensorSpec:
    dims: tuple[int, ...]  # GGUF order, fastest first
    types: frozenset[int]
    optional: bool = False


def expected_tensors(c: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor a file of this shape holds (docs/model.md §2), in file order."""
    E, hc, mix = c.n_embd, c.hc_count, c.hc_mix
    one = lambda t: frozenset({t})  # noqa: E731
    out: dict[str, TensorSpec] = {
        "token_embd.weight": TensorSpec((E, c.n_vocab), one(F16)),
        "output_hc_base.weight": TensorSpec((hc,), one(F32)),
        "output_hc_fn.weight": TensorSpec((hc * E, hc), one(F16)),
        "output_hc_scale.weight": TensorSpec((1,), one(F32)),
        "output_norm.weight": TensorSpec((E,), one(F32)),
        "output.weight": TensorSpec((E, c.n_vocab), one(Q8_0)),
    }
    heads_per_group = c.n_head // c.n_out_group
    for i in range(c.n_layer):
        p = f"blk.{i}."
        t = {
            "hc_attn_fn.weight": TensorSpec((hc * E, mix), one(F16)),
            "hc_attn_scale.weight": TensorSpec((3,), one(F32)),
            "hc_attn_base.weight": TensorSpec((mix,), one(F32)),
            "attn_norm.weight": TensorSpec((E,), one(F32)),
            "attn_q_a.weight": TensorSpec((E, c.q_lora_rank), one(Q8_0)),
            "attn_q_a_norm.weight": TensorSpec((c.q_lora_rank,), one(F32)),
            "attn_q_b.weight": TensorSpec((c.q_lora_rank, c.n_head * c.head_dim), one(Q8_0)),
            "attn_kv.weight": TensorSpec((E, c.head_dim), one(Q8_0)),
            "attn_kv_a_norm.weight": TensorSpec((c.head_dim,), one(F32)),
            "attn_sinks.weight": TensorSpec((c.n_head,), one(F32)),
            "attn_output_a.weight": TensorSpec((heads_per_group * c.head_dim, c.n_out_group * c.o_lora_rank),
                                               one(Q8_0)),
            "attn_output_b.weight": TensorSpec((c.n_out_group * c.o_lora_rank, E), one(Q8_0)),
        }
        r = c.ratio(i)
        if r:
            W = c.compressor_width(i)
            t.update({
                "attn_compressor_ape.weight": TensorSpec((W, r), one(F16)),
                "attn_compressor_kv.weight": TensorSpec((E, W), one(F16)),
                "attn_compressor_gate.weight": TensorSpec((E, W), one(F16)),
                "attn_compressor_norm.weight": TensorSpec((c.head_dim,), one(F32)),
            })
        if r == 4:
            Wi = 2 * c.indexer_head_dim
            t.update({
                "indexer.attn_q_b.weight": TensorSpec((c.q_lora_rank, c.indexer_n_head * c.indexer_head_dim), one(F16)),
                "indexer.proj.weight": TensorSpec((E, c.indexer_n_head), one(F16)),
                "indexer_compressor_ape.weight": TensorSpec((Wi, 4), one(F16)),
                "indexer_compressor_kv.weight": TensorSpec((E, Wi), one(F16)),
                "indexer_compressor_gate.weight": TensorSpec((E, Wi), one(F16)),
                "indexer_compressor_norm.weight": TensorSpec((c.indexer_head_dim,), one(F32)),
            })
        t.update({
            "hc_ffn_fn.weight": TensorSpec((hc * E, mix), one(F16)),
            "hc_ffn_scale.weight": TensorSpec((3,), one(F32)),
            "hc_ffn_base.weight": TensorSpec((mix,), one(F32)),
            "ffn_norm.weight": TensorSpec((E,), one(F32)),
            "ffn_gate_inp.weight": TensorSpec((E, c.n_expert), one(F16)),
        })
        if c.is_hash_layer(i):
            t["ffn_gate_tid2eid.weight"] = TensorSpec((c.n_expert_used, c.n_vocab), one(I32))
        else:
            # ds4 treats the selection bias as optional; the published files have it.
            t["exp_probs_b.bias"] = TensorSpec((c.n_expert,), one(F32), optional=True)
        t.update({
            "ffn_gate_exps.weight": TensorSpec((E, c.expert_ff, c.n_expert), EXPERT_GATE_UP_TYPES),
            "ffn_up_exps.weight": TensorSpec((E, c.expert_ff, c.n_expert), EXPERT_GATE_UP_TYPES),
            "ffn_down_exps.weight": TensorSpec((c.expert_ff, E, c.n_expert), EXPERT_DOWN_TYPES),
            "ffn_gate_shexp.weight": TensorSpec((E, c.expert_ff), one(Q8_0)),
            "ffn_up_shexp.weight": TensorSpec((E, c.expert_ff), one(Q8_0)),
            "ffn_down_shexp.weight": TensorSpec((c.expert_ff, E), one(Q8_0)),
        })
        out.update({p + k: v for k, v in t.items()})
    return out


def check_tensors(f: GGUFFile, c: ModelConfig) -> list[str]:
    """Problems with the tensor directory for this config (empty list: the layout is sound)."""
    problems = []
    expected = expected_tensors(c)
    for name, spec in expected.items():
        t = f.tensors.get(name)
        if t is None:
            if not spec.optional:
                problems.append(f"missing tensor {name}")
            continue
        if t.dims != spec.dims:
            problems.append(f"tensor {name} has dims {list(t.dims)}, expected {list(spec.dims)}")
        if t.type not in spec.types:
            want = "/".join(sorted(type_name(x) for x in spec.types))
            problems.append(f"tensor {name} has type {t.type_name}, expected {want}")
    for i in range(c.n_layer):
        g, u = f.tensors.get(f"blk.{i}.ffn_gate_exps.weight"), f.tensors.get(f"blk.{i}.ffn_up_exps.weight")
        if g and u and g.type != u.type:
            problems.append(f"blk.{i}: expert gate is {g.type_name} but up is {u.type_name} (they must match)")
    for name in f.tensors:
        if name not in expected:
            problems.append(f"unexpected tensor {name}")
    return problems


# -- the published Flash shape ------------------------------------------------------------------

FLASH_LAYERS = 43


def flash_ratios(n_layer: int = FLASH_LAYERS) -> list[int]:
    """Layer pattern of V4 Flash: two window-only layers, then ratio 4 on even, 128 on odd."""
    return [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(n_layer)]


# The published model (docs/model.md §1.1); the validator compares a file against these values.
FLASH = ModelConfig(
    n_layer=43, n_embd=4096, n_vocab=129280, n_head=64, n_head_kv=1, head_dim=512, value_dim=512,
    n_rot=64, q_lora_rank=1024, o_lora_rank=1024, n_out_group=8, sliding_window=128,
    indexer_n_head=64, indexer_head_dim=128, indexer_top_k=512,
    compress_ratios=tuple(flash_ratios()), compress_rope_base=160000.0, rms_eps=1e-6,
    rope_base=10000.0, rope_scaling_factor=16.0, rope_orig_ctx=65536, yarn_beta_fast=32.0,
    yarn_beta_slow=1.0, n_expert=256, n_expert_used=6, expert_ff=2048, n_shared_expert=1,
    expert_group_count=0, expert_group_used=0, expert_weights_scale=1.5, expert_weights_norm=True,
    n_hash_layer=3, swiglu_clamp=(10.0,) * 43, hc_count=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    name="DeepSeek V4 Flash",
)
FLASH_VALUES: dict[str, Any] = {suffix: getattr(FLASH, field) for suffix, field, _ in _REQUIRED}
# ds4 reads integer keys as UINT32 exactly; the YaRN context may also be UINT64.
_U32_ONLY = {suffix for suffix, _, kind in _REQUIRED if kind == "int"}


def claims_flash(c: ModelConfig) -> bool:
    """A file with the published hidden size and layer count claims to be the real model and is
    checked value by value. Shape models (real dimensions, fewer layers or experts, for
    benchmarks) are checked for internal consistency only."""
    return c.n_embd == FLASH_VALUES["embedding_length"] and c.n_layer == FLASH_VALUES["block_count"]


def validate_flash(f: GGUFFile, c: ModelConfig) -> list[str]:
    """Every difference from the published V4 Flash layout; empty when the file is exactly it."""
    diffs: list[str] = []
    for suffix, want in FLASH_VALUES.items():
        key = f"{ARCH}.{suffix}"
        if key not in f.metadata:
            diffs.append(f"{key} is missing (expected {want})")
            continue
        got = f.metadata[key]
        vtype, _ = f.value_types[key]
        if isinstance(want, float):
            # float32 storage: 1e-6 is stored as 9.99999997e-07.
            if abs(float(got) - want) > 1e-6 * max(1.0, abs(want)) or isinstance(got, bool):
                diffs.append(f"{key} = {got}, expected {want}")
        elif got != want:
            diffs.append(f"{key} = {got}, expected {want}")
        if suffix in _U32_ONLY and vtype != ValueType.UINT32:
            diffs.append(f"{key} is stored as {ValueType(vtype).name}, expected UINT32")
        if suffix == "rope.scaling.original_context_length" and vtype not in (ValueType.UINT32, ValueType.UINT64):
            diffs.append(f"{key} is stored as {ValueType(vtype).name}, expected UINT32 or UINT64")
    for suffix in ("expert_group_count", "expert_group_used_count"):
        key = f"{ARCH}.{suffix}"
        if f.metadata.get(key, 0) != 0:
            diffs.append(f"{key} = {f.metadata[key]}, expected 0 or absent (no group-limited routing)")
    want_ratios = flash_ratios()
    if list(c.compress_ratios) != want_ratios[: c.n_layer] or c.n_layer != FLASH_LAYERS:
        bad = [i for i, (a, b) in enumerate(zip(c.compress_ratios, want_ratios)) if a != b]
        if bad:
            diffs.append(f"{ARCH}.attention.compress_ratios differs at layers {bad[:8]} (expected 0,0,4,128,4,...)")
    if any(x != 10.0 for x in c.swiglu_clamp):
        diffs.append(f"{ARCH}.swiglu_clamp_exp is not all 10.0")
    diffs.extend(check_tensors(f, c))
    return diffs
