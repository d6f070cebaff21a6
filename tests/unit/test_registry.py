"""The experiment registry: "module:ATTR" entries, checks on what they name, and experiments found through entry points."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata

import pytest
from typer.testing import CliRunner

from contllm import registry
from contllm.cli.commands import app
from contllm.errors import ExperimentError
from contllm.experiments.timeline import SCALING

pytestmark = pytest.mark.unit

#: Something that is not an Experiment, for the registry to refuse.
NOT_AN_EXPERIMENT = object()


def test_every_entry_names_an_experiment_object_and_builtins_need_no_shim_modules() -> None:
    for name in registry.names():
        module, _, attr = registry.EXPERIMENTS[name].partition(":")
        assert module and attr, registry.EXPERIMENTS[name]
        assert registry.get(name).name == name
    assert registry.get("scaling") is SCALING
    assert registry.EXPERIMENTS["translation"] == "contllm.experiments.timeline:TRANSLATION"


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        (f"{__name__}:NOT_AN_EXPERIMENT", "is a object, not an Experiment"),
        (f"{__name__}:MISSING", f"{__name__} has no MISSING"),
        ("contllm.experiments.timeline:SCALING", "declares the experiment 'scaling', registered as 'odd'"),
    ],
)
def test_an_entry_that_names_no_fitting_experiment_is_refused(entry: str, needle: str) -> None:
    registry.register("odd", entry)
    try:
        with pytest.raises(ExperimentError) as err:
            registry.get("odd")
        assert needle in str(err.value)
    finally:
        registry.unregister("odd")
    with pytest.raises(ExperimentError, match="must be 'module:ATTR'"):
        registry.register("odd", "module:not an attribute")


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed package's entry point declaring the scaling experiment again as "rescaled", and one reusing "counting"."""
    points = [
        metadata.EntryPoint(name="rescaled", value=f"{__name__}:RESCALED", group=registry.ENTRY_POINT_GROUP),
        metadata.EntryPoint(name="counting", value=f"{__name__}:RESCALED", group=registry.ENTRY_POINT_GROUP),
    ]

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        return [p for p in points if p.group == group]

    globals()["RESCALED"] = replace_name(SCALING, "rescaled")
    monkeypatch.setattr(registry.metadata, "entry_points", entry_points)
    registry.discover()
    yield
    registry.unregister("rescaled")
    globals().pop("RESCALED", None)


def replace_name(experiment: object, name: str) -> object:
    """A copy of ``experiment`` called ``name`` (an instance of a subclass, as a plug-in would declare one)."""
    kind = type(experiment)
    return type(f"Plugin{kind.__name__}", (kind,), {"name": name})()


def test_an_installed_experiment_is_found_through_its_entry_point(installed: None) -> None:
    assert registry.names()[-1] == "rescaled" and registry.get("rescaled").name == "rescaled"
    assert registry.EXPERIMENTS["counting"] == "contllm.experiments.counting:EXPERIMENT"  # built-in names win
    listing = CliRunner().invoke(app, ["run", "--help"])
    assert listing.exit_code == 0 and "rescaled" in listing.output
    assert "--threshold" in CliRunner().invoke(app, ["run", "rescaled", "--help"]).output


def test_every_declared_metric_says_its_direction_and_meaning_once() -> None:
    from contllm.experiments.base import Metric

    for name in registry.names():
        declared = registry.get(name).metrics
        assert len({m.name for m in declared}) == len(declared), name
        assert all(m.direction in ("higher", "lower") and m.meaning for m in declared), name
        assert declared, f"{name} declares no metric: contllm report cannot rank its runs"
    with pytest.raises(ExperimentError, match="direction must be 'higher' or 'lower'"):
        Metric("x", "up", "meaning")  # type: ignore[arg-type]
