"""Token sampling: temperature, top-k, top-p, min-p with a seedable 64-bit xorshift generator.

Semantics follow docs/protocol.md §3.3 so a seed reproduces a run: temperature <= 0 is argmax
(first maximum); min-p is relative to the most likely token; without top-k/top-p the draw walks
the vocabulary in id order. Logits arrive as float32 numpy (front ends never see MLX arrays).
"""

from __future__ import annotations

import os
import time

import numpy as np

from .params import SamplingParams

_MASK64 = (1 << 64) - 1


class Rng:
    """xorshift64* with a 24-bit uniform output: tiny, fast, and the same sequence everywhere."""

    def __init__(self, seed: int | None) -> None:
        if seed is None:
            seed = (time.time_ns() ^ (os.getpid() << 32)) & _MASK64
        self.state = (seed & _MASK64) or 0x9E3779B97F4A7C15

    def uniform(self) -> float:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & _MASK64
        x ^= x >> 27
        self.state = x
        out = (x * 0x2545F4914F6CDD1D) & _MASK64
        return ((out >> 40) & 0xFFFFFF) / 16777216.0


class Sampler:
    def __init__(self, params: SamplingParams = SamplingParams()) -> None:
        self.params = params.validate()
        self.rng = Rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        if self.params.temperature <= 0:
            return int(np.argmax(np.asarray(logits, dtype=np.float32)))  # first maximum
        return self._draw(*self.candidates(logits))

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, weights) of what a draw at temperature > 0 picks from, in the order the
        draw walks them: the tokens top-k, top-p and min-p keep, each weighted by
        exp((logit - max) / temperature)."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        if p.top_k > 0:
            k = min(p.top_k, logits.size)
            ids = np.argsort(-logits, kind="stable")[:k]
        elif p.top_p < 1:
            ids = np.argsort(-logits, kind="stable")
        else:
            ids = None
        cand = logits if ids is None else logits[ids]
        weights = np.exp((cand.astype(np.float64) - cand.max()) / p.temperature)
        keep = weights >= p.min_p  # relative to the top token, whose weight is 1
        if ids is not None and p.top_p < 1:
            probs = weights / weights.sum()
            mass = np.cumsum(np.where(keep, probs, 0.0))
            # Keep the prefix (in descending order) until the kept mass reaches top_p.
            last = int(np.searchsorted(mass, p.top_p))
            keep[last + 1 :] = False
        keep[int(np.argmax(weights))] = True
        kept = np.flatnonzero(keep)
        return (kept if ids is None else ids[kept]), weights[kept]

    def _draw(self, tokens: np.ndarray, w: np.ndarray) -> int:
        r = self.rng.uniform() * w.sum()
        j = min(int(np.searchsorted(np.cumsum(w), r)), len(tokens) - 1)  # first with cumsum >= r
        return int(tokens[j])

    def check(self, logits: np.ndarray, draft: int) -> int | None:
        """Speculative sampling of one proposed token (docs/speculation.md): None when ``draft``
        is kept, else the token sampled in its place. A draft is a certain guess (the n-gram
        lookup proposes one token, not a distribution), so it is kept with its probability
        under these settings and otherwise replaced by a draw from the rest of the distribution,
        renormalised: each token then comes out with exactly the probability a plain draw gives
        it. Greedy (temperature <= 0): kept when it is the arg-max, else the arg-max."""
        if self.params.temperature <= 0:
            best = int(np.argmax(np.asarray(logits, dtype=np.float32)))
            return None if draft == best else best
        tokens, w = self.candidates(logits)
        at = np.flatnonzero(tokens == draft)
        p = float(w[at[0]] / w.sum()) if len(at) else 0.0
        if p > 0 and self.rng.uniform() < p:
            return None
        if len(at):
            w = w.copy()
            w[at[0]] = 0.0
        return self._draw(tokens, w)
