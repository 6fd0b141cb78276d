"""Engine.open: a model file, a backend, a context size -> sessions."""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from ..modelfile.config import ModelConfig, check_tensors, claims_flash, config_from_gguf, validate_flash
from ..modelfile.gguf import GGUFError, GGUFFile
from ..modelfile.tokenizer import Tokenizer
from . import expertpool
from .choices import BACKENDS
from .errors import EngineError
from .expertpool import ExpertPool
from .info import EngineInfo
from .kernels import KernelError
from .kernels import select as select_kernels
from .model import Model, Options
from .session import Session
from .weights import Weights


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
        raise EngineError("the metal backend is not available on this machine "
                          "(needs Apple Silicon and MLX's Metal build)")
    if requested == "cuda" and not cuda:
        raise EngineError("the cuda backend is not available "
                          "(install ds4agent[cuda12] or [cuda13] on an NVIDIA machine)")
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
    bits = 4 if f.tensors["blk.0.ffn_gate_exps.weight"].type_name in ("Q4_K", "MXFP4") else 2
    return EngineInfo(f.path, cfg, backend, ctx, qat_sim, mix, is_flash, bits, _fingerprint(f), kernels, note, check,
                      devices)


def _device_fit(f: GGUFFile, cfg: ModelConfig, backend: str, ctx: int, kernels: str | None,
                pool: ExpertPool | None = None) -> tuple[str, ...]:
    """On metal and cuda with GPU kernels: the line saying what will be resident on the device
    against its limit (with ``pool`` in device memory: the pool in place of the routed experts),
    or EngineError (one line) when the model cannot fit."""
    from .. import settings
    from .kernels import resident

    chosen = kernels or settings.kernels_choice()
    if backend not in ("metal", "cuda") or chosen not in ("auto", "metal", "cuda", "kquant"):
        return ()
    limit, buffer, what = resident.device_limits(backend)
    need = resident.plan(f, cfg, ctx, pool.allocated if pool is not None else None)
    try:
        return (resident.check(need, limit, buffer, what, backend),)
    except resident.DeviceMemoryError as e:
        hint = "a smaller --memory-budget" if pool is not None else \
            "--memory-budget streams routed experts through a pool that fits"
        raise EngineError(f"{e}; {hint}") from None


# The kernel sets that read routed experts through the expert pool, and where its slots are:
# in the process's memory ("host"), or in GPU memory that the reads fill and the kernels read in
# place ("device"). mlx-kquant's gather kernels read one contiguous tensor per layer and the
# reference gathers from the mapped file: they keep every expert where it is.
STREAMING = {"cpu": "host", "cpu-exact": "host", "gpu-host": "host", "metal": "device", "cuda": "device"}
# The kernels that find each expert by its own address (ExpertRows), so that the pool may read
# past the page cache and leave a matrix at its offset within a page of the file; the GPU
# kernels address a slot plus one offset per matrix (expertpool.ExpertPool.offsets).
BY_ADDRESS = ("cpu", "cpu-exact")


def _chosen_kernels(backend: str, kernels: str | None) -> str:
    from .. import settings

    chosen = kernels or settings.kernels_choice()
    return backend if chosen == "auto" else chosen


def _pool_memory(backend: str, kernels: str | None) -> str | None:
    """Where the expert pool's slots would be for these kernels ("host", "device"), or None
    when they do not stream. Auto on Metal weighs kquant too, but not when experts stream."""
    return STREAMING.get(_chosen_kernels(backend, kernels))


def _expert_pool(f: GGUFFile, cfg: ModelConfig, backend: str, ctx: int, kernels: str | None,
                 requested: int | str | None, profile: str | os.PathLike[str] | None = None,
                 ) -> tuple[ExpertPool | None, tuple[str, ...]]:
    """The expert pool when routed experts must stream from the file (engine/expertpool.py),
    and the line said at open. ``requested``: bytes, "auto" or None ($DS4_MEMORY_BUDGET, config,
    else auto). Auto gives the pool what the machine (or the GPU) has left after the dense
    weights, the KV at ``ctx`` and a prefill's working memory, and streams nothing when every
    expert fits too. ``profile``: a popularity profile whose most used experts the pool starts
    reading at once."""
    pool, lines = _expert_pool_sized(f, cfg, backend, ctx, kernels, requested)
    if profile is None:
        return pool, lines
    if pool is None:
        return None, (*lines, f"expert profile {profile}: not needed, no expert streams")
    try:
        uses = expertpool.load_profile(profile, _fingerprint(f), (cfg.n_layer, cfg.n_expert))
        n = pool.preload(uses)
    except expertpool.PoolError as e:
        pool.close()
        raise EngineError(str(e)) from None
    return pool, (*lines, f"expert profile {profile}: reading its {n} most used experts")


