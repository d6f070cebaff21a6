"""The experiment registry: every experiment's name and where its declaration lives.

An entry is ``"module:ATTR"``, an :class:`~contllm.experiments.base.Experiment` instance
named ATTR in a module (``"module"`` alone means ``module:EXPERIMENT``). Adding an
experiment is one module and one line here; third-party packages add theirs through the
entry-point group :data:`ENTRY_POINT_GROUP` instead, e.g. in their pyproject.toml::

    [project.entry-points."contllm.experiments"]
    shrink = "mypackage.shrink:EXPERIMENT"

``contllm run``, spec files, ``contllm report`` and ``--help`` all read this table;
modules are imported only when their experiment is asked for, so ``contllm --help``
stays fast.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment

#: Where installed packages declare experiments (name = "module:ATTR").
ENTRY_POINT_GROUP = "contllm.experiments"

#: name -> "module:ATTR" of its Experiment instance, in the order ``--help`` lists them.
EXPERIMENTS: dict[str, str] = {
    "counting": "contllm.experiments.counting:EXPERIMENT",
    "events": "contllm.experiments.events:EXPERIMENT",
    "boolean": "contllm.experiments.boolean:EXPERIMENT",
    "depth": "contllm.depth.experiment:EXPERIMENT",
    "pde": "contllm.pde.experiment:EXPERIMENT",
    "equivalence": "contllm.experiments.equivalence:EXPERIMENT",
    "attribution": "contllm.experiments.attribution:EXPERIMENT",
    "interpolation": "contllm.experiments.word_interpolation:EXPERIMENT",
    "linearity": "contllm.experiments.linearity:EXPERIMENT",
    "sums": "contllm.experiments.sums:EXPERIMENT",
    "tokens": "contllm.experiments.tokens:EXPERIMENT",
    "scaling": "contllm.experiments.timeline:SCALING",
    "translation": "contllm.experiments.timeline:TRANSLATION",
    "patching": "contllm.experiments.patching:EXPERIMENT",
    "lens": "contllm.experiments.lens:EXPERIMENT",
    "attention-mass": "contllm.experiments.attention_mass:EXPERIMENT",
    "counting-interpolation": "contllm.experiments.counting_interpolation:EXPERIMENT",
    "circuit": "contllm.experiments.circuit:EXPERIMENT",
}

_discovered = False


def _target(entry: str) -> tuple[str, str]:
    """("module", "ATTR") of an entry; ExperimentError for one that is not "module:ATTR" or "module"."""
    module, _, attr = entry.partition(":")
    if not module or (":" in entry and not attr.isidentifier()):
        raise ExperimentError(f"a registry entry must be 'module:ATTR', got {entry!r}")
    return module, attr or "EXPERIMENT"


def discover() -> dict[str, str]:
    """Add the experiments of installed packages (entry-point group :data:`ENTRY_POINT_GROUP`); returns those added.

    Built-in names win: an entry point that reuses one is ignored. :func:`names` and
    :func:`get` look once per process; call this again after installing a package.
    """
    global _discovered
    _discovered = True
    added: dict[str, str] = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if point.name not in EXPERIMENTS:
            EXPERIMENTS[point.name] = added[point.name] = point.value
    return added


def _entries() -> dict[str, str]:
    if not _discovered:
        discover()
    return EXPERIMENTS


def names() -> list[str]:
    """Every registered experiment's name, in registry order (built-in first, then installed ones)."""
    return list(_entries())


def known(name: Any) -> bool:
    """Whether ``name`` is a registered experiment."""
    return isinstance(name, str) and name in _entries()


def get(name: str) -> Any:
    """The :class:`~contllm.experiments.base.Experiment` called ``name``; ExperimentError naming the known ones otherwise."""
    entry = _entries().get(name) if isinstance(name, str) else None
    if entry is None:
        raise ExperimentError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}")
    module, attr = _target(entry)
    try:
        experiment = getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise ExperimentError(f"experiment {name!r}: {module} has no {attr}") from None
    if not isinstance(experiment, Experiment):
        raise ExperimentError(f"experiment {name!r}: {entry} is a {type(experiment).__name__}, not an Experiment")
    if experiment.name != name:
        raise ExperimentError(f"{entry} declares the experiment {experiment.name!r}, registered as {name!r}")
    return experiment


def register(name: str, entry: str) -> None:
    """Register the experiment at ``entry`` ("module:ATTR", or "module" for its EXPERIMENT) under ``name``; replaces nothing."""
    _target(entry)
    if name in _entries() and EXPERIMENTS[name] != entry:
        raise ExperimentError(f"an experiment called {name!r} is registered already ({EXPERIMENTS[name]})")
    EXPERIMENTS[name] = entry


def unregister(name: str) -> None:
    """Remove an experiment added by :func:`register` or discovered (tests clean up with it)."""
    EXPERIMENTS.pop(name, None)
