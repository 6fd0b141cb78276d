"""GPU kernels for Metal (mx.fast.metal_kernel) and CUDA (mx.fast.cuda_kernel).

One kernel source serves both: the bodies below are written in the common subset of Metal
Shading Language, CUDA C++ and C, with a few macros (GLOBAL address space, FN qualifier,
GID thread index, h2f) defined per target in HEADER. The same text is also compiled by the
host C compiler into a harness that runs each body over its whole grid on the CPU
(tests/test_gpu_kernels.py), so every kernel's arithmetic is tested against the MLX reference
on machines without a GPU; only the launch itself needs one.

Kernels (one thread per output value: no cross-thread reductions, so the harness runs the
exact body a GPU runs):

* ``matvec``: rows of a Q8_0/Q2_K/Q4_K/IQ2_XXS matrix dotted with a few tokens' activations,
  dequantising each block in registers;
* ``gate_up``: per routed slot, gather the chosen expert's gate and up rows, dequantise,
  dot, clamped SwiGLU and routing weight;
* ``down``: per token, the chosen experts' down rows against their SwiGLU outputs, summed
  over the token's slots;
* ``scores`` / ``mix``: decode attention over the visible rows only (the window plus the
  compressed rows the indexer selected), with the sink softmax between them in MLX ops.

Weights are held on the device as raw GGUF bytes (one MLX uint8 array per tensor, made the
first time a tensor is used); nothing is dequantised ahead of time. Prefill-sized products
(more than DECODE_MAX_T tokens) go to the MLX reference path, whose quantised matmuls are
already batched GEMMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from ...modelfile.gguf import block_info
from ..quants import iq2xxs_tables
from ..weights import Weights
from .reference import ReferenceKernels, sink_softmax

KERNEL_TYPES = frozenset({int(Q.Q8_0), int(Q.Q2_K), int(Q.Q4_K), int(Q.IQ2_XXS)})
DECODE_MAX_T = 8
THREADGROUP = 256

HEADER = r"""
#if defined(__METAL_VERSION__)
#define GLOBAL device
#define FN inline
#define EXPF(v) metal::exp(v)
inline float h2f(uint16_t h) { return float(as_type<half>(h)); }
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#define GLOBAL
#define FN __device__ inline
#define EXPF(v) expf(v)
__device__ inline float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
#else
#define GLOBAL
#define FN static inline
#define EXPF(v) expf(v)
static inline float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) { bits = sign; }
        else { int e = -1; do { e++; man <<= 1; } while (!(man & 0x400u));
               bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13); }
    } else if (exp == 31) { bits = sign | 0x7f800000u | (man << 13); }
    else { bits = sign | ((exp + 112) << 23) | (man << 13); }
    float f; memcpy(&f, &bits, 4); return f;
}
#endif

FN float rdh(const GLOBAL uint8_t *p) { return h2f((uint16_t)(p[0] | (p[1] << 8))); }

/* One block of packed weights dotted with the matching 32 or 256 activations; each weight
 * is dequantised exactly as gguf does (same float operations) before its product. */
FN float dot_q8_0(const GLOBAL uint8_t *b, const GLOBAL float *x) {
    const float d = rdh(b);
    float s = 0.0f;
    for (int l = 0; l < 32; l++) s += ((float)((const GLOBAL int8_t *)(b + 2))[l] * d) * x[l];
    return s;
}

FN float dot_q2_k(const GLOBAL uint8_t *b, const GLOBAL float *x) {
    const float d = rdh(b + 80), dmin = rdh(b + 82);
    float s = 0.0f;
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, j = (i % 128) / 32, l = i % 32, g = i / 16;
        const float dl = d * (float)(b[g] & 0xF), ml = dmin * (float)(b[g] >> 4);
        s += (dl * (float)((b[16 + 32 * h + l] >> (2 * j)) & 3) - ml) * x[i];
    }
    return s;
}

FN float dot_q4_k(const GLOBAL uint8_t *b, const GLOBAL float *x) {
    const float d = rdh(b), dmin = rdh(b + 2);
    const GLOBAL uint8_t *sc = b + 4;
    float s = 0.0f;
    for (int j = 0; j < 8; j++) {
        int scale, mn;
        if (j < 4) { scale = sc[j] & 63; mn = sc[j + 4] & 63; }
        else { scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4); mn = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4); }
        const float dl = d * (float)scale, ml = dmin * (float)mn;
        for (int l = 0; l < 32; l++)
            s += (dl * (float)((b[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF) - ml) * x[32 * j + l];
    }
    return s;
}

