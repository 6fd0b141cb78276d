"""Mutation testing of one module against its fast tests (docs/testing.md).

Usage:
  python dev/mutate.py MODULE [--list] [--only N,M] [--scope NAME] [--sample N] [--json PATH]
  python dev/mutate.py --modules

MODULE is a path such as ds4agent/engine/sampler.py; dev/mutation.toml names the tests that
judge it and the surviving mutants explained as equivalent. Each mutant is one small, plausible
bug (a comparison's boundary, an operator, a constant, a dropped call or keyword argument, a
negated condition ...). A worker process runs the module's tests with pytest in-process and
swaps the mutated code in between runs (function code objects, or the one module-level
statement re-executed), so the files on disk are never touched and other people's test runs
in the same tree see the real code. Only the tests that execute the mutated line run, fastest
first, stopping at the first failure.

Why not mutmut 3: it forks its warmed-up process once per mutant, and a process that has used
MLX hangs in the forked child (MLX's worker threads are not fork-safe); the sessions, snapshot
and sampler tests all use MLX.
"""

from __future__ import annotations
import __future__ as future_flags

import argparse
import ast
import functools
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict
from pathlib import Path

from mutants import Mutant, find_mutants  # noqa: E402 - dev/ is the script's folder

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Path(__file__).with_name("mutation.toml")

# ---------------------------------------------------------------------------------------------
# Applying a mutant inside the worker


def _module_name(path: Path) -> str:
    return ".".join(path.resolve().relative_to(ROOT).with_suffix("").parts)


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for s in tree.body:
        if isinstance(s, ast.ImportFrom) and s.module == "__future__":
            for a in s.names:
                flags |= getattr(future_flags, a.name).compiler_flag
    return flags


def _codes(code, out: dict) -> dict:
    for c in code.co_consts:
        if hasattr(c, "co_qualname"):
            out.setdefault(c.co_qualname, c)
            _codes(c, out)
    return out


def _live_function(mod, qualname: str):
    """The function object of ``qualname`` in the imported module (methods, static and class
    methods, properties and wrapped functions included)."""
    parts = qualname.split(".")
    obj = mod
    for p in parts[:-1]:
        obj = obj.__dict__[p] if isinstance(obj, type) else getattr(obj, p)
    raw = obj.__dict__[parts[-1]] if isinstance(obj, type) else getattr(obj, parts[-1])
    cands = [raw]
    for attr in ("__func__", "fget", "fset", "fdel", "__wrapped__"):
        if getattr(raw, attr, None) is not None:
            cands.append(getattr(raw, attr))
    for c in cands:
        while True:
            if getattr(c, "__code__", None) is not None and c.__code__.co_qualname == qualname:
                return c
            c = getattr(c, "__wrapped__", None)
            if c is None:
                break
    raise LookupError(qualname)


