"""Compile cpu.c once per machine and load it with ctypes.

The library is built for the CPU it runs on (-march=native: AVX-512, AVX2 or NEON dot products)
and cached under the ds4agent home keyed by the source, the compiler, the flags and the CPU's
feature list, so a home directory shared between machines never loads code built for another
CPU. No compiler, or a failed build, means no native kernels: the caller falls back to the
MLX reference path and says so once.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ... import settings

SOURCE = Path(__file__).with_name("cpu.c")
# -ffp-contract=off: the dequantisers must not fuse multiply-adds, or they stop matching gguf
# bit for bit; the dot products use explicit FMA intrinsics instead.
BASE_FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]


class BuildError(RuntimeError):
    pass


def _cache_dir() -> Path:
    return settings.kernels_dir()


def sources() -> list[Path]:
    """cpu.c and the parts it includes (one translation unit): what a build is keyed by."""
    parts = re.findall(rb'^#include "([a-z_0-9]+\.c)"', SOURCE.read_bytes(), flags=re.M)
    return [SOURCE] + [SOURCE.with_name(p.decode()) for p in parts]


def cpu_identity() -> str:
    """The CPU's model name and feature flags: what code built or tuned here is keyed by."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        flags = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
        model = next((ln for ln in text.splitlines() if ln.startswith("model name")), "")
        return model + flags
    except OSError:
        return platform.processor() + platform.machine()


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang, whichever is found first."""
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


class CompileFailed(BuildError):
    """The compiler refused a source: the message is its last line, ``log`` all it printed."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def compile_shared(cc: str, flags: list[str], source: Path, out: Path) -> None:
    """Compile ``source`` into the shared library ``out``, atomically (a concurrent process
    sees the old file or the whole new one); CompileFailed when the compiler refuses it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True)
        if r.returncode:
            log = r.stderr.strip()
            raise CompileFailed(log.splitlines()[-1] if log else f"{cc} failed", log)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build() -> ctypes.CDLL:
    """The compiled kernel library for this machine, building it on first use."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (install gcc or clang, or set CC)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    src = b"".join(p.read_bytes() for p in sources())
    errors: list[str] = []
    # OpenMP spreads rows over every core; without it (e.g. Apple clang) the kernels run on one.
    for flags in (BASE_FLAGS + ["-fopenmp"], BASE_FLAGS):
        key = hashlib.sha1(src + version.encode() + " ".join(flags).encode() + cpu_identity().encode()).hexdigest()[:16]
        path = _cache_dir() / f"cpu-{key}.so"
        failed = path.with_suffix(".failed")  # this compiler cannot build these flags: do not retry
        if failed.exists():
            errors.append(failed.read_text(errors="replace").strip() or "build failed")
            continue
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:  # a damaged cache entry: build it again
                path.unlink(missing_ok=True)
        if not errors:
            print("ds4: building the CPU kernels for this machine (once, a few seconds)", file=sys.stderr, flush=True)
        try:
            compile_shared(cc, flags, SOURCE, path)
            return ctypes.CDLL(str(path))
        except BuildError as e:
            errors.append(str(e))
            try:
                failed.write_text(str(e))
            except OSError:
                pass
        except OSError as e:  # an unwritable cache: the reason is the same for every flag set
            raise BuildError(f"could not build the CPU kernels: {e}") from None
    raise BuildError(f"could not build the CPU kernels: {errors[-1]}")
