"""ModelConfig from metadata; refusals name the key; the Flash validator checks every value."""

from __future__ import annotations

import re
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as Q
from helpers import copy_model, patch_metadata

from ds4agent.modelfile.config import (
    FLASH,
    ConfigError,
    check_tensors,
    claims_flash,
    config_from_gguf,
    expected_tensors,
    validate_flash,
)
from ds4agent.modelfile.demo import _metadata, official_vocab, tiny_config, write_model
from ds4agent.modelfile.gguf import GGUFFile, write_gguf
from ds4agent.modelfile.gguf import ValueType as V


def test_demo_config(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        c = config_from_gguf(f)
        # Floats are stored as float32: 1e-6 reads back as 9.99999997e-07.
        assert abs(c.rms_eps - 1e-6) < 1e-12 and abs(c.hc_eps - 1e-6) < 1e-12
        assert replace(c, rms_eps=1e-6, hc_eps=1e-6) == tiny_config()
        assert check_tensors(f, c) == []
        assert not claims_flash(c)
    assert c.compress_ratios == (0, 0, 4, 128, 4, 128)
    assert [c.is_hash_layer(i) for i in range(6)] == [True] * 3 + [False] * 3
    assert c.compressor_width(2) == 512 and c.compressor_width(3) == 256 and c.hc_mix == 24


def test_flash_layout_validates(flash_header_path: Path) -> None:
    with GGUFFile(flash_header_path) as f:
        c = config_from_gguf(f)
        assert claims_flash(c)
        assert validate_flash(f, c) == []
        assert c.compress_ratios == FLASH.compress_ratios
        # Spot checks against docs/model.md §2.
        t = f.tensors
        assert t["blk.7.ffn_gate_exps.weight"].dims == (4096, 2048, 256)
        assert t["blk.7.ffn_gate_exps.weight"].row_bytes == 1056
        assert t["blk.7.ffn_down_exps.weight"].row_bytes == 672
        assert t["blk.2.indexer.attn_q_b.weight"].dims == (1024, 8192)
        assert t["blk.3.attn_compressor_ape.weight"].dims == (512, 128)
        assert t["blk.4.attn_compressor_ape.weight"].dims == (1024, 4)
        assert "blk.2.ffn_gate_tid2eid.weight" in t and "blk.3.ffn_gate_tid2eid.weight" not in t
        assert "blk.2.exp_probs_b.bias" not in t and "blk.3.exp_probs_b.bias" in t
        assert abs(f.file_size / 2**30 - 80.76) < 0.01


def _build(tmp_path: Path, cfg=FLASH, meta_edit=None, tensor_edit=None) -> Path:
    """A header-only file of shape ``cfg`` whose metadata/tensors a test can alter."""
    meta = _metadata(cfg, official_vocab(), "tiny", 0)
    if meta_edit:
        meta_edit(meta)
    tensors = []
    for name, spec in expected_tensors(cfg).items():
        # The q2 release mix: IQ2_XXS gate/up, Q2_K down, the only allowed type elsewhere.
        qtype = Q.IQ2_XXS if Q.IQ2_XXS in spec.types else min(spec.types)
        tensors.append([name, int(qtype), spec.dims, None])
    if tensor_edit:
        tensor_edit(tensors)
    p = tmp_path / "m.gguf"
    write_gguf(p, meta, [tuple(t) for t in tensors])
    return p


def _diffs(p: Path) -> list[str]:
    with GGUFFile(p) as f:
        return validate_flash(f, config_from_gguf(f))


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("deepseek4.attention.sliding_window", (V.UINT32, 256), "sliding_window = 256, expected 128"),
        ("deepseek4.attention.compress_rope_freq_base", (V.FLOAT32, 10000.0), "compress_rope_freq_base = 10000.0"),
        ("deepseek4.expert_weights_scale", (V.FLOAT32, 2.5), "expert_weights_scale = 2.5"),
        ("deepseek4.hash_layer_count", (V.INT32, 3), "hash_layer_count is stored as INT32, expected UINT32"),
        ("deepseek4.rope.scaling.original_context_length", (V.UINT64, 65536), None),
        ("deepseek4.attention.compress_ratios", (V.ARRAY, (V.INT32, [0, 0] + [4, 128] * 20 + [4, 0, 0])), None),
        ("deepseek4.swiglu_clamp_exp", (V.ARRAY, (V.FLOAT32, [10.0] * 42 + [7.0])), "swiglu_clamp_exp is not all 10.0"),
        ("deepseek4.expert_group_count", (V.UINT32, 8), "expert_group_count = 8"),
    ],
)
def test_flash_value_checks(tmp_path: Path, key: str, value, fragment: str | None) -> None:
    p = _build(tmp_path, meta_edit=lambda m: m.__setitem__(key, value))
    diffs = _diffs(p)
    if fragment is None:
        # U64 context and longer (MTP) ratio arrays are legal.
        assert diffs == []
    else:
        assert any(fragment in d for d in diffs), diffs


