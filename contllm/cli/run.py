"""``contllm run``: one sub-command per registered experiment, or a spec file.

``contllm run NAME`` has one sub-command per registered experiment (see
:mod:`contllm.registry`), each with the run options every experiment shares and the
experiment's own options; ``contllm run SPEC.toml`` runs a spec file. Errors a user can
cause print one line and exit with status 2; nothing already written is overwritten
without --resume or --force. :data:`RUN_GROUP` is registered in
:data:`contllm.cli.commands.COMMANDS`, which hands it every argument.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from contllm import logs, registry
from contllm.cli import index as cli_index
from contllm.cli.errors import OneLineCommand, guarded
from contllm.cli.errors import fail as _fail
from contllm.errors import ContllmError, ExperimentError
from contllm.experiments.options import Option, read_value
from contllm.settings import (
    AUTO_DTYPE_HELP,
    DEFAULT_FORMATS,
    DTYPE_METAVAR,
    FIGURE_FORMATS,
    ITEM_FIGURES_UP_TO,
    SETTINGS,
    RunSettings,
    check_seed,
)

# Help pages answer at once: this module and the ones it imports at the top load neither
# torch, transformers nor matplotlib (tests/unit/test_cli_startup.py holds it to that).
# The commands read the experiments' declarations from contllm.cli.index; a run imports them
# once every value the command line alone decides has been checked (usage errors stay fast too).


def _showing_news() -> bool:
    """Whether news and progress bars show (not under -q)."""
    return logs.LOGGER.isEnabledFor(logging.INFO)


class _OneLineCommand(OneLineCommand):
    """``contllm run NAME`` and ``contllm run SPEC.toml``: an unknown option is one that does not apply to the experiment."""

    def usage_error(self, exc: click.UsageError) -> NoReturn:
        if isinstance(exc, click.NoSuchOption):
            _fail(
                f"option(s) {exc.option_name} do not apply to the {self.name} experiment; see 'contllm run {self.name} --help'"
            )
        super().usage_error(exc)


def run_options(default_model: str, aliases: Sequence[str]) -> tuple[tuple[tuple[str, ...], dict[str, Any]], ...]:
    """Options every experiment takes: (parameter declarations, click keyword arguments)."""
    return (
        (
            ("--model", "-m"),
            {
                "default": default_model,
                "show_default": True,
                "metavar": "NAME",
                "help": f"Embedded alias ({', '.join(aliases)}), Hugging Face id or local directory.",
            },
        ),
    ) + RUN_OPTIONS


#: Options every experiment takes besides --model.
RUN_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--device",),
        {
            "default": "auto",
            "show_default": True,
            "metavar": "DEVICE",
            "help": "auto (CUDA when available, else CPU), cpu, cuda, cuda:1, ...",
        },
    ),
    (
        ("--dtype",),
        {
            "default": None,
            "metavar": DTYPE_METAVAR,
            "help": f"Precision of the model's weights and activations; {AUTO_DTYPE_HELP} (the choice and why go "
            "into manifest.json). [default: float32]",
        },
    ),
    (
        ("--items",),
        {
            "default": None,
            "metavar": "N|ID,...",
            "help": "The first N items, or a comma-separated list of item ids. [default: all]",
        },
    ),
    (
        ("--out", "-o"),
        {
            "default": None,
            "type": click.Path(),  # kept as typed: '' is refused, not taken as "."
            "help": "Run directory. [default: runs/<experiment>-<model>-<time>]",
        },
    ),
    (("--resume",), {"is_flag": True, "help": "Continue the run in --out, skipping finished items."}),
    (("--force",), {"is_flag": True, "help": "Replace the run in --out."}),
    (
        ("--seed",),
        {
            "default": "0",
            "show_default": True,
            "metavar": "INTEGER",
            "help": "Random seed, 0 to 2**63 - 1 (recorded in config.json).",
        },
    ),
    (
        ("--item-figures/--no-item-figures",),
        {
            "default": None,
            "help": "Draw one figure per item. [default: for runs of at most "
            f"{ITEM_FIGURES_UP_TO} items; a larger run draws the summary figure only, since the item "
            "figures would take as long as the evaluation: the explorer page shows every item, and "
            "'contllm figures RUN_DIR' draws them later]",
        },
    ),
    (
        ("--formats",),
        {
            "default": ",".join(DEFAULT_FORMATS),
            "show_default": True,
            "metavar": f"[{'|'.join(FIGURE_FORMATS)}],...",
            "help": "Figure formats, comma-separated (png,pdf for PDF too: it doubles the time figures take).",
        },
    ),
)
#: Options of the experiments that evaluate through the batched engine.
ENGINE_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--max-batch-tokens",),
        {
            "default": None,
            "metavar": "INTEGER",
            "help": "Most tokens computed in one forward (rows x padded length after a shared prefix): the memory budget. [default: automatic]",
        },
    ),
    (
        ("--device-map",),
        {
            "default": None,
            "help": "auto: spread a model too large for one device over the GPUs (accelerate); --device is then unused.",
        },
    ),
)


#: What --help shows for each kind of experiment option; the values are read by the
#: experiment's declaration (contllm.experiments.options), so that the command line,
#: spec files and Python read them alike.
METAVARS = {
    "int": "INTEGER",
    "float": "FLOAT",
    "str": "TEXT",
    "ints": "INTEGER,...",
    "floats": "FLOAT,...",
    "words": "TEXT,...",
    "range": "MIN,MAX",
}


def _metavar(option: Option) -> str:
    if option.choices:
        listed = "[" + "|".join(option.choices) + "]"
        return listed + ",..." if option.kind == "words" else listed
    return METAVARS.get(option.kind, "TEXT")


def experiment_command(name: str, *, indexed: bool = False) -> click.Command:
    """The ``contllm run NAME`` command of a registered experiment, built from its declaration.

    indexed: read the declaration from :mod:`contllm.cli.index` (without importing the
    experiment) where it holds it, as the command line does for help pages and runs alike;
    the run itself then reads the options through the imported experiment.
    """
    experiment = cli_index.declaration(name, indexed=indexed)
    params: list[click.Parameter] = [
        click.Option(list(decls), **kwargs) for decls, kwargs in run_options(*cli_index.models(indexed=indexed))
    ]
    if experiment.engine:
        params += [click.Option(list(decls), **kwargs) for decls, kwargs in ENGINE_OPTIONS]
    taken = {p.name for p in params} & {o.name for o in experiment.options}
    if taken:
        raise ExperimentError(f"{name} declares option(s) {', '.join(sorted(taken))}, which every run already takes")
    for option in experiment.options:
        if option.kind == "bool":
            flag = option.flag or f"--{option.name.replace('_', '-')}/--no-{option.name.replace('_', '-')}"
            params.append(click.Option([flag, option.name], default=None, help=option.help))
        else:
            params.append(
                click.Option(
                    [option.cli_flag, option.name], default=None, type=str, metavar=_metavar(option), help=option.help
                )
            )
    run_keys = {p.name for p in params} - {o.name for o in experiment.options}

    def callback(**values: Any) -> None:
        given = {k: v for k, v in values.items() if k not in run_keys}
        where = {k: v for k, v in values.items() if k in run_keys and k not in SETTINGS}
        # Everything the command line alone decides is checked before torch is imported (a second or more).
        chosen = {k: values[k] for k in run_keys if k in SETTINGS}
        settings = guarded(lambda: _early_checks(experiment, given, where, chosen))

        def start() -> Any:
            from contllm.rundir.runner import run

            return run(name, options=given, settings=settings, progress=_showing_news(), **where)

        path = guarded(start)
        if _is_main_process():  # under a launch every process returns the path; one prints it
            click.echo(str(path))

    return _OneLineCommand(
        name,
        params=params,
        callback=callback,
        help=f"{experiment.help}\n\n{experiment.description}{_metrics_help(experiment)}".strip(),
        short_help=experiment.help,
    )


def _early_checks(declaration: Any, given: dict[str, Any], where: dict[str, Any], values: dict[str, Any]) -> Any:
    """The run's settings, once every value the command line alone decides is checked; imports no torch.

    Checked: each option's value against its declared kind and choices, the run settings
    (seed, items, formats, --max-batch-tokens) and --out (with --resume, its config and
    manifest). What needs the experiment or the model (a dataset's size, a template's
    fields, the device) is checked next, still before the model loads.
    """
    from contllm.rundir.runs import check_modes, check_out

    declaration.check_values(given)
    values = dict(values)
    values["seed"] = check_seed(values["seed"], "--seed")
    if values.get("max_batch_tokens") is not None:
        values["max_batch_tokens"] = read_value(values["max_batch_tokens"], "int", "--max-batch-tokens")
    settings = RunSettings(**values)
    check_modes(resume=where.get("resume", False), force=where.get("force", False))
    if where.get("out") is not None:
        check_out(where["out"], resume=where.get("resume", False), force=where.get("force", False))
    cli_index.check_cache(settings.model)
    return settings


def _metrics_help(experiment: Any) -> str:
    """The experiment's declared metrics, one line each, for ``contllm run NAME --help``."""
    if not experiment.metrics:
        return ""
    lines = [f"  {m.name} ({m.direction} is better): {m.meaning}" for m in experiment.metrics]
    return "\n\nMetrics in summary.json:\n\n\b\n" + "\n".join(lines)


