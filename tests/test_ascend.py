"""The Ascend module (engine/ascend: PyTorch, torch_npu) run on CPU torch: no NPU here.

What runs: the plain-torch operations, the dequantisers, the forward pass, the layer split
over several "devices" (all of them the host), sessions crossing between it and the MLX
engine, W8A8 emulated in plain torch, and the registry's fused entries against a stand-in
torch_npu (tests/npu_standin.py) written from torch_npu's documentation, never the real
one: that nothing ran on Ascend hardware is said in README.md and docs/ascend.md.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from helpers import random_blocks, rel_err, same_bits
from npu_standin import StandIn

from ds4agent.engine import Engine, EngineError, SamplingParams
from ds4agent.engine import quants as mlx_quants
from ds4agent.engine.ascend import devices as adev
from ds4agent.engine.ascend import engine as aengine
from ds4agent.engine.ascend import plain
from ds4agent.engine.ascend import qat as aqat
from ds4agent.engine.ascend import quants as aquants
from ds4agent.engine.ascend import weights as aweights

# torch's OpenMP workers spin against each other on a busy 2-core box (an index_add of a few
# KB measured 18 ms with 2 threads, 20 µs with 1); the tests' sizes need no parallelism.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "qat_vectors.npz"


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128000, n).tolist()


def _open(path, devices="cpu", qat_sim=False, ctx=1024, **kw) -> Engine:
    return Engine.open(path, backend="npu", devices=devices, ctx=ctx, qat_sim=qat_sim, **kw)


@pytest.fixture(scope="module")
def torch_engine(demo_path):
    e = _open(demo_path)
    yield e
    e.close()


@pytest.fixture(scope="module")
def mlx_engine(demo_path):
    e = Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=False, kernels="reference")
    yield e
    e.close()


# -- dequantisation ------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", [Q.IQ2_XXS, Q.Q2_K, Q.Q4_K, Q.Q8_0])
def test_dequantisers_bit_exact_with_gguf_and_mlx(qtype) -> None:
    raw = random_blocks(qtype, 24, 3, seed=int(qtype))
    want = gguf_dequantize(raw, qtype).astype(np.float32)
    ours = aquants.dequantize(torch.from_numpy(raw), qtype).numpy()
    assert same_bits(ours, want)
    assert same_bits(ours, np.array(mlx_quants.dequantize(raw, qtype)))
    # A batch of experts (3 leading axes) expands the same bytes to the same values.
    assert same_bits(aquants.dequantize(torch.from_numpy(raw.reshape(2, 12, -1)), qtype).numpy().reshape(want.shape), want)


@pytest.mark.parametrize("qtype", [Q.F16, Q.F32])
def test_float_formats_bit_exact(qtype) -> None:
    vals = np.random.default_rng(3).normal(size=(5, 64)).astype(np.float16 if qtype == Q.F16 else np.float32)
    raw = vals.view(np.uint8)
    ours = aquants.dequantize(torch.from_numpy(raw), qtype).numpy()
    assert same_bits(ours, vals.astype(np.float32))
    assert same_bits(ours, np.array(mlx_quants.dequantize(raw, qtype)))


def test_q8_matrix_and_packed_experts_dequantise_exactly(demo_path) -> None:
    """The device-side forms (Q8Matrix over the file's blocks, Packed expert rows) give
    gguf's values: what the products compute with."""
    from ds4agent.modelfile.gguf import GGUFFile

    with _open(demo_path) as e, GGUFFile(demo_path) as f:
        w = e.model.w
        name = "blk.0.attn_q_a.weight"
        want = gguf_dequantize(np.ascontiguousarray(f.array(name)), f.tensors[name].type).reshape(f.tensors[name].shape)
        assert same_bits(w.matrix(name).dequantized().numpy(), want.astype(np.float32))
        name = "blk.1.ffn_gate_exps.weight"
        t = f.tensors[name]
        got = w.packed(1, "gate").experts(torch.tensor([3, 0])).numpy()
        for j, ex in enumerate((3, 0)):
            assert same_bits(got[j], gguf_dequantize(np.ascontiguousarray(f.array(name)[ex]), t.type).astype(np.float32))


def test_only_the_selected_experts_are_dequantised(torch_engine, monkeypatch) -> None:
    """Per experts() call, the experts dequantised are the ones its tokens chose, never more,
    never a whole expert tensor; over a prefill, a short product and decode."""
    from ds4agent.engine.ascend import registry

    calls: list[tuple[set, set, int]] = []  # (selected, asked for, expert matrices dequantised)
    current: dict = {}
    real_experts, real_packed, real_dq = plain.experts, aweights.Packed.experts, aweights.dequantize

    def dq(raw, qtype):  # what the expert bytes handed to the dequantiser hold
        current["n"] += raw.shape[0] if raw.dim() == 3 else 1
        return real_dq(raw, qtype)

    def packed_experts(self, ids):
        assert ids.numel() == len(set(ids.tolist()))  # each expert once per call
        current["got"] |= set(ids.tolist())
        return real_packed(self, ids)

    def experts(x, sel, weights, mats, clamp):
        current["got"], current["n"] = set(), 0
        out = real_experts(x, sel, weights, mats, clamp)
        calls.append((set(sel.reshape(-1).tolist()), current["got"], current["n"]))
        return out

    monkeypatch.setattr(aweights, "dequantize", dq)
    monkeypatch.setattr(aweights.Packed, "experts", packed_experts)
    monkeypatch.setitem(registry._PLAIN, "experts", experts)
    s = torch_engine.session()
    s.sync(_prompt(40, 1))
    s.sync(s.tokens + [5, 6, 7])
    s.eval(9)
    assert len(calls) == 3 * torch_engine.info.config.n_layer
    for selected, got, n in calls:
        assert got == selected
        assert n == 3 * len(selected)  # gate, up, down of each selected expert, nothing else
    # decoding one token (the last n_layer calls) dequantises its 2 experts of 16, per layer
    assert all(len(got) <= torch_engine.info.config.n_expert_used
               for _, got, _ in calls[-torch_engine.info.config.n_layer:])


# -- QAT rounding ---------------------------------------------------------------------------------

def _bits(ours: torch.Tensor, ref: np.ndarray) -> None:
    assert same_bits(ours.numpy().astype(np.float32), ref.astype(np.float32))


def test_qat_rounding_bit_exact_with_golden_vectors() -> None:
    z = np.load(GOLDEN)
    t = lambda k: torch.from_numpy(np.ascontiguousarray(z[k], dtype=np.float32))  # noqa: E731
    _bits(aqat.e4m3_round(t("e4m3_in")), z["e4m3_out"])
    _bits(aqat.e2m1_round(t("e2m1_in")), z["e2m1_out"])
    _bits(aqat.f16_round(t("f16_in")), z["f16_out"])
    for width in (512, 192, 256):
        _bits(aqat.fp8_kv_round(t(f"fp8_{width}_in"), 64), z[f"fp8_{width}_out"])
    _bits(aqat.hadamard(t("had_normal_in")), z["had_normal_out"])
    _bits(aqat.hadamard(t("idx_in")), z["idx_had_out"])
    _bits(aqat.fp4_round(t("fp4_in")), z["fp4_out"])
    _bits(aqat.indexer_round(t("idx_in")), z["idx_qat_out"])
    for width in (512, 128):
        st = np.ascontiguousarray(z[f"chain{width}_stages"], dtype=np.float32)
        x = torch.from_numpy(np.ascontiguousarray(st[:, 2]))
        third = aqat.fp8_kv_round(x, 64) if width == 512 else aqat.indexer_round(x)
        _bits(third, st[:, 3])
        _bits(aqat.f16_round(torch.from_numpy(np.ascontiguousarray(st[:, 3]))), st[:, 4])


def test_qat_ceil_log2_near_powers_of_two() -> None:
    """Every float32 just above each power of two (where log2f rounds down): same bits as the
    MLX/numpy version (tested exhaustively against C in test_qat.py)."""
    from ds4agent.engine import qat

    e = np.arange(-120, 120, dtype=np.int32)
    m = np.array([1, 2, 3, 7, 100, 1000, 5000, 2**22], dtype=np.int32)
    bits = (((e[:, None] + 127) << 23) | m[None, :]).reshape(-1)
    r = bits.view(np.float32)
    assert same_bits(aqat.pow2_ceil_log2(torch.from_numpy(r.copy())).numpy(), qat.pow2_ceil_log2(r.copy()))


# -- the forward pass ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [20, 150])
def test_logits_match_mlx_reference(torch_engine, mlx_engine, n: int) -> None:
    ids = _prompt(n, n)
    a, b = torch_engine.session(), mlx_engine.session()
    a.sync(ids)
    b.sync(ids)
    assert rel_err(a.logits, b.logits) <= 1e-4
    assert int(np.argmax(a.logits)) == int(np.argmax(b.logits))


def test_logits_and_greedy_tokens_match_transformers(torch_engine, demo_path) -> None:
    """transformers' deepseek_v4 on gguf's dequantisation (tests/hf_oracle.py), QAT off:
    the last position after 300 tokens (indexer choosing 8 of 75 rows) and 12 greedy
    tokens after a 140-token prompt (12: each decode step here costs ~0.15-0.5 s, the output head
    dequantised in tiles)."""
    from hf_oracle import load_hf
    from transformers import DynamicCache

    model, _ = load_hf(demo_path)
    ids = _prompt(300, 420)
    s = torch_engine.session()
    s.sync(ids)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
    assert rel_err(s.logits, ref) <= 1e-4
    assert int(np.argmax(s.logits)) == int(np.argmax(ref))
    prompt = _prompt(140, 3)
    s.sync(prompt)
    ours = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=12, stop_at_eos=False)]
    cache, theirs = DynamicCache(config=model.config), []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        for _ in range(12):
            theirs.append(int(out.logits[0, -1].argmax()))
            out = model(input_ids=torch.tensor([[theirs[-1]]]), cache=out.cache, use_cache=True)
    assert ours == theirs


