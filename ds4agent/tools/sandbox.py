"""An OS sandbox for shell commands: writes confined to the workspace and the temporary
directory, the workspace's .git read-only (except for git itself), optionally no network.

Modes, as Codex names them:

- ``read-only``: commands may read everything and write nothing (but /dev/null and the like);
- ``workspace-write``: they may also write inside the workspace and the temporary directories;
- ``full-access``: no sandbox.

Mechanisms, best first:

- Linux: Landlock (kernel 5.13+), applied by this file run as a tiny wrapper between fork and
  exec: ``python -I -S sandbox.py --write DIR ... -- bash -c CMD`` restricts itself and execs the
  command, so nothing in the agent's own process changes and no preexec_fn runs in a threaded
  parent. Landlock cannot carve a read-only directory out of a writable one, so where the
  kernel allows unprivileged user namespaces the wrapper first enters new user and mount
  namespaces and bind-mounts .git read-only over itself; with ``--no-network`` it also enters a
  new network namespace (only a loopback interface). Without namespaces, Landlock's TCP rules
  (ABI 4+) stop TCP connects and binds (UDP still works). From ABI 6 signals to processes
  outside the sandbox and abstract unix sockets outside it are refused too.
- Linux without Landlock: bubblewrap (``bwrap``) when installed.
- macOS: ``/usr/bin/sandbox-exec`` with a generated Seatbelt profile (``seatbelt_profile``).

``detect()`` finds what this machine has (and proves it by running a command under it once);
``None`` means no sandbox, which the agent says at start. This module is also the wrapper's
main program, so it imports nothing outside the standard library.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

MODES = ("read-only", "workspace-write", "full-access")
WRAPPER = os.path.abspath(__file__)


@dataclass(frozen=True)
class Confinement:
    """What one command may do."""

    mode: str  # read-only | workspace-write
    writable: tuple[str, ...] = ()  # directories (real paths) it may write below
    protected: tuple[str, ...] = ()  # read-only paths below those (the workspace's .git)
    network: bool = True

    def describe(self) -> str:
        if self.mode == "read-only":
            what = "no writes"
        else:
            what = "writes only inside " + ", ".join(self.writable)
            if self.protected:
                what += f" ({', '.join(self.protected)} read-only)"
        return what + ("" if self.network else "; no network")


@dataclass
class Backend:
    name: str  # landlock | bubblewrap | seatbelt
    detail: str  # one line for the user
    abi: int = 0  # Landlock ABI
    namespaces: bool = False  # user + mount (+ network) namespaces available to the wrapper
    features: dict = field(default_factory=dict)

    def wrap(self, argv: list[str], conf: Confinement) -> list[str]:
        if self.name == "landlock":
            return landlock_argv(argv, conf)
        if self.name == "bubblewrap":
            return bwrap_argv(argv, conf)
        if self.name == "seatbelt":
            profile, params = seatbelt_profile(conf)
            return [SANDBOX_EXEC, "-p", profile, *[f"-D{k}={v}" for k, v in params], "--", *argv]
        raise ValueError(self.name)

    def protects_git(self) -> bool:
        return self.name in ("bubblewrap", "seatbelt") or (self.name == "landlock" and self.namespaces)

    def network_off(self) -> str:
        """How --no-network is enforced here."""
        if self.name == "landlock":
            return "network namespace" if self.namespaces else ("TCP only (Landlock)" if self.abi >= 4 else "")
        return "yes"


# -- Linux: Landlock through the wrapper -----------------------------------------------------------

_NR = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3, "remove_dir": 1 << 4,
       "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7, "make_reg": 1 << 8, "make_sock": 1 << 9,
       "make_fifo": 1 << 10, "make_block": 1 << 11, "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14,
       "ioctl_dev": 1 << 15}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
# Writes of every kind; reads and execution stay allowed everywhere.
_WRITE_V1 = sum(_FS[k] for k in ("write_file", "remove_dir", "remove_file", "make_char", "make_dir", "make_reg",
                                 "make_sock", "make_fifo", "make_block", "make_sym"))
_FILE_RIGHTS = _FS["write_file"] | _FS["truncate"]  # what a rule on a single file may hold (of ours)
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom")
DEVICE_DIRS = ("/dev/pts",)
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 when unavailable or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        r = _libc().syscall(ctypes.c_long(_NR["create_ruleset"]), None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(r), 0)


def write_access(abi: int) -> int:
    rights = _WRITE_V1
    if abi >= 2:
        rights |= _FS["refer"]
    if abi >= 3:
        rights |= _FS["truncate"]
    return rights


def restrict_self(writable: list[str], files: list[str], abi: int, network: bool, scope: bool = True) -> None:
    """Landlock this process: writes only below ``writable`` and to ``files``; without
    ``network``, no TCP connect or bind (ABI 4+). Raises OSError."""
    libc = _libc()
    handled = write_access(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        if not network:
            attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    if abi >= 6 and scope:
        size = 24
        attr.scoped = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX
    fd = libc.syscall(ctypes.c_long(_NR["create_ruleset"]), ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        for path, rights in [(p, handled) for p in writable] + [(f, _FILE_RIGHTS & handled) for f in files]:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a root that does not exist here cannot be written anyway
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(rights, pfd)
                r = libc.syscall(ctypes.c_long(_NR["add_rule"]), ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                                 ctypes.byref(rule), ctypes.c_uint32(0))
                if r < 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"landlock_add_rule({path}): {os.strerror(e)}")
            finally:
                os.close(pfd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(NO_NEW_PRIVS): {os.strerror(e)}")
        if libc.syscall(ctypes.c_long(_NR["restrict_self"]), ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(fd)


def enter_namespaces(protected: list[str], network: bool) -> None:
    """New user + mount (+ network) namespaces: ``protected`` bind-mounted read-only over
    themselves, and without ``network`` only a loopback interface. Raises OSError."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | (0 if network else CLONE_NEWNET)
    if libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except FileNotFoundError:
            if name != "setgroups":
                raise
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount --make-rprivate /: {os.strerror(e)}")
    for p in protected:
        if not os.path.exists(p):
            continue
        bp = os.fsencode(p)
        if libc.mount(bp, bp, None, MS_BIND | MS_REC, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"bind {p}: {os.strerror(e)}")
        st = os.statvfs(p)
        keep = 0
        for st_flag, ms_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                                 (getattr(os, "ST_NOATIME", 1024), MS_NOATIME),
                                 (getattr(os, "ST_NODIRATIME", 2048), MS_NODIRATIME),
                                 (getattr(os, "ST_RELATIME", 4096), MS_RELATIME)):
            if st.f_flag & st_flag:
                keep |= ms_flag
        if libc.mount(None, bp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, None) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"read-only {p}: {os.strerror(e)}")
    if not network:
        _loopback_up()


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), 0x8913, ifr))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    finally:
        s.close()


