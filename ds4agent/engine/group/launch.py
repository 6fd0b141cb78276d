"""Starting a group from `ds4 ... --hosts A,B` or `--hostfile FILE` (docs/distributed.md).

mlx.launch starts every rank with its standard input a pipe, so an interactive chat under it
would have no terminal. Here this process becomes rank 0 (keeping the terminal) and starts the
other ranks the way mlx.launch does for the ring backend: a hostfile of "ip:port" per rank in
MLX_HOSTFILE, the rank in MLX_RANK, over ssh for other hosts and directly for this one. The
bytes then move through mx.distributed alone. Imports nothing heavy: the CLI calls it.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass

DEFAULT_PORT = 32323  # mlx.launch's default starting port
LOCAL = {"localhost", "127.0.0.1", "::1"}


class GroupError(RuntimeError):
    """The group cannot go on, or could not form; one line naming the process or host. Defined
    here (no MLX) so that the CLI can catch it; engine/group/link.py raises it."""


def launched() -> bool:
    """Whether this process was started as one rank of a group (mlx.launch, or ds4 --hosts)."""
    return "MLX_RANK" in os.environ and (bool(os.environ.get("MLX_HOSTFILE"))
                                         or "MLX_JACCL_COORDINATOR" in os.environ
                                         or "MLX_WORLD_SIZE" in os.environ)


def follower() -> bool:
    """A rank other than 0: it runs no front end, only its share of the model."""
    return launched() and os.environ.get("MLX_RANK", "0") != "0"


class LaunchError(ValueError):
    """A hostfile or host list that cannot be used; one line naming the host or the entry."""


@dataclass(frozen=True)
class Host:
    ssh: str  # how to reach it ("localhost": started here, without ssh)
    ip: str  # the address the other ranks connect to


def parse_hosts(text: str) -> list[Host]:
    """--hosts A,B,C: each name resolved to the address the ring uses; rank 0 is the first."""
    hosts = []
    for name in (h.strip() for h in text.split(",")):
        if not name:
            raise LaunchError(f"--hosts {text!r}: an empty host name")
        try:
            ip = "127.0.0.1" if name in LOCAL else socket.gethostbyname(name)
        except OSError as e:
            raise LaunchError(f"--hosts: cannot resolve host {name!r} ({e.strerror or e})") from None
        hosts.append(Host(name, ip))
    return _check(hosts)


def read_hostfile(path: str) -> list[Host]:
    """mlx.launch's hostfile: a JSON list (or {"hosts": [...]}) of {"ssh": NAME, "ips": [IP, ...]}."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise LaunchError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise LaunchError(f"{path}: not JSON ({e})") from None
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise LaunchError(f"{path}: expected a list of hosts like "
                          '[{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]')
    hosts = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("ssh"), str) or not e["ssh"]:
            raise LaunchError(f"{path}: host {i} has no \"ssh\" name")
        ips = e.get("ips") or []
        if not isinstance(ips, list) or not all(isinstance(a, str) for a in ips):
            raise LaunchError(f"{path}: host {i} ({e['ssh']}): \"ips\" must be a list of addresses")
        if ips:
            try:
                socket.inet_pton(socket.AF_INET6 if ":" in ips[0] else socket.AF_INET, ips[0])
            except OSError:
                raise LaunchError(f"{path}: host {i} ({e['ssh']}): {ips[0]!r} is not an IP address") from None
            ip = ips[0]
        else:
            ip = parse_hosts(e["ssh"])[0].ip
        hosts.append(Host(e["ssh"], ip))
    return _check(hosts)


def _check(hosts: list[Host]) -> list[Host]:
    if len(hosts) < 2:
        raise LaunchError("a group needs at least two hosts (the same host may be named twice)")
    return hosts


def ring_hostfile(hosts: list[Host], port: int) -> str:
    """The ring backend's own hostfile: one list of "ip:port" per rank."""
    return json.dumps([[f"{h.ip}:{port + r}"] for r, h in enumerate(hosts)])


def follower_command(python: str, argv: list[str], rank: int, ring: str, cwd: str, threads: int | None = None) -> str:
    """A bash script that runs ``argv`` (ds4's own arguments) as ``rank``: the hostfile in a
    temporary file, the environment mlx.launch would set (and DS4_THREADS when given)."""
    script = f"cd {shlex.quote(cwd)} 2>/dev/null; f=$(mktemp); printf %s {shlex.quote(ring)} > \"$f\"; "
    script += f"export MLX_HOSTFILE=\"$f\" MLX_RANK={rank} DS4_GROUP_FOLLOWER=1; "
    if threads:
        script += f"export DS4_THREADS={threads}; "
    script += f"exec {shlex.quote(python)} -m ds4agent.cli " + " ".join(shlex.quote(a) for a in argv)
    return script


def strip_options(argv: list[str]) -> list[str]:
    """ds4's arguments without --hosts/--hostfile (a follower must not start a group itself)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--hosts", "--hostfile"):
            skip = True
            continue
        if a.startswith("--hosts=") or a.startswith("--hostfile="):
            continue
        out.append(a)
    return out


def local_threads(hosts: list[Host]) -> int | None:
    """Kernel threads for each rank on this machine when several share it (rank 0 is always
    here): each would start one per core and they would spin against each other (the loopback
    group ran several times slower so). None when one rank is here or DS4_THREADS is set."""
    here = 1 + sum(1 for h in hosts[1:] if h.ssh in LOCAL)
    if here < 2 or os.environ.get("DS4_THREADS"):
        return None
    return max(1, (os.cpu_count() or 1) // here)


def start(hosts: list[Host], argv: list[str], port: int | None = None) -> list[subprocess.Popen]:
    """Start ranks 1.. and make this process rank 0 (its environment says so for
    mx.distributed.init). Followers' standard output is discarded (rank 0 owns it); their
    standard error stays, so a message of theirs reaches the user."""
    port = port or int(os.environ.get("DS4_DIST_PORT", DEFAULT_PORT))
    ring = ring_hostfile(hosts, port)
    fd, path = tempfile.mkstemp(prefix="ds4-ring-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(ring)
    os.environ["MLX_HOSTFILE"], os.environ["MLX_RANK"] = path, "0"
    args = strip_options(argv)
    threads = local_threads(hosts)
    if threads:
        os.environ["DS4_THREADS"] = str(threads)  # read when this process loads its kernels
    procs = []
    for rank, h in enumerate(hosts[1:], 1):
        script = follower_command(sys.executable, args, rank, ring, os.getcwd(), threads if h.ssh in LOCAL else None)
        cmd = ["bash", "-c", script] if h.ssh in LOCAL else ["ssh", "-o", "BatchMode=yes", h.ssh, script]
        try:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          start_new_session=True))
        except OSError as e:
            for p in procs:
                p.terminate()
            raise LaunchError(f"cannot start rank {rank} on {h.ssh}: {e.strerror or e}") from None
    return procs


def alive(procs: list[subprocess.Popen], hosts: list[Host]):
    """A check for link.init's wait: raises once a started rank has exited (its own message,
    if any, is on stderr already)."""
    def check() -> None:
        for rank, p in enumerate(procs, 1):
            code = p.poll()
            if code is not None:
                unreachable = code == 255 and hosts[rank].ssh not in LOCAL
                why = "ssh could not reach it" if unreachable else f"exit status {code}"
                raise GroupError(f"rank {rank} ({hosts[rank].ssh}) stopped before the group formed ({why})")

    return check