class Applier:
    """Swaps one mutant's code into the imported module, and back."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()
        self.name = _module_name(path)
        self.source = self.path.read_bytes()
        self.tree = ast.parse(self.source)
        self.flags = _future_flags(self.tree)
        self.undo: list = []

    def apply(self, m: Mutant) -> bool:
        """Returns False when the change could not be put in place (nothing is changed then)."""
        mod = importlib.import_module(self.name)
        mutated = self.source[: m.start] + m.text.encode() + self.source[m.end:]
        if m.target is not None:
            code = compile(mutated, str(self.path), "exec", flags=self.flags, dont_inherit=True)
            new = _codes(code, {}).get(m.target)
            fn = _live_function(mod, m.target)
            if new is None or new.co_freevars != fn.__code__.co_freevars:
                return False
            self.undo.append((setattr, fn, "__code__", fn.__code__))
            fn.__code__ = new
        else:
            tree = ast.parse(mutated)
            stmt = tree.body[m.top_index]
            code = compile(ast.Module([stmt], []), str(self.path), "exec", flags=self.flags, dont_inherit=True)
            changed = self._exec_statement(mod, stmt, code)
            if not changed:
                return False
        _clear_caches(mod)
        return True

    def _exec_statement(self, mod, stmt: ast.stmt, code) -> bool:
        g = mod.__dict__
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scratch = dict(g)
            exec(code, scratch)
            return self._merge(g[stmt.name], scratch[stmt.name])
        # Any other statement rebinds names in the module itself (it may refer to the module's
        # own classes and functions, which must stay the same objects).
        before = dict(g)
        exec(code, g)
        changed = False
        for k, v in list(g.items()):
            if k not in before:
                self.undo.append((g.pop, k))
                changed = True
            elif v is not before[k]:
                old = before[k]
                if isinstance(old, type) or callable(old) and hasattr(old, "__code__"):
                    g[k] = old
                    changed |= self._merge(old, v)
                elif self._merge_value(old, v):
                    g[k] = old  # changed in place: other modules and lists holding it see the mutant
                    changed = True
                else:
                    self.undo.append((g.__setitem__, k, old))
                    self._rebind_imports(k, old, v)
                    changed |= not _same(old, v)
        return changed

    def _rebind_imports(self, name: str, old, new) -> None:
        """A value that cannot change in place (a frozenset, a tuple, a number, a compiled
        pattern) is rebound in this module; modules of the package that imported it by name
        (``from .tables import SHELLS``) hold the old object, so they are rebound too."""
        package = self.name.rsplit(".", 1)[0] + "."
        for other_name, other in list(sys.modules.items()):
            d = getattr(other, "__dict__", None)
            if other_name != self.name and other_name.startswith(package) and d is not None and d.get(name) is old:
                self.undo.append((d.__setitem__, name, old))
                d[name] = new

    def _merge_value(self, old, new) -> bool:
        """Containers and plain objects (a table of rules, the list of tools) are changed in
        place, element by element, so that what other modules built from them at import (an
        ``all_tools()`` list holding the same Tool objects) sees the mutant too. Returns False
        when ``old`` is not something it can change in place (ints, strings: rebound instead)."""
        if type(old) is not type(new):
            return False
        if isinstance(old, list) and len(old) == len(new):
            for i, (a, b) in enumerate(zip(old, new)):
                if not (a is b or _same(a, b) or self._merge_value(a, b)):
                    self.undo.append((old.__setitem__, i, a))
                    old[i] = b
            return True
        if isinstance(old, (list, dict, set)):
            saved = old.copy()
            self.undo.append((_refill, old, saved))
            _refill(old, new)
            return True
        if hasattr(old, "__dict__") and not isinstance(old, type) and not callable(old):
            saved = dict(old.__dict__)
            self.undo.append((_refill, old.__dict__, saved))
            for k, v in new.__dict__.items():
                ov = old.__dict__.get(k)
                if ov is v or _same(ov, v) or self._merge_value(ov, v):
                    continue
                old.__dict__[k] = v
            return True
        return False

    def _merge(self, old, new) -> bool:
        """Patch the live ``old`` (function or class) with what differs in ``new``."""
        changed = False
        if isinstance(old, type) and isinstance(new, type):
            for k, v in new.__dict__.items():
                if k in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__dataclass_fields__",
                         "__dataclass_params__", "__match_args__", "__annotations__", "__hash__", "__slots__"):
                    continue
                if k not in old.__dict__:
                    continue
                ov = old.__dict__[k]
                if _funcs(ov) and _funcs(v):
                    for fo, fn in zip(_funcs(ov), _funcs(v)):
                        changed |= self._merge(fo, fn)
                elif isinstance(v, type) and isinstance(ov, type):
                    changed |= self._merge(ov, v)
                elif not _same(ov, v):
                    self.undo.append((setattr, old, k, ov))
                    setattr(old, k, v)
                    changed = True
            return changed
        fo, fn = _unwrap(old), _unwrap(new)
        if fo is None or fn is None:
            return False
        for attr in ("__code__", "__defaults__", "__kwdefaults__"):
            a, b = getattr(fo, attr), getattr(fn, attr)
            if not _same(a, b):
                if attr == "__code__" and a.co_freevars != b.co_freevars:
                    continue
                self.undo.append((setattr, fo, attr, a))
                setattr(fo, attr, b)
                changed = True
        # A wrapper with code of its own (a dataclass's generated __repr__ under reprlib's
        # recursion guard, a contextmanager's helper) has the same code in both versions: what
        # the mutant changed is the function it wraps.
        wo, wn = getattr(fo, "__wrapped__", None), getattr(fn, "__wrapped__", None)
        if wo is not None and wn is not None and wo is not fo:
            changed |= self._merge(wo, wn)
        return changed

    def restore(self) -> None:
        while self.undo:
            f, *args = self.undo.pop()
            f(*args)
        mod = sys.modules.get(self.name)
        if mod is not None:
            _clear_caches(mod)


def _refill(container, content) -> None:
    container.clear()
    container.update(content) if not isinstance(container, list) else container.extend(content)


def _unwrap(f):
    while f is not None and not hasattr(f, "__code__"):
        f = getattr(f, "__wrapped__", None) or getattr(f, "__func__", None)
    return f


def _funcs(v) -> list:
    if isinstance(v, property):
        return [f for f in (v.fget, v.fset, v.fdel) if f is not None]
    f = _unwrap(v) if (callable(v) or isinstance(v, (staticmethod, classmethod))) else None
    return [f] if f is not None and hasattr(f, "__code__") else []


def _same(a, b) -> bool:
    if a is b:
        return True
    if hasattr(a, "co_code") and hasattr(b, "co_code"):
        return a == b
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b) and repr(a) == repr(b)
    except Exception:
        return False


def _clear_caches(mod) -> None:
    for v in list(vars(mod).values()):
        targets = [v] + ([x for x in vars(v).values()] if isinstance(v, type) else [])
        for t in targets:
            clear = getattr(t, "cache_clear", None)
            if callable(clear) and isinstance(t, functools._lru_cache_wrapper):
                clear()


# ---------------------------------------------------------------------------------------------
# The worker: runs pytest in-process, answers one JSON line per request


class _Recorder:
    """pytest plugin: the lines of the target file each test executes, its duration and the
    first failing test."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lines: dict[str, set[int]] = {}
        self.durations: dict[str, float] = {}
        self.current: set[int] | None = None
        self.failed: str | None = None
        self.outcomes: dict[str, str] = {}

    def _trace(self, frame, event, arg):
        if frame.f_code.co_filename != self.path:
            return None
        cur = self.current

        def local(frame, event, arg):
            if event == "line" and cur is not None:
                cur.add(frame.f_lineno)
            return local

        if cur is not None:
            cur.add(frame.f_lineno)
        return local

    def pytest_runtest_setup(self, item) -> None:
        if self.path:
            self.current = self.lines.setdefault(item.nodeid, set())
            sys.settrace(self._trace)
            import threading

            threading.settrace(self._trace)

    def pytest_runtest_teardown(self, item, nextitem) -> None:
        pass

    def pytest_runtest_logreport(self, report) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.failed and self.failed is None:
            self.failed = report.nodeid
        if report.when == "call" or report.failed:
            self.outcomes[report.nodeid] = report.outcome
        if report.when == "teardown" and self.path:
            sys.settrace(None)
            import threading

            threading.settrace(None)
            self.current = None


