"""The command line: ``contllm run``, ``contllm models``, ``contllm report``.

Errors a user can cause print one line and exit with status 2; nothing already written is
overwritten without --resume or --force.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from contllm.errors import ContllmError, ExperimentError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Probe the implicit continuity of pretrained language models.",
)

EXPERIMENT_NAMES = ("counting", "events", "boolean")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def build_config(experiment: str, options: dict[str, Any]) -> Any:
    """The experiment's config dataclass from CLI or spec options (None means: the default)."""
    from contllm.experiments import BooleanConfig, CountingConfig, EventsConfig
    from contllm.experiments.base import parse_range

    given = {k: v for k, v in options.items() if v is not None}
    kwargs: dict[str, Any] = {}
    if "range" in given:
        value = given.pop("range")
        if isinstance(value, (list, tuple)) and len(value) == 2:
            value = f"{value[0]},{value[1]}"
        low, high = parse_range(str(value))
        kwargs["low"], kwargs["high"] = low, high
    for key in ("samples", "template", "chat"):
        if key in given:
            kwargs[key] = given.pop(key)
    if experiment == "counting":
        config_type: Any = CountingConfig
    elif experiment == "events":
        config_type = EventsConfig
        if "event" in given:
            kwargs["event"] = int(given.pop("event"))
    elif experiment == "boolean":
        config_type = BooleanConfig
        if "operators" in given:
            ops = given.pop("operators")
            kwargs["operators"] = tuple(o.strip() for o in (ops.split(",") if isinstance(ops, str) else ops) if o.strip())
        if "method" in given:
            kwargs["method"] = given.pop("method")
    else:
        raise ExperimentError(f"unknown experiment {experiment!r}; known experiments: {', '.join(EXPERIMENT_NAMES)}")
    extra = sorted(k for k in given if k not in RUN_KEYS)
    if extra:
        raise ExperimentError(f"option(s) {', '.join(extra)} do not apply to the {experiment} experiment")
    if "samples" in kwargs and int(kwargs["samples"]) < 1:
        raise ExperimentError(f"samples must be >= 1, got {kwargs['samples']}")
    return config_type(**kwargs)


#: Options that belong to the run rather than to the experiment's config.
RUN_KEYS = {"model", "device", "dtype", "items", "batch_size", "max_batch_tokens", "out", "seed", "item_figures"}


