"""Run the GPU kernel bodies (engine/kernels/gpu.py) on the CPU.

Each body is compiled by the host C compiler inside a loop over its whole grid, with the
launch's template constants as #defines and the same HEADER the GPU compilers see. One thread
per output value and no cross-thread communication make this loop exactly the computation a
GPU launch performs, so the kernels' arithmetic is tested here without a GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ds4agent.engine.kernels import gpu
from ds4agent.engine.kernels.cpu_build import _compiler

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.uint8): "uint8_t", np.dtype(np.int32): "int32_t"}
_BUILD = Path(tempfile.mkdtemp(prefix="ds4-gpu-harness-"))


def c_source(launch: gpu.Launch, inputs: list[np.ndarray]) -> str:
    ins, outs, body = gpu.BODIES[launch.kind]
    ins, outs = ins.split(), outs.split()
    if len(ins) != len(inputs):
        raise ValueError(f"{launch.kind} takes {len(ins)} inputs, got {len(inputs)}")
    params = [f"const {_CTYPES[a.dtype]} *{n}" for n, a in zip(ins, inputs)] + [f"float *{n}" for n in outs]
    defines = "\n".join(f"#define {k} {v}" for k, v in launch.template)
    return (f"#include <stdint.h>\n#include <stddef.h>\n#include <string.h>\n#include <math.h>\n{defines}\n"
            f"{gpu.HEADER}\n"
            f"void run({', '.join(params)}, int64_t n_threads) {{\n"
            f"    for (int64_t gid_ = 0; gid_ < n_threads; gid_++) {{\n{body.replace('GID', 'gid_')}\n    }}\n}}\n")


def run(launch: gpu.Launch, inputs: list[np.ndarray]) -> np.ndarray:
    inputs = [np.ascontiguousarray(a) for a in inputs]
    src = c_source(launch, inputs)
    so = _BUILD / f"{launch.kind}-{hashlib.sha1(src.encode()).hexdigest()[:12]}.so"
    if not so.exists():
        c = _BUILD / (so.stem + ".c")
        c.write_text(src)
        subprocess.run([_compiler(), "-O2", "-std=c11", "-fPIC", "-shared", str(c), "-o", str(so), "-lm"],
                       check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    out = np.zeros(launch.output_shapes[0], dtype=np.float32)
    lib.run.argtypes = [ctypes.c_void_p] * (len(inputs) + 1) + [ctypes.c_int64]
    lib.run(*[a.ctypes.data for a in inputs], out.ctypes.data, launch.grid[0])
    return out


_CUDA_TYPES = {"float": "float", "uint8_t": "uint8_t", "int32_t": "int32_t"}


def cuda_unit(plans: dict[str, tuple[gpu.Launch, list[str]]]) -> str:
    """A CUDA translation unit laid out the way mx.fast.cuda_kernel lays out its JIT source
    (default includes, our header, one templated __global__ function per kernel with the
    inputs then outputs as parameters), instantiated with each launch's template values, so
    nvcc can compile exactly the text the GPU would receive. ``plans`` maps kernel kind to
    (launch, input C types)."""
    parts = ["#include <cstdint>\n#include <cstddef>\n#include <cooperative_groups.h>\n", gpu.HEADER]
    for kind, (launch, types) in plans.items():
        ins, outs, body = gpu.source(kind, "cuda")
        params = [f"const {t}* {n}" for n, t in zip(ins, types)] + [f"float* {n}" for n in outs]
        tparams = ", ".join(f"int {k}" for k, _ in launch.template)
        targs = ", ".join(str(v) for _, v in launch.template)
        parts.append(f"template <{tparams}>\n__global__ void ds4_{kind}({', '.join(params)}) {{\n{body}\n}}\n"
                     f"template __global__ void ds4_{kind}<{targs}>({', '.join(params)});\n")
    return "\n".join(parts)
