"""Batched decoding (engine/model.py forward_batch, engine/session.py advance_together,
engine/batch.py Batcher): several sessions advancing one token each in one pass must get, each,
the bits it gets alone: logits, tokens and saved sessions, with every kernel set, at different
positions (some sessions past the indexer's limit, some not), and through the batcher's threads
with sessions joining, prefilling, finishing and being cancelled while others decode."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from helpers import random_blocks

from ds4agent.engine import Batcher, Engine, SamplingParams, Session
from ds4agent.engine.kernels import cpu, gpu

# Prompt lengths: before and past the demo's compressor windows (4 and 128) and the indexer's
# limit (8 rows: from position 35 on), and past its 32-token window.
LENGTHS = (5, 37, 130, 64, 1, 90)


def _prompts(n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, 100000, k).tolist() for k in LENGTHS[:n]]


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("kernels", ["cpu", "cpu-exact", "reference", "gpu-host"])
def test_a_batch_gives_each_session_its_bits_alone(demo_path, kernels: str) -> None:
    """Six sessions at different positions, five steps of one token each: every step's logits
    and the states after it are those of each session run alone (the sessions then drop out one
    by one, so batches of 6 down to 2 are seen)."""
    with Engine.open(demo_path, backend="cpu", ctx=512, kernels=kernels) as e:
        m = e.model
        prompts = _prompts(6)

        def prefilled():
            out = []
            for p in prompts:
                st = m.empty_state()
                m.forward(np.array(p), st)
                out.append(st)
            return out

        alone, together = prefilled(), prefilled()
        rng = np.random.default_rng(2)
        for step in range(5):
            live = range(6 - step)  # one session leaves after each step
            ids = rng.integers(1000, 100000, len(live))
            want = [m.forward(np.array([t]), alone[b]) for t, b in zip(ids, live)]
            got = m.forward_batch(ids, [together[b] for b in live])
            for b in live:
                assert np.array_equal(_bits(got[b]), _bits(want[b])), (kernels, step, b)
        for a, t in zip(alone, together):
            assert a.n_tokens == t.n_tokens
            for x, y in zip(a.arrays(), t.arrays()):
                assert np.array_equal(np.asarray(x), np.asarray(y))


def test_q4_experts_shared_by_a_batch_keep_their_bits(demo_q4_path) -> None:
    """Q4_K experts (the q4 file) take another integer path for several tokens than for one:
    sessions choosing the same experts must still each get their own bits."""
    with Engine.open(demo_q4_path, backend="cpu", ctx=256) as e:
        sessions = [e.session() for _ in range(6)]
        singles = [e.session() for _ in range(6)]
        for s, a, p in zip(sessions, singles, _prompts(6, seed=3)):
            s.sync(p)
            a.sync(p)
        for t in (7, 7, 300):  # the same token: the same experts in the hash layers
            Session.advance_together(sessions, [t] * 6)
            for a in singles:
                a.advance([t])
        for s, a in zip(sessions, singles):
            assert np.array_equal(_bits(s.logits), _bits(a.logits)) and s.snapshot() == a.snapshot()


def test_sessions_advanced_together_save_and_continue_alone(demo_path) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=256) as e:
        batch, alone = [e.session() for _ in range(4)], [e.session() for _ in range(4)]
        for s, a, p in zip(batch, alone, _prompts(4)):
            s.sync(p)
            a.sync(p)
        for t in (11, 12, 13):
            Session.advance_together(batch, [t, t + 1, t + 2, t + 3])
            for k, a in enumerate(alone):
                a.advance([t + k])
        for s, a in zip(batch, alone):
            blob = s.snapshot()
            assert blob == a.snapshot() and s.tokens == a.tokens
            r = e.session()
            r.restore(blob)
            greedy = SamplingParams(temperature=0)
            assert [st.token for st in r.generate(greedy, max_tokens=4, stop_at_eos=False)] == \
                [st.token for st in a.generate(greedy, max_tokens=4, stop_at_eos=False)]
        with pytest.raises(ValueError, match="distinct sessions"):
            Session.advance_together([batch[0], batch[0]], [1, 2])


def _greedy(session: Session, prompt: list[int], n: int, cancel: threading.Event | None = None) -> list[int]:
    session.sync(prompt)
    out = []
    for st in session.generate(SamplingParams(temperature=0), max_tokens=n, stop_at_eos=False):
        out.append(st.token)
        if cancel is not None and cancel.is_set():
            break
    return out


def test_the_batcher_runs_threads_together_to_their_tokens_alone(demo_path) -> None:
    """Five threads, one session each: different prompts and lengths, one joining late while
    the others decode (its prefill runs between their steps), one cancelled midway. Each gets
    exactly the tokens it gets alone, and the steps did batch."""
    prompts = _prompts(5, seed=4)
    lengths = [12, 5, 20, 9, 16]
    with Engine.open(demo_path, backend="cpu", ctx=512) as e:
        want = [_greedy(e.session(), p, n) for p, n in zip(prompts, lengths)]
        batcher = Batcher()
        try:
            sessions = [e.session() for _ in prompts]
            for s in sessions:
                s.batcher = batcher
            got: list[list[int] | None] = [None] * 5
            cancel = threading.Event()
            started = threading.Event()

            def run(k: int) -> None:
                if k == 4:
                    started.wait(30)  # joins while the others decode
                got[k] = _greedy(sessions[k], prompts[k], lengths[k], cancel if k == 3 else None)
                if k == 0:
                    started.set()

            threads = [threading.Thread(target=run, args=(k,)) for k in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads)
        finally:
            batcher.close()
        assert got[:3] == want[:3] and got[4] == want[4]
        assert got[3] == want[3][: len(got[3])]
        assert batcher.stats.widest >= 3 and batcher.stats.chunks >= 4  # (the 1-token prompt is a step)
        with pytest.raises(RuntimeError, match="closed"):
            batcher.run(sessions[0], [5])


def test_an_error_in_a_batched_pass_reaches_every_caller(demo_path) -> None:
    with Engine.open(demo_path, backend="cpu", ctx=256) as e:
        b = Batcher()
        try:
            s = e.session()
            s.batcher = b
            s.sync([5, 6, 7])
            with pytest.raises(ValueError, match="vocabulary"):
                s.sync([5, 6, 7, 10**9])  # refused before any pass
            with pytest.raises(Exception):
                b.run(s, [10**9])  # an id the embedding does not have: raised on the batcher's thread
            assert s.tokens == [5, 6, 7]  # nothing committed
            s.eval(8)
            assert s.tokens == [5, 6, 7, 8]
        finally:
            b.close()


@pytest.mark.parametrize("qtype,n", [(Q.Q8_0, 4096), (Q.Q8_0, 256), (Q.F16, 512), (Q.F32, 96), (Q.Q2_K, 512),
                                     (Q.IQ2_XXS, 512), (Q.Q4_K, 512)])
def test_cpu_products_alone_are_each_rows_bits(qtype, n: int) -> None:
    """The alone products of cpu.c against one product per token: every GGML type, row counts
    that leave partial runs and quads (4099 rows of 4096 Q8_0 values: 192 KiB runs of 44 rows),
    2 to 9 tokens (within one pass, a full pass of 8, and past it), both activation paths."""
    rng = np.random.default_rng(int(qtype) + n)
    rows = 4099 if n == 4096 else 203
    if qtype in (Q.F16, Q.F32):
        raw = rng.normal(size=(rows, n)).astype(np.float16 if qtype == Q.F16 else np.float32).view(np.uint8)
    else:
        from gguf.constants import GGML_QUANT_SIZES

        raw = random_blocks(qtype, rows, n // GGML_QUANT_SIZES[qtype][0], 5)
    for int8 in (True, False):
        group = cpu.alone_group(raw[:8], int(qtype), n, int8)  # up to 8 where the few-token path allows it
        for alone in {1, group}:
            for T in (2, 4, 8, 9):
                x = rng.normal(size=(T, n)).astype(np.float32)
                got = cpu.matmul_raw(raw, int(qtype), n, x, int8, alone=alone)
                want = np.concatenate([cpu.matmul_raw(raw, int(qtype), n, x[t : t + 1], int8) for t in range(T)])
                assert np.array_equal(_bits(got), _bits(want)), (qtype, int8, alone, T)


def test_the_few_token_group_is_checked_not_assumed() -> None:
    """alone_group answers 1 for a kernel whose few-token sums differ from its one-token sums,
    and stops at the first count of tokens whose pass differs."""
    rng = np.random.default_rng(9)
    raw = rng.normal(size=(8, 256)).astype(np.float16).view(np.uint8)
    real = cpu.matmul_raw
    try:
        def skewed(r, qtype, n, x, int8=True, alone=0):
            y = real(r, qtype, n, x, int8, alone)
            return y if x.shape[0] == 1 else np.nextafter(y, np.inf)  # one ulp off for several tokens

        cpu.matmul_raw = skewed
        assert cpu.alone_group(raw, int(Q.F16), 256, False) == 1

        def skewed_past_five(r, qtype, n, x, int8=True, alone=0):
            y = real(r, qtype, n, x, int8, alone)
            return y if x.shape[0] <= 5 else np.nextafter(y, np.inf)

        raw8 = random_blocks(Q.Q8_0, 8, 256 // 32, 3)
        cpu.matmul_raw = skewed_past_five
        assert cpu.alone_group(raw8, int(Q.Q8_0), 256, True) in (1, 5)  # 1: no few-token Q8_0 kernel here
    finally:
        cpu.matmul_raw = real


def _cpu_flags() -> set[str]:
    from ds4agent.engine.kernels.cpu_build import cpu_identity

    return set(cpu_identity().split())  # the model name's words and the feature flags


@pytest.mark.parametrize("qtype,int8,needs", [
    (Q.Q8_0, True, {"avx512_vnni", "avx512vl", "avx512bw"}),  # the few-token Q8_0 kernel
    (Q.F16, True, {"f16c", "fma"}),  # the one-token F16 dots (no integer path for F16)
    (Q.F16, False, {"f16c", "fma"}),
])
def test_passes_take_eight_sessions(qtype, int8: bool, needs: set[str]) -> None:
    """Where these kernels are built, a token's sums are the same operations whatever the
    count of tokens, so a batch of up to 8 sessions reads each dense matrix once in one pass
    (a change that made a token's sums depend on the count would silently drop batches to
    fewer tokens per pass: slower, still exact)."""
    if not needs <= _cpu_flags():
        pytest.skip(f"this kernel is built for x86-64 with {', '.join(sorted(needs))}; this CPU lacks some")
    if qtype == Q.F16:
        raw = np.random.default_rng(4).normal(size=(8, 4096)).astype(np.float16).view(np.uint8)
    else:
        raw = random_blocks(qtype, 8, 4096 // 32, 4)
    assert cpu.alone_group(raw, int(qtype), 4096, int8) == 8


def test_gpu_plans_alone_split_as_one_token() -> None:
    for T in (2, 7, 64):
        alone = gpu.plan_matmul(int(Q.Q8_0), 4096, 4096, T, alone=True)[0]
        one = gpu.plan_matmul(int(Q.Q8_0), 4096, 4096, 1)[0]
        assert alone.dims[4:6] == one.dims[4:6]  # splits, blocks per split
    sel = np.array([[0, 1], [1, 2], [2, 3]])
    plan = gpu.expert_plan(sel, 4)
    alone = gpu.plan_experts(int(Q.IQ2_XXS), int(Q.Q2_K), plan, 2048, 4096, alone=True)
    one = gpu.plan_experts(int(Q.IQ2_XXS), int(Q.Q2_K), gpu.expert_plan(sel[:1], 4), 2048, 4096)
    assert [la.dims[1:] for la in alone[::2]] == [la.dims[1:] for la in one[::2]]
