"""The repository's own scripts (docs/, scripts/, benchmarks/) loaded as modules by the tests."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load_script(path: Path, name: str) -> ModuleType:
    """The Python file at ``path`` executed as a new module called ``name`` (not entered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_benchmark(name: str) -> ModuleType:
    """benchmarks/``name``.py imported with benchmarks/ on sys.path for the import only.

    The benchmarks import one another as scripts do (``import sweep``), so their folder must
    be on the path while one is imported.
    """
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
