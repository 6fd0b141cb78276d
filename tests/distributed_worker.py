"""One rank of the distributed tests (tests/test_distributed.py), started by mlx.launch.

argv: model path, split, kernels, output .npz. Rank 0 runs a fixed scenario through the
ordinary Session API and saves every logits vector it saw; the others follow."""

from __future__ import annotations

import sys

import numpy as np


def scenario(engine, out: str, single_blob: bytes | None) -> None:
    from ds4agent.engine import SamplingParams

    rec: dict[str, np.ndarray] = {}
    s = engine.session(ctx=256)
    s.prefill_chunk = 5  # several chunks, and a last partial one
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 5000, 13)]
    s.sync(prompt)
    rec["prefill"] = s.logits.copy()
    dist = engine.model
    if hasattr(dist, "most_in_flight"):  # a group: a pipeline had its chunks in flight on several stages at once
        rec["in_flight"] = np.array(dist.most_in_flight)
    v = engine.session(ctx=256)  # a prefill interrupted after its first chunk, then resumed
    v.prefill_chunk = 5

    def stop(done: int, total: int) -> None:
        if done >= 5:
            raise InterruptedError

    try:
        v.sync(prompt, stop)
    except InterruptedError:
        pass
    rec["interrupted_n"] = np.array(v.n_tokens)
    v.sync(prompt)
    rec["resumed"] = v.logits.copy()
    greedy = []
    for i, step in enumerate(s.generate(SamplingParams(temperature=0.0), max_tokens=4, stop_at_eos=False)):
        greedy.append(step.token)
        rec[f"greedy{i}"] = s.logits.copy()
    rec["greedy"] = np.array(greedy)
    cp = s.checkpoint()
    blob = s.snapshot()
    sampled = [st.token for st in s.generate(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7),
                                             max_tokens=4, stop_at_eos=False)]
    rec["sampled"] = np.array(sampled)
    rec["after_sampled"] = s.logits.copy()
    s.rollback(cp)  # back to the checkpoint: the followers' states must follow
    s.eval(greedy[-1])
    rec["after_rollback"] = s.logits.copy()
    rec["snapshot"] = np.frombuffer(blob, dtype=np.uint8)
    t = engine.session(ctx=256)  # a distributed snapshot restored into the group again
    t.restore(blob)
    t.eval(greedy[-1])
    rec["restored"] = t.logits.copy()
    if single_blob is not None:  # a one-process snapshot loaded into the group
        u = engine.session(ctx=256)
        u.restore(single_blob)
        u.eval(3)
        rec["from_single"] = u.logits.copy()
    np.savez(out, **rec)


def main() -> int:
    import os

    path, split, kernels, out = sys.argv[1:5]
    single = sys.argv[5] if len(sys.argv) > 5 else None
    from ds4agent.engine.group import distributed
    from ds4agent.engine.group.distributed import follow, open_engine

    rank = int(os.environ["MLX_RANK"])
    if "," in path:  # one model file per rank: the handshake must refuse a mismatch
        path = path.split(",")[rank]
    if os.environ.get("DS4_TEST_VERSION") and rank == 1:  # another ds4agent version on rank 1
        distributed.__version__ = os.environ["DS4_TEST_VERSION"]
    engine = open_engine(path, split, backend="cpu", kernels=kernels)
    socks = engine.model.link._socks  # the ring's own sockets: one to each side, found once
    if socks is None or (len(socks["left"]), len(socks["right"])) != (1, 1):
        print(f"rank {rank}: ring sockets found: {socks and {k: len(v) for k, v in socks.items()}}", file=sys.stderr)
        return 3
    spy = os.environ.get("DS4_TEST_SPY")
    touched = _spy(engine) if spy else None
    try:
        if engine.model.rank != 0:
            return follow(engine)
        try:
            scenario(engine, out, open(single, "rb").read() if single else None)
        finally:
            engine.close()
        return 0
    finally:
        if spy:
            import json

            with open(os.path.join(spy, f"rank{rank}.json"), "w") as f:
                json.dump({k: sorted(v) for k, v in touched.items()}, f)


def _spy(engine) -> dict[str, set]:
    """Record, from now on, every tensor this rank reads out of its mmap and every routed
    expert its kernels compute (the pages it touches are those tensors', those experts' rows)."""
    dist = engine.model
    f, k = engine.file, dist.model.k
    touched: dict[str, set] = {"tensors": set(), "experts": set()}
    real_array, real_raw, real_experts = f.array, f.raw, k.experts

    def array(name):
        touched["tensors"].add(name)
        return real_array(name)

    def raw(name):
        touched["tensors"].add(name)
        return real_raw(name)

    def experts(layer, x, sel, weights, clamp):
        touched["experts"].update(f"{layer}:{int(e)}" for e in np.asarray(sel).ravel())
        return real_experts(layer, x, sel, weights, clamp)

    f.array, f.raw, k.experts = array, raw, experts
    return touched


if __name__ == "__main__":
    sys.exit(main())
