"""EngineInfo: what an opened Engine is (the model file, its shape, the backend and kernels that
run it). Sessions, the session store and the front ends read it; it imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..modelfile.config import ModelConfig


@dataclass(frozen=True)
class EngineInfo:
    path: str
    config: ModelConfig
    backend: str
    ctx: int
    qat_sim: bool
    quant_mix: dict[str, int]  # GGML type name -> bytes
    is_flash: bool
    expert_quant_bits: int  # 4 when layer 0's routed experts are Q4_K or MXFP4, else 2 (ds4's convention)
    fingerprint: int  # identifies these exact weights (see _fingerprint)
    kernels: str = "reference"  # the implementation of the heavy products (engine/kernels)
    kernel_note: str | None = None  # why the fast kernels (or some of their operations) were not used
    kernel_check: object = None  # kernels/check.CheckReport of the self-check at open, when it ran
    # Said at open: on npu one line per device (its layers and memory); on metal and cuda what the
    # GPU kernels will hold on the device against its limit (kernels/resident.py).
    devices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.config.name or "deepseek4"
