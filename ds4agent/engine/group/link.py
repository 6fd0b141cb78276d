"""Messages and sums between the processes of a group, carried by mx.distributed (docs/distributed.md).

MLX moves every byte (the ring backend over TCP, JACCL over Thunderbolt RDMA, MPI, NCCL). This
module adds what a product needs around it:

* numpy in and out: the CPU kernels' forward pass runs in numpy, so arrays are converted at the
  boundary (a copy of a few KB to a few MB per message, next to milliseconds of network);
* counters of what was sent and summed, for ``ds4 bench`` and the benchmarks;
* no busy waiting: MLX's ring backend spins on a non-blocking socket while a receive is pending,
  which would keep a core busy on every idle process (a follower waits for the next command
  while the user types). Before a receive from a ring neighbour we wait in select() on that
  neighbour's sockets (found among our open descriptors by the addresses of the hostfile), so
  the receive only starts once its bytes are arriving;
* failures that end in seconds, never a hang: a process that dies closes its sockets and MLX
  raises on its neighbours; a host that vanishes is found by TCP keep-alive, set here on the
  ring's sockets; a process that stops answering (stopped, swapping, deadlocked) is caught by
  a deadline on every wait inside a step, after which the sockets are shut down so the pending
  MLX call fails too. Either way the group is broken for good (collectives cannot be resumed
  half-way): the message is printed once, a GroupError unwinds the caller, and an alarm ends
  the process a few seconds later should anything still hang.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import mlx.core as mx
import numpy as np

from .launch import GroupError

DEFAULT_TIMEOUT = 30.0  # seconds a one-token step may wait for another process (DS4_DIST_TIMEOUT)
BACKSTOP = 8  # seconds after a failure before SIGALRM ends a process that is still running
NOTICE = b"\0DS4FAIL"  # starts a failure notice on a ring socket (see Link.fail)
KEEPALIVE = (3, 1, 3)  # idle seconds, probe interval, probes: a vanished host is found in about 6 s




def timeout_setting() -> float:
    try:
        value = float(os.environ.get("DS4_DIST_TIMEOUT", ""))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


# -- the ring backend's sockets ---------------------------------------------------------------

def _ring_addresses() -> list[list[tuple[str, int]]] | None:
    """Each rank's ring addresses from MLX_HOSTFILE (the ring backend's own file), or None."""
    path = os.environ.get("MLX_HOSTFILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        out = []
        for node in data:
            out.append([(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in node])
        return out
    except (OSError, ValueError, TypeError, AttributeError, IndexError):
        return None


def ring_sockets(rank: int, size: int) -> dict[str, list[socket.socket]] | None:
    """Duplicates of the ring backend's sockets to the left and right neighbours, told apart by
    address: a left socket was accepted on one of our own addresses, a right one connects to
    the right neighbour's. None when they cannot all be found (another backend, another MLX)."""
    nodes = _ring_addresses()
    if not nodes or len(nodes) != size:
        return None
    mine, right = set(nodes[rank]), set(nodes[(rank + 1) % size])
    found: dict[str, list[socket.socket]] = {"left": [], "right": []}
    try:
        limit = min(os.sysconf("SC_OPEN_MAX"), 4096)
    except (ValueError, OSError):
        limit = 1024
    # The descriptors open now, listed before any is duplicated: a duplicate gets a higher
    # number, and a scan that met it would take it (and duplicate it) again.
    fds = []
    for fd in range(3, limit):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                fds.append(fd)
        except OSError:
            continue
    for fd in fds:
        s = socket.socket(fileno=os.dup(fd))
        try:
            local, peer = s.getsockname()[:2], s.getpeername()[:2]
        except (OSError, ValueError, TypeError):
            s.close()
            continue
        if local in mine and peer not in right:
            found["left"].append(s)
        elif peer in right:
            found["right"].append(s)
        else:
            s.close()
    if not found["left"] or not found["right"]:
        for s in found["left"] + found["right"]:
            s.close()
        return None
    return found


def _keepalive(s: socket.socket) -> None:
    idle, interval, count = KEEPALIVE
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        elif hasattr(socket, "TCP_KEEPALIVE"):  # macOS
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPALIVE, idle)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # unacknowledged data: give up after 10 s
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 10000)
    except OSError:
        pass


# -- stderr: MLX's ring backend writes a dozen lines when a peer goes ----------------------------

