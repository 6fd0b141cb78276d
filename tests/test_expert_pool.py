"""The expert pool (engine/expertpool.py): routed experts streamed from the model file into a
fixed number of slots. The numbers must not depend on the budget (same logits, tokens and saved
sessions as with every expert in the mapped file, down to a pool of one slot); the pool never
holds more than its slots; eviction follows its policy; reads ahead are counted; a failed read
leaves nothing half-filled; the budget is chosen from the machine or refused in one line."""

from __future__ import annotations

import ctypes
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from ds4agent import settings
from ds4agent.engine import Engine, EngineError, SamplingParams, expertpool
from ds4agent.engine.expertpool import ExpertPool, PoolError
from ds4agent.modelfile.config import config_from_gguf
from ds4agent.modelfile.gguf import GGUFFile

PROMPTS = (list(range(5, 60)), [7, 300, 2, 2, 91, 45, 46, 47, 1000, 12, 13, 14])


def _slot(path: Path) -> int:
    with GGUFFile(path) as f:
        return expertpool.slot_bytes(f, config_from_gguf(f))


def _reads_direct(path: Path) -> bool:
    """Whether this file system takes the pool's direct reads (GGUFFile.read_direct)."""
    import mmap

    with GGUFFile(path) as f:
        return f.read_direct(0, 1, np.frombuffer(mmap.mmap(-1, 4096), dtype=np.uint8)) is not None


def _run(path: Path, budget, kernels: str | None = None, prompt: list[int] = PROMPTS[0]):
    """Prefill, 6 greedy tokens; the last logits, the tokens, the saved session, the pool's counters."""
    with Engine.open(path, backend="cpu", ctx=256, kernels=kernels, memory_budget=budget) as e:
        s = e.session()
        s.sync(prompt)
        tokens = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=6, stop_at_eos=False)]
        return np.array(s.logits), tokens, s.snapshot(), e.streaming()


@pytest.mark.parametrize("kernels,slots,direct", [(None, 1, "1"), (None, 3, "1"), (None, 3, "0"), (None, 20, "1"),
                                                  ("cpu-exact", 2, "1")])
def test_same_logits_tokens_and_saved_session_whatever_the_budget(demo_path: Path, kernels, slots: int,
                                                                  direct: str, monkeypatch) -> None:
    """One slot makes every layer run expert by expert in separate calls (prefill by whole
    experts, decode by rows); the sums must still be added in the same order. Read past the
    page cache or through it (DS4_POOL_DIRECT=0), the same bits."""
    want = _run(demo_path, None, kernels)
    assert want[3] is None  # the whole tiny model fits: nothing streams
    monkeypatch.setenv("DS4_POOL_DIRECT", direct)
    got = _run(demo_path, slots * _slot(demo_path), kernels)
    assert got[3]["slots"] == slots and got[3]["misses"] > 0
    assert got[3]["direct"] == (direct == "1" and _reads_direct(demo_path))
    assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32))
    assert got[1] == want[1]
    assert got[2] == want[2]


def test_a_session_saved_while_streaming_continues_without_it(demo_path: Path) -> None:
    slot = _slot(demo_path)
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=4 * slot) as streamed:
        s = streamed.session()
        s.sync(PROMPTS[1])
        blob = s.snapshot()
        after = [st.token for st in s.generate(SamplingParams(temperature=0), max_tokens=5, stop_at_eos=False)]
    with Engine.open(demo_path, backend="cpu", ctx=256) as resident:
        r = resident.session()
        r.restore(blob)
        assert [st.token for st in r.generate(SamplingParams(temperature=0), max_tokens=5, stop_at_eos=False)] == after
        back = r.snapshot()
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=2 * slot) as streamed:
        s = streamed.session()
        s.restore(back)
        assert s.snapshot() == back


def _pool_rss(pool: ExpertPool) -> int:
    """Resident bytes of the pool's own mapping, from /proc/self/smaps."""
    base = pool.address
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= base < hi
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_the_pool_stays_within_its_budget_when_the_expert_set_changes(demo_path: Path) -> None:
    slot = _slot(demo_path)
    budget = 7 * slot + slot // 2  # not a whole number of slots: the half is never used
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=budget) as e:
        pool = e.parts.pool
        assert pool.slots == 7 and pool.allocated <= budget
        for prompt in PROMPTS:  # two prompts route to different experts
            s = e.session()
            s.sync(prompt)
            for _ in s.generate(SamplingParams(temperature=0), max_tokens=4, stop_at_eos=False):
                pass
            assert len(pool.resident()) <= pool.slots
            assert _pool_rss(pool) <= pool.allocated
        stats = e.streaming()
        assert stats["bytes_read"] > 7 * slot  # experts were evicted and read again