def test_q4_experts_match_mlx(demo_q4_path) -> None:
    ids = _prompt(60, 11)
    with _open(demo_q4_path) as a, Engine.open(demo_q4_path, backend="cpu", ctx=1024, qat_sim=False,
                                               kernels="reference") as b:
        sa, sb = a.session(), b.session()
        sa.sync(ids)
        sb.sync(ids)
        assert rel_err(sa.logits, sb.logits) <= 1e-4


def test_decode_equals_prefill(demo_path) -> None:
    """One batch, chunks of 32 and token by token: the same logits and the same state, QAT
    off. With QAT on, torch's matmuls sum a batch in another order than a single row, a
    one-ulp difference can move a cached value across an FP8 step, and this random model
    cascades that (measured 2e-4 after 180 tokens): the same reason tests/test_model.py holds
    only the MLX reference, whose sums do not depend on the batch, to it with QAT on."""
    ids = _prompt(140, 5)
    with _open(demo_path, qat_sim=False) as e:
        runs = []
        for chunk in (256, 32, 1):
            s = e.session()
            s.prefill_chunk = chunk
            # token by token from 124 on: ratio-4 rows, the indexer's choice among them and the
            # first ratio-128 row (at 128) are made in decode (a decode step costs ~0.15-0.5 s here)
            s.sync(ids[:124] if chunk == 1 else ids)
            for t in ids[len(s.tokens):]:
                s.eval(t)
            runs.append(s)
        for other in runs[1:]:
            assert other.tokens == ids
            assert rel_err(other.logits, runs[0].logits) <= 1e-4
            for la, lb in zip(runs[0]._live.state.layers, other._live.state.layers):
                for xa, xb in ((la.raw, lb.raw), (la.comp, lb.comp), (la.idx_comp, lb.idx_comp)):
                    if xa is not None:
                        assert xa.shape == xb.shape
                        assert torch.allclose(xa, xb, rtol=1e-3, atol=1e-4)
                for fa, fb in ((la.comp_frontier, lb.comp_frontier), (la.idx_frontier, lb.idx_frontier)):
                    if fa is not None:
                        assert torch.allclose(fa.kv, fb.kv, rtol=1e-3, atol=1e-4)
                        assert torch.equal(fa.score <= -1e29, fb.score <= -1e29)
        assert any(st.ratio == 128 and st.comp.shape[0] == 1 for st in runs[2]._live.state.layers)


