"""The operation registry: for each heavy operation the fused torch_npu implementation where
one exists (fused.py) and the plain-torch one that defines the result (plain.py).

An entry is fused when the registry was made with fused ops on (``--kernels auto``, the
default, with an NPU named in --devices) and torch_npu provides every function the entry
calls (tests hand in a stand-in module instead, tests/npu_standin.py). A fused entry steps
aside, per call, when a documented constraint does not hold for the arguments (a head width
other than 512, a hash-routed layer ...), and the open-time check (check.py) refuses it for good when it
raises or disagrees with the plain version beyond its stated tolerance. ``report()`` says
which implementation each operation has and why.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import fused, plain
from .weights import Q8Matrix, W8A8Matrix

OPS = ("linear_q8", "linear_w8a8", "rms_norm", "route", "experts", "attend", "index_select", "sinkhorn")
_PLAIN: dict[str, Callable] = {
    "linear_q8": plain.linear, "linear_w8a8": plain.linear_w8a8, "rms_norm": plain.rms_norm, "route": plain.route,
    "experts": plain.experts, "attend": plain.sink_attend, "index_select": plain.index_select,
    "sinkhorn": plain.sinkhorn,
}


class Registry:
    def __init__(self, npu: Any = None, use_fused: bool = False) -> None:
        """``npu``: the torch_npu module (or a stand-in); ``use_fused``: take its fused ops."""
        self.npu = npu
        self.fused: dict[str, Callable] = {}
        self.why: dict[str, str] = {}  # op -> why it runs plain
        for op in OPS:
            fn, needs = fused.FUSED[op]
            if not use_fused or npu is None:
                self.why[op] = "plain torch" if npu is None else "plain torch (--kernels reference)"
                continue
            missing = [n for n in needs if not callable(getattr(npu, n, None))]
            if missing:
                self.why[op] = f"plain torch (this torch_npu has no {', '.join(missing)})"
            else:
                self.fused[op] = fn
        self.calls = {op: [0, 0] for op in OPS}  # op -> [fused calls, plain calls]

    def refuse(self, op: str, why: str) -> None:
        """Run ``op`` plain from now on (the open-time check found it wrong or failing)."""
        self.fused.pop(op, None)
        self.why[op] = f"plain torch (fused refused: {why})"

    def _run(self, op: str, *args: Any) -> Any:
        fn = self.fused.get(op)
        if fn is not None:
            out = fn(self.npu, *args)
            if out is not NotImplemented:
                self.calls[op][0] += 1
                return out
        self.calls[op][1] += 1
        return _PLAIN[op](*args)

    def plain(self, op: str, *args: Any) -> Any:
        return _PLAIN[op](*args)

    # The operations the model calls ---------------------------------------------------------
    def linear(self, x: torch.Tensor, w) -> torch.Tensor:
        """x (T, in) @ Wᵀ: quantised matmul for Q8_0 (W8A16 fused) and W8A8 matrices, a
        plain product for F16/F32 ones."""
        if isinstance(w, W8A8Matrix):
            return self._run("linear_w8a8", x, w)
        if isinstance(w, Q8Matrix):
            return self._run("linear_q8", x, w)
        return plain.linear(x, w)

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
        return self._run("rms_norm", x, w, eps)

    def route(self, logits, bias, table, ids, k: int, norm: bool, scale: float):
        return self._run("route", logits, bias, table, ids, k, norm, scale)

    def experts(self, x, sel, weights, mats, clamp: float) -> torch.Tensor:
        return self._run("experts", x, sel, weights, mats, clamp)

    def attend(self, q, keys, mask, sinks) -> torch.Tensor:
        return self._run("attend", q, keys, mask, sinks)

    def index_select(self, qi, keys, wi, n_vis, k: int) -> torch.Tensor:
        return self._run("index_select", qi, keys, wi, n_vis, k)

    def sinkhorn(self, M, eps: float, iters: int) -> torch.Tensor:
        return self._run("sinkhorn", M, eps, iters)

    def report(self) -> list[str]:
        """One line per operation: fused (and the torch_npu functions) or plain, and why."""
        lines = []
        for op in OPS:
            if op in self.fused:
                lines.append(f"{op:<13} fused: torch_npu.{', torch_npu.'.join(fused.FUSED[op][1])}")
            else:
                lines.append(f"{op:<13} {self.why.get(op, 'plain torch')}")
        return lines