def _direct_pool(path: Path, slots: int, policy: str = "lru", direct: bool = True) -> tuple[GGUFFile, ExpertPool]:
    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    return f, ExpertPool(f, cfg, slots * expertpool.slot_bytes(f, cfg), policy=policy, direct=direct)


@contextmanager
def _pooled(path: Path, slots: int, policy: str = "lru", direct: bool = True) -> Iterator[tuple[GGUFFile, ExpertPool]]:
    """_direct_pool for the length of a block: the pool, then the file, closed after it."""
    f, pool = _direct_pool(path, slots, policy, direct)
    try:
        yield f, pool
    finally:
        pool.close()
        f.close()


def _use(pool: ExpertPool, layer: int, *experts: int) -> None:
    with pool.holding(layer, np.array(experts)):
        pass


@pytest.mark.parametrize("reads", ["direct", "cached", "direct refused"])
def test_a_slot_holds_the_experts_bytes_from_the_file(demo_path: Path, reads: str, monkeypatch) -> None:
    """Direct reads place each matrix at its own offset within its region (its offset within
    a page of the file), reads through the page cache at the region's start; where the file
    system refuses direct reads the pool reads through the page cache from then on."""
    if reads == "direct" and not _reads_direct(demo_path):
        pytest.skip("this file system does not read with O_DIRECT")
    with _pooled(demo_path, 4, direct=reads != "cached") as (f, pool):
        if reads == "direct refused":
            monkeypatch.setattr(f, "read_direct", lambda offset, length, out: None)
        cfg = config_from_gguf(f)
        layer, experts = cfg.n_layer - 1, [1, cfg.n_expert - 1]
        with pool.holding(layer, np.array(experts)) as rows:
            for name, table in (("gate", rows.gate), ("up", rows.up), ("down", rows.down)):
                t = f.array(f"blk.{layer}.ffn_{name}_exps.weight")
                for e in experts:
                    assert ctypes.string_at(int(table[e]), t[e].nbytes) == t[e].tobytes()
                assert table[0] == 0  # not held by this call
                if reads == "direct":
                    assert [int(table[e]) % 4096 for e in experts] == [(t.ctypes.data + t[e].nbytes * e) % 4096
                                                                        for e in experts]
            assert rows.F == f.tensors[f"blk.{layer}.ffn_gate_exps.weight"].shape[1]
        assert pool.direct == (reads == "direct")


def test_lru_evicts_the_least_recently_used(demo_path: Path) -> None:
    with _pooled(demo_path, 3, "lru") as (f, pool):
        for e in (0, 1, 2):
            _use(pool, 4, e)
        _use(pool, 4, 0)  # 1 is now the oldest
        _use(pool, 4, 3)
        assert pool.resident() == [(4, 0), (4, 2), (4, 3)]
        assert (pool.stats.hits, pool.stats.misses) == (1, 4)


def test_lfu_keeps_the_often_used_and_ages_the_counts(demo_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expertpool, "AGE_EVERY", 1)  # counts halved every 3 uses (3 slots)
    with _pooled(demo_path, 3, "lfu") as (f, pool):
        for e in (0, 0, 0, 1, 2, 3):  # lru would evict 0 (the oldest use); lfu evicts 1 (used least, older than 2)
            _use(pool, 4, e)
        assert pool.resident() == [(4, 0), (4, 2), (4, 3)]
        for _ in range(10):
            _use(pool, 4, 0)
        for _ in range(4):
            _use(pool, 4, 2)
            _use(pool, 4, 3)
        # Without ageing 0 (13 uses) would stay and 2 (5 uses, older than 3) go; the counts are
        # halved every 3 uses here, so 0's old uses count for little now and the recent
        # favourites stay.
        _use(pool, 4, 6)
        assert pool.resident() == [(4, 2), (4, 3), (4, 6)]


