"""Lazy re-exports for package ``__init__`` files: a name is imported from its module on first use.

A package that re-exports its modules' names this way loads none of them when it is
imported, so importing ``contllm.experiments`` (or ``contllm.depth``) runs no experiment
module and ``contllm --help`` stays fast::

    __getattr__, __all__ = lazy_exports(__name__, {"contllm.depth.experiment": ("DepthConfig", "run_depth")})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], list[str]]:
    """(a module ``__getattr__``, ``__all__``) re-exporting ``modules`` (module name -> the names it gives).

    The ``__getattr__`` imports a name's module on first use and keeps the name in the
    package, and raises AttributeError for any other name.
    """
    if any(isinstance(names, str) for names in modules.values()):
        raise TypeError("lazy_exports takes a sequence of names per module, not one string")
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__, sorted(where)
