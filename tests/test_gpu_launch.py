"""The Metal/CUDA kernels launched for real, where this machine has the GPU backend.

test_gpu_kernels.py checks every kernel body on the CPU; this file is what needs the
hardware: the kernels compiled by MLX for the device and launched through
mx.fast.metal_kernel / mx.fast.cuda_kernel, against the MLX reference kernels on the same
device, op by op on the demo model, at Flash dimensions, and as a whole model. Everywhere
else (CI included) it is skipped: bench/gpu_check.sh runs it on an NVIDIA machine.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from helpers import flash_experts_case, rel_err

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.kernels import gpu

if mx.metal.is_available():
    BACKEND = "metal"
elif hasattr(mx, "cuda") and mx.cuda.is_available():
    BACKEND = "cuda"
else:
    BACKEND = None

pytestmark = pytest.mark.skipif(BACKEND is None, reason="no Metal or CUDA backend in this MLX build")


@pytest.fixture(scope="module")
def engines(demo_path):
    """The demo model twice on the GPU backend: our kernels and the reference. The FP8 KV
    simulation is off: with it a one-ulp difference in summation order can move a cached
    value across an FP8 step, after which this random model's greedy text diverges, which
    says nothing about the kernels (the same reasoning as test_kernels.py's model test)."""
    with Engine.open(demo_path, backend=BACKEND, kernels=BACKEND, qat_sim=False) as ours, \
            Engine.open(demo_path, backend=BACKEND, kernels="reference", qat_sim=False) as ref:
        assert ours.info.kernels == BACKEND and ref.info.kernels == "reference"
        # The self-check at open (engine/kernels/check.py) must have refused nothing: a refused
        # kernel runs the reference, and these tests would compare the reference with itself.
        check = ours.info.kernel_check
        assert check is None or check.refused == {}, ours.info.kernel_note
        yield ours, ref


def _np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


@pytest.mark.parametrize("T", [1, 3, 64])
def test_matmul_launch_matches_reference(engines, T: int) -> None:
    ours, ref = (e.model.k for e in engines)
    rng = np.random.default_rng(T)
    for name in ("output.weight", "blk.0.attn_q_b.weight", "blk.1.attn_output_a.weight",
                 "blk.0.ffn_gate_shexp.weight", "blk.0.hc_attn_fn.weight", "blk.0.ffn_gate_inp.weight"):
        n = engines[0].file.tensors[name].shape[-1]
        x = mx.array(rng.normal(size=(T, n)).astype(np.float32))
        assert rel_err(_np(ours.linear(x, name)), _np(ref.linear(x, name))) <= 1e-5, name
    x = mx.array(rng.normal(size=(T, engines[0].file.tensors["output.weight"].shape[-1])).astype(np.float32))
    assert rel_err(_np(ours.linear(x, "output.weight", (7, 300))), _np(ref.linear(x, "output.weight", (7, 300)))) <= 1e-5
    x = x[:, 32:96]
    assert rel_err(_np(ours.linear(x, "output.weight", None, (32, 96))),
                   _np(ref.linear(x, "output.weight", None, (32, 96)))) <= 1e-5


@pytest.mark.parametrize("T", [1, 4, 64])
@pytest.mark.parametrize("layer", [0, 3])
def test_experts_launch_matches_reference(engines, layer: int, T: int) -> None:
    ours, ref = (e.model.k for e in engines)
    t = engines[0].file.tensors[f"blk.{layer}.ffn_gate_exps.weight"]
    E, n_exp = t.shape[2], t.shape[0]
    rng = np.random.default_rng(layer + T)
    x = mx.array((rng.normal(size=(T, E)) * 2).astype(np.float32))
    sel = np.stack([rng.choice(n_exp, size=6, replace=False) for _ in range(T)]).astype(np.int32)
    route = mx.array(rng.uniform(0.2, 1.0, size=(T, 6)).astype(np.float32))
    a, b = ours.experts(layer, x, sel, route, 0.8), ref.experts(layer, x, sel, route, 0.8)
    assert rel_err(_np(a), _np(b)) <= 1e-5


def test_decode_attention_launch_matches_reference(engines) -> None:
    ours, ref = (e.model.k for e in engines)
    rng = np.random.default_rng(0)
    H, N, D = 8, 300, 512
    q = mx.array(rng.normal(size=(H, 1, D)).astype(np.float32))
    keys = mx.array(rng.normal(size=(N, D)).astype(np.float32))
    mask = rng.random((1, N)) < 0.3
    sinks = mx.array(rng.normal(size=H).astype(np.float32))
    assert rel_err(_np(ours.attend(q, keys, mask, sinks)), _np(ref.attend(q, keys, mask, sinks))) <= 1e-5


def test_experts_launch_at_flash_dimensions(engines) -> None:
    """Hidden 4096, expert width 2048, IQ2_XXS gate/up and Q2_K down on random blocks for 8
    experts, through the launched kernels, against float64 on gguf's dequantisation."""
    kern = engines[0].model.k
    c = flash_experts_case()
    E, F = c["E"], c["F"]
    plan = gpu.expert_plan(c["sel"], 8)
    gate_up, glu, down, total = gpu.plan_experts(int(Q.IQ2_XXS), int(Q.Q2_K), plan, F, E)
    tiles, order = mx.array(plan.tiles.reshape(-1)), mx.array(plan.order)
    part = kern._run(gate_up, [mx.array(c["gate"].reshape(-1)), mx.array(c["up"].reshape(-1)), mx.array(c["x"]), tiles,
                               order, kern._grid, kern._signs])
    mid = kern._run(glu, [part, order, mx.array(c["route"].reshape(-1)), mx.array([c["clamp"]], dtype=mx.float32)])
    part = kern._run(down, [mx.array(c["down"].reshape(-1)), mid, tiles, kern._grid, kern._signs])
    y = _np(kern._run(total, [part, mx.array(plan.inv)]))
    assert rel_err(y[0], c["want"]) <= 1e-4


@pytest.mark.parametrize("chunk", [1, 64, 256])
def test_whole_model_on_gpu_kernels_matches_reference(engines, chunk: int) -> None:
    """A 200-token prompt (past the window: compressed rows and the indexer) prefilled in
    chunks of 1, 64 and 256 tokens, then 24 greedy tokens: the same tokens, and logits to 1e-4
    relative, on either kernel set."""
    ids = np.random.default_rng(5).integers(1000, 120000, 200).tolist()
    runs = []
    for e in engines:
        s = e.session()
        s.prefill_chunk = chunk
        s.sync(ids)
        first = s.logits.copy()
        toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=24, stop_at_eos=False)]
        runs.append((first, toks, s.logits.copy()))
    (a0, ta, a1), (b0, tb, b1) = runs
    assert ta == tb
    assert rel_err(a0, b0) <= 1e-4 and rel_err(a1, b1) <= 1e-4