def test_qat_on_matches_mlx_reference(demo_path) -> None:
    """The model's own numerics (FP8 KV, FP4 indexer, f16 cache) on both engines."""
    ids = _prompt(150, 8)
    with _open(demo_path, qat_sim=True) as a, Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=True,
                                                          kernels="reference") as b:
        sa, sb = a.session(), b.session()
        sa.sync(ids)
        sb.sync(ids)
        # The rounding functions are bit-exact (above); what differs is the FP8 cascade of a
        # different summation order (test_decode_equals_prefill): measured 2.5e-3 here.
        assert rel_err(sa.logits, sb.logits) <= 1e-2
        assert int(np.argmax(sa.logits)) == int(np.argmax(sb.logits))


# -- sessions across the two engines ---------------------------------------------------------------

def _greedy(s, n: int = 6) -> list[int]:
    return [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=n, stop_at_eos=False)]


def test_sessions_cross_between_torch_and_mlx(demo_path) -> None:
    """A snapshot made on the torch engine loads on MLX and the other way round (the same
    payload bytes), and the continuation from it is the one the saving engine makes."""
    ids = _prompt(150, 21)
    with _open(demo_path, qat_sim=True) as a, Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=True,
                                                          kernels="reference") as b:
        assert a.info.fingerprint == b.info.fingerprint
        sa = a.session()
        sa.sync(ids)
        blob = sa.snapshot()
        assert len(blob) == sa.payload_size(150)
        sb = b.session()
        sb.restore(blob)
        assert sb.tokens == ids and np.array_equal(sb.logits, sa.logits)
        assert sb.snapshot() == blob  # the MLX engine reads exactly what the torch one wrote
        sa2 = a.session()
        sa2.restore(blob)
        assert sa2.snapshot() == blob
        want = _greedy(sa)
        assert _greedy(sb) == want
        assert _greedy(sa2) == want
        # and back: an MLX snapshot continued on torch
        sm = b.session()
        sm.sync(ids)
        st = a.session()
        st.restore(sm.snapshot())
        assert _greedy(st) == _greedy(sm)