def test_lfu_remembers_an_evicted_experts_uses(demo_path: Path) -> None:
    """Counts belong to experts, not slots: an expert read again comes back with the uses it
    had, so under skewed routing a popular expert pushed out once is not the next victim."""
    with _pooled(demo_path, 3, "lfu") as (f, pool):
        for e in (2, 2, 0, 0, 0, 1, 3):  # 3 evicts 1 (one use)
            _use(pool, 4, e)
        assert pool.resident() == [(4, 0), (4, 2), (4, 3)]
        _use(pool, 4, 1)  # evicts 3 (one use, against 2's two); 1 now has two uses
        _use(pool, 4, 4)  # 1 and 2 both at two uses: the older use goes, 2's (a count per slot would evict 1)
        assert pool.resident() == [(4, 0), (4, 1), (4, 4)]
        pool.prefetch(4, np.array([5]))  # evicts 4 (one use); 5 is read ahead, not used yet
        pool.settle()
        _use(pool, 4, 6)  # 5 has no use at all, but it was read to be used: 1 (two uses) goes
        assert pool.resident() == [(4, 0), (4, 5), (4, 6)]


def test_a_call_holds_its_experts_while_it_runs(demo_path: Path) -> None:
    with _pooled(demo_path, 2) as (f, pool):
        with pool.holding(2, np.array([3, 4])):
            assert pool.prefetch(2, np.array([5, 6])) == 0  # nothing free: no read ahead evicts them
        with pytest.raises(ValueError, match="3 experts at once in a pool of 2"):
            with pool.holding(2, np.array([3, 4, 5])):
                pass
        assert [len(s) for s in pool.spans(np.array([[5, 1], [1, 9], [3, -1]]))] == [2, 2]


def test_reads_ahead_are_counted_used_or_wasted(demo_path: Path) -> None:
    with _pooled(demo_path, 4) as (f, pool):
        assert pool.prefetch(1, np.array([7, 8, 9])) == 2  # at most half the pool
        _use(pool, 1, 7)
        assert (pool.stats.prefetched, pool.stats.prefetch_used, pool.stats.hits) == (2, 1, 1)
        for e in (0, 1, 2, 3):  # evict 8 unused
            _use(pool, 0, e)
        assert pool.stats.wasted == 1


@pytest.mark.parametrize("reader", ["read_direct", "read_into"])
def test_a_failed_read_raises_in_the_call_and_frees_the_slot(demo_path: Path, monkeypatch, reader: str) -> None:
    with _pooled(demo_path, 2, direct=reader == "read_direct") as (f, pool):
        real = getattr(f, reader)
        calls = {"n": 0}

        def failing(*args):
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(5, "Input/output error")
            return real(*args)

        monkeypatch.setattr(f, reader, failing)
        with pytest.raises(OSError, match="Input/output"):
            _use(pool, 3, 1)
        assert pool.resident() == []  # nothing half-read is kept
        _use(pool, 3, 1)  # read again
        assert pool.resident() == [(3, 1)]


def test_hash_layers_and_the_next_layer_are_read_ahead(demo_path: Path) -> None:
    slot = _slot(demo_path)
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=40 * slot) as e:
        s = e.session()
        s.sync(PROMPTS[1])
        for _ in s.generate(SamplingParams(temperature=0), max_tokens=4, stop_at_eos=False):
            pass
        stats = e.streaming()
    assert stats["prefetched"] > 0 and stats["prefetch_used"] > 0
    assert stats["hits"] > stats["misses"]  # 40 of 96 slots, and most experts were asked for ahead


def test_budgets_the_engine_refuses_in_one_line(demo_path: Path) -> None:
    slot = _slot(demo_path)
    with pytest.raises(EngineError, match="holds no routed expert"):
        Engine.open(demo_path, backend="cpu", memory_budget=slot - 1)
    with pytest.raises(EngineError, match="the kernels chosen here keep every expert where it is"):
        Engine.open(demo_path, backend="cpu", kernels="reference", memory_budget=2 * slot)
    with pytest.raises(EngineError, match="give bytes"):
        Engine.open(demo_path, backend="cpu", memory_budget="a lot")
    with Engine.open(demo_path, backend="cpu", memory_budget="1G") as e:  # everything fits: no pool
        assert e.streaming() is None
        assert "every routed expert fits" in e.info.devices[0]
    with pytest.raises(PoolError, match="unknown eviction policy"):
        _direct_pool(demo_path, 2, "fifo")


