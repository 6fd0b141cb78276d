"""What each kernel path holds of the routed experts: never a whole expert tensor dequantised,
never more than the experts a call's tokens selected.

The reference path is what a Mac user gets when a GPU kernel is refused (tests/test_kernel_check.py),
so it must hold the real model (81 GiB) in 128 GiB: the dense weights are materialised once
(Q8_0 repacked losslessly, F16 kept as F16), the routed experts (73 GiB of the file) stay in the
mmap and only the selected experts' rows are dequantised, expert by expert
(bench/reference_memory.py measures the peak on real-dimension layers). Checked here on the
demo model for every path a session takes: the reference kernels, the GPU kernels' own
kernels (which dequantise nothing, at any number of tokens), GPU kernels whose expert kernel the
self-check refused, and the CPU kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernel_check import BUGS, HarnessGpu, _engine, _plant

from ds4agent.engine import Engine, SamplingParams
from ds4agent.engine import weights as weights_mod
from ds4agent.engine.kernels import gpu
from ds4agent.engine.weights import Weights


class Spy:
    """Records every dequantisation, every expert matrix asked for, every dense tensor
    materialised, and per call of the kernels' experts(): the experts its tokens selected and
    the experts it dequantised."""

    def __init__(self, monkeypatch) -> None:
        self.dequantised: list[tuple[int, ...]] = []
        self.got: list[str] = []
        self.calls: list[tuple[set, set, int]] = []  # (selected, dequantised, tokens)
        self._current: set | None = None
        real_dq, real_expert, real_get = weights_mod.dequantize, Weights.expert, Weights.get

        def dequantize(raw, qtype):
            self.dequantised.append(tuple(raw.shape))
            return real_dq(raw, qtype)

        def expert(w, layer, kind, e):
            if self._current is not None:
                self._current.add((layer, int(e)))
            return real_expert(w, layer, kind, e)

        def get(w, name):
            self.got.append(name)
            return real_get(w, name)

        monkeypatch.setattr(weights_mod, "dequantize", dequantize)
        monkeypatch.setattr(Weights, "expert", expert)
        monkeypatch.setattr(Weights, "get", get)

    def watch(self, kernels) -> None:
        real = kernels.experts

        def experts(layer, x, sel, weights, clamp):
            self._current = set()
            try:
                return real(layer, x, sel, weights, clamp)
            finally:
                self.calls.append(({(layer, int(e)) for e in np.unique(sel)}, self._current, len(sel)))
                self._current = None

        kernels.experts = experts

    def check(self, f, cfg, reference_tokens: int) -> None:
        """No dense materialisation of an expert tensor or the embedding; no dequantisation of
        more than one expert's rows at once; each experts() call dequantised only experts its
        tokens selected, all of them when it ran on the reference (more than
        ``reference_tokens`` tokens)."""
        assert not [n for n in self.got if "_exps." in n or n == "token_embd.weight"]
        one_expert = {(cfg.expert_ff, f.tensors["blk.0.ffn_gate_exps.weight"].row_bytes),
                      (cfg.n_embd, f.tensors["blk.0.ffn_down_exps.weight"].row_bytes)}
        assert not [s for s in self.dequantised if len(s) > 2]
        expert_rows = [s for s in self.dequantised if s in one_expert]
        assert self.calls and all(dq <= sel for sel, dq, _ in self.calls)
        assert all(dq == sel for sel, dq, T in self.calls if T > reference_tokens)
        assert len(expert_rows) == 3 * sum(len(dq) for _, dq, _ in self.calls)
        assert any(T == 1 for _, _, T in self.calls)


def _session(e: Engine) -> None:
    s = e.session()
    ids = np.random.default_rng(2).integers(1000, 120000, 30).tolist()
    s.sync(ids)  # 30 tokens: a prefill chunk
    s.sync(ids + [5, 6, 7])  # a 3-token product
    list(s.generate(SamplingParams(temperature=0), max_tokens=3, stop_at_eos=False))  # one token each


def test_reference_path(demo_path, monkeypatch) -> None:
    spy = Spy(monkeypatch)
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels="reference") as e:
        spy.watch(e.model.k)
        _session(e)
        spy.check(e.file, e.info.config, 0)
        assert e.model.w.materialised_bytes() < 64 * 2**20


@pytest.mark.parametrize("kernels", ["gpu-host", "kquant"])
def test_gpu_kernels_dequantise_nothing(demo_path, monkeypatch, kernels: str) -> None:
    """The GPU kernel sets at every size a session uses (a 30-token prefill, a 3-token suffix,
    decode): no dequantisation at all, no dense copy of an expert tensor or the embedding, no
    Q8_0 matrix repacked beside the raw bytes; only small tensors through Weights.get."""
    if kernels == "kquant":
        pytest.importorskip("mlx_kquant", reason="mlx-kquant is not installed (README, 'Kernels')")
    spy = Spy(monkeypatch)
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels=kernels) as e:
        spy.calls.clear()
        spy.dequantised.clear()
        spy.got.clear()  # the self-check's reference side at open
        spy.watch(e.model.k)
        _session(e)
        assert spy.dequantised == [] and {T for _, _, T in spy.calls} >= {1, 3, 30}
        assert all(not dq for _, dq, _ in spy.calls)
        f = e.file
        assert not [n for n in spy.got if "_exps." in n or n == "token_embd.weight"]
        assert not [n for n in spy.got if f.tensors[n].type_name == "Q8_0"]  # no QMatrix beside the raw bytes


def test_gpu_kernels_hold_the_raw_bytes_once(demo_path) -> None:
    """On the device the GPU kernels hold each tensor they read as its packed bytes, exactly
    its size in the file, one copy for decode and prefill alike."""
    from gpu_harness import harness_make

    with Engine.open(demo_path, backend="cpu", ctx=256, kernels="reference") as e:
        k = e.model.k = gpu.GpuKernels(e.model.w, "cuda", make=harness_make("cuda"))
        _session(e)
        names = k.resident.names()
        assert any("_exps." in n for n in names) and "output.weight" in names and "token_embd.weight" not in names
        for n in names:
            a = k.resident.get(n)
            assert str(a.dtype) == "mlx.core.uint8" and a.size == e.file.tensors[n].nbytes
        assert k.resident.nbytes() == sum(e.file.tensors[n].nbytes for n in names)
        assert e.model.w.materialised_bytes() < 2**20  # norms, scales, sinks: nothing else


def test_refused_expert_kernel_holds_nothing_of_the_experts(demo_path, monkeypatch) -> None:
    """The self-check refuses a wrong expert kernel: from then on every experts() call runs on
    the reference, per selected expert, and no expert tensor is held on the device."""
    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    _plant(monkeypatch, "wrong")
    assert BUGS["wrong"][2] == ("experts",)
    spy = Spy(monkeypatch)
    with _engine(demo_path, "cuda") as e:
        k = e.model.k
        assert set(e.info.kernel_check.refused) == {"experts"}
        spy.calls.clear()
        spy.dequantised.clear()  # the check's probes at open (one layer's selected experts)
        spy.watch(k)
        _session(e)
        spy.check(e.file, e.info.config, 0)
        assert not [n for n in k.resident.names() if "_exps." in n]


@pytest.mark.parametrize("kernels", ["cpu", "cpu-exact"])
def test_cpu_kernels_dequantise_nothing(demo_path, monkeypatch, kernels: str) -> None:
    spy = Spy(monkeypatch)
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels=kernels) as e:
        _session(e)
        assert not [n for n in spy.got if "_exps." in n or n == "token_embd.weight"]
        assert spy.dequantised == []


def test_reference_attention_in_blocks_is_the_same(demo_path, monkeypatch) -> None:
    """The reference attends over blocks of queries when the scores of a whole chunk would pass
    ATTEND_BLOCK_BYTES (long contexts); forced here on the demo model with a tiny budget: the
    same attention, and the same logits, as in one block."""
    import mlx.core as mx
    from helpers import rel_err

    from ds4agent.engine.kernels import reference
    from ds4agent.engine.kernels.reference import ReferenceKernels, attend_mx

    rng = np.random.default_rng(1)
    H, T, N, D = 4, 37, 90, 64
    q, keys = mx.array(rng.normal(size=(H, T, D)).astype(np.float32)), mx.array(rng.normal(size=(N, D)).astype(np.float32))
    mask, sinks = rng.random((T, N)) < 0.5, mx.array(rng.normal(size=H).astype(np.float32))
    whole = np.array(attend_mx(q, keys, mask, sinks))
    monkeypatch.setattr(reference, "ATTEND_BLOCK_BYTES", 4 * H * N * 5)  # blocks of 5 queries
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels="reference") as e:
        blocked = np.array(ReferenceKernels(e.model.w).attend(q, keys, mask, sinks))
        assert rel_err(blocked, whole) <= 1e-6
        s = e.session()
        ids = np.random.default_rng(2).integers(1000, 120000, 150).tolist()
        s.sync(ids)
        small = s.logits.copy()
    monkeypatch.setattr(reference, "ATTEND_BLOCK_BYTES", 1 << 28)
    with Engine.open(demo_path, backend="cpu", ctx=256, kernels="reference") as e:
        s = e.session()
        s.sync(ids)
        assert rel_err(small, s.logits) <= 1e-5
