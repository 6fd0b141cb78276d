"""The GPU kernels (engine/kernels/gpu.py) reading routed experts through the expert pool
(engine/expertpool.py): the same kernels, addressed by slot instead of by expert, must give the
same bits as with every expert on the device, down to a pool of one slot; on a GPU the slots
are device memory that the pool's reads fill in place (kernels/resident.py device_buffer); the
budget is taken from the device's limit. Run here through the host harness (gpu_host.py), which
compiles the very kernel bodies for the CPU; test_gpu_launch.py repeats the comparison on a GPU."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import Engine, EngineError, SamplingParams, engine, expertpool
from ds4agent.engine.expertpool import ExpertPool
from ds4agent.engine.kernels import gpu, resident
from ds4agent.engine.kernels.gpu_host import HostGpuKernels
from ds4agent.engine.weights import Weights
from ds4agent.modelfile.config import config_from_gguf
from ds4agent.modelfile.gguf import GGUFFile


def _slot(path: Path) -> int:
    with GGUFFile(path) as f:
        return expertpool.slot_bytes(f, config_from_gguf(f))


def _run(path: Path, budget, ctx: int) -> tuple:
    """A prompt and 4 greedy tokens on the GPU kernels' bodies: the last logits, the tokens,
    the saved session, the pool's counters."""
    with Engine.open(path, backend="cpu", ctx=ctx, kernels="gpu-host", memory_budget=budget) as e:
        assert e.info.kernels == "gpu-host" and e.info.kernel_check.refused == {}, e.info.kernel_note
        s = e.session()
        s.sync(list(range(5, 60)))
        tokens = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=4, stop_at_eos=False)]
        stats = e.streaming()
        assert stats is None or not stats["direct"]  # the GPU kernels address a slot plus one offset per matrix
        return np.array(s.logits), tokens, s.snapshot(), stats


@pytest.fixture(scope="module")
def resident_run(demo_path: Path) -> tuple:
    got = _run(demo_path, None, 200)
    assert got[3] is None  # the tiny model fits: nothing streams
    return got


@pytest.mark.parametrize("slots", [1, 3, 20])
def test_gpu_kernels_streaming_give_the_same_bits_as_resident(demo_path: Path, resident_run: tuple,
                                                               slots: int) -> None:
    """With one or three slots a prefill's layer runs in many turns of a few experts each,
    whose down partials are joined before one per-token sum: the same logits, tokens and
    saved session as with every expert resident."""
    got = _run(demo_path, slots * _slot(demo_path), 200)
    assert got[3]["slots"] == slots and got[3]["misses"] > 0
    assert np.array_equal(got[0].view(np.uint32), resident_run[0].view(np.uint32))
    assert got[1] == resident_run[1]
    assert got[2] == resident_run[2]


@pytest.fixture()
def device_pool(demo_path: Path):
    """The demo model's weights with a pool of 5 slots in device memory (an MLX array, as on
    a GPU), and the same weights without a pool."""
    f = GGUFFile(demo_path)
    cfg = config_from_gguf(f)
    pool = ExpertPool(f, cfg, 5 * expertpool.slot_bytes(f, cfg), allocate=resident.device_buffer)
    try:
        yield f, cfg, pool
    finally:
        pool.close()
        f.close()


def test_the_pool_in_device_memory_is_filled_in_place(device_pool) -> None:
    f, cfg, pool = device_pool
    assert isinstance(pool.backing, mx.array) and pool.backing.size == pool.allocated
    layer, experts = 1, np.array([2, cfg.n_expert - 1])
    with pool.holding(layer, experts) as rows:
        device = np.array(pool.backing)  # what MLX reads, not the host view the reads wrote
        for name, at in zip(("gate", "up", "down"), pool.offsets(layer)):
            t = f.array(f"blk.{layer}.ffn_{name}_exps.weight").view(np.uint8).reshape(cfg.n_expert, -1)
            for e in experts:
                s = int(rows.slots[e])
                start = s * pool.slot_bytes + at
                assert np.array_equal(device[start : start + t.shape[1]], t[e])
        assert (rows.slots >= 0).sum() == 2