def test_streamed_experts_on_the_device_give_the_same_bits(demo_path) -> None:
    """The expert pool in device memory (filled by the host's reads in place, read by the
    kernels by slot) against every expert resident on the device: identical logits and tokens
    with 3 slots (many turns per layer) and 40."""
    from ds4agent.engine import expertpool
    from ds4agent.modelfile.config import config_from_gguf
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(demo_path) as f:
        slot = expertpool.slot_bytes(f, config_from_gguf(f))
    ids = np.random.default_rng(6).integers(1000, 120000, 120).tolist()
    runs = []
    for budget in (None, 3 * slot, 40 * slot):
        with Engine.open(demo_path, backend=BACKEND, kernels=BACKEND, qat_sim=False, memory_budget=budget) as e:
            assert (e.streaming() is None) == (budget is None)
            s = e.session()
            s.sync(ids)
            toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=12, stop_at_eos=False)]
            runs.append((np.array(s.logits), toks))
    for logits, toks in runs[1:]:
        assert np.array_equal(logits.view(np.uint32), runs[0][0].view(np.uint32)) and toks == runs[0][1]


def test_mxfp4_experts_on_gpu_kernels_match_reference(tmp_path) -> None:
    """The 0731 MXFP4 file's expert format through the device's kernels (tests/test_variants.py
    runs the same comparison on the kernel bodies on the host): logits to 1e-4, the same tokens."""
    from ds4agent.modelfile.demo import tiny_config, write_model

    path = write_model(tmp_path / "mxfp4.gguf", tiny_config(), "mxfp4")
    ids = np.random.default_rng(6).integers(1000, 120000, 60).tolist()
    runs = []
    for kernels in (BACKEND, "reference"):
        with Engine.open(path, backend=BACKEND, kernels=kernels, qat_sim=False) as e:
            assert e.info.kernels == kernels
            s = e.session()
            s.sync(ids)
            first = s.logits.copy()
            runs.append((first, [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=12,
                                                               stop_at_eos=False)]))
    (a, ta), (b, tb) = runs
    assert ta == tb and rel_err(a, b) <= 1e-4


def test_mtp_drafts_on_gpu_kernels_give_plain_decoding(demo_path, tmp_path) -> None:
    """DeepSeek's MTP block on the device's kernels (a demo MTP file: its drafts are rarely
    right): the tokens and the saved session of plain greedy decoding."""
    from ds4agent.modelfile.demo import tiny_config, write_mtp

    mtp = write_mtp(tmp_path / "mtp.gguf", tiny_config())
    prompt = np.random.default_rng(7).integers(1000, 120000, 70).tolist()
    with Engine.open(demo_path, backend=BACKEND, kernels=BACKEND) as e:
        plain = e.session()
        plain.sync(prompt)
        want = [st.token for st in plain.generate(SamplingParams(temperature=0), max_tokens=40, stop_at_eos=False)]
        e.set_speculation("mtp", mtp=mtp)
        s = e.session()
        s.sync(prompt)
        got = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=40, stop_at_eos=False)]
        assert got == want and s.snapshot() == plain.snapshot() and s.drafter.proposals > 0
