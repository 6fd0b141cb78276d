"""The GPU path's cost on paper: bytes, FLOPs and dispatches per token of decode and of prefill
chunks, from the kernels' own launch plans, turned into tokens per second for a device.

    python bench/gpu_model.py [MODEL.gguf] [--device m3-max|m5-max|h200|all] [--ctx 2048,16384]

Without a model it uses the published q2 layout (43 layers, real dimensions and quant mix,
written as a header-only file). Nothing here runs a kernel. ``launches`` lists the launches one
forward pass makes, built with the same plan functions GpuKernels calls (engine/kernels/gpu.py)
in the order engine/model.py calls the kernels (tests/test_gpu_model.py checks the list against
the launches the engine really makes on the demo model); ``launch_cost`` reads each launch's
bytes and FLOPs off its template and run-time sizes. MLX's own work between the products (norms,
RoPE, the compressors, routing, sampling; prefill attention) is counted as dispatches measured
on the demo model's graph (``mlx_dispatches``: the same code at small sizes; the count does not
depend on the sizes) plus the bytes and FLOPs of attention and of the streams.

Each launch's time is the larger of its bytes at the device's bandwidth and its FLOPs at its
throughput (a roofline), derated by an efficiency, plus a fixed cost per dispatch. The device
figures are published specifications or assumptions (said below); the efficiencies and the
dispatch cost are assumptions that bench/gpu_check.sh and bench/mac_check.sh measure.

Kernel sets modelled: ``gpu`` (ours: scalar FMAs, a dense matrix read once per tile of up to 8
tokens, an expert once per 8 of its tokens) and, on Metal, ``kquant`` (mlx-kquant: prefill on
the matrix units with weights read once per 64-token tile, decode bandwidth-bound).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
    matrix: float  # FLOP/s of the matrix units at bf16/f16 (mlx-kquant's prefill, MLX's matmul)
    dispatch: float  # seconds per dependent kernel dispatch
    cache: float  # bytes of the last-level cache (a matrix of at most half of it is read once per launch)
    source: str


DEVICES = {
    "m3-max": Device("M3 Max (40-core GPU)", 400e9, 14.2e12, 14.2e12, 4e-6, 48e6,
                     "400 GB/s (Apple); fp32 40 cores x 128 lanes x 2 x 1.39 GHz; no separate matrix units; "
                     "48 MB system cache (reported, not published)"),
    "m5-max": Device("M5 Max (40-core GPU)", 614e9, 18.0e12, 70e12, 4e-6, 48e6,
                     "assumed: 614 GB/s (twice M5 Pro's), fp32 40 x 128 x 2 x 1.75 GHz, 70 TFLOPS f16 on the "
                     "per-core neural accelerators (Apple's 4x AI compute over M4), 48 MB system cache"),
    "h200": Device("H200 SXM", 4.8e12, 67e12, 989e12, 3e-6, 60e6,
                   "4.8 TB/s, 67 TFLOPS fp32, 989 TFLOPS bf16 dense, 60 MB L2 (NVIDIA)"),
}
# Assumed fractions of the roofline each kind of work reaches.
EFF = {"gpu_bw": 0.6, "gpu_flops": 0.35, "kquant_bw": 0.75, "kquant_matrix": 0.5, "mlx_bw": 0.5, "mlx_matrix": 0.4}
DEQUANT_FLOPS = 3  # per weight per tile: the scale product, the shift and mask, the conversion


@dataclass
class Cost:
    bytes: float = 0.0
    flops: float = 0.0  # scalar FLOPs
    matrix_flops: float = 0.0  # FLOPs on matrix units
    dispatches: int = 0
    by: Counter | None = None

    def add(self, what: str, b: float, f: float = 0.0, m: float = 0.0, d: int = 1) -> None:
        self.bytes, self.flops, self.matrix_flops, self.dispatches = (self.bytes + b, self.flops + f,
                                                                      self.matrix_flops + m, self.dispatches + d)
        self.by = self.by or Counter()
        self.by[what] += b


# -- the launches of one forward pass, as GpuKernels makes them --------------------------------

Route = Callable[[int, int], np.ndarray]  # (layer, tokens) -> expert choices (tokens, k)


def uniform_route(cfg: ModelConfig, seed: int = 0) -> Route:
    """Distinct experts per token, uniformly at random: a prompt's routing is less even, which
    fills tiles better; this errs on the slow side for our prefill."""
    rng = np.random.default_rng(seed)
    return lambda layer, T: np.stack([rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False) for _ in range(T)])


def launches(f: GGUFFile, cfg: ModelConfig, T: int, ctx: int, route: Route) -> list[tuple[str, gpu.Launch]]:
    """(part of the model, launch) for one forward pass of T tokens whose last is at position
    ctx - 1, in engine/model.py's order, grouped as GpuKernels groups them."""
    t = f.tensors
    out: list[tuple[str, gpu.Launch]] = []

    def products(what: str, names: list[str], tokens: int = T) -> None:
        by_type: dict[int, list[str]] = {}
        for n in names:
            by_type.setdefault(t[n].type, []).append(n)
        for qtype, group in by_type.items():
            for i in range(0, len(group), gpu.MAX_MATRICES):
                part = group[i : i + gpu.MAX_MATRICES]
                rows = [t[n].shape[0] for n in part]
                out.extend((what, la) for la in gpu.plan_matmul(qtype, rows, t[part[0]].shape[1], tokens))

    def hc(what: str, fn: str) -> None:
        products(what, [fn])
        out.extend((what, la) for la in gpu.plan_hc(T, cfg.hc_count, cfg.n_embd, cfg.hc_sinkhorn_iters))

    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        r = cfg.ratio(i)
        index = r == 4 and ctx // 4 > cfg.indexer_top_k
        hc("hyper-connections", p + "hc_attn_fn.weight")
        names = ["attn_q_a", "attn_kv"] + (["attn_compressor_kv", "attn_compressor_gate"] if r else [])
        names += ["indexer_compressor_kv", "indexer_compressor_gate"] if r == 4 else []
        names += ["indexer.proj"] if index else []
        products("attention products", [p + n + ".weight" for n in names])
        products("attention products", [p + "attn_q_b.weight"] + ([p + "indexer.attn_q_b.weight"] if index else []))
        if T == 1:  # decode attention in our kernels; a prefill chunk's is MLX's (see mlx_cost)
            V = min(cfg.sliding_window, ctx) + (min(ctx // 4, cfg.indexer_top_k) if index else ctx // r if r else 0)
            out += [("attention", gpu.plan_scores(cfg.n_head, V, cfg.head_dim)),
                    ("attention", gpu.plan_mix(cfg.n_head, V, cfg.head_dim))]
        name = p + "attn_output_a.weight"
        plans = gpu.plan_matmul(t[name].type, t[name].shape[0], t[name].shape[1], T, groups=cfg.n_out_group)
        out.extend(("attention products", la) for la in plans)
        products("attention products", [p + "attn_output_b.weight"])
        hc("hyper-connections", p + "hc_ffn_fn.weight")
        products("shared expert and router",
                 [p + n + ".weight" for n in ("ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp")])
        plan = gpu.expert_plan(route(i, T), cfg.n_expert)
        out.extend(("routed experts", la) for la in gpu.plan_experts(t[p + "ffn_gate_exps.weight"].type,
                                                                     t[p + "ffn_down_exps.weight"].type, plan,
                                                                     cfg.expert_ff, cfg.n_embd))
        products("shared expert and router", [p + "ffn_down_shexp.weight"])
    products("output head", ["output_hc_fn.weight"], 1)  # the head runs on the last token only
    products("output head", ["output.weight"], 1)
    return out


def launch_cost(la: gpu.Launch) -> tuple[float, float, float]:
    """(weight bytes read, other bytes moved, FLOPs) of one launch, from its template and its
    run-time sizes."""
    tp, d = dict(la.template), la.dims
    if la.kind == "matmul":
        R, T, S, n = d[0], d[1], d[4], d[6]
        tiles = -(-T // tp["TILE"])
        weights = tiles * R * (n // tp["BE"]) * tp["BB"]  # each tile of tokens reads its rows once
        return weights, T * n * 4 * (d[8] // n) + T * R * S * 4, tiles * R * n * (2 * tp["TILE"] + DEQUANT_FLOPS)
    if la.kind in ("reduce", "moe_glu", "moe_sum"):
        out = int(np.prod(la.output_shapes[0]))
        parts = out * d[1] * (2 if la.kind == "moe_glu" else tp.get("K", 1))
        return 0, (parts + out) * 4, parts + 8 * out
    if la.kind in ("moe_gate_up", "moe_down"):
        n_tiles = d[0]
        rows = tp["F"] if la.kind == "moe_gate_up" else tp["R"]
        mats = 2 if la.kind == "moe_gate_up" else 1
        return (mats * n_tiles * rows * tp["RB"],
                n_tiles * tp["TILE"] * tp["N"] * 4 + int(np.prod(la.output_shapes[0])) * 4,
                mats * n_tiles * rows * tp["N"] * (2 * tp["TILE"] + DEQUANT_FLOPS))
    if la.kind == "hc_weights":
        T = d[0]
        return 0, T * (2 + tp["HC"]) * tp["HC"] * 8, T * tp["ITERS"] * 4 * tp["HC"] ** 2
    if la.kind == "hc_collapse":
        T, E, hc = d[0], tp["E"], tp["HC"]
        return 0, T * E * (hc + 1) * 4, 2 * T * E * hc
    if la.kind in ("scores", "mix"):
        H, D, V = tp["H"], tp["D"], d[0]
        return 0, V * D * 4 + H * V * 4 + H * D * 4, 2 * H * V * D
    raise ValueError(la.kind)


# -- MLX's own work ---------------------------------------------------------------------------

from collections import defaultdict  # noqa: E402

KINDS: defaultdict = defaultdict(Counter)  # (ratio, hash) -> primitive -> count, of the last mlx_dispatches


def mlx_dispatches(demo_path: str, T: int, ctx: int) -> dict[tuple[int, bool], int]:
    """MLX's dispatches per layer, by (compression ratio, hash-routed), for a pass of T tokens
    ending at position ctx - 1, counted on the demo model's real graph: the model runs with
    GpuKernels whose launches are recorded (not run), and every graph segment the model
    evaluates is exported (mx.export_to_dot) and its kernels counted; views (reshape, slice,
    broadcast, transpose) and the recorded launches' stand-ins (zeros that depend on the
    launch's inputs) are not dispatches."""
    import re

    import mlx.core as mx

    from ds4agent.engine import Engine
    from ds4agent.engine import model as model_mod
    from ds4agent.engine.kernels.gpu import GpuKernels

    views = {"Reshape", "Slice", "Broadcast", "ExpandDims", "Squeeze", "Transpose", "AsStrided", "Full", "Flatten",
             "Unflatten", "StopGradient", "Depends"}
    counts: Counter = Counter()
    current = [None]
    dot = Path(tempfile.mkdtemp()) / "g.dot"

    def count(*arrays) -> None:
        arrs = [a for a in arrays if isinstance(a, mx.array)]
        if current[0] is None or not arrs:
            return
        mx.export_to_dot(str(dot), *arrs)
        for label in re.findall(r'label\s*=\s*"([^"]+)"', dot.read_text()):
            kind = label.split()[0]
            if kind[:1].isupper() and kind not in views:
                counts[current[0]] += 1
                KINDS[current[0]][kind] += 1

    class Recorded(GpuKernels):
        def _run(self, launch, inputs):  # a stand-in that keeps the graph through the launch
            out = mx.zeros(tuple(launch.output_shapes[0]), dtype=mx.float32)
            return mx.depends([out], [a for a in inputs if isinstance(a, mx.array)])[0]

    real_eval, real_np = mx.eval, model_mod.np

    class NP:  # model.py's numpy, with the graph counted before a conversion evaluates it
        def __getattr__(self, name):
            return getattr(real_np, name)

        def array(self, a, *args, **kw):
            count(a)
            return real_np.array(a, *args, **kw)

        asarray = array

    def eval_(*arrays):
        count(*arrays)
        return real_eval(*arrays)

    with Engine.open(demo_path, backend="cpu", kernels="reference", qat_sim=True, ctx=max(4 * ctx, 256)) as e:
        m, cfg = e.model, e.info.config
        s = e.session()
        s.sync(list(range(1000, 1000 + ctx - T)))  # the state at the pass's start (reference kernels)
        m.k = Recorded(m.w, "metal", make=lambda **_: None)
        layer_of = m._layer
        model_mod.np, mx.eval = NP(), eval_
        try:
            def layer(i, *args):
                current[0] = (cfg.ratio(i), cfg.is_hash_layer(i))
                try:
                    out = layer_of(i, *args)
                    count(out)
                    return out
                finally:
                    current[0] = None

            m._layer = layer
            state = s._live.state.fork()
            m.layers(m.embed(np.arange(T) + 2000), np.arange(T) + 2000, state, range(cfg.n_layer))
        finally:
            model_mod.np, mx.eval = real_np, real_eval
            m._layer = layer_of
    per_type = Counter()
    for key in counts:  # each demo layer of a type counted once
        per_type[key] = counts[key] // sum(1 for i in range(cfg.n_layer) if (cfg.ratio(i), cfg.is_hash_layer(i)) == key)
    return dict(per_type)


def mlx_cost(c: Cost, cfg: ModelConfig, T: int, ctx: int, dispatches: dict[tuple[int, bool], int]) -> None:
    """MLX's work: its dispatches per layer type, the streams it reads and writes, and (in a
    prefill chunk) the attention over every cached row, masked (kernels/reference.py)."""
    hc, E, H, D = cfg.hc_count, cfg.n_embd, cfg.n_head, cfg.head_dim
    for i in range(cfg.n_layer):
        r = cfg.ratio(i)
        c.add("MLX (norms, RoPE, compressors, routing)", 16 * T * hc * E * 4, 60 * T * hc * E, 0,
              dispatches.get((r, cfg.is_hash_layer(i)), dispatches.get((r, False), 0)))
        if T > 1:
            N = min(cfg.sliding_window, ctx) + T + (ctx // r if r else 0)
            c.add("MLX attention (prefill)", N * D * 4 + 3 * H * T * N * 4, 0, 4 * H * T * N * D, 0)
            if r == 4 and ctx // 4 > cfg.indexer_top_k:
                c.add("MLX attention (prefill)", (ctx // 4) * cfg.indexer_head_dim * 4, 0,
                      2 * T * cfg.indexer_n_head * cfg.indexer_head_dim * (ctx // 4), 0)


def pass_cost(f: GGUFFile, cfg: ModelConfig, kernels: str, T: int, ctx: int, dispatches, dev: Device,
              seed: int = 0) -> Cost:
    c = Cost()
    for what, la in launches(f, cfg, T, ctx, uniform_route(cfg, seed)):
        w, other, fl = launch_cost(la)
        if la.kind == "matmul":  # tiles after the first find a matrix that fits the cache still there
            tp = dict(la.template)
            once = la.dims[0] * (la.dims[6] // tp["BE"]) * tp["BB"]
            w = once if once <= dev.cache / 2 else w
        if kernels == "kquant" and la.kind in ("matmul", "moe_gate_up", "moe_down") and T > 8:
            # mlx-kquant's GEMMs on the matrix units: a dense matrix read once per 64-token tile
            # (ours: per 8); an expert once per 64 of its tokens, which at a chunk's few tokens
            # per expert is once, as ours; the dequantisation inside the GEMM.
            tp = dict(la.template)
            if la.kind == "matmul" and w > once:
                w = w / -(-T // tp["TILE"]) * -(-T // 64)
            c.add(what, w + other, 0, fl * 2 * tp["TILE"] / (2 * tp["TILE"] + DEQUANT_FLOPS))
        else:
            c.add(what, w + other, fl)
    mlx_cost(c, cfg, T, ctx, dispatches)
    return c


def seconds(c: Cost, dev: Device, kernels: str) -> tuple[float, str]:
    """(modelled seconds, what limits it) for a pass of cost ``c`` on ``dev``."""
    t = {"bandwidth": c.bytes / (dev.bandwidth * EFF[f"{kernels}_bw"]),
         "scalar FLOPs": c.flops / (dev.fp32 * EFF["gpu_flops"]),
         "matrix FLOPs": c.matrix_flops / (dev.matrix * EFF["kquant_matrix" if kernels == "kquant" else "mlx_matrix"]),
         "dispatches": c.dispatches * dev.dispatch}
    work = max(t["bandwidth"], t["scalar FLOPs"] + t["matrix FLOPs"])
    return work + t["dispatches"], max(t, key=t.get)


def bound(c: Cost, dev: Device) -> float:
    """Passes per second at 100% of the roofline and no dispatch cost: what the device allows."""
    return 1 / max(c.bytes / dev.bandwidth, c.flops / dev.fp32 + c.matrix_flops / dev.matrix)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a GGUF (default: the published q2 layout, header only)")
    ap.add_argument("--device", default="all", choices=[*DEVICES, "all"])
    ap.add_argument("--ctx", default="2048,16384", help="contexts of the prefill chunks and decode (comma-separated)")
    ap.add_argument("--chunk", default="256,1024", help="prefill chunk sizes (comma-separated)")
    ap.add_argument("--detail", action="store_true", help="bytes by part of the model")
    a = ap.parse_args()
    from ds4agent.modelfile.demo import write_demo, write_model

    with tempfile.TemporaryDirectory() as tmp:
        path = a.model or write_model(Path(tmp) / "flash-q2-header.gguf", FLASH, "tiny", with_data=False)
        demo = write_demo(Path(tmp) / "demo.gguf", "tiny", 0)
        ctxs = [int(x) for x in a.ctx.split(",")]
        with GGUFFile(path) as f:
            cfg = config_from_gguf(f)
            print(f"model {Path(path).name}: {cfg.n_layer} layers, {f.file_size / 2**30:.1f} GiB; "
                  f"assumed efficiencies {EFF}")
            # The demo's indexer picks 8 rows (Flash: 512): count its dispatches where the indexer is
            # live or not, as Flash's is at that context; decode averaged over the four positions
            # of a ratio-4 window (one in four emits a compressed row).
            def per_layer(T: int, ctx: int) -> dict:
                starts = (36, 37, 38, 39) if ctx // 4 > cfg.indexer_top_k else (28, 29, 30, 31)
                runs = [mlx_dispatches(str(demo), T, c + T) for c in (starts if T == 1 else starts[:1])]
                return {k: sum(r.get(k, 0) for r in runs) / len(runs) for k in runs[0]}

            chunks = [int(x) for x in a.chunk.split(",")]
            disp = {(T, ctx): per_layer(T, ctx) for T in (1, *chunks) for ctx in ctxs}
            for key in (DEVICES if a.device == "all" else [a.device]):
                dev = DEVICES[key]
                print(f"\n{dev.name}: {dev.source}; {dev.dispatch * 1e6:.0f} us per dispatch (assumed)")
                for kernels in ("gpu", "kquant") if key.startswith("m") else ("gpu",):
                    for ctx in ctxs:
                        dc = pass_cost(f, cfg, kernels, 1, ctx, disp[(1, ctx)], dev)
                        ds, dlim = seconds(dc, dev, kernels)
                        line = (f"  {kernels:<6} ctx {ctx:>6}: decode {1 / ds:6.1f} t/s (bound {bound(dc, dev):6.1f}; "
                                f"{dc.bytes / 1e9:.2f} GB, {dc.dispatches:.0f} dispatches; {dlim})")
                        for chunk in chunks:
                            pc = pass_cost(f, cfg, kernels, chunk, ctx, disp[(chunk, ctx)], dev)
                            ps, plim = seconds(pc, dev, kernels)
                            line += (f" | prefill/{chunk} {chunk / ps:7.1f} t/s "
                                     f"(bound {chunk * bound(pc, dev):7.1f}; {plim})")
                        print(line)
                        if a.detail:
                            for what, b in dc.by.most_common():
                                print(f"         decode {what:<42} {b / 1e9:8.3f} GB")

if __name__ == "__main__":
    main()
