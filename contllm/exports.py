"""Lazy re-exports for package ``__init__`` files: a name is imported from its module on first use.

A package that re-exports its modules' names this way loads none of them when it is
imported, so importing ``contllm.experiments`` (or ``contllm.depth``) runs no experiment
module and ``contllm --help`` stays fast::

    __getattr__, __all__ = lazy_exports(__name__, {"contllm.depth.experiment": ("DepthConfig", "run_depth")})

Each re-exported name is a property of the package's own module class, so it wins over
any attribute of the same name that a library adds to ``object`` (nnsight adds ``save``,
which a module-level ``__getattr__`` alone would never get to answer).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], list[str]]:
    """(a module ``__getattr__``, ``__all__``) re-exporting ``modules`` (module name -> the names it gives).

    A name's module is imported on first use and the name kept; assigning the name (as
    ``unittest.mock.patch`` does) replaces it. The ``__getattr__`` raises AttributeError
    for any other name.
    """
    if any(isinstance(names, str) for names in modules.values()):
        raise TypeError("lazy_exports takes a sequence of names per module, not one string")
    where = {name: module for module, names in modules.items() for name in names}
    loaded: dict[str, Any] = {}

    def export(name: str) -> property:
        def get(_: types.ModuleType) -> Any:
            if name not in loaded:
                loaded[name] = getattr(importlib.import_module(where[name]), name)
            return loaded[name]

        def put(_: types.ModuleType, value: Any) -> None:
            loaded[name] = value

        def drop(_: types.ModuleType) -> None:
            loaded.pop(name, None)

        return property(get, put, drop, doc=f"{name}, from {where[name]}")

    module = sys.modules[package]
    kind = type(module)
    if not issubclass(kind, types.ModuleType):
        raise TypeError(f"{package} is not a module")
    module.__class__ = type("LazyModule", (kind,), {name: export(name) for name in where})

    def __getattr__(name: str) -> Any:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(where)
