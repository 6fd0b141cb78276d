"""The exact text MLX compiles for our custom kernels, and the compilers that check it here.

CUDA. ``mx.fast.cuda_kernel`` assembles the source in C++ (MLX 0.32.3,
mlx/backend/cuda/custom_kernel.cpp, ``build_kernel``) and compiles it with NVRTC
(mlx/backend/cuda/jit_module.cpp, ``compile``) with MLX's device headers
(mlx/backend/cuda/device/*.cuh, embedded in libmlx.so as strings) and its bundled CCCL. MLX's
CPU build cannot do either, so ``cuda_source`` below mirrors ``build_kernel`` line for line, and
the rest comes from the pinned mlx-cuda-12 wheel itself, downloaded from PyPI at test time
(hash-checked) and never installed: its include folder, the device headers read out of its
libmlx.so (each header's name paired with its text through the same tables MLX hands NVRTC),
and every literal fragment our mirror emits, which must be in that libmlx.so
(``missing_fragments``). NVRTC and the CUDA headers come from the test extra
(nvidia-cuda-nvrtc-cu12, nvidia-cuda-runtime-cu12, the versions mlx-cuda-12 0.32.3 asks for).
A different MLX version fails tests/test_gpu_compile.py until this file is re-checked.

Metal. ``mx.fast.metal_kernel`` builds its source (mlx/backend/common/metal_kernel.cpp,
``write_signature``) in every MLX build, and prints it with ``verbose=True``; on a machine
without Metal it still does so while a function is exported (mx.export_function). So the
Metal text is MLX's own output, captured from its stdout (``metal_source``). MLX prepends its
Metal prelude (kernels/utils.h: metal_stdlib, ``using namespace metal``, bfloat) before handing
it to the Metal compiler; tests/metal_compat.h stands in for that prelude and the Metal
language, and libclang (test extra) parses the result as C++ (``metal_syntax``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MLX_VERSION = "0.32.3"
MLX_CUDA_WHEEL = f"mlx_cuda_12-{MLX_VERSION}-py3-none-manylinux_2_35_x86_64.whl"
MLX_CUDA_SHA256 = "0050fdc4ee7dacfc27942fd4542c469e2ba6c0b91f9e64a9822c6e00e2e75855"
HERE = Path(__file__).parent

# -- CUDA: the source mx.fast.cuda_kernel builds -----------------------------------------------

# custom_kernel.cpp: default_header, then the literal pieces of build_kernel.
CUDA_DEFAULT_HEADER = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
CUDA_NAMESPACE_OPEN = "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
CUDA_NAMESPACE_CLOSE = "\n}\n\n} // namespace mlx::core::cu\n"
# utils.cpp, dtype_to_cuda_type (the dtypes our kernels take).
CUDA_TYPES = {"bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
              "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
              "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double"}
# Every literal string cuda_source emits besides our own names and bodies: all must be in the
# pinned wheel's libmlx.so, or MLX's generator has changed under this mirror.
CUDA_FRAGMENTS = [CUDA_DEFAULT_HEADER, CUDA_NAMESPACE_OPEN, CUDA_NAMESPACE_CLOSE, "__global__ void ",
                  "    const __grid_constant__ Shape ", "    const __grid_constant__ Strides ",
                  "    const __grid_constant__ int ", "  constexpr int {} = {};\n", "custom_kernel_",
                  "mlx::core::cu::", "--device-as-default-execution-space", "--gpu-architecture={}_{}{}{}",
                  "--include-path={}", "cuda_runtime", "mlx/backend/cuda/device/utils.cuh"]


@dataclass(frozen=True)
class Arg:
    """What MLX's generators look at in an input array: its dtype name (MLX's), ndim, size."""

    dtype: str
    ndim: int
    size: int

    @classmethod
    def of(cls, a) -> "Arg":
        """Of an MLX or numpy array."""
        return cls(str(a.dtype).removeprefix("mlx.core."), a.ndim, a.size)


def cuda_source(name: str, input_names: list[str], inputs: list[Arg], output_names: list[str],
                output_dtypes: list[str], template: list[tuple[str, int]], header: str, source: str) -> tuple[str, str]:
    """(kernel name, source text) exactly as MLX 0.32.3's cuda_kernel builds them
    (template_arguments_hash and build_kernel in mlx/backend/cuda/custom_kernel.cpp; int
    template arguments only, which is all ours use)."""
    kernel_name = "custom_kernel_" + name + "".join(f"_{v}" for _, v in template)
    text = CUDA_DEFAULT_HEADER + header + CUDA_NAMESPACE_OPEN
    text += "__global__ void " + kernel_name + "(\n"
    for n, a in zip(input_names, inputs, strict=True):
        text += "    const " + CUDA_TYPES[a.dtype] + "* " + n + ",\n"
        if a.ndim > 0:
            if n + "_shape" in source:
                text += "    const __grid_constant__ Shape " + n + "_shape,\n"
            if n + "_strides" in source:
                text += "    const __grid_constant__ Strides " + n + "_strides,\n"
            if n + "_ndim" in source:
                text += "    const __grid_constant__ int " + n + "_ndim,\n"
    for i, (n, d) in enumerate(zip(output_names, output_dtypes, strict=True)):
        text += "    " + CUDA_TYPES[d] + "* " + n + (",\n" if i < len(output_names) - 1 else ") {\n")
    if template:
        text += "".join(f"  constexpr int {k} = {v};\n" for k, v in template) + "\n"
    text += source + CUDA_NAMESPACE_CLOSE
    return kernel_name, text


# -- the pinned mlx-cuda-12 wheel --------------------------------------------------------------

def cache_dir() -> Path:
    d = Path(os.environ.get("DS4_TEST_CACHE") or Path.home() / ".cache" / "ds4agent-tests")
    d.mkdir(parents=True, exist_ok=True)
    return d


def mlx_cuda_wheel() -> Path:
    """The wheel, downloaded once with pip (hash-checked) into the test cache."""
    whl = cache_dir() / MLX_CUDA_WHEEL
    if whl.exists() and hashlib.sha256(whl.read_bytes()).hexdigest() == MLX_CUDA_SHA256:
        return whl
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "req.txt"
        req.write_text(f"mlx-cuda-12=={MLX_VERSION} --hash=sha256:{MLX_CUDA_SHA256}\n")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--platform", "manylinux_2_35_x86_64", "--python-version", "3.11", "--implementation", "py",
                            "--require-hashes", "-r", str(req), "-d", tmp], capture_output=True, text=True, timeout=600)
        got = Path(tmp) / MLX_CUDA_WHEEL
        if r.returncode or not got.exists():
            raise RuntimeError(f"could not download {MLX_CUDA_WHEEL} from PyPI: {r.stderr.strip()[-500:]}")
        os.replace(got, whl)
    return whl


class _Elf:
    """Just enough of an ELF64 shared library to follow the pointer tables of its data."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not a little-endian ELF64 file")
        self.data = data
        phoff, = struct.unpack_from("<Q", data, 0x20)
        shoff, = struct.unpack_from("<Q", data, 0x28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
        self.loads = []
        for i in range(phnum):
            p_type, _, off, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                self.loads.append((vaddr, off, filesz))
        self.relative: dict[int, int] = {}  # address of a pointer -> address it points to
        for i in range(shnum):
            sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
            off, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 24)
            if sh_type == 4:  # SHT_RELA
                for k in range(size // 24):
                    r_offset, r_info, r_addend = struct.unpack_from("<QQq", data, off + 24 * k)
                    if r_info & 0xFFFFFFFF == 8:  # R_X86_64_RELATIVE
                        self.relative[r_offset] = r_addend

    def offset(self, vaddr: int) -> int:
        for va, off, size in self.loads:
            if va <= vaddr < va + size:
                return off + vaddr - va
        raise KeyError(hex(vaddr))

    def vaddr(self, offset: int) -> int:
        for va, off, size in self.loads:
            if off <= offset < off + size:
                return va + offset - off
        raise KeyError(hex(offset))

    def string(self, vaddr: int) -> bytes:
        o = self.offset(vaddr)
        return self.data[o:self.data.index(b"\0", o)]


def device_headers(libmlx: bytes, known: dict[str, str]) -> dict[str, str]:
    """MLX's CUDA device headers as NVRTC gets them from libmlx.so (jit_module.cpp: the
    g_include_names and g_headers tables passed to nvrtcCreateProgram): name -> text.
    ``known`` holds headers the wheel also ships as files (config.h): the pairing must give
    exactly their text (as bin2h.cmake embeds it: the copyright sign as two spaces)."""
    elf = _Elf(libmlx)
    prefix = b"mlx/backend/cuda/device/"
    anchor = libmlx.find(b"\0" + prefix + b"utils.cuh\0") + 1
    slot = [a for a, t in elf.relative.items() if t == elf.vaddr(anchor)]
    if anchor <= 0 or len(slot) != 1:
        raise ValueError("libmlx.so: the include-name table of the CUDA JIT was not found")
    def name_at(slot: int) -> str | None:
        try:
            s = elf.string(elf.relative[slot])
        except KeyError:
            return None
        return s.decode() if s.startswith(prefix) else None

    names_at = slot[0]
    while name_at(names_at - 8):
        names_at -= 8
    names = []
    while (n := name_at(names_at + 8 * len(names))) is not None:
        names.append(n)
    # The header table has as many pointers, each to a header text; it sits next to the names.
    for table in range(names_at - 8 * (len(names) + 8), names_at + 8 * (len(names) + 8), 8):
        ptrs = [elf.relative.get(table + 8 * k) for k in range(len(names))]
        if None in ptrs or table == names_at:
            continue
        try:
            texts = [elf.string(p) for p in ptrs]
        except KeyError:
            continue
        found = {n: t.decode() for n, t in zip(names, texts)}
        if all(t.startswith(b"// Copyright") for t in texts) and all(
                found.get(n) == k.replace("\u00a9", "  ") for n, k in known.items()):
            return found
    raise ValueError("libmlx.so: the header table of the CUDA JIT was not found")


@dataclass
class MlxCuda:
    include: Path  # the wheel's mlx/include (MLX's bundled headers, cccl/ inside)
    headers: dict[str, str]  # the embedded device headers, by include name
    missing_fragments: list[str]  # CUDA_FRAGMENTS not found in libmlx.so (must be empty)


def mlx_cuda() -> MlxCuda:
    whl = mlx_cuda_wheel()
    root = cache_dir() / f"mlx-cuda-12-{MLX_VERSION}"
    with zipfile.ZipFile(whl) as z:
        if not (root / ".complete").exists():
            for info in z.infolist():
                if info.filename.startswith("mlx/include/"):
                    z.extract(info, root)
            (root / ".complete").write_text(MLX_CUDA_SHA256)
        lib = z.read("mlx/lib/libmlx.so")
        config = "mlx/backend/cuda/device/config.h"
        known = {config: z.read("mlx/include/" + config).decode()}
    missing = [f for f in CUDA_FRAGMENTS if f.encode() not in lib]
    return MlxCuda(root / "mlx" / "include", device_headers(lib, known), missing)


# -- NVRTC -------------------------------------------------------------------------------------

def _nvidia_dir(sub: str) -> Path:
    import nvidia  # namespace package of the nvidia-*-cu12 wheels (test extra)

    for p in nvidia.__path__:
        if (Path(p) / sub).exists():
            return Path(p) / sub
    raise FileNotFoundError(f"nvidia/{sub} (install the test extra: pip install -e '.[test]')")


class Nvrtc:
    """NVRTC through ctypes, called the way MLX's jit_module.cpp calls it."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(str(_nvidia_dir("cuda_nvrtc") / "lib" / "libnvrtc.so.12"))
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.lib.nvrtcGetLoweredName.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
        self.cuda_include = _nvidia_dir("cuda_runtime") / "include"

    def version(self) -> tuple[int, int]:
        a, b = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
        return a.value, b.value

    def compile(self, text: str, kernel: str, arch: str, mlx: MlxCuda, extra: tuple[str, ...] = ()) -> "Compiled":
        """Compile ``text`` for ``arch`` (e.g. sm_80, sm_90a: what MLX picks for compute
        capability 8.0 and 9.0) with MLX's options and headers; ``kernel`` is the name MLX
        asks NVRTC to lower (mlx::core::cu::<kernel name>)."""
        lib, prog = self.lib, ctypes.c_void_p()
        names, texts = list(mlx.headers), list(mlx.headers.values())
        check = self._check
        check(lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"ds4_kernel.cu", len(names),
                                     (ctypes.c_char_p * len(texts))(*[t.encode() for t in texts]),
                                     (ctypes.c_char_p * len(names))(*[n.encode() for n in names])), "create")
        try:
            check(lib.nvrtcAddNameExpression(prog, kernel.encode()), "name")
            opts = ["--device-as-default-execution-space", f"--gpu-architecture={arch}",
                    f"--include-path={mlx.include}", f"--include-path={mlx.include / 'cccl'}",
                    f"--include-path={self.cuda_include}", *extra]
            rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
            size = ctypes.c_size_t()
            check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
            log = ctypes.create_string_buffer(size.value + 1)
            check(lib.nvrtcGetProgramLog(prog, log), "log")
            if rc:
                return Compiled(False, log.value.decode(errors="replace"), 0, None)
            lowered = ctypes.c_char_p()
            check(lib.nvrtcGetLoweredName(prog, kernel.encode(), ctypes.byref(lowered)), "lowered name")
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
            return Compiled(True, log.value.decode(errors="replace"), size.value, lowered.value.decode())
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"nvrtc {what}: {self.lib.nvrtcGetErrorString(rc).decode()}")


@dataclass
class Compiled:
    ok: bool
    log: str
    cubin_bytes: int
    symbol: str | None

    @property
    def clean(self) -> bool:
        """Compiled, and neither the front end nor ptxas said anything (warnings are errors)."""
        return self.ok and not self.log.strip()


# -- Metal: the source mx.fast.metal_kernel builds ---------------------------------------------

def metal_source(name: str, input_names: list[str], inputs: list[Arg], output_names: list[str],
                 output_dtypes: list[str], template: list[tuple[str, int]], header: str, source: str,
                 grid=(1, 1, 1), threadgroup=(1, 1, 1)) -> str:
    """MLX's own Metal source for one instantiation: metal_kernel called with verbose=True
    while exporting a function (MLX generates the source then, even without Metal), its
    stdout captured at the file-descriptor level. Only an input's dtype, ndim and whether it has
    fewer than 8 elements shape the text (write_signature), so small stand-in arrays are used."""
    import mlx.core as mx

    kernel = mx.fast.metal_kernel(name=name, input_names=input_names, output_names=output_names,
                                  source=source, header=header)
    arrays = [mx.zeros((min(a.size, 8),) if a.ndim else (), dtype=getattr(mx, a.dtype)) for a in inputs]

    def fn(*xs):
        return kernel(inputs=list(xs), grid=grid, threadgroup=threadgroup, output_shapes=[(1,)] * len(output_names),
                      output_dtypes=[getattr(mx, d) for d in output_dtypes], template=template, verbose=True)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stdout"
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(out, "wb") as f:
                os.dup2(f.fileno(), 1)
                mx.export_function(str(Path(tmp) / "k.mlxfn"), fn, *arrays)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        printed = out.read_text()
    start = printed.index("```\n") + 4
    return printed[start:printed.index("\n```", start)]


METAL_COMPAT = HERE / "metal_compat.h"
# Clang flags of the Metal check: C++17 with nothing from the host (no libc, no C++ library:
# Metal has neither), the Metal branch of our header selected, every warning an error except
# the Metal attributes C++ does not know ([[kernel]], [[buffer(n)]], ...).
METAL_FLAGS = ["-x", "c++", "-std=c++17", "-nostdinc", "-nostdinc++", "-fsyntax-only", "-D__METAL_VERSION__=310",
               "-Wall", "-Wextra", "-Wconversion", "-Wno-unknown-attributes", "-Werror"]


# MLX's explicit instantiation of a templated kernel (metal_kernel in metal_kernel.cpp):
#   template [[host_name("NAME")]] [[kernel]] decltype(NAME<ARGS>) NAME<ARGS>;
# C++ allows no attributes after `template` there; metal_syntax drops exactly these two and
# keeps the instantiation, which is what type-checks the body with the launch's constants.
MLX_INSTANTIATION = re.compile(r'^template \[\[host_name\("(\w+)"\)\]\] \[\[kernel\]\] (decltype\(\1<[-0-9, a-z_]*>\) \1<[-0-9, a-z_]*>;)$',
                               re.M)


def metal_syntax(text: str) -> list[str]:
    """Diagnostics of clang (libclang) on ``text`` after tests/metal_compat.h: empty when it
    parses and type-checks cleanly. The one C++-incompatible line MLX writes (the attributes on
    its explicit instantiation) is rewritten, nothing else."""
    from clang import cindex

    templated = "template <" in text.split("[[kernel]] void ", 1)[0]
    if len(MLX_INSTANTIATION.findall(text)) != int(templated) or text.count("template [[") != int(templated):
        raise ValueError("MLX's explicit instantiation line is not in the form this check knows")
    text = MLX_INSTANTIATION.sub(r"template \2", text)
    name = "ds4_kernel.metal.cpp"
    tu = cindex.Index.create().parse(name, args=METAL_FLAGS + ["-include", str(METAL_COMPAT)],
                                     unsaved_files=[(name, text)])
    return [f"{d.location.file}:{d.location.line}:{d.location.column}: {d.spelling}" for d in tu.diagnostics
            if d.severity >= cindex.Diagnostic.Warning]


# -- the instantiations of recorded launches ---------------------------------------------------

def _kernel_args(inputs) -> list[Arg]:
    return [Arg(d, len(shape), int(np.prod(shape, dtype=np.int64))) for d, shape in inputs]


def instance_key(call) -> tuple:
    """What decides the generated source of a recorded launch, on either backend: the kernel,
    its template arguments, and per input the dtype, whether it is a scalar, and whether it
    has fewer than 8 elements (write_signature puts those in Metal's constant memory)."""
    name, template, inputs = call
    return name, tuple(template), tuple((a.dtype, a.ndim == 0, a.size < 8) for a in _kernel_args(inputs))


def cuda_instances(calls) -> dict[str, tuple[str, str]]:
    """The distinct CUDA sources of recorded launches (gpu_harness: (name, template, inputs)):
    text -> (the name expression MLX has NVRTC lower, a label)."""
    from ds4agent.engine.kernels import gpu

    out: dict[str, tuple[str, str]] = {}
    for name, template, inputs in calls:
        ins, outs, body = gpu.source(name.removeprefix("ds4_"), "cuda")
        kname, text = cuda_source(name, ins, _kernel_args(inputs), outs, ["float32"], list(template), gpu.HEADER, body)
        out.setdefault(text, ("mlx::core::cu::" + kname, kname))
    return out


def metal_instances(calls) -> dict[str, str]:
    """The distinct Metal sources of recorded launches, from MLX's own generator: text -> label."""
    from ds4agent.engine.kernels import gpu

    seen: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for call in calls:
        name, template, inputs = call
        args = _kernel_args(inputs)
        key = instance_key(call)
        if key in seen:
            continue
        ins, outs, body = gpu.source(name.removeprefix("ds4_"), "metal")
        text = metal_source(name, ins, args, outs, ["float32"], list(template), gpu.HEADER, body)
        seen[key] = text
        out.setdefault(text, text[text.index("[[kernel]] void ") + 16:].split("(", 1)[0])
    return out


def _compile_job(job) -> "Compiled":
    text, symbol, arch, mlx, extra = job
    global _WORKER_NVRTC
    if _WORKER_NVRTC is None:
        _WORKER_NVRTC = Nvrtc()
    return _WORKER_NVRTC.compile(text, symbol, arch, mlx, extra)


_WORKER_NVRTC: Nvrtc | None = None


def compile_many(jobs: list[tuple[str, str, str]], mlx: MlxCuda, extra: tuple[str, ...] = (),
                 workers: int | None = None) -> list["Compiled"]:
    """Compile (text, symbol, arch) jobs in worker processes (NVRTC serialises the compiles of
    one process: threads do not help)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or min(len(jobs), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_compile_job, [(t, s, a, mlx, extra) for t, s, a in jobs]))
