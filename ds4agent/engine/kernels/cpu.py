"""Native CPU kernels (cpu.c through ctypes) for the hot spots of a token.

* linear: any GGUF matrix (F32, F16, Q8_0, Q2_K, Q4_K, IQ2_XXS) times activations, read in
  place from the mmap: no repacked or dequantised copy of a weight is ever kept.
* experts: the fused routed-expert FFN (gather, dequantise, gate/up, clamped SwiGLU, routing
  weight, down, sum) in one call per layer.
* attend: the whole sink-softmax attention in one call (ds4_attend), over only the rows each
  query can see; matmul (indexer scores): through the same float kernel as the weights.
  Not BLAS: MLX's CPU backend on Linux ships a reference GEMM (about 4 GFLOP/s here), and
  numpy's OpenBLAS, though fast alone, keeps its own threads spinning after each call and
  starves the OpenMP threads of cpu.c (decode ran 2.8x slower with it).

They take and return numpy arrays (``xp = NP``), so the model runs its small ops (norms,
RoPE, compressors, routing) in numpy too: engine/xp.py. ctypes drops the GIL for the duration
of each call; OpenMP inside cpu.c uses every core.
"""

from __future__ import annotations

import ctypes
import sys
import time

import mlx.core as mx
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

from ... import settings
from ..expertpool import ExpertRows
from ..qat import ceil_log2_table
from ..quants import iq2xxs_tables, mxfp4_values
from ..weights import Weights
from ..xp import NP
from . import cpu_tune
from .cpu_build import build

SUPPORTED = frozenset({int(Q.F32), int(Q.F16), int(Q.Q8_0), int(Q.Q2_K), int(Q.Q4_K), int(Q.IQ2_XXS), int(Q.MXFP4)})

_P = ctypes.c_void_p
_I = ctypes.c_int64
_lib: ctypes.CDLL | None = None


