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
from contllm.errors import ExperimentError, MissingDependencyError
from contllm.experiments.base import Table
from contllm.files import atomic_write_json, atomic_write_text, write_csv

#: Columns that every row of results.csv carries after the experiment's own: which run
#: made it, so that tables of several runs can be stacked and told apart.
RUN_COLUMNS = ("experiment", "model")


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


def result_tables(experiment: Any, result: Any) -> dict[str, Table]:
    """The experiment's tables of ``result`` (file stem -> (columns, rows)), "results" with :data:`RUN_COLUMNS` added.

    A column the experiment's table holds already is kept as it is.
    """
    tables = dict(experiment.tables(result))
    if "results" in tables:
        columns, rows = tables["results"]
        run = {"experiment": experiment.name, "model": str(getattr(result, "model", "") or "")}
        added = [c for c in RUN_COLUMNS if c not in columns]
        tables["results"] = ([*columns, *added], ({**row, **{c: run[c] for c in added}} for row in rows))
    return tables


def write_tables(out: Output) -> None:
    """<stem>.csv for each of the experiment's tables (see :func:`result_tables`)."""
    for stem, (columns, rows) in result_tables(out.experiment, out.result).items():
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


def write_explorer(out: Output) -> None:
    """explorer.html: the sweep to scrub in a browser (:mod:`contllm.explorer`), for results with a read-out per item."""
    from contllm.explorer import explorer_data, page

    data = explorer_data([(str(getattr(out.result, "model", "") or "run"), out.result)])
    if data is not None:
        atomic_write_text(out.directory / "explorer.html", page(data))


Writer = Callable[[Output], None]

#: Format name -> writer, in the order :func:`save` runs them.
WRITERS: dict[str, Writer] = {
    "results": write_results,
    "tables": write_tables,
    "summary": write_summary,
    "figures": write_figures,
    "documents": write_documents,
    "explorer": write_explorer,
}
#: The formats that draw (left out by ``save(..., figures=False)``).
DRAWN = ("figures", "documents")


def save(
    result: Any,
    directory: str | Path,
    *,
    figures: bool = True,
    item_figures: bool = True,
    name: str | None = None,
    formats: Sequence[str] | None = None,
) -> dict[str, Any]:
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


def to_pandas(result: Any, table: str = "results", *, name: str | None = None) -> Any:
    """One table of a result as a pandas DataFrame: the rows its CSV file holds, one observation each.

    table: the file stem ("results", the default, carries the run's experiment and model
    in every row; an experiment may give more, e.g. depth's "layers"). Cells left empty
    for a non-finite number read as NaN. Raises MissingDependencyError without pandas
    (``pip install pandas``), ExperimentError for a table the experiment does not give.
    """
    try:
        import pandas as pd
    except ImportError:
        raise MissingDependencyError("to_pandas needs pandas; install it with: pip install pandas") from None
    experiment = registry.get(name or _experiment_name(result))
    tables = result_tables(experiment, result)
    if table not in tables:
        raise ExperimentError(
            f"the {experiment.name} experiment has no table {table!r}; its tables: {', '.join(tables)}"
        )
    columns, rows = tables[table]
    frame = pd.DataFrame(list(rows), columns=list(columns))
    for column in frame.columns:  # a column with empty cells and numbers otherwise is numeric
        cells = frame[column]
        filled = cells[cells != ""]
        if (
            len(filled) < len(cells)
            and filled.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all()
        ):
            frame[column] = pd.to_numeric(cells.where(cells != ""), errors="raise")
    return frame


def _experiment_name(result: Any) -> str:
    name = getattr(result, "experiment", None)
    if not isinstance(name, str):
        raise ExperimentError(f"a {type(result).__name__} does not say its experiment; give name=")
    return name


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