def _streaming_budget(f: GGUFFile, cfg: ModelConfig, memory: str | None, backend: str, ctx: int,
                      requested: int | str | None) -> tuple[int | None, str]:
    """(the pool's budget, or None when nothing streams; what to say about it) for a pool in
    ``memory`` ("host", "device"; None: the kernels do not stream). EngineError, one line, for
    a budget that cannot work."""
    from .. import settings
    from .kernels import resident

    try:
        requested = settings.memory_budget_choice() if requested is None else (
            settings.parse_budget(requested) if isinstance(requested, str) else requested)
    except settings.SettingsError as e:
        raise EngineError(str(e)) from None
    need = resident.plan(f, cfg, ctx)
    gib = expertpool.size_text
    if memory is None:
        if requested == "auto":
            return None, "routed experts where the kernels keep them (these kernels do not stream experts)"
        raise EngineError(f"--memory-budget streams routed experts through the {', '.join(STREAMING)} kernels; the "
                          "kernels chosen here keep every expert where it is")
    buffer = None
    if memory == "device":
        available, buffer, what = resident.device_limits(backend)
        working = resident.WORKING_BYTES
    else:
        available, what = expertpool.available_memory()
        working = expertpool.HOST_WORKING
    if requested == "auto":
        if available is None:
            return None, ""
        budget = available - need.dense - need.kv - working
        if need.experts <= budget:
            return None, (f"every routed expert fits: {gib(need.experts)} in the {gib(budget)} that {what} "
                          f"({gib(available)}) leaves after dense weights, KV and working memory; nothing streams")
        if budget < expertpool.slot_bytes(f, cfg) * cfg.n_expert_used:
            raise EngineError(f"the model does not fit: {what} is {gib(available)}, and the dense weights "
                              f"({gib(need.dense)}), the KV at {ctx} tokens ({gib(need.kv)}) and a prefill's working "
                              f"memory ({gib(working)}) leave less than one layer's experts; a smaller --ctx frees KV")
        said = f"auto: {what} {gib(available)} less dense weights, KV and working memory"
        if buffer and budget > buffer:  # the slots are one device array
            budget, said = buffer, f"{said}, down to one {backend} buffer's {gib(buffer)}"
        return budget, said
    if need.experts <= requested:
        return None, (f"memory budget {gib(requested)}: every routed expert fits ({gib(need.experts)}); they stay "
                      "where the kernels keep them")
    if requested < expertpool.slot_bytes(f, cfg):
        raise EngineError(f"a memory budget of {gib(requested)} holds no routed expert (one takes "
                          f"{gib(expertpool.slot_bytes(f, cfg))})")
    if buffer and requested > buffer:
        raise EngineError(f"a memory budget of {gib(requested)} is more than one {backend} buffer may hold "
                          f"({gib(buffer)})")
    return int(requested), "--memory-budget"


def _expert_pool_sized(f: GGUFFile, cfg: ModelConfig, backend: str, ctx: int, kernels: str | None,
                       requested: int | str | None) -> tuple[ExpertPool | None, tuple[str, ...]]:
    from .. import settings

    memory = _pool_memory(backend, kernels)
    budget, said = _streaming_budget(f, cfg, memory, backend, ctx, requested)
    if budget is None:  # auto says nothing at open when nothing streams; a given budget does
        return None, (said,) if said and requested not in (None, "auto") else ()
    allocate = None
    if memory == "device":
        from .kernels.resident import device_buffer

        allocate = device_buffer
    try:
        direct = settings.pool_direct() and _chosen_kernels(backend, kernels) in BY_ADDRESS
        pool = expertpool.ExpertPool(f, cfg, budget, policy=settings.pool_policy(), allocate=allocate, direct=direct)
    except (expertpool.PoolError, ValueError) as e:  # resident.DeviceMemoryError is a ValueError
        raise EngineError(str(e)) from None
    total = cfg.n_layer * cfg.n_expert
    where = f"in {backend} memory, " if memory == "device" else ""
    line = (f"expert streaming: {pool.slots} of {total} routed experts resident ({where}"
            f"{expertpool.size_text(pool.allocated)} of {expertpool.size_text(expertpool.expert_bytes(f, cfg))}; "
            f"{said}), the rest read from the file as routed; dense weights "
            f"{expertpool.lock_dense(f) if memory == 'host' else 'on the device'}")
    return pool, (line,)


