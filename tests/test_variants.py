"""Every published kind of file opens (modelfile/info.py variant_of, MXFP4 experts in the
reference and the CPU kernels): ds4 inspect names the variant from the expert types layer by
layer, the file name and the shape; a file of a larger shape than Flash (V4 Pro's kind) passes
the layout check; a model with MXFP4 experts runs on the CPU kernels and the GPU kernels' bodies
as on the reference, and streams through the expert pool to the same bits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ds4agent.cli import main
from ds4agent.engine import Engine, SamplingParams
from ds4agent.modelfile.demo import shape_config, tiny_config, write_model
from ds4agent.modelfile.info import describe, variant_of


@pytest.fixture(scope="module")
def mxfp4_path(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("mxfp4") / "demo-mxfp4.gguf", tiny_config(), "mxfp4")


def test_the_variant_is_named(demo_path, demo_q4_path, mxfp4_path) -> None:
    assert describe(demo_path).variant == "q2: 2-bit experts (IQ2_XXS gate/up, Q2_K down)"
    assert describe(demo_q4_path).variant == "q4: Q4_K experts"
    assert describe(mxfp4_path).variant.startswith("MXFP4 experts (DeepSeek's own, not requantised)")
    c = shape_config(43)
    types = {}
    for i in range(43):
        q4 = 37 <= i <= 42
        types[f"blk.{i}.ffn_gate_exps.weight"] = "Q4_K" if q4 else "IQ2_XXS"
        types[f"blk.{i}.ffn_down_exps.weight"] = "Q4_K" if q4 else "Q2_K"
    name = ("DeepSeek-V4-Flash-Layers37-42Q4KExperts-OtherExpertLayersIQ2XXSGateUp-Q2KDown-AProjQ8-SExpQ8-OutQ8"
            "-chat-v2-imatrix-fixed-0731.gguf")
    assert variant_of(c, types, name) == \
        "mixed: Q4_K experts in layers 37-42, 2-bit elsewhere; imatrix; 0731 checkpoint"


def test_a_larger_shape_than_flash_passes_the_layout_check(tmp_path, capsys) -> None:
    """V4 Pro's dimensions are not written down here: a shape larger in every direction (61
    layers, hidden 7168, 128 heads, 384 experts), header only (432 GiB of holes)."""
    c = replace(shape_config(61), n_embd=7168, n_head=128, q_lora_rank=1536, n_out_group=16, expert_ff=3072,
                n_expert=384, name="larger")
    path = write_model(tmp_path / "larger.gguf", c, with_data=False)
    r = describe(path)
    assert r.usable and not r.claims_flash and "a larger shape than Flash (61 layers, hidden 7168" in r.variant
    assert main(["inspect", str(path)]) == 0
    assert "layout consistent" in capsys.readouterr().out


def test_mxfp4_experts_run_on_the_cpu_kernels_as_on_the_reference(mxfp4_path) -> None:
    """cpu-exact against the reference to 1e-4 of the logits' range and the same greedy tokens
    (the FP8 KV simulation off, as tests/test_kernels.py compares them: with it on, a one-ulp
    difference can cross an FP8 step); the 8-bit kernels' experts streamed through a pool of a
    few slots give the bits they give resident."""
    ids = list(range(2000, 2050))
    greedy = SamplingParams(temperature=0)
    runs = {}
    for kernels in ("reference", "cpu-exact"):
        with Engine.open(mxfp4_path, backend="cpu", ctx=256, qat_sim=False, kernels=kernels) as e:
            assert e.info.kernels == kernels and e.info.expert_quant_bits == 4
            s = e.session()
            s.drafter = None
            s.sync(ids)
            first = s.logits.copy()
            runs[kernels] = (first, [st.token for st in s.generate(greedy, max_tokens=8, stop_at_eos=False)])
    (ra, ta), (rb, tb) = runs["reference"], runs["cpu-exact"]
    assert np.abs(ra - rb).max() <= 1e-4 * np.abs(ra).max() and ta == tb
    logits = []
    for budget in (None, "1M"):
        with Engine.open(mxfp4_path, backend="cpu", ctx=256, kernels="cpu", memory_budget=budget) as e:
            assert (budget is not None) == any("expert streaming" in line for line in e.info.devices)
            s = e.session()
            s.drafter = None
            s.sync(ids)
            logits.append(s.logits.copy())
    assert np.array_equal(logits[0], logits[1])


def test_mxfp4_experts_run_on_the_gpu_kernel_bodies_as_on_the_reference(mxfp4_path) -> None:
    """The GPU kernels' MXFP4 decoding (their bodies on the host: gpu-host), the whole model
    against the reference: logits to 1e-4 of their range, the same greedy tokens."""
    ids = list(range(2100, 2140))
    runs = {}
    for kernels in ("reference", "gpu-host"):
        with Engine.open(mxfp4_path, backend="cpu", ctx=256, qat_sim=False, kernels=kernels) as e:
            assert e.info.kernels == kernels
            s = e.session()
            s.drafter = None
            s.sync(ids)
            first = s.logits.copy()
            runs[kernels] = (first, [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=6,
                                                                   stop_at_eos=False)])
    (ra, ta), (rb, tb) = runs["reference"], runs["gpu-host"]
    assert np.abs(ra - rb).max() <= 1e-4 * np.abs(ra).max() and ta == tb


def test_inspect_names_a_dspark_support_file(tmp_path, capsys) -> None:
    """Stages mtp.0 .. mtp.2 (DSpark's support file), told apart from the one-stage MTP file."""
    from ds4agent.modelfile.gguf import write_gguf

    one = np.ones(4, dtype="<f4")
    write_gguf(tmp_path / "dspark.gguf", {}, [(f"mtp.{s}.attn_norm.weight", 0, (4,), one) for s in range(3)])
    assert main(["inspect", str(tmp_path / "dspark.gguf")]) == 0
    assert "a DSpark support file (3 tensors" in capsys.readouterr().out
