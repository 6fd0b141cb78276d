"""What the GPU kernels keep on the device: the raw GGUF bytes of each tensor they read, once,
and the plan of what that will amount to, checked at open against what the device may hold.

Both GPU kernel sets (gpu.py, kquant.py) read the tensors' packed bytes as they are in the file:
``DeviceTensors`` copies a tensor to the device the first time a kernel asks for it and lets
the file's pages of it go (on a Mac the GPU shares the memory, so keeping them would hold the
weights twice). Decode and prefill read the same copy; nothing is repacked beside it.

``plan`` adds up what will be resident after the first tokens of a session at the engine's
context: every matrix and routed-expert tensor the kernels read, the small tensors the model
reads through Weights.get (norms, biases, scales, sinks; the F16 matrices the kquant kernels
leave to MLX), the KV state at that context (engine/state.py's payload size), and a working
margin for one prefill chunk. ``check`` compares it with the device's limit
(``mx.device_info``: Metal's recommended working set, CUDA's total memory) and refuses with one
line saying how much is missing, so a model that cannot fit fails at open, not an hour into a
prompt. The embedding and the hash-routing tables are never copied: rows are gathered from the
mmap on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np

from ...modelfile.config import ModelConfig
from ...modelfile.gguf import GGUFFile
from ..state import payload_size

GiB = 1 << 30
# One prefill chunk's temporaries on the device: attention scores in blocks of at most 256 MiB
# (reference.ATTEND_BLOCK_BYTES, three arrays of them), the expert kernels' partial sums (at
# most 256 tokens x 6 slots x 2048 x 2 floats), the logits, and the allocator's slack.
WORKING_BYTES = 2 * GiB
HOST_ONLY = ("token_embd.weight", "_tid2eid.")  # gathered row by row from the mmap


class DeviceMemoryError(ValueError):
    """The model does not fit the device; one line."""


class DeviceTensors:
    """Raw tensor bytes on the device, one array per tensor, made on first use."""

    def __init__(self, f: GGUFFile, to_device: Callable[[np.ndarray], object], shape: str = "flat") -> None:
        """``shape``: "flat" (one uint8 row of all the bytes) or "rows" (the file's logical rows:
        (rows, row bytes), experts (n_expert, rows, row bytes))."""
        self.file = f
        self._to_device = to_device
        self._shape = shape
        self._arrays: dict[str, object] = {}

    def get(self, name: str):
        a = self._arrays.get(name)
        if a is None:
            view = np.asarray(self.file.array(name)).view(np.uint8)
            t = self.file.tensors[name]
            view = view.reshape(-1) if self._shape == "flat" else view.reshape(*t.shape[:-1], t.row_bytes)
            a = self._arrays[name] = self._to_device(view)
            self.file.release_pages(name)
        return a

    def drop(self, experts: bool, dense: bool) -> None:
        """Forget the copies of the routed-expert tensors and/or of every other tensor (what a
        refused kernel would have read: the self-check's refuse() calls this through the
        kernels' release())."""
        for name in [n for n in self._arrays if ("_exps." in n and experts) or ("_exps." not in n and dense)]:
            del self._arrays[name]

    def nbytes(self) -> int:
        return sum(int(getattr(a, "nbytes", 0)) for a in self._arrays.values())

    def names(self) -> set[str]:
        """The tensors held now."""
        return set(self._arrays)


@dataclass(frozen=True)
class Residency:
    """Bytes the engine will hold on the device (see the module's docstring)."""

    dense: int  # matrices and small tensors the model reads on the device
    experts: int  # routed-expert tensors
    kv: int  # the KV state at ``ctx`` tokens
    working: int
    ctx: int
    largest: tuple[str, int]  # the biggest single tensor (one device buffer each)
    pooled: bool = False  # ``experts`` is the expert pool's slots, not every routed expert

    @property
    def total(self) -> int:
        return self.dense + self.experts + self.kv + self.working

    def describe(self) -> str:
        experts = "expert pool" if self.pooled else "routed experts"
        return (f"{_gib(self.dense)} dense weights + {_gib(self.experts)} {experts} + {_gib(self.kv)} KV at "
                f"{self.ctx} tokens + {_gib(self.working)} working = {_gib(self.total)}")


def plan(f: GGUFFile, cfg: ModelConfig, ctx: int, pool: int | None = None) -> Residency:
    """What the device will hold; ``pool``: the bytes of an expert pool in device memory, which
    then stands in for the routed-expert tensors (none of them is copied)."""
    dense = experts = 0
    largest = ("", 0)
    for name, t in f.tensors.items():
        if any(h in name for h in HOST_ONLY):
            continue
        if "_exps." in name:
            experts += t.nbytes
        else:
            # Small tensors go through Weights.get as float32 when stored as F32 (the same
            # bytes) and stay F16 when F16: their file size is what the device holds.
            dense += t.nbytes
        if t.nbytes > largest[1] and not ("_exps." in name and pool is not None):
            largest = (name, t.nbytes)
    if pool is not None:
        experts = pool
        if pool > largest[1]:
            largest = ("the expert pool", pool)
    return Residency(dense, experts, payload_size(cfg, ctx), WORKING_BYTES, ctx, largest, pool is not None)


def device_buffer(nbytes: int) -> tuple[np.ndarray, mx.array]:
    """``nbytes`` of device memory that the host writes in place and the GPU kernels read: (a
    writable uint8 view of it, the MLX array that owns it). The expert pool's slots
    (engine/expertpool.py): reads from the model file land where the kernels read them, with no
    second copy in host memory. MLX's Metal buffers are shared with the CPU, and its CUDA
    allocator hands out managed memory, so the host's view is the device's bytes; that is
    checked here (a byte written by the host must be what a device operation reads), and
    DeviceMemoryError says so when an MLX build keeps its arrays elsewhere."""
    a = mx.zeros((nbytes,), dtype=mx.uint8)
    mx.eval(a)
    try:
        view = np.array(a, copy=False)
    except (ValueError, TypeError) as e:
        raise DeviceMemoryError(f"this MLX build gives no host view of device memory ({e}); experts cannot stream "
                                "to the GPU") from None
    if view.size != nbytes or not view.flags.writeable:
        raise DeviceMemoryError("this MLX build's device memory is not writable from the host; experts cannot "
                                "stream to the GPU")
    view[0], view[-1] = 0xA5, 0x5A
    seen = int((a[:1].astype(mx.int32) * 256 + a[-1:].astype(mx.int32)).item())
    view[0] = view[-1] = 0
    if seen != 0xA55A:
        raise DeviceMemoryError("the host's view of device memory is not what the device reads; experts cannot "
                                "stream to the GPU")
    return view, a


def device_limits(backend: str) -> tuple[int | None, int | None, str]:
    """(bytes the device may hold, largest single buffer, what the first number is) for the
    default GPU; (None, None, ...) when MLX does not say."""
    try:
        info = mx.device_info(mx.gpu)
    except Exception:  # an MLX without device_info, or no GPU
        return None, None, ""
    buffer = info.get("max_buffer_length")
    if backend == "metal" and info.get("max_recommended_working_set_size"):
        return int(info["max_recommended_working_set_size"]), int(buffer) if buffer else None, \
            "Metal's recommended working set"
    if info.get("total_memory"):
        return int(info["total_memory"]), int(buffer) if buffer else None, "the GPU's memory"
    return None, None, ""


def check(r: Residency, limit: int | None, buffer: int | None, what: str, backend: str) -> str:
    """The line said at open (what will be resident against the limit), or DeviceMemoryError when it
    does not fit."""
    if buffer and r.largest[1] > buffer:
        raise DeviceMemoryError(f"{r.largest[0]} is {_gib(r.largest[1])}, more than one {backend} buffer may hold "
                           f"({_gib(buffer)})")
    if limit is None:
        return f"on the {backend} device: {r.describe()} (the device's limit is unknown)"
    if r.total > limit:
        short = r.total - limit
        hint = " (a smaller --ctx frees KV)" if r.kv >= short else ""
        raise DeviceMemoryError(f"the model does not fit the {backend} device: it needs {r.describe()}, "
                           f"{_gib(short)} more than {what} ({_gib(limit)}){hint}")
    return f"on the {backend} device: {r.describe()} of {_gib(limit)} ({what})"


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"