def streaming_plan(path: str | os.PathLike[str], ctx: int = 32768, memory_budget: int | str | None = None) -> str:
    """What the CPU kernels would keep resident and what they would stream for this model file
    on this machine (``ds4 inspect``): reads the header only, allocates nothing."""
    f, cfg, _, _ = _read_model(path)
    try:
        budget, said = _streaming_budget(f, cfg, "host", "cpu", ctx, memory_budget)
        if budget is None:
            return said
        slots = expertpool.slots_for(f, cfg, budget)
        return (f"{slots} of {cfg.n_layer * cfg.n_expert} routed experts resident at a time, the rest streamed "
                f"from the file ({said}; at --ctx {ctx})")
    finally:
        f.close()


@dataclass(frozen=True)
class Parts:
    """What a backend builds over an opened, checked model file. Engine takes these and nothing
    else: each backend (MLX below, the Ascend module, a distributed group) returns its parts,
    and nobody sets an Engine's fields from outside."""

    file: GGUFFile
    tokenizer: Tokenizer
    info: EngineInfo
    # Runs the forward pass and owns the state's layout: Model (MLX, CPU kernels),
    # ascend.model.AscendModel, distributed.Distributed. Sessions call forward(ids, state),
    # empty_state(), for_snapshot(state) and from_snapshot(state) on it.
    model: object
    session_class: type[Session] = Session
    on_close: Callable[[], None] | None = None  # runs before the model file closes
    pool: ExpertPool | None = None  # where routed experts stream through, when they do


def mlx_parts(f: GGUFFile, cfg: ModelConfig, tok: Tokenizer, backend: str, ctx: int, qat_sim: bool,
              is_flash: bool, kernels: str | None, memory_budget: int | str | None = None,
              expert_profile: str | os.PathLike[str] | None = None) -> Parts:
    """The MLX engine's parts over an opened model file on ``backend`` (as _pick_backend gave
    it): weights (with the expert pool when experts stream), the kernels (checked at open where
    they need it), the model."""
    pool, streaming = _expert_pool(f, cfg, backend, ctx, kernels, memory_budget, expert_profile)
    try:
        memory = _device_fit(f, cfg, backend, ctx, kernels, pool)  # before anything is copied to the device
        weights = Weights(f, cfg, pool)
        impl, note = select_kernels(backend, weights, kernels)
        if pool is not None and impl.name not in STREAMING:
            raise EngineError(f"expert streaming needs kernels that read the pool ({', '.join(STREAMING)}); the "
                              f"{impl.name} kernels were chosen here ({note})")
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    model = Model(weights, Options(qat_sim=qat_sim), impl)
    info = _info(f, cfg, backend, ctx, qat_sim, is_flash, impl.name, note, getattr(impl, "check", None),
                 memory + streaming)
    return Parts(f, tok, info, model, on_close=pool.close if pool is not None else None, pool=pool)


def _npu_parts(path, ctx: int, qat_sim: bool, kernels: str | None, devices: str | None, w8a8: bool) -> Parts:
    """The Ascend module (engine/ascend/) behind the same Engine: its model runs the sessions,
    the model file and tokenizer are read here as for MLX."""
    from .ascend.devices import AscendError, load_torch, parse_devices

    try:
        names = parse_devices(devices)
        load_torch(names)  # what is missing is said before the model file is read
    except AscendError as e:
        raise EngineError(str(e)) from None
    from .ascend.engine import build

    f, cfg, tok, flash = _read_model(path)
    built = _closing_on_error(f, AscendError, lambda: build(f, cfg, names, ctx, qat_sim, kernels, w8a8))
    info = _info(f, cfg, "npu", ctx, qat_sim, flash, built.kernels, built.note, None, built.devices)
    return Parts(f, tok, info, built.model)