def _killers_first(sel: list[str], killers: dict[tuple[str, object], dict[str, int]], m: Mutant) -> list[str]:
    """The covering tests in the order to run them: first those that killed a mutant of the same
    line, then of the same function, then any mutant (most kills first), then the rest fastest
    first. Only the order changes, so a survivor still ran every covering test; but a killed
    mutant usually dies in its first test instead of after hundreds of fast ones that never look
    at what it changed (classify.py's kills came ~900 tests in, most of a run's time)."""
    rank: dict[str, tuple[int, int]] = {}
    for tier, where in enumerate((("line", m.line), ("scope", m.scope), ("any", ""))):
        for test, count in killers.get(where, {}).items():
            rank.setdefault(test, (tier, -count))
    pos = {t: k for k, t in enumerate(sel)}
    return sorted(sel, key=lambda t: (rank.get(t, (3, 0)), pos[t]))


def _pytest(args: list[str], recorder: _Recorder, basetemp: Path) -> int:
    import pytest

    opts = ["-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-p", "no:warnings",
            f"--basetemp={basetemp}", "--rootdir", str(ROOT)]
    # Test ids go to the selector, not the command line: pytest cannot select on the command line
    # a parametrized id that holds its own "::" or brackets (the shell-policy tests' ids are
    # commands), and answers "not found" for the whole run. The files are collected, then the
    # named tests kept in the order given (fastest first).
    ids = [a for a in args if "::" in a and not a.startswith("-")]
    files = list(dict.fromkeys(a.split("::", 1)[0] for a in ids))
    rest = [a for a in args if a not in ids]
    plugins: list = [recorder]
    select = _Select(ids) if ids else None
    if select:
        plugins.append(select)
    _forget_test_modules()
    rc = int(pytest.main(opts + files + rest, plugins=plugins))
    if select and select.missing and rc in (0, 5):
        # A covering test that is not collected under its recorded id would silently not run,
        # and a mutant only it kills would count as a survivor.
        recorder.failed = f"not collected: {min(select.missing)} (and {len(select.missing) - 1} more)"
        return 3
    return rc


