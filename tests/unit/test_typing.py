"""Modules that type-check clean stay clean: no mypy override in pyproject.toml silences their errors.

CI runs mypy over contllm/ with the [tool.mypy] settings of pyproject.toml; a module listed
in an override with ``disable_error_code`` passes without being clean. The modules below were
made clean (issue 31); an override that covers one of them again fails here, so a new finding
is fixed in the code rather than silenced.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

#: Modules that mypy checks with every error code.
CLEAN = (
    "contllm.internals.activations",
    "contllm.data.user",
    "contllm.experiments.options",
    "contllm.experiments.prompts",
    "contllm.rundir.outputs",
    "contllm.core.readout",
    "contllm.rundir.report",
    "contllm.rundir.runs",
    "contllm.rundir.spec",
    # the experiments (issue 26: Experiment[RecordT, ResultT], records through contllm.experiments.records)
    "contllm.depth.experiment",
    "contllm.experiments.attention_mass",
    "contllm.experiments.attribution",
    "contllm.experiments.base",
    "contllm.experiments.boolean",
    "contllm.experiments.counting_interpolation",
    "contllm.experiments.equivalence",
    "contllm.experiments.lens",
    "contllm.experiments.linearity",
    "contllm.experiments.patching",
    "contllm.experiments.records",
    "contllm.experiments.sums",
    "contllm.experiments.sweeps",
    "contllm.experiments.timeline",
    "contllm.experiments.tokens",
    "contllm.experiments.tracking",
    "contllm.experiments.word_interpolation",
    "contllm.pde.experiment",
)


def _covers(pattern: str, module: str) -> bool:
    """Whether a mypy override's module pattern applies to ``module`` ("a.b" or "a.*", which also covers "a")."""
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return module == package or module.startswith(package + ".")
    return pattern == module


def _silencing_overrides() -> list[tuple[list[str], list[str]]]:
    """(module patterns, disabled error codes) of each mypy override with ``disable_error_code``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    overrides = config["tool"]["mypy"].get("overrides", [])
    out = []
    for override in overrides:
        codes = override.get("disable_error_code", [])
        if codes:
            modules = override["module"]
            out.append(([modules] if isinstance(modules, str) else list(modules), list(codes)))
    return out


@pytest.mark.parametrize("module", CLEAN)
def test_clean_module_has_no_disabled_error_codes(module: str) -> None:
    found = [
        (patterns, codes) for patterns, codes in _silencing_overrides() if any(_covers(p, module) for p in patterns)
    ]
    assert not found, f"{module} is type-clean; fix the new finding instead of disabling {found[0][1]} for it"


@pytest.mark.parametrize("module", CLEAN)
def test_clean_module_exists(module: str) -> None:
    path = ROOT.joinpath(*module.split("."))
    assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), f"{module} was moved; update CLEAN"


def test_covers() -> None:
    assert _covers("contllm.rundir.spec", "contllm.rundir.spec")
    assert not _covers("contllm.rundir.spec", "contllm.specs")
    assert _covers("contllm.*", "contllm.rundir.spec")
    assert _covers("contllm.experiments.*", "contllm.experiments")
    assert not _covers("contllm.experiments.*", "contllm.experimental")
