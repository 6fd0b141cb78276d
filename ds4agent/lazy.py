"""Lazily resolved package names: a package lists name -> defining module, and a name's module
is imported on first use. Front ends then import a package for one light name (SamplingParams,
say) without loading MLX or numpy for the others."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` for ``names`` (module paths relative to the
    package, like ".engine", or absolute)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module, package), name)

    return __getattr__