def landlock_argv(argv: list[str], conf: Confinement) -> list[str]:
    args = [sys.executable, "-I", "-S", WRAPPER]
    if conf.mode != "read-only":
        for d in conf.writable:
            args += ["--write", d]
    for p in conf.protected:
        args += ["--protect", p]
    if not conf.network:
        args.append("--no-network")
    return args + ["--", *argv]


def _wrapper_main(args: list[str]) -> int:
    """``sandbox.py [--write DIR]... [--protect PATH]... [--no-network] [--probe] -- CMD...``"""
    writable: list[str] = []
    protected: list[str] = []
    network = True
    probe = False
    while args and args[0] != "--":
        a = args.pop(0)
        if a in ("--write", "--protect") and args:
            (writable if a == "--write" else protected).append(args.pop(0))
        elif a == "--no-network":
            network = False
        elif a == "--probe":
            probe = True
        else:
            sys.stderr.write(f"ds4 sandbox: unknown option {a}\n")
            return 126
    argv = args[1:]
    abi = landlock_abi()
    report = {"landlock": abi, "namespaces": False, "namespace_error": ""}
    if abi < 1:
        sys.stderr.write("ds4 sandbox: Landlock is not available in this kernel; the command was not run\n")
        return 126
    if protected or not network or probe:
        try:
            enter_namespaces(protected, network)
            report["namespaces"] = True
        except OSError as e:
            report["namespace_error"] = str(e)
            if not network and abi < 4:
                sys.stderr.write(f"ds4 sandbox: cannot turn the network off here ({e}); the command was not run\n")
                return 126
    files = [f for f in DEVICE_FILES if os.path.exists(f)]
    dirs = [d for d in DEVICE_DIRS if os.path.isdir(d)] + writable
    try:
        restrict_self(dirs, files, abi, network)
    except OSError as e:
        sys.stderr.write(f"ds4 sandbox: cannot confine the command ({e}); it was not run\n")
        return 126
    if probe:
        inside = os.path.join(writable[0], ".ds4-sandbox-probe") if writable else ""
        # next to the writable directory: a directory (the temporary one) writable without the sandbox
        outside = os.path.join(os.path.dirname(writable[0]), f".ds4-sandbox-probe-{os.getpid()}") if writable else ""
        report["blocks_writes"] = _write_fails(outside) if outside else False
        report["allows_writes"] = not _write_fails(inside) if inside else False
        sys.stdout.write(json.dumps(report))
        return 0
    if not argv:
        return 0
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"ds4 sandbox: cannot run {argv[0]}: {e.strerror}\n")
        return 127


