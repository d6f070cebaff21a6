"""Every output file of a result, in one place: results.json, CSV tables, summary.json, figures, documents.

:func:`save` writes a result into a directory through the writers in :data:`WRITERS`,
each one function of an :class:`Output`; a new output format is one more function there.
:func:`summarize` and :func:`figure` give the same summary and figures without writing.
Which experiment made a result is read from the result (``result.experiment``) unless
``name`` says it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.errors import ExperimentError
from contllm.files import atomic_write_json, atomic_write_text, write_csv


@dataclass
class Output:
    """What a writer gets: the experiment, its result, the summary, the directory and whether to draw per-item figures."""

    experiment: Any
    result: Any
    summary: dict[str, Any]
    directory: Path
    item_figures: bool = True


def write_results(out: Output) -> None:
    """results.json: the result's ``to_dict()``."""
    atomic_write_json(out.directory / "results.json", out.result.to_dict())


def write_tables(out: Output) -> None:
    """<stem>.csv for each of the experiment's tables."""
    for stem, (columns, rows) in out.experiment.tables(out.result).items():
        write_csv(out.directory / f"{stem}.csv", columns, rows)


def write_summary(out: Output) -> None:
    """summary.json: the headline numbers, and under "metrics" what each declared one means."""
    declared = {m.name: m.to_dict() for m in out.experiment.metrics if m.name in out.summary}
    atomic_write_json(out.directory / "summary.json", {**out.summary, **({"metrics": declared} if declared else {})})


def write_figures(out: Output) -> None:
    """figures/<name>.png and .pdf for each of the experiment's figures."""
    from contllm.plotting import save_figure

    for name, fig in out.experiment.figures(out.result, per_item=out.item_figures):
        save_figure(fig, out.directory / "figures" / name)


def write_documents(out: Output) -> None:
    """The experiment's extra documents (self-contained HTML, ...), at the paths it names."""
    for relative, text in out.experiment.documents(out.result, per_item=out.item_figures):
        atomic_write_text(out.directory / relative, text)


Writer = Callable[[Output], None]

#: Format name -> writer, in the order :func:`save` runs them.
WRITERS: dict[str, Writer] = {
    "results": write_results,
    "tables": write_tables,
    "summary": write_summary,
    "figures": write_figures,
    "documents": write_documents,
}
#: The formats that draw (left out by ``save(..., figures=False)``).
DRAWN = ("figures", "documents")


def save(result: Any, directory: str | Path, *, figures: bool = True, item_figures: bool = True,
         name: str | None = None, formats: Sequence[str] | None = None) -> dict[str, Any]:
    """Write ``result`` into ``directory`` in every format of :data:`WRITERS` (or those in ``formats``); returns the summary.

    figures: False leaves out the formats in :data:`DRAWN`. item_figures: also one figure
    per item. This is what a run directory holds besides its config, manifest and records.
    """
    chosen = list(formats) if formats is not None else [f for f in WRITERS if figures or f not in DRAWN]
    unknown = [f for f in chosen if f not in WRITERS]
    if unknown:
        raise ExperimentError(f"unknown output format(s) {', '.join(unknown)}; known: {', '.join(WRITERS)}")
    experiment = registry.get(name or result.experiment)
    summary = experiment.summary(result)
    out = Output(experiment, result, summary, Path(directory), item_figures)
    for fmt in chosen:
        WRITERS[fmt](out)
    return summary


def summarize(result: Any, name: str | None = None) -> dict[str, Any]:
    """Headline numbers of a result (``name``: its experiment, when the result does not say)."""
    return registry.get(name or result.experiment).summary(result)


def figure(result: Any, item: str | None = None, *, name: str | None = None) -> Any:
    """A matplotlib figure of a result: its summary figure, or the figure of one item; ExperimentError when it has none."""
    from contllm.plotting import plt

    wanted = "summary" if item is None else f"items/{item}"
    experiment = registry.get(name or result.experiment)
    for key, fig in experiment.figures(result, per_item=item is not None):
        if key == wanted:
            return fig
        plt.close(fig)
    raise ExperimentError(f"no figure {wanted!r} for this result")
