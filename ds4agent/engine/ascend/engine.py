"""Putting the Ascend module together for Engine.open(backend="npu"): devices, the layer
split, the weights on the devices, the operation registry and its open-time check, and the
session class whose snapshots are the MLX engine's payload.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...modelfile.config import ModelConfig
from ...modelfile.gguf import GGUFFile
from ..model import Options
from ..session import Session
from ..state import Frontier, LayerState, ModelState, write_payload
from .devices import AscendError, free_bytes, load_torch, plan
from .model import AscendModel
from .registry import Registry
from .weights import DeviceWeights, tensor_bytes

KERNEL_CHOICES = (None, "auto", "reference")  # auto: fused torch_npu ops on an NPU; reference: plain torch


@dataclass(frozen=True)
class Built:
    model: AscendModel
    session_class: type
    kernels: str  # EngineInfo.kernels
    note: str | None  # fused ops refused or missing, one line
    devices: tuple[str, ...]  # one line per device: its layers, bytes and memory


def _host(a) -> np.ndarray | None:
    return None if a is None else a.detach().to("cpu").numpy()


def host_state(state: ModelState) -> ModelState:
    """A copy of ``state`` with every tensor as a host numpy array (what write_payload reads);
    the device tensors are untouched."""
    layers = []
    for st in state.layers:
        if st is None or not isinstance(st.raw, torch.Tensor):
            layers.append(st)
            continue
        fr = [None if f is None else Frontier(_host(f.kv), _host(f.score)) for f in (st.comp_frontier, st.idx_frontier)]
        layers.append(LayerState(st.ratio, _host(st.raw), _host(st.comp), fr[0], _host(st.idx_comp), fr[1]))
    return ModelState(layers, state.n_tokens)


class AscendSession(Session):
    """A Session on the Ascend module: the same sync/eval/generate/restore; a snapshot brings
    the state from the devices to the host first (write_payload reads host arrays)."""

    def snapshot(self) -> bytes:
        live = self._live
        if live.logits is None:
            raise RuntimeError("nothing to snapshot: the session holds no tokens")
        return write_payload(self._model.cfg, self.ctx, host_state(live.state), live.tokens[: live.n], live.logits)


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
    return Built(model, AscendSession, name, note, lines)