def test_auto_streams_only_what_the_machine_cannot_hold(demo_path: Path, monkeypatch) -> None:
    from ds4agent.engine.kernels import resident

    slot = _slot(demo_path)

    def machine_with(ctx: int, extra: int | None) -> None:
        """As if the machine had exactly the room for the dense weights, the KV at ``ctx``, the
        working memory and ``extra`` bytes of experts (every expert: None)."""
        with GGUFFile(demo_path) as f:
            need = resident.plan(f, config_from_gguf(f), ctx)
        room = need.dense + need.kv + expertpool.HOST_WORKING + (need.experts if extra is None else extra)
        monkeypatch.setattr(expertpool, "available_memory", lambda: (room, "available memory"))

    # (each open has its own context size: the mutation runner reuses engines opened alike)
    machine_with(256, None)
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget="auto") as e:
        assert e.streaming() is None and e.info.devices == ()
    machine_with(255, 10 * slot)
    with Engine.open(demo_path, backend="cpu", ctx=255, memory_budget="auto") as e:
        assert e.streaming()["slots"] == 10
        assert e.info.devices[0].startswith("expert streaming: 10 of 96 routed experts resident")
    machine_with(254, slot)
    with pytest.raises(EngineError, match="the model does not fit: available memory is"):
        Engine.open(demo_path, backend="cpu", ctx=254, memory_budget="auto")


@pytest.mark.parametrize("text,value", [("auto", "auto"), ("8G", 8 << 30), ("8GiB", 8 << 30), ("8gb", 8 << 30),
                                        ("512M", 512 << 20), ("1.5K", 1536), ("123", 123), (" 2T ", 2 << 40)])
def test_budget_spellings(text: str, value) -> None:
    assert settings.parse_budget(text) == value


@pytest.mark.parametrize("text", ["", "G", "-1G", "0", "nan", "inf", "8X", "8 G B"])
def test_budget_spellings_refused(text: str) -> None:
    with pytest.raises(settings.SettingsError):
        settings.parse_budget(text)


