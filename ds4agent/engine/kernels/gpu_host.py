"""The GPU kernels' bodies run on the host: ``--kernels gpu-host`` (also DS4_KERNELS=gpu-host).

Each body of gpu.py is compiled by the host C compiler inside a loop over its whole grid, with
the launch's template constants as #defines and the same HEADER the GPU compilers see (its C
branch). The kernels share nothing between threads, so this loop computes exactly what a GPU
launch computes; it runs the iterations on every core with OpenMP where the compiler has it
(their order cannot matter: each writes its own outputs). ``HostGpuKernels`` is GpuKernels
with this stand-in for mx.fast.metal_kernel / cuda_kernel, so the launch plans, the argument
marshalling, the expert plans and the self-check run for real on machines without a GPU: the
tests run the whole model through it, and a user can compare it with ``--kernels reference``
when a GPU result looks wrong. It is slow (scalar C, one launch at a time): for diagnosis, not
for use.

The weights are read in place from the model file's mmap: nothing is copied for the host.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np

from ... import settings
from ..weights import Weights
from . import gpu
from .cpu_build import CompileFailed, compile_shared, compiler

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.uint8): "uint8_t", np.dtype(np.int32): "int32_t"}
FLAGS = ["-O2", "-std=c11", "-ffp-contract=off", "-fPIC", "-shared"]


class CompileError(RuntimeError):
    """The host compiler refused a kernel's text (the first line it printed)."""


def c_source(kind: str, template: list[tuple[str, int]], dtypes: list[np.dtype], body: str | None = None,
             header: str | None = None) -> str:
    """The C translation unit of one kernel instantiation: ``dtypes`` are those of its inputs,
    ``dims`` included; ``body``/``header`` default to gpu.py's."""
    ins, outs, default = gpu.BODIES[kind]
    ins, outs = ins.split(), outs.split()
    if len(ins) != len(dtypes):
        raise ValueError(f"{kind} takes {len(ins) - 1} inputs, got {len(dtypes) - 1}")
    params = [f"const {_CTYPES[np.dtype(d)]} *{n}" for n, d in zip(ins, dtypes)] + [f"float *{n}" for n in outs]
    defines = "\n".join(f"#define {k} {v}" for k, v in template)
    text = (default if body is None else body).replace("GID", gpu.GID["host"])
    return (f"#include <stdint.h>\n#include <stddef.h>\n#include <string.h>\n#include <math.h>\n{defines}\n"
            f"{gpu.HEADER if header is None else header}\n"
            f"void run({', '.join(params)}, int64_t n_threads) {{\n"
            f"    #pragma omp parallel for schedule(static)\n"
            f"    for (int64_t gid_ = 0; gid_ < n_threads; gid_++) {{\n{text}\n    }}\n}}\n")


def _build_dir() -> Path:
    d = settings.kernels_dir() / "gpu-host"
    d.mkdir(parents=True, exist_ok=True)
    return d


_LIBS: dict[str, ctypes.CDLL] = {}


def compile_source(src: str) -> ctypes.CDLL:
    """Compile (once per text, cached under the kernels folder) and load one kernel's C."""
    key = hashlib.sha1(src.encode()).hexdigest()[:16]
    lib = _LIBS.get(key)
    if lib is not None:
        return lib
    cc = compiler()
    if cc is None:
        raise CompileError("no C compiler found (install gcc or clang, or set CC)")
    d = _build_dir()
    so = d / f"{key}.so"
    if not so.exists():
        c = d / f"{key}.c"
        c.write_text(src)
        for extra in (["-fopenmp"], []):  # without OpenMP (e.g. Apple clang) the loop runs on one core
            try:
                compile_shared(cc, [*FLAGS, *extra], c, so)
                break
            except CompileFailed as e:
                if not extra or "omp" not in e.log:  # the text itself is wrong: say its first complaint
                    raise CompileError(e.log.splitlines()[0] if e.log else str(e)) from None
    lib = _LIBS[key] = ctypes.CDLL(str(so))
    return lib


def run(launch: gpu.Launch, inputs: list[np.ndarray], body: str | None = None, header: str | None = None) -> np.ndarray:
    """Run one launch's body over its whole grid; ``inputs`` without the trailing ``dims``
    (added here from the launch), as numpy arrays."""
    arrays = [np.ascontiguousarray(a) for a in inputs] + [np.asarray(launch.dims, np.int32)]
    lib = compile_source(c_source(launch.kind, launch.template, [a.dtype for a in arrays], body, header))
    out = np.zeros(launch.output_shapes[0], dtype=np.float32)
    lib.run.argtypes = [ctypes.c_void_p] * (len(arrays) + 1) + [ctypes.c_int64]
    lib.run(*[a.ctypes.data for a in arrays], out.ctypes.data, launch.grid[0])
    return out


def host_make(backend: str = "host", calls: list | None = None) -> Callable:
    """A stand-in for mx.fast.metal_kernel / cuda_kernel: the kernel object it returns runs the
    text it was given (``backend``'s thread index turned back into the loop variable) through
    the host C compiler over the whole grid, on MLX or numpy inputs, and returns MLX arrays.
    ``calls`` (when given) collects every launch: (name, template, inputs' (dtype, shape))."""

    def make(name: str, input_names: list[str], output_names: list[str], source: str, header: str = "", **_):
        kind = name.removeprefix("ds4_")
        body = source.replace(gpu.GID[backend], "GID")

        def kernel(inputs, grid, threadgroup, output_shapes, output_dtypes, template, **__):
            if len(inputs) != len(input_names):
                raise ValueError(f"[custom_kernel] Expected `inputs` to have size {len(input_names)} but got size "
                                 f"{len(inputs)}.")
            arrays = [a if isinstance(a, np.ndarray) else np.array(a) for a in inputs]
            if calls is not None:
                calls.append((name, tuple(template), tuple((str(a.dtype), a.shape) for a in arrays)))
            dims = tuple(int(v) for v in arrays[-1])
            launch = gpu.Launch(kind, tuple(grid), tuple(threadgroup), [tuple(s) for s in output_shapes],
                                list(template), dims)
            return [mx.array(run(launch, arrays[:-1], body, header))]

        return kernel

    return make


class HostGpuKernels(gpu.GpuKernels):
    """GpuKernels whose launches run on the host (see the module's docstring)."""

    def __init__(self, weights: Weights, make: Callable | None = None) -> None:
        super().__init__(weights, "host", make or host_make())
        self.name = "gpu-host"

    def _to_device(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def _pool_memory(self, pool) -> np.ndarray:
        """The expert pool's memory in place: its device array when it has one (read through
        MLX, as a GPU would), else the host mapping itself."""
        backing = pool.backing
        return backing if isinstance(backing, mx.array) else pool.memory

    def _bytes(self, name: str) -> np.ndarray:
        """The tensor's bytes viewed in the mmap: the host reads them in place (and keeps the
        file's pages, which are all there is)."""
        return self.w.file.array(name).view(np.uint8).reshape(-1)
