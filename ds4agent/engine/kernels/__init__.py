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
``metal`` and ``cuda`` (custom MLX kernels, see gpu.py).

When the engine selects ``metal`` or ``cuda``, every operation those kernels implement first
runs once on a slice of the real weights against the reference on the same device (check.py);
one that fails to compile, launch or agree is refused and the reference runs it instead, with
a one-line note. DS4_KERNEL_CHECK=0 skips the check.
"""

from __future__ import annotations

from ... import settings
from ..weights import Weights
from .interface import Kernels

CHOICES = ("auto", "reference", "cpu", "cpu-exact", "metal", "cuda")


class KernelError(ValueError):
    """Requested kernels that cannot run here; one line."""


def select(backend: str, weights: Weights, requested: str | None = None) -> tuple[Kernels, str | None]:
    """Kernels for ``backend`` (cpu/metal/cuda). ``requested`` (default: $DS4_KERNELS or auto)
    names an implementation; auto takes the fast one for the backend and falls back to the
    reference with a note (the second value) when it cannot be used."""
    from .reference import ReferenceKernels

    requested = requested or settings.kernels_choice()
    if requested not in CHOICES:
        raise KernelError(f"unknown kernels {requested!r} (choose from {', '.join(CHOICES)})")
    if requested == "reference":
        return ReferenceKernels(weights), None
    want = backend if requested == "auto" else requested.removesuffix("-exact")
    if want != backend:
        raise KernelError(f"{want} kernels need the {want} backend (the engine runs on {backend})")
    try:
        if want == "cpu":
            from .cpu import CpuKernels

            return CpuKernels(weights, exact=requested == "cpu-exact"), None
        from .gpu import GpuKernels

        kernels = GpuKernels(weights, want)
    except Exception as e:  # a compiler, a GPU library or a format the kernels do not cover
        if requested != "auto":
            raise KernelError(f"{want} kernels unavailable: {e}") from None
        return ReferenceKernels(weights), f"{want} kernels unavailable ({e}); using the MLX reference path"
    if not settings.kernel_check_enabled():
        return kernels, None
    from .check import checked

    return checked(kernels, weights)