def run_one(
    experiment: str,
    *,
    model: str,
    device: str,
    dtype: Optional[str],
    items: Optional[str],
    out: Optional[Path],
    resume: bool,
    force: bool,
    seed: int,
    max_batch_tokens: Optional[int],
    item_figures: bool,
    config_options: dict[str, Any],
    lm: Any = None,
    batch_size: Optional[int] = None,
    device_map: Optional[str] = None,
) -> Path:
    """Run one experiment on one model into a run directory; returns its path.

    Under ``accelerate launch`` every process runs this: each computes its share of the
    unfinished items into its own shard of the directory, and the main process merges
    the shards and writes what a single process would (see :mod:`contllm.distributed`).
    device_map: "auto" spreads a model too large for one device over the devices.
    """
    import torch

    from contllm import plotting
    from contllm.data import select_items
    from contllm.distributed import device_map_memory, start_processes
    from contllm.engine import Engine
    from contllm.errors import RunDirectoryError
    from contllm.experiments import get_experiment, run_experiment
    from contllm.experiments.base import config_dict
    from contllm.precision import is_half
    from contllm.runs import RunDir, atomic_write_json, base_manifest, default_out, load_for_run, now

    kind = get_experiment(experiment)
    config = build_config(experiment, config_options)
    chosen = [item.id for item in select_items(kind.items(config), items)]
    resolved = {
        "experiment": experiment,
        "model": model,
        "dtype": dtype,
        "items": items,
        "seed": seed,
        "options": config_dict(config),
    }
    procs = start_processes(device, device_map=device_map)
    echo = (lambda message: typer.echo(message, err=True)) if procs.is_main else (lambda message: None)
    # The default name holds the time, which the processes must agree on.
    out = procs.broadcast(out or default_out(experiment, model))
    run = RunDir(out, resolved, resume=resume, force=force)
    procs.barrier()  # every process has checked the directory before the main one writes to it
    torch.manual_seed(seed)
    if lm is None:
        placement: dict[str, Any] = {}
        if device_map is not None:
            placement = {"device_map": device_map, "max_memory": device_map_memory(procs)}
        with procs.main_first():  # an embedded model is converted into the cache once
            lm = load_for_run(model, device=procs.device or device, dtype=dtype, say=echo, **placement)
    done: dict[str, Any] = {}
    if procs.is_main:
        run.open()
        where = f" with {procs.world_size} processes" if procs.launched else ""
        echo(f"{'resuming' if run.resumed else 'writing'} {experiment} on {model} -> {run.path}{where}")
        manifest = base_manifest(lm, model)
        if is_half(lm.dtype):  # the engine keeps everything between the matmuls in float32
            manifest["state_dtype"] = "float32"
        if device_map is not None:
            manifest["device_map"] = device_map
        if procs.launched or run.resumed:
            manifest["processes"] = procs.describe()
        run.write_manifest({**manifest, "status": "running"})
        if run.resumed:
            run.merge_shards()
            done = run.finished()
        if done:
            echo(f"{len(done)} items already finished; skipping them")
    engine = Engine(lm, max_batch_tokens=max_batch_tokens)

    def evaluate(signals: list) -> Any:
        return _in_batches(engine, signals, batch_size)

    mine: list[str] = []
    if procs.launched:
        pending = procs.broadcast([item_id for item_id in chosen if item_id not in done] if procs.is_main else None)
        mine = procs.share(pending)
        run.use_shard(procs.rank)
        typer.echo(f"process {procs.rank + 1} of {procs.world_size}: {len(mine)} of {len(pending)} unfinished items", err=True)
        if mine:
            _with_progress(
                f"{experiment} [{procs.rank + 1}/{procs.world_size}]",
                procs.is_main,
                lambda progress: run_experiment(
                    lm, experiment, config, items=",".join(mine), evaluate=evaluate,
                    on_sweep=run.save_sweep, progress=progress, model_name=model,
                ),
            )
        # Returns once every process has finished its share (and so written its records).
        shards = procs.gather(procs.report(len(mine)))
        if not procs.is_main:
            return run.path
        run.merge_shards()
        done = run.finished()
        missing = [item_id for item_id in chosen if item_id not in done]
        if missing:
            raise RunDirectoryError(
                f"{len(missing)} item(s) have no record after every process finished (first: {missing[0]}); "
                "continue with --resume"
            )
        # Every item is in `done`, so this only assembles the records in the items' order.
        result = run_experiment(lm, experiment, config, items=items, evaluate=evaluate, skip=done, model_name=model)
        run.write_manifest({"processes": {**procs.describe(), "shards": shards}})
    else:
        result = _with_progress(
            experiment,
            True,
            lambda progress: run_experiment(
                lm, experiment, config, items=items, evaluate=evaluate, skip=done,
                on_sweep=run.save_sweep, progress=progress, model_name=model,
            ),
        )
    result.save(run.path)
    summary = result.summary()
    atomic_write_json(run.path / "summary.json", summary)
    plotting.save_all(result, run.path / "figures", per_item=item_figures)
    run.write_manifest({"status": "finished", "finished": now(), "items": len(result.sweeps)})
    for key, value in summary.items():
        if isinstance(value, float):
            echo(f"  {key}: {value:.3f}")
    typer.echo(str(run.path))
    return run.path


def _with_progress(label: str, show: bool, work: Any) -> Any:
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

        def progress(k: int, total: int) -> None:
            bar.update(task, completed=k, total=total)

        return work(progress)


def _check_processes(target: str, device_map: Optional[str]) -> None:
    """Refuse what a launch or a device map cannot do, before anything loads or writes."""
    from contllm.distributed import launch_size
    from contllm.models import check_device_map

    spec_file = target.endswith(".toml") or Path(target).is_file()
    if device_map is not None:
        if target not in EXPERIMENT_NAMES:
            raise ExperimentError(f"--device-map applies to {', '.join(EXPERIMENT_NAMES)} runs, not {target}")
        check_device_map(device_map)
    if launch_size() > 1 and target not in EXPERIMENT_NAMES and not spec_file:
        raise ExperimentError(
            f"{target} runs in one process; start it without a launcher "
            f"({', '.join(EXPERIMENT_NAMES)} and spec files are the runs shared over processes)"
        )


def _in_batches(engine: Any, signals: list, batch_size: Optional[int]) -> Any:
    """Engine probabilities, at most ``batch_size`` signals per engine call (None: no cap)."""
    import torch

    if batch_size is None or len(signals) <= batch_size:
        return engine.probs(signals)
    return torch.cat([engine.probs(signals[i : i + batch_size]) for i in range(0, len(signals), batch_size)])


