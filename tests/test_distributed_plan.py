"""The plans of engine/group/split.py and the launcher's pure parts (engine/group/launch.py): no group."""

from __future__ import annotations

import itertools
import json

import pytest

from ds4agent.engine.group import split as splits
from ds4agent.engine.group.launch import (
    Host,
    LaunchError,
    follower_command,
    local_threads,
    read_hostfile,
    ring_hostfile,
    strip_options,
)
from ds4agent.modelfile.config import FLASH


def _brute(sizes: list[int], first: int, last: int, parts: int) -> int:
    best = None
    for cuts in itertools.combinations(range(1, len(sizes)), parts - 1):
        bounds = (0, *cuts, len(sizes))
        cost = max(sum(sizes[a:b]) + (first if s == 0 else 0) + (last if s == parts - 1 else 0)
                   for s, (a, b) in enumerate(zip(bounds, bounds[1:])))
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_pipeline_stages_are_contiguous_and_optimal(parts: int) -> None:
    sizes = [5, 9, 2, 7, 7, 1, 8, 3]
    stages = splits.pipeline_stages(sizes, 6, 4, parts)
    assert stages[0][0] == 0 and stages[-1][1] == len(sizes) and len(stages) == parts
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(stages, stages[1:]))
    cost = max(sum(sizes[a:b]) + (6 if s == 0 else 0) + (4 if s == parts - 1 else 0) for s, (a, b) in enumerate(stages))
    assert cost == _brute(sizes, 6, 4, parts)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_expert_split_shares_cover_everything_once(n: int) -> None:
    sizes = {"blk.0.attn_q_a.weight": 1}
    plans = [splits.plan(FLASH, sizes, "experts", n, r, 32) for r in range(n)]
    for field, total in (("groups", FLASH.n_out_group), ("experts", FLASH.n_expert), ("vocab", FLASH.n_vocab),
                         ("shared", FLASH.expert_ff * FLASH.n_shared_expert)):
        shares = [getattr(p, field) for p in plans]
        assert shares[0][0] == 0 and shares[-1][1] == total, field
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:])), field
    assert all(p.shared[0] % 32 == 0 for p in plans)  # whole Q8_0 blocks of the down matrix's columns


def test_pipeline_stage_order_puts_the_head_on_rank_0() -> None:
    p = splits.plan(FLASH, {f"blk.{i}.x": 10 for i in range(FLASH.n_layer)} | {"output.weight": 30}, "pipeline", 3, 0)
    assert p.stage == 2 and p.rank_of(0) == 1 and p.layers.stop == FLASH.n_layer
    with pytest.raises(splits.SplitError):
        splits.plan(FLASH.__class__(**{**FLASH.__dict__, "n_layer": 2}), {}, "pipeline", 3, 0)


def test_launcher_pieces(tmp_path) -> None:
    assert strip_options(["chat", "--hosts", "a,b", "-m", "x", "--hostfile=f", "--split", "experts"]) == \
        ["chat", "-m", "x", "--split", "experts"]
    ring = json.loads(ring_hostfile([Host("a", "10.0.0.1"), Host("b", "10.0.0.2")], 5000))
    assert ring == [["10.0.0.1:5000"], ["10.0.0.2:5001"]]
    f = tmp_path / "h.json"
    f.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": ["10.0.0.2"]}]}))
    assert [h.ip for h in read_hostfile(str(f))] == ["10.0.0.1", "10.0.0.2"]
    f.write_text(json.dumps([{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ips": ["10.0.0.2"]}]))
    with pytest.raises(LaunchError, match="host 1"):
        read_hostfile(str(f))


def test_ranks_sharing_this_machine_share_its_cores(monkeypatch) -> None:
    monkeypatch.delenv("DS4_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    here, there = Host("localhost", "127.0.0.1"), Host("mac2", "10.0.0.2")
    assert local_threads([here, here]) == 4
    assert local_threads([here, here, here]) == 2
    assert local_threads([here, there, here, here]) == 2  # rank 0 and two more here
    assert local_threads([Host("mac1", "10.0.0.1"), there]) is None  # one rank per machine
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert local_threads([here] * 3) == 1
    monkeypatch.setenv("DS4_THREADS", "3")  # the user's own choice stands
    assert local_threads([here, here]) is None
    script = follower_command("/py", ["-p", "hi"], 1, "[]", "/w", threads=4)
    assert "export DS4_THREADS=4;" in script and script.index("DS4_THREADS") < script.index("exec ")
    assert "DS4_THREADS" not in follower_command("/py", ["-p", "hi"], 1, "[]", "/w")
