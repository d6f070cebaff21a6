"""Old import paths of modules that moved into folders, kept working.

Until 0.1.0 every module lay flat in ``contllm/``; they now live in folders that show
the architecture (see CONTRIBUTING.md). Importing an old path, ``import contllm.engine``
or ``from contllm.cards import Card``, gives the module at its new place: the very same
module object, so a name patched through either path is patched for both. :data:`MOVED`
maps each old path to the new one; a submodule of a moved package moves with it.
CHANGELOG.md lists the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

_FOLDERS = {
    "core": (
        "attention",
        "chunks",
        "decoding",
        "engine",
        "families",
        "forward",
        "interpolate",
        "precision",
        "prefix",
        "readout",
        "signal",
    ),
    "internals": (
        "activation_cache",
        "activations",
        "gradients",
        "hooked_attention",
        "hookpoints",
        "hooks",
        "interop",
        "intervention",
    ),
    "rundir": ("distributed", "explorer", "files", "outputs", "pages", "report", "runner", "runs", "schemas", "spec"),
}

#: Old module path -> new module path.
MOVED: dict[str, str] = {
    **{f"contllm.{name}": f"contllm.{folder}.{name}" for folder, names in _FOLDERS.items() for name in names},
    "contllm.cli_errors": "contllm.cli.errors",
    "contllm.cli_index": "contllm.cli.index",
    "contllm.generate_cli": "contllm.cli.generate",
    "contllm.cards": "contllm.audits",
    "contllm.cards.auditing": "contllm.audits.run",
    "contllm.cards.cli": "contllm.cli.audit",
}

#: Old packages whose other submodules kept their names under the new package.
_PACKAGES = {"contllm.cards": "contllm.audits"}


def new_name(old: str) -> str | None:
    """The module path that ``old`` moved to, or None if it did not move."""
    if old in MOVED:
        return MOVED[old]
    for package, target in _PACKAGES.items():
        if old.startswith(package + "."):
            return target + old[len(package) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module already imported at its new one."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec; the module keeps its own


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), is_package=new == "contllm.audits")


def install() -> None:
    """Put the finder of old paths first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
