"""Session snapshots in ds4's DSV4 payload layout: exact resume, strict checks, size formula."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine.state import PayloadError, payload_size
from ds4agent.modelfile.config import FLASH


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=4096) as e:
        yield e


def _greedy(session, n: int) -> list[int]:
    return [st.token for st in session.generate(SamplingParams(temperature=0), max_tokens=n, stop_at_eos=False)]


@pytest.mark.parametrize("n", [1, 37, 300])
def test_restore_continues_exactly(engine, demo_path, n: int) -> None:
    ids = np.random.default_rng(n).integers(0, 128000, n).tolist()
    s = engine.session()
    s.sync(ids)
    blob = s.snapshot()
    assert len(blob) == payload_size(engine.info.config, n)
    first = _greedy(s, 12)
    logits_after = s.logits.copy()
    # A fresh engine (new weights cache, new model object) resumes bit for bit.
    with Engine.open(demo_path, backend="cpu", ctx=4096) as other:
        r = other.session()
        r.restore(blob)
        assert r.tokens == ids
        assert _greedy(r, 12) == first
        assert np.array_equal(r.logits, logits_after)


def test_restore_runs_no_forward_pass(engine, monkeypatch) -> None:
    s = engine.session()
    s.sync(list(range(2000, 2100)))
    blob = s.snapshot()
    r = engine.session()

    def boom(*a, **k):
        raise AssertionError("restore must not evaluate the model")

    monkeypatch.setattr(engine.model, "forward", boom)
    r.restore(blob)
    assert r.tokens == list(range(2000, 2100)) and np.array_equal(r.logits, s.logits)
    assert r.sync(list(range(2000, 2100))) == 0  # already live: nothing to prefill


def test_flash_payload_size_formula() -> None:
    """docs/model.md §4.3: bytes(2048) = 52 184 460 for the published shape."""
    def spec_formula(n: int) -> int:
        return (52 + 4 * n + 517120 + 344 + 43 * min(n, 128) * 2048 + 21 * ((n // 4) * 2560 + 81920)
                + 20 * ((n // 128) * 2048 + 524288))

    assert payload_size(FLASH, 2048) == 52_184_460
    for n in (0, 1, 127, 128, 129, 1000, 4096, 65535):
        assert payload_size(FLASH, n) == spec_formula(n)


def _patched(blob: bytes, field: int, value: int) -> bytes:
    b = bytearray(blob)
    b[4 * field : 4 * field + 4] = struct.pack("<I", value)
    return bytes(b)


@pytest.fixture(scope="module")
def blob(engine) -> bytes:
    s = engine.session()
    s.sync(list(range(500, 640)))
    return s.snapshot()


@pytest.mark.parametrize("mutate,fragment", [
    (lambda b: b[:30], "truncated"),
    (lambda b: b[:-4], "truncated"),
    (lambda b: b + b"\0\0\0\0", "trailing bytes"),
    (lambda b: _patched(b, 0, 0x12345678), "bad magic"),
    (lambda b: _patched(b, 1, 2), "version 2"),
    (lambda b: _patched(b, 2, 8192), "needs a context of 8192"),
    (lambda b: _patched(b, 3, 1024), "prefill capacity 1024"),
    (lambda b: _patched(b, 5, 64), "window 64"),
    (lambda b: _patched(b, 8, 43), "another model shape"),
    (lambda b: _patched(b, 11, 1000), "another model shape"),
    (lambda b: _patched(b, 12, 3), "raw row count"),
])
def test_restore_refuses_mismatches(engine, blob: bytes, mutate, fragment: str) -> None:
    s = engine.session()
    s.sync([1, 2, 3])
    with pytest.raises(PayloadError, match=fragment):
        s.restore(mutate(blob))
    assert s.tokens == [1, 2, 3]  # untouched


def test_restore_refuses_smaller_context(demo_path, blob: bytes) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=100) as e:
        with pytest.raises(PayloadError, match="needs a context"):
            e.session().restore(blob)


def test_size_formula_tracks_config() -> None:
    small = replace(FLASH, n_layer=4, compress_ratios=(0, 0, 4, 128), swiglu_clamp=(10.0,) * 4)
    assert payload_size(small, 0) == 52 + 4 * FLASH.n_vocab + 32 + (81920 + 524288)