class StderrFilter:
    """fd 2 through a pipe that drops the ring backend's own '[ring] ...' lines (which say a
    socket closed, ten times, before the error we report in one line); DS4_DIST_VERBOSE=1
    keeps them. ``write`` goes to the real stderr directly."""

    def __init__(self) -> None:
        self.real = os.dup(2)
        self.verbose = os.environ.get("DS4_DIST_VERBOSE") == "1"
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        self._r = r
        self._thread = threading.Thread(target=self._pump, name="ds4-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self._r, 65536)
            except OSError:
                return
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if self.verbose or not line.startswith(b"[ring]"))
            if out:
                os.write(self.real, out)
        if buf and (self.verbose or not buf.startswith(b"[ring]")):
            os.write(self.real, buf)

    def write(self, text: str) -> None:
        try:
            os.write(self.real, text.encode("utf-8", "replace"))
        except OSError:
            pass

    def close(self) -> None:
        """Back to the real stderr, everything written so far delivered."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.real, 2)  # closes the pipe's last write end: the pump reads EOF
        self._thread.join(2)


# -- forming the group -----------------------------------------------------------------------

def init(backend: str, deadline: float, alive: Callable[[], None] = lambda: None):
    """mx.distributed.init(strict=True) on a helper thread, waiting at most ``deadline``
    seconds; ``alive`` is called while waiting and raises GroupError when a process we started
    died (then waiting on is pointless). The helper thread is abandoned if the group never
    forms: the process is about to exit with the message anyway."""
    box: dict = {}

    def run() -> None:
        try:
            box["group"] = mx.distributed.init(strict=True, backend=backend)
        except Exception as e:  # noqa: BLE001 - reported below, in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ds4-join", daemon=True)
    t.start()
    end = time.monotonic() + deadline
    while t.is_alive() and time.monotonic() < end:
        alive()
        t.join(0.1)
    if "error" in box:
        raise GroupError(f"could not join the group ({backend} backend): {box['error']}")
    if "group" not in box:
        alive()
        raise GroupError(f"the group did not form within {deadline:.0f} s: some process could not reach its "
                         "neighbours (check the hosts' addresses and that the ports are open)")
    return box["group"]


# -- the link -------------------------------------------------------------------------------

class Link:
    """One process's end of a group: send/recv to the ring neighbours, sums and gathers over
    all. Arrays go in as numpy or MLX and come back as the same kind."""

    def __init__(self, group, names: list[str], timeout: float | None = None,
                 report: Callable[[str], None] | None = None) -> None:
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.left, self.right = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        self.names = names
        self.timeout = timeout or timeout_setting()
        self.report = report or (lambda msg: sys.stderr.write(f"ds4: error: {msg}\n"))
        # A follower that ds4 --hosts started leaves the message to rank 0 (whose terminal its
        # stderr shares); under mlx.launch every rank says it.
        self.quiet = os.environ.get("DS4_GROUP_FOLLOWER") == "1"
        self.sent = 0  # bytes this process sent point to point
        self.reduced = 0  # bytes of arrays it summed or gathered with the others
        self.messages = 0  # sends, sums and gathers
        self.broken: str | None = None
        self._socks = ring_sockets(self.rank, self.size)
        for s in self._all_socks():
            _keepalive(s)
        self._cv = threading.Condition()
        self._wait: tuple[int, float, str] | None = None  # (id, deadline, what)
        self._wait_id = 0
        self._fired: str | None = None
        self._watch = threading.Thread(target=self._watchdog, name="ds4-watchdog", daemon=True)
        self._watch.start()

    # naming ---------------------------------------------------------------------------------
    def name(self, rank: int) -> str:
        host = self.names[rank] if rank < len(self.names) else "?"
        return f"rank {rank} ({host})"

    def _others(self) -> str:
        return ", ".join(self.name(r) for r in range(self.size) if r != self.rank)

    def _all_socks(self) -> list[socket.socket]:
        return [] if self._socks is None else self._socks["left"] + self._socks["right"]

    # failure --------------------------------------------------------------------------------
    def _closed_side(self) -> int | None:
        """The neighbour whose socket is closed or failed, if one is (after an error)."""
        if self._socks is None:
            return None
        for side, rank in (("left", self.left), ("right", self.right)):
            for s in self._socks[side]:
                try:
                    if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        return rank
                except BlockingIOError:
                    continue
                except OSError:
                    return rank
        return None

    def fail(self, msg: str, say: bool = False) -> GroupError:
        """Mark the group broken with ``msg`` (shown once), arm the backstop, return the error.

        Before closing, the message goes to both neighbours as a notice (NOTICE, then the text)
        on the ring's own sockets: the group is dead, so nothing else will be read from them,
        and a neighbour that waits for its next message reads the notice instead and passes the
        true cause on round the ring, so rank 0 names the process that failed first (not the
        neighbour that closed after it)."""
        if self.broken is None:
            self.broken = msg
            if say or not self.quiet or self.rank == 0:  # say: this process's own failure
                self.report(msg)
            try:
                signal.alarm(BACKSTOP)  # SIGALRM's default action ends the process
            except (ValueError, OSError):
                pass
            note = NOTICE + msg.encode("utf-8", "replace")[:4000] + b"\n"
            for s in self._all_socks():
                try:
                    s.setblocking(False)
                    s.send(note)  # best effort: a full buffer or a gone peer loses only the notice
                except OSError:
                    pass
            for s in self._all_socks():  # the neighbours learn it now, not at their deadline
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return GroupError(self.broken)

    def _notice(self, socks: list[socket.socket]) -> str | None:
        """A failure notice waiting at the head of one of these sockets, if there is one."""
        for s in socks:
            try:
                head = s.recv(len(NOTICE), socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except OSError:
                continue
            if head != NOTICE:
                continue
            data, end = b"", time.monotonic() + 1.0
            while not data.endswith(b"\n") and time.monotonic() < end:
                try:
                    chunk = s.recv(4096, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
            return data[len(NOTICE):].decode("utf-8", "replace").strip() or None
        return None

    def _lost(self, what: str, peer: int | None, cause: BaseException) -> GroupError:
        if self.broken is not None:
            return GroupError(self.broken)
        if self._fired:
            return self.fail(self._fired)
        note = self._notice(self._all_socks())
        if note:
            return self.fail(note)
        who = self._closed_side()
        who = peer if who is None and peer is not None and self.size == 2 else who
        if who is not None:
            return self.fail(f"{self.name(who)} stopped or cannot be reached ({what}: {_first_line(cause)}); "
                             "the group is stopped")
        return self.fail(f"lost the connection to the group ({what}: {_first_line(cause)}; {self._others()}); "
                         "the group is stopped")

    def _watchdog(self) -> None:
        with self._cv:
            while True:
                w = self._wait
                if w is None:
                    self._cv.wait()
                    continue
                left = w[1] - time.monotonic()
                if left > 0:
                    self._cv.wait(left)
                    continue
                if self._wait is w and self.broken is None:
                    self._fired = f"no answer for {w[1] - w[3]:.0f} s while {w[2]}; the group is stopped"
                    if self._socks is None:  # nothing to shut: the MLX call cannot be woken
                        self.report(self._fired + " (DS4_DIST_TIMEOUT sets the limit)")
                        os._exit(1)
                    for s in self._all_socks():  # the pending MLX call fails now
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                self._wait = None

    @contextmanager
    def _waiting(self, what: str, seconds: float | None) -> Iterator[None]:
        if seconds is None:
            yield
            return
        with self._cv:
            self._wait_id += 1
            now = time.monotonic()
            self._wait = (self._wait_id, now + seconds, what, now)
            self._cv.notify()
        try:
            yield
        finally:
            with self._cv:
                self._wait = None

    def _check(self) -> None:
        if self.broken is not None:
            raise GroupError(self.broken)

    def _readable(self, src: int, seconds: float | None, what: str) -> None:
        """Wait without spinning until ``src``'s bytes arrive (or its socket closes)."""
        if self._socks is None:
            return
        socks = self._socks["left"] if src == self.left else self._socks["right"]
        # poll, not select: MLX's descriptors can lie above select()'s FD_SETSIZE (1024).
        poller = select.poll()
        for s in socks:
            poller.register(s, select.POLLIN | select.POLLPRI)
        try:
            ready = poller.poll(None if seconds is None else int(seconds * 1000))
        except (OSError, ValueError) as e:
            raise self._lost(what, src, e) from None
        note = self._notice(socks) if ready else None
        if note:
            raise self.fail(note)
        if not ready:
            raise self.fail(f"no answer from {self.name(src)} for {seconds:.0f} s while {what}; the group is stopped")

    # operations -----------------------------------------------------------------------------
    def _eval(self, out, what: str, peer: int | None, seconds: float | None):
        try:
            with self._waiting(what, seconds):
                mx.eval(out)
        except RuntimeError as e:
            raise self._lost(what, peer, e) from None
        return out

    def send(self, a, dst: int, seconds: float | None, what: str = "sending") -> None:
        self._check()
        x = a if isinstance(a, mx.array) else mx.array(np.ascontiguousarray(a))
        self._eval(mx.distributed.send(x, dst, group=self.group), f"{what} to {self.name(dst)}", dst, seconds)
        self.sent += x.nbytes
        self.messages += 1

    def recv(self, shape: tuple[int, ...], dtype, src: int, seconds: float | None, what: str = "receiving",
             numpy: bool = True):
        """Receive an array of ``shape`` and ``dtype`` (an MLX dtype) from neighbour ``src``;
        ``seconds`` None waits for ever (an idle process waiting for its next command)."""
        self._check()
        what = f"{what} from {self.name(src)}"
        self._readable(src, seconds, what)
        out = self._eval(mx.distributed.recv(shape, dtype, src, group=self.group), what, src, seconds)
        return np.array(out) if numpy else out

    def all_sum(self, a, seconds: float | None, what: str = "summing"):
        return self._collective(a, mx.distributed.all_sum, what, seconds, lambda out, x: out)

    def all_gather(self, a, seconds: float | None, what: str = "gathering"):
        """Every process's ``a`` (same shape everywhere) stacked along a new first axis."""
        return self._collective(a, mx.distributed.all_gather, what, seconds,
                                lambda out, x: out.reshape(self.size, *x.shape))

    def _collective(self, a, op, what: str, seconds: float | None, shape):
        """``op`` over every process's ``a`` (an MLX array, or numpy: answered in kind), counted."""
        self._check()
        x = a if isinstance(a, mx.array) else mx.array(np.ascontiguousarray(a))
        out = shape(self._eval(op(x, group=self.group), what, None, seconds), x)
        self.reduced += x.nbytes
        self.messages += 1
        return out if isinstance(a, mx.array) else np.array(out)

    def close(self) -> None:
        for s in self._all_socks():
            s.close()
        self._socks = None


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
