"""Several processes with mx.distributed (engine/group/distributed.py) on loopback, ring backend.

Each configuration is one `mlx.launch -n N --backend ring` run of tests/distributed_worker.py:
rank 0 runs the same scenario as one process does here (chunked prefill, greedy decode, seeded
sampling, checkpoint and rollback, snapshot and restore in the group, a one-process snapshot
restored into the group) and the logits of every step are compared. The pipeline split does
the same arithmetic in the same order (bit-identical); the expert split sums partial products
in another order (float tolerance; tokens identical).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "distributed_worker.py"
LAUNCH = Path(sys.executable).parent / "mlx.launch"
# A port range per test run (runs may overlap), below Linux's ephemeral range (32768 and up),
# where the kernel hands out ports to every outgoing connection and one could hold a rank's.
PORT = [20000 + 61 * (os.getpid() % 200)]


def launch(n: int, args: list[str], timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``args`` (a script and its arguments) as n ranks on loopback. The ranks bind their
    ports only after start-up, so another process can take one meanwhile: a group that could
    not bind runs again on the next ports."""
    full = {**os.environ, **(env or {})}
    for _ in range(3):
        port = PORT[0]
        PORT[0] += n + 3
        cmd = [str(LAUNCH), "-n", str(n), "--backend", "ring", "--starting-port", str(port), "--python",
               sys.executable, "--", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)
        if done.returncode == 0 or "Couldn't bind socket (error: 98)" not in done.stdout + done.stderr:
            break  # 98: EADDRINUSE
    return done


