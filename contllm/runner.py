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


def run(
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    config: Any = None,
    model: str = DEFAULT_MODEL,
    lm: Any = None,
    items: str | int | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    device: str = "auto",
    dtype: str | None = None,
    item_figures: bool = True,
    max_batch_tokens: int | None = None,
    device_map: str | None = None,
    say: Say | None = None,
    progress: bool = False,
) -> Path:
    """Run experiment ``name`` into a run directory; returns its path.

    options: option values by name, as typed on the command line or in a spec (None:
    defaults); or config: the experiment's config dataclass itself. model: what to load
    (and how config.json names it); lm: an already loaded model (then ``model`` only
    names it). items: the first N items or comma-separated ids. out: the run directory
    (default runs/<name>-<model>-<time>); resume: continue the run there; force: replace
    the run there. max_batch_tokens, device_map: engine experiments only. say: where
    news lines go (None: nowhere). progress: draw a progress bar on stderr.
    Raises a ContllmError subclass for bad input, before anything is written.
    """
    import torch

    from contllm.distributed import device_map_memory, launch_size, start_processes
    from contllm.models import check_device_map

    say = say or _quiet
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
    procs = start_processes(device, device_map=device_map)
    echo = say if procs.is_main else _quiet
    # The default name holds the time, which the processes must agree on.
    out = procs.broadcast(Path(out) if out is not None else default_out(name, model))
    run_dir = RunDir(out, resolved, resume=resume, force=force)
    procs.barrier()  # every process has checked the directory before the main one writes to it
    torch.manual_seed(seed)
    if lm is None:
        placement: dict[str, Any] = {}
        if device_map is not None:
            placement = {"device_map": device_map, "max_memory": device_map_memory(procs)}
        with procs.main_first():  # an embedded model is converted into the cache once
            lm = load_for_run(model, device=procs.device or device, dtype=dtype, say=echo, **placement)
    experiment.check(lm, config)
    try:
        return _lifecycle(experiment, name, config, lm, run_dir, procs, chosen, resolved, echo, say, progress,
                          max_batch_tokens=max_batch_tokens, device_map=device_map, item_figures=item_figures)
    finally:
        run_dir.close()


def _lifecycle(experiment: Any, name: str, config: Any, lm: Any, run_dir: RunDir, procs: Any, chosen: list[str],
               resolved: dict[str, Any], echo: Say, say: Say, progress: bool, *, max_batch_tokens: int | None,
               device_map: str | None, item_figures: bool) -> Path:
    """Open the checked run directory, compute what is missing, and write the outputs."""
    model, items, seed = resolved["model"], resolved["items"], resolved["seed"]
    done: dict[str, Any] = {}
    if procs.is_main:
        run_dir.open()
        where = f" with {procs.world_size} processes" if procs.launched else ""
        echo(f"{'resuming' if run_dir.resumed else 'writing'} {name} on {model} -> {run_dir.path}{where}")
        manifest = base_manifest(lm, model)
        if experiment.engine and _is_half(lm):  # the engine keeps everything between the matmuls in float32
            manifest["state_dtype"] = "float32"
        if device_map is not None:
            manifest["device_map"] = device_map
        if procs.launched or run_dir.resumed:
            manifest["processes"] = procs.describe()
        run_dir.write_manifest({**manifest, "status": "running"})
        if run_dir.resumed:
            run_dir.merge_shards()
            done = run_dir.finished(experiment.decode)
        if done:
            echo(f"{len(done)} {experiment.unit}s already finished; skipping them")
    evaluate = None
    if experiment.engine:
        from contllm.engine import Engine

        evaluate = Engine(lm, max_batch_tokens=max_batch_tokens).probs

    def keep(item_id: str, record: Any) -> None:
        run_dir.save_record(item_id, experiment.encode(record))

    def compute(selection: str | int | None, skip: Mapping[str, Any], label: str, show: bool) -> Any:
        return _with_progress(
            label,
            show and progress,
            lambda tick: run_experiment(
                lm, name, config, items=selection, evaluate=evaluate, skip=skip, on_record=keep,
                progress=tick, model_name=model, seed=seed, say=echo,
            ),
        )

    if procs.launched:
        pending = procs.broadcast([i for i in chosen if i not in done] if procs.is_main else None)
        mine = procs.share(pending)
        run_dir.use_shard(procs.rank)
        say(f"process {procs.rank + 1} of {procs.world_size}: {len(mine)} of {len(pending)} unfinished {experiment.unit}s")
        if mine:
            compute(",".join(mine), {}, f"{name} [{procs.rank + 1}/{procs.world_size}]", procs.is_main)
        # Returns once every process has finished its share (and so written its records).
        shards = procs.gather(procs.report(len(mine)))
        if not procs.is_main:
            return run_dir.path
        run_dir.merge_shards()
        done = run_dir.finished(experiment.decode)
        missing = [i for i in chosen if i not in done]
        if missing:
            raise RunDirectoryError(
                f"{len(missing)} {experiment.unit}(s) have no record after every process finished "
                f"(first: {missing[0]}); continue with --resume"
            )
        run_dir.write_manifest({"processes": {**procs.describe(), "shards": shards}})
        # Every item is in `done`, so this only assembles the records in the items' order.
        result = run_experiment(lm, name, config, items=items, skip=done, model_name=model, seed=seed)
    else:
        result = compute(items, done, name, True)
    summary = save(result, run_dir.path, item_figures=item_figures, name=name)
    run_dir.write_manifest({"status": "finished", "finished": now(), "items": len(chosen)})
    for key, value in summary.items():
        if isinstance(value, float):
            echo(f"  {key}: {value:.4g}")
    return run_dir.path


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