FN float dot_iq2_xxs(const GLOBAL uint8_t *b, const GLOBAL float *x, const GLOBAL float *grid,
                     const GLOBAL float *signs) {
    const float d = rdh(b);
    float s = 0.0f;
    for (int g = 0; g < 8; g++) {
        const GLOBAL uint8_t *a0 = b + 2 + 8 * g;
        const uint32_t a1 = (uint32_t)a0[4] | ((uint32_t)a0[5] << 8) | ((uint32_t)a0[6] << 16) | ((uint32_t)a0[7] << 24);
        const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const GLOBAL float *gr = grid + 8 * a0[l];
            const GLOBAL float *sg = signs + 8 * ((a1 >> (7 * l)) & 127);
            for (int k = 0; k < 8; k++) s += (db * gr[k] * sg[k]) * x[32 * g + 8 * l + k];
        }
    }
    return s;
}

/* A whole row of n weights of GGML type qt (row_bytes apart) dotted with x. */
FN float dot_row(int qt, const GLOBAL uint8_t *row, const GLOBAL float *x, int n, const GLOBAL float *grid,
                 const GLOBAL float *signs) {
    float s = 0.0f;
    if (qt == 8) { for (int b = 0; b < n / 32; b++) s += dot_q8_0(row + 34 * b, x + 32 * b); }
    else if (qt == 10) { for (int b = 0; b < n / 256; b++) s += dot_q2_k(row + 84 * b, x + 256 * b); }
    else if (qt == 12) { for (int b = 0; b < n / 256; b++) s += dot_q4_k(row + 144 * b, x + 256 * b); }
    else { for (int b = 0; b < n / 256; b++) s += dot_iq2_xxs(row + 66 * b, x + 256 * b, grid, signs); }
    return s;
}
"""

# Kernel bodies. Template constants (upper case) are fixed by the weights and the model: QT/QD
# GGML types, N/E/F row lengths, RB/RBD row bytes, K slots per token, H heads, D head dim. What
# changes from call to call (tokens, rows, visible rows) arrives at run time in the last input,
# ``dims`` (int32; see Launch.dims), so the engine compiles a handful of kernels per model rather
# than one per token count, row range or context length, and the compile tests can cover every
# instantiation it uses (tests/test_gpu_compile.py).
BODIES = {
    "matvec": ("W x iq_grid iq_signs dims", "y", r"""
    const uint32_t gid = GID;
    const uint32_t n_out = (uint32_t)dims[0], n_tok = (uint32_t)dims[1];
    if (gid < n_out * n_tok) {
        const uint32_t t = gid / n_out, r = gid % n_out;
        y[gid] = dot_row(QT, W + ((size_t)dims[2] + r) * RB, x + (size_t)t * N, N, iq_grid, iq_signs);
    }
"""),
    "gate_up": ("gate up x sel route clampv iq_grid iq_signs dims", "mid", r"""
    const uint32_t gid = GID;
    if (gid < (uint32_t)dims[0] * K * F) {
        const uint32_t s = gid / F, f = gid % F;
        const size_t row = ((size_t)sel[s] * F + f) * RB;
        const GLOBAL float *xs = x + (size_t)(s / K) * E;
        float g = dot_row(QT, gate + row, xs, E, iq_grid, iq_signs);
        float u = dot_row(QT, up + row, xs, E, iq_grid, iq_signs);
        const float c = clampv[0];
        g = g < c ? g : c;
        u = u < -c ? -c : (u > c ? c : u);
        mid[gid] = g / (1.0f + EXPF(-g)) * u * route[s];
    }
"""),
    "down": ("down mid sel iq_grid iq_signs dims", "y", r"""
    const uint32_t gid = GID;
    if (gid < (uint32_t)dims[0] * E) {
        const uint32_t t = gid / E, r = gid % E;
        float acc = 0.0f;
        for (uint32_t j = 0; j < K; j++) {
            const uint32_t s = t * K + j;
            acc += dot_row(QD, down + ((size_t)sel[s] * E + r) * RBD, mid + (size_t)s * F, F, iq_grid, iq_signs);
        }
        y[gid] = acc;
    }
