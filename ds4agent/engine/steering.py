"""Directional steering (docs/steering.md, docs/model.md §7.2): one direction per layer, removed
from (or, with a negative scale, added to) a sublayer's output before the hyper-connection post
step:

    y <- y - s * v * (v . y)

on the attention output (after its output projection; scale ``attn``, default 0) and on the FFN
output (routed plus shared; scale ``ffn``, default 1 when a file is given). A steering file is
raw little-endian float32 [n_layer x n_embd], no header: ds4's files load unchanged. A JSON
sidecar (``FILE.json``) may say how it was made; its "name" is what the status line shows.

The projection is a dot and a scaled subtraction per row, done in the model's array namespace
for every kernel set; a session carries its own steering (Session.steering), so sessions of one
engine (a server's slots) may be steered differently, in one batch too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


class SteeringError(ValueError):
    """A steering file or scale that cannot be used; one line."""


@dataclass(frozen=True, eq=False)
class Steering:
    directions: np.ndarray  # (n_layer, n_embd) float32, read-only
    attn: float = 0.0
    ffn: float = 1.0
    name: str = ""  # what the status line and session records call it
    digest: str = ""  # the file's SHA-1, 12 hex digits: which directions, exactly

    def __post_init__(self) -> None:
        for which in ("attn", "ffn"):
            s = getattr(self, which)
            if not math.isfinite(s) or abs(s) > 100:
                raise SteeringError(f"steering scale {which} must be a number in -100..100, got {s}")

    def scaled(self, attn: float | None = None, ffn: float | None = None) -> "Steering":
        return replace(self, attn=self.attn if attn is None else float(attn),
                       ffn=self.ffn if ffn is None else float(ffn))

    @property
    def active(self) -> bool:
        return self.attn != 0.0 or self.ffn != 0.0

    def describe(self) -> str:
        """"verbosity ffn 1 attn 0": the status line's and the session record's words."""
        return f"{self.name} ffn {self.ffn:g} attn {self.attn:g}"

    def record(self) -> dict:
        """What a saved session keeps of the steering in force."""
        return {"name": self.name, "digest": self.digest, "ffn": self.ffn, "attn": self.attn}

    def vector(self, layer: int, xp):
        """Layer ``layer``'s direction in the model's namespace ``xp`` (engine/xp.py)."""
        return xp.array(self.directions[layer])


def load_steering(path: str | os.PathLike[str], n_layer: int, n_embd: int, attn: float = 0.0,
                  ffn: float = 1.0) -> Steering:
    """The directions of file ``path`` for a model of ``n_layer`` x ``n_embd``, with scales."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SteeringError(f"steering file {p}: {e.strerror or e}") from None
    want = n_layer * n_embd * 4
    if len(raw) != want:
        raise SteeringError(f"steering file {p}: {len(raw)} bytes, but this model needs {n_layer} layers x {n_embd} "
                            f"float32 = {want} bytes")
    directions = np.frombuffer(raw, dtype="<f4").reshape(n_layer, n_embd).astype(np.float32)
    if not np.isfinite(directions).all():
        bad = int(np.argwhere(~np.isfinite(directions))[0][0])
        raise SteeringError(f"steering file {p}: layer {bad} holds a NaN or an infinity")
    directions.setflags(write=False)
    name = p.stem
    side = p.with_name(p.name + ".json")
    if side.exists():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SteeringError(f"steering sidecar {side}: {e}") from None
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"].strip():
            name = meta["name"].strip()
    return Steering(directions, float(attn), float(ffn), name, hashlib.sha1(raw).hexdigest()[:12])


def project(y, v, s: float, xp):
    """y - s * v * (v . y) for every row of y (T, E) with one direction v (E,). The dot is
    summed along each row alone, so a row's bits do not depend on the other rows."""
    d = xp.sum(y * v[None, :], axis=-1, keepdims=True)
    return y - (s * v[None, :]) * d


def build_directions(session, good: list[list[int]], bad: list[list[int]], component: str,
                     control: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Directions from two prompt sets (token ids each): per layer, the mean of the bad
    prompts' last-row ``component`` ("ffn" or "attn") output less the good prompts', optionally
    made orthogonal to the control prompts' mean, normalised. It points from the good set to the
    bad one, so a positive scale removes the bad set's trait. Returns (directions (n_layer, E)
    float32, the norms before normalising). The session's own steering is left out."""
    if component not in ("ffn", "attn"):
        raise SteeringError(f"component must be ffn or attn, got {component!r}")
    if not good or not bad:
        raise SteeringError("both prompt sets need at least one prompt")
    kept = session.steering
    session.set_steering(None)  # the directions of the model as it is
    try:
        def mean(prompts: list[list[int]]) -> np.ndarray:
            rows = [session.activations(p, last_only=True)[component][:, 0, :].astype(np.float64) for p in prompts]
            return np.mean(rows, axis=0)  # (n_layer, E)

        d = mean(bad) - mean(good)
        if control:
            c = mean(control)
            c_hat = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-30)
            d = d - np.sum(d * c_hat, axis=1, keepdims=True) * c_hat
    finally:
        session.set_steering(kept)
    norms = np.linalg.norm(d, axis=1)
    if not np.all(norms > 0) or not np.all(np.isfinite(norms)):
        raise SteeringError("the two prompt sets give the same outputs in some layer: no direction to take")
    return (d / norms[:, None]).astype(np.float32), norms


def write_steering(path: str | os.PathLike[str], directions: np.ndarray, meta: dict) -> Path:
    """The directions as ds4's raw float32 file, and ``meta`` as its JSON sidecar (both written
    whole to temporary files and renamed)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(np.ascontiguousarray(directions, dtype="<f4").tobytes())
    side = p.with_name(p.name + ".json")
    stmp = side.with_name(side.name + ".tmp")
    stmp.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    os.replace(stmp, side)
    return p


def save_activations(path: str | os.PathLike[str], acts: dict[str, np.ndarray], tokens: list[int]) -> Path:
    """``--dump-activations``: the captured outputs (Session.activations) and the token ids as
    an .npz (arrays "attn", "ffn": (n_layer, T, E); "hidden": (n_layer, T, hc, E); "tokens")."""
    p = Path(path)
    with open(p, "wb") as f:
        np.savez(f, tokens=np.asarray(tokens, dtype=np.int64), **acts)
    return p
