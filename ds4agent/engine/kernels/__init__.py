"""Kernels: the few products that dominate a token, behind one interface.

Every implementation provides the same operations (see ReferenceKernels for the exact
definitions); the model calls nothing else for its heavy work:

* ``linear(x, name, rows=None, cols=None)``: activations times a GGUF weight matrix (or a row
  range of it; or, x holding only those input columns, a column range: a partial product);
* ``linears(x, names)``: the same for several matrices sharing the input x, in one call;
* ``grouped(x, name)``: the attention output projection, group g through its own rows;
* ``experts(layer, x, sel, weights, clamp)``: the fused routed-expert FFN of one layer;
* ``attend(q, keys, mask, sinks)``: softmax attention with per-head sinks over shared K=V rows;
* ``matmul(a, b)``: a product of two activation tensors (indexer scores);
* ``queries`` / ``unrotate``: the per-head layout around attention (norm and RoPE of the
  queries into (H, T, D); the outputs rotated back and grouped for the output projection);
* ``kv_round`` / ``indexer_round``: the FP8 / FP4 simulation of cached rows (engine/qat.py);
* ``hc_pre`` / ``hc_post``: the hyper-connection mix around each sublayer (hundreds of tiny
  ops in MLX; one call each in the CPU kernels).

Implementations: ``reference`` (MLX ops, any device); ``cpu`` (cpu.c: native SIMD + OpenMP,
weights read in place from the mmap, activations rounded to 8 bits per block of 32 for
integer dot products wherever the weight is quantised) and ``cpu-exact`` (the same with float32 activations throughout);
``metal`` and ``cuda`` (our custom MLX kernels, gpu.py); ``kquant`` (mlx-kquant's kernels on the
same raw GGUF bytes, kquant.py; Metal, or MLX's CPU stream); ``gpu-host`` (gpu.py's bodies
compiled for the host, gpu_host.py: the GPU arithmetic on any machine, for tests and diagnosis).

When the engine selects ``metal``, ``cuda``, ``kquant`` or ``gpu-host``, every operation those
kernels implement first runs once on a slice of the real weights against the reference on the
same device (check.py); one that fails to compile, launch or agree is refused and the reference
runs it instead, with a one-line note. DS4_KERNEL_CHECK=0 skips the check.
"""

from __future__ import annotations

from ... import settings
from ..choices import KERNELS
from ..weights import Weights
from .interface import Kernels

CHOICES = KERNELS  # what --kernels and $DS4_KERNELS may name (engine/choices.py)


class KernelError(ValueError):
    """Requested kernels that cannot run here; one line."""


# The fast implementations auto weighs on each backend, best first; the Metal pair is decided by
# the self-check's timing (check.choose). mlx-kquant is optional: auto passes over it in silence
# when it is not installed.
AUTO = {"cpu": ("cpu",), "metal": ("metal", "kquant"), "cuda": ("cuda",)}
BACKEND_OF = {"cpu": ("cpu",), "cpu-exact": ("cpu",), "metal": ("metal",), "cuda": ("cuda",),
              "kquant": ("metal", "cpu"), "gpu-host": ("cpu", "metal", "cuda")}


def _build(which: str, weights: Weights) -> Kernels:
    if which in ("cpu", "cpu-exact"):
        from .cpu import CpuKernels

        return CpuKernels(weights, exact=which == "cpu-exact")
    if which == "gpu-host":
        from .gpu_host import HostGpuKernels

        return HostGpuKernels(weights)
    if which == "kquant":
        from .kquant import KquantKernels

        return KquantKernels(weights)
    from .gpu import GpuKernels

    return GpuKernels(weights, which)


def like(kernels: Kernels, weights: Weights) -> Kernels:
    """The implementation ``kernels`` is, built over other weights (an MTP block beside its
    target, engine/mtp.py). Not checked again: the target's kernels passed the check at open."""
    if kernels.name == "reference":
        from .reference import ReferenceKernels

        return ReferenceKernels(weights)
    return _build(kernels.name, weights)


def select(backend: str, weights: Weights, requested: str | None = None) -> tuple[Kernels, str | None]:
    """Kernels for ``backend`` (cpu/metal/cuda). ``requested`` (default: $DS4_KERNELS or auto)
    names an implementation; auto takes the fast one for the backend (on Metal, of ours and
    mlx-kquant's, the one the self-check finds correct and faster) and falls back to the
    reference with a note (the second value) when none can be used."""
    from .reference import ReferenceKernels

    requested = requested or settings.kernels_choice()
    if requested not in CHOICES:
        raise KernelError(f"unknown kernels {requested!r} (choose from {', '.join(CHOICES)})")
    if requested == "reference":
        return ReferenceKernels(weights), None
    if requested != "auto" and backend not in BACKEND_OF[requested]:
        need = " or ".join(BACKEND_OF[requested])
        raise KernelError(f"{requested} kernels need the {need} backend (the engine runs on {backend})")
    built, notes = [], []
    for which in AUTO[backend] if requested == "auto" else (requested,):
        if weights.pool is not None and which == "kquant" and requested == "auto":
            continue  # its gather kernels read whole expert tensors: not with experts streaming
        try:
            built.append(_build(which, weights))
        except ImportError as e:
            if requested != "auto":
                raise KernelError(f"{which} kernels unavailable: {e} (see README, 'Kernels')") from None
        except Exception as e:  # a compiler, a GPU library or a format the kernels do not cover
            if requested != "auto":
                raise KernelError(f"{which} kernels unavailable: {e}") from None
            notes.append(f"{which} kernels unavailable ({e})")
    if not built:
        return ReferenceKernels(weights), "; ".join(notes) + "; using the MLX reference path"
    if built[0].name in ("cpu", "cpu-exact") or not settings.kernel_check_enabled():
        return built[0], "; ".join(notes) or None
    from .check import choose

    chosen, note = choose(built, weights)
    return chosen, "; ".join([*notes, *([note] if note else [])]) or None