"""),
    "scores": ("q keys idx dims", "s", r"""
    const uint32_t gid = GID;
    const uint32_t n_vis = (uint32_t)dims[0];
    if (gid < H * n_vis) {
        const uint32_t h = gid / n_vis, v = gid % n_vis;
        const GLOBAL float *qh = q + (size_t)h * D, *k = keys + (size_t)idx[v] * D;
        float acc = 0.0f;
        for (uint32_t i = 0; i < D; i++) acc += qh[i] * k[i];
        s[gid] = acc;
    }
"""),
    "mix": ("p keys idx dims", "o", r"""
    const uint32_t gid = GID;
    const uint32_t n_vis = (uint32_t)dims[0];
    if (gid < H * D) {
        const uint32_t h = gid / D, i = gid % D;
        float acc = 0.0f;
        for (uint32_t v = 0; v < n_vis; v++) acc += p[(size_t)h * n_vis + v] * keys[(size_t)idx[v] * D + i];
        o[gid] = acc;
    }
"""),
}

GID = {"metal": "thread_position_in_grid.x", "cuda": "cooperative_groups::this_grid().thread_rank()"}


def source(kind: str, backend: str) -> tuple[list[str], list[str], str]:
    """(input names, output names, body) of a kernel for ``metal`` or ``cuda``."""
    ins, outs, body = BODIES[kind]
    return ins.split(), outs.split(), body.replace("GID", GID[backend])


@dataclass(frozen=True)
class Launch:
    """Everything a launch needs besides the input arrays: one thread per output value.
    ``template`` is compiled in; ``dims`` is passed at run time as the kernel's last input (an
    int32 array: matvec [rows, tokens, first row], gate_up/down [tokens], scores/mix [visible
    rows])."""

    kind: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: list[tuple[int, ...]]
    template: list[tuple[str, int]]
    dims: tuple[int, ...]


def _launch(kind: str, n_out: int, out_shape: tuple[int, ...], template: dict[str, int],
            dims: tuple[int, ...]) -> Launch:
    if n_out <= 0 or n_out >= 2**32:
        raise ValueError(f"{kind}: {n_out} outputs do not fit one 32-bit grid")
    tg = min(THREADGROUP, n_out)
    return Launch(kind, (n_out, 1, 1), (tg, 1, 1), [out_shape], sorted(template.items()), dims)


def _row_bytes(qtype: int, n: int) -> int:
    if qtype not in KERNEL_TYPES:
        raise ValueError(f"GGML type {Q(qtype).name} has no GPU kernel")
    block, size = block_info(qtype)
    if n % block:
        raise ValueError(f"row of {n} is not a whole number of {Q(qtype).name} blocks")
    return n // block * size


def plan_matvec(qtype: int, out: int, n: int, T: int, r0: int = 0) -> Launch:
    if not 1 <= T <= DECODE_MAX_T:
        raise ValueError(f"matvec takes 1..{DECODE_MAX_T} tokens, got {T}")
    return _launch("matvec", out * T, (T, out), {"QT": int(qtype), "N": n, "RB": _row_bytes(qtype, n)}, (out, T, r0))


def plan_gate_up(qtype: int, T: int, k: int, F: int, E: int) -> Launch:
    return _launch("gate_up", T * k * F, (T * k, F),
                   {"QT": int(qtype), "K": k, "F": F, "E": E, "RB": _row_bytes(qtype, E)}, (T,))


def plan_down(qtype: int, T: int, k: int, F: int, E: int) -> Launch:
    return _launch("down", T * E, (T, E),
                   {"QD": int(qtype), "K": k, "F": F, "E": E, "RBD": _row_bytes(qtype, F)}, (T,))


def plan_scores(H: int, V: int, D: int) -> Launch:
    return _launch("scores", H * V, (H, V), {"H": H, "D": D}, (V,))


def plan_mix(H: int, V: int, D: int) -> Launch:
    return _launch("mix", H * D, (H, D), {"H": H, "D": D}, (V,))


class GpuKernels(ReferenceKernels):
    """Metal or CUDA kernels for decode-sized products; the reference MLX path otherwise."""

    def __init__(self, weights: Weights, backend: str, make=None) -> None:
        """``make`` builds a kernel object the way mx.fast.metal_kernel / cuda_kernel do (the
        default for ``backend``); the tests pass one that runs the bodies on the CPU."""
        super().__init__(weights)
        if backend not in GID:
            raise ValueError(f"no GPU kernels for backend {backend!r}")
        if make is None:
            make = mx.fast.metal_kernel if backend == "metal" else getattr(mx.fast, "cuda_kernel", None)
        if make is None:
            raise ValueError("this MLX build has no custom CUDA kernels")
        self.name = backend
        self.xp = mx
        self.backend = backend
        self._make = make
        self._kernels: dict[str, object] = {}
        self._raw: dict[str, mx.array] = {}
        grid, signs = iq2xxs_tables()
        self._grid, self._signs = mx.array(grid.reshape(-1)), mx.array(signs.reshape(-1))
        self._kernel("matvec")  # fail at open, not mid-answer, when the toolchain is missing

    def _kernel(self, kind: str):
        k = self._kernels.get(kind)
        if k is None:
            ins, outs, body = source(kind, self.backend)
            k = self._kernels[kind] = self._make(name=f"ds4_{kind}", input_names=ins, output_names=outs,
                                                 source=body, header=HEADER)
        return k

    def _run(self, launch: Launch, inputs: list[mx.array]) -> mx.array:
        inputs = [*inputs, mx.array(launch.dims, dtype=mx.int32)]
        return self._kernel(launch.kind)(inputs=inputs, grid=launch.grid, threadgroup=launch.threadgroup,
                                         output_shapes=launch.output_shapes, output_dtypes=[mx.float32],
                                         template=launch.template)[0]

    def release(self, ops: set[str]) -> None:
        """Drop the device copies only the refused ``ops`` would have used (the self-check
        calls this: a refused expert kernel must not keep a layer's experts on the device)."""
        for name in list(self._raw):
            expert = "_exps." in name
            if ("experts" in ops and expert) or ("linear" in ops and not expert):
                del self._raw[name]

    def _bytes(self, name: str) -> mx.array:
        """The tensor's packed bytes on the device, copied from the mmap on first use."""
        a = self._raw.get(name)
        if a is None:
            a = self._raw[name] = mx.array(np.asarray(self.w.file.array(name)).view(np.uint8).reshape(-1))
        return a

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None) -> mx.array:
        t = self.w.file.tensors[name]
        T = x.shape[0]
        if t.type not in KERNEL_TYPES or T > DECODE_MAX_T or cols is not None:  # column slices: the reference
            return super().linear(x, name, rows, cols)
        r0, r1 = rows or (0, t.shape[0])
        launch = plan_matvec(t.type, r1 - r0, t.shape[-1], T, r0)
        return self._run(launch, [self._bytes(name), x.astype(mx.float32), self._grid, self._signs])

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float) -> mx.array:
        p = f"blk.{layer}.ffn_"
        tg, td = self.w.file.tensors[p + "gate_exps.weight"], self.w.file.tensors[p + "down_exps.weight"]
        tu = self.w.file.tensors[p + "up_exps.weight"]
        T, E = x.shape
        k = sel.shape[1]
        if T > DECODE_MAX_T or tg.type not in KERNEL_TYPES or td.type not in KERNEL_TYPES or tu.type != tg.type:
            return super().experts(layer, x, sel, weights, clamp)
        F = tg.shape[1]
        ids = mx.array(np.ascontiguousarray(sel, dtype=np.int32).reshape(-1))
        mid = self._run(plan_gate_up(tg.type, T, k, F, E),
                        [self._bytes(p + "gate_exps.weight"), self._bytes(p + "up_exps.weight"), x.astype(mx.float32),
                         ids, weights.astype(mx.float32).reshape(-1), mx.array([clamp], dtype=mx.float32),
                         self._grid, self._signs])
        return self._run(plan_down(td.type, T, k, F, E),
                         [self._bytes(p + "down_exps.weight"), mid, ids, self._grid, self._signs])

    def attend(self, q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array:
        H, T, D = q.shape
        if T != 1:
            return super().attend(q, keys, mask, sinks)
        visible = np.flatnonzero(mask[0]).astype(np.int32)
        idx = mx.array(visible)
        V = len(visible)
        keys = keys.astype(mx.float32)  # the kernels read float32: any other dtype is converted, not misread
        scores = self._run(plan_scores(H, V, D), [q.reshape(H, D).astype(mx.float32), keys, idx]) * (1.0 / math.sqrt(D))
        ex, den = sink_softmax(scores, sinks.reshape(H, 1).astype(mx.float32))
        out = self._run(plan_mix(H, V, D), [ex, keys, idx]) / den
        return out.reshape(H, 1, D)
