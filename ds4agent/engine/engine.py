"""Engine.open: a model file, a backend, a context size -> sessions."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import mlx.core as mx

from ..modelfile.config import ModelConfig, check_tensors, claims_flash, config_from_gguf, validate_flash
from ..modelfile.gguf import GGUFError, GGUFFile
from ..modelfile.tokenizer import Tokenizer
from .kernels import KernelError
from .kernels import select as select_kernels
from .model import Model, Options
from .session import Session
from .weights import Weights

# "npu" is the Ascend module (engine/ascend/: PyTorch + torch_npu), never chosen by "auto".
BACKENDS = ("auto", "cpu", "metal", "cuda", "npu")


class EngineError(ValueError):
    """A model or backend that cannot be used; one line."""


@dataclass(frozen=True)
class EngineInfo:
    path: str
    config: ModelConfig
    backend: str
    ctx: int
    qat_sim: bool
    quant_mix: dict[str, int]  # GGML type name -> bytes
    is_flash: bool
    expert_quant_bits: int  # 4 when layer 0's routed experts are Q4_K, else 2 (ds4's convention)
    fingerprint: int  # identifies these exact weights (see _fingerprint)
    kernels: str = "reference"  # the implementation of the heavy products (engine/kernels)
    kernel_note: str | None = None  # why the fast kernels (or some of their operations) were not used
    kernel_check: object = None  # kernels/check.CheckReport of the self-check at open, when it ran
    # Said at open: on npu one line per device (its layers and memory); on metal and cuda what the
    # GPU kernels will hold on the device against its limit (kernels/resident.py).
    devices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.config.name or "deepseek4"


def _fingerprint(f: GGUFFile) -> int:
    """A 32-bit identity of the weights: the tensor directory plus the first 4 KiB of a few
    tensors (an imatrix build differs from a plain one only in quantised bytes). Reads a handful
    of pages, never whole tensors."""
    h = hashlib.sha1()
    for t in f.tensors.values():
        h.update(f"{t.name}:{t.type}:{t.dims}".encode())
    for name in ("token_embd.weight", "output.weight", "blk.0.ffn_gate_exps.weight", "blk.0.attn_q_a.weight"):
        if name in f.tensors:
            h.update(bytes(f.raw(name)[:4096]))
    return int.from_bytes(h.digest()[:4], "little") or 1  # 0 means "unknown" (ds4 files)


def _pick_backend(requested: str) -> str:
    if requested not in BACKENDS:
        raise EngineError(f"unknown backend {requested!r} (choose from {', '.join(BACKENDS)})")
    metal = mx.metal.is_available()
    cuda = hasattr(mx, "cuda") and mx.cuda.is_available()
    if requested == "auto":
        return "metal" if metal else "cuda" if cuda else "cpu"
    if requested == "metal" and not metal:
        raise EngineError("the metal backend is not available on this machine (needs Apple Silicon and MLX's Metal build)")
    if requested == "cuda" and not cuda:
        raise EngineError("the cuda backend is not available (install ds4agent[cuda12] or [cuda13] on an NVIDIA machine)")
    return requested



def _closing_on_error(f, user_error: type[Exception], make):
    """``make()``, closing the model file ``f`` if it fails: ``user_error`` (a kernel or device
    problem the user can act on) becomes one EngineError message, anything else propagates."""
    try:
        return make()
    except user_error as e:
        f.close()
        raise EngineError(str(e)) from None
    except Exception:
        f.close()
        raise


def _read_model(path: str | os.PathLike[str]) -> tuple[GGUFFile, ModelConfig, Tokenizer, bool]:
    """The model file opened and checked, its config, its tokenizer, whether it claims Flash."""
    f = GGUFFile(path)
    try:
        cfg = config_from_gguf(f)
        flash = claims_flash(cfg)
        problems = validate_flash(f, cfg) if flash else check_tensors(f, cfg)
        if problems:
            more = f" (and {len(problems) - 1} more; see 'ds4 inspect')" if len(problems) > 1 else ""
            raise EngineError(f"{f.path}: {problems[0]}{more}")
        tok = Tokenizer.from_gguf(f)
        if tok.vocab_size != cfg.n_vocab:
            raise EngineError(f"{f.path}: {tok.vocab_size} vocabulary strings for {cfg.n_vocab} embedding rows")
        return f, cfg, tok, flash
    except Exception:
        f.close()
        raise


def _info(f: GGUFFile, cfg: ModelConfig, backend: str, ctx: int, qat_sim: bool, is_flash: bool, kernels: str,
          note: str | None, check: object, devices: tuple[str, ...] = ()) -> EngineInfo:
    mix: dict[str, int] = {}
    for t in f.tensors.values():
        mix[t.type_name] = mix.get(t.type_name, 0) + t.nbytes
    bits = 4 if f.tensors["blk.0.ffn_gate_exps.weight"].type_name == "Q4_K" else 2
    return EngineInfo(f.path, cfg, backend, ctx, qat_sim, mix, is_flash, bits, _fingerprint(f), kernels, note, check,
                      devices)


def _device_fit(f: GGUFFile, cfg: ModelConfig, backend: str, ctx: int, kernels: str | None) -> tuple[str, ...]:
    """On metal and cuda with GPU kernels: the line saying what will be resident on the device
    against its limit, or EngineError (one line) when the model cannot fit."""
    from .. import settings
    from .kernels import resident

    if backend not in ("metal", "cuda") or (kernels or settings.kernels_choice()) not in ("auto", "metal", "cuda", "kquant"):
        return ()
    limit, buffer, what = resident.device_limits(backend)
    try:
        return (resident.check(resident.plan(f, cfg, ctx), limit, buffer, what, backend),)
    except resident.DeviceMemoryError as e:
        raise EngineError(f"{e}; --kernels reference keeps the routed experts in the file instead (much slower)") from None


class Engine:
    def __init__(self, f: GGUFFile, cfg: ModelConfig, tok: Tokenizer, backend: str, ctx: int, qat_sim: bool,
                 is_flash: bool, kernels: str | None = None) -> None:
        self._file = f
        self.tokenizer = tok
        self.ctx = ctx
        weights = Weights(f, cfg)
        memory = _device_fit(f, cfg, backend, ctx, kernels)  # before anything is copied to the device
        impl, note = select_kernels(backend, weights, kernels)
        self._model = Model(weights, Options(qat_sim=qat_sim), impl)
        self.info = _info(f, cfg, backend, ctx, qat_sim, is_flash, impl.name, note, getattr(impl, "check", None), memory)

    _session_class = Session  # the npu backend's sessions bring its device tensors home to save

    @classmethod
    def open(cls, path: str | os.PathLike[str], backend: str = "auto", ctx: int = 32768,
             qat_sim: bool = True, kernels: str | None = None, devices: str | None = None,
             w8a8: bool = False) -> "Engine":
        """Open a DeepSeek V4 GGUF. Reads the header and vocabulary only; weights stay in the
        mmap and are materialised when first used. ``kernels`` picks the implementation of the
        heavy products (default $DS4_KERNELS or auto: the backend's fast kernels when usable).
        ``devices`` ("0,1", "cpu", ...) and ``w8a8`` are the npu backend's (docs/ascend.md)."""
        if ctx < 2:
            raise EngineError(f"context size must be at least 2 tokens, got {ctx}")
        if backend == "npu":
            return cls._open_npu(path, ctx, qat_sim, kernels, devices, w8a8)
        if devices is not None or w8a8:
            raise EngineError("--devices and --w8a8 are options of --backend npu")
        chosen = _pick_backend(backend)
        mx.set_default_device(mx.cpu if chosen == "cpu" else mx.gpu)
        f, cfg, tok, flash = _read_model(path)
        return _closing_on_error(f, KernelError, lambda: cls(f, cfg, tok, chosen, ctx, qat_sim, flash, kernels))

    @classmethod
    def _open_npu(cls, path, ctx: int, qat_sim: bool, kernels: str | None, devices: str | None,
                  w8a8: bool) -> "Engine":
        """The Ascend module (engine/ascend/) behind the same Engine: its model runs the
        sessions, the model file and tokenizer are read here as for MLX."""
        from .ascend.devices import AscendError, load_torch, parse_devices

        try:
            names = parse_devices(devices)
            load_torch(names)  # what is missing is said before the model file is read
        except AscendError as e:
            raise EngineError(str(e)) from None
        from .ascend.engine import build

        f, cfg, tok, flash = _read_model(path)
        built = _closing_on_error(f, AscendError, lambda: build(f, cfg, names, ctx, qat_sim, kernels, w8a8))
        e = cls.__new__(cls)
        e._file, e.tokenizer, e.ctx, e._model = f, tok, ctx, built.model
        e._session_class = built.session_class
        e.info = _info(f, cfg, "npu", ctx, qat_sim, flash, built.kernels, built.note, None, built.devices)
        return e

    def session(self, ctx: int | None = None) -> Session:
        """A new, empty session; ``ctx`` defaults to the context the engine was opened with."""
        return self._session_class(self._model, self.tokenizer, self.info, self.ctx if ctx is None else ctx)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Engine", "EngineError", "EngineInfo", "GGUFError"]
