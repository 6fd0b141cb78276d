"""The names a user picks an engine by: the backend, the kernels, a distributed group's split.
Defined here, importing nothing, so that the front ends can offer exactly these (argparse
choices) without loading MLX; the engine modules that act on them import them from here."""

from __future__ import annotations

# "npu" is the Ascend module (engine/ascend/: PyTorch + torch_npu), never chosen by "auto".
BACKENDS = ("auto", "cpu", "metal", "cuda", "npu")
# The implementations of the heavy products (engine/kernels/, README's Speed section).
KERNELS = ("auto", "reference", "cpu", "cpu-exact", "metal", "cuda", "kquant", "gpu-host")
# How a distributed group divides the model (engine/group/split.py).
SPLITS = ("pipeline", "experts")
