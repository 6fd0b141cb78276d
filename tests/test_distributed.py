"""Several processes with mx.distributed (engine/distributed.py) on loopback, ring backend.

Each configuration is one `mlx.launch -n N --backend ring` run of tests/distributed_worker.py:
rank 0 runs the same scenario as one process does here (chunked prefill, greedy decode, seeded
sampling, checkpoint and rollback, snapshot and restore in the group, a one-process snapshot
restored into the group) and the logits of every step are compared. The pipeline split does
the same arithmetic in the same order (bit-identical); the expert split sums partial products
in another order (float tolerance; tokens identical).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "distributed_worker.py"
LAUNCH = Path(sys.executable).parent / "mlx.launch"
PORT = [39000 + 97 * (os.getpid() % 200)]  # a port range per test run (runs may overlap)


def launch(n: int, args: list[str], timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``args`` (a script and its arguments) as n ranks on loopback."""
    port = PORT[0]
    PORT[0] += n + 3
    cmd = [str(LAUNCH), "-n", str(n), "--backend", "ring", "--starting-port", str(port), "--python", sys.executable,
           "--", *args]
    full = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)


def run_single(path: Path, kernels: str, out: Path, snapshot_out: Path | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from distributed_worker import scenario

    from ds4agent.engine import Engine

    with Engine.open(path, backend="cpu", kernels=kernels) as e:
        scenario(e, str(out), None)
    return dict(np.load(out))


def run_group(path: Path, split: str, n: int, kernels: str, out: Path, single_blob: Path) -> dict:
    r = launch(n, [str(WORKER), str(path), split, kernels, str(out), str(single_blob)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return dict(np.load(out))


@pytest.fixture(scope="module")
def single(demo_path: Path, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("single")
    rec = run_single(demo_path, "cpu-exact", d / "single.npz")
    (d / "snap.bin").write_bytes(rec["snapshot"].tobytes())
    rec["_snap"] = d / "snap.bin"
    return rec


def _compare(group: dict, single: dict, exact: bool) -> None:
    for k in ("greedy", "sampled"):
        assert group[k].tolist() == single[k].tolist(), k
    for k in ("prefill", "greedy1", "greedy2", "greedy3", "after_sampled", "after_rollback", "restored"):
        a, b = group[k], single[k]
        if exact:
            assert np.array_equal(a, b), k
        else:
            err = float(np.abs(a - b).max() / np.abs(b).max())
            assert err < 2e-3, (k, err)
    # The group's snapshot is one ordinary payload: the same size, equal bytes for the pipeline.
    assert group["snapshot"].shape == single["snapshot"].shape
    if exact:
        assert np.array_equal(group["snapshot"], single["snapshot"])
    # A one-process snapshot loaded into the group continues as it does in one process.
    want = _single_continue(single)
    err = float(np.abs(group["from_single"] - want).max() / np.abs(want).max())
    assert (err == 0.0) if exact else (err < 2e-3), err


def _single_continue(single: dict) -> np.ndarray:
    from ds4agent.engine import Engine

    if "_cont" not in single:
        with Engine.open(single["_path"], backend="cpu", kernels="cpu-exact") as e:
            s = e.session(ctx=256)
            s.restore(single["_snap"].read_bytes())
            s.eval(3)
            single["_cont"] = s.logits.copy()
    return single["_cont"]


@pytest.mark.slow
@pytest.mark.parametrize("split,n", [("pipeline", 2), ("pipeline", 3), ("experts", 2), ("experts", 3)])
def test_group_matches_one_process(demo_path: Path, single: dict, tmp_path: Path, split: str, n: int) -> None:
    single["_path"] = demo_path
    group = run_group(demo_path, split, n, "cpu-exact", tmp_path / "g.npz", single["_snap"])
    _compare(group, single, exact=split == "pipeline")
