"""Session semantics: suffix-only prefill, reset on divergence, context limits, lazy weights."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from ds4agent.engine import Engine, EngineError, SamplingParams
from ds4agent.engine.session import ContextFullError


@pytest.fixture(scope="module")
def engine(demo_path):
    # Float activations: a suffix prefill and a fresh prefill then agree to float rounding.
    # (With the default 8-bit activations a rounding flip in one activation moves this random
    # model's logits by percents; test_kernels.py bounds that path on its own.)
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels="cpu-exact") as e:
        yield e


def test_sync_prefills_only_the_suffix(engine) -> None:
    s = engine.session()
    a = list(range(1000, 1040))
    assert s.sync(a) == 40
    assert s.sync(a + [7, 8, 9]) == 3
    assert s.tokens == a + [7, 8, 9]
    assert s.sync(a + [7, 8, 9]) == 0  # nothing new
    fresh = engine.session()
    fresh.sync(a + [7, 8, 9])
    assert np.allclose(fresh.logits, s.logits, rtol=1e-4, atol=1e-4)


def test_sync_resets_when_not_an_extension(engine) -> None:
    s = engine.session()
    s.sync([5, 6, 7, 8])
    assert s.sync([5, 6, 9]) == 3  # diverged: everything again
    assert s.tokens == [5, 6, 9]
    assert s.sync([5, 6]) == 2  # a shorter prompt is not an extension either


def test_context_limits(engine) -> None:
    s = engine.session()
    with pytest.raises(ContextFullError):
        s.sync(list(range(300)))
    s.sync(list(range(250)))
    steps = list(s.generate(SamplingParams(temperature=0), max_tokens=100, stop_at_eos=False))
    assert steps[-1].finish == "context"
    assert len(steps) == 256 - 250 - 1  # at most ctx - prompt - 1 new tokens
    with pytest.raises(ValueError):
        engine.session().sync([10**7])


def test_generate_stops_at_eos_and_max(engine) -> None:
    s = engine.session()
    s.sync([100, 200, 300])
    steps = list(s.generate(SamplingParams(temperature=0), max_tokens=5))
    assert [st.index for st in steps] == list(range(5)) and steps[-1].finish == "length"
    assert len(s.tokens) == 3 + 4  # the last sampled token is yielded, not evaluated
    s2 = engine.session()
    s2.sync([100, 200, 300])
    eos = engine.tokenizer.eos_id
    forced = np.full(engine.info.config.n_vocab, -10.0, np.float32)
    forced[eos] = 10.0
    s2._live = dataclasses.replace(s2._live, logits=forced)
    steps = list(s2.generate(SamplingParams(temperature=0), max_tokens=5))
    assert len(steps) == 1 and steps[0].token == eos and steps[0].finish == "eos"


def test_experts_are_gathered_not_materialised(demo_path, monkeypatch) -> None:
    """Only the selected experts' packed rows are dequantised, never a whole expert tensor."""
    from ds4agent.engine import weights

    seen = []
    real = weights.dequantize

    def spy(raw, qtype):
        seen.append(tuple(raw.shape))
        return real(raw, qtype)

    monkeypatch.setattr(weights, "dequantize", spy)
    with Engine.open(demo_path, backend="cpu", ctx=64, kernels="reference") as e:
        s = e.session()
        s.sync([11, 22, 33])
        cfg = e.info.config
        per_expert = {(cfg.expert_ff, e.file.tensors["blk.0.ffn_gate_exps.weight"].row_bytes),
                      (cfg.n_embd, e.file.tensors["blk.0.ffn_down_exps.weight"].row_bytes)}
        expert_calls = [sh for sh in seen if sh in per_expert]
        assert expert_calls, seen
        assert not any(len(sh) == 3 for sh in seen)  # no (experts, rows, bytes) block was dequantised
        assert e.model.w.materialised_bytes() < 64 * 2**20


def test_cpu_kernels_read_experts_in_place(demo_path, monkeypatch) -> None:
    """The native kernels find the experts through addresses in the model file's mmap (no
    copy), and nothing expert-sized is materialised."""
    from ds4agent.engine.kernels import cpu

    calls = []
    real = cpu.moe_rows

    def spy(x, sel, route_w, rows, clamp, int8=True, into=None, alone=False):
        calls.append(rows)
        return real(x, sel, route_w, rows, clamp, int8, into)

    monkeypatch.setattr(cpu, "moe_rows", spy)
    with Engine.open(demo_path, backend="cpu", ctx=64, kernels="cpu") as e:
        e.session().sync([11, 22, 33])
        mm = np.frombuffer(e.file.raw("blk.0.ffn_gate_exps.weight"), dtype=np.uint8)
        assert len(calls) == e.info.config.n_layer
        for rows in calls:
            for a in rows.keep:
                assert not a.flags.owndata and not a.flags.writeable  # read-only views of the file
        gate = calls[0].keep[0]
        assert np.shares_memory(gate, mm)
        expect = gate.ctypes.data + np.arange(gate.shape[0], dtype=np.uint64) * gate.strides[0]
        assert np.array_equal(calls[0].gate, expect)  # expert e's first row, in the mapping
        assert e.model.w.materialised_bytes() < 2**20  # norms and small vectors only


def test_open_reads_no_weights(flash_header_path) -> None:
    """Opening the (sparse) 80.8 GiB Flash layout materialises nothing."""
    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    with Engine.open(flash_header_path, backend="cpu", ctx=4096) as e:
        assert e.info.is_flash and e.info.config.n_layer == 43
        assert e.model.w.materialised_bytes() == 0
        grown = rss() - before
    # Header, vocabulary (strings and the HF tokenizer's tables); no tensor data.
    assert grown < 400 * 2**20, grown


def test_open_errors(tmp_path, demo_path) -> None:
    with pytest.raises(EngineError, match="unknown backend"):
        Engine.open(demo_path, backend="tpu")
    with pytest.raises(EngineError, match="metal backend is not available"):
        Engine.open(demo_path, backend="metal")
    with pytest.raises(EngineError, match="context size"):
        Engine.open(demo_path, ctx=1)