def test_flash_wrong_ratio_pattern(tmp_path: Path) -> None:
    ratios = [0, 0] + [128, 4] * 20 + [4]
    p = _build(tmp_path, meta_edit=lambda m: m.__setitem__("deepseek4.attention.compress_ratios", (V.ARRAY, (V.UINT32, ratios))))
    # The tensor inventory follows the file's own ratios, so only the ratio check can catch it.
    diffs = _diffs(p)
    assert any("compress_ratios differs at layers [2, 3" in d for d in diffs), diffs


def test_flash_tensor_type_and_dims(tmp_path: Path) -> None:
    def edit(ts):
        for t in ts:
            if t[0] == "blk.10.attn_q_a.weight":
                t[1] = int(Q.F16)
            if t[0] == "blk.5.ffn_up_exps.weight":
                t[1] = int(Q.Q4_K)
            if t[0] == "output_norm.weight":
                t[2] = (4095,)
        ts[:] = [t for t in ts if t[0] != "blk.20.attn_sinks.weight"]

    diffs = _diffs(_build(tmp_path, tensor_edit=edit))
    text = "\n".join(diffs)
    assert "blk.10.attn_q_a.weight has type F16, expected Q8_0" in text
    assert "blk.5: expert gate is IQ2_XXS but up is Q4_K" in text
    assert "output_norm.weight has dims [4095], expected [4096]" in text
    assert "missing tensor blk.20.attn_sinks.weight" in text


def test_flash_mixed_expert_layers_are_fine(tmp_path: Path) -> None:
    """gguf-tools can splice Q4_K experts into chosen layers of a q2 file."""
    def edit(ts):
        for t in ts:
            if t[0].startswith(("blk.40.", "blk.41.", "blk.42.")) and "_exps." in t[0]:
                t[1] = int(Q.Q4_K)

    assert _diffs(_build(tmp_path, tensor_edit=edit)) == []


def test_missing_key_is_named(tmp_path: Path) -> None:
    p = _build(tmp_path, tiny_config(), meta_edit=lambda m: m.pop("deepseek4.attention.indexer.top_k"))
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="missing required metadata key deepseek4.attention.indexer.top_k"):
        config_from_gguf(f)


def test_wrong_architecture(demo_path: Path, tmp_path: Path) -> None:
    p = copy_model(demo_path, tmp_path / "arch.gguf")
    patch_metadata(p, "general.architecture", b"deepseek4", b"deepseek3")
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="general.architecture is 'deepseek3'"):
        config_from_gguf(f)


def test_wrong_value_type(tmp_path: Path) -> None:
    p = _build(tmp_path, tiny_config(), meta_edit=lambda m: m.__setitem__("deepseek4.expert_count", (V.STRING, "16")))
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="deepseek4.expert_count has type STRING"):
        config_from_gguf(f)


def test_short_per_layer_array(tmp_path: Path) -> None:
    p = _build(tmp_path, tiny_config(), meta_edit=lambda m: m.__setitem__("deepseek4.swiglu_clamp_exp", (V.ARRAY, (V.FLOAT32, [10.0] * 5))))
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="swiglu_clamp_exp has 5 entries, need at least 6"):
        config_from_gguf(f)


def test_bad_ratio_value(tmp_path: Path) -> None:
    p = _build(tmp_path, tiny_config(), meta_edit=lambda m: m.__setitem__("deepseek4.attention.compress_ratios", (V.ARRAY, (V.UINT32, [0, 0, 4, 64, 4, 128]))))
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="layer 3 has ratio 64"):
        config_from_gguf(f)


def test_any_shape_loads(tmp_path: Path) -> None:
    """Tiny shapes with other layer counts and widths load through the same code."""
    cfg = replace(tiny_config(3), n_expert=4, n_expert_used=1, sliding_window=8)
    p = write_model(tmp_path / "t3.gguf", cfg)
    with GGUFFile(p) as f:
        got = config_from_gguf(f)
        assert check_tensors(f, got) == []
    assert got.n_layer == 3 and got.compress_ratios == (0, 0, 4) and got.n_expert == 4


def test_demo_embedding_length_patched_is_inconsistent(demo_path: Path, tmp_path: Path) -> None:
    p = copy_model(demo_path, tmp_path / "emb.gguf")
    patch_metadata(p, "deepseek4.embedding_length", struct.pack("<I", 256), struct.pack("<I", 512))
    with GGUFFile(p) as f:
        problems = check_tensors(f, config_from_gguf(f))
    assert "tensor token_embd.weight has dims [256, 129280], expected [512, 129280]" in problems


# -- every number the model computes with is range-checked, by the check inspect and open share --

