"""The folders of the house, and the old flat import paths that still work (contllm.moved)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import contllm
from contllm.moved import MOVED, new_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "contllm"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_module_at_its_new_place(old: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == MOVED[old]
    assert module.__spec__ is not None and module.__spec__.name == MOVED[old]  # its own spec, not the alias's
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()


def test_a_submodule_of_a_moved_package_moves_with_it() -> None:
    assert new_name("contllm.cards.budget") == "contllm.audits.budget"
    import contllm.cards.budget as old
    from contllm.audits import budget

    assert old is budget
    from contllm.cards import Card, compare  # the package's lazy re-exports, through the old name

    assert Card.__module__ == "contllm.audits.card"
    assert callable(compare)


def test_a_name_patched_through_the_old_path_is_patched_for_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import contllm.core.engine as new
    import contllm.engine as old

    marker = object()
    monkeypatch.setattr("contllm.engine.check_signals", marker)
    assert new.check_signals is marker
    assert old.check_signals is marker


def test_unmoved_names_are_not_taken() -> None:
    assert new_name("contllm.lm") is None
    assert new_name("contllm.cardsx") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("contllm.cards.nonexistent")


def test_the_public_names_and_the_command_line_entry_points_still_import() -> None:
    for name in contllm.__all__:
        assert getattr(contllm, name) is not None
    assert callable(contllm.audit)  # the function, not the audits package
    from contllm.cli import app, main

    assert callable(main)
    assert type(app).__name__ == "Typer"
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["contllm"]
    module, _, attribute = script.partition(":")
    assert getattr(importlib.import_module(module), attribute) is main


def test_old_paths_work_in_a_fresh_interpreter_without_torch() -> None:
    code = (
        "import sys, contllm.cli_index as i, contllm.cards as c; "
        "assert i.__name__ == 'contllm.cli.index' and c.__name__ == 'contllm.audits'; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_at_most_twenty_modules_lie_flat_and_every_folder_is_a_package() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 20, flat
    for folder in PACKAGE.iterdir():
        if folder.is_dir() and any(folder.glob("*.py")):
            assert (folder / "__init__.py").is_file(), folder