def test_session_store_round_trip_on_torch(demo_path, tmp_path) -> None:
    from helpers import convo_session

    from ds4agent.sessions import SessionStore

    with _open(demo_path, qat_sim=True) as a, Engine.open(demo_path, backend="cpu", ctx=1024, qat_sim=True,
                                                          kernels="reference") as b:
        s = convo_session(a, "hello there")
        store = SessionStore(tmp_path)
        saved = store.save(s)
        loaded = b.session()
        store.load(getattr(saved, "sha", saved), loaded)
        assert loaded.tokens == s.tokens
        assert np.array_equal(loaded.logits, s.logits)


# -- several devices ----------------------------------------------------------------------------------

def test_two_devices_same_results_one_move_per_boundary(demo_path, torch_engine) -> None:
    ids = _prompt(150, 4)
    with _open(demo_path, devices="cpu,cpu,cpu") as e:
        m = e.model
        assert len(e.info.devices) == 3
        assert [s.layers for s in m.w.stages] == [range(0, 2), range(2, 4), range(4, 6)] or \
            sorted(i for s in m.w.stages for i in s.layers) == list(range(6))
        stages = {m.w.layer_stage[i] for i in range(e.info.config.n_layer)}
        assert stages == {0, 1, 2}
        assert m.w.layer_stage == sorted(m.w.layer_stage)  # contiguous
        s = e.session()
        s.sync(ids)  # one call of 150 tokens
        assert m.moves == 2
        s.eval(7)
        assert m.moves == 4
        one = torch_engine.session()
        one.sync(ids)
        one.eval(7)
        assert same_bits(s.logits, one.logits)
        assert s.snapshot() == one.snapshot()


