"""Every output file of a result, in one place: results.json, CSV tables, summary.json, figures, documents.

:func:`save` writes a result into a directory through the writers in :data:`WRITERS`,
each one function of an :class:`Output`; a new output format is one more function there.
:func:`summarize` and :func:`figure` give the same summary and figures without writing.
:func:`contllm.rundir.report.draw_figures` (``contllm figures RUN_DIR``) draws a finished run's
figures again through the same writers. Which experiment made a result
is read from the result (``result.experiment``) unless ``name`` says it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.errors import ExperimentError, MissingDependencyError
from contllm.experiments.base import Experiment, Records, Table
from contllm.rundir.files import atomic_write_json, atomic_write_text, data_name, inside, write_csv
from contllm.settings import DEFAULT_FORMATS
from contllm.settings import figure_formats as checked_formats

#: Columns that every row of results.csv carries after the experiment's own: which run
#: made it, so that tables of several runs can be stacked and told apart.
RUN_COLUMNS = ("experiment", "model")


@dataclass
class Output:
    """What a writer gets: the experiment, its result, the summary, the directory and which figures to draw.

    item_figures: also one figure (and document) per item. formats: the figure formats
    (:data:`contllm.settings.FIGURE_FORMATS`; PNG only by default). items: the item figures and documents of
    only these item ids (None: every item's). written: the figures and documents written,
    in order (the writers add to it).
    """

    experiment: Any
    result: Any
    summary: dict[str, Any]
    directory: Path
    item_figures: bool = True
    formats: Sequence[str] = DEFAULT_FORMATS
    items: Collection[str] | None = None
    written: list[Path] = field(default_factory=list)


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
        write_csv(inside(out.directory, f"{stem}.csv"), columns, rows)


def write_summary(out: Output) -> None:
    """summary.json: the headline numbers, and under "metrics" what each declared one means."""
    declared = {m.name: m.to_dict() for m in out.experiment.metrics if m.name in out.summary}
    atomic_write_json(out.directory / "summary.json", {**out.summary, **({"metrics": declared} if declared else {})})


def write_figures(out: Output) -> None:
    """figures/<name>.<format> for each of the experiment's figures and each of ``out.formats``.

    A name that would leave the run directory (an experiment that does not name its item
    figures by :func:`contllm.rundir.files.data_name`) is refused before its figure is saved.
    """
    from contllm.plotting import plt, save_figure

    for name, fig in drawn_figures(out):
        try:
            stem = inside(out.directory, Path("figures") / name)
        except BaseException:
            plt.close(fig)
            raise
        out.written += save_figure(fig, stem, formats=out.formats)


def drawn_figures(out: Output) -> Iterator[tuple[str, Any]]:
    """The experiment's (name, figure) pairs for ``out``: the item figures only with ``item_figures``, of ``items`` only when given.

    The figures of items left out are not drawn where the experiment draws item figures
    one record at a time (:meth:`Experiment.item_figure`); otherwise they are drawn and closed.
    """
    experiment, result = out.experiment, out.result
    if out.items is None or not out.item_figures:
        yield from experiment.figures(result, per_item=out.item_figures)
        return
    wanted = set(out.items)
    if isinstance(result, Records) and type(experiment).figures is Experiment.figures:
        yield from experiment.figures(result, per_item=False)
        for record in result.records:
            item_id = getattr(record, "item_id", None)
            fig = experiment.item_figure(result, record) if isinstance(item_id, str) and item_id in wanted else None
            if fig is not None:
                yield f"items/{data_name(str(item_id))}", fig
        return
    from contllm.plotting import plt

    names = {f"items/{data_name(i)}" for i in wanted}
    for name, fig in experiment.figures(result, per_item=True):
        if name.startswith("items/") and name not in names:
            plt.close(fig)
        else:
            yield name, fig


def write_documents(out: Output) -> None:
    """The experiment's extra documents (self-contained HTML, ...), at the paths it names (per item: of ``out.items`` when given).

    A path that would leave the run directory is refused before anything is written there.
    """
    wanted = None if out.items is None else {data_name(i) for i in out.items}
    for relative, text in out.experiment.documents(out.result, per_item=out.item_figures):
        path = inside(out.directory, relative)
        if wanted is not None and path.parent.name == "items" and path.stem not in wanted:
            continue
        out.written.append(atomic_write_text(path, text))


def write_explorer(out: Output) -> None:
    """explorer.html: the sweep to scrub in a browser (:mod:`contllm.rundir.explorer`), for results with a read-out per item."""
    from contllm.rundir.explorer import explorer_data, page

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
    figure_formats: str | Sequence[str] = DEFAULT_FORMATS,
) -> dict[str, Any]:
    """Write ``result`` into ``directory`` in every format of :data:`WRITERS` (or those in ``formats``); returns the summary.

    figures: False leaves out the formats in :data:`DRAWN`. item_figures: also one figure
    per item. figure_formats: the figures' file formats ("png", "pdf" or both; PNG
    only by default). This is what a run directory holds besides its config, manifest and records.
    """
    chosen = list(formats) if formats is not None else [f for f in WRITERS if figures or f not in DRAWN]
    unknown = [f for f in chosen if f not in WRITERS]
    if unknown:
        raise ExperimentError(f"unknown output format(s) {', '.join(unknown)}; known: {', '.join(WRITERS)}")
    drawn_as = checked_formats(figure_formats, "figure_formats")
    experiment = registry.get(name or result.experiment)
    summary = experiment.summary(result)
    out = Output(experiment, result, summary, Path(directory), item_figures, drawn_as)
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

    wanted = "summary" if item is None else f"items/{data_name(item)}"
    experiment = registry.get(name or result.experiment)
    for key, fig in experiment.figures(result, per_item=item is not None):
        if key == wanted:
            return fig
        plt.close(fig)
    raise ExperimentError(f"no figure {wanted!r} for this result")