def test_budget_from_the_environment_and_config(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    monkeypatch.delenv("DS4_MEMORY_BUDGET", raising=False)
    assert settings.memory_budget_choice() == "auto"
    (tmp_path / "config.toml").write_text('memory_budget = "6G"\n')
    assert settings.memory_budget_choice() == 6 << 30
    (tmp_path / "config.toml").write_text("memory_budget = 4096\n")
    assert settings.memory_budget_choice() == 4096
    monkeypatch.setenv("DS4_MEMORY_BUDGET", "1M")
    assert settings.memory_budget_choice() == 1 << 20
    monkeypatch.delenv("DS4_MEMORY_BUDGET")
    (tmp_path / "config.toml").write_text("memory_budget = true\n")
    with pytest.raises(settings.SettingsError, match="'memory_budget' must be bytes"):
        settings.memory_budget_choice()


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_cgroup_room_v1_counts_the_tightest_ancestor_without_page_cache(tmp_path: Path) -> None:
    own = tmp_path / "self_cgroup"
    own.write_text("9:name=systemd:/\n4:memory:/a/b\n0::/\n")
    mem = tmp_path / "memory"
    _tree(mem, {
        "memory.limit_in_bytes": str(1 << 62), "memory.usage_in_bytes": "0", "memory.stat": "total_cache 0\n",
        "a/memory.limit_in_bytes": "1000000", "a/memory.usage_in_bytes": "600000",
        "a/memory.stat": "cache 1\ntotal_cache 100000\n",
        "a/b/memory.limit_in_bytes": "9000000", "a/b/memory.usage_in_bytes": "10",
        "a/b/memory.stat": "total_cache 0\n",
    })
    assert expertpool._cgroup_room(str(tmp_path), str(own)) == 1000000 - (600000 - 100000)


def test_cgroup_room_v2_and_no_limit(tmp_path: Path) -> None:
    own = tmp_path / "self_cgroup"
    own.write_text("0::/user/job\n")
    _tree(tmp_path, {
        "memory.max": "max", "user/memory.max": "max",
        "user/job/memory.max": "4096000", "user/job/memory.current": "96000",
        "user/job/memory.stat": "anon 90000\nfile 6000\n",
    })
    assert expertpool._cgroup_room(str(tmp_path), str(own)) == 4096000 - 90000
    (tmp_path / "user/job/memory.max").write_text("max\n")
    assert expertpool._cgroup_room(str(tmp_path), str(own)) is None


def test_ds4_says_what_streams_and_refuses_a_bad_budget(demo_path: Path, capsys) -> None:
    from ds4agent.cli import main

    slot = _slot(demo_path)
    assert main(["-m", str(demo_path), "--backend", "cpu", "-p", "hi", "-n", "3", "--temp", "0",
                 "--memory-budget", str(5 * slot)]) == 0
    assert "expert streaming: 5 of 96 routed experts resident" in capsys.readouterr().err
    assert main(["-m", str(demo_path), "-p", "hi", "--memory-budget", "lots"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory budget 'lots'" in err


def test_a_popularity_profile_is_saved_and_preloads_the_most_used(demo_path: Path, tmp_path: Path) -> None:
    slot = _slot(demo_path)
    profile = tmp_path / "experts.json"
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=6 * slot) as e:
        s = e.session()
        s.sync(PROMPTS[0])
        e.save_expert_profile(profile)
        uses = e.parts.pool.uses.copy()
    assert uses.sum() > 0
    hottest = sorted(divmod(int(k), uses.shape[1]) for k in np.argsort(-uses.reshape(-1), kind="stable")[:6])
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=6 * slot, expert_profile=profile) as e:
        assert e.info.devices[-1] == f"expert profile {profile}: reading its 6 most used experts"
        pool = e.parts.pool
        with pool.holding(0, np.array([], dtype=np.int64)):
            pass
        assert pool.resident() == hottest
        assert e.streaming()["prefetched"] == 6
    with Engine.open(demo_path, backend="cpu", ctx=256, expert_profile=profile) as e:  # nothing streams
        assert "not needed" in e.info.devices[-1]
        with pytest.raises(EngineError, match="no expert streams"):
            e.save_expert_profile(tmp_path / "none.json")


@pytest.mark.parametrize("text,why", [("{", "not JSON"), ('{"ds4agent_expert_profile": 9}', "of this version"),
                                      ('{"ds4agent_expert_profile": 1, "fingerprint": 1}', "another model file")])
def test_a_bad_profile_is_refused_in_one_line(demo_path: Path, tmp_path: Path, text: str, why: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(EngineError, match=why):
        Engine.open(demo_path, backend="cpu", memory_budget=4 * _slot(demo_path), expert_profile=p)
    with pytest.raises(EngineError, match="cannot read the expert profile"):
        Engine.open(demo_path, backend="cpu", memory_budget=4 * _slot(demo_path), expert_profile=tmp_path / "no")


def test_damaged_profile_counts_are_refused(demo_path: Path, tmp_path: Path) -> None:
    slot = _slot(demo_path)
    p = tmp_path / "p.json"
    with Engine.open(demo_path, backend="cpu", ctx=256, memory_budget=4 * slot) as e:
        e.save_expert_profile(p)
    import json

    doc = json.loads(p.read_text())
    doc["uses"] = doc["uses"][:-1]
    p.write_text(json.dumps(doc))
    with pytest.raises(EngineError, match="counts are damaged"):
        Engine.open(demo_path, backend="cpu", memory_budget=4 * slot, expert_profile=p)


def test_ds4_bench_reports_the_pool_and_saves_a_profile(demo_path: Path, tmp_path: Path, capsys) -> None:
    from ds4agent.cli import main

    out = tmp_path / "profile.json"
    assert main(["bench", "-m", str(demo_path), "--backend", "cpu", "--ctx-start", "16", "--ctx-max", "32",
                 "--step-incr", "16", "--gen-tokens", "2", "--memory-budget", str(8 * _slot(demo_path)),
                 "--save-profile", str(out)]) == 0
    err = capsys.readouterr().err
    assert "expert pool: 8 of 96 experts resident" in err and f"expert profile written to {out}" in err
    assert out.exists()


def test_guessed_reads_stop_while_guesses_are_wrong_and_are_tried_again(demo_path: Path) -> None:
    with _pooled(demo_path, 8) as (f, pool):
        for wrong in ([10, 11], [12, 13]):  # two rounds of guesses the calls do not use
            assert pool.prefetch(5, np.array(wrong), guess=True) == 2
            _use(pool, 5, 0)
        assert pool.prefetch(5, np.array([14, 15]), guess=True) == 0  # the layer stopped guessing
        assert pool.stats.guesses_skipped == 1
        assert pool.prefetch(5, np.array([14])) == 1  # experts known from the ids (the default): always read
        started = [pool.prefetch(5, np.array([3]), guess=True) for _ in range(expertpool.PROBE_EVERY)]
        assert sorted(started) == [0] * (expertpool.PROBE_EVERY - 1) + [1]  # one probe in every PROBE_EVERY
        _use(pool, 5, 3)  # the probe came true
        assert pool.prefetch(5, np.array([4]), guess=True) == 1  # guessing again
        assert pool.prefetch(4, np.array([4]), guess=True) == 1  # other layers never stopped


def test_inspect_says_what_would_stream_here(demo_path: Path, capsys) -> None:
    from ds4agent.cli import main

    slot = _slot(demo_path)
    assert main(["inspect", str(demo_path)]) == 0
    assert "memory (CPU kernels, this machine): every routed expert fits" in capsys.readouterr().out
    assert main(["inspect", str(demo_path), "--memory-budget", str(9 * slot)]) == 0
    out = capsys.readouterr().out
    assert "memory (CPU kernels, this machine): 9 of 96 routed experts resident at a time" in out
    assert main(["inspect", str(demo_path), "--memory-budget", "10"]) == 0  # a budget below one expert
    assert "holds no routed expert" in capsys.readouterr().out


@pytest.fixture(scope="module")
def wide_path(tmp_path_factory) -> Path:
    """A tiny model whose experts are wider than the hidden size (hidden 256, expert 512), with
    3 experts per token: the gate/up and down matrices differ in shape, and the order in which
    an output's experts are added shows."""
    from dataclasses import replace

    from ds4agent.modelfile.demo import tiny_config, write_model

    return write_model(tmp_path_factory.mktemp("wide") / "wide.gguf",
                       replace(tiny_config(3), expert_ff=512, n_expert_used=3), "tiny", 1)


def test_experts_wider_than_the_hidden_size_stream_to_the_same_bits(wide_path: Path) -> None:
    want = _run(wide_path, None, prompt=PROMPTS[1])
    for slots in (1, 2, 5):
        got = _run(wide_path, slots * _slot(wide_path), prompt=PROMPTS[1])
        assert got[3]["slots"] == slots
        assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32)) and got[1:3] == want[1:3]
    with _pooled(wide_path, 4, direct=False) as (f, pool):
        with pool.holding(1, np.array([2, 5])) as rows:
            assert (rows.F, rows.gu_row_bytes) == (512, f.tensors["blk.1.ffn_gate_exps.weight"].row_bytes)
            assert rows.d_row_bytes == f.tensors["blk.1.ffn_down_exps.weight"].row_bytes
            for table in (rows.gate, rows.up, rows.down):  # read through the page cache: on a page
                assert table[2] % 4096 == 0 and table[5] % 4096 == 0
            assert rows.up[2] - rows.gate[2] >= f.tensors["blk.1.ffn_gate_exps.weight"].nbytes // 16


