"""Declarative experiment specs: several models times several experiments, from one TOML file.

A spec looks like::

    out = "runs/paper"                  # root of the run directories (optional)
    models = ["smollm2-135m", "gemma3-270m"]
    dtype = "float32"                   # optional, like --dtype

    [[experiment]]
    name = "counting"                   # counting, events or boolean
    samples = 20
    range = [0.1, 1.0]
    items = "20"                        # first N, or "id1,id2"

    [[experiment]]
    name = "boolean"
    label = "boolean-slerp"             # directory name when an experiment appears twice
    method = "slerp"

Each (model, experiment) pair is written to ``<out>/<model>/<label or name>``. The whole
spec is checked before anything runs; every model is loaded once.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contllm.errors import ExperimentError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = {"out", "models", "dtype", "device", "seed", "max_batch_tokens", "item_figures", "experiment"}
EXPERIMENT_KEYS = {"name", "label", "samples", "range", "items", "chat", "template", "event", "operators", "method"}


@dataclass
class SpecEntry:
    model: str
    experiment: str
    label: str
    items: str | None
    options: dict[str, Any]


@dataclass
class Spec:
    path: Path
    out: Path
    models: list[str]
    dtype: str | None
    device: str
    seed: int
    max_batch_tokens: int | None
    item_figures: bool
    entries: list[SpecEntry]


def load_spec(path: Path) -> Spec:
    """Parse and check a spec file; ExperimentError names the file and the problem."""
    from contllm.cli import EXPERIMENT_NAMES, build_config

    where = str(path)
    if not path.is_file():
        raise ExperimentError(f"spec file {where} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"{where} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ExperimentError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_KEYS))}")
    models = data.get("models", ["smollm2-135m"])
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        raise ExperimentError(f"{where}: 'models' must be a non-empty list of model names")
    experiments = data.get("experiment")
    if not isinstance(experiments, list) or not experiments:
        raise ExperimentError(f"{where}: no [[experiment]] tables; add at least one with a 'name'")
    entries: list[SpecEntry] = []
    labels: set[str] = set()
    for k, table in enumerate(experiments, start=1):
        if not isinstance(table, dict):
            raise ExperimentError(f"{where}: experiment {k} is not a table")
        bad = sorted(set(table) - EXPERIMENT_KEYS)
        if bad:
            raise ExperimentError(f"{where}: experiment {k}: unknown key(s) {', '.join(bad)}")
        name = table.get("name")
        if name not in EXPERIMENT_NAMES:
            raise ExperimentError(
                f"{where}: experiment {k}: name must be one of {', '.join(EXPERIMENT_NAMES)}, got {name!r}"
            )
        label = str(table.get("label", name))
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
            raise ExperimentError(f"{where}: experiment {k}: label {label!r} must be a plain directory name")
        if label in labels:
            raise ExperimentError(f"{where}: experiment {k}: label {label!r} is used twice; give each a 'label'")
        labels.add(label)
        options = {key: v for key, v in table.items() if key not in ("name", "label", "items")}
        try:
            build_config(name, dict(options))
        except ExperimentError as exc:
            raise ExperimentError(f"{where}: experiment {k} ({label}): {exc}") from None
        items = table.get("items")
        for model in models:
            entries.append(SpecEntry(model, name, label, None if items is None else str(items), options))
    out = Path(data.get("out", Path("runs") / path.stem))
    return Spec(
        path=path,
        out=out,
        models=models,
        dtype=data.get("dtype"),
        device=str(data.get("device", "auto")),
        seed=int(data.get("seed", 0)),
        max_batch_tokens=data.get("max_batch_tokens"),
        item_figures=bool(data.get("item_figures", True)),
        entries=entries,
    )


def _model_dir(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or model)


def run_spec(
    path: Path,
    *,
    out: Path | None = None,
    resume: bool = False,
    force: bool = False,
    device: str | None = None,
    dtype: str | None = None,
) -> list[Path]:
    """Run every (model, experiment) of a spec; returns the run directories."""
    from contllm import load
    from contllm.cli import run_one
    from contllm.distributed import start_processes

    spec = load_spec(path)
    root = out or spec.out
    written = []
    # Under a launch each process loads on its own device, and the main process fills the model cache first.
    procs = start_processes(device if device not in (None, "auto") else spec.device)
    for model in spec.models:
        with procs.main_first():
            lm = load(
                model,
                device=procs.device or (device if device not in (None, "auto") else spec.device),
                dtype=dtype or spec.dtype,
            )
        for entry in (e for e in spec.entries if e.model == model):
            written.append(
                run_one(
                    entry.experiment,
                    model=model,
                    device=spec.device,
                    dtype=dtype or spec.dtype,
                    items=entry.items,
                    out=root / _model_dir(model) / entry.label,
                    resume=resume,
                    force=force,
                    seed=spec.seed,
                    max_batch_tokens=spec.max_batch_tokens,
                    item_figures=spec.item_figures,
                    config_options=dict(entry.options),
                    lm=lm,
                )
            )
    return written
