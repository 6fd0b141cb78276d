"""The Metal kernels checked as far as Linux allows: MLX's own Metal source, parsed by clang.

For every kernel instantiation the engine can launch (tests/gpu_harness.py launches_of, the
same enumeration the CUDA compile test uses), MLX 0.32.4 itself writes the Metal source
mx.fast.metal_kernel would hand to the Metal compiler (tests/mlx_sources.py metal_source: its
generator runs without Metal while a function is exported), and libclang parses it as C++17
after tests/metal_compat.h, with no host headers and every warning an error. The template is
instantiated with the launch's constants, so the whole body is type-checked as it will be
compiled, including which inputs MLX puts in `constant` memory (fewer than 8 elements) and
which in `device` memory.

What this does not catch (README, "What was verified where"): anything where Metal and C++
differ beyond what metal_compat.h models, the Metal compiler's own limits and code generation,
MLX's prelude (kernels/utils.h, stood in for by metal_compat.h) and the attributes of MLX's
signature, and of course whether the kernels run or compute the right values on Apple GPUs.
"""

from __future__ import annotations

from pathlib import Path

import mlx_sources
import pytest
from gpu_harness import launches_of

from ds4agent.engine.kernels import gpu


@pytest.fixture(scope="module")
def flash_q4_header_path(tmp_path_factory) -> Path:
    from ds4agent.modelfile.config import FLASH
    from ds4agent.modelfile.demo import write_model

    return write_model(tmp_path_factory.mktemp("models") / "flash-q4-header.gguf", FLASH, "q4", with_data=False)


@pytest.fixture(scope="module")
def metal_sources(demo_path, demo_q4_path, flash_header_path, flash_q4_header_path) -> dict[str, str]:
    calls = []
    for p in (demo_path, demo_q4_path, flash_header_path, flash_q4_header_path):
        calls += launches_of(p, "metal")
    return mlx_sources.metal_instances(calls)


def test_the_source_is_mlx_own(metal_sources) -> None:
    """MLX's generator wrote these: its signature, buffer indices and explicit instantiation,
    and the split between constant and device memory by input size."""
    texts = list(metal_sources)
    gate_up = [t for t in texts if "custom_kernel_ds4_gate_up__4096_2048_6_16_1056_" in t]
    assert len(gate_up) == 2  # one token (6 slots: sel and route in constant memory) and more
    one = next(t for t in gate_up if "const constant int32_t* sel [[buffer(3)]]" in t)
    assert "const constant float* route [[buffer(4)]]" in one and "const device float* x [[buffer(2)]]" in one
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]" in one
    assert one.rstrip().endswith("custom_kernel_ds4_gate_up__4096_2048_6_16_1056_uint8_t_uint8_t_float_int32_tc_floatc_"
                                 "floatc_float_float_int32_tc_float<4096, 2048, 6, 16, 1056>;")
    assert all("const constant int32_t* dims [[buffer(" in t for t in texts)


def test_every_instantiation_parses_clean(metal_sources) -> None:
    labels = set(metal_sources.values())
    assert {lb.split("__")[0] for lb in labels} == {f"custom_kernel_ds4_{k}" for k in gpu.BODIES}
    assert len(metal_sources) >= 20
    bad = {label: d for text, label in metal_sources.items() if (d := mlx_sources.metal_syntax(text))}
    assert not bad, bad


def test_compat_header_accepts_ordinary_metal() -> None:
    """Idioms a kernel may use (vector types and swizzles, half, as_type, metal:: and precise
    math, SIMD-group reductions, barriers, constant and device pointers) parse clean: the check
    refuses mistakes, not Metal."""
    text = r'''
template <int N>
[[kernel]] void ok(const device float4* a [[buffer(0)]], const constant float* c [[buffer(1)]],
                   device half* o [[buffer(2)]], uint3 tid [[thread_position_in_grid]],
                   uint lane [[thread_index_in_simdgroup]]) {
    float4 v = a[tid.x];
    float s = simd_sum(v.x * v.y + metal::precise::exp(v.z)) + simd_shuffle_down(v.w, 1) + c[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const ushort bits = as_type<ushort>(half(s));
    o[tid.x + lane] = as_type<half>(bits) + half(metal::max(s, 0.0f) * N);
}
template [[host_name("ok")]] [[kernel]] decltype(ok<4>) ok<4>;
'''
    assert mlx_sources.metal_syntax(text) == []


def _one(kind: str, T: int = 1) -> str:
    plan = {"matvec": gpu.plan_matvec(8, 1024, 4096, T), "gate_up": gpu.plan_gate_up(16, T, 6, 2048, 4096)}[kind]
    ins = gpu.BODIES[kind][0].split()
    sizes = {"W": 99, "gate": 99, "up": 99, "x": 4096 * T, "sel": 6 * T, "route": 6 * T, "clampv": 1,
             "iq_grid": 2048, "iq_signs": 1024, "dims": len(plan.dims)}
    calls = [(f"ds4_{kind}", tuple(plan.template),
              tuple(("int32" if n in ("sel", "dims") else "uint8" if n in ("W", "gate", "up") else "float32", (sizes[n],))
                    for n in ins))]
    [text] = mlx_sources.metal_instances(calls)
    return text


@pytest.mark.parametrize("bug", ["typo", "pointer-type", "address-space", "double", "libc", "instantiation"])
def test_a_planted_bug_is_caught(monkeypatch, bug: str) -> None:
    """Plausible mistakes, each reported: a misspelt name, a pointer of the wrong element type,
    a helper written for device memory given a one-element input (MLX passes that in constant
    memory: NVRTC accepts this one, Metal does not), double (Metal has none), a libc call, and
    an error that only the instantiation with the launch's constants reveals."""
    ins, outs, body = gpu.BODIES["gate_up"]
    header = gpu.HEADER
    if bug == "typo":
        body = body.replace("iq_grid, iq_signs);\n        float u", "iq_grid, iq_sings);\n        float u")
    elif bug == "pointer-type":
        body = body.replace("const GLOBAL float *xs = x", "const GLOBAL int32_t *xs = x")
    elif bug == "address-space":
        header += "\nFN float first(const GLOBAL float *p) { return p[0]; }\n"
        body = body.replace("const float c = clampv[0];", "const float c = first(clampv);")
    elif bug == "double":
        body = body.replace("const float c = clampv[0];", "const double c = clampv[0];")
    elif bug == "libc":
        body = body.replace("mid[gid] = g", 'printf("%f", g);\n        mid[gid] = g')
    else:
        body = body.replace("const uint32_t gid = GID;", "const uint32_t gid = GID;\n    static_assert(F != 2048, \"\");")
    assert (body, header) != (gpu.BODIES["gate_up"][2], gpu.HEADER)
    monkeypatch.setitem(gpu.BODIES, "gate_up", (ins, outs, body))
    monkeypatch.setattr(gpu, "HEADER", header)
    assert mlx_sources.metal_syntax(_one("gate_up")) != []


def test_unplanted_probe_is_clean() -> None:
    """The probe of the planted-bug test, without a bug, is clean (so the bugs are what fail)."""
    assert mlx_sources.metal_syntax(_one("gate_up")) == []
    assert mlx_sources.metal_syntax(_one("gate_up", T=2)) == []
    assert mlx_sources.metal_syntax(_one("matvec")) == []


def test_an_unknown_instantiation_form_is_refused() -> None:
    text = _one("matvec").replace("[[kernel]] decltype(", "[[kernel, something]] decltype(")
    with pytest.raises(ValueError, match="instantiation"):
        mlx_sources.metal_syntax(text)
