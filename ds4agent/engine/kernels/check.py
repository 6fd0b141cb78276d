"""The kernels' self-check: each operation of a fast kernel set, run once on a small slice of
the real weights against the reference path on the same device, before the model uses it.

Nothing here knows which kernels it checks: it takes any implementation of the Kernels
interface (kernels/__init__.py), finds the operations it implements itself (those it inherits
from ReferenceKernels are the reference), runs each on a few probe cases built from the model's
own tensors and shapes, and compares with ReferenceKernels. An operation that raises (a compile
or launch error surfaces as an exception from the call or from evaluating its result), returns
the wrong shape, a non-finite value where the reference has none, or differs by more than its
tolerance is refused: ``refuse`` then points that operation, on the checked object itself, at
the reference implementation (so operations that call it internally use the reference too), and
the engine reports one line. The engine runs this for the metal and cuda kernels
(DS4_KERNEL_CHECK=0 skips it); ``ds4 inspect --kernels`` runs it for any kernel set and prints
the results; the tests run it on the CPU kernels and on GPU kernels whose bodies run on the CPU.

The probes launch every kernel instantiation the engine can use on the demo and Flash models
(tests/test_kernel_check.py checks this against the compile tests' enumeration), so a kernel
that will not compile on this machine is found here, not mid-answer. What it cannot catch: a
kernel that hangs, one that is right on these few sizes and wrong on others, a GPU error that
leaves the device unusable for the reference too, and errors of the reference itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ..weights import Weights
from ..xp import NP, to

# Every operation of the Kernels interface, with the positions of the arguments that are
# activations in the model's array namespace (the others are names, numbers, numpy masks and
# expert ids, passed as they are).
ARRAYS: dict[str, tuple[int, ...]] = {
    "linear": (0,), "linears": (0,), "grouped": (0,), "experts": (1, 3), "attend": (0, 1, 3),
    "matmul": (0, 1), "queries": (0, 1, 2), "unrotate": (0, 1, 2), "kv_round": (0,),
    "indexer_round": (0,), "hc_pre": (0, 2, 3), "hc_post": (0, 1, 2, 3),
}
TOLERANCE = 1e-4  # relative (L2) error allowed by default: float32 in another summation order


@dataclass
class CaseResult:
    op: str
    case: str
    ok: bool
    why: str  # "" when ok
    err: float | None  # relative error against the reference, when both ran
    seconds: float


@dataclass
class CheckReport:
    kernels: str  # the checked implementation's name
    results: list[CaseResult] = field(default_factory=list)
    inherited: list[str] = field(default_factory=list)  # operations that are the reference's own
    seconds: float = 0.0

    @property
    def refused(self) -> dict[str, str]:
        """Operation -> why, for each refused operation (its first failing case)."""
        out: dict[str, str] = {}
        for r in self.results:
            if not r.ok and r.op not in out:
                out[r.op] = f"{r.why} [{r.case}]"
        return out

    @property
    def note(self) -> str | None:
        """The one line the engine prints when something was refused."""
        ref = self.refused
        if not ref:
            return None
        parts = "; ".join(f"{op}: {why}" for op, why in ref.items())
        which = "it" if len(ref) == 1 else "them"
        return f"{self.kernels} kernels refused by the self-check, {parts}; the MLX reference path runs {which}"


def operations() -> tuple[str, ...]:
    from .interface import Kernels

    return tuple(n for n, v in vars(Kernels).items() if callable(v) and not n.startswith("_"))


def _first_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    msg = msg if len(msg) <= 200 else msg[:197] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _as_np(out) -> list[np.ndarray]:
    """A result (array, or a tuple/list of arrays) as float64 numpy arrays, evaluated."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    arrays = [a for a in items if isinstance(a, mx.array)]
    if arrays:
        mx.eval(*arrays)
    return [np.array(a.astype(mx.float32) if isinstance(a, mx.array) else a, dtype=np.float64) for a in items]


