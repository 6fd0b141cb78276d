"""Putting the Ascend module together for Engine.open(backend="npu"): devices, the layer
split, the weights on the devices, the operation registry and its open-time check. Sessions are
the engine's own (engine/session.py): the model brings its device tensors home for a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...modelfile.config import ModelConfig
from ...modelfile.gguf import GGUFFile
from ..model import Options
from .devices import AscendError, free_bytes, load_torch, plan
from .model import AscendModel
from .registry import Registry
from .weights import DeviceWeights, tensor_bytes

KERNEL_CHOICES = (None, "auto", "reference")  # auto: fused torch_npu ops on an NPU; reference: plain torch


@dataclass(frozen=True)
class Built:
    model: AscendModel
    kernels: str  # EngineInfo.kernels
    note: str | None  # fused ops refused or missing, one line
    devices: tuple[str, ...]  # one line per device: its layers, bytes and memory


def build(f: GGUFFile, cfg: ModelConfig, devices: list[str], ctx: int, qat_sim: bool, kernels: str | None,
          w8a8: bool, npu=None) -> Built:
    """The Ascend module over an opened, checked model file. ``npu`` replaces torch_npu (tests
    hand in a stand-in that implements the documented ops in plain torch)."""
    if kernels not in KERNEL_CHOICES:
        raise AscendError(f"--kernels {kernels} is not for --backend npu (use auto: fused torch_npu ops where they "
                          "apply, or reference: plain torch)")
    torch_mod, torch_npu = load_torch(devices)
    if npu is None:
        npu = torch_npu
    memory = [free_bytes(torch_mod, d) for d in devices]
    layer_bytes, embed, head = tensor_bytes(f, cfg)
    stages = plan(cfg, layer_bytes, embed, head, devices, memory, ctx)
    use_fused = npu is not None and kernels != "reference"
    weights = DeviceWeights(f, cfg, stages, w8a8, fused_q8=use_fused)
    reg = Registry(npu, use_fused)
    note = None
    if use_fused:
        from .check import check_fused

        refused = check_fused(reg, weights)
        if refused:
            note = "fused torch_npu ops refused by the open-time check, run in plain torch: " + "; ".join(refused)
    model = AscendModel(weights, Options(qat_sim=qat_sim), reg)
    name = ("torch_npu fused" if reg.fused else "torch plain") + (" w8a8" if w8a8 else "")
    lines = tuple(s.describe(len(stages), ctx) for s in stages)
    return Built(model, name, note, lines)