def test_slot_size_is_the_largest_expert_of_any_layer_in_whole_pages() -> None:
    """Layers may differ in quant type (the published variant with Q4_K experts in some
    layers): every slot must hold the largest."""
    from types import SimpleNamespace

    from ds4agent.modelfile.gguf import TensorInfo, tensor_nbytes

    E, F, n = 256, 256, 4
    tensors = {}
    for layer, qtype in ((0, 16), (1, 12)):  # IQ2_XXS, then Q4_K
        for kind, dims in (("gate", (E, F, n)), ("up", (E, F, n)), ("down", (F, E, n))):
            t = qtype if kind != "down" or layer else 10  # layer 0: Q2_K down
            name = f"blk.{layer}.ffn_{kind}_exps.weight"
            tensors[name] = TensorInfo(name, t, dims, 4096 * len(tensors), tensor_nbytes(t, dims))
    f = SimpleNamespace(tensors=tensors)
    cfg = SimpleNamespace(n_layer=2, n_expert=n)
    q4 = tensors["blk.1.ffn_gate_exps.weight"].nbytes // n
    region = -(-q4 // 4096) * 4096 + 4096  # whole pages and one more: where a direct read may land it
    assert expertpool.slot_bytes(f, cfg) == 3 * region
    assert expertpool.expert_bytes(f, cfg) == sum(t.nbytes for t in tensors.values())
    up = tensors["blk.1.ffn_up_exps.weight"]
    tensors[up.name] = TensorInfo(up.name, 16, up.dims, up.offset, tensor_nbytes(16, up.dims))
    with pytest.raises(PoolError, match="layer 1: gate and up experts differ"):
        expertpool.slot_bytes(f, cfg)


def test_expert_bytes_and_the_budget_arithmetic(demo_path: Path) -> None:
    from ds4agent.engine.kernels import resident

    with GGUFFile(demo_path) as f:
        cfg = config_from_gguf(f)
        assert expertpool.expert_bytes(f, cfg) == resident.plan(f, cfg, 256).experts == 5308416
        with pytest.raises(PoolError, match="holds no routed expert"):
            ExpertPool(f, cfg, expertpool.slot_bytes(f, cfg) - 1)
        pool = ExpertPool(f, cfg, expertpool.slot_bytes(f, cfg))  # exactly one slot
        try:
            assert (pool.slots, pool.policy, pool.allocated) == (1, "lru", expertpool.slot_bytes(f, cfg))
        finally:
            pool.close()
    assert expertpool.HOST_WORKING == 768 << 20 and expertpool.PROBE_EVERY == 8 and expertpool.GUESS_FLOOR == 0.5


def test_counters_and_their_rates(demo_path: Path) -> None:
    empty = expertpool.PoolStats()
    assert empty.as_dict() == {"hits": 0, "misses": 0, "prefetched": 0, "guesses_skipped": 0, "prefetch_used": 0,
                               "wasted": 0, "bytes_read": 0, "stall_s": 0.0, "read_s": 0.0, "calls": 0,
                               "hit_rate": 0.0}
    with _pooled(demo_path, 2) as (f, pool):
        _use(pool, 2, 0)
        _use(pool, 2, 1)
        waited = pool.stats.stall_s
        assert 0 < waited < 60  # two misses waited for their reads
        _use(pool, 2, 0)
        assert pool.stats.stall_s == waited  # a hit waits for nothing
        d = pool.stats.as_dict()
        per_expert = sum(f.tensors[f"blk.2.ffn_{k}_exps.weight"].nbytes for k in ("gate", "up", "down")) // 16
        assert (d["hits"], d["misses"], d["calls"], d["bytes_read"]) == (1, 2, 3, 2 * per_expert)
        assert d["hit_rate"] == 0.3333 and d["stall_s"] >= 0 and d["read_s"] > 0
        assert pool.uses[2, 0] == 2 and pool.uses[2, 1] == 1 and pool.uses.sum() == 3


def test_expert_rows_over_the_file_are_checked_and_frozen() -> None:
    import dataclasses

    gate = np.zeros((3, 4, 8), np.uint8)
    rows = expertpool.ExpertRows.over(gate, gate, 16, gate, 10)
    assert len(rows.gate) == 3 and rows.gate[1] - rows.gate[0] == 32 and rows.F == 4 and rows.gu_row_bytes == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows.F = 5
    for bad in (gate[:, :, ::2], gate[:, ::2], gate[0]):
        with pytest.raises(ValueError, match="contiguous"):
            expertpool.ExpertRows.over(bad, gate, 16, gate, 10)


def test_size_text() -> None:
    assert expertpool.size_text(3 << 30) == "3.00 GiB"
    assert expertpool.size_text(5 << 20) == "5.0 MiB"
    assert expertpool.size_text((1 << 30) // 10) == "0.10 GiB"
    assert expertpool.size_text((1 << 30) // 10 - 1) == "102.4 MiB"


def _locked_kib(path: Path) -> int:
    """Resident, locked KiB of the mappings of ``path`` (/proc/self/smaps' Locked fields)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and all(c in "0123456789abcdef-" for c in head[0]):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Locked:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_dense_weights_are_locked_as_they_are_read(wide_path: Path) -> None:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and soft < 64 << 20:
        pytest.skip(f"RLIMIT_MEMLOCK is {soft} bytes here (ulimit -l): locking is refused, as the open line says")
    with GGUFFile(wide_path) as f:
        dense = sum(t.nbytes for name, t in f.tensors.items() if expertpool.is_dense(name))
    with Engine.open(wide_path, backend="cpu", ctx=250, memory_budget=5 * _slot(wide_path)) as e:
        assert "dense weights locked in memory as they are read" in e.info.devices[0]
        opened = _locked_kib(wide_path)
        e.session().sync(PROMPTS[1])
        read = _locked_kib(wide_path)
    assert opened < 1024  # opening reads nothing: pages are locked as they fault in
    assert read - opened > dense // 2048  # at least half the dense weights, read by the forward pass


def test_a_layer_stops_guessing_when_a_quarter_of_its_guesses_come_true(demo_path: Path) -> None:
    """The share of guessed reads used is a moving average (0.7 old, 0.3 new) starting at 1:
    one of four used each time brings it to 0.775, 0.618, 0.507, then 0.430, under one half."""
    with _pooled(demo_path, 8) as (f, pool):
        for r in range(4):
            guess = np.arange(4 * r, 4 * r + 4)
            pool.settle()  # the last round's reads ahead done: their slots may be taken again
            assert pool.prefetch(5, guess, guess=True) == 4, r
            _use(pool, 5, int(guess[0]))
        assert pool.prefetch(5, np.array([0, 1]), guess=True) == 0


def test_preload_reads_the_most_used_into_empty_slots(demo_path: Path) -> None:
    with _pooled(demo_path, 4) as (f, pool):
        uses = np.zeros((6, 16), dtype=np.int64)
        for (layer, e), n in {(1, 3): 5, (2, 7): 9, (0, 1): 2, (4, 4): 1, (5, 5): 1}.items():
            uses[layer, e] = n
        with pytest.raises(PoolError, match="a profile of 5 layers x 16 experts for a model of 6 x 16"):
            pool.preload(uses[:5])
        assert pool.preload(uses) == 4  # the five used ones do not fit: the least used of the ties stays out
        assert pool.resident() == [(0, 1), (1, 3), (2, 7), (4, 4)]
        assert pool.stats.prefetched == 4 and pool.stats.misses == 0
        _use(pool, 2, 7)
        assert (pool.stats.hits, pool.stats.prefetch_used) == (1, 1)  # read ahead, then used
        assert pool.preload(uses) == 0  # no empty slot left
    with _pooled(demo_path, 4) as (f, pool):
        _use(pool, 2, 7)
        only = np.zeros((6, 16), dtype=np.int64)
        only[2, 7], only[3, 2] = 4, 1
        assert pool.preload(only) == 1  # (2, 7) is there already; unused experts are not read
        assert pool.resident() == [(2, 7), (3, 2)]


def test_prefetch_skips_what_is_there_and_probes_with_new_guesses(demo_path: Path) -> None:
    with _pooled(demo_path, 8) as (f, pool):
        _use(pool, 3, 1)
        assert pool.prefetch(3, np.array([1, 2])) == 1  # 1 is there; 2 is read (known experts by default)
        for wrong in ([10, 11], [12, 13]):
            pool.prefetch(3, np.array(wrong), guess=True)
            _use(pool, 3, 0)
        started = [pool.prefetch(3, np.array([e]), guess=True) for e in (14, 15, 9, 8, 7, 6, 5, 4)]
        assert sum(started) == 1  # one probe in eight guesses, each of an expert not read yet


def _mapped(address: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_close_waits_for_the_readers_and_frees_the_slots(demo_path: Path) -> None:
    import threading

    def readers() -> int:  # other engines' pools may have theirs
        return sum(t.name.startswith("ds4-experts") for t in threading.enumerate())

    before = readers()
    f, pool = _direct_pool(demo_path, 8)
    try:
        pool.prefetch(1, np.arange(4))
        address = pool.address
        assert _mapped(address) and readers() > before
        pool.close()
        assert readers() == before
        assert not _mapped(address)
    finally:
        f.close()


def test_a_call_waits_while_every_slot_is_held_or_being_read(demo_path: Path, monkeypatch) -> None:
    import time

    with _pooled(demo_path, 2, direct=False) as (f, pool):
        real = f.read_into

        def slow(offset, out):
            time.sleep(0.05)
            real(offset, out)

        monkeypatch.setattr(f, "read_into", slow)
        assert pool.prefetch(4, np.array([9])) == 1  # one slot being read (slowly)
        with pool.holding(4, np.array([1, 2])) as rows:  # needs both slots: waits for that read, then evicts it
            assert rows.gate[1] and rows.gate[2]
        assert pool.resident() == [(4, 1), (4, 2)] and pool.stats.wasted == 1
