"""Which devices the Ascend module runs on, what is missing when it cannot, and how the
layers are split across several devices.

Devices are named as torch names them: ``npu:0``, ``npu:1`` (an Atlas 300I Duo enumerates as
two 48 GB devices, one per die; the 81 GiB model needs both), or ``cpu``, which runs the same
module on host torch (what the tests do; ``--devices cpu``). Several entries split the layers
into contiguous stages, one per entry; the hidden state crosses each boundary once per step.

torch and torch_npu are imported here and nowhere else first: both are an optional extra
(``pip install 'ds4agent[npu]'``), and every way they can be missing or broken becomes one
AscendError line naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ...modelfile.config import ModelConfig

GiB = 1024**3
INSTALL = "pip install 'ds4agent[npu]'"
# Memory a stage needs beyond its weights and KV state: one prefill chunk's temporaries
# (attention scores are made in blocks of at most 256 MiB, experts are dequantised in groups
# of at most 3 x 256 MiB, the output head in 64 MiB tiles) and the allocator's slack.
WORKING_BYTES = 2 * GiB


class AscendError(ValueError):
    """The Ascend module cannot run as asked; one line for the user."""


def parse_devices(spec: Sequence[str] | str | None) -> list[str]:
    """Device names from ``--devices`` text ("0,1", "cpu", "npu:0,npu:1") or a list of names.
    None is one NPU, device 0."""
    if spec is None:
        return ["npu:0"]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for raw in items:
        s = str(raw).strip().lower()
        if s.isdigit():
            s = f"npu:{int(s)}"
        elif s.startswith("npu:") and s[4:].isdigit():
            s = f"npu:{int(s[4:])}"
        elif s != "cpu":
            raise AscendError(f"--devices: {raw!r} is not a device (use NPU indices like 0,1, or cpu)")
        if s != "cpu" and s in out:
            raise AscendError(f"--devices names {s} twice (each stage needs its own device)")
        out.append(s)
    if not out:
        raise AscendError("--devices is empty")
    return out


def load_torch(devices: Sequence[str]) -> tuple[Any, Any]:
    """(torch, torch_npu or None): torch_npu only when an NPU is named. Checks that each
    named NPU exists. Every failure is one AscendError line saying what is missing."""
    try:
        import torch
    except ImportError:
        raise AscendError(f"--backend npu needs PyTorch and torch_npu, and torch is not installed: {INSTALL} "
                          "(then source the CANN toolkit's set_env.sh)") from None
    npus = [int(d[4:]) for d in devices if d.startswith("npu:")]
    if not npus:
        return torch, None
    try:
        import torch_npu
    except ImportError as e:
        if e.name in ("torch_npu", None) and "torch_npu" in str(e) and "No module named" in str(e):
            raise AscendError(f"--backend npu needs torch_npu (Ascend's PyTorch plugin), which is not installed: "
                              f"{INSTALL}, on a host with the CANN toolkit") from None
        raise AscendError(f"torch_npu is installed but does not load ({_first_line(e)}): source the CANN toolkit's "
                          "set_env.sh, and check that torch_npu matches torch "
                          f"{getattr(torch, '__version__', '?')}") from None
    except Exception as e:  # a CANN library or driver that fails while torch_npu initialises
        raise AscendError(f"torch_npu does not load ({_first_line(e)}): source the CANN toolkit's set_env.sh") from None
    try:
        count = int(torch.npu.device_count())
    except Exception as e:
        raise AscendError(f"torch_npu cannot count the Ascend devices ({_first_line(e)}): check the driver "
                          "(npu-smi info)") from None
    if count == 0:
        raise AscendError("torch_npu found no Ascend device (torch.npu.device_count() is 0): check the driver and "
                          "the card (npu-smi info), and ASCEND_RT_VISIBLE_DEVICES")
    for i in npus:
        if i >= count:
            have = "device 0" if count == 1 else f"devices 0-{count - 1}"
            raise AscendError(f"--devices {i}: this machine has {count} Ascend "
                              f"{'device' if count == 1 else 'devices'} ({have})")
    return torch, torch_npu


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def free_bytes(torch: Any, device: str) -> tuple[int, int] | None:
    """(free, total) bytes of an NPU's memory, None for the host (whose weights are pages of
    the model file's mmap, not allocations)."""
    if not device.startswith("npu:"):
        return None
    free, total = torch.npu.mem_get_info(int(device[4:]))
    return int(free), int(total)