def run_single(path: Path, kernels: str, out: Path, snapshot_out: Path | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from distributed_worker import scenario

    from ds4agent.engine import Engine

    with Engine.open(path, backend="cpu", kernels=kernels) as e:
        scenario(e, str(out), None)
    return dict(np.load(out))


def run_group(path: Path, split: str, n: int, kernels: str, out: Path, single_blob: Path,
              spy: Path | None = None) -> dict:
    r = launch(n, [str(WORKER), str(path), split, kernels, str(out), str(single_blob)],
               env={"DS4_TEST_SPY": str(spy)} if spy else None)
    assert r.returncode == 0 and "exited with code" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
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
    assert int(group["interrupted_n"]) == int(single["interrupted_n"]) == 5  # the first chunk, no more
    for k in ("prefill", "resumed", "greedy1", "greedy2", "greedy3", "after_sampled", "after_rollback", "restored"):
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
    group = run_group(demo_path, split, n, "cpu-exact", tmp_path / "g.npz", single["_snap"], spy=tmp_path)
    _compare(group, single, exact=split == "pipeline")
    # 13 prompt tokens in chunks of 5: a pipeline keeps one chunk per stage in flight.
    assert int(group["in_flight"]) == (min(n, 3) if split == "pipeline" else 0)
    _check_pages(demo_path, split, n, tmp_path)


def _check_pages(path: Path, split: str, n: int, spy: Path) -> None:
    """Each rank read only its share of the mmap: a pipeline stage its layers' tensors (and
    the embedding on the first stage, the head on the last); an expert split only its routed
    experts (every rank reads the other tensors, each only its rows of the split matrices)."""
    import json

    from ds4agent.engine.group import split as splits
    from ds4agent.modelfile.config import config_from_gguf
    from ds4agent.modelfile.gguf import GGUFFile

    with GGUFFile(path) as f:
        cfg = config_from_gguf(f)
        sizes = {name: t.nbytes for name, t in f.tensors.items()}
        block = splits.block_width(f.tensors["blk.0.ffn_down_shexp.weight"].type)
    seen_experts = set()
    for rank in range(n):
        got = json.loads((spy / f"rank{rank}.json").read_text())
        plan = splits.plan(cfg, sizes, split, n, rank, block)
        experts = {tuple(map(int, e.split(":"))) for e in got["experts"]}
        assert experts, rank  # the spy saw the work
        if split == "pipeline":
            layers = {int(t.split(".")[1]) for t in got["tensors"] if t.startswith("blk.")}
            assert layers == set(plan.layers), (rank, layers, plan.layers)
            assert ("token_embd.weight" in got["tensors"]) == (plan.stage == 0), rank
            assert any(t.startswith("output") for t in got["tensors"]) == (plan.stage == n - 1), rank
            assert {layer for layer, _ in experts} <= set(plan.layers)
        else:
            e0, e1 = plan.experts
            assert all(e0 <= e < e1 for _, e in experts), (rank, plan.experts, sorted(experts)[:5])
            seen_experts |= experts
    if split == "experts":
        assert len({e for _, e in seen_experts}) > n  # the routing spread over several ranks' experts


# -- refused at start --------------------------------------------------------------------------

def test_mismatched_model_file_is_refused_naming_the_host(demo_path: Path, tmp_path: Path) -> None:
    from ds4agent.modelfile.demo import write_demo

    other = write_demo(tmp_path / "other.gguf", "tiny", 1)  # same layout, other weights
    r = launch(2, [str(WORKER), f"{demo_path},{other}", "pipeline", "cpu-exact", str(tmp_path / "x.npz")], 120)
    text = r.stdout + r.stderr  # (mlx.launch itself exits 0 whatever its ranks do)
    # Every rank compares the fingerprints, so either may refuse first, and mlx.launch then ends
    # the other (seen: rank 1 exits 1 and rank 0 is killed by -15). No rank may go on.
    assert re.search(r"rank [01] exited with code 1", text) and "exited with code 0" not in text, text[-2000:]
    assert "rank 1 (" in text and "different model file" in text and str(other) in text, text[-2000:]
    assert not (tmp_path / "x.npz").exists()


def test_mismatched_version_is_refused(demo_path: Path, tmp_path: Path) -> None:
    r = launch(2, [str(WORKER), str(demo_path), "experts", "cpu-exact", str(tmp_path / "x.npz")], 120,
               env={"DS4_TEST_VERSION": "9.9.9"})
    text = r.stdout + r.stderr
    # Every rank compares the fingerprints, so either may refuse first, and mlx.launch then ends
    # the other (seen: rank 1 exits 1 and rank 0 is killed by -15). No rank may go on.
    assert re.search(r"rank [01] exited with code 1", text) and "exited with code 0" not in text, text[-2000:]
    assert "rank 1 (" in text and "runs ds4agent 9.9.9" in text, text[-2000:]


def test_bad_hostfile_and_hosts_are_refused_in_one_line(demo_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "hosts.json"
    cases = [
        (["--hostfile", str(tmp_path / "missing.json")], "missing.json"),
        (["--hosts", "localhost,no-such-host.invalid"], "no-such-host.invalid"),
        (["--hosts", "localhost"], "at least two hosts"),
        (["--split", "experts"], "needs a group"),
    ]
    bad.write_text('[{"ssh": "mac1", "ips": ["10.0.0.300"]}, {"ssh": "mac2"}]')
    cases.append((["--hostfile", str(bad)], "mac1"))
    for extra, needle in cases:
        r = subprocess.run([sys.executable, "-m", "ds4agent.cli", "-m", str(demo_path), "-p", "hi", "-n", "1",
                            "--backend", "cpu", *extra], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={k: v for k, v in os.environ.items() if not k.startswith("MLX_")})
        assert r.returncode == 2, (extra, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ds4: error:") and needle in lines[0], (extra, r.stderr)


# -- a rank that dies ----------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _rank_of(pid: int) -> int | None:
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"MLX_RANK="):
            return int(e[9:])
    return None


# Within seconds: the failure notice goes round the ring at once (0.2 s here when idle); the
# limit leaves room for a loaded 2-core machine, and stays well under a step's deadline
# (link.DEFAULT_TIMEOUT, 30 s), so a group that only its deadline stopped fails the test.
LIMIT = 15


@pytest.mark.parametrize("victim", [1, 0])
def test_killed_rank_stops_the_others_with_one_message(demo_path: Path, victim: int) -> None:
    """Three ranks via --hosts (this ds4 is rank 0); mid-generation one rank gets SIGKILL: the
    others exit within seconds, rank 0 with one message naming the rank."""
    import signal
    import time

    cmd = [sys.executable, "-m", "ds4agent.cli", "-m", str(demo_path), "-p", "hello", "-n", "100000", "--temp", "0",
           "--ctx", "4096", "--backend", "cpu", "--kernels", "cpu-exact", "--hosts", "localhost,localhost,localhost"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["DS4_DIST_PORT"] = str(PORT[0])
    PORT[0] += 6
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    try:
        os.set_blocking(p.stdout.fileno(), False)
        deadline = time.monotonic() + 150
        got = b""
        while len(got) < 3 and time.monotonic() < deadline and p.poll() is None:  # tokens are coming
            time.sleep(0.2)
            got += p.stdout.read() or b""
        assert len(got) >= 3, p.stderr.read().decode() if p.poll() is not None else "no output"
        followers = {_rank_of(c): c for c in _children(p.pid)}
        assert set(followers) == {1, 2}, followers
        target = p.pid if victim == 0 else followers[victim]
        os.kill(target, signal.SIGKILL)
        t0 = time.monotonic()
        others = [c for r, c in followers.items() if r != victim]
        if victim != 0:
            p.wait(timeout=LIMIT)
            err = p.stderr.read().decode()
            assert p.returncode == 1, err
            lines = [ln for ln in err.splitlines() if ln.startswith("ds4: error:")]
            assert len(lines) == 1 and f"rank {victim} (" in lines[0] and "stopped" in lines[0], err
            assert "Traceback" not in err, err
        for c in others:  # the followers left too (they are not our children: poll /proc)
            while Path(f"/proc/{c}").exists() and (Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0]
                                                   != "Z") and time.monotonic() - t0 < LIMIT:
                time.sleep(0.1)
            state = Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{c}").exists() else "gone"
            assert state in ("Z", "gone"), (c, state)
        assert time.monotonic() - t0 < LIMIT
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        for c in _children(p.pid):
            try:
                os.kill(c, signal.SIGKILL)
            except OSError:
                pass


# -- front ends on a group -------------------------------------------------------------------

def _serve(demo_path: Path, tmp: Path, extra: list[str]):
    """`ds4 serve` on a free port (greedy, 12 tokens); returns the process and an openai client."""
    import socket
    import time

    import openai

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env.update(DS4_HOME=str(tmp / "home"), DS4_DIST_PORT=str(PORT[0]))
    PORT[0] += 6
    p = subprocess.Popen([sys.executable, "-m", "ds4agent", "serve", "-m", str(demo_path), "--port", str(port),
                          "--ctx", "1024", "--sessions", str(tmp / "kv"), "--cache-min-tokens", "1", "-n", "12",
                          "--temp", "0", "--backend", "cpu", "--kernels", "cpu-exact", *extra],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=120)
    deadline = time.monotonic() + 150
    while True:
        try:
            c.models.list()
            return p, c
        except openai.APIConnectionError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                raise AssertionError(p.communicate()[1][-3000:])
            time.sleep(0.3)


@pytest.mark.slow
def test_serve_on_a_pipeline_group_answers_as_one_process(demo_path: Path, tmp_path: Path) -> None:
    """`ds4 serve --hosts localhost,localhost`: rank 0 owns the HTTP socket; two turns (the
    second reusing the first's cache) give one process's greedy text; Ctrl+C saves the live
    session as one ordinary file (gathered from both ranks) and ends every process."""
    import signal

    from ds4agent.engine import Engine
    from ds4agent.sessions.store import SessionStore

    turns = [[{"role": "user", "content": "hello there"}]]
    answers: dict[str, list[str]] = {}
    for name, extra in (("one", []), ("group", ["--hosts", "localhost,localhost", "--split", "pipeline"])):
        tmp = tmp_path / name
        p, c = _serve(demo_path, tmp, extra)
        try:
            got = []
            r = c.chat.completions.create(model="m", messages=turns[0])
            got.append(r.choices[0].message.model_dump_json())
            follow = turns[0] + [{"role": "assistant", "content": r.choices[0].message.content or "x"},
                                 {"role": "user", "content": "and then?"}]
            r2 = c.chat.completions.create(model="m", messages=follow)
            got.append(r2.choices[0].message.model_dump_json())
            assert r2.usage.prompt_tokens_details.cached_tokens > 0
            answers[name] = got
            followers = _children(p.pid)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0 and "Traceback" not in err, err
        assert "reason=shutdown" in err, err
        if name == "group":
            assert len(followers) == 1
            for f in followers:  # the follower left with rank 0
                assert not Path(f"/proc/{f}").exists() or \
                    Path(f"/proc/{f}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        saved = [i for i in SessionStore(tmp / "kv").list() if i.reason == "shutdown"]
        assert len(saved) == 1
        answers[name].append(saved[0].sha)
    assert answers["group"] == answers["one"]  # the same text, so the same file name
    logits = []
    with Engine.open(demo_path, backend="cpu", kernels="cpu-exact") as e:
        for name in ("one", "group"):  # the group's file loads in one process, the same state
            s = e.session(ctx=1024)
            SessionStore(tmp_path / name / "kv").load(answers[name][2], s)
            s.eval(3)
            logits.append(s.logits.copy())
    assert np.array_equal(*logits)


@pytest.mark.slow
def test_chat_and_bench_on_an_expert_group(demo_path: Path, tmp_path: Path) -> None:
    """Pipe-mode `ds4 chat` over `--hosts` with the expert split gives one process's greedy
    answers (cpu-exact kernels: the partial sums reorder only float additions); `ds4 bench`
    runs on the group and writes its CSV."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env.update(DS4_MODEL=str(demo_path), DS4_HOME=str(tmp_path / "home"))
    base = [sys.executable, "-m", "ds4agent", "--ctx", "1024", "-n", "6", "--temp", "0", "--nothink", "--backend", "cpu",
            "--kernels", "cpu-exact"]
    outs = []
    for extra in ([], ["--hosts", "localhost,localhost", "--split", "experts"]):
        env["DS4_DIST_PORT"] = str(PORT[0])
        PORT[0] += 6
        r = subprocess.run(base + extra, input="Hello\nAgain\n", capture_output=True, text=True, env=env, timeout=240,
                           cwd=ROOT)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        outs.append(r.stdout)
    assert outs[0].count("\n") == 2 and outs[1] == outs[0]
    env["DS4_DIST_PORT"] = str(PORT[0])
    PORT[0] += 6
    csv = tmp_path / "b.csv"
    r = subprocess.run([sys.executable, "-m", "ds4agent", "bench", "--backend", "cpu", "--kernels", "cpu-exact",
                        "--ctx-start", "64", "--ctx-max", "128", "--step-incr", "64", "--gen-tokens", "4",
                        "--csv", str(csv), "--hosts", "localhost,localhost", "--split", "experts"],
                       capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = csv.read_text().strip().splitlines()
    assert len(rows) == 3, rows  # a header and the two context sizes