def _write_fails(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return True
    os.close(fd)
    os.unlink(path)
    return False


# -- Linux: bubblewrap ---------------------------------------------------------------------------

def bwrap_argv(argv: list[str], conf: Confinement) -> list[str]:
    args = [_which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--die-with-parent"]
    if conf.mode != "read-only":
        for d in conf.writable:
            if os.path.isdir(d) and not d.startswith("/dev"):
                args += ["--bind", d, d]
    for p in conf.protected:
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    if not conf.network:
        args.append("--unshare-net")
    return args + ["--", *argv]


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


# -- macOS: Seatbelt -------------------------------------------------------------------------------

SANDBOX_EXEC = "/usr/bin/sandbox-exec"  # only this one: a sandbox-exec on PATH could be anything


def _sbpl_regex_escape(path: str) -> str:
    out = []
    for c in path:
        out.append("\\" + c if c in r".^$|()[]{}*+?\\" else c)
    return "".join(out).replace('"', '\\"')


def seatbelt_profile(conf: Confinement) -> tuple[str, list[tuple[str, str]]]:
    """The Seatbelt profile for ``conf`` and its parameters (``-DNAME=VALUE``: paths are never
    spliced into the profile text). Rules are read in order and the last one that matches
    decides: everything is allowed, then every write is denied, then writes below the
    writable roots and to the terminal and null devices are allowed again, then writes to the
    protected paths (.git, at any depth below a root, in any letter case) are denied again.
    Without network, IP traffic in and out is denied (local unix sockets stay)."""
    params: list[tuple[str, str]] = []
    lines = [
        "(version 1)",
        "; ds4agent: reads, processes and IPC as usual; writes and network confined",
        "(allow default)",
        "(deny file-write*)",
        "(allow file-write-data file-write-create file-write-unlink file-ioctl",
        '  (literal "/dev/null") (literal "/dev/zero") (literal "/dev/tty") (literal "/dev/dtracehelper")',
        '  (literal "/dev/stdout") (literal "/dev/stderr") (literal "/dev/ptmx")',
        '  (regex #"^/dev/ttys[0-9]+$") (regex #"^/dev/fd/[0-9]+$"))',
    ]
    if conf.mode != "read-only" and conf.writable:
        parts = []
        for i, d in enumerate(conf.writable):
            key = f"WRITABLE_ROOT_{i}"
            params.append((key, d))
            parts.append(f'(subpath (param "{key}"))')
        lines.append("(allow file-write* " + " ".join(parts) + ")")
        denies = []
        for i, p in enumerate(conf.protected):
            key = f"PROTECTED_{i}"
            params.append((key, p))
            denies += [f'(literal (param "{key}"))', f'(subpath (param "{key}"))']
        for i, d in enumerate(conf.writable):
            if conf.protected:
                # .git at any depth below a writable root, whatever the case (APFS ignores it)
                denies.append(f'(regex #"^{_sbpl_regex_escape(d)}/(.*/)?\\.[gG][iI][tT](/.*)?$")')
        if denies:
            lines.append("(deny file-write* " + " ".join(denies) + ")")
    lines += [
        "; signals only to processes of this sandbox",
        "(deny signal)",
        "(allow signal (target same-sandbox))",
    ]
    if not conf.network:
        lines += [
            "; no network: IP traffic denied in and out, local unix sockets allowed",
            '(deny network-outbound (remote ip "*:*"))',
            '(deny network-inbound (local ip "*:*"))',
            '(deny network-bind (local ip "*:*"))',
        ]
    return "\n".join(lines) + "\n", params


# -- what this machine has ---------------------------------------------------------------------

@lru_cache(maxsize=1)
def detect() -> Backend | None:
    """The sandbox this machine offers, proven by running a command under it; None if none."""
    if sys.platform == "darwin":
        return _detect_seatbelt()
    if sys.platform.startswith("linux"):
        return _detect_landlock() or _detect_bwrap()
    return None


def _detect_landlock() -> Backend | None:
    abi = landlock_abi()
    if abi < 1:
        return None
    import tempfile

    tmp = tempfile.mkdtemp(prefix="ds4-sandbox-probe-")
    try:
        out = subprocess.run([sys.executable, "-I", "-S", WRAPPER, "--write", tmp, "--probe", "--"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        report = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        report = None
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if not report or not report.get("blocks_writes") or not report.get("allows_writes"):
        return None
    ns = bool(report.get("namespaces"))
    why_not = report.get("namespace_error") or "unavailable"
    detail = f"Landlock ABI {abi}" + (", .git read-only (mount namespace)" if ns else
                                      f", .git writable (no user namespaces: {why_not})")
    return Backend("landlock", detail, abi=abi, namespaces=ns, features=report)


def _detect_bwrap() -> Backend | None:
    path = _which("bwrap")
    if not path:
        return None
    try:
        ok = subprocess.run(bwrap_argv(["true"], Confinement("read-only")), capture_output=True, timeout=30,
                            stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return Backend("bubblewrap", f"bubblewrap ({path})") if ok else None


def _detect_seatbelt() -> Backend | None:
    if not os.path.exists(SANDBOX_EXEC):
        return None
    b = Backend("seatbelt", "Seatbelt (sandbox-exec)")
    try:
        ok = subprocess.run(b.wrap(["/usr/bin/true"], Confinement("workspace-write", (os.path.realpath("/tmp"),),
                                                                  network=False)),
                            capture_output=True, timeout=30, stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return b if ok else None


# -- why a command failed ----------------------------------------------------------------------

_DENIED = ("permission denied", "operation not permitted", "read-only file system", "eacces", "eperm", "erofs",
           "sandbox", "landlock", "not permitted")
_OFFLINE = ("network is unreachable", "could not resolve host", "temporary failure in name resolution",
            "name or service not known", "nodename nor servname", "failed to establish a new connection",
            "connection refused", "no route to host", "getaddrinfo", "enotfound", "eai_again", "network unreachable")


def denial(output: str, code: int | None, conf: Confinement | None) -> str:
    """Why the sandbox probably stopped a failed command ("" when nothing says so). Like
    Codex, this reads the output: the kernel does not tell the parent what it refused."""
    if conf is None or code in (0, None):
        return ""
    if "ds4 sandbox:" in output:
        line = next(ln for ln in output.splitlines() if "ds4 sandbox:" in ln)
        return line.split("ds4 sandbox:", 1)[1].strip()
    low = output.lower()
    lines = [ln for ln in output.splitlines() if any(k in ln.lower() for k in _DENIED)]
    if lines:
        paths = _paths_in(lines)
        outside = [p for p in paths if not _writable(p, conf)]
        shown = (outside or paths)[:2]
        where = f" ({', '.join(shown)})" if shown else ""
        return f"a write the sandbox does not allow{where}: {conf.describe()}"
    if not conf.network and any(k in low for k in _OFFLINE):
        return "the network is off in the sandbox (--no-network)"
    return ""


def _paths_in(lines: list[str]) -> list[str]:
    import re

    out = []
    for ln in lines:
        for m in re.finditer(r"(?:(?<=[\s'\"`‘(])|^)(/[^\s'\"`’):]+|\.{0,2}/?[\w.-]+/[^\s'\"`’):]*)", ln):
            p = m.group(1).rstrip(".,;")
            if p and p not in out:
                out.append(p)
    return out


def _writable(path: str, conf: Confinement) -> bool:
    if conf.mode == "read-only":
        return False
    p = os.path.realpath(path)
    for pr in conf.protected:
        if p == pr or p.startswith(pr.rstrip("/") + "/"):
            return False
    return any(p == d or p.startswith(d.rstrip("/") + "/") for d in conf.writable) or not os.path.isabs(path)


if __name__ == "__main__":
    sys.exit(_wrapper_main(sys.argv[1:]))
