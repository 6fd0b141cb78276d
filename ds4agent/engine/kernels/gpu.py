"""GPU kernels for Metal (mx.fast.metal_kernel) and CUDA (mx.fast.cuda_kernel), for any number
of tokens: decode and prefill run the same kernels.

One kernel source serves both: the bodies below are written in the common subset of Metal
Shading Language, CUDA C++ and C, with a few macros (GLOBAL address space, FN qualifier, GID
thread index, h2f) defined per target in HEADER. The same text is also compiled by the host C
compiler into a loop over the whole grid (gpu_host.py, ``--kernels gpu-host``), so every
kernel's arithmetic runs, and is tested against the MLX reference, on machines without a GPU;
only the launch itself needs one.

No thread talks to another (no shared memory, no barriers, no atomics): each writes its own
outputs, so the host loop runs exactly the computation a GPU launch performs. Where one output
needs more work than one thread should do (a 4096-wide row at decode is too few threads to fill
a GPU), the work is split along the input (``S`` splits of ``CH`` blocks each, chosen by
``splits``) into partial sums, and a second kernel adds them in a fixed order.

Kernels:

* ``matmul``: a GGUF matrix (Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4, F16, F32; a row range, a column range)
  times T tokens. A thread owns one row, one input split and a tile of up to TILE (<= 8)
  consecutive tokens: it dequantises each block of its row once, into registers (32 weights at
  a time), and dots it with every token of its tile.
* ``moe_gate_up`` / ``moe_glu`` / ``moe_down`` / ``moe_sum``: the routed-expert FFN. The host
  sorts the (token, slot) assignments by expert (``expert_plan``) and cuts each expert's run
  into tiles of up to TILE assignments; a thread owns one row of one expert for one tile, so
  the expert's block is dequantised once for all the tile's tokens, as cpu.c does.
  ``moe_gate_up`` writes gate and up partials, ``moe_glu`` adds them and applies the clamped
  SwiGLU and routing weight, ``moe_down`` multiplies the down rows, ``moe_sum`` adds each
  token's slots. A decode step is the same plan with one token: one tile per chosen expert.
* ``reduce``: the sum of a matmul's partials.
* ``hc_weights`` / ``hc_collapse``: the hyper-connection mix before each sublayer: one thread
  per token turns the mixing projection's output into pre, post and the Sinkhorn-balanced comb
  (ITERS rounds on an HC x HC matrix in registers; in MLX ops that is some 80 dispatches of
  tiny arrays per sublayer), then one thread per value collapses the streams.
* ``scores`` / ``mix``: decode attention over the visible rows only (the window plus the
  compressed rows the indexer selected), with the sink softmax between them in MLX ops.

Weights live on the device once, as the raw GGUF bytes (one MLX uint8 array per tensor, copied
from the mmap the first time a tensor is used, the file's pages then released); decode and
prefill read the same copy, nothing is repacked or dequantised ahead of time, and no path of
these kernels dequantises an expert to a float matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from gguf.constants import GGMLQuantizationType as Q

from ...modelfile.gguf import block_info
from ..ops import fused, hc_flat
from ..quants import iq2xxs_tables
from ..weights import Weights
from .reference import ReferenceKernels, sink_softmax
from .resident import DeviceTensors

# GGML types the kernels read, with their block: (elements, bytes). F16 and F32 have no blocks
# in GGUF; 32 values are taken as one so that every type is walked the same way.
BLOCKS = {int(Q.Q8_0): (32, 34), int(Q.Q2_K): (256, 84), int(Q.Q4_K): (256, 144), int(Q.IQ2_XXS): (256, 66),
          int(Q.MXFP4): (32, 17), int(Q.F16): (32, 64), int(Q.F32): (32, 128)}
KERNEL_TYPES = frozenset(BLOCKS)
EXPERT_TYPES = frozenset({int(Q.Q8_0), int(Q.Q2_K), int(Q.Q4_K), int(Q.IQ2_XXS), int(Q.MXFP4)})
MAX_TILE = 8  # tokens per thread: 8 accumulators (16 for gate/up) stay in registers
THREADGROUP = 256
# Below this many threads a launch leaves most of a GPU idle: an H200 keeps about 270 000
# threads resident, an M-series Max about 40 000 per 40 cores. Products smaller than this are
# split along their input until they reach it (or until each split is one block).
TARGET_THREADS = 1 << 16

HEADER = r"""
#if defined(__METAL_VERSION__)
#define GLOBAL device
#define FN inline
#define EXPF(v) metal::exp(v)
inline float h2f(uint16_t h) { return float(as_type<half>(h)); }
inline float u2f(uint32_t u) { return as_type<float>(u); }
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#define GLOBAL
#define FN __device__ inline
#define EXPF(v) expf(v)
__device__ inline float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ inline float u2f(uint32_t u) { return __uint_as_float(u); }
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
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
#endif