def test_memory_reported_and_a_clear_message_when_it_does_not_fit(demo_path) -> None:
    from ds4agent.modelfile.config import config_from_gguf
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        lb, emb, head = aweights.tensor_bytes(f, cfg)
    GiB = 1024**3
    big = [(64 * GiB, 64 * GiB), (64 * GiB, 64 * GiB)]
    st = adev.plan(cfg, lb, emb, head, ["npu:0", "npu:1"], big, 4096)
    assert [s.layers.start for s in st] == [0, st[1].layers.start] and st[1].layers.stop == cfg.n_layer
    assert 0 < st[1].layers.start < cfg.n_layer
    line = st[0].describe(2, 4096)
    assert line.startswith("npu:0: layers 0-") and "embedding" in line and "64.00 GiB free of 64.00 GiB" in line
    assert "output head" in st[1].describe(2, 4096)
    small = [(adev.WORKING_BYTES + 1000, 8 * GiB)]
    with pytest.raises(adev.AscendError) as ei:
        adev.plan(cfg, lb, emb, head, ["npu:0"], small, 4096)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("the model does not fit: npu:0 would hold") and "--devices 0,1" in msg
    # The Flash layout on one 48 GB die of a 300I Duo does not fit; on its two dies it does.
    from ds4agent.modelfile.config import FLASH

    layers = [0] * FLASH.n_layer
    flash_layer = int(78 * GiB / FLASH.n_layer)
    die = (int(45.5 * GiB), 48 * GiB)
    with pytest.raises(adev.AscendError, match="npu:0 would hold"):
        adev.plan(FLASH, [flash_layer] * FLASH.n_layer, GiB, 2 * GiB, ["npu:0"], [die], 32768)
    two = adev.plan(FLASH, [flash_layer] * FLASH.n_layer, GiB, 2 * GiB, ["npu:0", "npu:1"], [die, die], 32768)
    assert abs(len(two[0].layers) - len(two[1].layers)) <= 2
    del layers


def test_parse_devices() -> None:
    assert adev.parse_devices("0,1") == ["npu:0", "npu:1"]
    assert adev.parse_devices(None) == ["npu:0"]
    assert adev.parse_devices("cpu,cpu") == ["cpu", "cpu"]
    for bad in ("0,0", "gpu", ""):
        with pytest.raises(adev.AscendError):
            adev.parse_devices(bad)


# -- W8A8 ---------------------------------------------------------------------------------------------