NAN, INF = float("nan"), float("inf")
# Float keys: the model takes logs of, divides by, or clamps with each of these.
FLOAT_KEYS = [
    "attention.compress_rope_freq_base", "rope.freq_base", "rope.scaling.factor",
    "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "attention.layer_norm_rms_epsilon",
    "hyper_connection.epsilon", "expert_weights_scale",
]
# Integer keys: counts and sizes the model divides or indexes by, or loops over.
INT_KEYS = [
    "block_count", "embedding_length", "vocab_size", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "attention.q_lora_rank",
    "attention.output_lora_rank", "attention.output_group_count", "attention.sliding_window",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "rope.scaling.original_context_length", "expert_count", "expert_used_count",
    "expert_feed_forward_length", "expert_shared_count", "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
]
BAD_CASES = (
    [(k, (V.FLOAT32, v), v) for k in FLOAT_KEYS for v in (0.0, -1.0, NAN, INF)]
    + [(k, (V.FLOAT32, 1.0), 1.0) for k in ("attention.compress_rope_freq_base", "rope.freq_base")]  # log(1) = 0
    + [(k, (V.UINT32, 0), 0) for k in INT_KEYS]
    + [(k, (V.INT32, -1), -1) for k in INT_KEYS + ["hash_layer_count", "expert_group_count", "expert_group_used_count"]]
    + [("hyper_connection.sinkhorn_iterations", (V.UINT32, 4_000_000_000), 4_000_000_000),  # a loop count
       ("block_count", (V.UINT32, 4_000_000_000), 4_000_000_000)]
    + [("swiglu_clamp_exp", (V.ARRAY, (V.FLOAT32, [10.0] * 3 + [v] + [10.0] * 2)), v) for v in (0.0, -1.0, NAN, INF)]
)


def _found(value) -> str:
    return f"found {value!r}" if isinstance(value, float) else f"found {value}"


@pytest.mark.parametrize("suffix,stored,value", BAD_CASES,
                         ids=[f"{k}={v}" for k, _, v in BAD_CASES])
def test_out_of_range_values_are_refused(tmp_path: Path, capsys, suffix: str, stored, value) -> None:
    """A zero, negative, NaN or infinite value used to pass `ds4 inspect` ("layout consistent")
    and then kill Engine.open with ZeroDivisionError / ValueError (or produce NaN logits)."""
    from small_model import write_small

    from ds4agent.cli import main
    from ds4agent.engine import Engine

    key = f"deepseek4.{suffix}"
    p = write_small(tmp_path / "bad.gguf", meta_edit=lambda m: m.__setitem__(key, stored))

    assert main(["inspect", str(p)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("ds4: error: ") and err.count("\n") == 1, (out, err)
    assert key in err and "must be" in err and _found(value) in err, err

    with pytest.raises(ConfigError) as e:
        Engine.open(p, backend="cpu", ctx=64)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and key in msg and _found(value) in msg, msg
    # The message states the accepted range.
    assert re.search(r"must be (an integer in \d+\.\.\d+|a finite number in [(\[][-\d.e+]+, [-\d.e+]+[)\]])", msg), msg


def test_valid_edge_values_are_accepted(tmp_path: Path) -> None:
    """Zero is legal where the model does not divide by it: no hash layers, no expert groups."""
    from small_model import small_config, write_small

    from ds4agent.engine import Engine

    def edit(m):
        m["deepseek4.expert_group_count"] = (V.UINT32, 0)
        m["deepseek4.expert_group_used_count"] = (V.UINT32, 0)

    cfg = replace(small_config(), n_hash_layer=0, rope_scaling_factor=1.0)
    p = write_small(tmp_path / "ok.gguf", meta_edit=edit, cfg=cfg)
    with Engine.open(p, backend="cpu", ctx=64) as e:
        assert e.info.config.n_hash_layer == 0 and e.info.config.rope_scaling_factor == 1.0


def test_informational_context_length_of_any_type(tmp_path: Path) -> None:
    """deepseek4.context_length is a summary nobody computes with: a string there is ignored,
    not a crash (int('x') used to raise ValueError)."""
    from small_model import write_small

    p = write_small(tmp_path / "ctx.gguf", meta_edit=lambda m: m.__setitem__("deepseek4.context_length", (V.STRING, "x")))
    with GGUFFile(p) as f:
        assert config_from_gguf(f).context_length is None


def test_flash_nan_value_is_refused(flash_header_path: Path, tmp_path: Path) -> None:
    """NaN passes any '>' comparison with the published value, so the Flash diff alone would
    miss it; the range check, which runs first for every file, refuses it."""
    p = copy_model(flash_header_path, tmp_path / "nan.gguf")
    patch_metadata(p, "deepseek4.expert_weights_scale", struct.pack("<f", 1.5), struct.pack("<f", NAN))
    with GGUFFile(p) as f, pytest.raises(ConfigError, match="expert_weights_scale must be .* found nan"):
        config_from_gguf(f)