FN float rdh(const GLOBAL uint8_t *p) { return h2f((uint16_t)(p[0] | (p[1] << 8))); }
FN float rdf(const GLOBAL uint8_t *p) {
    return u2f((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

/* Weights 32j .. 32j+31 of one block b of GGML type qt into w, each dequantised with gguf's
 * float operations (the scale products first, then the quant). A block of Q8_0, F16 and F32
 * is 32 weights (j = 0), and one of MXFP4; one of Q2_K, Q4_K and IQ2_XXS is 256 (j = 0..7). */
FN void deq32(int qt, const GLOBAL uint8_t *b, int j, float *w, const GLOBAL float *grid,
              const GLOBAL float *signs) {
    if (qt == 8) {
        const float d = rdh(b);
        for (int l = 0; l < 32; l++) w[l] = (float)((const GLOBAL int8_t *)(b + 2))[l] * d;
    } else if (qt == 10) {
        const float d = rdh(b + 80), dmin = rdh(b + 82);
        const int h = j / 4, shift = 2 * (j % 4);
        for (int l = 0; l < 32; l++) {
            const int g = 2 * j + l / 16;
            const float dl = d * (float)(b[g] & 0xF), ml = dmin * (float)(b[g] >> 4);
            w[l] = dl * (float)((b[16 + 32 * h + l] >> shift) & 3) - ml;
        }
    } else if (qt == 12) {
        const float d = rdh(b), dmin = rdh(b + 2);
        const GLOBAL uint8_t *sc = b + 4;
        int scale, mn;
        if (j < 4) { scale = sc[j] & 63; mn = sc[j + 4] & 63; }
        else { scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4); mn = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4); }
        const float dl = d * (float)scale, ml = dmin * (float)mn;
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) w[l] = dl * (float)((b[16 + 32 * (j / 2) + l] >> shift) & 0xF) - ml;
    } else if (qt == 16) {
        const GLOBAL uint8_t *a0 = b + 2 + 8 * j;
        const uint32_t a1 = (uint32_t)a0[4] | ((uint32_t)a0[5] << 8) | ((uint32_t)a0[6] << 16)
                          | ((uint32_t)a0[7] << 24);
        const float db = rdh(b) * (0.5f + (float)(a1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const GLOBAL float *gr = grid + 8 * a0[l];
            const GLOBAL float *sg = signs + 8 * ((a1 >> (7 * l)) & 127);
            for (int k = 0; k < 8; k++) w[8 * l + k] = db * gr[k] * sg[k];
        }
    } else if (qt == 39) {
        /* MXFP4: an E8M0 exponent, then codes (weight l low nibble of byte 1 + l, weight l + 16
         * its high nibble). The E2M1 code decoded (doubled values 0 1 2 3 4 6 8 12, bit 3 the
         * sign) and the scale 2^(e-128) built as gguf builds it (below e = 2 a subnormal, which
         * a GPU that flushes subnormals reads as 0: no real block has such a scale). */
        const uint32_t e = b[0];
        const float d = u2f(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
        for (int l = 0; l < 32; l++) {
            const uint32_t c = (l < 16 ? b[1 + l] : b[1 + l - 16] >> 4) & 0xFu, m = c & 7u;
            const float v = (float)(m < 4u ? m : (2u + (m & 1u)) << ((m >> 1) - 1u));
            w[l] = d * (c & 8u ? 0.0f - v : v);  /* (0 - 0 is +0, as gguf's code 8) */
        }
    } else if (qt == 1) {
        for (int l = 0; l < 32; l++) w[l] = rdh(b + 2 * l);
    } else {
        for (int l = 0; l < 32; l++) w[l] = rdf(b + 4 * l);
    }
}
"""

# Kernel bodies: (input names, output names, body). Template constants (upper case) are fixed
# by the weights and the model: QT the GGML type, BB/BE its block's bytes and elements, SB the
# block's 32-weight sub-blocks, TILE the tokens per thread (1, 2, 4 or 8), N an expert's input
# width and RB the bytes of its row, F/R output rows, K slots per token, H heads, D head dim.
# What changes from call to call (tokens, the dense matrix's shape, row and column offsets,
# splits, tiles, visible rows) arrives at run time in the last input, ``dims`` (int32; see
# Launch.dims), so the engine compiles a handful of kernels per model (a dense product is one
# of 4 tiles per weight type, whatever its shape) rather than one per token count or matrix,
# and the compile tests can cover every instantiation it uses (tests/test_gpu_compile.py).
BODIES = {
    "matmul": ("W0 W1 W2 W3 W4 W5 x iq_grid iq_signs dims", "y", r"""
    const uint32_t gid = GID;
    const uint32_t n_rows = (uint32_t)dims[0], n_tok = (uint32_t)dims[1], n = (uint32_t)dims[6];
    const uint32_t n_split = (uint32_t)dims[4], chunk = (uint32_t)dims[5];
    if (gid < (n_tok + TILE - 1) / TILE * n_rows * n_split) {
        const uint32_t s = gid % n_split, r = gid / n_split % n_rows, t0 = gid / n_split / n_rows * TILE;
        /* which matrix the row is in (up to six share the input), and its row there */
        uint32_t k = 0, rr = r;
        while (k < 5 && rr >= (uint32_t)dims[11 + k]) { rr -= (uint32_t)dims[11 + k]; k++; }
        const GLOBAL uint8_t *Wk = k == 0 ? W0 : k == 1 ? W1 : k == 2 ? W2 : k == 3 ? W3 : k == 4 ? W4 : W5;
        const GLOBAL uint8_t *row = Wk + ((size_t)(k == 0 ? (uint32_t)dims[2] : 0u) + rr) * (size_t)(uint32_t)dims[7]
                                    + (size_t)dims[3];
        /* a grouped product: the rows of group g read slab g of each token */
        const size_t xo = (size_t)(r / (uint32_t)dims[9]) * (size_t)(uint32_t)dims[10];
        const size_t xt = (size_t)(uint32_t)dims[8];
        const uint32_t b1 = (s + 1) * chunk < n / BE ? (s + 1) * chunk : n / BE;
        float acc[TILE];
        uint32_t tok[TILE];
        for (uint32_t p = 0; p < (uint32_t)TILE; p++) { acc[p] = 0.0f; tok[p] = t0 + p < n_tok ? t0 + p : n_tok - 1; }
        for (uint32_t b = s * chunk; b < b1; b++) {
            for (uint32_t j = 0; j < (uint32_t)SB; j++) {
                float w[32];
                deq32(QT, row + (size_t)b * BB, (int)j, w, iq_grid, iq_signs);
                const size_t c = xo + (size_t)b * BE + 32 * j;
                for (uint32_t p = 0; p < (uint32_t)TILE; p++) {
                    float d = 0.0f;
                    for (uint32_t l = 0; l < 32; l++) d += w[l] * x[(size_t)tok[p] * xt + c + l];
                    acc[p] += d;
                }
            }
        }
        for (uint32_t p = 0; p < (uint32_t)TILE; p++)
            if (t0 + p < n_tok) y[((size_t)(t0 + p) * n_rows + r) * n_split + s] = acc[p];
    }
"""),
    "reduce": ("part dims", "y", r"""
    const uint32_t gid = GID;
    const uint32_t n_split = (uint32_t)dims[1];
    if (gid < (uint32_t)dims[0]) {
        float acc = 0.0f;
        for (uint32_t s = 0; s < n_split; s++) acc += part[(size_t)gid * n_split + s];
        y[gid] = acc;
    }
"""),
    "moe_gate_up": ("gate up x tiles order iq_grid iq_signs dims", "part", r"""
    const uint32_t gid = GID;
    const uint32_t n_split = (uint32_t)dims[1], chunk = (uint32_t)dims[2];
    if (gid < (uint32_t)dims[0] * F * n_split) {
        const uint32_t s = gid % n_split, f = gid / n_split % F, tile = gid / n_split / F;
        const uint32_t e = (uint32_t)tiles[3 * tile], start = (uint32_t)tiles[3 * tile + 1];
        const uint32_t n = (uint32_t)tiles[3 * tile + 2];
        const size_t roff = (size_t)e * XS + (size_t)f * RB;
        const uint32_t b1 = (s + 1) * chunk < N / BE ? (s + 1) * chunk : N / BE;
        float ag[TILE], au[TILE];
        uint32_t tok[TILE];
        for (uint32_t p = 0; p < (uint32_t)TILE; p++) {
            ag[p] = 0.0f; au[p] = 0.0f;
            tok[p] = (uint32_t)order[start + (p < n ? p : n - 1)] / K;
        }
        for (uint32_t b = s * chunk; b < b1; b++) {
            for (uint32_t j = 0; j < (uint32_t)SB; j++) {
                float wg[32], wu[32];
                deq32(QT, gate + GO + roff + (size_t)b * BB, (int)j, wg, iq_grid, iq_signs);
                deq32(QT, up + UO + roff + (size_t)b * BB, (int)j, wu, iq_grid, iq_signs);
                const size_t c = (size_t)b * BE + 32 * j;
                for (uint32_t p = 0; p < (uint32_t)TILE; p++) {
                    float dg = 0.0f, du = 0.0f;
                    for (uint32_t l = 0; l < 32; l++) {
                        const float xv = x[(size_t)tok[p] * N + c + l];
                        dg += wg[l] * xv;
                        du += wu[l] * xv;
                    }
                    ag[p] += dg;
                    au[p] += du;
                }
            }
        }
        for (uint32_t p = 0; p < (uint32_t)TILE; p++) {
            if (p < n) {
                const size_t o = ((size_t)(start + p) * F + f) * 2 * n_split + s;
                part[o] = ag[p];
                part[o + n_split] = au[p];
            }
        }
    }
"""),
    "moe_glu": ("part order route clampv dims", "mid", r"""
    const uint32_t gid = GID;
    const uint32_t n_split = (uint32_t)dims[1];
    if (gid < (uint32_t)dims[0] * F) {
        float g = 0.0f, u = 0.0f;
        for (uint32_t s = 0; s < n_split; s++) {
            g += part[(size_t)gid * 2 * n_split + s];
            u += part[(size_t)gid * 2 * n_split + n_split + s];
        }
        const float c = clampv[0];
        g = g < c ? g : c;
        u = u < -c ? -c : (u > c ? c : u);
        mid[gid] = g / (1.0f + EXPF(-g)) * u * route[order[gid / F]];
    }
"""),
    "moe_down": ("down mid tiles iq_grid iq_signs dims", "part", r"""
    const uint32_t gid = GID;
    const uint32_t n_split = (uint32_t)dims[1], chunk = (uint32_t)dims[2];
    if (gid < (uint32_t)dims[0] * R * n_split) {
        const uint32_t s = gid % n_split, r = gid / n_split % R, tile = gid / n_split / R;
        const uint32_t e = (uint32_t)tiles[3 * tile], start = (uint32_t)tiles[3 * tile + 1];
        const uint32_t n = (uint32_t)tiles[3 * tile + 2];
        const GLOBAL uint8_t *row = down + DO + (size_t)e * XS + (size_t)r * RB;
        const uint32_t b1 = (s + 1) * chunk < N / BE ? (s + 1) * chunk : N / BE;
        float acc[TILE];
        uint32_t pos[TILE];
        for (uint32_t p = 0; p < (uint32_t)TILE; p++) { acc[p] = 0.0f; pos[p] = start + (p < n ? p : n - 1); }
        for (uint32_t b = s * chunk; b < b1; b++) {
            for (uint32_t j = 0; j < (uint32_t)SB; j++) {
                float w[32];
                deq32(QT, row + (size_t)b * BB, (int)j, w, iq_grid, iq_signs);
                const size_t c = (size_t)b * BE + 32 * j;
                for (uint32_t p = 0; p < (uint32_t)TILE; p++) {
                    float d = 0.0f;
                    for (uint32_t l = 0; l < 32; l++) d += w[l] * mid[(size_t)pos[p] * N + c + l];
                    acc[p] += d;
                }
            }
        }
        for (uint32_t p = 0; p < (uint32_t)TILE; p++)
            if (p < n) part[((size_t)(start + p) * R + r) * n_split + s] = acc[p];
    }
"""),
    "moe_sum": ("part inv dims", "y", r"""
    const uint32_t gid = GID;
    const uint32_t n_split = (uint32_t)dims[1];
    if (gid < (uint32_t)dims[0] * R) {
        const uint32_t t = gid / R, r = gid % R;
        float acc = 0.0f;
        for (uint32_t j = 0; j < K; j++) {
            const size_t base = ((size_t)inv[t * K + j] * R + r) * n_split;
            for (uint32_t s = 0; s < n_split; s++) acc += part[base + s];
        }
        y[gid] = acc;
    }
"""),
    "hc_weights": ("mix scale base consts dims", "w", r"""
    const uint32_t t = GID;
    if (t < (uint32_t)dims[0]) {
        const float eps = consts[0];
        const size_t at = (size_t)t * (2 + HC) * HC;
        float comb[HC * HC];
        for (uint32_t j = 0; j < HC; j++) {
            w[at + j] = 1.0f / (1.0f + EXPF(-(mix[at + j] * scale[0] + base[j]))) + eps;
            w[at + HC + j] = 2.0f * (1.0f / (1.0f + EXPF(-(mix[at + HC + j] * scale[1] + base[HC + j]))));
        }
        for (uint32_t i = 0; i < HC; i++) {  /* softmax of each source's row */
            for (uint32_t j = 0; j < HC; j++)
                comb[i * HC + j] = mix[at + 2 * HC + i * HC + j] * scale[2] + base[2 * HC + i * HC + j];
            float top = comb[i * HC], sum = 0.0f;
            for (uint32_t j = 1; j < HC; j++) top = comb[i * HC + j] > top ? comb[i * HC + j] : top;
            for (uint32_t j = 0; j < HC; j++) {
                comb[i * HC + j] = EXPF(comb[i * HC + j] - top);
                sum += comb[i * HC + j];
            }
            for (uint32_t j = 0; j < HC; j++) comb[i * HC + j] = comb[i * HC + j] / sum + eps;
        }
        for (uint32_t it = 0; it < ITERS; it++) {
            if (it > 0) {  /* rows (each source's weights over its destinations) */
                for (uint32_t i = 0; i < HC; i++) {
                    float sum = 0.0f;
                    for (uint32_t j = 0; j < HC; j++) sum += comb[i * HC + j];
                    for (uint32_t j = 0; j < HC; j++) comb[i * HC + j] = comb[i * HC + j] / (sum + eps);
                }
            }
            for (uint32_t j = 0; j < HC; j++) {  /* columns */
                float sum = 0.0f;
                for (uint32_t i = 0; i < HC; i++) sum += comb[i * HC + j];
                for (uint32_t i = 0; i < HC; i++) comb[i * HC + j] = comb[i * HC + j] / (sum + eps);
            }
        }
        for (uint32_t k = 0; k < HC * HC; k++) w[at + 2 * HC + k] = comb[k];
    }
"""),
    "hc_collapse": ("X w dims", "x", r"""
    const uint32_t gid = GID;
    if (gid < (uint32_t)dims[0] * E) {
        const uint32_t t = gid / E, e = gid % E;
        float acc = 0.0f;
        for (uint32_t j = 0; j < HC; j++) acc += w[(size_t)t * (2 + HC) * HC + j] * X[((size_t)t * HC + j) * E + e];
        x[gid] = acc;
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

# The thread index as each target spells it; "host" is the loop variable of gpu_host.py's loop.
GID = {"metal": "thread_position_in_grid.x", "cuda": "cooperative_groups::this_grid().thread_rank()",
       "host": "gid_"}


def source(kind: str, backend: str) -> tuple[list[str], list[str], str]:
    """(input names, output names, body) of a kernel for ``metal``, ``cuda`` or ``host``."""
    ins, outs, body = BODIES[kind]
    return ins.split(), outs.split(), body.replace("GID", GID[backend])


@dataclass(frozen=True)
class Launch:
    """Everything a launch needs besides the input arrays. ``template`` is compiled in;
    ``dims`` is passed at run time as the kernel's last input (an int32 array): matmul [rows,
    tokens, first row, column byte offset, splits, blocks per split, input width, row bytes],
    reduce [outputs,
    splits], moe_gate_up/moe_down [tiles, splits, blocks per split], moe_glu [assignments,
    splits], moe_sum [tokens, splits], scores/mix [visible rows]. One thread per grid
    position; threads past the useful count return at once."""

    kind: str
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: list[tuple[int, ...]]
    template: list[tuple[str, int]]
    dims: tuple[int, ...]


def _launch(kind: str, n_threads: int, out_shape: tuple[int, ...], template: dict[str, int],
            dims: tuple[int, ...]) -> Launch:
    if n_threads <= 0 or n_threads >= 2**32:
        raise ValueError(f"{kind}: {n_threads} threads do not fit one 32-bit grid")
    tg = min(THREADGROUP, n_threads)
    return Launch(kind, (n_threads, 1, 1), (tg, 1, 1), [out_shape], sorted(template.items()), dims)


def _type_template(qtype: int, n: int) -> dict[str, int]:
    """QT, BB, BE, SB for rows of ``n`` weights of ``qtype``."""
    if qtype not in BLOCKS:
        raise ValueError(f"GGML type {Q(qtype).name} has no GPU kernel")
    be, bb = BLOCKS[qtype]
    if n % be:
        raise ValueError(f"row of {n} is not a whole number of {Q(qtype).name} blocks")
    if qtype not in (int(Q.F16), int(Q.F32)):
        assert block_info(qtype) == (be, bb)
    return {"QT": int(qtype), "BB": bb, "BE": be, "SB": be // 32}


def splits(work: int, n_blocks: int) -> tuple[int, int]:
    """(splits, blocks per split) for ``work`` threads of ``n_blocks`` blocks each: enough
    splits to reach TARGET_THREADS, never an empty one."""
    want = max(1, min(n_blocks, -(-TARGET_THREADS // max(1, work))))
    chunk = -(-n_blocks // want)
    return -(-n_blocks // chunk), chunk


def tile_for(count: int) -> int:
    """The smallest of 1, 2, 4, 8 that holds ``count`` tokens (8 for more)."""
    t = 1
    while t < min(count, MAX_TILE):
        t *= 2
    return t


MAX_MATRICES = 6  # matrices one matmul launch multiplies with the same input (W0 .. W5)


def plan_matmul(qtype: int, out: int | list[int], n: int, T: int, r0: int = 0, col_byte: int = 0,
                row_bytes: int | None = None, groups: int = 1, alone: bool = False) -> list[Launch]:
    """x (T, n) times ``out`` rows (or, a list, all the rows of up to MAX_MATRICES matrices of
    one type side by side, read from W0, W1, ...) of matrices whose rows are ``row_bytes``
    apart, read from byte ``col_byte`` of each row, the first from row ``r0``. With ``groups``
    G, x is (T, G, n) and rows g·out/G .. (g+1)·out/G read group g's slab (the attention's
    grouped output projection, one launch for all groups). The matmul, then the reduce of its
    splits if it has any. ``alone``: the tokens are different sessions' (a batch): the splits
    are those of one token, so that each token's sums run in the order they run alone (a
    thread's tile adds each of its tokens separately, block by block, whatever the tile)."""
    if T < 1:
        raise ValueError(f"matmul needs at least one token, got {T}")
    counts = list(out) if isinstance(out, (list, tuple)) else [out]
    if not 1 <= len(counts) <= MAX_MATRICES or (len(counts) > 1 and (r0 or groups > 1)):
        raise ValueError(f"matmul takes 1..{MAX_MATRICES} matrices, a row offset or groups only for one")
    R = sum(counts)
    if groups < 1 or R % groups:
        raise ValueError(f"{R} rows do not split into {groups} groups")
    tpl = _type_template(qtype, n)
    tile = tile_for(T)
    tpl["TILE"] = tile
    work = -(-T // tile) * R
    S, chunk = splits(R if alone else work, n // tpl["BE"])
    rb = n // tpl["BE"] * tpl["BB"] if row_bytes is None else row_bytes
    rows = counts + [0] * (MAX_MATRICES - len(counts))  # rows of W0..W4 (W5: what is left)
    dims = (R, T, r0, col_byte, S, chunk, n, rb, groups * n, R // groups, n if groups > 1 else 0, *rows[:5])
    mm = _launch("matmul", work * S, (T, R) if S == 1 else (T * R * S,), tpl, dims)
    if S == 1:
        return [mm]
    return [mm, _launch("reduce", T * R, (T, R), {}, (T * R, S))]


@dataclass(frozen=True)
class ExpertPlan:
    """The routed assignments of a batch sorted by expert: ``order`` maps a sorted position
    to its assignment (token · K + slot), ``inv`` the reverse; ``tiles`` (n_tiles, 3) are
    (expert, first sorted position, count <= tile) and cover every position once."""

    order: np.ndarray  # int32 (T·K,)
    inv: np.ndarray  # int32 (T·K,)
    tiles: np.ndarray  # int32 (n_tiles, 3)
    tile: int  # assignments per thread: 1, 2, 4 or 8
    T: int
    K: int


def expert_plan(sel: np.ndarray, n_expert: int) -> ExpertPlan:
    """Group a batch's expert choices ``sel`` (T, K) by expert; ids outside 0..n_expert-1 are
    refused (a kernel would read past the tensor)."""
    sel = np.asarray(sel)
    T, K = sel.shape
    flat = sel.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise ValueError(f"expert id out of range 0..{n_expert - 1}")
    order = np.argsort(flat, kind="stable").astype(np.int32)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order), dtype=np.int32)
    ids, starts, counts = np.unique(flat[order], return_index=True, return_counts=True)
    tile = tile_for(int(counts.max()))
    per = -(-counts // tile)
    which = np.repeat(np.arange(len(ids)), per)
    within = np.arange(int(per.sum())) - np.repeat(np.cumsum(per) - per, per)
    first = starts[which] + within * tile
    tiles = np.stack([ids[which], first, np.minimum(tile, counts[which] - within * tile)], axis=1).astype(np.int32)
    return ExpertPlan(order, inv, np.ascontiguousarray(tiles), tile, T, K)


@dataclass(frozen=True)
class ExpertLayout:
    """Where the expert kernels find expert (or pool slot) e's matrices in the buffers they are
    given: gate/up rows at ``gate + go + e·gu_stride`` and ``up + uo + e·gu_stride``, down rows
    at ``down + do + e·d_stride``. Over the file's tensors every offset is 0 and the stride is
    one expert; over the expert pool (engine/expertpool.py) the three buffers are the pool's
    memory, the stride one slot and the offsets where the layer's matrices sit in a slot."""

    gu_stride: int
    d_stride: int
    go: int = 0
    uo: int = 0
    do: int = 0


def plan_experts(gu_type: int, d_type: int, plan: ExpertPlan, F: int, E: int, layout: ExpertLayout | None = None,
                 n_run: int | None = None, alone: bool = False) -> list[Launch]:
    """The four launches of the routed FFN for ``plan``: gate/up partials, SwiGLU, down
    partials, the per-token sum. E is the hidden width, F the expert's. ``n_run``: the gate/up
    and down launches cover only that many of the plan's tiles (a run of them handed over
    separately, as when the expert pool holds a layer's experts in several turns); their
    splits are still the whole plan's, so every partial sum is the same bits either way.
    ``alone``: the tokens are different sessions' (a batch): the splits are those of one
    token's plan (one tile per chosen expert), as plan_matmul's."""
    n_tiles, A = len(plan.tiles), plan.T * plan.K
    n_split = plan.K if alone else n_tiles  # the tiles the splits are chosen for
    n_run = n_tiles if n_run is None else n_run
    gu = _type_template(gu_type, E)
    gu.update(TILE=plan.tile, F=F, K=plan.K, N=E, RB=E // gu["BE"] * gu["BB"])
    dn = _type_template(d_type, F)
    dn.update(TILE=plan.tile, R=E, N=F, RB=F // dn["BE"] * dn["BB"])
    layout = layout or ExpertLayout(F * gu["RB"], E * dn["RB"])
    gu.update(XS=layout.gu_stride, GO=layout.go, UO=layout.uo)
    dn.update(XS=layout.d_stride, DO=layout.do)
    S1, ch1 = splits(n_split * F, E // gu["BE"])
    S2, ch2 = splits(n_split * E, F // dn["BE"])
    return [_launch("moe_gate_up", n_run * F * S1, (A * F * 2 * S1,), gu, (n_run, S1, ch1)),
            _launch("moe_glu", A * F, (A, F), {"F": F}, (A, S1)),
            _launch("moe_down", n_run * E * S2, (A * E * S2,), dn, (n_run, S2, ch2)),
            _launch("moe_sum", plan.T * E, (plan.T, E), {"K": plan.K, "R": E}, (plan.T, S2))]


def _scaled_sink_softmax(scores: mx.array, sinks: mx.array, scale: float) -> tuple[mx.array, mx.array]:
    return sink_softmax(scores * scale, sinks)


# MLX passes a Metal kernel's inputs of fewer than 8 elements in constant memory, which makes
# another kernel source (another compile at open). The expert plan's small arrays (a decode
# step's 6 slots) are padded to this length, so one source serves every batch size.
SMALL = 8


def _padded(a: np.ndarray) -> np.ndarray:
    """``a`` (1-D int32) with zeros after it up to SMALL elements; the kernels never read them."""
    return a if a.size >= SMALL else np.concatenate([a, np.zeros(SMALL - a.size, a.dtype)])


def plan_hc(T: int, hc: int, E: int, iters: int) -> tuple[Launch, Launch]:
    """The mix weights of T tokens ((2 + hc)·hc values each: pre, post, comb), then the
    collapse of their hc streams of width E."""
    n = (2 + hc) * hc
    return (_launch("hc_weights", T, (T, n), {"HC": hc, "ITERS": iters}, (T,)),
            _launch("hc_collapse", T * E, (T, E), {"HC": hc, "E": E}, (T,)))


def plan_scores(H: int, V: int, D: int) -> Launch:
    return _launch("scores", H * V, (H, V), {"H": H, "D": D}, (V,))


def plan_mix(H: int, V: int, D: int) -> Launch:
    return _launch("mix", H * D, (H, D), {"H": H, "D": D}, (V,))


class GpuKernels(ReferenceKernels):
    """Metal or CUDA kernels for every dense product and the routed experts, at any number of
    tokens; decode attention (one query) and the hyper-connection mix too. What they do not
    cover (attention over several queries, the small MLX ops around the products) is the
    reference's, on the same device."""

    # A prefill chunk reads nearly every routed expert once whatever its size (a 256-token
    # chunk picks ~1500 slots of 256 experts): 1024 tokens spread that read over four times the
    # tokens for ~170 MB more temporaries (bench/gpu_model.py: +15-25% prefill on paper).
    prefill_chunk = 1024

    def __init__(self, weights: Weights, backend: str, make=None) -> None:
        """``make`` builds a kernel object the way mx.fast.metal_kernel / cuda_kernel do (the
        default for ``backend``); gpu_host.py passes one that runs the bodies on the CPU."""
        super().__init__(weights)
        if backend not in GID:
            raise ValueError(f"no GPU kernels for backend {backend!r}")
        if make is None:
            make = {"metal": mx.fast.metal_kernel, "cuda": getattr(mx.fast, "cuda_kernel", None)}.get(backend)
        if make is None:
            raise ValueError("this MLX build has no custom CUDA kernels")
        for name, t in weights.file.tensors.items():
            if "_exps." in name and t.type not in EXPERT_TYPES:
                raise ValueError(f"{name}: GGML type {t.type_name} has no GPU expert kernel")
        self.name = backend
        self.xp = mx
        self.backend = backend
        self._make = make
        self._kernels: dict[str, object] = {}
        self.resident = DeviceTensors(weights.file, self._to_device)
        grid, signs = iq2xxs_tables()
        self._grid, self._signs = self._to_device(grid.reshape(-1)), self._to_device(signs.reshape(-1))
        self._kernel("matmul")  # fail at open, not mid-answer, when the toolchain is missing
        if weights.pool is not None:
            self._pool_memory(weights.pool)  # the pool's slots must be where the kernels read

    def _kernel(self, kind: str):
        k = self._kernels.get(kind)
        if k is None:
            ins, outs, body = source(kind, self.backend)
            k = self._kernels[kind] = self._make(name=f"ds4_{kind}", input_names=ins, output_names=outs,
                                                 source=body, header=HEADER)
        return k

    def _run(self, launch: Launch, inputs: list) -> mx.array:
        inputs = [*inputs, mx.array(launch.dims, dtype=mx.int32)]
        return self._kernel(launch.kind)(inputs=inputs, grid=launch.grid, threadgroup=launch.threadgroup,
                                         output_shapes=launch.output_shapes, output_dtypes=[mx.float32],
                                         template=launch.template)[0]

    def _to_device(self, a: np.ndarray):
        return mx.array(a)

    def release(self, ops: set[str]) -> None:
        """Drop the device copies only the refused ``ops`` would have used (the self-check
        calls this: a refused expert kernel must not keep a layer's experts on the device)."""
        self.resident.drop(experts="experts" in ops,
                           dense={"linear", "linears", "grouped", "hc_pre"} <= ops)  # every dense product

    def _bytes(self, name: str):
        """The tensor's packed bytes on the device (resident.py: once, from the mmap)."""
        return self.resident.get(name)

    def _products(self, x: mx.array, names: tuple[str, ...], rows: tuple[int, int] | None = None,
                  cols: tuple[int, int] | None = None, groups: int = 1, alone: bool = False) -> mx.array:
        """x times matrices ``names`` (one type and width) in one launch: (T, their rows)."""
        t = self.w.file.tensors[names[0]]
        r0, r1 = rows or (0, t.shape[0])
        n, col_byte = t.shape[1], 0
        if cols is not None:
            be, bb = BLOCKS[t.type]
            if cols[0] % be or cols[1] % be:
                raise ValueError(f"{names[0]}: columns {cols[0]}..{cols[1]} are not whole blocks of {be}")
            n, col_byte = cols[1] - cols[0], cols[0] // be * bb
        counts = [r1 - r0] if len(names) == 1 else [self.w.file.tensors[nm].shape[0] for nm in names]
        T = x.shape[0]
        x = x.astype(mx.float32)
        ws = [self._bytes(nm) for nm in names]
        ws += [ws[0]] * (MAX_MATRICES - len(ws))  # unused slots: any array (never read)
        out = None
        for launch in plan_matmul(t.type, counts, n, T, r0, col_byte, t.row_bytes, groups, alone):
            out = self._run(launch, [*ws, x, self._grid, self._signs] if launch.kind == "matmul" else [out])
        return out

    def _kernel_matrix(self, name: str) -> bool:
        t = self.w.file.tensors[name]
        return t.type in KERNEL_TYPES and len(t.shape) == 2

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, alone: bool = False) -> mx.array:
        if not self._kernel_matrix(name):
            return super().linear(x, name, rows, cols, alone)
        return self._products(x, (name,), rows, cols, alone=alone)

    def linears(self, x: mx.array, names: tuple[str, ...], alone: bool = False) -> list[mx.array]:
        """The matrices of each type in one launch (up to MAX_MATRICES), their outputs split."""
        out: dict[str, mx.array] = {}
        by_type: dict[int, list[str]] = {}
        for nm in names:
            if self._kernel_matrix(nm):
                by_type.setdefault(self.w.file.tensors[nm].type, []).append(nm)
            else:
                out[nm] = super().linear(x, nm, alone=alone)
        for group in by_type.values():
            for i in range(0, len(group), MAX_MATRICES):
                part = tuple(group[i : i + MAX_MATRICES])
                y, at = self._products(x, part, alone=alone), 0
                for nm in part:
                    rows = self.w.file.tensors[nm].shape[0]
                    out[nm], at = y[:, at : at + rows], at + rows
        return [out[nm] for nm in names]

    def grouped(self, x: mx.array, name: str, alone: bool = False) -> mx.array:
        """Every group's rows through its own slab of x (T, G, n), in one launch."""
        if not self._kernel_matrix(name):
            return super().grouped(x, name, alone)
        return self._products(x, (name,), groups=x.shape[1], alone=alone)

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float,
                alone: bool = False) -> mx.array:
        p = f"blk.{layer}.ffn_"
        tg, tu = self.w.file.tensors[p + "gate_exps.weight"], self.w.file.tensors[p + "up_exps.weight"]
        td = self.w.file.tensors[p + "down_exps.weight"]
        if tu.type != tg.type:
            raise ValueError(f"layer {layer}: gate and up experts of different types ({tg.type_name}, {tu.type_name})")
        E, F = x.shape[1], tg.shape[1]
        plan = expert_plan(sel, tg.shape[0])
        x = x.astype(mx.float32)
        route = weights.astype(mx.float32).reshape(-1)
        if route.size < SMALL:
            route = mx.concatenate([route, mx.zeros((SMALL - route.size,), dtype=mx.float32)])
        order, inv = self._to_device(_padded(plan.order)), self._to_device(_padded(plan.inv))
        pool = self.w.pool
        if pool is None:
            launches = plan_experts(tg.type, td.type, plan, F, E, alone=alone)
            buffers = [self._bytes(p + k + "_exps.weight") for k in ("gate", "up", "down")]
            part = self._down_partials(launches, buffers, plan.tiles, x, order, route, clamp)
            return self._run(launches[3], [part, inv])
        # Streamed (engine/expertpool.py): the kernels read the pool's memory by slot. The plan
        # is sorted by expert, so each run of experts the pool holds at once is a run of tiles
        # and of sorted positions; each run's down partials are kept and the per-token sum is
        # made once over all of them, in the same order as from the file: the same bits.
        slot = pool.slot_bytes
        layout = ExpertLayout(slot, slot, *pool.offsets(layer))
        memory = self._pool_memory(pool)
        parts = []
        for span in pool.spans(sel):
            lo, hi = np.searchsorted(plan.tiles[:, 0], [span[0], span[-1] + 1])
            launches = plan_experts(tg.type, td.type, plan, F, E, layout, n_run=int(hi - lo), alone=alone)
            with pool.holding(layer, span) as rows:
                tiles = plan.tiles[lo:hi].copy()
                tiles[:, 0] = rows.slots[tiles[:, 0]]
                part = self._down_partials(launches, [memory] * 3, tiles, x, order, route, clamp)
                mx.eval(part)  # the slots may be refilled once released: read them first
            first, last = plan.tiles[lo], plan.tiles[hi - 1]
            size = part.size // (plan.T * plan.K)  # floats per sorted position
            parts.append(part[int(first[1]) * size : int(last[1] + last[2]) * size])
        part = parts[0] if len(parts) == 1 else mx.concatenate(parts)
        return self._run(plan_experts(tg.type, td.type, plan, F, E, layout, alone=alone)[3], [part, inv])

    def _down_partials(self, launches: list[Launch], buffers: list, tiles: np.ndarray, x: mx.array, order,
                       route: mx.array, clamp: float) -> mx.array:
        """Gate/up, SwiGLU and down over ``tiles`` (expert or slot, first position, count) of
        the experts in ``buffers`` (gate, up, down) as ``launches`` lay them out: the down
        partials of every sorted position those tiles cover."""
        gate_up, glu, down, _ = launches
        tiles = self._to_device(_padded(np.ascontiguousarray(tiles).reshape(-1)))
        part = self._run(gate_up, [buffers[0], buffers[1], x, tiles, order, self._grid, self._signs])
        mid = self._run(glu, [part, order, route, mx.array([clamp], dtype=mx.float32)])
        return self._run(down, [buffers[2], mid, tiles, self._grid, self._signs])

    def _pool_memory(self, pool):
        """The expert pool's memory as the kernels take it: the device array it lives in."""
        backing = pool.backing
        if isinstance(backing, mx.array):
            return backing
        raise ValueError("the expert pool's slots are not in device memory")

    def hc_pre(self, X: mx.array, fn: str, scale: mx.array, base: mx.array, alone: bool = False):
        cfg = self.w.cfg
        T, hc, E = X.shape
        X = X.astype(mx.float32)
        mix = self.linear(fused(hc_flat, cfg.rms_eps)(X), fn, alone=alone)
        weights, collapse = plan_hc(T, hc, E, cfg.hc_sinkhorn_iters)
        w = self._run(weights, [mix, scale.astype(mx.float32), base.astype(mx.float32),
                                mx.array([cfg.hc_eps], dtype=mx.float32)])
        x = self._run(collapse, [X, w])
        return x, w[:, hc : 2 * hc], w[:, 2 * hc :].reshape(T, hc, hc)

    def attend(self, q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array:
        H, T, D = q.shape
        if T != 1:
            return super().attend(q, keys, mask, sinks)
        visible = np.flatnonzero(mask[0]).astype(np.int32)
        idx = self._to_device(visible)
        V = len(visible)
        keys = keys.astype(mx.float32)  # the kernels read float32: any other dtype is converted, not misread
        scores = self._run(plan_scores(H, V, D), [q.reshape(H, D).astype(mx.float32), keys, idx])
        ex, den = fused(_scaled_sink_softmax, 1.0 / math.sqrt(D))(scores, sinks.reshape(H, 1).astype(mx.float32))
        out = self._run(plan_mix(H, V, D), [ex, keys, idx]) / den
        return out.reshape(H, 1, D)