def _compare(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[str, float | None]:
    if len(got) != len(want):
        return f"returned {len(got)} arrays, the reference {len(want)}", None
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return f"shape {g.shape} where the reference gives {w.shape}", None
        finite = np.isfinite(w)
        if not np.array_equal(np.isfinite(g), finite):
            return "non-finite values where the reference has finite ones (or the reverse)", None
        den = float(np.linalg.norm(w[finite]))
        num = float(np.linalg.norm((g - w)[finite]))
        worst = max(worst, num / den if den > 0 else num)
    return "", worst


def _probe_cases(w: Weights, seed: int = 0) -> dict[str, list[tuple[str, tuple]]]:
    """op -> [(label, args)], args in numpy (activations) and plain values, from the model's
    own tensors and dimensions. Small: a few tokens, one layer's tensors."""
    from ..ops import Rope

    cfg, f = w.cfg, w.file
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    cases: dict[str, list[tuple[str, tuple]]] = {op: [] for op in ARRAYS}
    # Dense products: one matrix (the smallest) for each (type, input width) the model has.
    groups: dict[tuple[int, int], list[str]] = {}
    for name, t in f.tensors.items():
        if (len(t.shape) == 2 and name.endswith(".weight") and "_exps." not in name and "tid2eid" not in name
                and "_ape." not in name and name != "token_embd.weight"):
            groups.setdefault((t.type, t.shape[1]), []).append(name)
    for (qtype, n), names in sorted(groups.items()):
        names.sort(key=lambda nm: (f.tensors[nm].shape[0], nm))
        small, out = names[0], f.tensors[names[0]].shape[0]
        label = f"{f.tensors[small].type_name} x{n} {small}"
        # 1, 2, 3 and 37 tokens: tiles of 1, 2, 4 and 8 (a partial last one); a row range and a
        # column range (whole blocks) of the matrix as expert splits ask for them.
        block = 256 if n % 256 == 0 else 32
        cases["linear"].append((f"{label} T=1", (normal(1, n), small, None)))
        cases["linear"].append((f"{label} T=2 rows {out // 4}..{out}", (normal(2, n), small, (out // 4, out))))
        if n > block:
            c0, c1 = block, n - block if n > 2 * block else n
            cases["linear"].append((f"{label} T=3 columns {c0}..{c1}", (normal(3, c1 - c0), small, None, (c0, c1))))
        cases["linear"].append((f"{label} T=37", (normal(37, n), small, None)))
        if len(names) > 1:
            cases["linears"].append((f"{label} + {names[1]} T=3", (normal(3, n), tuple(names[:2]))))
    name = "blk.0.attn_output_a.weight"
    G, n = cfg.n_out_group, f.tensors[name].shape[1]
    for T in (1, 2):
        cases["grouped"].append((f"{name} T={T}", (normal(T, G, n), name)))
    # Routed experts: the first layer of each quantisation mix.
    seen = set()
    for layer in range(cfg.n_layer):
        p = f"blk.{layer}.ffn_"
        mix = tuple(f.tensors[p + k + "_exps.weight"].type_name for k in ("gate", "up", "down"))
        if mix in seen:
            continue
        seen.add(mix)
        k = cfg.n_expert_used
        first = rng.choice(cfg.n_expert, k, replace=False)
        rest = np.setdiff1d(np.arange(cfg.n_expert), first)
        second = np.concatenate([first[: k // 2], rng.choice(rest, k - k // 2, replace=False)])
        clamp = float(cfg.swiglu_clamp[layer])
        # One token; several with distinct choices; and 2, 3 and 9 tokens that all choose the
        # same experts: tiles of 2, 4 and 8 of an expert's tokens (at 9, a full and a partial).
        many = max(2, -(-8 // k))
        more = np.stack([first, rng.permutation(second)] + [rng.choice(cfg.n_expert, k, replace=False)
                                                              for _ in range(many - 2)])
        batches = [("", first[None]),
                   ("", more)] + [(" same experts", np.repeat(second[None], T, axis=0)) for T in (2, 3, 9)]
        for what, sel in batches:
            T = len(sel)
            route = rng.uniform(0.1, 1.0, (T, k)).astype(np.float32)
            cases["experts"].append((f"layer {layer} {'/'.join(mix)} T={T}{what}",
                                     (layer, normal(T, cfg.n_embd), sel.astype(np.int64), route, clamp)))
    # Attention over K = V rows with the layer's real sinks; few and many visible rows.
    H, D = cfg.n_head, cfg.head_dim
    sinks = np.array(w.get("blk.0.attn_sinks.weight"), dtype=np.float32)
    for T, N, V in ((1, 48, 20), (1, 48, 3), (1, 48, 1), (2, 40, 30)):
        mask = np.zeros((T, N), bool)
        for t in range(T):
            mask[t, rng.choice(N, V, replace=False)] = True
        cases["attend"].append((f"T={T} {V} of {N} rows visible",
                                (normal(H, T, D, scale=0.3), normal(N, D), mask, sinks)))
    Hi, Di = cfg.indexer_n_head, cfg.indexer_head_dim
    cases["matmul"].append((f"({2}, {Hi}, {Di}) @ ({Di}, 20)", (normal(2, Hi, Di), normal(Di, 20))))
    cos, sin = Rope(cfg).tables(np.array([5, 700]), True, NP)
    cases["queries"].append(("T=2", (normal(2, H * D), cos, sin)))
    cases["unrotate"].append(("T=2", (normal(H, 2, D), cos, sin)))
    cases["kv_round"].append(("4 rows", (normal(4, D, scale=3.0), cfg.n_rot)))
    cases["indexer_round"].append(("4 rows", (normal(4, Di, scale=3.0),)))
    hc, E = cfg.hc_count, cfg.n_embd
    scale = np.array(w.get("blk.0.hc_attn_scale.weight"), dtype=np.float32)
    base = np.array(w.get("blk.0.hc_attn_base.weight"), dtype=np.float32)
    cases["hc_pre"].append(("blk.0.hc_attn_fn.weight T=2", (normal(2, hc, E), "blk.0.hc_attn_fn.weight", scale, base)))
    comb = rng.uniform(0, 1, (2, hc, hc)).astype(np.float32)
    comb /= comb.sum(axis=1, keepdims=True)
    cases["hc_post"].append(("T=2",
                             (normal(2, E), normal(2, hc, E), rng.uniform(0, 2, (2, hc)).astype(np.float32), comb)))
    return cases


def _in(xp, op: str, args: tuple) -> tuple:
    return tuple(to(xp, a) if i in ARRAYS[op] else a for i, a in enumerate(args))


def self_check(candidate, reference, weights: Weights, ops: tuple[str, ...] | None = None) -> CheckReport:
    """Run each operation ``candidate`` implements itself on the probe cases, against
    ``reference`` (a ReferenceKernels on the same weights and device). Does not change
    either; see ``refuse``."""
    from .reference import ReferenceKernels

    t0 = time.perf_counter()
    report = CheckReport(candidate.name)
    cases = _probe_cases(weights)
    for op in ops or operations():
        mine = getattr(type(candidate), op, None)
        if mine is getattr(ReferenceKernels, op) and op not in vars(candidate):
            report.inherited.append(op)
            continue
        tol = getattr(candidate, "check_tolerance", {}).get(op, TOLERANCE)
        for label, args in cases[op]:
            t = time.perf_counter()
            try:
                want = _as_np(getattr(reference, op)(*_in(reference.xp, op, args)))
            except Exception as e:  # the reference itself cannot run this case: nothing to compare with
                report.results.append(CaseResult(op, label, True,
                                                 f"not compared: the reference failed ({_first_line(e)})",
                                                 None, time.perf_counter() - t))
                continue
            try:
                got = _as_np(getattr(candidate, op)(*_in(candidate.xp, op, args)))
                why, err = _compare(got, want)
                if not why and not err <= tol:
                    why = f"mismatch: relative error {err:.1e} > {tol:.0e}"
            except Exception as e:  # compile, launch or run error of the candidate (never propagates)
                why, err = f"error: {_first_line(e)}", None
            report.results.append(CaseResult(op, label, not why, why, err, time.perf_counter() - t))
    report.seconds = time.perf_counter() - t0
    return report


def refuse(candidate, reference, report: CheckReport) -> None:
    """Point each operation ``report`` refused, on ``candidate`` itself, at ``reference``
    (converting the arrays when the two use different array namespaces), release what the
    candidate holds for those operations, and keep the report on it (``candidate.check``)."""
    refused = set(report.refused)
    for op in refused:
        setattr(candidate, op, _bridge(reference, op, candidate.xp))
    if refused and hasattr(candidate, "release"):
        candidate.release(refused)
    candidate.check = report


def _bridge(reference, op: str, xp):
    fn = getattr(reference, op)
    if xp is reference.xp:
        return fn

    def call(*args, **kw):
        out = fn(*_in(reference.xp, op, args), **kw)
        if isinstance(out, (tuple, list)):
            return type(out)(to(xp, a) for a in out)
        return to(xp, out)

    return call


def checked(candidate, weights: Weights) -> tuple[object, str | None]:
    """``candidate`` after its self-check (refused operations on the reference), and the line
    to print when something was refused."""
    from .reference import ReferenceKernels

    reference = ReferenceKernels(weights)
    report = self_check(candidate, reference, weights)
    refuse(candidate, reference, report)
    return candidate, report.note


def _timing_cases(w: Weights, seed: int = 1) -> list[tuple[str, tuple]]:
    """(op, args) of what dominates a token, at decode and prefill sizes: the widest dense
    matrix of layer 0 at 1 and 64 tokens, layer 0's routed experts at 1 and 64 tokens."""
    cfg, f = w.cfg, w.file
    rng = np.random.default_rng(seed)
    dense = max((n for n, t in f.tensors.items() if n.startswith("blk.0.") and len(t.shape) == 2
                 and n.endswith(".weight") and "_exps." not in n and "tid2eid" not in n and "_ape." not in n),
                key=lambda n: f.tensors[n].nbytes)
    n = f.tensors[dense].shape[1]
    cases = []
    for T in (1, 64):
        x = rng.standard_normal((T, n)).astype(np.float32)
        cases.append(("linear", (x, dense, None)))
        sel = np.stack([rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False) for _ in range(T)])
        route = rng.uniform(0.1, 1.0, sel.shape).astype(np.float32)
        cases.append(("experts", (0, rng.standard_normal((T, cfg.n_embd)).astype(np.float32), sel, route,
                                  float(cfg.swiglu_clamp[0]))))
    return cases


def timing(candidate, weights: Weights, repeat: int = 2) -> float:
    """Seconds ``candidate`` takes for the timing cases, the best of ``repeat`` runs after a
    first one (which compiles what it uses)."""
    total = 0.0
    for op, args in _timing_cases(weights):
        args = _in(candidate.xp, op, args)
        _as_np(getattr(candidate, op)(*args))
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            _as_np(getattr(candidate, op)(*args))
            best = min(best, time.perf_counter() - t)
        total += best
    return total


def choose(candidates: list, weights: Weights) -> tuple[object, str | None]:
    """The one of ``candidates`` (kernel sets for the same device) to use: each is self-checked
    (refused operations go to the reference); of those with the fewest refusals, the fastest on
    the timing cases. The line returned says which, and why, when there was a choice, and what
    the chosen set's check refused."""
    from .reference import ReferenceKernels

    reference = ReferenceKernels(weights)
    checked_ = []
    for c in candidates:
        report = self_check(c, reference, weights)
        refuse(c, reference, report)
        checked_.append(c)
    if len(checked_) == 1:
        return checked_[0], checked_[0].check.note
    fewest = min(len(c.check.refused) for c in checked_)
    timed = [(timing(c, weights), c) for c in checked_ if len(c.check.refused) == fewest]
    seconds, best = min(timed, key=lambda tc: tc[0])
    for c in checked_:
        if c is not best and hasattr(c, "release"):
            c.release(set(operations()))  # its device copies are not needed
    others = ", ".join(f"{c.name} {t * 1e3:.1f} ms" for t, c in timed if c is not best)
    unchecked = [c.name for c in checked_ if len(c.check.refused) > fewest]
    why = f"{best.name} kernels chosen by the self-check (timing cases {seconds * 1e3:.1f} ms"
    why += f"; {others})" if others else ")"
    if unchecked:
        why += f"; {', '.join(unchecked)} had more operations refused"
    return best, "; ".join(filter(None, [why, best.check.note]))