def test_dynamic_quant_emulation_matches_an_independent_statement() -> None:
    """plain.quantize_tokens (the CPU statement of npu_dynamic_quant: symmetric per token,
    scale max|x|/127, round half to even) and the exact integer product."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 96)).astype(np.float32)
    x[2] = 0
    q, s = plain.quantize_tokens(torch.from_numpy(x))
    amax = np.abs(x).max(axis=1)
    want_s = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    assert np.array_equal(s.numpy(), want_s)
    assert np.array_equal(q.numpy(), np.clip(np.rint(x / want_s[:, None]), -127, 127).astype(np.int8))
    a = rng.integers(-127, 128, size=(3, 3000)).astype(np.int8)
    b = rng.integers(-127, 128, size=(4, 3000)).astype(np.int8)
    got = plain.int_matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64).T)


W8A8_BOUND = 0.08  # measured 0.034 median on the demo model (docs/ascend.md, "W8A8")


def test_w8a8_accuracy_cost_measured(demo_path, torch_engine) -> None:
    """W8A8 on the Q8_0 matrices against the exact path, teacher-forced on the exact path's 12
    greedy tokens (free-running greedy decoding diverges at the first position where the exact
    path's top two logits lie within the rounding, which on a random-weight model depends on
    the machine's float order): the relative logit difference at each position, and where the
    W8A8 path's top token ranks among the exact path's; printed (docs/ascend.md quotes them)."""
    ids = _prompt(150, 31)
    b = torch_engine.session()
    b.sync(ids)
    greedy = _greedy(b, 12)
    with _open(demo_path, w8a8=True) as q:
        assert q.info.kernels.endswith("w8a8")
        assert any(isinstance(m, aweights.W8A8Matrix) for _, m in q.model.w._t.items())
        a = q.session()
        a.sync(ids)
        b.sync(ids)
        errs, ranks = [], []
        for token in greedy:
            exact = b.logits
            errs.append(rel_err(a.logits, exact))
            ranks.append(int((exact > exact[int(np.argmax(a.logits))]).sum()))  # 0: the same top token
            a.eval(token)
            b.eval(token)
    print(f"W8A8 cost: logits rel. diff median {np.median(errs):.4f} (max {max(errs):.4f}), the same top token "
          f"at {ranks.count(0)}/12 positions, W8A8's top token ranked {ranks} by the exact path")
    assert 0 < np.median(errs) <= W8A8_BOUND
    assert ranks.count(0) >= 8 and max(ranks) <= 2


# -- the registry and the fused entries (stand-in torch_npu) --------------------------------------------

@pytest.fixture()
def standin_engine(demo_path, monkeypatch):
    def make(bug: str | None = None, **kw):
        npu = StandIn(bug)
        monkeypatch.setattr(aengine, "build", functools.partial(_real_build, npu=npu))
        return _open(demo_path, **kw), npu

    return make


_real_build = aengine.build


def test_fused_entries_map_their_arguments(standin_engine, torch_engine) -> None:
    """Every fused entry, called at torch_npu's documented signatures against a stand-in that
    checks dtypes and shapes and computes the documented result, gives the plain result
    (within the float16 rounding those ops compute in), and the whole model then gives the
    plain engine's answer."""
    e, npu = standin_engine()
    reg = e.model.reg
    assert e.info.kernel_note is None, e.info.kernel_note
    # every entry but W8A8's (a W8A8 engine: below) is used on the demo
    assert set(reg.fused) == {"linear_q8", "linear_w8a8", "rms_norm", "route", "experts", "attend", "index_select",
                              "sinkhorn"}
    ids = _prompt(150, 9)
    s, p = e.session(), torch_engine.session()
    s.sync(ids)
    p.sync(ids)
    used = {op for op, (f, _) in reg.calls.items() if f}
    # attend steps aside on the demo's 256-wide heads (the op takes 512: checked on its own below)
    assert used == {"linear_q8", "rms_norm", "route", "experts", "index_select", "sinkhorn"}
    assert reg.calls["attend"] == [0, e.info.config.n_layer]  # one call per layer for the one sync
    assert rel_err(s.logits, p.logits) <= 2e-2
    assert int(np.argmax(s.logits)) == int(np.argmax(p.logits))
    assert set(npu.called) >= {"npu_weight_quant_batchmatmul", "npu_rms_norm", "npu_moe_gating_top_k",
                               "npu_grouped_matmul", "npu_lightning_indexer", "npu_mhc_sinkhorn"}
    e.close()


@pytest.mark.parametrize("bug", ["route_lowest", "gmm_untransposed", "wq_no_scale", "indexer_raises",
                                 "norm_no_gamma"])
def test_open_time_check_refuses_a_wrong_fused_op(standin_engine, torch_engine, bug: str) -> None:
    e, _ = standin_engine(bug)
    op = {"route_lowest": "route", "gmm_untransposed": "experts", "wq_no_scale": "linear_q8",
          "indexer_raises": "index_select", "norm_no_gamma": "rms_norm"}[bug]
    assert op not in e.model.reg.fused
    assert e.info.kernel_note and op in e.info.kernel_note and "\n" not in e.info.kernel_note
    assert any(line.startswith(op) and "refused" in line for line in e.model.reg.report())
    s, p = e.session(), torch_engine.session()
    ids = _prompt(40, 2)
    s.sync(ids)
    p.sync(ids)
    assert rel_err(s.logits, p.logits) <= 2e-2
    e.close()


def test_w8a8_fused_entry_maps_its_arguments(standin_engine) -> None:
    e, npu = standin_engine(w8a8=True)
    assert "linear_w8a8" in e.model.reg.fused
    with _open(e.info.path, w8a8=True) as plain_e:
        ids = _prompt(40, 3)
        a, b = e.session(), plain_e.session()
        a.sync(ids)
        b.sync(ids)
        assert rel_err(a.logits, b.logits) <= 2e-2
    assert "npu_quant_matmul" in npu.called and "npu_dynamic_quant" in npu.called
    e.close()


def test_missing_fused_functions_run_plain() -> None:
    from ds4agent.engine.ascend.registry import Registry

    class Partial:
        npu_rms_norm = staticmethod(lambda x, g, epsilon: (plain.rms_norm(x, g, epsilon), None))

    reg = Registry(Partial(), use_fused=True)
    assert list(reg.fused) == ["rms_norm"]
    line = next(x for x in reg.report() if x.startswith("attend"))
    assert line.endswith("plain torch (this torch_npu has no npu_sparse_flash_attention)")
    assert all("plain torch" in x for x in Registry(None).report())


def test_fused_attention_maps_its_arguments() -> None:
    """npu_sparse_flash_attention takes 512-wide heads (Flash's): random rows of that width,
    a window-and-compressed-rows mask, sinks; the stand-in computes the documented result."""
    from ds4agent.engine.ascend import fused

    g = torch.Generator().manual_seed(1)
    H, T, N, D = 8, 5, 40, 512
    q, keys = torch.randn(H, T, D, generator=g), torch.randn(N, D, generator=g)
    mask = (torch.arange(N)[None, :] <= torch.arange(N - T, N)[:, None]) & (torch.rand(T, N, generator=g) > 0.3)
    mask[:, -1] = True
    sinks = torch.randn(H, generator=g)
    want = plain.sink_attend(q, keys, mask, sinks)
    got = fused.attend(StandIn(None), q, keys, mask, sinks)
    assert rel_err(got.numpy(), want.numpy()) <= 2e-3
    bad = fused.attend(StandIn("attend_no_sinks"), q, keys, mask, sinks)
    assert rel_err(bad.numpy(), want.numpy()) > 1e-2  # the comparison would see a dropped argument


# -- the command line ---------------------------------------------------------------------------------

def _ds4(args: list[str], env_extra: dict | None = None, pre: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    code = pre + "import sys; from ds4agent.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)


def test_backend_npu_without_torch_npu_says_what_is_missing(demo_path) -> None:
    r = _ds4(["-p", "hi", "-m", str(demo_path), "--backend", "npu", "-n", "2"])
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr
    assert err[0] == ("ds4: error: --backend npu needs torch_npu (Ascend's PyTorch plugin), which is not installed: "
                      "pip install 'ds4agent[npu]', on a host with the CANN toolkit")


BLOCK_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "torch_npu"}:
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""


def test_backend_npu_without_torch_and_the_base_install_never_imports_torch(demo_path) -> None:
    r = _ds4(["-p", "hi", "-m", str(demo_path), "--backend", "npu", "-n", "2"], pre=BLOCK_TORCH)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert "torch is not installed: pip install 'ds4agent[npu]'" in r.stderr
    r = _ds4(["-p", "hi", "-m", str(demo_path), "--backend", "cpu", "-n", "2", "--temp", "0"], pre=BLOCK_TORCH)
    assert r.returncode == 0, r.stderr  # the MLX engine runs with torch unimportable


def test_backend_npu_with_a_device_that_is_not_there(monkeypatch) -> None:
    class FakeNpu:
        @staticmethod
        def device_count() -> int:
            return 1

    fake = type(sys)("torch_npu")
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch, "npu", FakeNpu, raising=False)
    with pytest.raises(adev.AscendError, match=r"^--devices 1: this machine has 1 Ascend device \(device 0\)$"):
        adev.load_torch(["npu:0", "npu:1"])
    monkeypatch.setattr(FakeNpu, "device_count", staticmethod(lambda: 0))
    with pytest.raises(adev.AscendError, match="found no Ascend device"):
        adev.load_torch(["npu:0"])


