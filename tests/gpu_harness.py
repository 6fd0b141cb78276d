"""The GPU kernels (engine/kernels/gpu.py) without a GPU: their bodies run on the host through
engine/kernels/gpu_host.py (the same code ``--kernels gpu-host`` uses), and launches can be
recorded without running anything, to enumerate every kernel instantiation the engine can use
on a model (for the compile tests and the self-check's coverage).
"""

from __future__ import annotations

import numpy as np

from ds4agent.engine.kernels import gpu
from ds4agent.engine.kernels.gpu_host import CompileError, c_source, host_make, run  # noqa: F401 (re-exported)


def harness_make(backend: str = "cuda", calls: list | None = None):
    """mx.fast.cuda_kernel / metal_kernel stood in for by the host compiler (gpu_host.host_make)
    for kernels built with ``backend``'s spelling of the thread index."""
    return host_make(backend, calls)


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


class Recording(gpu.GpuKernels):
    """GpuKernels that records its launches and reads no weights (stand-in bytes)."""

    def __init__(self, weights, backend: str, calls: list) -> None:
        super().__init__(weights, backend, make=recording_make(calls))

    def _bytes(self, name: str):
        import mlx.core as mx

        return mx.zeros((64,), dtype=mx.uint8)


# Token counts that reach every tile width (1, 2, 4, 8), a partial last tile, and small and
# large slot arrays (fewer or more than 8 elements: Metal's constant or device memory).
TOKEN_COUNTS = (1, 2, 3, 5, 9, 40)


def expert_choices(rng: np.random.Generator, n_expert: int, k: int, T: int) -> list[np.ndarray]:
    """Expert choices (T, k) a batch can make, reaching every tile width: distinct random
    experts per token, and every token choosing the same k (then an expert has T slots)."""
    spread = np.stack([rng.choice(n_expert, k, replace=False) for _ in range(T)])
    same = np.broadcast_to(rng.choice(n_expert, k, replace=False), (T, k))
    return [spread, np.ascontiguousarray(same)]


def launches_of(path, backend: str = "cuda") -> list:
    """Every kernel launch GpuKernels can make on the model at ``path``: each dense matrix of
    a kernel type at TOKEN_COUNTS tokens (whole, and in groups where the model asks for them),
    each layer's hyper-connection mix and routed experts at TOKEN_COUNTS tokens (expert_choices),
    decode attention over
    1 to 300 visible rows. Weights are not read (the raw bytes are stand-ins). Returns the
    recorded calls: (name, template, inputs' (dtype, shape)); instantiations are what these
    differ in besides sizes."""
    import mlx.core as mx

    from ds4agent.engine import Engine

    calls: list = []
    with Engine.open(path, backend="cpu", kernels="reference") as e:
        k = Recording(e.model.w, backend, calls)
        cfg, f = e.info.config, e.file
        rng = np.random.default_rng(0)
        for T in TOKEN_COUNTS:
            for name, t in f.tensors.items():
                if len(t.shape) == 2 and t.type in gpu.KERNEL_TYPES and name != "token_embd.weight" \
                        and "tid2eid" not in name and "_ape." not in name:
                    k.linear(mx.zeros((T, t.shape[1])), name)
                    if name.endswith("attn_output_a.weight"):
                        G = cfg.n_out_group
                        k.grouped(mx.zeros((T, G, t.shape[1])), name)
            for layer in range(cfg.n_layer):
                k.hc_pre(mx.zeros((T, cfg.hc_count, cfg.n_embd)), f"blk.{layer}.hc_attn_fn.weight", mx.zeros((3,)),
                         mx.zeros(((2 + cfg.hc_count) * cfg.hc_count,)))
                for sel in expert_choices(rng, cfg.n_expert, cfg.n_expert_used, T):
                    k.experts(layer, mx.zeros((T, cfg.n_embd)), sel, mx.ones(sel.shape), 10.0)
        for V in (*range(1, 10), 64, 300):
            mask = np.zeros((1, 300), bool)
            mask[0, :V] = True
            k.attend(mx.zeros((cfg.n_head, 1, cfg.head_dim)), mx.zeros((300, cfg.head_dim)), mask,
                     mx.zeros((cfg.n_head,)))
    return calls
