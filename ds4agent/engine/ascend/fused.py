"""Fused torch_npu versions of the heavy operations, called at their documented signatures
(the torch_npu API reference of Ascend/op-plugin; docs/ascend.md lists each op, the
argument mapping, the constraints that make an entry step aside, and where the
documentation was unclear).

Each function takes the ``torch_npu`` module first (tests pass a stand-in that implements
the documented semantics) and returns NotImplemented when a documented constraint does not
hold for these arguments, in which case the registry runs the plain version. Each computes
what its plain counterpart in plain.py defines; where the op works in float16 the
difference is the accuracy cost the open-time check (check.py) bounds.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import plain
from .weights import Packed, Q8Matrix, W8A8Matrix

N_MAX = 65535  # weight-quantised matmul: K and N at most 65535 (the output head is split)
BLOCK = 128  # rows per block of the indexer's paged key layout (a multiple of 16, at most 1024)


def linear_q8(npu: Any, x: torch.Tensor, w) -> Any:
    """Q8_0 x float16 activations: npu_weight_quant_batchmatmul, per-group antiquant with
    groups of 32 along K (the Q8_0 block), weight (K, N) int8 and antiquant_scale
    (K/32, N) float16, both as transposed views of the (N, K) storage. Needs the compact
    codes an NPU load keeps; float16 scales are Q8_0's own, so the weights are exact and the
    cost is the float16 rounding of x and of the output."""
    if not isinstance(w, Q8Matrix) or not w.codes.is_contiguous():
        return NotImplemented
    out, inn = w.shape
    if inn > N_MAX or inn < 64:  # the group size must be a multiple of 32 in [32, K-1]
        return NotImplemented
    xh = x.to(torch.float16)
    parts = []
    for a in range(0, out, N_MAX):
        m = w.rows(a, min(out, a + N_MAX))
        y = npu.npu_weight_quant_batchmatmul(xh, m.codes.reshape(m.shape).t(), m.scales.t(),
                                             antiquant_group_size=32)
        parts.append(y.to(torch.float32))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def linear_w8a8(npu: Any, x: torch.Tensor, w) -> Any:
    """W8A8: npu_dynamic_quant (per-token symmetric int8 of float16 x; its scale is float32
    per token) then npu_quant_matmul(x1 int8 (M, K), x2 int8 (K, N), scale float32 (N,),
    pertoken_scale float32 (M,), output_dtype float16): the A2/A3 table's int8/int8/
    float32/None/None/float32 -> float16 row."""
    if not isinstance(w, W8A8Matrix):
        return NotImplemented
    xq, xs = npu.npu_dynamic_quant(x.to(torch.float16))
    y = npu.npu_quant_matmul(xq, w.q.t(), w.scale, pertoken_scale=xs, output_dtype=torch.float16)
    return y.to(torch.float32)


def rms_norm(npu: Any, x: torch.Tensor, w: torch.Tensor | None, eps: float) -> Any:
    """npu_rms_norm(x, gamma, epsilon) -> (y, rstd), float32 x and gamma (A2/A3). The
    weightless norms (hyper-connection flattening, per-head queries) stay plain."""
    if w is None:
        return NotImplemented
    y, _ = npu.npu_rms_norm(x, w, epsilon=eps)
    return y


def route(npu: Any, logits: torch.Tensor, bias, table, ids: torch.Tensor, k: int, norm: bool, scale: float) -> Any:
    """npu_moe_gating_top_k(x, k, bias=..., k_group=1, group_count=1, group_select_mode=0,
    renorm=0, norm_type=2, out_flag=True, routed_scaling_factor=1.0, eps=1e-20) on the
    top-k layers; the hash-routed layers step aside (their experts are a table lookup, which
    the documented op has no argument for).

    Unclear in the documentation (docs/ascend.md): it lists norm_type 0 (softmax) and 1
    (sigmoid) only, and on A2/A3 256 experts, k_group 4 and a bias; DeepSeek V4 scores with
    sqrt(softplus), passed as norm_type=2 as Ascend's own DeepSeek V4 recipes do. Only the
    expert ids and normOut (the scores, out_flag=True) are used; the weights are computed
    from the scores here, so yOut's normalisation cannot change them, and the open-time check
    (check.py) refuses the entry when the installed op rejects these arguments or chooses
    other experts than the plain version."""
    if table is not None:
        return NotImplemented
    n_exp = logits.shape[1]
    if n_exp > 2048 or not 1 <= k <= 32 or n_exp <= 2:
        return NotImplemented
    _, idx, scores = npu.npu_moe_gating_top_k(logits, k, bias=bias, k_group=1, group_count=1, group_select_mode=0,
                                              renorm=0, norm_type=2, out_flag=True, routed_scaling_factor=1.0,
                                              eps=1e-20)
    sel = idx.to(torch.int64)
    return sel, plain.route_weights(scores.to(torch.float32), sel, norm, scale)


def experts(npu: Any, x: torch.Tensor, sel: torch.Tensor, weights: torch.Tensor, mats: tuple[Packed, Packed, Packed],
            clamp: float) -> Any:
    """The routed FFN as three npu_grouped_matmul calls per group of experts: the slots
    sorted by expert (x rows gathered in that order), group_list the slot count of each
    expert (group_list_type=1, group_type=0: groups along M), weight one (experts, K, N)
    float32 tensor of just the selected experts dequantised on the device, split_item=3 (one
    output tensor). Float32 throughout (supported on A2/A3), so it differs from the plain
    loop only in summation order."""
    gate, up, down = mats
    k = sel.shape[1]
    out = torch.zeros_like(x)
    order, ids, counts, groups = plain.expert_groups(sel, gate.shape[0], 4 * gate.shape[1] * gate.shape[2])
    if max(g1 - g0 for g0, g1, _, _ in groups) > 128:  # list/group limits of the op
        return NotImplemented
    tok = order // k
    w_slot = weights.reshape(-1)[order]
    for g0, g1, s0, s1 in groups:
        e_ids, n = ids[g0:g1], counts[g0:g1].to(torch.int64)
        xs = x.index_select(0, tok[s0:s1])

        def gmm(a: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
            y = npu.npu_grouped_matmul([a], [W.transpose(1, 2)], group_list=n, group_list_type=1, group_type=0,
                                       split_item=3)
            return y[0] if isinstance(y, (list, tuple)) else y

        mid = plain.swiglu(gmm(xs, gate.experts(e_ids)), gmm(xs, up.experts(e_ids)), clamp) * w_slot[s0:s1, None]
        out = out.index_add(0, tok[s0:s1], gmm(mid, down.experts(e_ids)))
    return out


def attend(npu: Any, q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor) -> Any:
    """npu_sparse_flash_attention in MLA-absorb mode (attention_mode=2), TND layouts, with
    sinks (A2/A3; V2 of the op): its query/key are the 512-wide rows (key = value, as in the
    model), query_rope/key_rope zeros of width 64 (they add nothing to the scores), and
    sparse_indices each query's visible rows, padded with -1; sparse_mode=0, so the indices
    alone decide what a query sees. float16 q and keys (cached rows are f16-rounded already,
    so the keys are exact)."""
    H, T, D = q.shape
    if D != 512 or H not in (1, 2, 4, 8, 16, 32, 64, 128):
        return NotImplemented
    width = int(mask.sum(dim=1).max())
    rank = torch.cumsum(mask.to(torch.int32), dim=1) - 1
    idx = torch.full((T, max(1, width)), -1, dtype=torch.int32, device=q.device)
    rows, cols = torch.nonzero(mask, as_tuple=True)
    idx[rows, rank[rows, cols].long()] = cols.to(torch.int32)
    qh = q.transpose(0, 1).contiguous().to(torch.float16)  # (T, H, D)
    kh = keys.to(torch.float16)[:, None, :].contiguous()  # (N, 1, D)
    zq = torch.zeros((T, H, 64), dtype=torch.float16, device=q.device)
    zk = torch.zeros((keys.shape[0], 1, 64), dtype=torch.float16, device=q.device)
    out = npu.npu_sparse_flash_attention(
        qh, kh, kh, idx[:, None, :], 1.0 / math.sqrt(D),
        actual_seq_lengths_query=torch.tensor([T], dtype=torch.int32, device=q.device),
        actual_seq_lengths_kv=torch.tensor([keys.shape[0]], dtype=torch.int32, device=q.device),
        query_rope=zq, key_rope=zk, sparse_block_size=1, layout_query="TND", layout_kv="TND", sparse_mode=0,
        attention_mode=2, sinks=sinks.to(torch.float32))
    out = out[0] if isinstance(out, (list, tuple)) else out
    return out.to(torch.float32).transpose(0, 1)  # (H, T, D)


def index_select(npu: Any, qi: torch.Tensor, keys: torch.Tensor, wi: torch.Tensor, n_vis: torch.Tensor, k: int) -> Any:
    """npu_lightning_indexer with every query its own batch (BSND query (T, 1, Hi, 128),
    actual_seq_lengths_query ones) over one paged copy of the indexer rows (PA_BSND key
    (blocks, 128, 1, 128), every query's block_table the same blocks,
    actual_seq_lengths_key = its visible row count), sparse_mode=0, sparse_count=k. Returns
    the selected rows as the plain version's (T, C) mask (-1 entries are unused slots)."""
    T, Hi, Di = qi.shape
    C = keys.shape[0]
    if Di != 128 or Hi > 64 or not 1 <= k <= 2048:
        return NotImplemented
    n_blk = max(1, -(-C // BLOCK))
    paged = torch.zeros((n_blk * BLOCK, Di), dtype=torch.float16, device=keys.device)
    paged[:C] = keys.to(torch.float16)
    table = torch.arange(n_blk, dtype=torch.int32, device=keys.device).repeat(T, 1)
    idx, _ = npu.npu_lightning_indexer(
        qi.to(torch.float16)[:, None].contiguous(), paged.reshape(n_blk, BLOCK, 1, Di), wi[:, None].contiguous(),
        actual_seq_lengths_query=torch.ones(T, dtype=torch.int32, device=qi.device),
        actual_seq_lengths_key=n_vis.to(torch.int32), block_table=table, layout_query="BSND", layout_key="PA_BSND",
        sparse_count=k, sparse_mode=0)
    idx = idx.reshape(T, k).to(torch.int64)
    valid = idx >= 0
    sel = torch.zeros((T, C + 1), dtype=torch.bool, device=qi.device)
    sel = sel.scatter(1, torch.where(valid, idx, C), True)[:, :C]
    cols = torch.arange(C, device=qi.device)
    visible = cols[None, :] < n_vis[:, None]
    return (sel | (n_vis <= k)[:, None]) & visible


def sinkhorn(npu: Any, M: torch.Tensor, eps: float, iters: int) -> Any:
    """npu_mhc_sinkhorn(x (T, n, n) float32, eps, num_iters, out_flag=0): the same
    iteration as the plain version (Ascend 950; n of 4, 6 or 8). The documentation gives a
    three-tensor result and an example that keeps it whole; either form is accepted."""
    if M.shape[-1] not in (4, 6, 8) or not 1 <= iters <= 100:
        return NotImplemented
    y = npu.npu_mhc_sinkhorn(M.to(torch.float32), eps=eps, num_iters=iters, out_flag=0)
    return y[0] if isinstance(y, (list, tuple)) else y


# registry name -> (fused function, the torch_npu functions it calls)
FUSED = {
    "linear_q8": (linear_q8, ("npu_weight_quant_batchmatmul",)),
    "linear_w8a8": (linear_w8a8, ("npu_dynamic_quant", "npu_quant_matmul")),
    "rms_norm": (rms_norm, ("npu_rms_norm",)),
    "route": (route, ("npu_moe_gating_top_k",)),
    "experts": (experts, ("npu_grouped_matmul",)),
    "attend": (attend, ("npu_sparse_flash_attention",)),
    "index_select": (index_select, ("npu_lightning_indexer",)),
    "sinkhorn": (sinkhorn, ("npu_mhc_sinkhorn",)),
}
