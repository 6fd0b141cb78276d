"""The Ascend module: DeepSeek V4 Flash on PyTorch + torch_npu (``--backend npu``), a second
implementation of the forward pass behind the same Engine and Session (docs/ascend.md).

Nothing here is imported unless the npu backend is asked for: torch and torch_npu are the
optional ``npu`` extra, and devices.load_torch turns their absence into one line.
"""
