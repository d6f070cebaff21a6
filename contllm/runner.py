"""The one run lifecycle, for every registered experiment.

:func:`run` checks the options, opens the run directory, loads the model, writes the
manifest, skips what a previous run finished (``resume``), shares the rest over the
processes of an ``accelerate launch`` (experiments that use the engine), saves one record
per finished item, and writes the result, its tables, its summary and its figures. What
an experiment computes is its own (:class:`contllm.experiments.base.Experiment`); how a
run is kept on disk is :mod:`contllm.runs`.

Order of work: everything that can be checked without the model is checked before the
model loads, and everything that needs the model is checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.data import select_items
from contllm.errors import ExperimentError, RunDirectoryError
from contllm.experiments import run_experiment, save
from contllm.models import DEFAULT_MODEL
from contllm.runs import RunDir, base_manifest, default_out, load_for_run, now

Say = Callable[[str], None]


def _quiet(message: str) -> None:
    """Where news goes when nobody listens."""


@dataclass
class Plan:
    """A run checked before anything loads or is written: what to compute and how to keep it."""

    experiment: Any
    config: Any
    resolved: dict[str, Any]  # what config.json records, and what --resume must match
    chosen: list[str]  # the item ids, in order
    item_figures: bool = True
    max_batch_tokens: int | None = None
    device_map: str | None = None
    progress: bool = False
    say: Say = _quiet

    @property
    def name(self) -> str:
        return str(self.resolved["experiment"])

    @property
    def model(self) -> str:
        return str(self.resolved["model"])


def plan(
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    config: Any = None,
    model: str = DEFAULT_MODEL,
    items: str | int | None = None,
    seed: int = 0,
    dtype: str | None = None,
    item_figures: bool = True,
    max_batch_tokens: int | None = None,
    device_map: str | None = None,
    say: Say | None = None,
    progress: bool = False,
) -> Plan:
    """Check everything about a run that needs no model and no file; ExperimentError otherwise."""
    from contllm.distributed import launch_size
    from contllm.models import check_device_map

    experiment = registry.get(name)
    if config is not None and options:
        raise ExperimentError("give either options or a config, not both")
    config = experiment.check_config(config) if config is not None else experiment.config(options)
    if not experiment.engine:
        unused = [flag for flag, value in (("--max-batch-tokens", max_batch_tokens), ("--device-map", device_map)) if value is not None]
        if unused:
            raise ExperimentError(f"option(s) {', '.join(unused)} do not apply to the {name} experiment")
    if not experiment.shardable and launch_size() > 1:
        raise ExperimentError(f"{name} runs in one process; start it without a launcher")
    if max_batch_tokens is not None and (isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int) or max_batch_tokens < 1):
        raise ExperimentError(f"--max-batch-tokens must be an integer >= 1, got {max_batch_tokens!r}")
    if device_map is not None:
        check_device_map(device_map)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ExperimentError(f"seed must be an integer, got {seed!r}")
    chosen = [item.id for item in select_items(experiment.items(config), items)]
    resolved = {
        "experiment": name,
        "model": model,
        "dtype": dtype,
        "items": None if items is None else str(items),
        "seed": seed,
        "options": experiment.config_dict(config),
    }
    if experiment.engine:  # the chunking changes float summation order: a resumed run must keep it
        resolved["max_batch_tokens"] = max_batch_tokens
    return Plan(experiment, config, resolved, chosen, item_figures, max_batch_tokens, device_map, progress, say or _quiet)


def run(
    name: str,
    *,
    lm: Any = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    device: str = "auto",
    **settings: Any,
) -> Path:
    """Run experiment ``name`` into a run directory; returns its path.

    settings (see :func:`plan`): options (option values by name, as typed on the command
    line or in a spec; None: defaults) or config (the experiment's config dataclass),
    model (what to load, and how config.json names it; default the embedded SmolLM2),
    items (the first N or comma-separated ids), seed, dtype, item_figures,
    max_batch_tokens and device_map (engine experiments), say (where news lines go),
    progress (a progress bar on stderr). lm: an already loaded model (then ``model``
    only names it). out: the run directory (default runs/<name>-<model>-<time>);
    resume: continue the run there; force: replace the run there.
    Raises a ContllmError subclass for bad input, before anything is written.
    """
    import torch

    from contllm.distributed import device_map_memory, start_processes

    checked = plan(name, **settings)
    procs = start_processes(device, device_map=checked.device_map)
    echo = checked.say if procs.is_main else _quiet
    # The default name holds the time, which the processes must agree on.
    out = Path(procs.broadcast(str(out if out is not None else default_out(name, checked.model))))
    run_dir = RunDir(out, checked.resolved, resume=resume, force=force)
    procs.barrier()  # every process has checked the directory before the main one writes to it
    torch.manual_seed(checked.resolved["seed"])
    if lm is None and procs.is_main:
        _note_half_precision(checked.resolved["dtype"], procs.device or device, echo)
    if lm is None:
        placement: dict[str, Any] = {}
        if checked.device_map is not None:
            placement = {"device_map": checked.device_map, "max_memory": device_map_memory(procs)}
        with procs.main_first():  # an embedded model is converted into the cache once
            lm = load_for_run(checked.model, device=procs.device or device, dtype=checked.resolved["dtype"],
                              say=echo, **placement)
    checked.experiment.check(lm, checked.config)
    try:
        return _Execution(checked, lm, run_dir, procs, echo).run()
    finally:
        run_dir.close()


class _Execution:
    """One run of a checked plan: open the directory, compute what is missing, write the outputs."""

    def __init__(self, plan: Plan, lm: Any, run_dir: RunDir, procs: Any, echo: Say) -> None:
        self.plan, self.lm, self.run_dir, self.procs, self.echo = plan, lm, run_dir, procs, echo
        self.evaluate = None
        if plan.experiment.engine:
            from contllm.engine import Engine

            self.evaluate = Engine(lm, max_batch_tokens=plan.max_batch_tokens).probs

    def run(self) -> Path:
        plan, procs, run_dir = self.plan, self.procs, self.run_dir
        done = self.open() if procs.is_main else {}
        if procs.launched:
            result = self.shared(done)
            if result is None:  # not the main process: its share is on disk
                return run_dir.path
        else:
            result = self.compute(plan.resolved["items"], done, plan.name, True)
        summary = save(result, run_dir.path, item_figures=plan.item_figures, name=plan.name)
        run_dir.write_manifest({"status": "finished", "finished": now(), "items": len(plan.chosen)})
        for key, value in summary.items():
            if isinstance(value, float):
                self.echo(f"  {key}: {value:.4g}")
        return run_dir.path

    def open(self) -> dict[str, Any]:
        """Open the directory, write the manifest; the records a previous run finished, by item id."""
        plan, procs, run_dir = self.plan, self.procs, self.run_dir
        run_dir.open()
        where = f" with {procs.world_size} processes" if procs.launched else ""
        self.echo(f"{'resuming' if run_dir.resumed else 'writing'} {plan.name} on {plan.model} -> {run_dir.path}{where}")
        manifest = base_manifest(self.lm, plan.model)
        if plan.experiment.engine and _is_half(self.lm):  # the engine keeps everything between the matmuls in float32
            manifest["state_dtype"] = "float32"
        if plan.device_map is not None:
            manifest["device_map"] = plan.device_map
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

    def compute(self, selection: str | int | None, skip: Mapping[str, Any], label: str, show: bool) -> Any:
        """The result over ``selection``, each new record saved as it is finished."""
        plan = self.plan

        def keep(item_id: str, record: Any) -> None:
            self.run_dir.save_record(item_id, plan.experiment.encode(record))

        return _with_progress(
            label,
            show and plan.progress,
            lambda tick: run_experiment(
                self.lm, plan.name, plan.config, items=selection, evaluate=self.evaluate, skip=skip,
                on_record=keep, progress=tick, model_name=plan.model, seed=plan.resolved["seed"], say=self.echo,
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
            plan.say(f"process {procs.rank + 1} of {procs.world_size}: {len(mine)} of {len(pending)} unfinished {unit}s")
            return part

        run_dir.use_shard(procs.rank)
        if pending:
            from contllm.experiments import compute_records
            from contllm.experiments.base import Context

            chosen = select_items(plan.experiment.items(plan.config), plan.resolved["items"])
            context = Context(evaluate=self.evaluate, seed=plan.resolved["seed"], say=self.echo, model_name=plan.model)

            def keep(item_id: str, record: Any) -> None:
                run_dir.save_record(item_id, plan.experiment.encode(record))

            label = f"{plan.name} [{procs.rank + 1}/{procs.world_size}]"
            _with_progress(label, procs.is_main and plan.progress, lambda tick: compute_records(
                self.lm, plan.experiment, plan.config, chosen, context, skip=finished, on_record=keep,
                progress=tick, share=share))
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
        return run_experiment(self.lm, plan.name, plan.config, items=plan.resolved["items"], skip=done,
                              model_name=plan.model, seed=plan.resolved["seed"])


def _note_half_precision(dtype: str | None, device: str, say: Say) -> None:
    """Say so when a half-precision run on a CPU would be no faster than float32 (a ~50 ms matmul probe)."""
    import torch

    from contllm.errors import ModelLoadError
    from contllm.hardware import half_precision_note
    from contllm.models.load import parse_dtype
    from contllm.precision import is_half

    try:
        kind = parse_dtype(dtype)
    except ModelLoadError:  # a bad name is refused where the model loads
        return
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if is_half(kind) and on_cpu and (note := half_precision_note(kind)):
        say(note)


def _is_half(lm: Any) -> bool:
    from contllm.precision import is_half

    return is_half(lm.dtype)


def _with_progress(label: str, show: bool, work: Callable[[Any], Any]) -> Any:
    """``work(progress)`` under a progress bar on stderr (none when ``show`` is false)."""
    if not show:
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
