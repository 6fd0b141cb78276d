"""The Metal kernels checked as far as Linux allows: MLX's own Metal source, parsed by clang.

For every kernel instantiation the engine can launch (tests/gpu_harness.py launches_of, the
same enumeration the CUDA compile test uses), MLX 0.32.3 itself writes the Metal source
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
    # Flash IQ2_XXS, tiles of 1, read from the expert tensors (offsets 0, one expert 2048 x 1056 bytes apart)
    stem = "custom_kernel_ds4_moe_gate_up__66_256_2048_0_6_4096_16_1056_8_1_0_2162688_"
    gate_up = [t for t in texts if stem in t]
    # One source for every batch size: a decode step's 6 slots are padded to 8 (gpu.SMALL), so
    # MLX never moves the slot arrays to constant memory.
    [one] = gate_up
    assert "const device int32_t* order [[buffer(4)]]" in one and "const device int32_t* tiles [[buffer(3)]]" in one
    assert "const device float* x [[buffer(2)]]" in one
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]" in one
    assert one.rstrip().endswith(stem + "uint8_t_uint8_t_float_int32_t_int32_t_float_float_int32_tc_float"
                                 "<66, 256, 2048, 0, 6, 4096, 16, 1056, 8, 1, 0, 2162688>;")
    # dims: 8 values for a dense product (device memory), fewer elsewhere (constant memory).
    assert any("const constant float* clampv [[buffer(" in t for t in texts)
    for t in texts:
        space = "device" if "custom_kernel_ds4_matmul_" in t else "constant"
        assert f"const {space} int32_t* dims [[buffer(" in t


def test_every_instantiation_parses_clean(metal_sources) -> None:
    labels = set(metal_sources.values())
    assert {k for k in gpu.BODIES if any(lb.startswith(f"custom_kernel_ds4_{k}_") for lb in labels)} == set(gpu.BODIES)
    assert len(metal_sources) >= 30
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
    """MLX's Metal text of one launch at Flash dimensions (dense Q8_0 4096 -> 1024, or the
    routed experts' gate/up or SwiGLU with 6 slots per token), at T tokens."""
    import numpy as np

    if kind == "matmul":
        plan = gpu.plan_matmul(8, 1024, 4096, T)[0]
    else:
        sel = np.stack([np.arange(6) + 6 * t for t in range(T)])
        gate_up, glu, _, _ = gpu.plan_experts(16, 10, gpu.expert_plan(sel, 256), 2048, 4096)
        plan = gate_up if kind == "moe_gate_up" else glu
    ins = gpu.BODIES[kind][0].split()
    sizes = {**{f"W{i}": 99 for i in range(6)}, "gate": 99, "up": 99, "x": 4096 * T, "tiles": 3 * 6 * T, "order": 6 * T, "route": 6 * T,
             "part": 2048 * 6 * T * 2, "clampv": 1, "iq_grid": 2048, "iq_signs": 1024, "dims": len(plan.dims)}
    ints, raw = ("tiles", "order", "dims"), ("W0", "W1", "W2", "W3", "W4", "W5", "gate", "up")
    calls = [(f"ds4_{kind}", tuple(plan.template),
              tuple(("int32" if n in ints else "uint8" if n in raw else "float32", (sizes[n],)) for n in ins))]
    [text] = mlx_sources.metal_instances(calls)
    return text


BUGS = {  # a plausible mistake -> (the kernel, the change to its body, an addition to the header)
    "typo": ("moe_gate_up", lambda b: b.replace("wu, iq_grid, iq_signs)", "wu, iq_grid, iq_sings)"), ""),
    "pointer-type": ("moe_gate_up", lambda b: b.replace("const float xv = x[", "const GLOBAL int32_t *xi = x;\n"
                                                        "                        const float xv = xi["), ""),
    "address-space": ("moe_glu", lambda b: b.replace("const float c = clampv[0];", "const float c = first(clampv);"),
                      "\nFN float first(const GLOBAL float *p) { return p[0]; }\n"),
    "double": ("moe_glu", lambda b: b.replace("const float c = clampv[0];", "const double c = clampv[0];"), ""),
    "libc": ("moe_glu", lambda b: b.replace("mid[gid] = g", 'printf("%f", g);\n        mid[gid] = g'), ""),
    "instantiation": ("moe_gate_up", lambda b: b.replace("const uint32_t gid = GID;",
                                                         "const uint32_t gid = GID;\n    static_assert(F != 2048, \"\");"),
                      ""),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_is_caught(monkeypatch, bug: str) -> None:
    """Plausible mistakes, each reported: a misspelt name, a pointer of the wrong element type,
    a helper written for device memory given a one-element input (MLX passes that in constant
    memory: NVRTC accepts this one, Metal does not), double (Metal has none), a libc call, and
    an error that only the instantiation with the launch's constants reveals."""
    kind, change, extra = BUGS[bug]
    ins, outs, body = gpu.BODIES[kind]
    assert change(body) != body
    monkeypatch.setitem(gpu.BODIES, kind, (ins, outs, change(body)))
    monkeypatch.setattr(gpu, "HEADER", gpu.HEADER + extra)
    assert mlx_sources.metal_syntax(_one(kind)) != []


def test_unplanted_probe_is_clean() -> None:
    """The probes of the planted-bug test, without a bug, are clean (so the bugs are what fail)."""
    for kind in ("moe_gate_up", "moe_glu", "matmul"):
        for T in (1, 2):
            assert mlx_sources.metal_syntax(_one(kind, T)) == [], (kind, T)


def test_an_unknown_instantiation_form_is_refused() -> None:
    text = _one("matmul").replace("[[kernel]] decltype(", "[[kernel, something]] decltype(")
    with pytest.raises(ValueError, match="instantiation"):
        mlx_sources.metal_syntax(text)
