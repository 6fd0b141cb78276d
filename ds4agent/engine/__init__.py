"""The runtime engine: the only package that knows tensors. Opens a model file, runs the
DeepSeek V4 forward pass (MLX, or numpy and C on the CPU kernels path), and holds each
conversation's KV state in a Session.

Public names, resolved lazily so that importing one (a front end asking for SamplingParams,
say) does not load MLX: Engine, EngineError, EngineInfo, Session, Checkpoint, Step,
ContextFullError, PayloadError, SamplingParams, Batcher, kernel_report, streaming_plan; for
directional steering SteeringError, build_directions, write_steering, save_activations. The tokenizer is the model
file's (ds4agent.modelfile.Tokenizer), render and parse the chat protocol's
(ds4agent.protocol.render, .parse).
"""

from __future__ import annotations

from .. import lazy

# public name -> module that defines it (relative to this package, or absolute)
_EXPORTS = {
    "Engine": ".engine", "EngineError": ".errors", "EngineInfo": ".info",
    "Session": ".session", "Checkpoint": ".session", "Step": ".session", "ContextFullError": ".errors",
    "PayloadError": ".state", "SamplingParams": ".params", "kernel_report": ".reports.check",
    "streaming_plan": ".engine", "Batcher": ".batch",
    "SteeringError": ".steering", "build_directions": ".steering", "write_steering": ".steering",
    "save_activations": ".steering",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy.exports(__name__, _EXPORTS)
