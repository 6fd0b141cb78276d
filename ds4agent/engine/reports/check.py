"""`ds4 inspect --kernels`: what the kernel self-check (kernels/check.py) found, as report lines."""

from __future__ import annotations

import os

from ..engine import Engine
from ..kernels.check import self_check
from ..kernels.reference import ReferenceKernels


def kernel_report(path: str | os.PathLike[str], backend: str = "auto", kernels: str | None = None) -> list[str]:
    """`ds4 inspect --kernels`: open the model with these kernels and print their self-check
    (kernels/check.py): each probe case, its result, its error against the reference on the
    same device, its time. The metal/cuda kernels were checked when the engine opened (the
    report shown is that check, refusals included) unless DS4_KERNEL_CHECK=0; any other set
    (cpu, cpu-exact) is checked now. Loads the weights the probes touch."""
    with Engine.open(path, backend=backend, kernels=kernels) as e:
        info, k = e.info, e.model.k
        lines = []
        if info.kernel_note:
            lines.append(f"              note: {info.kernel_note}")
        if info.backend == "npu":  # the Ascend module's registry: fused torch_npu op or plain torch, per op
            return ([f"kernels       {info.kernels} on npu: the operation registry (engine/ascend)"]
                    + [f"              {line}" for line in e.model.reg.report()]
                    + [f"              {line}" for line in info.devices] + lines)
        if info.kernels == "reference":
            return [f"kernels       reference on {info.backend}: the definition the others are checked against; "
                    "nothing to check"] + lines
        report = info.kernel_check
        when = "at open"
        if report is None:
            report = self_check(k, ReferenceKernels(e.model.w), e.model.w)
            when = "now"
        refused = report.refused
        refusals = f"{len(refused)} operations refused (the reference runs them)" if refused else "nothing refused"
        lines.insert(0, f"kernels       {info.kernels} on {info.backend}: self-check {when} against the MLX reference "
                        f"on the same device, {len(report.results)} cases in {report.seconds:.2f} s, {refusals}")
        if report.inherited:
            lines.append("              the reference's own (not checked): " + ", ".join(report.inherited))
        w = max([len(r.case) for r in report.results] + [4]) + 2
        lines.append(f"              {'operation':<14}{'case':<{w}}{'result':<8}{'rel. error':>11}{'time':>11}")
        for r in report.results:
            err = f"{r.err:.1e}" if r.err is not None else "-"
            lines.append(f"              {r.op:<14}{r.case:<{w}}{'ok' if r.ok else 'REFUSED':<8}{err:>11}"
                         f"{r.seconds * 1e3:>8.1f} ms")
            if r.why:
                lines.append(f"              {'':<14}  {r.why}")
        return lines
