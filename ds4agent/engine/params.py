"""Sampling settings: a plain dataclass with no numeric dependency, so that front ends can build
them (from flags or an API request) without loading numpy or MLX. The sampler itself is in
sampler.py (docs/protocol.md §3.3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.05
    top_k: int = 0  # 0 disables
    seed: int | None = None

    def validate(self) -> "SamplingParams":
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (0 <= self.top_k <= 1024):
            raise ValueError(f"top_k must be in 0..1024, got {self.top_k}")
        return self