def _keep_freed_memory() -> None:
    """Have glibc keep large freed blocks for reuse instead of handing them back to the OS.

    A prefill chunk's temporaries are tens of MB each (the queries alone: 256 tokens x 64 heads
    x 512 floats = 33.5 MB), above glibc's largest mmap threshold (32 MB): each was a fresh
    mapping whose pages faulted in one by one, 8 000 faults for the queries, which cost more
    than computing them (on a 2-core VM: 24 ms of the queries' 28, and some 10% of a prefill).
    With the thresholds raised, freed blocks are reused and the pages stay mapped; the process
    keeps its peak of temporaries instead of returning it between chunks. Linux glibc only;
    elsewhere this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # not glibc
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mallopt(M_MMAP_THRESHOLD, 1 << 30)
    mallopt(M_TRIM_THRESHOLD, 1 << 30)


def library() -> ctypes.CDLL:
    """The loaded kernel library (built on first use; raises cpu_build.BuildError)."""
    global _lib
    if _lib is None:
        lib = build()
        _keep_freed_memory()
        lib.ds4_dequant.argtypes = [_P, ctypes.c_int, _I, _I, _I, _P]
        lib.ds4_matmul.argtypes = [_P, ctypes.c_int, _I, _I, _I, _P, _I, _P, ctypes.c_int, ctypes.c_int]
        lib.ds4_moe.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, ctypes.c_int, _I, _P, ctypes.c_int, _I,
                                ctypes.c_float, _P, ctypes.c_int, ctypes.c_int]
        lib.ds4_quantize_act.argtypes = [_P, _I, _I, _P]
        lib.ds4_quantize_k.argtypes = [_P, _I, _I, _P]
        lib.ds4_set_amx.argtypes = [ctypes.c_int]
        lib.ds4_set_vnni512.argtypes = [ctypes.c_int]
        lib.ds4_alone_max.argtypes = []
        lib.ds4_set_ceil_log2_table.argtypes = [_P]
        lib.ds4_kv_round.argtypes = [_P, _I, _I, _I]
        lib.ds4_indexer_round.argtypes = [_P, _I, _I]
        lib.ds4_queries.argtypes = [_P, _I, _I, _I, _I, _P, _P, ctypes.c_float, _P]
        lib.ds4_unrotate.argtypes = [_P, _I, _I, _I, _I, _P, _P, _I, _P]
        lib.ds4_attend.argtypes = [_P, _I, _I, _I, _P, _I, _P, _P, _P]
        lib.ds4_matmul_multi.argtypes = [_I, _P, _P, _P, _P, _I, _P, _I, _P, ctypes.c_int, ctypes.c_int]
        lib.ds4_matmul_grouped.argtypes = [_P, ctypes.c_int, _I, _I, _I, _I, _P, _I, _P, ctypes.c_int, ctypes.c_int]
        lib.ds4_hc_pre.argtypes = [_P, _I, _I, _I, _P, ctypes.c_int, _I, _P, _P, ctypes.c_float, ctypes.c_float,
                                   ctypes.c_int, _P, _P, _P, ctypes.c_int]
        lib.ds4_hc_post.argtypes = [_P, _P, _P, _P, _I, _I, _I, _P]
        lib.ds4_set_iq2_tables.argtypes = [_P, _P]
        lib.ds4_set_mxfp4_values.argtypes = [_P]
        lib.ds4_set_threads.argtypes = [ctypes.c_int]
        lib.ds4_read.argtypes = [_P, _I]
        lib.ds4_read.restype = ctypes.c_uint64
        lib.ds4_set_prefetch.argtypes = [_I, _I]
        lib.ds4_get_prefetch.argtypes = [_P]
        grid, signs = iq2xxs_tables()
        lib.ds4_set_iq2_tables(grid.ctypes.data, signs.ctypes.data)
        values = mxfp4_values()  # named: alive through the call
        lib.ds4_set_mxfp4_values(values.ctypes.data)
        table = np.ascontiguousarray(ceil_log2_table(), dtype=np.int32)  # named: alive through the call
        lib.ds4_set_ceil_log2_table(table.ctypes.data)
        if settings.cpu_threads():
            lib.ds4_set_threads(settings.cpu_threads())
        if settings.amx_disabled():  # the tiles off (comparisons; a kernel that refuses them)
            lib.ds4_set_amx(0)
        _lib = lib
    return _lib


def prefetch() -> tuple[int, int]:
    """The prefetch distances the kernels use now: (bytes ahead in the Q8_0 products, rows
    ahead in the expert products); cpu_tune chooses them."""
    out = np.zeros(2, np.int64)
    library().ds4_get_prefetch(out.ctypes.data)
    return int(out[0]), int(out[1])


def set_threads(n: int) -> None:
    library().ds4_set_threads(n)


def threads() -> int:
    return int(library().ds4_threads())


def read_bandwidth(view: np.ndarray, repeat: int = 3) -> float:
    """Bytes per second at which every core together reads ``view`` (best of ``repeat`` timed
    passes after one untimed pass that pages it in): the machine's read bandwidth for that
    memory, what a bandwidth-bound product can reach at best."""
    buf = np.ascontiguousarray(view).view(np.uint8).reshape(-1)
    lib = library()
    lib.ds4_read(buf.ctypes.data, buf.size)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        lib.ds4_read(buf.ctypes.data, buf.size)
        best = min(best, time.perf_counter() - t)
    return buf.size / best


def _f32(x: mx.array | np.ndarray) -> np.ndarray:
    if isinstance(x, mx.array):
        # Evaluate first: numpy's conversion of a pending MLX graph costs ~4x an explicit eval.
        mx.eval(x)
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def dequant(raw: np.ndarray, qtype: int, n: int) -> np.ndarray:
    """Rows of packed blocks (rows, row_bytes) -> (rows, n) float32, through cpu.c."""
    raw = np.ascontiguousarray(raw.view(np.uint8)).reshape(-1, raw.view(np.uint8).shape[-1])
    out = np.empty((raw.shape[0], n), dtype=np.float32)
    if library().ds4_dequant(raw.ctypes.data, int(qtype), raw.shape[1], raw.shape[0], n, out.ctypes.data):
        raise ValueError(f"no CPU dequantiser for GGML type {qtype}")
    return out


def int8_available() -> bool:
    """Whether this build has the integer (8-bit activation) path: x86-64 with AVX2 and FMA."""
    return bool(library().ds4_int8_available())


QBLOCK = np.dtype([("d", "<f4"), ("s", "<i2", 2), ("q", "i1", 32), ("ds", "<f4", 8)])


def quantize_act(x: np.ndarray) -> np.ndarray:
    """The activation blocks the integer path multiplies with: (T, n/32) of QBLOCK."""
    x = _f32(x)
    out = np.empty((x.shape[0], x.shape[1] // 32), dtype=QBLOCK)
    library().ds4_quantize_act(x.ctypes.data, x.shape[0], x.shape[1], out.ctypes.data)
    return out


def set_amx(on: bool) -> bool:
    """Use Intel AMX tiles for Q8_0 products of 16 tokens and more (the default where the CPU
    and the kernel allow it) or not; returns whether they are used now."""
    return bool(library().ds4_set_amx(int(on)))


def set_vnni512(on: bool) -> bool:
    """Use the AVX-512 VNNI kernel for Q8_0 products of 16 tokens and more where no AMX tiles
    take them (the default where the build has AVX-512 VNNI) or the decoded-row kernels;
    returns whether it is used now."""
    return bool(library().ds4_set_vnni512(int(on)))


KBLOCK = np.dtype([("q", "i1", 256), ("bsum", "<i2", 16), ("d", "<f4"), ("pad", "<i4", 7)])


def quantize_k(x: np.ndarray) -> np.ndarray:
    """The activation blocks IQ2_XXS and Q2_K products of fewer than 16 tokens multiply with:
    (T, n/256) of KBLOCK (one scale per 256 values)."""
    x = _f32(x)
    out = np.empty((x.shape[0], x.shape[1] // 256), dtype=KBLOCK)
    library().ds4_quantize_k(x.ctypes.data, x.shape[0], x.shape[1], out.ctypes.data)
    return out


def matmul_raw(raw: np.ndarray, qtype: int, n: int, x: np.ndarray, int8: bool = True, alone: int = 0
               ) -> np.ndarray:
    """x (T, n) @ Wᵀ for W = packed rows raw (out, row_bytes) of n elements each. With int8
    and a quantised W (and an AVX2 build) the activations go through quantize_act first
    (quantize_k for IQ2_XXS and Q2_K below 16 tokens). ``alone`` (> 0): each token's row the
    same bits as a product of that token alone, the weights still read once for all of them,
    this many tokens per pass (alone_group).

    Each row's bytes must be contiguous, the rows need not be: a column range of a matrix is
    a view whose rows lie a whole row of the file apart (cpu.c takes that distance as the
    row stride and reads only the n elements of each)."""
    raw = raw.view(np.uint8)
    if raw.ndim != 2 or raw.strides[1] != 1:
        raise ValueError("weight rows must be contiguous")
    stride = raw.strides[0]
    if stride != raw.shape[1] and raw.shape[0] % 16:
        # The 16-row tile kernels pad a last partial tile by copying whole strides, which
        # would read past the end of a column range's last row: give them a compact copy.
        raw, stride = np.ascontiguousarray(raw), raw.shape[1]
    x = _f32(x)
    y = np.empty((x.shape[0], raw.shape[0]), dtype=np.float32)
    if library().ds4_matmul(raw.ctypes.data, int(qtype), stride, raw.shape[0], n, x.ctypes.data, x.shape[0],
                            y.ctypes.data, int(int8), int(alone)):
        raise ValueError(f"no CPU kernel for GGML type {qtype}")
    return y


def alone_group(raw: np.ndarray, qtype: int, n: int, int8: bool) -> int:
    """How many tokens one pass of the alone products may take over rows ``raw`` (a few rows of
    the matrix) while each token keeps the bits it gets alone: the largest g (at most the C
    side's ds4_alone_max) such that a pass of every count of tokens from 2 to g computes each
    token as the one-token path does (the same dot products in the same order: checked here on
    these rows), else 1. Machines and types differ: the few-token Q8_0 kernel takes 8 tokens on
    AVX-512 VNNI; elsewhere the one-token Q8_0 product has a path of its own."""
    most = library().ds4_alone_max()
    x = np.random.default_rng(0).standard_normal((most, n)).astype(np.float32)
    ones = np.concatenate([matmul_raw(raw, qtype, n, x[t : t + 1], int8) for t in range(most)])
    g = 1
    for m in range(2, most + 1):
        if not np.array_equal(matmul_raw(raw, qtype, n, x[:m], int8).view(np.uint32), ones[:m].view(np.uint32)):
            break
        g = m
    return g


def moe_raw(x: np.ndarray, sel: np.ndarray, route_w: np.ndarray, gate: np.ndarray, up: np.ndarray, gu_type: int,
            down: np.ndarray, d_type: int, clamp: float, int8: bool = True) -> np.ndarray:
    """The routed-expert FFN on raw expert tensors gate/up (n_exp, F, row_bytes) and down
    (n_exp, E, row_bytes): x (T, E), sel/route_w (T, k) -> (T, E)."""
    return moe_rows(x, sel, route_w, ExpertRows.over(gate, up, gu_type, down, d_type), clamp, int8)


def moe_rows(x: np.ndarray, sel: np.ndarray, route_w: np.ndarray, rows: ExpertRows, clamp: float,
             int8: bool = True, into: np.ndarray | None = None, alone: int = 0) -> np.ndarray:
    """The routed-expert FFN over experts found through ``rows`` (the mapped file or the
    expert pool's slots): x (T, E), sel/route_w (T, k) -> (T, E). A selection of -1 is left
    out; ``into`` (T, E) is added to in place (the next range of experts of the same call).
    ``alone`` (> 0): each token's output the bits it gets as the only token of the call, this
    many tokens per pass (alone_group)."""
    x = _f32(x)
    T, E = x.shape
    sel = np.ascontiguousarray(sel, dtype=np.int32)
    route_w = _f32(route_w)
    y = np.zeros((T, E), dtype=np.float32) if into is None else into
    if y.shape != (T, E) or y.dtype != np.float32 or not y.flags.c_contiguous:
        raise ValueError(f"expert output {y.shape} {y.dtype} for {T} tokens of {E}")
    rc = library().ds4_moe(x.ctypes.data, T, E, rows.F, len(rows.gate), sel.shape[1], sel.ctypes.data,
                           route_w.ctypes.data, rows.gate.ctypes.data, rows.up.ctypes.data, rows.gu_type,
                           rows.gu_row_bytes, rows.down.ctypes.data, rows.d_type, rows.d_row_bytes, clamp,
                           y.ctypes.data, int(int8), int(alone))
    if rc:
        why = {-1: "unsupported expert type", -2: "out of memory", -3: "expert id out of range"}
        raise ValueError(why.get(rc, str(rc)))
    return y


def products(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """a (M, D) @ rowsᵀ for float32 rows (N, D), through the same kernel as the weights."""
    rows = _f32(rows)
    return matmul_raw(rows.view(np.uint8), int(Q.F32), rows.shape[1], a, False)


def kv_round(rows: np.ndarray, n_rot: int) -> np.ndarray:
    """qat.f16_round(qat.fp8_kv_round(rows, n_rot)) through cpu.c: the same bits."""
    out = np.array(_f32(rows))  # a copy: the C function rounds in place
    width = out.shape[-1]
    if (width - n_rot) % 64:
        raise ValueError(f"KV rows of {width} with {n_rot} rotated dims are not whole FP8 blocks")
    library().ds4_kv_round(out.ctypes.data, out.size // width, width, n_rot)
    return out


def indexer_round(rows: np.ndarray) -> np.ndarray:
    """qat.indexer_round (Hadamard, then FP4 blocks) through cpu.c: the same bits."""
    out = np.array(_f32(rows))  # a copy: the C function rounds in place
    width = out.shape[-1]
    if width & (width - 1) or width % 32:
        raise ValueError(f"indexer rows of {width} are not a power of two of whole FP4 blocks")
    library().ds4_indexer_round(out.ctypes.data, out.size // width, width)
    return out


def attend(q: np.ndarray, keys: np.ndarray, mask: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """The reference attention (kernels.reference.attend_mx) through cpu.c's ds4_attend:
    q (H, T, D), keys (N, D) shared by every head (and the values), mask (T, N), sinks (H,)."""
    q, keys, sinks = _f32(q), _f32(keys), _f32(sinks)
    H, T, D = q.shape
    m = np.ascontiguousarray(mask, dtype=np.bool_).view(np.uint8)
    if keys.shape[1] != D or m.shape != (T, keys.shape[0]) or sinks.shape != (H,):
        raise ValueError(f"attention shapes q {q.shape}, keys {keys.shape}, mask {m.shape}, sinks {sinks.shape}")
    out = np.empty_like(q)
    if library().ds4_attend(q.ctypes.data, H, T, D, keys.ctypes.data, keys.shape[0], m.ctypes.data,
                            sinks.ctypes.data, out.ctypes.data):
        raise MemoryError("attention: out of memory")
    return out


class CpuKernels:
    """``exact``: keep activations in float32 for every product (the ``cpu-exact`` kernels);
    otherwise products with a quantised weight take the integer path where this CPU has one."""

    def __init__(self, weights: Weights, exact: bool = False) -> None:
        self.w = weights
        # Prefetch distances: from DS4_PREFETCH or this machine's cache now; if neither has them,
        # measured on this model at the first expert product (opening reads no weights).
        self.prefetch = cpu_tune.choose(library())
        self._measure_prefetch = self.prefetch.source == "default"
        self.int8 = not exact and int8_available()
        self._views: dict[str, tuple[np.ndarray, int, int]] = {}
        self._experts: dict[int, ExpertRows] = {}
        self._plans: dict[tuple[str, ...], tuple] = {}
        self._groups: dict[str, int] = {}  # tokens per pass of the alone products, per matrix
        self.name = "cpu" if self.int8 else "cpu-exact"  # what the arithmetic is, not what was asked
        # The self-check's bounds (kernels/check.py) for the 8-bit path, as tests/test_kernels.py
        # bounds it: activations rounded to 8 bits per block (measured on the demo model: about
        # 5e-3 for the dense products, 2e-2 for the routed experts); float32 elsewhere.
        self.check_tolerance = {"linear": 2e-2, "linears": 2e-2, "grouped": 2e-2, "experts": 4e-2} if self.int8 else {}
        self.xp = NP
        for name, t in weights.file.tensors.items():
            if name.endswith(".weight") and len(t.shape) >= 2 and t.type not in SUPPORTED and "tid2eid" not in name:
                raise ValueError(f"{name}: GGML type {t.type_name} has no CPU kernel")

    def _matrix(self, name: str) -> tuple[np.ndarray, int, int]:
        """(packed rows (out, row_bytes) viewing the mmap, GGML type, elements per row), cached:
        a decode step asks for a few hundred matrices."""
        m = self._views.get(name)
        if m is None:
            t = self.w.file.tensors[name]
            m = self._views[name] = (self.w.file.array(name).view(np.uint8).reshape(t.shape[0], -1), t.type,
                                     t.shape[-1])
        return m

    def linear(self, x: mx.array, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, alone: bool = False) -> mx.array:
        raw, qtype, n = self._matrix(name)
        if rows is not None:
            raw = raw[rows[0] : rows[1]]
        if cols is not None:  # whole blocks of the row: a strided view of the mmap, no copy
            block, size = GGML_QUANT_SIZES[qtype]
            if cols[0] % block or cols[1] % block:
                raise ValueError(f"{name}: columns {cols[0]}..{cols[1]} are not whole blocks of {block}")
            raw = raw[:, cols[0] // block * size : cols[1] // block * size]
            n = cols[1] - cols[0]
        return matmul_raw(raw, qtype, n, x, self.int8, self._alone(alone, name))

    def _alone(self, alone: bool, *names: str) -> int:
        """The ``alone`` argument of the C products over matrices ``names``: 0 (one batch), or
        the tokens per pass that keep each token's bits for all of them (alone_group, checked
        once per matrix on its first rows)."""
        if not alone:
            return 0
        groups = []
        for name in names:
            g = self._groups.get(name)
            if g is None:
                t = self.w.file.tensors[name]
                rows = self.w.file.array(name).view(np.uint8).reshape(-1, t.row_bytes)[:8]
                g = self._groups[name] = alone_group(rows, t.type, t.shape[-1], self.int8)
            groups.append(g)
        return min(groups)

    def linears(self, x: mx.array, names: tuple[str, ...], alone: bool = False) -> list[np.ndarray]:
        """``[linear(x, n) for n in names]`` for matrices with the same input width, in one
        call: the activations are quantised once and Python crosses into C once."""
        plan = self._plans.get(names)
        if plan is None:
            ms = [self._matrix(n) for n in names]
            if len({n for _, _, n in ms}) != 1:
                raise ValueError(f"{names}: the matrices take different input widths")
            outs = np.array([raw.shape[0] for raw, _, _ in ms], dtype=np.int64)
            plan = self._plans[names] = (
                np.array([raw.ctypes.data for raw, _, _ in ms], dtype=np.int64),
                np.array([qtype for _, qtype, _ in ms], dtype=np.int32),
                np.array([raw.shape[1] for raw, _, _ in ms], dtype=np.int64),
                outs, np.concatenate([[0], np.cumsum(outs)]), ms[0][2])
        wp, types, row_bytes, outs, ends, n = plan
        x = _f32(x)
        T = x.shape[0]
        y = np.empty(T * int(ends[-1]), dtype=np.float32)
        yp = y.ctypes.data + 4 * T * ends[:-1]
        if library().ds4_matmul_multi(len(names), wp.ctypes.data, types.ctypes.data, row_bytes.ctypes.data,
                                      outs.ctypes.data, n, x.ctypes.data, T, yp.ctypes.data, int(self.int8),
                                      self._alone(alone, *names)):
            raise ValueError(f"{names}: no CPU kernel for one of these types")
        return [y[T * a : T * b].reshape(T, b - a) for a, b in zip(ends[:-1].tolist(), ends[1:].tolist())]

    def queries(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg = self.w.cfg
        x, cos, sin = _f32(x), _f32(cos), _f32(sin)
        D = cfg.head_dim
        T, H = x.shape[0], x.shape[1] // D  # all heads, or an expert split's share
        out = np.empty((H, T, D), dtype=np.float32)
        library().ds4_queries(x.ctypes.data, T, H, D, cfg.n_rot, cos.ctypes.data, sin.ctypes.data, cfg.rms_eps,
                              out.ctypes.data)
        return out

    def unrotate(self, o: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        cfg = self.w.cfg
        o, cos, sin = _f32(o), _f32(cos), _f32(sin)
        H, T, D = o.shape
        G = H // (cfg.n_head // cfg.n_out_group)  # whole groups: all, or an expert split's share
        if cfg.n_rot > 512 or not G or H % G:
            raise ValueError(f"{H} heads with {cfg.n_rot} rotated dims cannot be regrouped into {G}")
        slabs = np.empty((G, T, H // G * D), dtype=np.float32)
        library().ds4_unrotate(o.ctypes.data, T, H, D, cfg.n_rot, cos.ctypes.data, sin.ctypes.data, G,
                               slabs.ctypes.data)
        return slabs.transpose(1, 0, 2)  # (T, G, n), the layout grouped() reads without a copy

    def grouped(self, x: mx.array, name: str, alone: bool = False) -> mx.array:
        raw, qtype, n = self._matrix(name)
        xn = x if isinstance(x, np.ndarray) and x.dtype == np.float32 else _f32(x)  # keep a transposed view
        T, G, _ = xn.shape
        R = raw.shape[0] // G
        slabs = np.ascontiguousarray(xn.transpose(1, 0, 2))  # (G, T, n): each group's rows together
        y = np.empty((T, G * R), dtype=np.float32)
        if library().ds4_matmul_grouped(raw.ctypes.data, int(qtype), raw.shape[1], G, R, n, slabs.ctypes.data, T,
                                        y.ctypes.data, int(self.int8), self._alone(alone, name)):
            raise ValueError(f"{name}: no CPU kernel for GGML type {qtype}")
        return y

    def experts(self, layer: int, x: mx.array, sel: np.ndarray, weights: mx.array, clamp: float,
                alone: bool = False) -> mx.array:
        if self._measure_prefetch:
            self._measure_prefetch = False
            self.prefetch = cpu_tune.measure_once(self.w.file, library(), matmul_raw)
        x, weights = _f32(x), _f32(weights)
        p = f"blk.{layer}.ffn_"
        alone = self._alone(alone, p + "gate_exps.weight", p + "down_exps.weight")
        pool = self.w.pool
        if pool is None:
            rows = self._experts.get(layer)
            if rows is None:  # every expert's address in the mapped file, once per layer
                f, p = self.w.file, f"blk.{layer}.ffn_"
                gate, up, down = (p + k + "_exps.weight" for k in ("gate", "up", "down"))
                rows = self._experts[layer] = ExpertRows.over(f.array(gate), f.array(up), f.tensors[gate].type,
                                                              f.array(down), f.tensors[down].type)
            return moe_rows(x, sel, weights, rows, clamp, self.int8, alone=alone)
        # Streamed: the chosen experts in ascending runs that fit the pool, each run's outputs
        # added to the last in the order one call would add them (the same bits).
        y = np.zeros(x.shape, dtype=np.float32)
        spans = pool.spans(sel)
        for span in spans:
            part = sel if len(spans) == 1 else np.where(np.isin(sel, span), sel, -1)
            with pool.holding(layer, span) as rows:
                moe_rows(x, part, weights, rows, clamp, self.int8, into=y, alone=alone)
        return y

    def attend(self, q: mx.array, keys: mx.array, mask: np.ndarray, sinks: mx.array) -> mx.array:
        return attend(q, keys, mask, sinks)

    def kv_round(self, rows: np.ndarray, n_rot: int) -> np.ndarray:
        return kv_round(rows, n_rot)

    def indexer_round(self, rows: np.ndarray) -> np.ndarray:
        return indexer_round(rows)

    def hc_pre(self, X: mx.array, fn: str, scale: mx.array, base: mx.array, alone: bool = False):
        cfg = self.w.cfg
        Xn = _f32(X)
        T, hc, E = Xn.shape
        raw, qtype, n = self._matrix(fn)
        x, post, M = (np.empty(shape, np.float32) for shape in ((T, E), (T, hc), (T, hc, hc)))
        # Converted inputs are bound to names: a temporary's buffer would be freed as soon as
        # its address is taken, before the C call reads it.
        scale, base = _f32(scale), _f32(base)
        rc = library().ds4_hc_pre(Xn.ctypes.data, T, hc, E, raw.ctypes.data, int(qtype), raw.shape[1],
                                  scale.ctypes.data, base.ctypes.data, cfg.rms_eps, cfg.hc_eps,
                                  cfg.hc_sinkhorn_iters, x.ctypes.data, post.ctypes.data, M.ctypes.data, int(alone))
        if rc:
            raise ValueError(f"{fn}: hyper-connection mix failed ({rc})")
        return x, post, M

    def hc_post(self, y: mx.array, X: mx.array, post: mx.array, M: mx.array) -> mx.array:
        Xn = _f32(X)
        T, hc, E = Xn.shape
        out = np.empty_like(Xn)
        y, post, M = _f32(y), _f32(post), _f32(M)  # named, as in hc_pre
        library().ds4_hc_post(y.ctypes.data, Xn.ctypes.data, post.ctypes.data, M.ctypes.data, T, hc, E, out.ctypes.data)
        return out

    def matmul(self, a: mx.array, b: mx.array) -> mx.array:
        a_np = _f32(a)
        out = products(a_np.reshape(-1, a_np.shape[-1]), np.ascontiguousarray(_f32(b).T))
        return out.reshape(*a_np.shape[:-1], -1)
