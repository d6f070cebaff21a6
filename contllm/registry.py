"""The experiment registry: every experiment's name and the module that declares it.

Adding an experiment is one module that defines ``EXPERIMENT`` (an instance of
:class:`contllm.experiments.base.Experiment`) and one line here. ``contllm run``, spec
files, ``contllm report`` and ``--help`` all read this table; modules are imported only
when their experiment is asked for, so ``contllm --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from contllm.errors import ExperimentError

#: name -> module defining EXPERIMENT, in the order ``--help`` lists them.
EXPERIMENTS: dict[str, str] = {
    "counting": "contllm.experiments.counting",
    "events": "contllm.experiments.events",
    "boolean": "contllm.experiments.boolean",
    "depth": "contllm.depth.experiment",
    "pde": "contllm.pde.experiment",
    "equivalence": "contllm.experiments.equivalence",
    "attribution": "contllm.experiments.attribution",
    "interpolation": "contllm.experiments.interpolation",
    "linearity": "contllm.experiments.linearity",
    "sums": "contllm.experiments.sums",
    "tokens": "contllm.experiments.tokens",
    "scaling": "contllm.experiments.scaling",
    "translation": "contllm.experiments.translation",
}


def names() -> list[str]:
    """Every registered experiment's name, in registry order."""
    return list(EXPERIMENTS)


def get(name: str) -> Any:
    """The :class:`~contllm.experiments.base.Experiment` called ``name``; ExperimentError naming the known ones otherwise."""
    module = EXPERIMENTS.get(name) if isinstance(name, str) else None
    if module is None:
        raise ExperimentError(f"unknown experiment {name!r}; known experiments: {', '.join(EXPERIMENTS)}")
    experiment = importlib.import_module(module).EXPERIMENT
    if experiment.name != name:
        raise ExperimentError(f"{module} declares the experiment {experiment.name!r}, registered as {name!r}")
    return experiment


def register(name: str, module: str) -> None:
    """Register an experiment declared in ``module`` (for plug-ins and tests); replaces nothing."""
    if name in EXPERIMENTS and EXPERIMENTS[name] != module:
        raise ExperimentError(f"an experiment called {name!r} is registered already ({EXPERIMENTS[name]})")
    EXPERIMENTS[name] = module


def unregister(name: str) -> None:
    """Remove an experiment added by :func:`register` (tests clean up with it)."""
    EXPERIMENTS.pop(name, None)