def spec_command(path: str) -> click.Command:
    """``contllm run SPEC.toml``: every (model, experiment) of a spec file."""

    def callback(
        out: Path | None,
        resume: bool,
        force: bool,
        device: str | None,
        dtype: str | None,
        model: str | None,
        items: str | None,
        samples: str | None,
        formats: str | None,
    ) -> None:
        from contllm.rundir.spec import run_spec

        say = logs.note if _showing_news() else None  # no say: no progress bars either
        written = guarded(
            lambda: run_spec(
                Path(path),
                out=out,
                resume=resume,
                force=force,
                device=device,
                dtype=dtype,
                say=say,
                model=model,
                items=items,
                samples=samples,
                formats=formats,
            )
        )
        if _is_main_process():
            for run_dir in written:
                click.echo(str(run_dir))

    return _OneLineCommand(
        path,
        params=[
            click.Option(
                ["--out", "-o"],
                type=click.Path(),
                default=None,
                help="Root of the run directories. [default: the spec's out]",
            ),
            click.Option(["--resume"], is_flag=True, help="Continue every run of the spec."),
            click.Option(["--force"], is_flag=True, help="Replace every run of the spec."),
            click.Option(["--device"], default=None, help="Overrides the spec's device."),
            click.Option(["--dtype"], default=None, metavar=DTYPE_METAVAR, help="Overrides the spec's dtype."),
            click.Option(
                ["--model", "-m"], default=None, help="Runs every experiment on this model instead of the spec's."
            ),
            click.Option(["--items"], default=None, help="Overrides every experiment's items (N or id1,id2)."),
            click.Option(
                ["--samples"], default=None, help="Overrides the samples of every experiment that takes them."
            ),
            click.Option(
                ["--formats"],
                default=None,
                metavar=f"[{'|'.join(FIGURE_FORMATS)}],...",
                help="Overrides the spec's figure formats (png,pdf).",
            ),
        ],
        callback=callback,
        help="Run every (model, experiment) of a spec file.",
    )


