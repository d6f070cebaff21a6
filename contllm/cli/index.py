"""What the command line's help shows of the built-in experiments, without importing them.

An experiment's declaration (its help, description, options and metrics) lives in its
module, which imports torch and transformers at the top; ``contllm --help`` and
``contllm run NAME`` read this index of those declarations instead, a JSON file shipped
with the package (:data:`INDEX_PATH`), so that help pages and malformed values answer at
once. The index is derived, never edited by hand: ``python -m contllm.cli.index``
rewrites it from the registered experiments, and a unit test fails while it differs from
them. A run reads its options again through the imported experiment, so a stale index
could refuse a value early, never compute with a wrong one. Experiments that installed
packages register are not indexed; their commands import them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.errors import ExperimentError, ModelLoadError, RunDirectoryError
from contllm.experiments.base import Metric
from contllm.experiments.options import Option

#: The index shipped with the package.
INDEX_PATH = Path(__file__).with_name("index.json")


@dataclass(frozen=True)
class Declaration:
    """What the command line needs of an experiment: its texts, options and metrics.

    entry: the registry's "module:ATTR" it was read from. engine: whether the experiment
    evaluates through the batched engine (and so takes --max-batch-tokens, --device-map).
    """

    name: str
    entry: str
    help: str
    description: str
    engine: bool
    options: tuple[Option, ...]
    metrics: tuple[Metric, ...]

    @classmethod
    def of(cls, experiment: Any, entry: str) -> Declaration:
        """The declaration of an imported :class:`~contllm.experiments.base.Experiment`."""
        return cls(
            name=experiment.name,
            entry=entry,
            help=experiment.help,
            description=experiment.description,
            engine=bool(experiment.engine),
            options=tuple(experiment.options),
            metrics=tuple(experiment.metrics),
        )

    def check_values(self, given: Mapping[str, Any]) -> None:
        """ExperimentError for a given value that is not of its option's kind, or not one of a str option's choices.

        given: option name -> value as typed (None: not given); names the declaration does
        not hold are left to the experiment. Reads each value as the experiment will
        (:meth:`Option.read`), so the command line refuses a malformed value before the
        experiment (and torch) is imported; what the values mean together is the
        experiment's config to check.
        """
        options = {o.name: o for o in self.options}
        for name, value in given.items():
            option = options.get(name)
            if option is None or value is None:
                continue
            option.read(value)
            if option.kind == "str" and option.choices and value not in option.choices:
                allowed = " or ".join(repr(c) for c in option.choices)
                raise ExperimentError(f"{option.cli_flag.split('/')[0]} must be {allowed}, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = [{k: v for k, v in asdict(o).items() if v not in (None, ())} for o in self.options]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Declaration:
        options = tuple(Option(**{**o, "choices": tuple(o.get("choices", ()))}) for o in data["options"])
        return cls(**{**data, "options": options, "metrics": tuple(Metric(**m) for m in data["metrics"])})


def build() -> dict[str, Any]:
    """The index, read from the registered built-in experiments and the model catalog (imports them all)."""
    from contllm.models import DEFAULT_MODEL, REGISTRY

    entries = {name: entry for name, entry in registry.EXPERIMENTS.items() if entry.startswith("contllm.")}
    return {
        "models": {"default": DEFAULT_MODEL, "aliases": list(REGISTRY)},
        "experiments": {name: Declaration.of(registry.get(name), entry).to_dict() for name, entry in entries.items()},
    }


def write(path: Path = INDEX_PATH) -> Path:
    """Rewrite the index at ``path`` from the experiments; returns the path."""
    path.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


@cache
def _index() -> dict[str, Any]:
    try:
        data = json.loads(INDEX_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a checkout that lost it: help then imports the experiments
        return {"models": None, "experiments": {}}
    return data if isinstance(data, dict) else {"models": None, "experiments": {}}


def declaration(name: str, *, indexed: bool = True) -> Declaration:
    """The declaration of the registered experiment ``name``: from the index where it holds it (and ``indexed``), else imported.

    An index entry whose "module:ATTR" is not the registry's (a re-registered name) is
    not used. ExperimentError for an unknown name.
    """
    entry = registry.EXPERIMENTS.get(name) if registry.known(name) else None
    if entry is None:
        registry.get(name)  # raises the registry's error naming the known experiments
        raise ExperimentError(f"unknown experiment {name!r}")
    held = _index()["experiments"].get(name) if indexed else None
    if held is not None and held.get("entry") == entry:
        return Declaration.from_dict(held)
    return Declaration.of(registry.get(name), entry)


def models(*, indexed: bool = True) -> tuple[str, list[str]]:
    """(the default model, the embedded aliases): from the index where it holds them (and ``indexed``), else imported."""
    held = _index()["models"] if indexed else None
    if isinstance(held, dict):
        return held["default"], list(held["aliases"])
    from contllm.models import DEFAULT_MODEL, REGISTRY

    return DEFAULT_MODEL, list(REGISTRY)


if __name__ == "__main__":
    print(write())


def check_cache(model: str | None, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """ModelLoadError, before anything loads, when ``model`` is an embedded alias (None: the default model) not yet
    converted and its cache (:func:`cache_root`) is no place where a directory can be made and written (a file,
    /proc, read-only). Model-free and quick: the command line calls it before torch loads."""
    from contllm.rundir.files import cache_root
    from contllm.rundir.runs import check_place

    default, aliases = models()
    name = default if model is None else model
    if name not in aliases:
        return
    root = cache_root(cache_dir)
    if (root / name).is_dir():  # converted already: loading only reads it
        return
    try:
        check_place(root / name)
    except RunDirectoryError as exc:
        raise ModelLoadError(
            f"the model cache {root} cannot hold {name}: {exc}; choose another cache with $CONTLLM_CACHE"
        ) from None
