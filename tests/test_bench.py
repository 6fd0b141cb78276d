"""`ds4 bench`: ds4-bench CSV over context frontiers, snapshot-exact sizes."""

from __future__ import annotations

import os
import subprocess
import sys

from ds4agent.engine import Engine
from ds4agent.engine.state import payload_size


def test_bench_csv(demo_path, tmp_path) -> None:
    out = tmp_path / "b.csv"
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path)}
    env.pop("DS4_PREFETCH", None)
    r = subprocess.run([sys.executable, "-m", "ds4agent", "bench", "--ctx-start", "32", "--ctx-max", "160",
                        "--step-mul", "2", "--gen-tokens", "3", "--backend", "cpu", "--csv", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"
    rows = [ln.split(",") for ln in lines[1:]]
    assert [int(x[0]) for x in rows] == [32, 64, 128]
    assert [int(x[1]) for x in rows] == [32, 32, 64]  # only the new interval is prefilled
    with Engine.open(demo_path, backend="cpu", ctx=256) as e:
        cfg = e.info.config
    for x in rows:
        assert int(x[3]) == 3 and float(x[2]) > 0 and float(x[4]) > 0
        assert int(x[5]) == payload_size(cfg, int(x[0]))  # the snapshot before each timed generation
    assert "GB of weights read per decoded token" in r.stderr and "GB/s" in r.stderr
    # the read probe first, and every line's share of it (the CPU backend)
    assert r.stderr.startswith("ds4: read bandwidth here: ") or "\nds4: read bandwidth here: " in r.stderr
    assert r.stderr.count("% of the read bandwidth)") == 4  # three frontiers and the summary
    # and the prefetch distances the run used (the demo model is too small to measure them on)
    assert "ds4: CPU kernels' prefetch: Q8_0 products 0 bytes ahead, experts 2 rows ahead (default)" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "ds4agent", "bench", "--ctx-start", "100", "--ctx-max", "50"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--ctx-start" in bad.stderr


def test_read_probe_reads_every_byte() -> None:
    """The probe's fold is the xor of every 8-byte word of the buffer, on every core's share
    (a share or a tail left unread changes it), and its bandwidth is a positive number."""
    import numpy as np
    import pytest

    from ds4agent.engine.kernels import cpu

    try:
        lib = cpu.library()
    except Exception as e:  # no C compiler: the CPU kernels' own tests say so too
        pytest.skip(f"no CPU kernels here: {e}")
    rng = np.random.default_rng(0)
    for n in (128, 4096 + 128, (1 << 20) + 384):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        want = int(np.bitwise_xor.reduce(buf.view(np.uint64)))
        assert lib.ds4_read(buf.ctypes.data, n) == want
        buf[-1] ^= 1  # the last byte counts
        assert lib.ds4_read(buf.ctypes.data, n) != want
    assert cpu.read_bandwidth(np.ones(1 << 22, np.uint8)) > 1e8