def open_parts(path: str | os.PathLike[str], backend: str = "auto", ctx: int = 32768, qat_sim: bool = True,
               kernels: str | None = None, devices: str | None = None, w8a8: bool = False,
               memory_budget: int | str | None = None, expert_profile: str | os.PathLike[str] | None = None) -> Parts:
    """The parts of Engine.open(...) (same arguments): a distributed group builds its own
    Engine from them, around this process's share."""
    if ctx < 2:
        raise EngineError(f"context size must be at least 2 tokens, got {ctx}")
    if backend == "npu":
        if memory_budget not in (None, "auto") or expert_profile is not None:
            raise EngineError("--memory-budget and --expert-profile stream experts for the CPU kernels; "
                              "--backend npu keeps its experts on the devices")
        return _npu_parts(path, ctx, qat_sim, kernels, devices, w8a8)
    if devices is not None or w8a8:
        raise EngineError("--devices and --w8a8 are options of --backend npu")
    chosen = _pick_backend(backend)
    mx.set_default_device(mx.cpu if chosen == "cpu" else mx.gpu)
    f, cfg, tok, flash = _read_model(path)
    return _closing_on_error(f, KernelError, lambda: mlx_parts(f, cfg, tok, chosen, ctx, qat_sim, flash, kernels,
                                                               memory_budget, expert_profile))