def _is_main_process() -> bool:
    from contllm.rundir.distributed import start_processes

    return start_processes().is_main


def _is_spec(name: str) -> bool:
    return name.endswith(".toml") or Path(name).is_file()


class RunGroup(click.Group):
    """``contllm run``: one sub-command per registered experiment, or a spec file."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return registry.names()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if registry.known(cmd_name):
            # Built from the index (equal to the experiments' declarations, a unit test holds it):
            # a malformed value is refused before the experiment, and torch, is imported.
            return guarded(lambda: experiment_command(cmd_name, indexed=True))
        if _is_spec(cmd_name):
            return spec_command(cmd_name)
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        command = self.get_command(ctx, args[0])
        if command is None:
            _fail(f"unknown experiment {args[0]!r}; known experiments: {', '.join(registry.names())} (or a .toml spec)")
        return command.name, command, args[1:]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in registry.names():
            try:
                rows.append((name, cli_index.declaration(name).help))
            except ContllmError as exc:
                rows.append((name, f"(unavailable: {exc})"))
        rows.append(("SPEC.toml", "a spec file: several models x several experiments"))
        with formatter.section("Experiments"):
            formatter.write_dl(rows)


RUN_HELP = f"""Run an experiment, or a spec of several, and write a run directory.

The directory holds config.json, manifest.json, items/ (one record per finished item,
what --resume skips), results.json, the experiment's CSV tables, summary.json,
explorer.html (where the experiment reads out a value per item) and figures/: the
summary figure as PNG (--formats png,pdf adds PDF), and one figure per item for runs
of at most {ITEM_FIGURES_UP_TO} items (--item-figures / --no-item-figures decide
otherwise). Item figures cost about as much as evaluating the items, so a larger run
leaves them for `contllm figures RUN_DIR`, which draws them from results.json without
the model. `contllm run NAME --help` lists an experiment's options.
Examples:

\b
  contllm run counting
  contllm run counting --items 10 --samples 10 --range 0.2,1.5 --out runs/quick
  contllm run boolean --operators AND,OR,XOR --method slerp
  contllm run depth --items 1
  contllm run pde --times 0,1,16 --variants attention,matched
  contllm run specs/paper.toml
"""


RUN_GROUP = RunGroup(
    "run",
    help=RUN_HELP,
    short_help="Run an experiment (counting, events, boolean, depth, pde, ...) or a spec file.",
    no_args_is_help=True,
)