def layer_kv_bytes(cfg: ModelConfig, layer: int, ctx: int) -> int:
    """Float32 KV state of one layer at ``ctx`` tokens (docs/model.md §4.3)."""
    r = cfg.ratio(layer)
    size = 4 * min(ctx, cfg.sliding_window) * cfg.head_dim
    if r:
        size += 4 * (ctx // r) * cfg.head_dim + 2 * 4 * (8 if r == 4 else r) * cfg.compressor_width(layer)
    if r == 4:
        size += 4 * (ctx // 4) * cfg.indexer_head_dim + 2 * 4 * 8 * 2 * cfg.indexer_head_dim
    return size


@dataclass(frozen=True)
class Stage:
    """One device's share: layers ``layers`` (contiguous); the first stage also holds the
    embedding, the last the output head."""

    index: int
    device: str
    layers: range
    weight_bytes: int
    kv_bytes: int
    memory: tuple[int, int] | None  # (free, total) before loading, None for the host

    @property
    def needed(self) -> int:
        return self.weight_bytes + self.kv_bytes + (WORKING_BYTES if self.memory else 0)

    def describe(self, n_stages: int, ctx: int) -> str:
        what = [f"layers {self.layers.start}-{self.layers.stop - 1}"]
        if self.index == 0:
            what.append("embedding")
        if self.index == n_stages - 1:
            what.append("output head")
        line = (f"{self.device}: {' + '.join(what)}: {_gib(self.weight_bytes)} of weights, {_gib(self.kv_bytes)} of KV "
                f"state at {ctx} tokens")
        if self.memory:
            line += f"; {_gib(self.memory[0])} free of {_gib(self.memory[1])} before loading"
        return line


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def plan(cfg: ModelConfig, layer_bytes: Sequence[int], embed_bytes: int, head_bytes: int, devices: Sequence[str],
         memory: Sequence[tuple[int, int] | None], ctx: int) -> list[Stage]:
    """Split the layers into contiguous stages, one per device, each device's share of the
    bytes in proportion to its free memory (equal shares where it is unknown), and check
    that each share fits. Raises AscendError naming the first device that is short."""
    n = cfg.n_layer
    if len(devices) > n:
        raise AscendError(f"--devices names {len(devices)} devices for a model of {n} layers")
    load = [layer_bytes[i] + layer_kv_bytes(cfg, i, ctx) for i in range(n)]
    weights = [float(m[0]) if m else 1.0 for m in memory]
    share = [w / sum(weights) for w in weights]
    total = sum(load) + embed_bytes + head_bytes
    cuts, acc, stage = [], float(embed_bytes), 0
    target = share[0] * total
    for i in range(n):
        left_layers, left_stages = n - i, len(devices) - stage - 1
        # Close the stage once its share is reached, keeping a layer for every later stage.
        if stage < len(devices) - 1 and i > (cuts[-1] if cuts else 0) and (
                acc + load[i] / 2 > target or left_layers == left_stages):
            cuts.append(i)
            stage += 1
            target += share[stage] * total
        acc += load[i]
    bounds = [0, *cuts, n]
    stages = []
    for s, dev in enumerate(devices):
        layers = range(bounds[s], bounds[s + 1])
        w = (sum(layer_bytes[i] for i in layers) + (embed_bytes if s == 0 else 0)
             + (head_bytes if s == len(devices) - 1 else 0))
        kv = sum(layer_kv_bytes(cfg, i, ctx) for i in layers)
        stages.append(Stage(s, dev, layers, w, kv, memory[s]))
    for st in stages:
        if st.memory and st.needed > st.memory[0]:
            more = ("; add a device with --devices (e.g. --devices 0,1 on a dual-die card)" if len(devices) == 1
                    else "; add devices to --devices or use a smaller --ctx")
            raise AscendError(f"the model does not fit: {st.device} would hold {_gib(st.needed)} (layers "
                              f"{st.layers.start}-{st.layers.stop - 1}: {_gib(st.weight_bytes)} of weights, "
                              f"{_gib(st.kv_bytes)} of KV state at {ctx} tokens, {_gib(WORKING_BYTES)} of working "
                              f"memory) but has {_gib(st.memory[0])} free{more}")
    return stages


__all__ = ["AscendError", "Stage", "WORKING_BYTES", "free_bytes", "layer_kv_bytes", "load_torch", "parse_devices",
           "plan"]
