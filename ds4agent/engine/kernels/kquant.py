"""mlx-kquant's kernels (PyPI ``mlx-kquant``, MIT) as a kernel set: ``--kernels kquant``.

mlx-kquant multiplies activations with GGUF weights given as their wire bytes, the same bytes
our kernels read, with Metal kernels that use the GPU's matrix units for many tokens and
sorted-segment GEMMs for routed experts. On Linux it runs on MLX's CPU stream (its scalar,
bit-exact decoding), which is how this integration is tested here; several of its operations
exist only on Metal (calling them on the CPU aborts the process, so they are used only when
the engine runs on Metal).

What is used, and where (each checked against the reference by check.py at open):

* dense Q8_0/Q2_K/Q4_K/IQ2_XXS products: ``quantized_matmul`` (everywhere); F16 and F32
  matrices are not mlx-kquant codecs and stay with MLX (the reference's ``x @ W.T`` on the
  file's own F16 values);
* routed experts: gate and up by ``gather_qmm`` on the CPU stream; on Metal, up to
  DECODE_MAX_T tokens, ``moe_glu_gather_kq`` (gate and up sharing each activation load, the
  clamped SwiGLU fused: its ``silu_limit`` is our clamp) then ``gather_qmv_kq`` for down; more
  tokens: the slots sorted by expert, ``expert_tile_map`` and ``gather_qmm_seg`` (the
  matrix-unit segment GEMM) for gate, up and down;
* on Metal only, ``dsa_kv_qat`` and ``dsa_indexer_qat`` for the KV cache's FP8 rounding and the
  indexer's Hadamard + FP4 rounding (documented bit-identical to the chains of engine/qat.py).

Its products take bfloat16 activations (float32 inputs are converted; outputs come back as
bfloat16 and are widened here), so results differ from the float32 reference by about 2-3e-3
relative per product; the check's tolerances below are calibrated on the demo model
(tests/test_kquant.py) with margin. The routing weight multiplies each slot's down output
rather than its SwiGLU (the same product, reassociated). mlx-kquant pins MLX exactly; the
project is on the same MLX for that reason (pyproject.toml).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from ...modelfile.gguf import block_info
from ..ops import swiglu
from ..weights import Weights
from .reference import ReferenceKernels, one_at_a_time
from .resident import DeviceTensors

CODECS = {int(Q.Q8_0): "q8_0", int(Q.Q2_K): "q2_k", int(Q.Q4_K): "q4_k", int(Q.IQ2_XXS): "iq2_xxs"}
DECODE_MAX_T = 8  # at most this many tokens take the decode-shaped fused expert kernels on Metal
ACT = mx.bfloat16


class KquantKernels(ReferenceKernels):
    prefill_chunk = 1024  # as GpuKernels: a chunk reads nearly every expert once
    # Relative (L2) error the self-check allows, from the demo model's measured errors
    # (tests/test_kquant.py): bfloat16 activations give 2-3e-3 per dense product and up to
    # about 1e-2 through the routed FFN's three products; twice that, to hold on other weights.
    # (linears, grouped and hc_pre are the reference's, through this linear: not checked apart.)
    check_tolerance = {"linear": 1e-2, "experts": 2e-2}

    def __init__(self, weights: Weights) -> None:
        import mlx_kquant  # ImportError when not installed: auto passes over these kernels

        super().__init__(weights)
        self.kq = mlx_kquant
        self.name = "kquant"
        self.metal = mx.default_device() == mx.gpu and mx.metal.is_available()
        for name, t in weights.file.tensors.items():
            if "_exps." in name and t.type not in CODECS:
                raise ValueError(f"{name}: GGML type {t.type_name} is not an mlx-kquant codec here")
        self.resident = DeviceTensors(weights.file, mx.array, shape="rows")
        self._none = mx.zeros((1,), dtype=mx.uint8)  # the "scales" argument its ops ignore
        if self.metal:
            self.kv_round = self._kv_round_metal
            self.indexer_round = self._indexer_round_metal

    def release(self, ops: set[str]) -> None:
        """Drop the device copies only the refused ``ops`` would have used."""
        self.resident.drop(experts="experts" in ops, dense="linear" in ops)  # its other products go through linear

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, alone: bool = False) -> mx.array:
        if alone and x.shape[0] > 1:  # its kernels choose their method by the number of rows
            return one_at_a_time(self.linear, x, name, rows, cols)
        t = self.w.file.tensors[name]
        codec = CODECS.get(t.type)
        if codec is None or len(t.shape) != 2:
            return super().linear(x, name, rows, cols)
        w = self.resident.get(name)
        if rows is not None:
            w = w[rows[0] : rows[1]]
        if cols is not None:
            block, size = block_info(t.type)
            if cols[0] % block or cols[1] % block:
                raise ValueError(f"{name}: columns {cols[0]}..{cols[1]} are not whole blocks of {block}")
            w = w[:, cols[0] // block * size : cols[1] // block * size]
        return self.kq.quantized_matmul(x.astype(ACT), w, self._none, codec).astype(mx.float32)

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float,
                alone: bool = False) -> mx.array:
        if alone and x.shape[0] > 1:
            return mx.concatenate([self.experts(layer, x[t : t + 1], sel[t : t + 1], weights[t : t + 1], clamp)
                                   for t in range(x.shape[0])])
        p = f"blk.{layer}.ffn_"
        f = self.w.file
        gu_codec = CODECS[f.tensors[p + "gate_exps.weight"].type]
        d_codec = CODECS[f.tensors[p + "down_exps.weight"].type]
        if f.tensors[p + "up_exps.weight"].type != f.tensors[p + "gate_exps.weight"].type:
            raise ValueError(f"layer {layer}: gate and up experts of different types")
        n_expert = f.tensors[p + "gate_exps.weight"].shape[0]
        sel = np.asarray(sel)
        if sel.size and (sel.min() < 0 or sel.max() >= n_expert):
            raise ValueError(f"expert id out of range 0..{n_expert - 1}")
        gate, up, down = (self.resident.get(p + k + "_exps.weight") for k in ("gate", "up", "down"))
        T, K = sel.shape
        route = weights.astype(mx.float32).reshape(T, K, 1)
        if self.metal and T <= DECODE_MAX_T:
            return self._experts_decode(x, sel, route, gate, up, down, gu_codec, d_codec, clamp)
        if self.metal:
            return self._experts_sorted(x, sel, route, gate, up, down, gu_codec, d_codec, clamp, n_expert)
        ids = mx.array(sel.astype(np.uint32))
        xa = x.astype(ACT)[:, None, None, :]  # (T, 1, 1, E): every slot of a token reads its row
        g = self.kq.gather_qmm(xa, gate, self._none, gu_codec, rhs_indices=ids).astype(mx.float32)
        u = self.kq.gather_qmm(xa, up, self._none, gu_codec, rhs_indices=ids).astype(mx.float32)
        mid = swiglu(g, u, clamp).astype(ACT)  # (T, K, 1, F)
        y = self.kq.gather_qmm(mid, down, self._none, d_codec, rhs_indices=ids).astype(mx.float32)
        return mx.sum(y[:, :, 0, :] * route, axis=1)

    def _experts_decode(self, x, sel, route, gate, up, down, gu_codec, d_codec, clamp):
        """Metal, few tokens: the fused gate/up/SwiGLU gather, then the down gather."""
        ids = mx.array(sel.astype(np.uint32))  # as gather_qmm's indices (its docstring gives no dtype here)
        mid = self.kq.moe_glu_gather_kq(x.astype(ACT), gate, up, gu_codec, ids, act="silu_limit", limit=float(clamp))
        y = self.kq.gather_qmv_kq(mid, down, d_codec, ids).astype(mx.float32)  # (T, K, E)
        return mx.sum(y * route, axis=1)

    def _experts_sorted(self, x, sel, route, gate, up, down, gu_codec, d_codec, clamp, n_expert):
        """Metal, a prefill chunk: the slots sorted by expert and tiled (expert_tile_map), each
        of gate, up and down one segment GEMM over the sorted rows (gather_qmm_seg)."""
        T, K = sel.shape
        order = np.argsort(sel.reshape(-1), kind="stable")
        rows = mx.array((order // K).astype(np.int32))  # the token each sorted row reads
        ids = mx.array(sel.reshape(-1)[order].astype(np.uint32))
        E, F = x.shape[1], gate.shape[1]
        tile = self.kq.seg_tile_rows(T * K, n_expert, E, gu_codec)
        tmap, count = self.kq.expert_tile_map(ids, n_expert, tile_rows=tile)
        xa = x.astype(ACT)
        g = self.kq.gather_qmm_seg(xa, gate, self._none, gu_codec, tmap, count, tile_rows=tile, x_rows=rows)
        u = self.kq.gather_qmm_seg(xa, up, self._none, gu_codec, tmap, count, tile_rows=tile, x_rows=rows)
        mid = swiglu(g.astype(mx.float32), u.astype(mx.float32), clamp).astype(ACT)  # (T·K, F), sorted
        tile_d = self.kq.seg_tile_rows(T * K, n_expert, F, d_codec)
        if tile_d != tile:
            tmap, count = self.kq.expert_tile_map(ids, n_expert, tile_rows=tile_d)
        y = self.kq.gather_qmm_seg(mid, down, self._none, d_codec, tmap, count, tile_rows=tile_d).astype(mx.float32)
        inv = np.empty_like(order)
        inv[order] = np.arange(len(order))
        y = y[mx.array(inv.astype(np.int32))].reshape(T, K, E)  # back to (token, slot)
        return mx.sum(y * route, axis=1)

    def _kv_round_metal(self, rows: mx.array, n_rot: int) -> mx.array:
        return self.kq.dsa_kv_qat(rows.astype(mx.float32), n_rot)

    def _indexer_round_metal(self, rows: mx.array) -> mx.array:
        return self.kq.dsa_indexer_qat(rows.astype(mx.float32))
