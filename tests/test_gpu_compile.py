"""The CUDA kernels compiled here, as MLX's CUDA backend compiles them, without a GPU.

For every kernel instantiation the engine can launch (on the demo models and on the published
Flash layout, q2, q4 and MXFP4: tests/gpu_harness.py launches_of), the exact source text that
mx.fast.cuda_kernel builds (tests/mlx_sources.py: MLX 0.32.3's generator mirrored, checked
against the pinned mlx-cuda-12 wheel) is compiled by NVRTC 12.9 with MLX's own options, device
headers and CUDA headers, to SASS for sm_80 (A100) and sm_90a (H100/H200: MLX adds the "a"
from compute capability 9 on), with ptxas asked to warn on spills and local memory, and any
warning from either counts as a failure. Then the kernel name MLX looks up must resolve.

What this does not prove: that the kernels run or compute the right values on a GPU (the
arithmetic of the same bodies is tested on the CPU, tests/test_gpu_kernels.py; the launch
needs hardware, tests/test_gpu_launch.py), nor the driver's JIT, nor CUDA 13.
"""

from __future__ import annotations

import platform
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import mlx.core as mx
import mlx_sources
import numpy as np
import pytest
from gpu_harness import harness_make, launches_of

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.kernels import gpu

# NVRTC ships as Linux x86-64 wheels (the test extra installs them there); CI is such a machine,
# so there this never skips: a missing package fails.
pytestmark = pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                                reason="NVRTC wheels exist for Linux x86-64 only")

ARCHS = ("sm_80", "sm_90a")
PTXAS = ("-Xptxas=--warn-on-spills", "-Xptxas=--warn-on-local-memory-usage")


@pytest.fixture(scope="module")
def mlx_cuda() -> mlx_sources.MlxCuda:
    return mlx_sources.mlx_cuda()


@pytest.fixture(scope="module")
def nvrtc() -> mlx_sources.Nvrtc:
    return mlx_sources.Nvrtc()


@pytest.fixture(scope="module")
def flash_q4_header_path(tmp_path_factory) -> Path:
    from ds4agent.modelfile.config import FLASH
    from ds4agent.modelfile.demo import write_model

    return write_model(tmp_path_factory.mktemp("models") / "flash-q4-header.gguf", FLASH, "q4", with_data=False)


@pytest.fixture(scope="module")
def flash_mxfp4_header_path(tmp_path_factory) -> Path:
    from ds4agent.modelfile.config import FLASH
    from ds4agent.modelfile.demo import write_model

    return write_model(tmp_path_factory.mktemp("models") / "flash-mxfp4-header.gguf", FLASH, "mxfp4", with_data=False)


@pytest.fixture(scope="module")
def all_launches(demo_path, demo_q4_path, flash_header_path, flash_q4_header_path, flash_mxfp4_header_path) -> list:
    calls = []
    for p in (demo_path, demo_q4_path, flash_header_path, flash_q4_header_path, flash_mxfp4_header_path):
        calls += launches_of(p, "cuda")
    return calls


def test_pinned_versions_are_the_ones_mirrored(mlx_cuda) -> None:
    """tests/mlx_sources.py mirrors one MLX version: an MLX bump fails here until the mirror is
    re-checked against the new custom_kernel.cpp / jit_module.cpp (and the wheel's hash and
    NVRTC pins updated)."""
    assert mx.__version__ == mlx_sources.MLX_VERSION
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert f"mlx[cpu]=={mlx_sources.MLX_VERSION}; sys_platform == 'linux'" in deps["dependencies"]
    assert f"mlx[cuda12]=={mlx_sources.MLX_VERSION}; sys_platform == 'linux'" in deps["optional-dependencies"]["cuda12"]
    with zipfile.ZipFile(mlx_sources.mlx_cuda_wheel()) as z:
        meta = z.read(f"mlx_cuda_12-{mlx_sources.MLX_VERSION}.dist-info/METADATA").decode()
    assert "Requires-Dist: nvidia-cuda-nvrtc-cu12==12.9.*" in meta
    assert metadata.version("nvidia-cuda-nvrtc-cu12").startswith("12.9.")
    assert metadata.version("nvidia-cuda-runtime-cu12").startswith("12.9.")


def test_mirror_matches_the_wheel(mlx_cuda, nvrtc) -> None:
    """Every fixed piece of text the mirror emits is in the wheel's libmlx.so, and the device
    headers came out of its tables whole (17 of them, the ones jit_module.cpp lists)."""
    assert mlx_cuda.missing_fragments == []
    assert len(mlx_cuda.headers) == 17
    utils = mlx_cuda.headers["mlx/backend/cuda/device/utils.cuh"]
    assert '#include "mlx/backend/cuda/device/config.h"' in utils and "namespace mlx::core::cu" in utils
    assert (mlx_cuda.include / "cccl" / "cuda" / "std" / "array").exists()
    assert nvrtc.version() == (12, 9)


