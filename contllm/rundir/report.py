"""Reports over finished runs: a summary table and a figure comparing runs of one experiment.

``contllm report RUN... --out DIR`` reads run directories written by ``contllm run`` (any
registered experiment) and writes into DIR::

    summary.md        one row per run: model, experiment, items, headline numbers
    summary.csv       the same numbers, unrounded
    comparison.png    the runs side by side (also as comparison.pdf), where the experiment draws one

The headline numbers are recomputed from results.json by the experiment's own summary,
so runs made by different versions are compared by the same definitions. Rows are
ordered best first by the experiment's first declared metric
(:class:`~contllm.experiments.base.Metric`, higher or lower is better), and the Markdown
ranks the runs by each declared metric. Only runs of one experiment can be compared, and
runs over different items are compared on the items they share, with a warning
(:func:`shared_items`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contllm import registry
from contllm.errors import ContllmError, RunDirectoryError
from contllm.logs import LOGGER
from contllm.rundir import schemas
from contllm.rundir.files import atomic_write_text, csv_text, parse_json
from contllm.rundir.runs import CONFIG, MANIFEST
from contllm.settings import DEFAULT_FORMATS

RESULTS = "results.json"
REQUIRED = (CONFIG, MANIFEST, RESULTS)
#: The files a report writes; with --force only these are replaced, nothing is deleted.
REPORT_FILES = ("summary.md", "summary.csv", "comparison.png", "comparison.pdf", "explorer.html")


@dataclass
class Run:
    """A finished run directory, read (:func:`load_run`): its path, config, manifest, experiment, result and headline numbers.

    result: the experiment's result object, as the run made it (e.g. a counting run's
    sweeps, with ``experiment``, ``model``, ``config`` and its records); summary: the
    headline numbers of summary.json; label: the run's name in a report's legend.
    """

    path: Path
    config: dict[str, Any]
    manifest: dict[str, Any]
    experiment: str
    result: Any
    summary: dict[str, Any]
    label: str = ""

    @property
    def model(self) -> str:
        return str(self.config.get("model") or self.manifest.get("model") or "model")

    def to_pandas(self, table: str = "results") -> Any:
        """One of the run's tables as a pandas DataFrame (see :func:`contllm.rundir.outputs.to_pandas`).

        "results" (the default) holds the columns of results.csv, the run's experiment and
        model among them, so that the tables of several runs stack with ``pandas.concat``.
        Raises MissingDependencyError without pandas.
        """
        from contllm.rundir.outputs import to_pandas

        return to_pandas(self.result, table, name=self.experiment)


def _read(path: Path, run: Path, schema: Any) -> Any:
    """The JSON of one of a run's files, checked against ``schema``; RunDirectoryError naming the file (and the field)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirectoryError(f"{run}: cannot read {path.name} ({exc})") from None
    return parse_json(text, f"{run}: cannot read {path.name}", schema=schema)


def load_run(path: str | Path) -> Run:
    """Read a finished run directory written by ``contllm run`` (or :func:`contllm.rundir.runner.run`) into a :class:`Run`.

    path: the run directory (it holds config.json, manifest.json and results.json). The
    run's ``result`` is the experiment's result object, rebuilt from results.json;
    ``summary`` its headline numbers; ``to_pandas()`` its results table. Works anywhere
    the experiment is registered: no model is loaded. Raises RunDirectoryError naming
    what is missing, malformed or unfinished (an unfinished run says how to resume it).

    Example, several runs of one experiment in one table::

        import pandas as pd
        import contllm

        runs = [contllm.load_run(p) for p in ["runs/counting-smollm2", "runs/counting-gemma3"]]
        table = pd.concat([r.to_pandas() for r in runs])
        table.groupby(["model", "factor"])["probability"].mean()
    """
    path = _run_path(path)
    if not path.is_dir():
        why = "it does not exist" if not path.exists() else "it is not a directory"
        raise RunDirectoryError(f"{path} is not a run directory ({why}); give directories written by 'contllm run'")
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise RunDirectoryError(
            f"{path} is not a run directory (no {', '.join(missing)}); give directories written by 'contllm run'"
        )
    config = _read(path / CONFIG, path, schemas.CONFIG)
    manifest = _read(path / MANIFEST, path, schemas.MANIFEST)
    status = manifest.get("status")
    if status != "finished":
        experiment = config.get("experiment", "EXPERIMENT")
        raise RunDirectoryError(
            f"{path} is an unfinished run (status {status!r}); finish it with "
            f"'contllm run {experiment} --out {path} --resume' and the options it was started with"
        )
    name = config["experiment"]
    try:
        experiment = registry.get(name)
    except ContllmError:
        raise RunDirectoryError(
            f"{path}: its config names the experiment {name!r}, which is not registered "
            f"(known: {', '.join(registry.names())})"
        ) from None
    data = _read(path / RESULTS, path, schemas.results_schema(experiment, name))
    result, summary = _rebuilt(experiment, data, path)
    return Run(path, config, manifest, str(name), result, summary)