@app.command()
def run(
    target: str = typer.Argument(..., help="An experiment (counting, events, boolean, depth, pde) or a spec file (.toml)."),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Embedded alias (smollm2-135m, gemma3-270m), Hugging Face id or local directory. [default: smollm2-135m]"
    ),
    device: str = typer.Option("auto", help="auto (CUDA when available, else CPU), cpu, cuda, cuda:1, ..."),
    dtype: Optional[str] = typer.Option(None, help="float32 (default on CPU), bfloat16 or float16."),
    samples: Optional[int] = typer.Option(
        None, "--samples", "-n", help="Values of the factor (or alpha) per item. [default: 10 (counting, events: 0.1, 0.2, ..., 1.0), 21 (boolean)]"
    ),
    range_: Optional[str] = typer.Option(
        None, "--range", help="MIN,MAX of the duration factor (default 0.1,1.0) or of alpha (default 0,1)."
    ),
    items: Optional[str] = typer.Option(None, "--items", help="The first N items, or a comma-separated list of item ids."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Most signals evaluated in one forward (sets the memory budget with the prompt length)."
    ),
    max_batch_tokens: Optional[int] = typer.Option(
        None, "--max-batch-tokens", help="Most tokens (rows x padded length) in one forward. [default: automatic]"
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory. [default: runs/<experiment>-<model>-<time>]"),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out, skipping finished items."),
    force: bool = typer.Option(False, "--force", help="Replace the run in --out."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Wrap prompts in the model's chat template."),
    seed: int = typer.Option(0, help="Random seed (recorded; the sweeps themselves are deterministic)."),
    template: Optional[str] = typer.Option(None, help="Prompt template; see the experiment's docs for its fields."),
    event: Optional[int] = typer.Option(None, help="events: scale only this event (1-based); 0 scales all."),
    operators: Optional[str] = typer.Option(None, help="boolean: comma-separated operators to pair, e.g. AND,XOR."),
    method: Optional[str] = typer.Option(None, help="boolean: linear or slerp interpolation. [default: linear]"),
    item_figures: bool = typer.Option(True, "--item-figures/--no-item-figures", help="Also draw one figure per item."),
    device_map: Optional[str] = typer.Option(
        None, "--device-map", help="auto: spread a model too large for one device over the GPUs (accelerate); --device is then unused."
    ),
    layer: Optional[str] = typer.Option(
        None, "--layer", help="depth: layers of the single-layer probes, comma-separated, negative from the end. [default: first, 1/4, 1/2, 3/4, last]"
    ),
    eps: Optional[str] = typer.Option(
        None, "--eps", help="depth: perturbation sizes relative to ||h||, comma-separated, > 0. [default: 1e-3,1e-2,1e-1]"
    ),
    alphas: Optional[str] = typer.Option(
        None, "--alphas", help="depth: update scales alpha in [0, 2], comma-separated (1 is always added). [default: 0,0.25,...,2]"
    ),
    times: Optional[str] = typer.Option(
        None, "--times", help="pde: pseudo-times T >= 0, comma-separated (0 is always added). [default: 0,0.1,0.4,1,4,16,64,256]"
    ),
    dynamics: Optional[str] = typer.Option(None, "--dynamics", help="pde: diffusion, wave or reaction. [default: diffusion]"),
    variants: Optional[str] = typer.Option(
        None, "--variants", help="pde: attention, matched (temperature control), hidden (state smoothing), comma-separated. [default: all]"
    ),
    head: Optional[int] = typer.Option(None, "--head", help="pde: only this head of each layer in scope (--layer: one layer)."),
    spacing: Optional[str] = typer.Option(None, "--spacing", help="pde: time (cells as wide as durations) or index. [default: time]"),
    rho: Optional[float] = typer.Option(None, "--rho", help="pde: reaction strength of --dynamics reaction. [default: 1]"),
    wave_speed: Optional[float] = typer.Option(None, "--wave-speed", help="pde: wave speed c of --dynamics wave. [default: 1]"),
    long_range: Optional[int] = typer.Option(None, "--long-range", help="pde: D of the long-range mass (keys more than D back). [default: 32]"),
) -> None:
    """Run an experiment (counting, events, boolean, depth, pde) or a spec of several, and write a run directory.

    The directory holds config.json, manifest.json, results.json, results.csv,
    summary.json and figures/ (PNG and PDF). Examples:

      contllm run counting

      contllm run counting --items 10 --samples 10 --range 0.2,1.5 --out runs/quick

      contllm run boolean --operators AND,OR,XOR --method slerp

      contllm run pde --times 0,1,16 --variants attention,matched

      contllm run experiments/paper.toml
    """
    try:
        _check_processes(target, device_map)
        if batch_size is not None and batch_size < 1:
            raise ExperimentError(f"--batch-size must be >= 1, got {batch_size}")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ExperimentError(f"--max-batch-tokens must be >= 1, got {max_batch_tokens}")
        config_options = {
            "samples": samples,
            "range": range_,
            "chat": chat,
            "template": template,
            "event": event,
            "operators": operators,
            "method": method,
        }
        if target.endswith(".toml") or Path(target).is_file():
            from contllm.distributed import start_processes
            from contllm.spec import run_spec

            start_processes(device)  # launched: this process's device is chosen before the spec loads a model
            run_spec(Path(target), out=out, resume=resume, force=force, device=device, dtype=dtype)
            return
        if target == "depth":
            from contllm.depth import run_depth_command

            path = run_depth_command(
                model=model or "smollm2-135m", device=device, dtype=dtype, items=items, out=out,
                resume=resume, force=force, seed=seed, item_figures=item_figures,
                layer=layer, eps=eps, alphas=alphas,
                unused={**config_options, "batch_size": batch_size, "max_batch_tokens": max_batch_tokens},
                echo=lambda message: typer.echo(message, err=True),
            )
            typer.echo(str(path))
            return
        pde_options = {"times": times, "dynamics": dynamics, "variants": variants, "head": head, "spacing": spacing,
                       "rho": rho, "wave_speed": wave_speed, "long_range": long_range}
        if target == "pde":
            from contllm.pde.experiment import config_from_options, run_pde_command

            if eps is not None or alphas is not None:
                raise ExperimentError("--eps and --alphas apply to the depth experiment only, not pde")
            pde_config = config_from_options(
                times=times, dynamics=dynamics, variants=variants, layer=layer, head=head, spacing=spacing,
                rho=rho, c=wave_speed, long_range=long_range,
            )
            path = run_pde_command(
                model=model or "smollm2-135m", device=device, dtype=dtype, items=items, out=out,
                resume=resume, force=force, seed=seed, config=pde_config,
                unused={**config_options, "batch_size": batch_size, "max_batch_tokens": max_batch_tokens},
                echo=lambda message: typer.echo(message, err=True),
            )
            typer.echo(str(path))
            return
        given_pde = [f"--{k.replace('_', '-')}" for k, v in pde_options.items() if v is not None]
        if given_pde:
            raise ExperimentError(f"{', '.join(given_pde)} apply to the pde experiment only, not {target}")
        if target not in EXPERIMENT_NAMES:
            raise ExperimentError(
                f"unknown experiment {target!r}; known experiments: {', '.join(EXPERIMENT_NAMES)}, depth, pde (or a .toml spec)"
            )
        if layer is not None or eps is not None or alphas is not None:
            raise ExperimentError(f"--layer, --eps and --alphas apply to the depth experiment only, not {target}")
        run_one(
            target,
            model=model or "smollm2-135m",
            device=device,
            dtype=dtype,
            items=items,
            out=out,
            resume=resume,
            force=force,
            seed=seed,
            max_batch_tokens=max_batch_tokens,
            batch_size=batch_size,
            item_figures=item_figures,
            config_options={k: v for k, v in config_options.items() if v is not None},
            device_map=device_map,
        )
    except ContllmError as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        typer.echo("interrupted; finished items are saved, continue with --resume", err=True)
        raise typer.Exit(130)


