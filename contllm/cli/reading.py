"""``contllm models``, ``contllm report`` and ``contllm figures``: commands that read what is there.

Each is a Typer command function registered in :data:`contllm.cli.commands.COMMANDS`;
each imports what its work needs when it runs, so that help pages stay fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from contllm import logs
from contllm.cli.errors import guarded
from contllm.settings import DEFAULT_FORMATS, FIGURE_FORMATS


def models(
    cache_dir: Path | None = typer.Option(
        None, help="Cache of converted models. [default: $CONTLLM_CACHE or ~/.cache/contllm]"
    ),
) -> None:
    """List the embedded model aliases: family, size, whether installed and converted."""
    from contllm.models import format_listings, list_models

    for line in format_listings(guarded(lambda: list_models(cache_dir), typer.Exit)):
        typer.echo(line)


def report(
    run_dirs: list[Path] = typer.Argument(
        ..., metavar="RUN_DIR...", help="Run directories of one experiment to summarise and compare."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Directory for summary.md, summary.csv and the comparison figure."
    ),
    force: bool = typer.Option(False, "--force", help="Replace the report's files in --out."),
) -> None:
    """Summarise runs of any experiment (Markdown and CSV) and draw a figure comparing them."""
    from contllm.rundir.report import write_report

    for path in guarded(lambda: write_report(run_dirs, out, force=force), typer.Exit):
        typer.echo(str(path))


def figures(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A finished run directory (written by 'contllm run')."),
    formats: str = typer.Option(
        ",".join(DEFAULT_FORMATS),
        "--formats",
        metavar=f"[{'|'.join(FIGURE_FORMATS)}],...",
        help="Figure formats, comma-separated (png,pdf for PDF too).",
    ),
    items: str | None = typer.Option(
        None,
        "--items",
        metavar="N|ID,...",
        help="The first N items, or a comma-separated list of item ids, whose figures to draw. [default: all]",
    ),
) -> None:
    """Draw a finished run's figures from its results.json, without the model: the summary figure and every item's.

    A large run draws its summary figure only (see 'contllm run --help'); this draws the
    item figures afterwards, or draws every figure again in other formats. The files
    replace those of the same names, and the run's manifest lists them with its other
    outputs. Prints the path of each file written.
    """
    import time

    from contllm.rundir.report import draw_figures

    started = time.perf_counter()
    written = guarded(lambda: draw_figures(run_dir, formats=formats, items=items), typer.Exit)
    for path in written:
        typer.echo(str(path))
    logs.note(f"{len(written)} files written in {time.perf_counter() - started:.1f} s")