def _forget_test_modules() -> None:
    """Each pytest session must import the test modules afresh. pytest keeps the ids it made
    for a `parametrize(..., ids=[...])` on the mark, which lives on the cached module's function,
    and the next session in the same process escapes those ids again: an id holding a backslash
    (`find . -exec rm {} \\;`) gains two more each session, no longer matches the id the
    traced baseline recorded, and the test was left out of every mutant's run."""
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if Path(f).name.startswith("test_") and f.endswith(".py") and Path(f).resolve().is_relative_to(ROOT):
            del sys.modules[name]


class _Select:
    """Keep only the named tests, in the given order; `missing` is what was not collected."""

    def __init__(self, ids: list[str]) -> None:
        self.order = {nid: k for k, nid in enumerate(ids)}
        self.missing: set[str] = set()

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        keep = [it for it in items if it.nodeid in self.order]
        keep.sort(key=lambda it: self.order[it.nodeid])
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in self.order])
        self.missing = set(self.order) - {it.nodeid for it in keep}
        items[:] = keep


def _reuse_session_setup(cache: Path) -> None:
    """Each mutant's pytest run is a new session: conftest would write the demo models and the
    isolated home would rebuild the CPU kernels every time (seconds per mutant, most of a run).
    Here the demo models conftest asks for are written once and the kernels built once. Only
    conftest's own calls are cached: a test that writes a model for itself still gets a fresh one."""
    from ds4agent import settings as ds4_settings
    from ds4agent.modelfile import demo

    kernels = cache / "kernels"
    ds4_settings.kernels_dir = lambda: kernels
    real = demo.write_demo
    written: dict[tuple, Path] = {}

    def write_demo(path, preset: str = "tiny", seed: int = 0) -> Path:
        if not sys._getframe(1).f_code.co_filename.endswith("conftest.py"):
            return real(path, preset, seed)
        key = (Path(path).name, preset, seed)
        if key not in written:
            d = cache / f"{preset}-{seed}"
            d.mkdir(exist_ok=True)
            written[key] = real(d / Path(path).name, preset, seed)
        return written[key]

    demo.write_demo = write_demo

    # Engines the tests' fixtures open (the demo models, read-only) are opened once per worker:
    # opening one is most of a store or snapshot test's time. Closing a cached one does nothing.
    from ds4agent.engine.engine import Engine

    real_open, real_close = Engine.__dict__["open"].__func__, Engine.close
    engines: dict[tuple, Engine] = {}
    keep: set[int] = set()

    def open_cached(cls, path, *args, **kw):
        caller = sys._getframe(1).f_code.co_filename
        if not caller.startswith(str(ROOT / "tests")) or Path(path).parent.parent != cache:
            return real_open(cls, path, *args, **kw)
        key = (str(path), args, tuple(sorted(kw.items())))
        if key not in engines:
            engines[key] = real_open(cls, path, *args, **kw)
            keep.add(id(engines[key]))
        return engines[key]

    def close(self) -> None:
        if id(self) not in keep:
            real_close(self)

    Engine.open = classmethod(open_cached)
    Engine.close = close


