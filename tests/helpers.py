"""Helpers shared by tests: corrupting or patching model files, random quantised blocks,
bit-level and relative comparisons."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

# Byte offsets of the f16 scale fields inside one block of each quantised format.
SCALE_OFFSETS = {Q.Q8_0: [0, 1], Q.Q2_K: [80, 81, 82, 83], Q.Q4_K: [0, 1, 2, 3], Q.IQ2_XXS: [0, 1]}


def elements(qtype: Q) -> int:
    """Weights per block."""
    return GGML_QUANT_SIZES[Q(qtype)][0]


def random_blocks(qtype: Q, rows: int, blocks: int, seed: int, finite: bool = True, scale: float = 0.02) -> np.ndarray:
    """(rows, blocks * block bytes) random bytes of a quantised format. Random bytes often make
    NaN/inf f16 scales; with ``finite`` the scale fields get ordinary values instead."""
    size = GGML_QUANT_SIZES[Q(qtype)][1]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks * size), dtype=np.uint8)
    if finite and Q(qtype) == Q.MXFP4:  # the scale is one exponent byte: powers of two near 1
        raw.reshape(-1, size)[:, 0] = rng.integers(118, 139, size=raw.size // size)
    elif finite:
        view = raw.reshape(-1, size)
        offs = SCALE_OFFSETS[Q(qtype)]
        scales = rng.normal(0, scale, size=view.shape[0] * len(offs) // 2 + 1).astype("<f2").view(np.uint8)
        view[:, offs] = scales[: view.shape[0] * len(offs)].reshape(view.shape[0], len(offs))
    return raw


def flash_experts_case() -> dict:
    """The routed-expert FFN at Flash dimensions (hidden 4096, expert width 2048, 6 of 8
    experts, IQ2_XXS gate/up and Q2_K down) on random blocks for one token, and its float64
    value on gguf's dequantisation (clamp 7, SwiGLU, routing weights, sum over the slots)."""
    from gguf.quants import dequantize

    E, F, n_exp, k = 4096, 2048, 8, 6
    gate, up = (random_blocks(Q.IQ2_XXS, n_exp * F, E // 256, seed) for seed in (1, 2))
    down = random_blocks(Q.Q2_K, n_exp * E, F // 256, 3)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, E)).astype(np.float32)
    sel = rng.choice(n_exp, size=(1, k), replace=False).astype(np.int32)
    route = rng.uniform(0.1, 1.0, size=(1, k)).astype(np.float32)
    want = np.zeros(E)
    for j, e in enumerate(sel[0]):
        g = dequantize(gate.reshape(n_exp, F, -1)[e], Q.IQ2_XXS).astype(np.float64) @ x[0]
        u = dequantize(up.reshape(n_exp, F, -1)[e], Q.IQ2_XXS).astype(np.float64) @ x[0]
        g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
        want += dequantize(down.reshape(n_exp, E, -1)[e], Q.Q2_K).astype(np.float64) @ (g / (1 + np.exp(-g)) * u * route[0, j])
    return {"E": E, "F": F, "k": k, "clamp": 7.0, "gate": gate, "up": up, "down": down, "x": x, "sel": sel,
            "route": route, "want": want}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal float32 arrays, bit for bit (NaN payloads included)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference relative to the reference ``b``'s largest magnitude."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def damage(base: bytes, draw, span: int, hits: int) -> bytes:
    """Fuzzing: overwrite 1..hits bytes among the first ``span``, and truncate half of the
    time; ``draw`` is a hypothesis data.draw."""
    from hypothesis import strategies as st

    blob = bytearray(base)
    for _ in range(draw(st.integers(1, hits))):
        blob[draw(st.integers(0, min(len(blob), span) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        blob = blob[: draw(st.integers(0, len(blob)))]
    return bytes(blob)


def copy_model(src: Path, dst: Path) -> Path:
    """Copy a model file keeping its holes (SEEK_DATA/SEEK_HOLE): a copy of the sparse 80 GiB
    Flash header file stays a few MB, where a plain copy would write 80 GiB."""
    size = src.stat().st_size
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fd = fi.fileno()
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # no data after pos: the rest is a hole
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            fi.seek(start)
            fo.seek(start)
            left = end - start
            while left:
                block = fi.read(min(left, 1 << 22))
                fo.write(block)
                left -= len(block)
            pos = end
        fo.truncate(size)
    return dst


def patch_metadata(path: Path, key: str, old: bytes, new: bytes) -> None:
    """Overwrite the stored value of metadata ``key`` in place (same byte length).

    The value follows the key string and its u32 type (and, for strings, the u64 length);
    ``old`` must be what is stored there, so
    a test cannot silently patch the wrong bytes."""
    assert len(old) == len(new)
    with open(path, "rb") as f:
        data = bytearray(f.read(64 * 1024 * 1024))  # the header; never the (maybe 80 GiB) data
    k = key.encode()
    i = data.find(len(k).to_bytes(8, "little") + k)
    assert i >= 0, key
    at = i + 8 + len(k) + 4
    if int.from_bytes(data[at - 4 : at], "little") == 8:  # a string value: skip its u64 length
        at += 8
    assert bytes(data[at : at + len(old)]) == old, (key, bytes(data[at : at + len(old)]))
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)


def quantize_act_np(x: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Independent numpy statement of the CPU kernels' activation rounding: blocks of 32 (or
    256, the IQ2_XXS / Q2_K format below 16 tokens), scale max|x|/127 in float32, round half
    to even. Returns (scales, int8 values)."""
    blocks = x.reshape(x.shape[0], -1, block)
    d = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    return d, q


def convo_session(engine, user: str, extra: str = ""):
    """A session holding a short rendered conversation (system text, ``user``, the start of
    the answer plus ``extra``): what the session-store tests save and load."""
    text = f"<｜begin▁of▁sentence｜>You are terse.<｜User｜>{user}<｜Assistant｜></think>{extra}"
    s = engine.session()
    s.sync(engine.tokenizer.encode_rendered(text))
    return s


def scripted_steps(tok, text: str, max_tokens: int = 50000, last_finish: str = "length",
                   interrupt_at: int | None = None):
    """What Session.generate yields when the model samples exactly ``text`` (in the tokenizer's
    canonical ids, cut at ``max_tokens``): the end-of-sentence token finishes with "eos"; a text
    that ends without one finishes its last step with ``last_finish`` ("length", or "context" for
    a session that ran out of room). ``interrupt_at``: raise KeyboardInterrupt before that step."""
    from ds4agent.engine.session import Step

    ids = tok.encode_rendered(text)[:max_tokens]
    for i, t in enumerate(ids):
        if interrupt_at == i:
            raise KeyboardInterrupt
        finish = "eos" if t == tok.eos_id else (last_finish if i + 1 == len(ids) else None)
        yield Step(t, i, 0.0, finish)
        if finish:
            return
