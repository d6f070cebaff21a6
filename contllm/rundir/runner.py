"""Every way of running an experiment, through one lifecycle.

``contllm run NAME`` (:mod:`contllm.cli.commands`), spec files (:mod:`contllm.rundir.spec`) and Python
all come here: :func:`run` writes a run directory, :func:`run_experiment` returns a
result and writes nothing, :func:`compute_records` is what both compute with.

:func:`run` checks the options, opens the run directory, loads the model, writes the
manifest, skips what a previous run finished (``resume``), shares the rest over the
processes of an ``accelerate launch`` (experiments that use the engine), saves one record
per finished item, and writes the result, its tables, its summary and its figures. What
an experiment computes is its own (:class:`contllm.experiments.base.Experiment`); how a
run is kept on disk is :mod:`contllm.rundir.runs`; which files a result becomes is
:mod:`contllm.rundir.outputs`.

Order of work: everything that can be checked without the model is checked before the
model loads, and everything that needs the model is checked before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.data import select_items
from contllm.errors import ExperimentError, RunDirectoryError
from contllm.experiments.base import Experiment, RunContext
from contllm.logs import note
from contllm.rundir.outputs import save
from contllm.rundir.runs import RunDir, base_manifest, default_out, now
from contllm.settings import ITEM_FIGURES_UP_TO, SETTINGS, RunSettings, group_bytes_from_env

Say = Callable[[str], None]


def _quiet(message: str) -> None:
    """Where news goes when nobody listens."""


# ---------------------------------------------------------------------------- computing records


def context_for(
    lm: Any,
    *,
    seed: int = 0,
    say: Say | None = None,
    model_name: str | None = None,
    max_batch_tokens: int | None = None,
    group_bytes: int | None = None,
    evaluate: Callable[[list[Any]], Any] | None = None,
) -> RunContext:
    """The :class:`RunContext` of a run on ``lm``: its engine's ``probs`` as ``evaluate`` (unless given), seed, budgets.

    group_bytes: None reads CONTLLM_GROUP_BYTES (see :mod:`contllm.settings`).
    """
    if evaluate is None:
        from contllm.core.engine import Engine

        evaluate = Engine(lm, max_batch_tokens=max_batch_tokens, keep_prefix=True).probs
    model = model_name or getattr(getattr(lm, "info", None), "name", None) or "model"
    return RunContext(
        evaluate=evaluate,
        seed=seed,
        say=say or note,
        model_name=str(model),
        max_batch_tokens=max_batch_tokens,
        group_bytes=group_bytes_from_env() if group_bytes is None else group_bytes,
    )


def run_experiment(
    lm: Any,
    name: str,
    config: Any = None,
    *,
    items: str | int | None = None,
    skip: Mapping[str, Any] | None = None,
    on_record: Callable[[str, Any], None] | None = None,
    progress: Callable[[int, int], None] | bool | None = None,
    context: RunContext | None = None,
    **context_options: Any,
) -> Any:
    """Run experiment ``name`` on ``lm`` and return its result (nothing is written)::

        result = run_experiment(contllm.load(), "counting", CountingConfig(samples=10), items="5")

    config: the experiment's config dataclass (None: defaults). items: the first N items
    or comma-separated ids (None: all). skip: records already computed, by item id
    (reused). on_record: called with (item id, record) after each new record. progress:
    True draws a progress bar over the items, False none; None (the default) draws one in
    a Jupyter notebook and none elsewhere; a function is called with (items done, items
    total) instead. context: the run's :class:`RunContext`; without it one is made by
    :func:`context_for` from ``context_options`` (evaluate, seed, say, model_name,
    max_batch_tokens, group_bytes).
    """
    experiment = registry.get(name)
    config = experiment.check_config(config if config is not None else experiment.config())
    chosen = select_items(experiment.items(config), items)
    skip = dict(skip or {})
    context = context or context_for(lm, **context_options)
    if progress is None:
        progress = in_notebook()
    if progress is True:
        return _with_progress(
            name,
            True,
            lambda tick: run_experiment(
                lm, name, config, items=items, skip=skip, on_record=on_record, progress=tick, context=context
            ),
        )
    tick = progress if callable(progress) else None
    fresh = compute_records(lm, experiment, config, chosen, context, skip=skip, on_record=on_record, progress=tick)
    records = [skip[item.id] if item.id in skip else fresh[item.id] for item in chosen]
    return experiment.result(context.model_name, config, records)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where a progress bar is drawn in the cell's output by default)."""
    import sys

    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def compute_records(
    lm: Any,
    experiment: Experiment,
    config: Any,
    chosen: Sequence[Any],
    context: RunContext,
    *,
    skip: Collection[str] = (),
    on_record: Callable[[str, Any], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    share: Callable[[list[Any]], list[Any]] | None = None,
) -> dict[str, Any]:
    """The records of the ``chosen`` items whose ids are not in ``skip``, by item id.

    Items are computed in the experiment's groups (:meth:`Experiment.groups`): a group
    with any record missing is computed whole, and the records it yields for items in
    ``skip`` are dropped. share: under a launch, takes the unfinished items and returns
    this process's part of them, which is then grouped on its own (every process gets
    work; the records agree with a single process's to float summation order).
    """
    if share is not None:
        mine = share([item for item in chosen if item.id not in skip])
        groups = experiment.groups(lm, config, mine, context) if mine else []
        calls = [mine] if groups is None else groups
    else:
        groups = experiment.groups(lm, config, chosen, context)
        if groups is None:
            calls = [[item for item in chosen if item.id not in skip]]
        else:
            calls = [group for group in groups if any(item.id not in skip for item in group)]
    wanted = {item.id for call in calls for item in call if item.id not in skip}
    total = len(wanted) if share is not None else len(chosen)
    done = total - len(wanted)
    if progress is not None:
        progress(done, total)
    fresh: dict[str, Any] = {}
    for call in calls:
        for item_id, record in experiment.run(lm, config, call, context) if call else ():
            if item_id not in wanted:
                continue
            fresh[item_id] = record
            if on_record is not None:
                on_record(item_id, record)
            done += 1
            if progress is not None:
                progress(done, total)
    return fresh


# ---------------------------------------------------------------------------- a run into a directory


@dataclass
class CheckedRun:
    """A run checked before anything loads or is written: what to compute and how to keep it."""

    experiment: Any
    config: Any
    settings: RunSettings
    resolved: dict[str, Any]  # what config.json records, and what --resume must match
    chosen: list[str]  # the item ids, in order
    progress: bool = False
    say: Say = note

    @property
    def name(self) -> str:
        return str(self.resolved["experiment"])

    @property
    def model(self) -> str:
        return self.settings.model


def check_run(
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    config: Any = None,
    settings: RunSettings | None = None,
    say: Say | None = None,
    progress: bool = False,
    **values: Any,
) -> CheckedRun:
    """Check everything about a run that needs no model and no file; ExperimentError otherwise.

    settings: the run's :class:`RunSettings`, or its fields given one by one (``values``;
    not both). options (option values by name, as typed on the command line or in a
    spec) or config (the experiment's config dataclass): the experiment's own options.
    """
    experiment = registry.get(name)
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise ExperimentError(f"run() got unknown setting(s) {', '.join(unknown)}; settings: {', '.join(SETTINGS)}")
    if settings is not None and values:
        raise ExperimentError("give either settings or its fields one by one, not both")
    settings = settings or RunSettings(**values)
    if config is not None and options:
        raise ExperimentError("give either options or a config, not both")
    config = experiment.check_config(config) if config is not None else experiment.config(options)
    settings.check_for(experiment)
    chosen = [item.id for item in select_items(experiment.items(config), settings.items)]
    resolved = {"experiment": name, **settings.recorded(), "options": experiment.config_dict(config)}
    return CheckedRun(experiment, config, settings, resolved, chosen, progress, say or note)


def run(
    name: str,
    *,
    lm: Any = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    device: str = "auto",
    **checked: Any,
) -> Path:
    """Run experiment ``name`` into a run directory; returns its path.

    checked (see :func:`check_run`): options or config, settings or the fields of a
    :class:`~contllm.settings.RunSettings` (model, items, seed, dtype, max_batch_tokens,
    device_map, item_figures, formats, group_bytes), say (where news lines go; default: the
    ``contllm`` logger at INFO, see :mod:`contllm.logs`), progress (a
    progress bar on stderr). lm: an already loaded model (then ``model`` only names it).
    out: the run directory (default runs/<name>-<model>-<time>); resume: continue the run
    there (its config.json must match); force: replace the run there.
    Raises a ContllmError subclass for bad input, before anything is written.
    """
    from contllm.rundir.distributed import check_launch_device, start_processes

    plan = check_run(name, **checked)
    settings = plan.settings
    if out is not None and (not isinstance(out, (str, Path)) or not str(out).strip()):
        raise RunDirectoryError(f"the run directory (--out) must be a path, got {out!r}")
    check_launch_device(device)  # a launch's rule first: it holds on every machine, with or without CUDA
    if lm is None and settings.device_map is None:
        from contllm.models.load import resolve_device

        resolve_device(device)  # a device that cannot hold the model is refused before anything loads
    procs = start_processes(device, device_map=settings.device_map)
    echo = plan.say if procs.is_main else _quiet
    # The default name holds the time, which the processes must agree on.
    out = Path(procs.broadcast(str(out if out is not None else default_out(name, plan.model))))
    run_dir = RunDir(out, plan.resolved, resume=resume, force=force)
    procs.barrier()  # every process has checked the directory before the main one writes to it
    try:
        if procs.is_main:  # locked before the model loads: a second process on this directory is refused at once
            run_dir.reserve()
        auto_choice = _auto_choice_of(run_dir, plan.settings)
        lm, loading = _load_unless_given(lm, plan, procs, device, echo, auto_choice)
        _check_auto_resumed(lm, auto_choice, run_dir)
        plan.experiment.check(lm, plan.config)
        return _Execution(plan, lm, run_dir, procs, echo, loading).run()
    finally:
        run_dir.close()


def _auto_choice_of(run_dir: RunDir, settings: RunSettings) -> Mapping[str, Any] | None:
    """The dtype choice a resumed ``--dtype auto`` run made when it started (its manifest's), else None.

    A resumed run keeps that dtype rather than timing again: a second choice could differ,
    and the records of one run are computed in one dtype.
    """
    from contllm.settings import AUTO_DTYPE

    if not run_dir.resumed or (settings.dtype or "").strip().lower() != AUTO_DTYPE:
        return None
    return recorded_dtype_choice([run_dir.path])


def recorded_dtype_choice(dirs: Iterable[Path]) -> Mapping[str, Any] | None:
    """The dtype choice of ``--dtype auto`` recorded in the manifest of the first of the run directories ``dirs``
    that holds one (None: none does), for a resumed run, spec or audit to load that dtype instead of timing again."""
    from contllm.rundir import schemas
    from contllm.rundir.files import read_json
    from contllm.rundir.runs import MANIFEST

    for folder in dirs:
        path = Path(folder) / MANIFEST
        if path.is_file():
            choice = read_json(path, schema=schemas.MANIFEST).get("dtype_choice")
            if isinstance(choice, Mapping):
                return choice
    return None


def keep_choice(lm: Any, choice: Mapping[str, Any]) -> Any:
    """``lm``, loaded in the dtype of a recorded ``--dtype auto`` ``choice``, with that choice on its info."""
    from dataclasses import replace

    from contllm.models.autodtype import DtypeChoice

    lm.info = replace(lm.info, dtype_choice=DtypeChoice.from_dict(choice))
    return lm


def _check_auto_resumed(lm: Any, auto_choice: Mapping[str, Any] | None, run_dir: RunDir) -> None:
    """RunDirectoryError when a resumed ``--dtype auto`` run is given a model of another dtype than its records'.

    A model loaded here has the recorded dtype; one given (a spec's or an audit's, loaded
    and timed anew) may have picked the other, and one run's records share one dtype.
    """
    if auto_choice is None or str(lm.dtype).removeprefix("torch.") == auto_choice["dtype"]:
        return
    raise RunDirectoryError(
        f"cannot resume {run_dir.path}: --dtype auto picked {auto_choice['dtype']} when it started, and the model "
        f"given is {str(lm.dtype).removeprefix('torch.')}; load it with dtype={auto_choice['dtype']!r}"
    )


def _load_unless_given(
    lm: Any, plan: CheckedRun, procs: Any, device: str, echo: Say, auto_choice: Mapping[str, Any] | None = None
) -> tuple[Any, float | None]:
    """(the run's model, seconds its load took): ``lm`` itself (None: no load) when one was given.

    auto_choice: the dtype choice of the run being resumed (:func:`_auto_choice_of`): its
    dtype is loaded, untimed, and the choice kept on the model's info.
    """
    import torch

    from contllm.rundir.distributed import device_map_memory

    settings = plan.settings
    dtype = settings.dtype if auto_choice is None else str(auto_choice["dtype"])
    torch.manual_seed(settings.seed)
    if lm is None and procs.is_main:
        _note_half_precision(dtype, procs.device or device, echo)
    loading = None
    if lm is None:
        placement: dict[str, Any] = {}
        if settings.device_map is not None:
            placement = {"device_map": settings.device_map, "max_memory": device_map_memory(procs)}
        if auto_choice is not None:
            echo(f"dtype auto: resuming in {dtype}, as picked when the run started")
        started = time.perf_counter()
        with procs.main_first():  # an embedded model is converted into the cache once
            lm = load_for_run(plan.model, device=procs.device or device, dtype=dtype, say=echo, **placement)
        loading = time.perf_counter() - started
        if auto_choice is not None:
            keep_choice(lm, auto_choice)
    return lm, loading


def load_for_run(model: str, *, device: str, dtype: str | None, say: Say, **options: Any) -> Any:
    """Load ``model`` for a run (quietly: :func:`contllm.models.load.quiet_loading`); ``say`` gets the load time."""
    import time

    from contllm import load

    started = time.perf_counter()
    lm = load(model, device=device, dtype=dtype, **options)
    say(f"loaded {lm!r} in {time.perf_counter() - started:.1f} s")
    return lm


class _Execution:
    """One run of a checked plan: open the directory, compute what is missing, write the outputs.

    The manifest records the wall time of each stage under "seconds": the model's load
    (None when the model came loaded), the evaluation (computing the missing records,
    each saved as it is finished) and the outputs (results, tables, summary, figures).
    """

    def __init__(
        self, plan: CheckedRun, lm: Any, run_dir: RunDir, procs: Any, echo: Say, loading: float | None = None
    ) -> None:
        self.plan, self.lm, self.run_dir, self.procs, self.echo = plan, lm, run_dir, procs, echo
        self.seconds: dict[str, float | None] = {"load": None if loading is None else round(loading, 3)}
        settings = plan.settings
        self.context = context_for(
            lm,
            seed=settings.seed,
            say=echo,
            model_name=plan.model,
            max_batch_tokens=settings.max_batch_tokens,
            group_bytes=settings.group_bytes,
        )

    def run(self) -> Path:
        plan, procs, run_dir = self.plan, self.procs, self.run_dir
        done = self.open() if procs.is_main else {}
        started = time.perf_counter()
        if procs.launched:
            result = self.shared(done)
            if result is None:  # not the main process: its share is on disk
                return run_dir.path
        else:
            result = self.compute(done)
        self.seconds["evaluation"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        settings = plan.settings
        per_item = settings.draws_item_figures(len(plan.chosen))
        summary = run_dir.write_outputs(
            lambda: save(result, run_dir.path, item_figures=per_item, figure_formats=settings.formats, name=plan.name)
        )
        self.seconds["outputs"] = round(time.perf_counter() - started, 3)
        run_dir.write_manifest(
            {"status": "finished", "finished": now(), "items": len(plan.chosen), "seconds": self.seconds}
        )
        for key, value in summary.items():
            if isinstance(value, float):
                self.echo(f"  {key}: {value:.4g}")
        if not per_item and settings.item_figures is None:
            self.echo(
                f"item figures not drawn ({len(plan.chosen)} {plan.experiment.unit}s; a run draws them by itself "
                f"up to {ITEM_FIGURES_UP_TO}): contllm figures {run_dir.path}"
            )
        return run_dir.path

    def open(self) -> dict[str, Any]:
        """Open the directory, write the manifest; the records a previous run finished, by item id."""
        plan, procs, run_dir = self.plan, self.procs, self.run_dir
        run_dir.open()
        where = f" with {procs.world_size} processes" if procs.launched else ""
        self.echo(
            f"{'resuming' if run_dir.resumed else 'writing'} {plan.name} on {plan.model} -> {run_dir.path}{where}"
        )
        manifest = base_manifest(self.lm, plan.model)
        if plan.experiment.engine and _is_half(self.lm):  # the engine keeps everything between the matmuls in float32
            manifest["state_dtype"] = "float32"
        if plan.settings.device_map is not None:
            manifest["device_map"] = plan.settings.device_map
        if procs.launched or run_dir.resumed:
            manifest["processes"] = procs.describe()
        run_dir.write_manifest({**manifest, "status": "running"})
        done: dict[str, Any] = {}
        if run_dir.resumed:
            run_dir.merge_shards()
            done = run_dir.finished(plan.experiment.decode)
        if done:
            self.echo(f"{len(done)} {plan.experiment.unit}s already finished; skipping them")
        return done

    def keep(self, item_id: str, record: Any) -> None:
        """Save one finished record (items/ or this process's shard)."""
        self.run_dir.save_record(item_id, self.plan.experiment.encode(record))

    def compute(self, skip: Mapping[str, Any]) -> Any:
        """The result over the run's items, each new record saved as it is finished."""
        plan = self.plan
        return _with_progress(
            plan.name,
            plan.progress,
            lambda tick: run_experiment(
                self.lm,
                plan.name,
                plan.config,
                items=plan.settings.items,
                skip=skip,
                on_record=self.keep,
                progress=tick or False,
                context=self.context,
            ),
        )

    def shared(self, done: dict[str, Any]) -> Any:
        """Under a launch: this process's share of the missing work; the main process then merges and assembles."""
        plan, procs, run_dir = self.plan, self.procs, self.run_dir
        unit = plan.experiment.unit
        pending = procs.broadcast([i for i in plan.chosen if i not in done] if procs.is_main else None)
        finished = set(plan.chosen) - set(pending)
        mine: list[str] = []

        def share(work: list[Any]) -> list[Any]:  # the unfinished items
            part = procs.share(work)
            mine.extend(item.id for item in part)
            plan.say(
                f"process {procs.rank + 1} of {procs.world_size}: {len(mine)} of {len(pending)} unfinished {unit}s"
            )
            return part

        run_dir.use_shard(procs.rank)
        if pending:
            chosen = select_items(plan.experiment.items(plan.config), plan.settings.items)
            label = f"{plan.name} [{procs.rank + 1}/{procs.world_size}]"
            _with_progress(
                label,
                procs.is_main and plan.progress,
                lambda tick: compute_records(
                    self.lm,
                    plan.experiment,
                    plan.config,
                    chosen,
                    self.context,
                    skip=finished,
                    on_record=self.keep,
                    progress=tick,
                    share=share,
                ),
            )
        # Returns once every process has finished its share (and so written its records).
        shards = procs.gather(procs.report(len(mine)))
        if not procs.is_main:
            return None
        run_dir.merge_shards()
        done = run_dir.finished(plan.experiment.decode)
        missing = [i for i in plan.chosen if i not in done]
        if missing:
            raise RunDirectoryError(
                f"{len(missing)} {unit}(s) have no record after every process finished "
                f"(first: {missing[0]}); continue with --resume"
            )
        run_dir.write_manifest({"processes": {**procs.describe(), "shards": shards}})
        # Every item is in `done`, so this only assembles the records in the items' order.
        return run_experiment(
            self.lm, plan.name, plan.config, items=plan.settings.items, skip=done, context=self.context
        )


def _note_half_precision(dtype: str | None, device: str, say: Say) -> None:
    """Say so when a half-precision run on a CPU would be no faster than float32 (a ~50 ms matmul probe)."""
    import torch

    from contllm.core.precision import is_half
    from contllm.errors import ModelLoadError
    from contllm.hardware import half_precision_note
    from contllm.models.load import parse_dtype

    try:
        kind = parse_dtype(dtype)
    except ModelLoadError:  # RunSettings refuses a bad name first; a model loads with its own check too
        return
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if is_half(kind) and on_cpu and (note := half_precision_note(kind)):
        say(note)


def _is_half(lm: Any) -> bool:
    from contllm.core.precision import is_half

    return is_half(lm.dtype)


def _with_progress(label: str, show: bool, work: Callable[[Any], Any]) -> Any:
    """``work(progress)`` under a progress bar on stderr (none when ``show`` is false)."""
    if not show:
        return work(None)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=False,
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(label, total=None)

        def tick(k: int, total: int) -> None:
            bar.update(task, completed=k, total=total)

        return work(tick)