def worker(module: str) -> None:
    """Reads requests on stdin, one JSON object a line; answers on the original stdout."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    log = open(os.environ.get("DS4_MUTATE_LOG", os.devnull), "a")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    from hypothesis import HealthCheck, settings

    # Same examples every run (a score that does not move by chance), nothing written to the
    # tree's .hypothesis folder, no timing-based failures on a loaded machine.
    settings.register_profile("mutate", database=None, deadline=None, derandomize=True,
                              suppress_health_check=list(HealthCheck))
    settings.load_profile("mutate")
    _reuse_session_setup(Path(tempfile.mkdtemp(prefix="ds4-mutate-cache-")))
    applier = Applier(ROOT / module)
    basetemp = Path(tempfile.mkdtemp(prefix="ds4-mutate-"))
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "baseline":
            rec = _Recorder(str(applier.path) if req.get("trace") else None)
            t = time.monotonic()
            rc = _pytest(req["tests"], rec, basetemp)
            out.write(json.dumps({"rc": rc, "time": time.monotonic() - t, "failed": rec.failed,
                                  "lines": {k: sorted(v) for k, v in rec.lines.items()},
                                  "durations": rec.durations, "outcomes": rec.outcomes}) + "\n")
        elif req["op"] == "mutant":
            m = Mutant(**req["mutant"])
            rec = _Recorder(None)
            try:
                ok = applier.apply(m)
            except Exception as e:  # noqa: BLE001 - reported, not raised
                applier.restore()
                out.write(json.dumps({"status": "not applied", "why": f"{type(e).__name__}: {e}"}) + "\n")
                continue
            if not ok:
                applier.restore()
                out.write(json.dumps({"status": "not applied", "why": "nothing changed in the live module"}) + "\n")
                continue
            try:
                rc = _pytest(req["tests"], rec, basetemp)
            finally:
                applier.restore()
            status = {0: "survived", 1: "killed"}.get(rc, "error")
            if rc == 2 and rec.failed:  # an error while collecting or setting up counts as a failure
                status = "killed"
            out.write(json.dumps({"status": status, "rc": rc, "failed": rec.failed}) + "\n")
    out.close()


# ---------------------------------------------------------------------------------------------
# The driver


class Worker:
    def __init__(self, module: str, log: Path) -> None:
        env = dict(os.environ, DS4_MUTATE_LOG=str(log), PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", module],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)

    def ask(self, req: dict, timeout: float) -> dict | None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"status": "crashed"}

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def load_config() -> dict:
    with open(CONFIG, "rb") as f:
        return tomllib.load(f)


def module_config(cfg: dict, module: str) -> dict | None:
    """The module's entry in mutation.toml: its own, or its package's (a key ending in "/" names
    every module under that folder, e.g. the classify package's files, judged by one test list)."""
    if module in cfg["modules"]:
        return cfg["modules"][module]
    for name, m in cfg["modules"].items():
        if name.endswith("/") and module.startswith(name):
            return m
    return None


def run(module: str, args: argparse.Namespace) -> int:
    cfg = load_config()
    mcfg = module_config(cfg, module)
    if mcfg is None:
        print(f"mutate: {module} is not in {CONFIG.relative_to(ROOT)}; known: {', '.join(cfg['modules'])}",
              file=sys.stderr)
        return 2
    equivalent = {e["mutant"]: e["why"] for e in cfg.get("equivalent", []) if e["module"] == module}
    mutants = find_mutants(ROOT / module)
    if args.scope:
        mutants = [m for m in mutants if m.scope == args.scope or m.scope.startswith(args.scope + ".")]
    if args.only:
        want = {int(x) for x in args.only.split(",")}
        mutants = [m for m in mutants if m.n in want]
    if args.sample and len(mutants) > args.sample:
        # Evenly spaced through the module (the same ones every run): an estimate of the score
        # of a module too large to run whole, e.g. the shell classifier's 4000 mutants.
        step = len(mutants) / args.sample
        mutants = [mutants[int(i * step)] for i in range(args.sample)]
    if args.list:
        for m in mutants:
            print(f"{m.n:4d} L{m.line:<5d} {m.key}")
        print(f"{len(mutants)} mutants")
        return 0
    tests = mcfg["tests"]
    logdir = Path(tempfile.mkdtemp(prefix="ds4-mutate-log-"))
    log = logdir / "worker.log"
    w = Worker(module, log)
    t0 = time.monotonic()
    base = w.ask({"op": "baseline", "tests": tests, "trace": True}, 3600)
    if base is None or base.get("rc") != 0:
        print(f"mutate: the tests fail without any mutant (see {log})", file=sys.stderr)
        w.kill()
        return 2
    durations = base["durations"]
    lines = {k: set(v) for k, v in base["lines"].items()}
    order = sorted(durations, key=lambda k: durations[k])
    ran_tests = [k for k in order if base["outcomes"].get(k) == "passed"]
    print(f"{module}: {len(mutants)} mutants, {len(ran_tests)} tests ({base['time']:.0f} s traced)", flush=True)
    results: dict[int, dict] = {}
    killers: dict[tuple[str, object], dict[str, int]] = {}
    since_check: list[Mutant] = []
    queue = list(mutants)
    # A run stopped early (Ctrl+C, or `timeout` sending SIGTERM) still reports the score of the
    # mutants judged so far, and writes them with --json.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    stopped = False
    try:
        while queue:
            m = queue.pop(0)
            if args.trust_equivalents and m.key in equivalent:
                # Not run: it counts as explained, as a run that saw it survive would. A test
                # that now kills it goes unnoticed, so a full run leaves this off.
                results[m.n] = {"status": "equivalent"}
                if args.verbose:
                    print(f"  {m.n:4d} L{m.line:<5d} {'equivalent':<11s} {m.key}  (not run)", flush=True)
                continue
            if m.target is None:
                sel = ran_tests
            else:
                sel = [k for k in ran_tests if m.stmt_line in lines.get(k, ()) or m.line in lines.get(k, ())]
            if not sel:
                results[m.n] = {"status": "no coverage"}
            else:
                sel = _killers_first(sel, killers, m)
                budget = 30 + 4 * sum(durations[k] for k in sel)
                r = w.ask({"op": "mutant", "mutant": asdict(m), "tests": sel}, budget)
                if r is None or r.get("status") == "crashed":
                    w.kill()
                    r = {"status": "timeout" if r is None else "crashed"}
                    w = Worker(module, log)
                results[m.n] = r
                since_check.append(m)
                if r.get("status") == "killed" and r.get("failed"):
                    for where in (("line", m.line), ("scope", m.scope), ("any", "")):
                        k = killers.setdefault(where, {})
                        k[r["failed"]] = k.get(r["failed"], 0) + 1
            st = results[m.n]["status"]
            if m.key in equivalent and st in ("survived", "no coverage"):
                results[m.n]["status"] = st = "equivalent"
            elif m.key in equivalent and st == "killed":
                # Explained as behaving identically, yet a test tells it apart: the explanation
                # is wrong (or a new test reaches it) and should leave mutation.toml.
                print(f"  {m.n:4d} L{m.line:<5d} killed      {m.key}  (explained as equivalent in mutation.toml; "
                      f"killed by {results[m.n].get('failed')})", flush=True)
            if args.verbose or st in ("survived", "no coverage", "error", "not applied"):
                why = {"not applied": results[m.n].get("why"), "error": results[m.n].get("failed")}.get(st)
                print(f"  {m.n:4d} L{m.line:<5d} {st:<11s} {m.key}" + (f"  ({why})" if why else ""), flush=True)
            # Every so often the unmutated tests must still pass in this worker: a mutant must not
            # leave state behind that makes later ones look killed.
            if len(since_check) >= args.check_every or (not queue and since_check):
                chk = w.ask({"op": "baseline", "tests": ran_tests}, 3600)
                if chk is None or chk.get("rc") != 0:
                    print(f"  worker state went bad after mutant {m.n} (failed: {chk and chk.get('failed')}); "
                          f"rerunning {len(since_check)} mutants in a fresh worker", flush=True)
                    w.kill()
                    w = Worker(module, log)
                    if args.check_every <= 1:
                        return 2
                    queue = since_check + queue
                    args.check_every = max(1, args.check_every // 4)
                since_check = []
    except KeyboardInterrupt:
        print(f"  stopped: {len(results)} of {len(mutants)} mutants judged; the score below covers those", flush=True)
        stopped = True
    w.kill()
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    killed = counts.get("killed", 0) + counts.get("timeout", 0) + counts.get("crashed", 0)
    judged = sum(counts.values()) - counts.get("equivalent", 0) - counts.get("not applied", 0)
    score = 100.0 * killed / judged if judged else 100.0
    print(f"{module}: score {score:.1f}% ({killed} killed of {judged}; " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f") in {time.monotonic() - t0:.0f} s")
    stale = sorted(set(equivalent) - {m.key for m in mutants})
    if stale and not (args.only or args.scope or args.sample):  # a part of the module lists only its own
        print(f"  {len(stale)} equivalents in mutation.toml match no mutant any more:")
        for k in stale:
            print(f"    {k}")
    if args.json:
        Path(args.json).write_text(json.dumps({"module": module, "score": score, "counts": counts, "stopped": stopped,
                                               "mutants": [dict(asdict(m), **results[m.n]) for m in mutants
                                                           if m.n in results]}, indent=1))
    return 0 if score >= args.fail_under else 1


def main() -> int:
    ap = argparse.ArgumentParser(description="Mutation testing of one module against its fast tests.")
    ap.add_argument("module", nargs="?", help="e.g. ds4agent/engine/sampler.py")
    ap.add_argument("--worker", metavar="MODULE", help=argparse.SUPPRESS)
    ap.add_argument("--modules", action="store_true", help="list the configured modules and their tests")
    ap.add_argument("--list", action="store_true", help="list the mutants without running anything")
    ap.add_argument("--only", help="comma-separated mutant numbers")
    ap.add_argument("--scope", help="only mutants inside this function or class (qualname)")
    ap.add_argument("--sample", type=int, help="run only N mutants, evenly spaced (a large module's estimate)")
    ap.add_argument("--json", help="write every mutant and its result to this file")
    ap.add_argument("--trust-equivalents", action="store_true",
                    help="do not run the mutants mutation.toml explains (each survivor costs a whole run of its "
                         "tests: classify's 222 explained ones are over an hour on 2 cores)")
    ap.add_argument("--check-every", type=int, default=40, help="rerun the unmutated tests every N mutants")
    ap.add_argument("--fail-under", type=float, default=90.0, help="exit 1 below this score (percent)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every mutant's result")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if args.modules:
        for name, m in load_config()["modules"].items():
            print(f"{name}: {' '.join(m['tests'])}")
        return 0
    if not args.module:
        ap.error("name a module (see --modules)")
    module = Path(args.module).resolve().relative_to(ROOT).as_posix() if Path(args.module).exists() else args.module
    return run(module, args)


if __name__ == "__main__":
    sys.exit(main())
