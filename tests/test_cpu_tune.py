"""The CPU kernels' prefetch distances (engine/kernels/cpu_tune.py): DS4_PREFETCH, the
per-machine cache, the measurement's choice, and that the chosen values reach the kernels."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

from ds4agent.engine.kernels import cpu, cpu_tune


@pytest.fixture(autouse=True)
def _restore_prefetch():
    before = cpu.prefetch()
    yield
    cpu.library().ds4_set_prefetch(*before)


@pytest.mark.parametrize("value, want", [("", None), ("auto", None), (" 2048 ", (2048, cpu_tune.DEFAULT_ROWS)),
                                         ("0", (0, cpu_tune.DEFAULT_ROWS)), ("1024,3", (1024, 3))])
def test_parse_accepts(value: str, want) -> None:
    assert cpu_tune.parse(value) == want


@pytest.mark.parametrize("value", ["fast", "1,2,3", "-512", "512,0", "512,", "2k"])
def test_parse_refuses_with_the_value_named(value: str) -> None:
    with pytest.raises(ValueError, match="DS4_PREFETCH"):
        cpu_tune.parse(value)


def test_environment_wins_and_reaches_the_kernels(demo_path, tmp_path, monkeypatch) -> None:
    from ds4agent.modelfile.gguf import GGUFFile

    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    monkeypatch.setenv("DS4_PREFETCH", "1536,3")
    p = cpu_tune.choose(cpu.library())
    assert (p.q8_bytes, p.expert_rows, p.source) == (1536, 3, "DS4_PREFETCH")
    assert cpu_tune.measure_once(GGUFFile(demo_path), cpu.library(), cpu.matmul_raw) == p
    assert cpu.prefetch() == (1536, 3) and cpu_tune.current() == p


def test_bad_environment_warns_and_falls_back(demo_path, tmp_path, monkeypatch, capsys) -> None:
    from ds4agent.modelfile.gguf import GGUFFile

    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    monkeypatch.setenv("DS4_PREFETCH", "lots")
    p = cpu_tune.choose(cpu.library())
    assert "DS4_PREFETCH='lots'" in capsys.readouterr().err
    p = cpu_tune.measure_once(GGUFFile(demo_path), cpu.library(), cpu.matmul_raw)
    # the demo model is too small to measure on: the defaults, nothing cached
    assert (p.q8_bytes, p.expert_rows, p.source) == (cpu_tune.DEFAULT_Q8, cpu_tune.DEFAULT_ROWS, "default")
    assert not cpu_tune.cache_path().exists()


def test_cache_is_used_and_a_damaged_one_ignored(demo_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    monkeypatch.delenv("DS4_PREFETCH", raising=False)
    path = cpu_tune.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"q8_bytes": 512, "expert_rows": 4}))
    p = cpu_tune.choose(cpu.library())
    assert (p.q8_bytes, p.expert_rows, p.source) == (512, 4, "cached") and cpu.prefetch() == (512, 4)
    for bad in ("{", json.dumps({"q8_bytes": -1, "expert_rows": 2}), json.dumps({"q8_bytes": 1})):
        path.write_text(bad)
        assert cpu_tune.choose(cpu.library()).source == "default"


def test_measurement_picks_the_fastest_and_caches_it(tmp_path, monkeypatch, capsys) -> None:
    """A stand-in model whose products are slowest far from the distances 1024 (Q8_0) and 4
    rows (experts): those are chosen, cached, and set; the second call reads the cache."""
    monkeypatch.setenv("DS4_HOME", str(tmp_path))
    monkeypatch.delenv("DS4_PREFETCH", raising=False)
    monkeypatch.setattr(cpu_tune, "REGION", 1 << 16)
    monkeypatch.setattr(cpu_tune, "FLUSH", 1 << 16)
    head = np.zeros((8 * 64, 1088), np.uint8)  # 8 regions of Q8_0 rows of 1024 values
    gate = np.zeros((4, 16 * 64, 264), np.uint8)  # IQ2_XXS rows of 1024 values
    t = {"output.weight": SimpleNamespace(name="output.weight", type=Q.Q8_0, shape=(head.shape[0], 1024),
                                          nbytes=head.nbytes),
         "blk.0.ffn_gate_exps.weight": SimpleNamespace(name="blk.0.ffn_gate_exps.weight", type=Q.IQ2_XXS,
                                                       shape=(4, 16 * 64, 1024), nbytes=gate.nbytes)}
    model = SimpleNamespace(tensors=t, array=lambda name: head if name == "output.weight" else gate)

    def product(raw, qtype, n, x, int8=True):
        q8, rows = cpu.prefetch()
        time.sleep(0.001 * (abs(q8 - 1024) / 512 if qtype == Q.Q8_0 else abs(rows - 4)))

    assert cpu_tune.choose(cpu.library()).source == "default"
    p = cpu_tune.measure_once(model, cpu.library(), product)
    assert (p.q8_bytes, p.expert_rows, p.source) == (1024, 4, "measured")
    assert cpu.prefetch() == (1024, 4)
    assert "prefetch: Q8_0 products 1024 bytes ahead, experts 4 rows ahead" in capsys.readouterr().err
    again = cpu_tune.choose(cpu.library())
    assert (again.q8_bytes, again.expert_rows, again.source) == (1024, 4, "cached")
    assert cpu_tune.measure_once(model, cpu.library(), product) == again  # nothing measured again
    assert "measuring" not in capsys.readouterr().err
