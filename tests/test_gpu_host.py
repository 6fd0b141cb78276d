"""The whole model through the GPU kernels' bodies on the host (``--kernels gpu-host``,
engine/kernels/gpu_host.py): the GPU path proven on the CPU at every size a session uses.

A 150-token prompt (past the demo model's 32-token window: compressed rows, and more of them
than the indexer may pick, so its selection is live) is prefilled in chunks of 1, 8, 64 and 256
tokens (decode-sized products, one tile, several tiles, one chunk for the whole prompt), then 8
greedy tokens are decoded: the logits match the reference path to 1e-4 and the tokens are the
same. The FP8 KV simulation is off for the comparison: with it a one-ulp difference in
summation order can move a cached value across an FP8 step (seen here: 3e-3 in the logits
after 150 tokens), after which this random model's text diverges, which says nothing about the
kernels (test_kernels.py's model test reasons the same way).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rel_err

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.kernels.gpu_host import HostGpuKernels

PROMPT = np.random.default_rng(5).integers(1000, 120000, 150).tolist()


def _run(path, kernels: str, chunk: int, qat_sim: bool = False) -> tuple[np.ndarray, list[int], np.ndarray]:
    with Engine.open(path, backend="cpu", kernels=kernels, qat_sim=qat_sim) as e:
        assert e.info.kernels == kernels
        s = e.session()
        s.prefill_chunk = chunk
        s.sync(PROMPT)
        first = s.logits.copy()
        toks = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=8, stop_at_eos=False)]
        return first, toks, s.logits.copy()


@pytest.fixture(scope="module")
def reference(demo_path):
    return _run(demo_path, "reference", 256)


@pytest.mark.parametrize("chunk", [1, 8, 64, 256])
def test_whole_model_matches_the_reference(demo_path, reference, chunk: int) -> None:
    first, toks, last = _run(demo_path, "gpu-host", chunk)
    assert toks == reference[1]
    assert rel_err(first, reference[0]) <= 1e-4 and rel_err(last, reference[2]) <= 1e-4


def test_selected_by_flag_and_environment(demo_path, monkeypatch, capsys) -> None:
    """``--kernels gpu-host`` and DS4_KERNELS=gpu-host give the host kernels, self-checked at
    open like the GPU sets (nothing refused); ``ds4 inspect --kernels gpu-host`` reports it."""
    from ds4agent.cli import main

    with Engine.open(demo_path, backend="cpu", kernels="gpu-host") as e:
        assert isinstance(e.model.k, HostGpuKernels) and e.info.kernel_check.refused == {}
        assert {r.op for r in e.info.kernel_check.results} == {"linear", "linears", "grouped", "experts", "attend", "hc_pre"}
    monkeypatch.setenv("DS4_KERNELS", "gpu-host")
    with Engine.open(demo_path, backend="cpu") as e:
        assert e.info.kernels == "gpu-host"
    monkeypatch.delenv("DS4_KERNELS")
    assert main(["inspect", str(demo_path), "--kernels", "gpu-host", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "kernels       gpu-host on cpu: self-check at open" in out and "nothing refused" in out
    assert main(["-m", str(demo_path), "--kernels", "gpu-host", "-p", "hi", "-n", "3", "--temp", "0"]) == 0


def test_a_kernel_that_does_not_compile_is_one_line(demo_path, monkeypatch) -> None:
    """The host compiler refusing a body reaches the self-check as an error (refused, the
    reference runs it), like a GPU compiler's would."""
    from ds4agent.engine.kernels import gpu

    ins, outs, body = gpu.BODIES["moe_sum"]
    monkeypatch.setitem(gpu.BODIES, "moe_sum", (ins, outs, body.replace("acc += part", "acc += parts")))
    with Engine.open(demo_path, backend="cpu", kernels="gpu-host") as e:
        assert set(e.info.kernel_check.refused) == {"experts"}
        assert e.info.kernel_check.refused["experts"].startswith("error: CompileError")
