"""Declarative experiment specs: several models times several experiments, from one TOML file.

A spec looks like::

    out = "runs/paper"                  # root of the run directories (optional)
    models = ["smollm2-135m", "gemma3-270m"]
    dtype = "float32"                   # optional, like --dtype
    formats = "png,pdf"                 # optional, like --formats (figure formats; default png)

    [[experiment]]
    name = "counting"                   # any registered experiment (contllm run --help)
    samples = 20
    range = [0.1, 1.0]
    items = "20"                        # first N, or "id1,id2"

    [[experiment]]
    name = "boolean"
    label = "boolean-slerp"             # directory name when an experiment appears twice
    method = "slerp"

Each (model, experiment) pair is written to ``<out>/<model>/<label or name>``; labels are
single directory names. An experiment table takes ``name``, ``label``, ``items`` and the
experiment's own options (those of ``contllm run NAME --help``, with underscores). The
whole spec is checked before anything runs; every model is loaded once.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contllm.errors import ExperimentError
from contllm.rundir.files import model_folder
from contllm.rundir.schemas import non_finite
from contllm.settings import DEFAULT_FORMATS, RunSettings, figure_formats

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = {"out", "models", "dtype", "device", "seed", "max_batch_tokens", "item_figures", "formats", "experiment"}
#: Keys of an [[experiment]] table besides the experiment's own options.
ENTRY_KEYS = {"name", "label", "items"}
#: Labels and model directory names are single path components: no separators, no "." or "..".
SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: Longest label (and model directory name): a file-name component, with room to spare.
MAX_LABEL = 100


@dataclass
class SpecEntry:
    """One (model, experiment) run of a spec: the experiment, its label, its options and the run's settings."""

    experiment: str
    label: str
    options: dict[str, Any]
    settings: RunSettings

    @property
    def model(self) -> str:
        return self.settings.model


@dataclass
class Spec:
    """A checked spec file: where its runs go, its models, the device, and one entry per (model, experiment)."""

    path: Path
    out: Path
    models: list[str]
    device: str
    entries: list[SpecEntry]


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    value = data.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) and kind is not bool:
        raise ExperimentError(f"{where}: '{key}' must be {_KIND_NAMES.get(kind, 'a value')}, got {value!r}")
    if not isinstance(value, kind):
        raise ExperimentError(f"{where}: '{key}' must be {_KIND_NAMES.get(kind, 'a value')}, got {value!r}")
    return value


_KIND_NAMES: dict[Any, str] = {str: "a string", int: "an integer", bool: "true or false"}


