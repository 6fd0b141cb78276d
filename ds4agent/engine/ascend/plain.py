"""The plain-torch versions of the heavy operations: the definition every fused NPU entry of
the registry (registry.py) is checked against, and what runs wherever no fused op applies
(on the host, in the tests, on cards whose torch_npu lacks an op).

Float32 throughout, on the device the inputs are on; the mathematics is docs/model.md §3,
line for line the same as the MLX reference path (engine/model.py, engine/ops.py,
engine/kernels/reference.py), so the two engines agree to float rounding (tests).
"""

from __future__ import annotations

import math

import torch

from .weights import EXPERT_KINDS, ROW_TILE_BYTES, Packed, Q8Matrix, W8A8Matrix

ROUTE_WEIGHT_FLOOR = 6.103515625e-5  # 2^-14: floor of the sum of selected router scores (§3.7)
ATTEND_BLOCK_BYTES = 1 << 28  # the largest float32 score array attention makes at once
EXPERT_GROUP_BYTES = 1 << 28  # float32 bytes of one kind's dequantised experts at once
# Row tile of a dense product: the tile is expanded to float32 and multiplied at once, and one
# that stays in cache is the fast size. On host torch the demo's output head (129 280 x 256
# Q8_0) took 0.89 s per decoded token in 64 MiB tiles and 0.12 s in 2 MiB ones; each output
# column is its own dot product, so the tile changes no result.
PRODUCT_TILE_BYTES = 2 * 1024**2


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """x (T, in) @ Wᵀ for a Q8_0, W8A8 or dense (F16/F32) matrix (out, in), dequantised in
    row tiles of PRODUCT_TILE_BYTES (the output head alone is 2.1 GB as float32)."""
    if isinstance(w, W8A8Matrix):
        return linear_w8a8(x, w)
    out, inn = w.shape
    step = max(1, PRODUCT_TILE_BYTES // (4 * inn))
    if out <= step:
        return x @ _dense(w).T
    return torch.cat([x @ _dense(_rows(w, a, min(out, a + step))).T for a in range(0, out, step)], dim=-1)


def _rows(w, a: int, b: int):
    return w.rows(a, b) if isinstance(w, (Q8Matrix, W8A8Matrix)) else w[a:b]


def _dense(w) -> torch.Tensor:
    return w.dequantized() if isinstance(w, Q8Matrix) else w.to(torch.float32)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token int8: scale = max|row| / 127 (1 for a zero row), codes =
    round-half-even(x / scale) in [-127, 127]. Returns (codes as int8, scales (T,))."""
    amax = x.abs().amax(dim=-1)
    s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 (T, K) @ int8 (N, K)ᵀ as int32: float32 partial products over K-slices of
    1024 are exact integers (|sum| <= 127²·1024 < 2²⁴) and are summed in int32."""
    K = a.shape[-1]
    acc = None
    for k in range(0, K, 1024):
        part = (a[:, k : k + 1024].to(torch.float32) @ b[:, k : k + 1024].to(torch.float32).T).to(torch.int32)
        acc = part if acc is None else acc + part
    return acc


def linear_w8a8(x: torch.Tensor, w: W8A8Matrix) -> torch.Tensor:
    """The W8A8 product: activations quantised per token, weights per output channel, the
    exact integer dot products scaled by both."""
    xq, xs = quantize_tokens(x)
    out, inn = w.shape
    step = max(1, ROW_TILE_BYTES // (4 * inn))
    parts = [int_matmul(xq, w.q[a : a + step]).to(torch.float32) * w.scale[a : a + step][None, :]
             for a in range(0, out, step)]
    return torch.cat(parts, dim=-1) * xs[:, None]


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if w is None else y * w


def swiglu(g: torch.Tensor, u: torch.Tensor, clamp: float) -> torch.Tensor:
    """The clamped SwiGLU: gate clamped from above only, up on both sides (§3.7)."""
    g = torch.clamp(g, max=clamp)
    u = torch.clamp(u, -clamp, clamp)
    return g * torch.sigmoid(g) * u


def router_scores(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(softplus(z)) in ds4's piecewise form (z above 20: z; below -20: e^z)."""
    ex = torch.exp(torch.clamp(logits, max=20.0))
    return torch.sqrt(torch.where(logits > 20, logits, torch.where(logits < -20, ex, torch.log1p(ex))))


def route_weights(prob: torch.Tensor, sel: torch.Tensor, norm: bool, scale: float) -> torch.Tensor:
    """The unbiased scores of the chosen experts, divided by max(their sum, 2^-14), times the
    routed scale (§3.7)."""
    chosen = torch.gather(prob, 1, sel)
    if norm:
        chosen = chosen / torch.clamp(chosen.sum(dim=1, keepdim=True), min=ROUTE_WEIGHT_FLOOR)
    return chosen * scale


def route(logits: torch.Tensor, bias: torch.Tensor | None, table: torch.Tensor | None, ids: torch.Tensor, k: int,
          norm: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gating top-k: (experts (T, k) int64, weights (T, k)). Hash layers take the experts
    from ``table`` at the token ids; the others the k largest of score + bias, ties to the
    lower expert (a stable descending sort)."""
    prob = router_scores(logits)
    if table is not None:
        sel = table.index_select(0, ids).to(torch.int64)
    else:
        biased = prob + bias if bias is not None else prob
        sel = torch.sort(biased, dim=1, descending=True, stable=True).indices[:, :k]
    return sel, route_weights(prob, sel, norm, scale)


def expert_groups(sel: torch.Tensor, n_expert: int, expert_bytes: int):
    """The slots of a batch grouped by expert: (slot order sorted by expert, the distinct
    experts, their slot counts), and groups of consecutive experts whose dequantised float32
    matrices stay within EXPERT_GROUP_BYTES. The counts cross to the host (how many experts a
    group holds decides tensor shapes); nothing else does."""
    flat = sel.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    per_group = max(1, EXPERT_GROUP_BYTES // expert_bytes)
    counts_host = counts.tolist()
    groups, start, slot = [], 0, 0
    while start < len(counts_host):
        stop = min(len(counts_host), start + per_group)
        n = sum(counts_host[start:stop])
        groups.append((start, stop, slot, slot + n))
        start, slot = stop, slot + n
    return order, experts, counts, groups


def experts(x: torch.Tensor, sel: torch.Tensor, weights: torch.Tensor, mats: tuple[Packed, Packed, Packed],
            clamp: float) -> torch.Tensor:
    """Σ over each token's chosen experts of weight · down(swiglu(gate·x, up·x)), dequantising
    only the chosen experts, a bounded group at a time. x (T, E), sel/weights (T, k)."""
    gate, up, down = mats
    k = sel.shape[1]
    out = torch.zeros_like(x)
    order, ids, counts, groups = expert_groups(sel, gate.shape[0], 4 * gate.shape[1] * gate.shape[2])
    tok = order // k
    w_slot = weights.reshape(-1)[order]
    bounds = torch.cumsum(counts, 0).tolist()
    starts = [0] + bounds[:-1]
    for g0, g1, s0, s1 in groups:
        e_ids = ids[g0:g1]
        G, U, D = gate.experts(e_ids), up.experts(e_ids), down.experts(e_ids)
        for j in range(g1 - g0):
            a, b = starts[g0 + j], bounds[g0 + j]
            xt = x.index_select(0, tok[a:b])
            mid = swiglu(xt @ G[j].T, xt @ U[j].T, clamp) * w_slot[a:b, None]
            out = out.index_add(0, tok[a:b], mid @ D[j].T)
    return out


def sink_attend(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax attention with one learned sink logit per head, K = V (§3.3): q (H, T, D),
    keys (N, D), mask (T, N) bool -> (H, T, D); in blocks of queries so that no score array
    exceeds ATTEND_BLOCK_BYTES."""
    H, T, D = q.shape
    step = max(1, ATTEND_BLOCK_BYTES // (4 * H * max(1, keys.shape[0])))
    outs = []
    for t in range(0, T, step):
        s = (q[:, t : t + step] @ keys.T) * (1.0 / math.sqrt(D))
        s = torch.where(mask[None, t : t + step], s, -math.inf)
        sink = sinks.reshape(H, 1, 1)
        m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)
        ex = torch.exp(s - m)
        outs.append((ex @ keys) / (torch.exp(sink - m) + ex.sum(dim=-1, keepdim=True)))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def index_scores(qi: torch.Tensor, keys: torch.Tensor, wi: torch.Tensor) -> torch.Tensor:
    """Indexer scores (T, C) = Σ_h relu(qi[t, h] · keys[c]) · wi[t, h] (§3.6)."""
    dots = torch.clamp(qi @ keys.T, min=0.0)  # (T, Hi, C): relu before weighting
    return (dots * wi[:, :, None]).sum(dim=1)


def index_select(qi: torch.Tensor, keys: torch.Tensor, wi: torch.Tensor, n_vis: torch.Tensor, k: int) -> torch.Tensor:
    """The indexer's choice: for each query the k best-scoring of its n_vis visible rows
    (ties to the lower row; all of them when there are at most k), as a (T, C) bool mask."""
    scores = index_scores(qi, keys, wi)
    T, C = scores.shape
    cols = torch.arange(C, device=scores.device)
    visible = cols[None, :] < n_vis[:, None]
    scores = torch.where(visible, scores, -math.inf)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    sel = torch.zeros((T, C), dtype=torch.bool, device=scores.device).scatter(1, order, True)
    sel = sel | (n_vis <= k)[:, None]
    return sel & visible


def sinkhorn(M: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
    """The hyper-connection comb from its logits M (T, hc, hc), M[t, src, dst]: softmax over
    dst, + eps, columns divided by (sum + eps), then iters-1 rounds of rows then columns
    (§3.2 step 5)."""
    M = torch.softmax(M, dim=-1) + eps
    M = M / (M.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        M = M / (M.sum(dim=-1, keepdim=True) + eps)
        M = M / (M.sum(dim=-2, keepdim=True) + eps)
    return M


def hc_weights(mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, eps: float):
    """pre (T, hc), post (T, hc) and the comb's logits (T, hc, hc) from the mixing projection."""
    pre = torch.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2.0 * torch.sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    logits = (mix[:, 2 * hc :] * scale[2] + base[2 * hc :]).reshape(-1, hc, hc)
    return pre, post, logits


def hc_post(y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """X_new[t, j] = post[t, j]·y[t] + Σ_i M[t, i, j]·X[t, i] (Mᵀ, not M)."""
    return post[:, :, None] * y[:, None, :] + M.transpose(1, 2) @ X


__all__ = ["EXPERT_KINDS", "experts", "hc_post", "hc_weights", "index_select", "linear", "rms_norm", "route",
           "sink_attend", "sinkhorn", "swiglu"]