def test_one_shot_chat_on_the_torch_engine(demo_path) -> None:
    """`ds4 -p` through the whole front end on --backend npu --devices cpu: the greedy answer
    is the MLX engine's (same model, QAT on, same rendered prompt)."""
    args = ["-p", "Say hi", "-m", str(demo_path), "-n", "8", "--temp", "0", "--nothink", "--ctx", "1024"]
    r = _ds4(args + ["--backend", "npu", "--devices", "cpu"], {"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "ds4: cpu: layers 0-5 + embedding + output head" in r.stderr
    m = _ds4(args + ["--backend", "cpu", "--kernels", "reference"])
    assert m.returncode == 0, m.stderr
    assert r.stdout == m.stdout and r.stdout.strip()


def test_bad_kernels_for_npu_is_one_line(demo_path) -> None:
    with pytest.raises(EngineError, match="--kernels cpu is not for --backend npu"):
        _open(demo_path, kernels="cpu")
    with pytest.raises(EngineError, match="options of --backend npu"):
        Engine.open(demo_path, backend="cpu", devices="0")


def test_cli_backends_are_the_engines() -> None:
    """--backend offers exactly what Engine.open takes (engine/choices.py), npu included."""
    from ds4agent import cli
    from ds4agent.engine import engine

    sub = cli.build_parser()._subparsers._group_actions[0].choices["chat"]
    flag = next(a for a in sub._actions if "--backend" in a.option_strings)
    assert tuple(flag.choices) == engine.BACKENDS and "npu" in flag.choices