def _rebuilt(experiment: Any, data: dict[str, Any], path: Path) -> tuple[Any, dict[str, Any]]:
    """(the result, its summary) from results.json's checked envelope; RunDirectoryError naming the file otherwise.

    Each record's own fields are read by the result type (by its type hints); whatever is
    wrong with them (or with what the summary then asks of them) is one error naming the
    file and, where it can be told, the record.
    """
    try:
        result = experiment.load_result(data)
        summary = experiment.summary(result)
    except RunDirectoryError:
        raise
    except Exception as exc:  # the last resort: no value read from a file may end in a traceback
        where = _bad_record(experiment, data)
        reason = str(exc) if isinstance(exc, ContllmError) else f"{type(exc).__name__}: {exc}"
        raise RunDirectoryError(f"{path}: {RESULTS} is malformed ({where}{reason[:300]})") from None
    if not isinstance(summary, dict):
        raise RunDirectoryError(f"{path}: {RESULTS} is malformed (its summary is no table of numbers)")
    return result, summary


def _bad_record(experiment: Any, data: dict[str, Any]) -> str:
    """ "<key>[k]: " for the first record its result type cannot read, "" where every one reads (or none can be told)."""
    result_type = getattr(experiment, "result_type", None)
    read = getattr(getattr(result_type, "record_type", None), "from_dict", None)
    key = getattr(result_type, "key", "records")
    if read is None or not isinstance(data.get(key), list):
        return ""
    for k, record in enumerate(data[key]):
        try:
            read(record)
        except Exception:
            return f"{key}[{k}]: "
    return ""


