"""The layer rules of docs/architecture.md, checked on the source: every import between our
packages runs downward, there are no import circles, and the front ends and the conversation
layer import without MLX or numpy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ds4agent"

# Lower rank = lower layer. A module may import its own package and packages of lower rank; two
# packages of one rank never import each other. The model file is below both the protocol and
# the engine, which know nothing of each other; the tools import no other package of ours.
RANK = {"settings": 0, "lazy": 0, "modelfile": 1, "tools": 1, "protocol": 2, "engine": 2, "sessions": 3,
        "conversation": 4, "ui": 5, "server": 5, "verify": 5, "cli": 6, "__main__": 7}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _is_package(mod: str) -> bool:
    return MODULES.get(mod, Path()).name == "__init__.py"


def _imports(mod: str, path: Path) -> list[tuple[str, bool]]:
    """(imported module, type-checking only) for every import in the file, wherever it is."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = mod if _is_package(mod) else mod.rpartition(".")[0]
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for b in node.body for n in ast.walk(b)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in typing_only) for a in node.names if a.name.startswith("ds4agent")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("ds4agent"):
                target = node.module
            else:
                continue
            for a in node.names:  # `from . import qat` imports the module ds4agent.engine.qat
                sub = f"{target}.{a.name}"
                found.append((sub if sub in MODULES else target, id(node) in typing_only))
    return found


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_runs_downward() -> None:
    upward = []
    for mod, path in MODULES.items():
        if mod == "ds4agent":
            continue
        mine = _layer(mod)
        for target, _ in _imports(mod, path):
            theirs = _layer(target)
            if theirs in ("", mine):
                continue
            if RANK[theirs] >= RANK[mine]:
                upward.append(f"{mod} -> {target}")
    assert not upward, "imports that do not run downward:\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    """Function-level imports count too (a lazy import is still a dependency), and so do
    imports under TYPE_CHECKING: they never run, but a circle of types is a circle of concepts
    (the engine once knew its sessions and the sessions the engine only that way)."""
    graph = {mod: {t for t, _ in _imports(mod, path) if t in MODULES and t != mod}
             for mod, path in MODULES.items()}
    # A package's __init__ importing its own submodules is how a package publishes names; a
    # submodule importing the package (to reach a sibling) is the other direction.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_the_rule_test_sees_imports() -> None:
    """The checks above would pass on a file they cannot read: make sure they see real arrows."""
    arrows = {(m, t) for m, p in MODULES.items() for t, _ in _imports(m, p)}
    assert ("ds4agent.engine.model", "ds4agent.engine.ops") in arrows
    assert ("ds4agent.conversation.agent", "ds4agent.tools") in arrows
    assert ("ds4agent.engine.kernels.cpu", "ds4agent.settings") in arrows
    assert len(arrows) > 120


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"mlx", "numpy", "torch", "gguf"}:
            raise ImportError(f"{name} is blocked by the layer test")
        return None
sys.meta_path.insert(0, Block())
"""

FRONT = ["ds4agent.cli", "ds4agent.ui.chat", "ds4agent.ui.agent_ui", "ds4agent.ui.oneshot", "ds4agent.ui.commands",
         "ds4agent.ui.terminal", "ds4agent.ui.keys", "ds4agent.ui.markdown", "ds4agent.conversation",
         "ds4agent.conversation.turns", "ds4agent.conversation.agent", "ds4agent.conversation.events",
         "ds4agent.settings", "ds4agent.tools", "ds4agent.protocol", "ds4agent.sessions",
         "ds4agent.server.app", "ds4agent.server.run", "ds4agent.server.scripted", "ds4agent.verify.official"]


def test_front_ends_and_conversation_layer_import_without_mlx_or_numpy() -> None:
    code = BLOCKER + "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in FRONT) + (
        "from ds4agent.engine import SamplingParams\nSamplingParams(temperature=0.5).validate()\n"
        "from ds4agent.conversation import Agent, Conversation, Event\n"
        "from ds4agent.cli import build_parser\nbuild_parser().parse_args(['agent', '-p', 'x'])\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_blocker_blocks() -> None:
    r = subprocess.run([sys.executable, "-c", BLOCKER + "import ds4agent.engine.engine"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "blocked by the layer test" in r.stderr
