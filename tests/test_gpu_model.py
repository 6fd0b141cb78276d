"""bench/gpu_model.py, the GPU path's cost on paper, is built from the launches the engine makes:
its list of launches for a forward pass must be exactly what GpuKernels launches when the model
runs (kinds, template constants, run-time sizes, outputs, in order), at decode and at a prefill
chunk, with the indexer live and not; and its per-launch accounting must add up to the weights
a decode step reads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import Engine
from ds4agent.engine.kernels import gpu

spec = importlib.util.spec_from_file_location("gpu_model", Path(__file__).parents[1] / "bench" / "gpu_model.py")
gpu_model = importlib.util.module_from_spec(spec)
sys.modules["gpu_model"] = gpu_model
spec.loader.exec_module(gpu_model)


class Recorder(gpu.GpuKernels):
    """GpuKernels that records every launch and the expert choices, and returns zeros."""

    def __init__(self, weights) -> None:
        super().__init__(weights, "metal", make=lambda **_: None)
        self.launches: list[gpu.Launch] = []
        self.choices: list[np.ndarray] = []

    def _run(self, launch, inputs):
        self.launches.append(launch)
        return mx.zeros(tuple(launch.output_shapes[0]), dtype=mx.float32)

    def experts(self, layer, x, sel, weights, clamp):
        self.choices.append(np.array(sel))
        return super().experts(layer, x, sel, weights, clamp)


def _key(la: gpu.Launch) -> tuple:
    return la.kind, tuple(la.template), la.dims, tuple(map(tuple, la.output_shapes)), la.grid


@pytest.mark.parametrize("T, start", [(1, 20), (1, 39), (40, 0), (40, 60)])
def test_the_paper_model_lists_the_engines_launches(demo_path, T: int, start: int) -> None:
    """Decode before and after the indexer goes live (the demo's picks 8 of ctx/4 rows), a
    40-token chunk from the start and one that makes it live."""
    with Engine.open(demo_path, backend="cpu", kernels="reference", ctx=512) as e:
        s = e.session()
        if start:
            s.sync(list(range(1000, 1000 + start)))
        rec = e.model.k = Recorder(e.model.w)
        state = s._live.state.fork()
        e.model.forward(np.arange(T) + 3000, state)
        choices = iter(rec.choices)
        want = gpu_model.launches(e.file, e.info.config, T, start + T, lambda layer, n: next(choices))
    assert [_key(la) for la in rec.launches] == [_key(la) for _, la in want]


def test_a_decode_step_reads_every_dense_weight_once_and_the_chosen_experts(flash_header_path) -> None:
    """On the published layout at 2048 tokens: the dense matrices' bytes once each (the head
    too; the embedding and hash tables stay on the host), plus six experts per layer."""
    from ds4agent.modelfile.config import config_from_gguf
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(flash_header_path) as f:
        cfg = config_from_gguf(f)
        ls = gpu_model.launches(f, cfg, 1, 2048, gpu_model.uniform_route(cfg))
        weights = sum(gpu_model.launch_cost(la)[0] for _, la in ls)
        dense = sum(t.nbytes for n, t in f.tensors.items() if len(t.shape) == 2 and "_exps." not in n
                    and n != "token_embd.weight" and "tid2eid" not in n and "_ape." not in n
                    and not (n.endswith("indexer.proj.weight") or n.endswith("indexer.attn_q_b.weight")))
        per_expert = {n: t.nbytes // t.shape[0] for n, t in f.tensors.items() if "_exps." in n}
        experts = cfg.n_expert_used * sum(per_expert.values())
        assert weights == dense + experts  # at 2048 tokens the indexer is not live (512 rows of 512)
        assert 9.0e9 < weights < 9.7e9


def test_it_runs(capsys, monkeypatch) -> None:
    """The script end to end for one device (small: the dispatch count is measured on the demo)."""
    monkeypatch.setattr(sys, "argv", ["gpu_model.py", "--device", "h200", "--ctx", "2048", "--chunk", "256"])
    gpu_model.main()
    out = capsys.readouterr().out
    assert "H200 SXM" in out and "ctx   2048: decode" in out and "prefill/256" in out


def test_a_decode_session_matches_its_launch_count(demo_path) -> None:
    """A real decode step through the host kernels makes as many launches as the paper model
    counts for it (the dispatches it charges for our kernels)."""
    from gpu_harness import harness_make

    calls: list = []
    with Engine.open(demo_path, backend="cpu", kernels="reference", ctx=512, qat_sim=False) as e:
        e.model.k = gpu.GpuKernels(e.model.w, "cuda", make=harness_make("cuda", calls))
        s = e.session()
        s.sync(list(range(1000, 1020)))
        calls.clear()
        s.eval(4242)
        n = len(gpu_model.launches(e.file, e.info.config, 1, 21, gpu_model.uniform_route(e.info.config)))
    assert len(calls) == n
