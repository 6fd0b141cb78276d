"""The MTP block as a draft model (docs/speculation.md, docs/model.md §7.1).

DeepSeek trained one extra transformer block to predict the token after next: at position j it
takes the target's last-layer hidden streams at j-1 (which predicted token j) and the embedding
of token j, and its head predicts token j+1. Drafts chain: the block's own output streams at j,
with the token it proposed, give the next proposal. We follow DeepSeek's pairing (streams of
j-1 with the token of j); ds4 pairs the streams of j with the token of j (model.md §7.1 says
so, and notes the difference); either way every draft is verified by the target, so the
pairing can change how many drafts are kept, never the output.

The block runs as a model of one window-only layer (modelfile/mtpfile.py mtp_config) over the
same kernels as the target, reading the MTP file and the target's embedding and output matrix
in place. Its KV is its own: one window of the pairs it has seen, positions numbered in its own
sequence (RoPE is relative and the layer has no compressor, so only the order matters).
"""

from __future__ import annotations

import numpy as np

from ..modelfile.gguf import GGUFFile
from ..modelfile.mtpfile import PREFIX, MtpView, mtp_config, open_mtp
from .kernels import like
from .model import Model
from .ops import fused, norm
from .state import ModelState
from .weights import Weights
from .xp import NP, to


class MtpBlock:
    """The block of an MTP file beside its target model (engine/model.py Model)."""

    def __init__(self, target: Model, f: GGUFFile) -> None:
        self.file = f
        self.cfg = mtp_config(target.cfg)
        weights = Weights(MtpView(f, target.w.file), self.cfg)  # type: ignore[arg-type]  # what kernels read of a file
        self.model = Model(weights, target.opt, like(target.k, weights), output=target.output)
        self.window = self.cfg.sliding_window

    @classmethod
    def open(cls, target: Model, path: str) -> "MtpBlock":
        """The MTP file at ``path`` for ``target``; ValueError (one line) when it is not one."""
        if getattr(target, "part", None) is not None or not isinstance(target, Model):
            raise ValueError("MTP drafting runs with the MLX engine of one process")
        return cls(target, open_mtp(path, target.cfg))

    def close(self) -> None:
        self.file.close()

    def empty_state(self) -> ModelState:
        return ModelState.empty(self.cfg)

    def run(self, ids: np.ndarray, hidden, state: ModelState, logits: bool = True):
        """Pairs of tokens ``ids`` (T,) and the streams ``hidden`` (T, hc, E) that precede each
        (the target's, or the block's own), at the next positions of ``state`` (which
        advances): returns (the next-token logits after the last pair as float32 (V,), or
        None; the block's output streams (T, hc, E))."""
        m, w, cfg = self.model, self.model.param, self.cfg
        xp = m.xp
        ids = np.asarray(ids, dtype=np.int64)
        T, hc, E = hidden.shape
        rmsn = fused(norm, cfg.rms_eps)
        e = rmsn(xp.array(m.w.embed(ids)), w(PREFIX + "enorm.weight"))
        ep = m.k.linear(e, PREFIX + "e_proj.weight")  # (T, E)
        h = rmsn(xp.array(hidden).reshape(T * hc, E), w(PREFIX + "hnorm.weight"))
        hp = m.k.linear(h, PREFIX + "h_proj.weight").reshape(T, hc, E)
        X = m.layers(ep[:, None, :] + hp, ids, state, range(1))
        m.advance(state, T)
        out = np.asarray(to(NP, m.head(X)), dtype=np.float32) if logits else None
        return out, X
