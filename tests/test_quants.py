"""MLX dequantisation is bit-exact with gguf.quants.dequantize (the independent oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize as oracle
from helpers import random_blocks, same_bits
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4agent.engine.quants import dequantize

TYPES = [Q.Q8_0, Q.Q2_K, Q.Q4_K, Q.IQ2_XXS, Q.MXFP4]


@pytest.mark.parametrize("qtype", TYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_blocks_bit_exact(qtype: Q, data: st.DataObject) -> None:
    n_rows = data.draw(st.integers(1, 4))
    n_blocks = data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**32 - 1))
    # Ordinary finite scales half of the time; otherwise random bytes, often NaN/inf scales,
    # which must still match bit for bit, NaN payloads included.
    raw = random_blocks(qtype, n_rows, n_blocks, seed, finite=data.draw(st.booleans()), scale=0.01)
    ours = np.array(dequantize(raw, qtype))
    with np.errstate(all="ignore"):
        ref = oracle(raw, qtype)
    assert same_bits(ours, ref)


@pytest.mark.parametrize("name", ["blk.3.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight",
                                  "blk.3.ffn_down_exps.weight", "blk.0.attn_q_b.weight", "output.weight"])
def test_demo_tensors_bit_exact(demo_path, name: str) -> None:
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(demo_path) as f:
        t = f.tensors[name]
        rows = f.array(name)
        rows = rows[0, :64] if rows.ndim == 3 else rows[:64]
        assert same_bits(np.array(dequantize(rows, t.type)), oracle(np.ascontiguousarray(rows), t.type))


def test_q4_k_demo(demo_q4_path) -> None:
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(demo_q4_path) as f:
        rows = f.array("blk.4.ffn_down_exps.weight")[2]
        assert same_bits(np.array(dequantize(rows, Q.Q4_K)), oracle(np.ascontiguousarray(rows), Q.Q4_K))


def test_mxfp4_demo(tmp_path) -> None:
    """The MXFP4 experts of a generated model (ds4 demo --preset mxfp4), every exponent byte
    the generator writes, as gguf reads them."""
    from ds4agent.modelfile.demo import tiny_config, write_model
    from ds4agent.modelfile.gguf import GGUFFile

    path = write_model(tmp_path / "mx.gguf", tiny_config(4), "mxfp4")
    with GGUFFile(path) as f:
        for name in ("blk.3.ffn_gate_exps.weight", "blk.3.ffn_down_exps.weight"):
            assert f.tensors[name].type_name == "MXFP4"
            rows = np.ascontiguousarray(f.array(name)[1])
            assert same_bits(np.array(dequantize(rows, Q.MXFP4)), oracle(rows, Q.MXFP4))


def test_plain_types() -> None:
    x = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32)
    assert same_bits(np.array(dequantize(x.view(np.uint8), Q.F32)), x)
    h = x.astype(np.float16)
    assert same_bits(np.array(dequantize(h.view(np.uint8), Q.F16)), h.astype(np.float32))
    with pytest.raises(ValueError):
        dequantize(np.zeros((1, 33), np.uint8), Q.Q8_0)


def test_q8_0_repack_is_lossless(demo_path) -> None:
    """Q8_0 matrices repacked into MLX's 8-bit affine format dequantise to the same bits, and the
    quantised matmul agrees with a float32 matmul on the dequantised weights."""
    import mlx.core as mx

    from ds4agent.engine.weights import QMatrix
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(demo_path) as f:
        for name in ("blk.1.attn_q_b.weight", "blk.4.attn_output_a.weight", "blk.2.ffn_down_shexp.weight"):
            t = f.tensors[name]
            qm = QMatrix.from_q8_0(f.array(name), t.shape)
            ref = oracle(np.ascontiguousarray(f.array(name)), Q.Q8_0).reshape(t.shape)
            assert same_bits(np.array(qm.dequantized()), ref)
            x = mx.array(np.random.default_rng(0).normal(size=(3, t.shape[1])).astype(np.float32))
            dense = np.array(x) @ ref.T
            assert np.allclose(np.array(qm.matmul_t(x)), dense, rtol=1e-5, atol=1e-5)
            half = qm.rows(0, t.shape[0] // 2)
            assert same_bits(np.array(half.dequantized()), ref[: t.shape[0] // 2])