def load_spec(path: Path, *, model: str | None = None, items: str | None = None, samples: str | None = None) -> Spec:
    """Parse and check a spec file; ExperimentError names the file and the problem.

    model, items, samples: the command line's, in place of the spec's models, and of every
    experiment's items and samples (samples only where the experiment takes it). The file's
    shape and every value's kind are checked from the experiments' declarations first
    (:mod:`contllm.cli.index`, no torch imported); then each experiment checks its options.
    """
    from contllm import registry
    from contllm.cli import index as cli_index

    where = str(path)
    if not path.is_file():
        raise ExperimentError(f"spec file {where} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ExperimentError(f"{where} is not valid TOML: {exc}") from None
    for field, value in non_finite(data):  # TOML spells them nan and inf; no setting or option takes one
        raise ExperimentError(f"{where}: {field}: expected a finite number, got {value}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ExperimentError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_KEYS))}")
    models = [model] if model is not None else data.get("models", [cli_index.models()[0]])
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        raise ExperimentError(f"{where}: 'models' must be a non-empty list of model names")
    for k, model in enumerate(models):
        if not SAFE_COMPONENT.fullmatch(model_folder(model)) or len(model_folder(model)) > MAX_LABEL:
            raise ExperimentError(
                f"{where}: model {model[:80]!r} does not give a plain directory name (at most {MAX_LABEL} characters)"
            )
        if model in models[:k]:
            raise ExperimentError(f"{where}: model {model!r} is listed twice")
        same = [m for m in models[:k] if model_folder(m) == model_folder(model)]
        if same:
            raise ExperimentError(
                f"{where}: models {same[0]!r} and {model!r} would share the directory {model_folder(model)!r}"
            )
    out = _typed(data, "out", str, None, where)
    dtype = _typed(data, "dtype", str, None, where)
    device = _typed(data, "device", str, "auto", where)
    seed = _typed(data, "seed", int, 0, where)
    max_batch_tokens = _typed(data, "max_batch_tokens", int, None, where)
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ExperimentError(f"{where}: 'max_batch_tokens' must be >= 1, got {max_batch_tokens}")
    item_figures = _typed(data, "item_figures", bool, None, where)
    formats = figure_formats(data.get("formats", DEFAULT_FORMATS), f"{where}: 'formats'")
    experiments = data.get("experiment")
    if not isinstance(experiments, list) or not experiments:
        raise ExperimentError(f"{where}: no [[experiment]] tables; add at least one with a 'name'")
    try:  # the settings every entry shares, checked once
        settings = RunSettings(
            model=models[0],
            seed=seed,
            dtype=dtype,
            item_figures=item_figures,
            formats=formats,
            max_batch_tokens=max_batch_tokens,
        )
    except ExperimentError as exc:
        raise ExperimentError(f"{where}: {exc}") from None
    tables: list[tuple[str, str, dict[str, Any], str | None]] = []
    labels: set[str] = set()
    for k, table in enumerate(experiments, start=1):
        if not isinstance(table, dict):
            raise ExperimentError(f"{where}: experiment {k} is not a table")
        name = table.get("name")
        if not isinstance(name, str) or not registry.known(name):
            raise ExperimentError(
                f"{where}: experiment {k}: name must be one of {', '.join(registry.names())}, got {name!r}"
            )
        declared = cli_index.declaration(name)
        allowed = ENTRY_KEYS | {o.name for o in declared.options}
        table = {
            **table,
            **({} if items is None else {"items": items}),
            **({"samples": samples} if samples is not None and "samples" in allowed else {}),
        }
        bad = sorted(set(table) - allowed)
        if bad:
            raise ExperimentError(
                f"{where}: experiment {k}: unknown key(s) {', '.join(bad)}; {name} takes {', '.join(sorted(allowed))}"
            )
        label = table.get("label", name)
        if not isinstance(label, str) or not SAFE_COMPONENT.fullmatch(label) or len(label) > MAX_LABEL:
            shown = repr(label)
            if len(shown) > 60:  # a long string is cut, with its length; another value (a TOML date) has no length
                shown = f"{shown[:40]}... ({len(label)} characters)" if isinstance(label, str) else f"{shown[:40]}..."
            raise ExperimentError(
                f"{where}: experiment {k}: label {shown} must be a plain directory name "
                f"(letters, digits, '_', '.', '-'; not starting with '.' or '-'; at most {MAX_LABEL} characters)"
            )
        if label in labels:
            raise ExperimentError(f"{where}: experiment {k}: label {label!r} is used twice; give each a 'label'")
        labels.add(label)
        if not declared.engine and max_batch_tokens is not None:
            raise ExperimentError(f"{where}: experiment {k} ({label}): max_batch_tokens does not apply to {name}")
        options = {key: v for key, v in table.items() if key not in ENTRY_KEYS}
        chosen = table.get("items")  # this experiment's own, or the command line's for every one
        if chosen is not None and (isinstance(chosen, bool) or not isinstance(chosen, (str, int))):
            raise ExperimentError(f"{where}: experiment {k} ({label}): 'items' must be a count or a string of ids")
        chosen = None if chosen is None else str(chosen)
        try:
            declared.check_values(options)
            replace(settings, items=chosen)
        except ExperimentError as exc:
            raise ExperimentError(f"{where}: experiment {k} ({label}): {exc}") from None
        tables.append((name, label, options, chosen))
    entries: list[SpecEntry] = []
    for k, (name, label, options, chosen) in enumerate(tables, start=1):
        try:
            entries += _entries(name, label, options, chosen, models, settings)
        except ExperimentError as exc:
            raise ExperimentError(f"{where}: experiment {k} ({label}): {exc}") from None
    root = Path(out) if out is not None else Path("runs") / path.stem
    return Spec(path, root, models, device, entries)


def _entries(
    name: str, label: str, options: dict[str, Any], items: str | None, models: list[str], shared: RunSettings
) -> list[SpecEntry]:
    """One checked entry per model of experiment ``name`` (imports the experiment); ExperimentError otherwise."""
    from contllm import registry
    from contllm.data import select_items

    experiment = registry.get(name)
    config = experiment.config(options)
    select_items(experiment.items(config), items)
    out = []
    for model in models:
        settings = replace(shared, model=model, items=items)
        settings.check_for(experiment)
        out.append(SpecEntry(name, label, options, settings))
    return out


def run_spec(
    path: Path,
    *,
    out: Path | None = None,
    resume: bool = False,
    force: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    say: Any = None,
    model: str | None = None,
    items: str | None = None,
    samples: str | None = None,
    formats: str | None = None,
) -> list[Path]:
    """Run every (model, experiment) of a spec through :func:`contllm.rundir.runner.run`; returns the run directories.

    Every entry's options and items are checked before the first model loads. device,
    dtype and formats (the figure formats, "png,pdf") override the spec's; model, items
    and samples as :func:`load_spec` says.
    """
    from contllm.rundir.runs import check_modes

    check_modes(resume=resume, force=force)  # the command line's own mistakes first, before any experiment loads
    drawn_as = figure_formats(formats) if formats is not None else None
    spec = load_spec(path, model=model, items=items, samples=samples)
    from contllm import load  # the heavy modules once the spec holds
    from contllm.rundir.distributed import start_processes
    from contllm.rundir.runner import keep_choice, recorded_dtype_choice, run

    root = out if out is not None else spec.out
    device = device if device not in (None, "auto") else spec.device
    entries = [replace(e, settings=replace(e.settings, dtype=dtype)) if dtype else e for e in spec.entries]
    if drawn_as is not None:
        entries = [replace(e, settings=replace(e.settings, formats=drawn_as)) for e in entries]
    # Under a launch each process loads on its own device, and the main process fills the model cache first.
    procs = start_processes(device)
    targets = check_targets(spec, entries, Path(root), resume=resume, force=force, device=procs.device or device)
    written = []
    every_run: dict[str, Any] = dict(resume=resume, force=force, device=device, say=say, progress=say is not None)
    for model in spec.models:
        mine = [(e, t) for e, t in zip(entries, targets) if e.model == model]
        wanted = mine[0][0].settings.dtype
        # A resumed spec loads the dtype that --dtype auto picked when its runs started, instead of timing again.
        picked = recorded_dtype_choice(t for _, t in mine) if resume and str(wanted).lower() == "auto" else None
        with procs.main_first():
            lm = load(model, device=procs.device or device, dtype=wanted if picked is None else picked["dtype"])
        if picked is not None:
            keep_choice(lm, picked)
        for entry, out_dir in mine:
            written.append(
                run(
                    entry.experiment,
                    lm=lm,
                    out=out_dir,
                    options=dict(entry.options),
                    settings=entry.settings,
                    **every_run,
                )
            )
    return written


def check_targets(
    spec: Spec, entries: list[SpecEntry], root: Path, *, resume: bool, force: bool, device: str
) -> list[Path]:
    """The run directory of every entry, each checked as its run will check it; before any model loads.

    Every model is resolved (an alias, a directory or a hub id), the device is checked,
    and no two entries may share a directory. An ExperimentError, ModelLoadError or
    RunDirectoryError names the first problem.
    """
    from contllm.errors import RunDirectoryError
    from contllm.models.catalog import resolve
    from contllm.models.load import resolve_device
    from contllm.rundir.runner import check_run
    from contllm.rundir.runs import RunDir

    if not str(root).strip():
        raise RunDirectoryError(f"{spec.path}: the output root must be a path, got {str(root)!r}")
    for model in spec.models:
        resolve(model)
    resolve_device(device)
    targets: dict[Path, SpecEntry] = {}
    for entry in entries:
        target = root / model_folder(entry.model) / entry.label
        if target in targets:
            raise RunDirectoryError(
                f"{spec.path}: {entry.model} {entry.label} and {targets[target].model} {targets[target].label} "
                f"would both write {target}"
            )
        targets[target] = entry
        plan = check_run(entry.experiment, options=dict(entry.options), settings=entry.settings)
        RunDir(target, plan.resolved, resume=resume, force=force)  # checks only; writes nothing
    return list(targets)