class Engine:
    """An opened model: sessions over it, its tokenizer and what it is (``info``)."""

    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._speculate = "off"  # set_speculation
        self._mtp = None  # the MTP block "mtp" drafts with (engine/mtp.py)
        self._opened: list = []  # every MTP block opened, closed with the engine
        self._steering = None  # what new sessions are steered by (set_steering)
        self._power = None  # the duty-cycle cap every session passes through (set_power)
        self._sessions: weakref.WeakSet = weakref.WeakSet()  # the sessions made (set_power reaches them)
        self.tokenizer = parts.tokenizer
        self.info = parts.info
        self.ctx = parts.info.ctx

    @classmethod
    def open(cls, path: str | os.PathLike[str], backend: str = "auto", ctx: int = 32768,
             qat_sim: bool = True, kernels: str | None = None, devices: str | None = None,
             w8a8: bool = False, memory_budget: int | str | None = None,
             expert_profile: str | os.PathLike[str] | None = None) -> "Engine":
        """Open a DeepSeek V4 GGUF. Reads the header and vocabulary only; weights stay in the
        mmap and are materialised when first used. ``kernels`` picks the implementation of the
        heavy products (default $DS4_KERNELS or auto: the backend's fast kernels when usable).
        ``devices`` ("0,1", "cpu", ...) and ``w8a8`` are the npu backend's (docs/ascend.md).
        ``memory_budget`` (bytes, "8G", "auto"; default $DS4_MEMORY_BUDGET, config, auto) bounds
        the routed experts held in memory: beyond it they stream from the file
        (docs/streaming.md); ``expert_profile`` names a popularity profile (save_expert_profile)
        whose most used experts are read at once."""
        return cls(open_parts(path, backend, ctx, qat_sim, kernels, devices, w8a8, memory_budget, expert_profile))

    @property
    def file(self) -> GGUFFile:
        """The model file (read-only tensor views over its mmap)."""
        return self._parts.file

    @property
    def model(self) -> object:
        """What runs the forward pass (see Parts.model): reports, benchmarks and tests look into it."""
        return self._parts.model

    @property
    def parts(self) -> Parts:
        """What the engine was built from (a distributed group rebuilds one from them)."""
        return self._parts

    def streaming(self) -> dict[str, float] | None:
        """The expert pool's counters (hits, misses, prefetches used and wasted, bytes read,
        seconds waited: expertpool.PoolStats), its size in slots and whether it reads past the
        page cache ("direct"), or None when the routed experts do not stream."""
        pool = self._parts.pool
        if pool is None:
            return None
        return {**pool.stats.as_dict(), "slots": pool.slots, "slot_bytes": pool.slot_bytes,
                "experts": self.info.config.n_layer * self.info.config.n_expert, "direct": pool.direct}

    def save_expert_profile(self, path: str | os.PathLike[str]) -> None:
        """Write how often each routed expert was asked for since open (a popularity profile
        for ``expert_profile`` at a later open). EngineError when no expert streams."""
        pool = self._parts.pool
        if pool is None:
            raise EngineError("no expert streams in this engine: there is no popularity profile to save")
        try:
            expertpool.save_profile(path, pool.uses, self.info.fingerprint)
        except expertpool.PoolError as e:
            raise EngineError(str(e)) from None

    @property
    def batches(self) -> bool:
        """Whether sessions of this engine decode together in one pass (engine/batch.py); the
        Ascend module and a distributed group run one session at a time."""
        from .session import batches

        return batches(self._parts.model)

    def session_room(self, most: int = 8) -> tuple[int, int]:
        """(how many sessions at the engine's context the machine has room for beside the
        model, 1 .. ``most``; the bytes one session's KV takes at that context): the default
        number of server slots. At most 8: the CPU kernels' batched products take 8 sessions'
        tokens in one pass over each matrix, the GPU kernels tile 8 tokens per thread, and on
        the 4-layer shape model 8 streams gave 2.9x one stream's aggregate against 2.3x for 4
        (README, "Several requests at once"); idle slots cost only their KV as it grows. The
        model counts as the file's size, or with experts streaming as its dense weights and
        the pool; the room is the memory available now (engine/expertpool.py
        available_memory: MemAvailable or the cgroup's room)."""
        from .state import payload_size

        kv = payload_size(self.info.config, self.ctx)
        available, _ = expertpool.available_memory()
        if available is None:
            return 1, kv
        pool = self._parts.pool
        model = self.file.file_size if pool is None else (
            sum(t.nbytes for n, t in self.file.tensors.items() if "_exps." not in n) + pool.allocated)
        return max(1, min(most, (available - model) // max(kv, 1))), kv

    def set_speculation(self, kind: str, mtp: str | os.PathLike[str] | None = None) -> None:
        """Where the sessions made from now on take proposed tokens from (engine/drafts.py:
        "off", "ngram", "mtp" with ``mtp`` the MTP file, opened here and checked against the
        model; "dspark" needs a draft model this build does not run): EngineError, one line,
        for one that cannot run."""
        from . import drafts

        block = None
        if kind == "mtp" and mtp is not None:
            from .mtp import MtpBlock

            if not os.path.isfile(mtp):
                raise EngineError(f"MTP file {mtp}: no such file")
            try:
                block = MtpBlock.open(self._parts.model, str(mtp))  # type: ignore[arg-type]
            except ValueError as e:
                raise EngineError(str(e)) from None
        try:
            drafts.drafter(kind, block)
        except ValueError as e:
            if block is not None:
                block.close()
            raise EngineError(str(e)) from None
        if block is not None:
            self._opened.append(block)  # sessions made before keep theirs: all close with the engine
        self._speculate, self._mtp = kind, block

    def set_steering(self, path: str | os.PathLike[str] | None, attn: float = 0.0, ffn: float = 1.0) -> None:
        """Directional steering for the sessions made from now on (engine/steering.py): the
        directions of file ``path`` for this model with these scales; None: none. EngineError,
        one line, for a file that does not fit or a model that cannot steer."""
        from .steering import SteeringError, load_steering

        if path is None:
            self._steering = None
            return
        if not self.batches:
            raise EngineError("directional steering runs with the MLX engine of one process")
        cfg = self.info.config
        try:
            self._steering = load_steering(path, cfg.n_layer, cfg.n_embd, attn, ffn)
        except SteeringError as e:
            raise EngineError(str(e)) from None

    def set_power(self, level: int) -> None:
        """Cap the engine's duty cycle at ``level`` percent (engine/power.py), for every session
        of it, those made before included. EngineError, one line, out of 1..100."""
        from .power import Power, PowerError

        try:
            if self._power is None:
                threads = None
                kernels = getattr(self._parts.model, "k", None)
                if getattr(kernels, "name", "") in ("cpu", "cpu-exact"):
                    from .kernels import cpu

                    threads = (cpu.set_threads, cpu.threads())
                self._power = Power(level, threads)
            else:
                self._power.set(level)
        except PowerError as e:
            raise EngineError(str(e)) from None
        for s in self._sessions:
            s.power = self._power

    @property
    def power(self) -> int:
        """The duty-cycle cap in percent (100: none)."""
        return 100 if self._power is None else self._power.level

    @property
    def steering(self):
        """The steering new sessions get (a Steering), or None."""
        return self._steering

    def session(self, ctx: int | None = None) -> Session:
        """A new, empty session; ``ctx`` defaults to the context the engine was opened with."""
        from . import drafts

        s = self._parts.session_class(self._parts.model, self.tokenizer, self.info, self.ctx if ctx is None else ctx)
        s.drafter = drafts.drafter(self._speculate, self._mtp)
        if self._steering is not None:
            s.set_steering(self._steering)
        s.power = self._power
        self._sessions.add(s)
        return s

    def close(self) -> None:
        for block in self._opened:
            block.close()
        self._opened, self._mtp = [], None
        if self._parts.on_close is not None:
            self._parts.on_close()
        self._parts.file.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Engine", "EngineError", "EngineInfo", "GGUFError", "Parts", "mlx_parts", "open_parts", "streaming_plan"]
