"""Lazy re-exports answer with the re-exported object, whatever other attributes a module type has."""

from __future__ import annotations

import subprocess
import sys
import types
from unittest import mock

import pytest

from contllm.exports import lazy_exports
from contllm.rundir import outputs


class ModuleWithSave(types.ModuleType):
    save = "an attribute of the module type"  # as nnsight gives every object a save()


@pytest.fixture
def package():
    module = ModuleWithSave("lazy_pkg_for_test")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_reexported_name_wins_over_an_attribute_of_the_module_type(package: types.ModuleType) -> None:
    assert package.save == "an attribute of the module type"
    package.__getattr__, package.__all__ = lazy_exports(package.__name__, {"contllm.rundir.outputs": ("save", "summarize")})
    assert package.save is outputs.save
    assert package.summarize is outputs.summarize
    assert package.__all__ == ["save", "summarize"]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        package.nothing  # noqa: B018


def test_a_reexported_name_can_be_patched_and_restored(package: types.ModuleType) -> None:
    lazy_exports(package.__name__, {"contllm.rundir.outputs": ("save",)})
    with mock.patch.object(package, "save", "patched"):
        assert package.save == "patched"
    assert package.save is outputs.save


def test_a_single_string_of_names_is_refused() -> None:
    with pytest.raises(TypeError, match="sequence of names"):
        lazy_exports("contllm", {"contllm.rundir.outputs": "save"})


def test_after_nnsight_is_imported_the_toolkit_save_is_the_toolkit_save() -> None:
    pytest.importorskip("nnsight")
    code = (
        "import nnsight\n"
        "from contllm.experiments import save\n"
        "import contllm.rundir.outputs\n"
        "assert save is contllm.rundir.outputs.save, save\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