def test_mirror_reproduces_mlx_layout() -> None:
    """The generated text for one launch, spelled out: inputs then outputs as parameters, the
    template arguments as constexpr ints inside the function, the body, the namespace."""
    name, text = mlx_sources.cuda_source("ds4_mix", ["p", "keys", "idx", "dims"],
                                         [mlx_sources.Arg("float32", 1, 64), mlx_sources.Arg("float32", 1, 99),
                                          mlx_sources.Arg("int32", 1, 3), mlx_sources.Arg("int32", 1, 1)],
                                         ["o"], ["float32"], [("D", 512), ("H", 64)], "// ours\n", "BODY")
    assert name == "custom_kernel_ds4_mix_512_64"
    assert text == ('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n// ours\n'
                    "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
                    "__global__ void custom_kernel_ds4_mix_512_64(\n    const float* p,\n    const float* keys,\n"
                    "    const int32_t* idx,\n    const int32_t* dims,\n    float* o) {\n"
                    "  constexpr int D = 512;\n  constexpr int H = 64;\n\nBODY\n}\n\n} // namespace mlx::core::cu\n")


def test_engine_launches_are_among_the_enumerated(demo_path) -> None:
    """The enumeration the compile test covers contains every instantiation a real session
    makes: GpuKernels running the whole demo model (bodies on the CPU through the harness) over
    a prefill (40 tokens), a short suffix (a 5-token product) and greedy decoding."""
    calls: list = []
    with Engine.open(demo_path, backend="cpu", kernels="reference", qat_sim=False) as e:
        e.model.k = gpu.GpuKernels(e.model.w, "cuda", make=harness_make("cuda", calls))
        s = e.session()
        ids = np.random.default_rng(3).integers(1000, 120000, 40).tolist()
        s.sync(ids)
        s.sync(ids + [11, 22, 33, 44, 55])
        list(s.generate(SamplingParams(temperature=0), max_tokens=6, stop_at_eos=False))
    used = mlx_sources.cuda_instances(calls)
    assert {n for n, _, _ in calls} == {f"ds4_{k}" for k in gpu.BODIES}
    assert {dict(t)["TILE"] for n, t, _ in calls if n == "ds4_matmul"} == {1, 8}  # decode, suffix and prefill
    assert set(used) <= set(mlx_sources.cuda_instances(launches_of(demo_path, "cuda")))


def _compile_all(mlx_cuda, sources: dict[str, tuple[str, str]]) -> list[tuple[str, str, mlx_sources.Compiled]]:
    jobs = [(text, sym, arch) for text, (sym, _) in sources.items() for arch in ARCHS]
    labels = [(label, arch) for _, (_, label) in sources.items() for arch in ARCHS]
    return [(label, arch, r) for (label, arch), r in zip(labels, mlx_sources.compile_many(jobs, mlx_cuda, PTXAS))]


def test_every_instantiation_compiles_clean(nvrtc, mlx_cuda, all_launches) -> None:
    sources = mlx_sources.cuda_instances(all_launches)
    labels = [label for _, label in sources.values()]
    assert {k for k in gpu.BODIES if any(lb.startswith(f"custom_kernel_ds4_{k}") for lb in labels)} == set(gpu.BODIES)
    assert len(sources) >= 30  # 5 models: the Flash q2/q4/MXFP4 kernels plus the demo models'
    bad = [f"{label} {arch}:\n{r.log[-2000:]}" for label, arch, r in _compile_all(mlx_cuda, sources)
           if not r.clean or not r.symbol or r.cubin_bytes == 0]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("bug", ["typo", "type", "warning", "missing-dims"])
def test_a_planted_bug_fails_the_compile(nvrtc, mlx_cuda, monkeypatch, bug: str) -> None:
    """Plausible mistakes in a kernel body, each caught by the compile above: a misspelt input
    name, a pointer stored as a float, an unused variable (a warning), and a body that forgets
    the runtime sizes it must read (an input name the signature no longer has)."""
    ins, outs, body = gpu.BODIES["moe_gate_up"]
    planted = {
        "typo": (ins, body.replace("order[start", "orders[start")),
        "type": (ins, body.replace("part[o] = ag[p];", "part[o] = gate; part[o] = ag[p];")),
        "warning": (ins, body.replace("const uint32_t gid = GID;", "const uint32_t gid = GID; int unused_n;")),
        "missing-dims": (ins.replace(" dims", ""), body),
    }[bug]
    assert planted != (ins, body)
    monkeypatch.setitem(gpu.BODIES, "moe_gate_up", (planted[0], outs, planted[1]))
    launch = gpu.plan_experts(16, 10, gpu.expert_plan(np.arange(12).reshape(2, 6) % 4, 256), 2048, 4096)[0]
    args = (("uint8", (99,)), ("uint8", (99,)), ("float32", (8192,)), ("int32", (12,)), ("int32", (12,)),
            ("float32", (2048,)), ("float32", (1024,)), ("int32", (3,)))
    sources = mlx_sources.cuda_instances([("ds4_moe_gate_up", tuple(launch.template), args[:len(planted[0].split())])])
    [(text, (sym, _))] = sources.items()
    r = nvrtc.compile(text, sym, "sm_80", mlx_cuda, PTXAS)
    assert not r.clean, text
