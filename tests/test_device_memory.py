"""What the GPU kernels hold on the device (engine/kernels/resident.py), planned at open and
checked against the device's limit before anything is copied.

The limit itself comes from mx.device_info on a GPU; here it is stood in for, and the engine is
built on the "cuda" backend with the kernels' bodies on the host (test_kernel_check.HarnessGpu).
"""

from __future__ import annotations

import pytest
from test_kernel_check import HarnessGpu, _engine

from ds4agent.engine import Engine, EngineError, SamplingParams
from ds4agent.engine.kernels import gpu, resident
from ds4agent.engine.state import payload_size
from ds4agent.modelfile.config import config_from_gguf
from ds4agent.modelfile.gguf import GGUFFile

GiB = 1 << 30


def test_plan_of_the_published_q2_layout(flash_header_path) -> None:
    """The q2 model at 32k context: every matrix and expert tensor once, as its file bytes, the
    embedding and hash tables left on the host, the KV state, a working margin: no more than
    the file plus the KV plus 2 GiB (the issue's goal), and the line says each part."""
    with GGUFFile(flash_header_path) as f:
        cfg = config_from_gguf(f)
        r = resident.plan(f, cfg, 32768)
        host = f.tensors["token_embd.weight"].nbytes + sum(t.nbytes for n, t in f.tensors.items() if "tid2eid" in n)
        assert r.dense + r.experts + host == sum(t.nbytes for t in f.tensors.values())
        assert r.experts == sum(t.nbytes for n, t in f.tensors.items() if "_exps." in n)
        assert r.kv == payload_size(cfg, 32768) and r.total <= f.file_size + r.kv + 2 * GiB
        assert r.largest[0].endswith("_exps.weight") and 72 * GiB < r.experts < 73 * GiB
        line = resident.check(r, 128 * GiB, 64 * GiB, "Metal's recommended working set", "metal")
        assert line.startswith("on the metal device: ") and "routed experts" in line and "KV at 32768 tokens" in line
        assert line.endswith("of 128.0 GiB (Metal's recommended working set)")


def test_a_model_that_does_not_fit_is_refused_in_one_line(flash_header_path) -> None:
    with GGUFFile(flash_header_path) as f:
        r = resident.plan(f, config_from_gguf(f), 32768)
    limit = 72 * GiB  # a 96 GB Mac's working set
    with pytest.raises(resident.DeviceMemoryError) as e:
        resident.check(r, limit, None, "Metal's recommended working set", "metal")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the model does not fit the metal device: it needs ")
    assert f"{(r.total - limit) / GiB:.1f} GiB more than Metal's recommended working set (72.0 GiB)" in msg
    with pytest.raises(resident.DeviceMemoryError, match="more than one cuda buffer may hold"):
        resident.check(r, 200 * GiB, GiB // 2, "the GPU's memory", "cuda")
    # Short only by about the KV: the hint names --ctx.
    tight = r.total - r.kv // 2
    with pytest.raises(resident.DeviceMemoryError, match=r"a smaller --ctx frees KV"):
        resident.check(r, tight, None, "the GPU's memory", "cuda")
    assert resident.check(r, None, None, "", "cuda").endswith("(the device's limit is unknown)")


def test_engine_checks_at_open_and_says_it(demo_path, monkeypatch) -> None:
    """Engine on the cuda backend: the line is in info.devices (the CLI prints it at open); a
    limit below the plan even without the experts refuses with one EngineError before any
    weight is copied; the
    reference kernels (which keep the experts in the file) are not held to it."""
    monkeypatch.setattr(gpu, "GpuKernels", HarnessGpu)
    copied: list[str] = []
    real = resident.DeviceTensors.get
    monkeypatch.setattr(resident.DeviceTensors, "get", lambda self, name: (copied.append(name), real(self, name))[1])
    monkeypatch.setattr(resident, "device_limits", lambda backend: (8 * GiB, None, "the GPU's memory"))
    with _engine(demo_path, "cuda") as e:
        [line] = e.info.devices
        assert line.startswith("on the cuda device: ") and line.endswith("of 8.0 GiB (the GPU's memory)")
    monkeypatch.setattr(resident, "device_limits", lambda backend: (GiB, None, "the GPU's memory"))
    copied.clear()
    with pytest.raises(EngineError, match=r"^the model does not fit: the GPU's memory is 1.00 GiB, .* leave less "
                                          r"than one layer's experts"):
        _engine(demo_path, "cuda")  # (a limit that leaves room for some experts streams them: test_expert_pool_gpu)
    assert copied == []
    with _engine(demo_path, "reference") as e:
        assert e.info.devices == ()


def test_resident_bytes_are_the_plan(demo_path) -> None:
    """After prefill and decode every tensor the plan counts is on the device, as its file
    bytes, and nothing else: the plan is what the kernels hold."""
    from gpu_harness import harness_make

    with Engine.open(demo_path, backend="cpu", ctx=512, kernels="reference", qat_sim=False) as e:
        k = e.model.k = gpu.GpuKernels(e.model.w, "cuda", make=harness_make("cuda"))
        s = e.session()
        s.sync(list(range(1000, 1100)))
        list(s.generate(SamplingParams(temperature=0), max_tokens=2, stop_at_eos=False))
        r = resident.plan(e.file, e.info.config, 512)
        small = sum(t.nbytes for n, t in e.file.tensors.items() if len(t.shape) == 1 or "_ape." in n)
        assert k.resident.nbytes() + small == r.dense + r.experts