@pytest.mark.parametrize("T", [1, 9])
def test_gpu_experts_read_the_device_pool_by_slot(device_pool, T: int) -> None:
    """The experts kernel over a 5-slot pool in device memory against the same kernel over the
    whole expert tensors: bit for bit, with more distinct experts than slots (several turns)."""
    f, cfg, pool = device_pool
    streamed, whole = HostGpuKernels(Weights(f, cfg, pool)), HostGpuKernels(Weights(f, cfg))
    rng = np.random.default_rng(T)
    x = mx.array(rng.normal(size=(T, cfg.n_embd)).astype(np.float32))
    sel = np.stack([rng.choice(cfg.n_expert, cfg.n_expert_used, replace=False) for _ in range(T)]).astype(np.int32)
    route = mx.array(rng.uniform(0.1, 1, size=sel.shape).astype(np.float32))
    for layer in range(cfg.n_layer):
        got = np.array(streamed.experts(layer, x, sel, route, 7.0))
        want = np.array(whole.experts(layer, x, sel, route, 7.0))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), layer
    assert len(pool.spans(sel)) == (1 if T == 1 else -(-len(np.unique(sel)) // 5))
    assert pool.stats.misses > 0


@pytest.fixture(scope="module")
def wide_path(tmp_path_factory) -> Path:
    """A tiny model whose experts are twice the hidden width (down rows of two Q2_K blocks,
    so that the down product may be split along its input)."""
    from dataclasses import replace

    from ds4agent.modelfile.demo import tiny_config, write_model

    return write_model(tmp_path_factory.mktemp("wide") / "wide.gguf",
                       replace(tiny_config(3), expert_ff=512, n_expert_used=3), "tiny", 1)


def test_a_turn_of_few_experts_keeps_the_whole_plans_splits(wide_path: Path, monkeypatch) -> None:
    """Splits are chosen from the thread count; a turn of one expert's tiles has fewer threads
    than the whole plan. Were its splits chosen from its own size, its partial sums would add
    in another order: with a thread target of two rows' worth, the whole plan's down product
    runs unsplit and a one-tile turn would run in two splits."""
    monkeypatch.setattr(gpu, "TARGET_THREADS", 512)
    with GGUFFile(wide_path) as f:
        cfg = config_from_gguf(f)
        pool = ExpertPool(f, cfg, 1 * expertpool.slot_bytes(f, cfg), allocate=resident.device_buffer)
        try:
            streamed, whole = HostGpuKernels(Weights(f, cfg, pool)), HostGpuKernels(Weights(f, cfg))
            rng = np.random.default_rng(3)
            x = mx.array(rng.normal(size=(4, cfg.n_embd)).astype(np.float32))
            sel = np.array([[0, 1, 2], [1, 2, 3], [0, 2, 3], [0, 1, 3]], dtype=np.int32)
            route = mx.array(rng.uniform(0.1, 1, size=sel.shape).astype(np.float32))
            got = np.array(streamed.experts(1, x, sel, route, 7.0))
            want = np.array(whole.experts(1, x, sel, route, 7.0))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        finally:
            pool.close()


def test_gpu_kernels_refuse_a_pool_outside_device_memory(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        pool = ExpertPool(f, cfg, 2 * expertpool.slot_bytes(f, cfg))  # the process's own mapping
        try:
            with pytest.raises(ValueError, match="not in device memory"):
                gpu.GpuKernels(Weights(f, cfg, pool), "host", make=lambda **_: None)
        finally:
            pool.close()


def test_device_memory_the_host_cannot_write_in_place_is_refused(monkeypatch) -> None:
    view, a = resident.device_buffer(64)
    assert view.size == 64 and not view.any()
    real = np.array

    def copying(obj, *args, copy=True, **kw):  # an MLX build whose host view is a copy
        return real(obj, *args, **kw) if isinstance(obj, mx.array) else real(obj, *args, copy=copy, **kw)

    monkeypatch.setattr(np, "array", copying)
    with pytest.raises(resident.DeviceMemoryError, match="not what the device reads"):
        resident.device_buffer(64)


def test_given_memory_must_be_writable_bytes(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        size = 2 * expertpool.slot_bytes(f, cfg)
        for bad in (np.zeros(size - 1, np.uint8), np.zeros(size // 4, np.float32), np.zeros(size, np.uint8)[::-1]):
            with pytest.raises(expertpool.PoolError, match="writable bytes"):
                ExpertPool(f, cfg, size, allocate=lambda n, bad=bad: (bad, None))
        ro = np.zeros(size, np.uint8)
        ro.flags.writeable = False
        with pytest.raises(expertpool.PoolError, match="writable bytes"):
            ExpertPool(f, cfg, size, allocate=lambda n: (ro, None))


@pytest.mark.parametrize("backend,kernels,where", [
    ("metal", None, "device"), ("metal", "metal", "device"), ("cuda", "cuda", "device"), ("metal", "kquant", None),
    ("cuda", "reference", None), ("cpu", None, "host"), ("cpu", "cpu-exact", "host"), ("cpu", "gpu-host", "host"),
    ("cuda", "gpu-host", "host")])
def test_where_the_pool_lives_for_each_kernel_set(backend: str, kernels, where, monkeypatch) -> None:
    monkeypatch.delenv("DS4_KERNELS", raising=False)
    assert engine._pool_memory(backend, kernels) == where


def _device_with(monkeypatch, limit: int, buffer: int) -> None:
    monkeypatch.setattr(resident, "device_limits", lambda backend: (limit, buffer, "the GPU's memory"))


def test_auto_budget_on_a_gpu_is_what_the_device_leaves(demo_path: Path, monkeypatch) -> None:
    slot = _slot(demo_path)
    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        need = resident.plan(f, cfg, 256)
        base = need.dense + need.kv + resident.WORKING_BYTES
        _device_with(monkeypatch, base + 10 * slot, 1 << 40)
        budget, said = engine._streaming_budget(f, cfg, "device", "cuda", 256, "auto")
        assert budget == 10 * slot and said.startswith("auto: the GPU's memory")
        _device_with(monkeypatch, base + 10 * slot, 4 * slot)  # one buffer holds less
        budget, said = engine._streaming_budget(f, cfg, "device", "cuda", 256, "auto")
        assert budget == 4 * slot and "down to one cuda buffer's" in said
        with pytest.raises(EngineError, match="more than one cuda buffer may hold"):
            engine._streaming_budget(f, cfg, "device", "cuda", 256, 5 * slot)
        _device_with(monkeypatch, base + need.experts, 1 << 40)  # every expert fits
        assert engine._streaming_budget(f, cfg, "device", "cuda", 256, "auto")[0] is None
        _device_with(monkeypatch, base + slot, 1 << 40)
        with pytest.raises(EngineError, match="the model does not fit: the GPU's memory is"):
            engine._streaming_budget(f, cfg, "device", "cuda", 256, "auto")
        with pytest.raises(EngineError, match="keep every expert where it is"):
            engine._streaming_budget(f, cfg, None, "metal", 256, 3 * slot)
        assert engine._streaming_budget(f, cfg, None, "metal", 256, "auto")[0] is None


def test_a_cuda_engine_streams_experts_through_device_memory(demo_path: Path, monkeypatch) -> None:
    """Engine on the cuda backend (its kernels' bodies on the host, test_kernel_check.HarnessGpu),
    with a device that holds everything but the experts and 10 slots of them: auto streams
    through a pool in device memory, no expert tensor is copied to the device, and the numbers
    are those of the engine that holds every expert; a budget that does not fit is refused."""
    from test_kernel_check import HarnessGpu, _run

    from ds4agent.engine.engine import mlx_parts
    from ds4agent.modelfile.tokenizer import Tokenizer

    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    monkeypatch.delenv("DS4_MEMORY_BUDGET", raising=False)
    copied: list[str] = []
    real = resident.DeviceTensors.get
    monkeypatch.setattr(resident.DeviceTensors, "get", lambda self, name: (copied.append(name), real(self, name))[1])
    slot = _slot(demo_path)

    def open_engine(budget) -> Engine:
        f = GGUFFile(demo_path)
        cfg = config_from_gguf(f)
        return Engine(mlx_parts(f, cfg, Tokenizer.from_gguf(f), "cuda", 4096, False, False, "cuda", budget))

    with GGUFFile(demo_path) as f:
        need = resident.plan(f, config_from_gguf(f), 4096)
    _device_with(monkeypatch, need.dense + need.kv + resident.WORKING_BYTES + 10 * slot, 1 << 40)
    with open_engine("auto") as e:
        assert e.streaming()["slots"] == 10 and isinstance(e.model.w.pool.backing, mx.array)
        fit, line = e.info.devices
        assert line.startswith("expert streaming: 10 of 96 routed experts resident (in cuda memory, ")
        assert line.endswith("dense weights on the device") and " expert pool + " in fit
        got = _run(e)
        assert e.streaming()["misses"] > 0
    assert copied and not [n for n in copied if "_exps." in n]
    _device_with(monkeypatch, 1 << 40, 1 << 40)
    with open_engine(None) as e:  # everything fits: nothing streams
        assert e.streaming() is None
        want = _run(e)
    assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32)) and got[1] == want[1]
    _device_with(monkeypatch, need.dense + need.kv + resident.WORKING_BYTES + 10 * slot, 1 << 40)
    with pytest.raises(EngineError, match="does not fit the cuda device: .*; a smaller --memory-budget"):
        open_engine(20 * slot)


def test_the_device_plan_counts_the_pool_instead_of_the_experts(demo_path: Path) -> None:
    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        whole, pooled = resident.plan(f, cfg, 256), resident.plan(f, cfg, 256, pool=12345)
        assert pooled.experts == 12345 and pooled.dense == whole.dense and pooled.kv == whole.kv
        assert "expert pool" in pooled.describe() and "routed experts" in whole.describe()
        assert "_exps." not in pooled.largest[0]
        big = resident.plan(f, cfg, 256, pool=1 << 40)
        assert big.largest == ("the expert pool", 1 << 40)
        with pytest.raises(resident.DeviceMemoryError, match="the expert pool is"):
            resident.check(big, None, 1 << 30, "", "metal")


def test_auto_on_metal_passes_over_kquant_when_experts_stream(demo_path: Path, monkeypatch) -> None:
    from ds4agent.engine import kernels

    built: list[str] = []

    class Stub:
        def __init__(self, name: str) -> None:
            self.name = name

    def build(which: str, weights) -> Stub:
        built.append(which)
        return Stub(which)

    monkeypatch.setattr(kernels, "_build", build)
    monkeypatch.setenv("DS4_KERNEL_CHECK", "0")
    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        pool = ExpertPool(f, cfg, 2 * expertpool.slot_bytes(f, cfg))
        try:
            assert kernels.select("metal", Weights(f, cfg, pool), "auto")[0].name == "metal"
            assert built == ["metal"]
            built.clear()
            kernels.select("metal", Weights(f, cfg), "auto")
            assert built == ["metal", "kquant"]
        finally:
            pool.close()