@app.command()
def models(
    cache_dir: Optional[Path] = typer.Option(None, help="Cache of converted models. [default: $CONTLLM_CACHE or ~/.cache/contllm]"),
) -> None:
    """List the embedded model aliases: family, size, whether installed and converted."""
    try:
        from contllm.models import list_models

        rows = list_models(cache_dir)
        header = f"{'alias':<14} {'family':<12} {'params':>8}  {'installed':<9}  {'cached':<6}  install"
        typer.echo(header)
        for r in rows:
            typer.echo(
                f"{r.alias:<14} {r.family:<12} {r.n_parameters / 1e6:>7.0f}M  {'yes' if r.installed else 'no':<9}  "
                f"{'yes' if r.cached else 'no':<6}  {'' if r.installed else r.install_command}"
            )
    except ContllmError as exc:
        _fail(str(exc))


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories to summarise and compare."),
    out: Path = typer.Option(..., "--out", "-o", help="Directory for summary.md, summary.csv and figures."),
    force: bool = typer.Option(False, "--force", help="Replace files in --out."),
) -> None:
    """Summarise runs (Markdown and CSV) and draw figures comparing models per experiment."""
    try:
        from contllm.report import write_report

        for path in write_report(run_dirs, out, force=force):
            typer.echo(str(path))
    except ContllmError as exc:
        _fail(str(exc))


def main() -> None:
    """Entry point of the ``contllm`` command."""
    try:
        app()
    except ContllmError as exc:  # raised outside a command body (should not happen)
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
