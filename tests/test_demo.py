"""The demo model: real layout and types (docs/model.md §2), real vocabulary, sane random weights."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize

from ds4agent.modelfile.config import config_from_gguf
from ds4agent.modelfile.demo import write_demo
from ds4agent.modelfile.gguf import GGUFFile
from ds4agent.modelfile.gguf import ValueType as V


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_deterministic(demo_path: Path, tmp_path: Path) -> None:
    again = write_demo(tmp_path / "again.gguf", "tiny", 0)
    assert _sha(again) == _sha(demo_path)
    other = write_demo(tmp_path / "other.gguf", "tiny", 1)
    assert _sha(other) != _sha(demo_path)


# Types of docs/model.md §2 for the q2 release; the demo must use exactly these.
SPEC_TYPES = {
    "token_embd.weight": Q.F16, "output.weight": Q.Q8_0, "output_norm.weight": Q.F32,
    "output_hc_fn.weight": Q.F16, "output_hc_base.weight": Q.F32, "output_hc_scale.weight": Q.F32,
    "hc_attn_fn.weight": Q.F16, "hc_attn_scale.weight": Q.F32, "hc_attn_base.weight": Q.F32,
    "attn_norm.weight": Q.F32, "attn_q_a.weight": Q.Q8_0, "attn_q_a_norm.weight": Q.F32,
    "attn_q_b.weight": Q.Q8_0, "attn_kv.weight": Q.Q8_0, "attn_kv_a_norm.weight": Q.F32,
    "attn_sinks.weight": Q.F32, "attn_output_a.weight": Q.Q8_0, "attn_output_b.weight": Q.Q8_0,
    "attn_compressor_ape.weight": Q.F16, "attn_compressor_kv.weight": Q.F16,
    "attn_compressor_gate.weight": Q.F16, "attn_compressor_norm.weight": Q.F32,
    "indexer.attn_q_b.weight": Q.F16, "indexer.proj.weight": Q.F16,
    "indexer_compressor_ape.weight": Q.F16, "indexer_compressor_kv.weight": Q.F16,
    "indexer_compressor_gate.weight": Q.F16, "indexer_compressor_norm.weight": Q.F32,
    "hc_ffn_fn.weight": Q.F16, "hc_ffn_scale.weight": Q.F32, "hc_ffn_base.weight": Q.F32,
    "ffn_norm.weight": Q.F32, "ffn_gate_inp.weight": Q.F16, "exp_probs_b.bias": Q.F32,
    "ffn_gate_tid2eid.weight": Q.I32, "ffn_gate_exps.weight": Q.IQ2_XXS, "ffn_up_exps.weight": Q.IQ2_XXS,
    "ffn_down_exps.weight": Q.Q2_K, "ffn_gate_shexp.weight": Q.Q8_0, "ffn_up_shexp.weight": Q.Q8_0,
    "ffn_down_shexp.weight": Q.Q8_0,
}
ATTN_COMPRESSOR = {"attn_compressor_ape.weight", "attn_compressor_kv.weight", "attn_compressor_gate.weight",
                   "attn_compressor_norm.weight"}
INDEXER = {"indexer.attn_q_b.weight", "indexer.proj.weight", "indexer_compressor_ape.weight",
           "indexer_compressor_kv.weight", "indexer_compressor_gate.weight", "indexer_compressor_norm.weight"}


def test_layout_and_types(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        c = config_from_gguf(f)
        names = set(f.tensors)
        for name, t in f.tensors.items():
            short = name.split(".", 2)[2] if name.startswith("blk.") else name
            assert t.type == SPEC_TYPES[short], name
        ratios = c.compress_ratios
        # Every layer kind and both routing kinds are present.
        assert {0, 4, 128} <= set(ratios)
        assert c.n_hash_layer >= 1 and c.n_hash_layer < c.n_layer
        for i in range(c.n_layer):
            have = {n.split(".", 2)[2] for n in names if n.startswith(f"blk.{i}.")}
            assert (ATTN_COMPRESSOR <= have) == (ratios[i] != 0)
            assert (INDEXER <= have) == (ratios[i] == 4)
            assert not (INDEXER & have) or ratios[i] == 4
            assert ("ffn_gate_tid2eid.weight" in have) == (i < c.n_hash_layer)
            # llama.cpp wants the selection bias on every top-k layer and only there.
            assert ("exp_probs_b.bias" in have) == (i >= c.n_hash_layer)
        assert c.indexer_n_head >= 16
        assert c.n_vocab == 129280


def test_llama_cpp_metadata(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        m, vt = f.metadata, f.value_types
        assert m["deepseek4.expert_gating_func"] == 4 and vt["deepseek4.expert_gating_func"][0] == V.UINT32
        assert m["deepseek4.rope.scaling.type"] == "yarn"
        assert vt["deepseek4.context_length"][0] == V.UINT32
        assert len(m["deepseek4.swiglu_clamp_exp"]) == m["deepseek4.block_count"]
        assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "joyai-llm"
        assert m["tokenizer.ggml.bos_token_id"] == 0 and m["tokenizer.ggml.eos_token_id"] == 1
        assert len(m["tokenizer.ggml.token_type"]) == len(m["tokenizer.ggml.tokens"]) == 129280


def test_weights_are_sane(demo_path: Path) -> None:
    """Dequantised by the gguf package: finite, zero-mean-ish, at the intended scale."""
    with GGUFFile(demo_path) as f:
        c = config_from_gguf(f)
        for name in ["blk.3.ffn_gate_exps.weight", "blk.3.ffn_down_exps.weight", "blk.0.attn_q_a.weight",
                     "blk.2.ffn_gate_shexp.weight"]:
            t = f.tensors[name]
            raw = f.array(name)
            rows = raw[0] if raw.ndim == 3 else raw  # one expert is plenty
            w = dequantize(np.ascontiguousarray(rows), t.type)
            assert np.isfinite(w).all()
            target = 1 / np.sqrt(t.dims[0])
            assert 0.8 * target < w.std() < 1.25 * target, (name, w.std(), target)
            assert abs(w.mean()) < 0.2 * target, (name, w.mean())
        tid = f.array("blk.0.ffn_gate_tid2eid.weight")
        assert tid.shape == (129280, c.n_expert_used)
        assert tid.min() >= 0 and tid.max() < c.n_expert
        assert (tid[:, 0] != tid[:, 1]).all()
        for name, t in f.tensors.items():
            if t.type in (Q.F16, Q.F32):
                assert np.isfinite(f.array(name)).all(), name


def test_q4_preset(demo_q4_path: Path) -> None:
    with GGUFFile(demo_q4_path) as f:
        for name, t in f.tensors.items():
            if "_exps." in name:
                assert t.type == Q.Q4_K, name
        w = dequantize(np.ascontiguousarray(f.array("blk.4.ffn_down_exps.weight")[1]), Q.Q4_K)
        assert np.isfinite(w).all() and 0.8 / 16 < w.std() < 1.25 / 16


def test_size_dominated_by_vocabulary(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        vocab_rows = f.tensors["token_embd.weight"].nbytes + f.tensors["output.weight"].nbytes
        assert vocab_rows > 0.75 * f.file_size
        assert f.file_size < 160 * 2**20


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo preset"):
        write_demo(tmp_path / "x.gguf", "huge")


def test_shape_preset_layout(tmp_path: Path) -> None:
    """The shape preset: real dimensions, N layers in the real pattern, fewer experts allowed;
    checked on a header-only file (the real one is GBs)."""
    from ds4agent.modelfile.config import check_tensors, claims_flash
    from ds4agent.modelfile.demo import shape_config, write_model

    c = shape_config(4, 8)
    assert (c.n_embd, c.n_head, c.head_dim, c.expert_ff) == (4096, 64, 512, 2048)
    assert c.compress_ratios == (0, 0, 4, 128) and c.n_hash_layer == 3 and c.n_expert_used == 6
    p = write_model(tmp_path / "shape.gguf", c, with_data=False)
    with GGUFFile(p) as f:
        got = config_from_gguf(f)
        assert check_tensors(f, got) == [] and not claims_flash(got)
        assert f.tensors["blk.3.ffn_gate_exps.weight"].dims == (4096, 2048, 8)
    with pytest.raises(ValueError):
        shape_config(0)


def test_shape_preset_needs_out(capsys) -> None:
    from ds4agent.cli import main

    assert main(["demo", "--preset", "shape"]) == 2
    assert "needs --out" in capsys.readouterr().err