def _run_path(path: Any, what: str = "a run directory") -> Path:
    """``path`` (a str or path-like) as a Path; RunDirectoryError for anything else or an empty string."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes) or not str(path).strip():
        raise RunDirectoryError(
            f"{what} must be a path (a str or pathlib.Path), got {type(path).__name__} {path!r:.60}"
        )
    return Path(path)


def load_runs(run_dirs: Sequence[str | Path]) -> list[Run]:
    """Read run directories of one experiment, each once, and give each run a legend label."""
    if isinstance(run_dirs, (str, os.PathLike)) or not isinstance(run_dirs, Sequence):
        raise RunDirectoryError(f"run directories must be a list of paths, got {type(run_dirs).__name__}")
    if not run_dirs:
        raise RunDirectoryError("no run directories given; give one or more directories written by 'contllm run'")
    seen: dict[Path, Path] = {}
    for given in map(_run_path, run_dirs):
        key = given.resolve()
        if key in seen:
            also = "" if str(given) == str(seen[key]) else f" (also as {seen[key]})"
            raise RunDirectoryError(f"{given} is given twice{also}; give each run once")
        seen[key] = given
    runs = [load_run(p) for p in run_dirs]
    experiments = {r.experiment for r in runs}
    if len(experiments) > 1:
        listed = ", ".join(f"{r.path} ({r.experiment})" for r in runs)
        raise RunDirectoryError(
            f"runs of different experiments cannot be compared: {listed}; give runs of one experiment"
        )
    _label(runs)
    return runs


def _record_ids(run: Run) -> list[str] | None:
    """The item ids of a run's records, in order; None where its records carry none (pde's points)."""
    records = getattr(run.result, "records", None)
    if not records or not dataclasses.is_dataclass(run.result):
        return None
    ids = [getattr(r, "item_id", None) or getattr(r, "id", None) for r in records]
    return ids if all(isinstance(i, str) for i in ids) else None  # type: ignore[return-value]


def shared_items(runs: Sequence[Run]) -> tuple[list[Run], str | None]:
    """The runs as given when they hold the same items; otherwise each cut down to the items all of them hold (in the
    first run's order, summaries recomputed) and a line saying so. RunDirectoryError when they share no item."""
    ids = [_record_ids(r) for r in runs]
    if len(runs) < 2 or any(i is None for i in ids) or len({frozenset(i or ()) for i in ids}) == 1:
        return list(runs), None
    common = [i for i in ids[0] or () if all(i in (other or ()) for other in ids[1:])]
    held = ", ".join(f"{r.label or r.path} {len(i or ())}" for r, i in zip(runs, ids))
    if not common:
        raise RunDirectoryError(f"the runs share no item ({held} items); compare runs of the same items")
    experiment = registry.get(runs[0].experiment)
    kept = set(common)
    cut = []
    for r in runs:
        result = dataclasses.replace(
            r.result, records=[x for x, i in zip(r.result.records, _record_ids(r) or ()) if i in kept]
        )
        cut.append(dataclasses.replace(r, result=result, summary=experiment.summary(result)))
    return cut, f"the runs hold different items ({held}); every number here is over the {len(common)} items they share"


def _label(runs: list[Run]) -> None:
    """Legend labels: the model name, with the run directory added where models repeat."""
    models = Counter(r.model for r in runs)
    for r in runs:
        r.label = r.model if models[r.model] == 1 else f"{r.model} ({r.path.name})"
    labels = Counter(r.label for r in runs)
    for r in runs:
        if labels[r.label] > 1:
            r.label = f"{r.model} ({r.path})"


# --------------------------------------------------------------------------- tables


def _value(run: Run, metric: Any) -> float | None:
    """The run's value of ``metric``, or None where it has none (or NaN)."""
    value = run.summary.get(metric.name)
    if not _is_number(value) or value is None or math.isnan(value):
        return None
    return float(value)


def ranked(runs: Sequence[Run], metric: Any) -> list[Run]:
    """The runs best first by ``metric``'s declared direction; runs without a value last, in their given order."""
    have = [r for r in runs if _value(r, metric) is not None]
    return sorted(have, key=lambda r: metric.rank_key(_value(r, metric))) + [r for r in runs if r not in have]


def ordered(runs: Sequence[Run]) -> list[Run]:
    """The runs best first by the first declared metric any of them reports (given order without one)."""
    experiment = registry.get(runs[0].experiment)
    for metric in experiment.metrics:
        if any(_value(r, metric) is not None for r in runs):
            return ranked(runs, metric)
    return list(runs)


def table(runs: Sequence[Run]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of the summary: one row per run (best first, :func:`ordered`), headline numbers as floats.

    The experiment may add columns that describe a run (a sweep's range and samples). A
    number that a run cannot give (accuracy at factor 1 when its range excludes 1) is None.
    """
    fixed = ["run", "model", "experiment", "items"]
    runs = ordered(runs)
    experiment = registry.get(runs[0].experiment)
    described = [experiment.report_columns(r.result) for r in runs]
    extra: list[str] = []
    for d in described:
        extra += [k for k in d if k not in extra]
    numbers: list[str] = []
    for r in runs:
        taken = {*fixed, *extra, *numbers}  # a number the experiment already describes a run by is not repeated
        numbers += [k for k, v in r.summary.items() if k not in taken and _is_number(v)]
    columns = [*fixed, *extra, "dtype", *numbers]
    rows = []
    for r, d in zip(runs, described):
        items = r.summary.get("items", r.manifest.get("items"))
        rows.append(
            [
                str(r.path),
                r.model,
                r.experiment,
                items,
                *[d.get(k) for k in extra],
                r.manifest.get("dtype"),
                *[r.summary.get(k) for k in numbers],
            ]
        )
    return columns, rows


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _cell(value: Any, *, markdown: bool) -> str:
    if value is None:
        return "n/a" if markdown else ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if markdown else repr(value)
    text = str(value)
    return text.replace("|", "\\|") if markdown else text


def markdown(runs: Sequence[Run], *, figure: bool = True, note: str | None = None) -> str:
    """The Markdown report: a table of the runs, what its numbers mean, and the figure (``note``: a warning above them)."""
    columns, rows = table(runs)
    experiment = runs[0].experiment
    models = ", ".join(dict.fromkeys(r.model for r in runs))
    lines = [
        f"# {experiment}: {models}",
        "",
        f"{len(runs)} run(s) of the {experiment} experiment; numbers recomputed from each run's results.json.",
        "",
        *([f"**Note:** {note}.", ""] if note else []),
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" if k < 4 or columns[k] == "dtype" else "---:" for k in range(len(columns))) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v, markdown=True) for v in row) + " |" for row in rows]
    lines.append("")
    if any(v is None for row in rows for v in row):
        lines += ["n/a: the run's range does not hold the value the number is read at.", ""]
    declared = {m.name: m for m in registry.get(experiment).metrics}
    lines += [f"- `{k}` ({declared[k].direction} is better): {declared[k].meaning}" for k in columns if k in declared]
    ranking = [m for m in declared.values() if m.name in columns]
    if len(runs) > 1 and ranking:
        lines += ["", "Runs ranked by each metric, best first:", ""]
        for m in ranking:
            order = ", ".join(f"{r.label} ({_cell(_value(r, m), markdown=True)})" for r in ranked(runs, m))
            lines.append(f"- `{m.name}`: {order}")
    if figure:
        lines += ["", "![models compared](comparison.png)", ""]
    return "\n".join(lines)


def summary_csv(runs: Sequence[Run]) -> str:
    """The summary table as CSV, full precision."""
    columns, rows = table(runs)
    return csv_text(columns, [dict(zip(columns, [_cell(v, markdown=False) for v in row])) for row in rows])


# --------------------------------------------------------------------------- writing


def _check_out(out: Path, run_paths: Sequence[Path], force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"--out {out} exists and is not a directory")
    resolved = out.resolve()
    for path in run_paths:
        if path.resolve() == resolved:
            raise RunDirectoryError(f"--out {out} is one of the runs; write the report to another directory")
    from contllm.rundir.runs import is_run_dir

    if is_run_dir(out) or (out / "audit.json").is_file():  # --force never replaces another run's own files
        what = "a run directory" if is_run_dir(out) else "an audit directory"
        raise RunDirectoryError(f"--out {out} is {what}; a report never writes into one, give another directory")
    present = [name for name in REPORT_FILES if (out / name).exists()]
    if present and not all((out / name).is_file() for name in ("summary.md", "summary.csv")):
        # a report writes summary.md and summary.csv each time: without them, these files are someone else's
        raise RunDirectoryError(
            f"--out {out} holds {present[0]}, which no report wrote (no summary.md and summary.csv beside it); "
            "give another directory"
        )
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RunDirectoryError(
            f"{out} already holds files; use --force to replace the report's files there "
            f"({', '.join(REPORT_FILES)}; nothing else is touched)"
        )


def write_report(run_dirs: Sequence[str | Path], out: str | Path, *, force: bool = False) -> list[Path]:
    """Compare finished runs of one experiment: summary.md, summary.csv and comparison.png/.pdf in ``out``.

    Runs that hold different items are compared on the items they share (:func:`shared_items`),
    with a warning on the ``contllm`` logger and in summary.md.
    run_dirs: directories written by ``contllm run``. out: created if needed; when it already
    holds files, only ``force`` lets the report's own files there be replaced (nothing is
    deleted). Everything is read and checked before anything is written. The comparison
    figure is drawn where the experiment has one. Returns the paths written. Raises
    RunDirectoryError naming the directory that is wrong.
    """
    out = _run_path(out, "the report's directory (out)")
    runs = load_runs(run_dirs)
    _check_out(out, [r.path for r in runs], force)
    runs, warning = shared_items(runs)
    if warning:
        LOGGER.warning(f"warning: {warning}")
    fig, md, csv, explorer = _report_parts(runs, warning)  # everything made before anything is written
    out.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(out / "summary.md", md), atomic_write_text(out / "summary.csv", csv)]
    if fig is not None:
        from contllm.plotting import save_figure

        paths += save_figure(fig, out / "comparison")
    if explorer is not None:
        paths.append(atomic_write_text(out / "explorer.html", explorer))
    return paths


def _report_parts(runs: Sequence[Run], warning: str | None) -> tuple[Any, str, str, str | None]:
    """(the comparison figure or None, summary.md, summary.csv, explorer.html or None) of the runs; RunDirectoryError
    when their results hold values a report cannot take (read from results.json, so nothing is written then)."""
    from contllm.rundir.explorer import explorer_data, page

    experiment = registry.get(runs[0].experiment)
    fig = None
    try:
        fig = experiment.comparison([(r.label, r.result) for r in runs])
        md, csv = markdown(runs, figure=fig is not None, note=warning), summary_csv(runs)
        data = explorer_data([(r.label, r.result) for r in runs])  # the same item, one curve per run
        explorer = None if data is None else page(data, f"{runs[0].experiment}: {len(runs)} runs")
    except BaseException as exc:
        if fig is not None:
            from contllm.plotting import plt

            plt.close(fig)
        if isinstance(exc, ContllmError) or not isinstance(exc, Exception):
            raise
        # the last resort: a value read from a results.json that no report can take
        where = ", ".join(str(r.path) for r in runs)
        raise RunDirectoryError(
            f"the {RESULTS} of {where} cannot be reported ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return fig, md, csv, explorer


def draw_figures(
    path: str | Path, *, formats: str | Sequence[str] = DEFAULT_FORMATS, items: str | int | None = None
) -> list[Path]:
    """Draw the figures of a finished run directory again, from its results.json and without a model; returns the files written.

    Draws the summary figure and every item's figure and document, or with ``items`` (the
    first N or comma-separated ids, like ``--items``) the summary and those items' only, in
    ``formats`` ("png", "pdf", "png,pdf"; PNG only by default), over any files of the same
    names. The directory is locked meanwhile, and its manifest lists the new files among
    the run's outputs (``--force`` removes them with the rest). This is ``contllm figures
    RUN_DIR``. RunDirectoryError for a directory that is not a finished run (or that
    another process is writing), ExperimentError for an unknown format or item.
    """
    import tempfile

    from contllm.rundir.outputs import Output
    from contllm.rundir.runs import RunDir
    from contllm.settings import figure_formats

    drawn_as = figure_formats(formats)
    run = load_run(path)
    ids = _item_ids(run, items)
    run_dir = RunDir(run.path, run.config, resume=True).open()
    try:
        # Drawn apart first: a result that reads but cannot be drawn (a value edited by hand) changes nothing.
        with tempfile.TemporaryDirectory(prefix="contllm-figures-") as staging:
            out = Output(registry.get(run.experiment), run.result, run.summary, Path(staging), True, drawn_as, ids)
            _draw(out, run.path)
            moved: list[Path] = run_dir.write_outputs(lambda: _move_in(out.written, Path(staging), run.path))
            return moved
    finally:
        run_dir.close()


def _draw(out: Any, run: Path) -> None:
    """Every drawn output of ``out`` (figures, documents) into ``out.directory``; RunDirectoryError when the run's
    result holds values its figures cannot take."""
    from contllm.rundir.outputs import DRAWN, WRITERS

    try:
        for writer in DRAWN:
            WRITERS[writer](out)
    except (ContllmError, OSError):
        raise
    except Exception as exc:  # the last resort: a value read from results.json that no figure can take
        raise RunDirectoryError(
            f"{run}: the figures of its {RESULTS} cannot be drawn ({type(exc).__name__}: {str(exc)[:200]}); "
            "nothing was written"
        ) from None


def _move_in(staged: Sequence[Path], staging: Path, run: Path) -> list[Path]:
    """The files drawn into ``staging`` put at the same places in ``run``, each through a temporary name and a rename."""
    import shutil
    import tempfile

    from contllm.rundir.files import file_mode, inside, note_written

    placed = []
    for source in staged:
        target = inside(run, source.relative_to(staging))
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            shutil.copyfile(source, tmp)
            os.chmod(tmp, file_mode())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        note_written(target)
        placed.append(target)
    return placed


@dataclass(frozen=True)
class _Item:
    id: str


def _item_ids(run: Any, items: str | int | None) -> list[str] | None:
    """The ids ``items`` selects among a loaded run's records (None: every item)."""
    if items is None:
        return None
    from contllm.data import select_items
    from contllm.errors import ExperimentError

    found = [getattr(r, "item_id", None) or getattr(r, "id", None) for r in getattr(run.result, "records", None) or ()]
    ids = [i for i in found if isinstance(i, str)]
    if not ids or len(ids) != len(found):
        raise ExperimentError(
            f"the records of a {run.experiment} run have no item ids to choose from; leave out --items"
        )
    return [item.id for item in select_items([_Item(i) for i in ids], items)]
