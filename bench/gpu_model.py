"""The GPU path's cost on paper: bytes and FLOPs per token of decode and of prefill chunks, from
the kernels' own launch plans (engine/kernels/gpu.py: plan_matmul, expert_plan, plan_experts),
turned into tokens per second for a device's bandwidth and throughput.

    python bench/gpu_model.py [MODEL.gguf] [--device m3-max|m5-max|h200|all] [--ctx 2048,16384]

Without a model it uses the published q2 layout (43 layers, real dimensions and quant mix,
written as a header-only file). Nothing here runs a kernel: it lists the products a token makes
(the same calls engine/model.py makes, layer by layer), asks the plans what each launch reads,
writes and computes, and adds them up. For each launch the time is the larger of its bytes at
the device's bandwidth and its FLOPs at its throughput (a roofline), each derated by the
efficiency a kernel of that kind can expect, plus a fixed cost per dispatch; MLX's own work
between the products (norms, the hyper-connection mixes, RoPE, the compressors, prefill
attention) is counted from its sizes, with a dispatch count per layer that is an estimate.

What is modelled, per kernel set:
* ``gpu`` (ours): each thread dequantises a row's block once per tile of up to 8 tokens, so a
  prefill chunk of T tokens reads a dense matrix T/8 times and an expert once per 8 of its
  tokens; FLOPs are scalar FMAs (no matrix units) plus the dequantisation per weight per tile.
* ``kquant`` (mlx-kquant, Metal only): products on the matrix units, weights read once per
  64-row tile of tokens (its segment GEMM for experts), decode bandwidth-bound like ours.

Every device number below is a published specification or an assumption, said as such; the
efficiencies are assumptions to be replaced by bench/gpu_check.sh's and bench/mac_check.sh's
measurements. README ("GPU: on paper") records the output.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds4agent.engine.kernels import gpu  # noqa: E402
from ds4agent.modelfile.config import FLASH, ModelConfig, config_from_gguf  # noqa: E402
from ds4agent.modelfile.gguf import GGUFFile  # noqa: E402


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s
    fp32: float  # FLOP/s of scalar FMA (2 FLOPs each)
    matrix: float  # FLOP/s of the matrix units at bf16/f16 (what mlx-kquant's prefill uses)
    dispatch: float  # seconds per kernel dispatch
    source: str


DEVICES = {
    "m3-max": Device("M3 Max (40-core GPU)", 400e9, 14.2e12, 14.2e12, 4e-6,
                     "400 GB/s (Apple); 40 cores x 128 lanes x 2 x 1.39 GHz; no separate matrix units"),
    "m5-max": Device("M5 Max (40-core GPU)", 614e9, 18.0e12, 70e12, 4e-6,
                     "614 GB/s and 70 TFLOPS f16 on the per-core neural accelerators are assumptions (2x M5 Pro's "
                     "bandwidth; Apple's 4x AI compute over M4); fp32 40 x 128 x 2 x 1.75 GHz"),
    "h200": Device("H200 SXM", 4.8e12, 67e12, 989e12, 3e-6, "4.8 TB/s, 67 TFLOPS fp32, 989 TFLOPS bf16 dense (NVIDIA)"),
}
# Assumed efficiencies (fractions of the roofline a kernel of that kind reaches) and MLX's own
# dispatches per layer between our products (norms, mixes, RoPE, compressors, routing).
EFF = {"gpu_bw": 0.6, "gpu_flops": 0.35, "kquant_bw": 0.75, "kquant_matrix": 0.5, "mlx_bw": 0.5, "mlx_matrix": 0.4}
MLX_DISPATCHES_PER_LAYER = 60
DEQUANT_FLOPS = 3  # per weight per tile: scale multiply, shift/mask, convert


@dataclass
class Cost:
    bytes: float = 0.0
    flops: float = 0.0  # scalar FLOPs (ours, MLX elementwise)
    matrix_flops: float = 0.0  # FLOPs on matrix units (kquant, MLX matmul)
    dispatches: int = 0
    by: dict | None = None

    def add(self, what: str, b: float, f: float = 0.0, m: float = 0.0, d: int = 1) -> None:
        self.bytes += b
        self.flops += f
        self.matrix_flops += m
        self.dispatches += d
        if self.by is None:
            self.by = {}
        o = self.by.setdefault(what, [0.0, 0.0, 0.0])
        o[0] += b
        o[1] += f
        o[2] += m


def _matmul_ours(c: Cost, what: str, qtype: int, rows: int, n: int, T: int) -> None:
    """A dense product through plan_matmul: its launches' bytes and FLOPs."""
    launches = gpu.plan_matmul(qtype, rows, n, T)
    mm = launches[0]
    tile = dict(mm.template)["TILE"]
    be, bb = gpu.BLOCKS[qtype]
    tiles = -(-T // tile)
    row_bytes = n // be * bb
    S = mm.dims[4]
    c.add(what, tiles * rows * row_bytes + T * n * 4 + T * rows * S * 4,
          tiles * tile * rows * n * 2 + tiles * rows * n * DEQUANT_FLOPS, 0, 1)
    if len(launches) > 1:
        c.add(what, T * rows * S * 4 + T * rows * 4, T * rows * S, 0, 1)


def _matmul_kquant(c: Cost, what: str, qtype: int, rows: int, n: int, T: int) -> None:
    """mlx-kquant: decode-sized products read the weights once (a matvec); larger ones are
    matrix-unit GEMMs over 64-token tiles. F16 matrices are MLX's matmul: counted the same."""
    be, bb = gpu.BLOCKS[qtype]
    reads = 1 if T <= 8 else -(-T // 64)
    c.add(what, reads * rows * n // be * bb + T * (n + rows) * 2, 0 if T > 8 else 2 * T * rows * n,
          2 * T * rows * n if T > 8 else 0, 1)


def _experts(c: Cost, kernels: str, cfg: ModelConfig, gu_type: int, d_type: int, T: int, rng) -> None:
    """The routed FFN of one layer for T tokens routed uniformly at random (a real prompt's
    routing is less even, which makes tiles fuller: this errs on the slow side for ours)."""
    E, F, k = cfg.n_embd, cfg.expert_ff, cfg.n_expert_used
    sel = np.stack([rng.choice(cfg.n_expert, k, replace=False) for _ in range(T)])
    be_g, bb_g = gpu.BLOCKS[gu_type]
    be_d, bb_d = gpu.BLOCKS[d_type]
    gu_row, d_row = E // be_g * bb_g, F // be_d * bb_d
    if kernels == "gpu":
        plan = gpu.expert_plan(sel, cfg.n_expert)
        launches = gpu.plan_experts(gu_type, d_type, plan, F, E)
        n_tiles, tile, A = len(plan.tiles), plan.tile, T * k
        S1, S2 = launches[0].dims[1], launches[2].dims[1]
        c.add("experts", 2 * n_tiles * F * gu_row + T * E * 4 + A * F * 2 * S1 * 4,
              n_tiles * F * (2 * 2 * tile * E + 2 * E * DEQUANT_FLOPS))
        c.add("experts", A * F * 2 * S1 * 4 + A * F * 4, A * F * (2 * S1 + 8))
        c.add("experts", n_tiles * E * d_row + A * F * 4 + A * E * S2 * 4, n_tiles * E * (2 * tile * F + F * DEQUANT_FLOPS))
        c.add("experts", A * E * S2 * 4 + T * E * 4, A * E * S2)
        return
    used = len(np.unique(sel))
    per = np.bincount(sel.reshape(-1), minlength=cfg.n_expert)
    reads = 1 if T <= 8 else float(np.sum(np.ceil(per[per > 0] / 64)) / used)
    mf = 2 * T * k * (2 * F * E + E * F)
    c.add("experts", used * reads * (2 * F * gu_row + E * d_row) + T * k * (E + 2 * F) * 2,
          mf if T <= 8 else 0, 0 if T <= 8 else mf, 3 if T <= 8 else 5)


def token_cost(f: GGUFFile, cfg: ModelConfig, kernels: str, T: int, ctx: int, seed: int = 0) -> Cost:
    """The cost of one forward pass of T tokens ending at context ``ctx`` (decode: T = 1)."""
    rng = np.random.default_rng(seed)
    c = Cost()
    mm = _matmul_ours if kernels == "gpu" else _matmul_kquant
    t = f.tensors
    H, D, hc, E = cfg.n_head, cfg.head_dim, cfg.hc_count, cfg.n_embd

    def lin(what: str, name: str, rows: int | None = None, tokens: int | None = None) -> None:
        ti = t[name]
        mm(c, what, ti.type, rows or ti.shape[0], ti.shape[1], tokens or T)

    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        r = cfg.ratio(i)
        index = r == 4 and ctx // 4 > cfg.indexer_top_k
        for fn in ("hc_attn_fn", "hc_ffn_fn"):
            lin("hyper-connections", p + fn + ".weight")
        for n in ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if r else []) + \
                (["indexer_compressor_kv", "indexer_compressor_gate"] if r == 4 else []) + (["indexer.proj"] if index else []):
            lin("attention products", p + n + ".weight")
        lin("attention products", p + "attn_q_b.weight")
        if index:
            lin("indexer", p + "indexer.attn_q_b.weight")
            comp = ctx // 4
            c.add("indexer", T * cfg.indexer_n_head * cfg.indexer_head_dim * 4 + comp * cfg.indexer_head_dim * 4, 0,
                  2 * T * cfg.indexer_n_head * cfg.indexer_head_dim * comp, 2)
        G = cfg.n_out_group
        for g in range(G):
            lin("attention products", p + "attn_output_a.weight", t[p + "attn_output_a.weight"].shape[0] // G)
        lin("attention products", p + "attn_output_b.weight")
        # Attention itself: visible rows are the window plus the compressed rows (the indexer's
        # top-k of them on ratio-4 layers at decode; all of them, masked, in a prefill chunk).
        comp = ctx // r if r else 0
        if T == 1:
            V = min(cfg.sliding_window, ctx) + (min(comp, cfg.indexer_top_k) if r == 4 else comp)
            c.add("attention", V * D * 4 * 2 + H * V * 4 * 2, 4 * H * V * D, 0, 3 if kernels == "gpu" else 2)
        else:
            N = cfg.sliding_window + T + comp
            c.add("attention", N * D * 4 + 3 * H * T * N * 4, 0, 4 * H * T * N * D, 4)
        for n in ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):
            lin("shared expert and router", p + n + ".weight")
        _experts(c, kernels, cfg, t[p + "ffn_gate_exps.weight"].type, t[p + "ffn_down_exps.weight"].type, T, rng)
        # MLX's elementwise work between the products: the streams read and written a few times.
        c.add("MLX elementwise", 12 * T * hc * E * 4, 40 * T * hc * E, 0, MLX_DISPATCHES_PER_LAYER)
    lin("output head", "output_hc_fn.weight", tokens=1)  # the head runs on the last token only
    lin("output head", "output.weight", tokens=1)
    return c


def seconds(c: Cost, dev: Device, kernels: str) -> tuple[float, str]:
    """(modelled seconds, what limits it) for a pass of cost ``c`` on ``dev``."""
    bw = dev.bandwidth * EFF[f"{kernels}_bw"]
    t_bytes = c.bytes / bw
    t_flops = c.flops / (dev.fp32 * EFF["gpu_flops"])
    t_matrix = c.matrix_flops / (dev.matrix * EFF["kquant_matrix" if kernels == "kquant" else "mlx_matrix"])
    t_disp = c.dispatches * dev.dispatch
    parts = {"bandwidth": t_bytes, "scalar FLOPs": t_flops, "matrix FLOPs": t_matrix}
    limit = max(parts, key=parts.get)
    total = max(t_bytes, t_flops + t_matrix) + t_disp
    if t_disp > max(parts.values()):
        limit = "dispatches"
    return total, limit


def bound(c: Cost, dev: Device, kernels: str) -> float:
    """Tokens per second at 100% of the roofline, no dispatch cost: what the device allows."""
    t = max(c.bytes / dev.bandwidth, c.flops / dev.fp32 + c.matrix_flops / dev.matrix)
    return 1 / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a GGUF (default: the published q2 layout, header only)")
    ap.add_argument("--device", default="all", choices=[*DEVICES, "all"])
    ap.add_argument("--ctx", default="2048,16384", help="contexts of the prefill chunks (comma-separated)")
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk (the session's, 256)")
    ap.add_argument("--detail", action="store_true", help="bytes and FLOPs by part of the model")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if path is None:
            from ds4agent.modelfile.demo import write_model

            path = write_model(Path(tmp) / "flash-q2-header.gguf", FLASH, "tiny", with_data=False)
        with GGUFFile(path) as f:
            cfg = config_from_gguf(f)
            ctxs = [int(x) for x in a.ctx.split(",")]
            print(f"model: {Path(path).name} ({cfg.n_layer} layers, {f.file_size / 2**30:.1f} GiB); "
                  f"prefill chunks of {a.chunk}; efficiencies {EFF}; {MLX_DISPATCHES_PER_LAYER} MLX dispatches "
                  "per layer (estimates)")
            for key in (DEVICES if a.device == "all" else [a.device]):
                dev = DEVICES[key]
                print(f"\n{dev.name}: {dev.source}")
                for kernels in ("gpu", "kquant") if key.startswith("m") else ("gpu",):
                    dc = token_cost(f, cfg, kernels, 1, ctxs[0])
                    ds, dlim = seconds(dc, dev, kernels)
                    print(f"  {kernels:<7} decode at {ctxs[0]}: {dc.bytes / 1e9:.2f} GB/token, {1 / ds:7.1f} t/s modelled "
                          f"(bound {bound(dc, dev, kernels):.1f}; limited by {dlim}; {dc.dispatches} dispatches)")
                    for ctx in ctxs:
                        pc = token_cost(f, cfg, kernels, a.chunk, ctx)
                        ps, plim = seconds(pc, dev, kernels)
                        print(f"  {kernels:<7} prefill at {ctx}: {pc.bytes / 1e9:.1f} GB, "
                              f"{(pc.flops + pc.matrix_flops) / 1e12:.2f} TFLOP per chunk, {a.chunk / ps:7.1f} t/s modelled "
                              f"(bound {a.chunk * bound(pc, dev, kernels):.0f}; limited by {plim})")
                    if a.detail:
                        for what, (b, fl, m) in sorted(dc.by.items(), key=lambda kv: -kv[1][0]):
                            print(f"      decode {what:<26} {b / 1e9:7.3f} GB {fl / 1e9:8.2f} GFLOP {m / 1e9:8.2f} GFLOP(matrix)")


if __name__ == "__main__":
    main()
