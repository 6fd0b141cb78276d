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


def c_source(launch: gpu.Launch, inputs: list[np.ndarray], body: str | None = None, header: str | None = None) -> str:
    """The C translation unit of one launch. ``inputs`` are the kernel's inputs without the
    trailing ``dims`` (added here from the launch); ``body``/``header`` default to gpu.py's."""
    ins, outs, default = gpu.BODIES[launch.kind]
    ins, outs = ins.split(), outs.split()
    if len(ins) - 1 != len(inputs):
        raise ValueError(f"{launch.kind} takes {len(ins) - 1} inputs, got {len(inputs)}")
    inputs = [*inputs, np.asarray(launch.dims, np.int32)]
    params = [f"const {_CTYPES[a.dtype]} *{n}" for n, a in zip(ins, inputs)] + [f"float *{n}" for n in outs]
    defines = "\n".join(f"#define {k} {v}" for k, v in launch.template)
    body = (default if body is None else body).replace("GID", "gid_")
    return (f"#include <stdint.h>\n#include <stddef.h>\n#include <string.h>\n#include <math.h>\n{defines}\n"
            f"{gpu.HEADER if header is None else header}\n"
            f"void run({', '.join(params)}, int64_t n_threads) {{\n"
            f"    for (int64_t gid_ = 0; gid_ < n_threads; gid_++) {{\n{body}\n    }}\n}}\n")


class CompileError(RuntimeError):
    """The host compiler refused a kernel's text."""


def run(launch: gpu.Launch, inputs: list[np.ndarray], body: str | None = None, header: str | None = None) -> np.ndarray:
    """Run one launch's body over its whole grid; ``inputs`` as for c_source."""
    inputs = [np.ascontiguousarray(a) for a in inputs]
    src = c_source(launch, inputs, body, header)
    so = _BUILD / f"{launch.kind}-{hashlib.sha1(src.encode()).hexdigest()[:12]}.so"
    if not so.exists():
        c = _BUILD / (so.stem + ".c")
        c.write_text(src)
        r = subprocess.run([_compiler(), "-O2", "-std=c11", "-fPIC", "-shared", str(c), "-o", str(so), "-lm"],
                           capture_output=True, text=True)
        if r.returncode:
            raise CompileError(r.stderr.strip().splitlines()[0] if r.stderr.strip() else "compile failed")
    lib = ctypes.CDLL(str(so))
    inputs.append(np.asarray(launch.dims, np.int32))
    out = np.zeros(launch.output_shapes[0], dtype=np.float32)
    lib.run.argtypes = [ctypes.c_void_p] * (len(inputs) + 1) + [ctypes.c_int64]
    lib.run(*[a.ctypes.data for a in inputs], out.ctypes.data, launch.grid[0])
    return out


def harness_make(backend: str = "cuda", calls: list | None = None):
    """A stand-in for mx.fast.cuda_kernel / metal_kernel: the kernel object it returns runs
    the text it was given (the GPU thread index turned back into the loop variable) through
    the host C compiler over the whole grid, on MLX arrays, and returns MLX arrays. So
    GpuKernels, its launch plans and argument marshalling, and the self-check around it run
    here for real. ``calls`` (when given) collects every launch: (name, template, inputs'
    (dtype, shape)) - the instantiations the engine used."""

    def make(name: str, input_names: list[str], output_names: list[str], source: str, header: str = "", **_):
        kind = name.removeprefix("ds4_")
        body = source.replace(gpu.GID[backend], "GID")

        def kernel(inputs, grid, threadgroup, output_shapes, output_dtypes, template, **__):
            import mlx.core as mx

            if len(inputs) != len(input_names):
                raise ValueError(f"[custom_kernel] Expected `inputs` to have size {len(input_names)} but got size {len(inputs)}.")
            arrays = [np.array(a) for a in inputs]
            if calls is not None:
                calls.append((name, tuple(template), tuple((str(a.dtype), a.shape) for a in arrays)))
            dims = tuple(int(v) for v in arrays[-1])
            launch = gpu.Launch(kind, tuple(grid), tuple(threadgroup), [tuple(s) for s in output_shapes],
                                list(template), dims)
            return [mx.array(run(launch, arrays[:-1], body, header))]

        return kernel

    return make


def recording_make(calls: list):
    """Like harness_make, but nothing runs: every launch is recorded in ``calls`` and returns
    zeros (for enumerating instantiations on models too large to run here)."""

    def make(name: str, input_names: list[str], output_names: list[str], source: str, header: str = "", **_):
        def kernel(inputs, grid, threadgroup, output_shapes, output_dtypes, template, **__):
            import mlx.core as mx

            calls.append((name, tuple(template), tuple((str(a.dtype).removeprefix("mlx.core."), a.shape) for a in inputs)))
            return [mx.zeros(tuple(output_shapes[0]), dtype=mx.float32)]

        return kernel

    return make


def launches_of(path, backend: str = "cuda") -> list:
    """Every kernel launch GpuKernels can make on the model at ``path``: each dense matrix of
    a kernel type at 1..DECODE_MAX_T tokens (whole, and in groups where the model asks for
    them), each layer's routed experts at 1..DECODE_MAX_T tokens, decode attention over 1 to
    300 visible rows. Weights are not read (the raw bytes are stand-ins). Returns the recorded
    calls (see harness_make); instantiations are what these differ in besides sizes."""
    import mlx.core as mx

    from ds4agent.engine import Engine

    calls: list = []
    with Engine.open(path, backend="cpu", kernels="reference") as e:
        k = gpu.GpuKernels(e._model.w, backend, make=recording_make(calls))
        k._bytes = lambda name: mx.zeros((64,), dtype=mx.uint8)
        cfg, f = e.info.config, e._file
        rng = np.random.default_rng(0)
        for T in range(1, gpu.DECODE_MAX_T + 1):
            for name, t in f.tensors.items():
                if len(t.shape) == 2 and t.type in gpu.KERNEL_TYPES and name != "token_embd.weight":
                    k.linear(mx.zeros((T, t.shape[1])), name)
                    if name.endswith("attn_output_a.weight"):
                        G = cfg.n_out_group
                        k.grouped(mx.zeros((T, G, t.shape[1])), name)
            for layer in range(cfg.n_layer):
                sel = np.stack([rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False) for _ in range(T)])
                k.experts(layer, mx.zeros((T, cfg.n_embd)), sel, mx.ones((T, cfg.n_expert_used)), 10.0)
        for V in (*range(1, 10), 64, 300):
            mask = np.zeros((1, 300), bool)
            mask[0, :V] = True
            k.attend(mx.zeros((cfg.n_head, 1, cfg.head_dim)), mx.zeros((300, cfg.head_dim)), mask,
                     mx.zeros((cfg.n_head,)))
    return calls
