"""The open-time check of the fused torch_npu entries: each fused operation runs once on a
probe built from the model's own tensors against its plain version (plain.py), on the same
device; an entry that raises, returns the wrong shape or non-finite values, or differs beyond
its tolerance is refused (Registry.refuse) and runs plain from then on, with one line saying
why. Only runs when fused ops are in use, that is on an NPU (or with a test's stand-in).

Tolerances: the float32 ops (experts, rms_norm, sinkhorn) 1e-4 relative to the plain
result's largest magnitude, like the MLX kernels' self-check; the ops computing in float16
(weight-quantised matmul, W8A8, sparse attention) 1e-2, the float16 rounding of their inputs
and outputs; the discrete ones (routing, indexer selection) must choose exactly the same
experts and rows.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .registry import Registry
from .weights import DeviceWeights, Q8Matrix, W8A8Matrix

TOL = {"linear_q8": 1e-2, "linear_w8a8": 1e-2, "attend": 1e-2, "rms_norm": 1e-4, "experts": 1e-4, "sinkhorn": 1e-4}
EXACT = ("route", "index_select")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _smallest(w: DeviceWeights, kind: type) -> Any:
    found = [m for _, m in w._t.items() if isinstance(m, kind)]
    return min(found, key=lambda m: m.shape[0] * m.shape[1]) if found else None


def probes(w: DeviceWeights) -> dict[str, tuple]:
    """op -> its arguments, on the first stage's device, from the model's tensors where the op
    reads weights (deterministic: a fixed generator)."""
    cfg, dev = w.cfg, w.devices[0]
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dev)

    out: dict[str, tuple] = {}
    for op, kind in (("linear_q8", Q8Matrix), ("linear_w8a8", W8A8Matrix)):
        m = _smallest(w, kind)
        if m is not None:
            out[op] = (rnd(2, m.shape[1]), m)
    out["rms_norm"] = (rnd(2, cfg.n_embd), w.param("blk.0.attn_norm.weight"), cfg.rms_eps)
    layer = next((i for i in range(cfg.n_layer) if not cfg.is_hash_layer(i)), 0)
    p = f"blk.{layer}."
    bias = w.param(p + "exp_probs_b.bias") if w.has(p + "exp_probs_b.bias") else None
    ids = torch.tensor([1, 2], device=dev)
    out["route"] = (rnd(2, cfg.n_expert), bias, None, ids, cfg.n_expert_used, cfg.expert_weights_norm,
                    cfg.expert_weights_scale)
    sel = torch.stack([torch.randperm(cfg.n_expert, generator=g)[: cfg.n_expert_used] for _ in range(2)]).to(dev)
    mats = tuple(w.packed(layer, k) for k in ("gate", "up", "down"))
    out["experts"] = (rnd(2, cfg.n_embd), sel, rnd(2, cfg.n_expert_used).abs(), mats, cfg.swiglu_clamp[layer])
    H, D, N, T = cfg.n_head, cfg.head_dim, 30, 3
    mask = torch.arange(N, device=dev)[None, :] <= torch.arange(N - T, N, device=dev)[:, None]
    out["attend"] = (rnd(H, T, D), rnd(N, D), mask, w.param("blk.0.attn_sinks.weight"))
    C, k = max(40, 2 * cfg.indexer_top_k), cfg.indexer_top_k
    # float16-exact indexer inputs (as QAT's FP4 rows are): the op reads them in float16, and
    # the check is of the selection, not of that rounding.
    h = lambda a: a.half().float()  # noqa: E731
    out["index_select"] = (h(rnd(T, cfg.indexer_n_head, cfg.indexer_head_dim)), h(rnd(C, cfg.indexer_head_dim)),
                           rnd(T, cfg.indexer_n_head), torch.tensor([C - 2, C - 1, C], device=dev), k)
    out["sinkhorn"] = (rnd(2, cfg.hc_count, cfg.hc_count), cfg.hc_eps, cfg.hc_sinkhorn_iters)
    return out


def _compare(op: str, got: Any, want: Any) -> str | None:
    if op == "route":
        if not torch.equal(got[0], want[0]):
            return "chose other experts"
        got, want = got[1], want[1]
    if op == "index_select":
        return None if torch.equal(got, want) else "selected other rows"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if not torch.isfinite(got).all():
        return "non-finite values"
    err = _rel(got.to(torch.float32), want)
    tol = TOL.get(op, 1e-4)
    return None if err <= tol else f"relative error {err:.2e} above {tol:g}"


def check_fused(reg: Registry, w: DeviceWeights) -> list[str]:
    """Run every fused entry on its probe; refuse the failing ones. Returns one phrase per
    refused op ("attend: relative error ... above ...")."""
    refused = []
    cases = probes(w)
    for op in list(reg.fused):
        args = cases.get(op)
        if args is None:  # nothing in this model takes the op (no W8A8 matrices, say)
            continue
        fn: Callable = reg.fused[op]
        try:
            got = fn(reg.npu, *args)
            if got is NotImplemented:  # steps aside on these shapes: the plain version runs
                continue
            why = _compare(op, got, reg.plain(op, *args))
        except Exception as e:  # a launch, a signature or a dtype the installed torch_npu refuses
            why = f"raised {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        if why:
            reg.refuse(op, why)
            refused.append(f"{op}: {why}")
    return refused
