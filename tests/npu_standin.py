"""A stand-in for torch_npu: the fused ops the Ascend module calls, at the signatures of the
torch_npu API reference (as read for engine/ascend/fused.py; docs/ascend.md says where it was
unclear), computing what the documentation says in plain torch, and checking the dtypes and
layouts the documentation requires, so a wrong argument mapping in fused.py fails.

``bug`` plants one wrong behaviour (tests of the open-time check). This is not torch_npu:
whether the real ops behave like this was not checked on hardware.
"""

from __future__ import annotations

import math

import torch


class StandIn:
    def __init__(self, bug: str | None = None) -> None:
        self.bug = bug
        self.called: list[str] = []

    def _log(self, name: str) -> None:
        if name not in self.called:
            self.called.append(name)

    # W8A16: int8 weight (K, N), per-group float16 scales (K / group, N)
    def npu_weight_quant_batchmatmul(self, x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                     quant_offset=None, bias=None, antiquant_group_size=0):
        self._log("npu_weight_quant_batchmatmul")
        K, N = weight.shape
        assert x.dtype == torch.float16 and weight.dtype == torch.int8 and x.shape[-1] == K
        assert antiquant_scale.dtype == torch.float16 and antiquant_scale.shape == (K // antiquant_group_size, N)
        scale = antiquant_scale.to(torch.float32)
        if self.bug == "wq_no_scale":
            scale = torch.ones_like(scale)
        w = weight.to(torch.float32) * scale.repeat_interleave(antiquant_group_size, dim=0)
        return (x.to(torch.float32) @ w).to(torch.float16)

    def npu_dynamic_quant(self, x, smooth_scales=None):
        self._log("npu_dynamic_quant")
        assert x.dtype in (torch.float16, torch.bfloat16)
        xf = x.to(torch.float32)
        amax = xf.abs().amax(dim=-1)
        s = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        return torch.round(xf / s[..., None]).clamp(-127, 127).to(torch.int8), s

    def npu_quant_matmul(self, x1, x2, scale, offset=None, pertoken_scale=None, bias=None, output_dtype=None):
        self._log("npu_quant_matmul")
        assert x1.dtype == torch.int8 and x2.dtype == torch.int8 and x1.shape[1] == x2.shape[0]
        assert scale.dtype == torch.float32 and scale.shape == (x2.shape[1],)
        assert pertoken_scale.dtype == torch.float32 and pertoken_scale.shape == (x1.shape[0],)
        acc = (x1.to(torch.float64) @ x2.to(torch.float64))  # exact for these sizes
        y = acc * scale.to(torch.float64)[None, :] * pertoken_scale.to(torch.float64)[:, None]
        return y.to(output_dtype or torch.float16)

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        self._log("npu_rms_norm")
        assert gamma.shape == x.shape[-1:]
        rstd = torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + epsilon)
        return (x * rstd if self.bug == "norm_no_gamma" else x * rstd * gamma), rstd

    def npu_moe_gating_top_k(self, x, k, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0,
                             norm_type=1, out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
        self._log("npu_moe_gating_top_k")
        # norm_type 2 (sqrt(softplus)) is not in the documentation: what fused.route assumes
        assert norm_type == 2 and k_group == 1 and group_count == 1 and renorm == 0
        score = torch.sqrt(torch.nn.functional.softplus(x))
        biased = score + bias if bias is not None else score
        idx = torch.topk(biased, k, dim=-1, largest=self.bug != "route_lowest").indices.to(torch.int32)
        y = torch.gather(score, 1, idx.long())
        y = y / (y.sum(dim=-1, keepdim=True) + eps) * routed_scaling_factor
        return y, idx, (score if out_flag else None)

    def npu_grouped_matmul(self, x, weight, bias=None, scale=None, offset=None, antiquant_scale=None,
                           antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                           activation_quant_scale=None, activation_quant_offset=None, split_item=0, group_type=None,
                           group_list_type=0, act_type=0, output_dtype=None):
        self._log("npu_grouped_matmul")
        assert isinstance(x, list) and isinstance(weight, list) and len(x) == len(weight) == 1
        assert group_type == 0 and group_list_type == 1 and split_item in (2, 3)
        a, W = x[0], weight[0]
        if self.bug == "gmm_untransposed":
            W = W.transpose(1, 2)
        counts = group_list.tolist()
        assert W.dim() == 3 and W.shape[0] == len(counts) and W.shape[1] == a.shape[1] and sum(counts) == a.shape[0]
        outs, at = [], 0
        for e, n in enumerate(counts):
            outs.append(a[at : at + n] @ W[e])
            at += n
        return [torch.cat(outs, dim=0)]

    def npu_sparse_flash_attention(self, query, key, value, sparse_indices, scale_value, block_table=None,
                                   actual_seq_lengths_query=None, actual_seq_lengths_kv=None, query_rope=None,
                                   key_rope=None, sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                                   sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1, attention_mode=0,
                                   return_softmax_lse=False, sinks=None):
        self._log("npu_sparse_flash_attention")
        assert layout_query == "TND" and layout_kv == "TND" and attention_mode == 2 and sparse_mode == 0
        T, H, D = query.shape
        assert key.shape[1:] == (1, D) and value.shape == key.shape and sparse_indices.shape[:2] == (T, 1)
        assert query_rope.shape == (T, H, 64) and key_rope.shape == (key.shape[0], 1, 64)
        q, k, v = query.to(torch.float32), key[:, 0].to(torch.float32), value[:, 0].to(torch.float32)
        qr, kr = query_rope.to(torch.float32), key_rope[:, 0].to(torch.float32)
        out = torch.zeros((T, H, D), dtype=torch.float32)
        for t in range(T):
            idx = sparse_indices[t, 0]
            idx = idx[idx >= 0].long()
            s = (q[t] @ k[idx].T + qr[t] @ kr[idx].T) * scale_value  # (H, n)
            sink = sinks.to(torch.float32)[:, None] if sinks is not None and self.bug != "attend_no_sinks" else None
            m = s.amax(dim=-1, keepdim=True) if sink is None else torch.maximum(s.amax(dim=-1, keepdim=True), sink)
            ex = torch.exp(s - m)
            den = ex.sum(dim=-1, keepdim=True) + (torch.exp(sink - m) if sink is not None else 0)
            out[t] = (ex @ v[idx]) / den
        return out.to(torch.float16), None, None

    def npu_lightning_indexer(self, query, key, weights, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                              block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                              sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1, return_value=False):
        self._log("npu_lightning_indexer")
        if self.bug == "indexer_raises":
            raise RuntimeError("EZ9999: aclnnLightningIndexer failed (planted)")
        assert layout_query == "BSND" and layout_key == "PA_BSND" and sparse_mode == 0
        B, S, N, D = query.shape
        n_blk, blk, one, Dk = key.shape
        assert S == 1 and one == 1 and Dk == D and weights.shape == (B, S, N) and block_table.shape[0] == B
        idx_out = torch.full((B, S, 1, sparse_count), -1, dtype=torch.int32)
        val_out = torch.full((B, S, 1, sparse_count), -math.inf)
        for b in range(B):
            rows = key[block_table[b].long()].reshape(-1, D)[: int(actual_seq_lengths_key[b])].to(torch.float32)
            dots = torch.clamp(query[b, 0].to(torch.float32) @ rows.T, min=0.0)  # (N, L)
            sc = (dots * weights[b, 0].to(torch.float32)[:, None]).sum(dim=0)
            n = min(sparse_count, sc.shape[0])
            top = torch.topk(sc, n)
            idx_out[b, 0, 0, :n] = top.indices.to(torch.int32)
            val_out[b, 0, 0, :n] = top.values
        return idx_out, val_out

    def npu_mhc_sinkhorn(self, x, eps=1e-6, num_iters=20, out_flag=0):
        self._log("npu_mhc_sinkhorn")
        assert x.dtype == torch.float32 and x.shape[-1] == x.shape[-2]
        M = torch.softmax(x, dim=-1) + eps
        M = M / (M.sum(dim=-2, keepdim=True) + eps)
        for _ in range(num_iters - 1):
            M = M / (M.sum(dim=-1, keepdim=True) + eps)
            M = M / (M.sum(dim=-2, keepdim=True) + eps)
        return M, None, None
