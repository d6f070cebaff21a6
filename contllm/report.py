"""Reports over finished runs: a summary table and a figure comparing models on one experiment.

``contllm report RUN... --out DIR`` reads run directories written by ``contllm run`` and
writes into DIR::

    summary.md        one row per run: model, experiment, items, headline numbers
    summary.csv       the same numbers, unrounded
    comparison.png    the models side by side (also as comparison.pdf)

The headline numbers are recomputed from results.json by
:func:`contllm.experiments.summarize`, so runs made by different versions are compared by
the same definitions. Only runs of one experiment can be compared.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contllm import metrics
from contllm.errors import ContllmError, RunDirectoryError
from contllm.experiments import summarize
from contllm.experiments.base import ExperimentResult, Sweep
from contllm.runs import CONFIG, MANIFEST

RESULTS = "results.json"
REQUIRED = (CONFIG, MANIFEST, RESULTS)
#: The files a report writes; with --force only these are replaced, nothing is deleted.
REPORT_FILES = ("summary.md", "summary.csv", "comparison.png", "comparison.pdf")
COUNT_EXPERIMENTS = ("counting", "events")

#: What each headline number means, for the Markdown report.
DEFINITIONS = {
    "accuracy_at_1": "share of items whose most probable digit at factor 1 is the true count",
    "mean_spearman_implied_vs_factor": "Spearman correlation of the implied count E[k] with the factor, mean over items",
    "auc_observed_time_sensitivity": "area over h of the share of counts 1..n reaching probability h somewhere on the sweep",
    "auc_counterfactual_time_sensitivity": "the same, read only at factor 1",
    "argmax_coverage": "share of counts 1..n that are the most probable digit at some factor",
    "accuracy_at_alpha_0": "truth-table accuracy (P(1) vs P(0)) of the first operator, at alpha 0",
    "accuracy_at_alpha_1": "truth-table accuracy of the second operator, at alpha 1",
    "mean_total_variation_p1": "total variation of P(1) over the alpha sweep, mean over items",
    "mean_max_jump_p1": "largest change of P(1) between neighbouring alphas, mean over items",
}


@dataclass
class Run:
    """A finished run directory, read: its path, config, manifest, result and headline numbers."""

    path: Path
    config: dict[str, Any]
    manifest: dict[str, Any]
    result: ExperimentResult
    summary: dict[str, Any]
    label: str = ""

    @property
    def experiment(self) -> str:
        return self.result.experiment


def _read_json(path: Path, run: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirectoryError(f"{run}: cannot read {path.name} ({exc})") from None


def load_run(path: str | Path) -> Run:
    """Read a finished run directory; RunDirectoryError naming what is missing or unfinished."""
    path = Path(path)
    if not path.is_dir():
        why = "it does not exist" if not path.exists() else "it is not a directory"
        raise RunDirectoryError(f"{path} is not a run directory ({why}); give directories written by 'contllm run'")
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise RunDirectoryError(
            f"{path} is not a run directory (no {', '.join(missing)}); give directories written by 'contllm run'"
        )
    config = _read_json(path / CONFIG, path)
    manifest = _read_json(path / MANIFEST, path)
    if not isinstance(config, dict) or not isinstance(manifest, dict):
        raise RunDirectoryError(f"{path}: {CONFIG} and {MANIFEST} must each hold a JSON object")
    status = manifest.get("status")
    if status != "finished":
        experiment = config.get("experiment", "EXPERIMENT")
        raise RunDirectoryError(
            f"{path} is an unfinished run (status {status!r}); finish it with "
            f"'contllm run {experiment} --out {path} --resume' and the options it was started with"
        )
    try:
        result = ExperimentResult.from_dict(_read_json(path / RESULTS, path))
        summary = summarize(result)
    except RunDirectoryError:
        raise
    except (ContllmError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise RunDirectoryError(f"{path}: {RESULTS} is malformed ({type(exc).__name__}: {exc})") from None
    return Run(path, config, manifest, result, summary)


def load_runs(run_dirs: Sequence[str | Path]) -> list[Run]:
    """Read run directories of one experiment, each once, and give each run a legend label."""
    if not run_dirs:
        raise RunDirectoryError("no run directories given; give one or more directories written by 'contllm run'")
    seen: dict[Path, Path] = {}
    for given in map(Path, run_dirs):
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


def _label(runs: list[Run]) -> None:
    """Legend labels: the model name, with the run directory added where models repeat."""
    models = Counter(r.result.model for r in runs)
    for r in runs:
        r.label = r.result.model if models[r.result.model] == 1 else f"{r.result.model} ({r.path.name})"
    labels = Counter(r.label for r in runs)
    for r in runs:
        if labels[r.label] > 1:
            r.label = f"{r.result.model} ({r.path})"


# --------------------------------------------------------------------------- tables


def _grid(result: ExperimentResult) -> tuple[float, float, int]:
    """The knob's range and the number of samples per item (the most common grid)."""
    grids = Counter((float(s.x.min()), float(s.x.max()), len(s.x)) for s in result.sweeps)
    return grids.most_common(1)[0][0]


def table(runs: Sequence[Run]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of the summary: one row per run, headline numbers as floats.

    A number that a run cannot give (accuracy at factor 1 when its range excludes 1) is None.
    """
    fixed = ["run", "model", "experiment", "items"]
    numbers: list[str] = []
    for r in runs:
        numbers += [k for k in r.summary if k not in fixed and k not in numbers]
    x_label = runs[0].result.x_label
    columns = [*fixed, f"{x_label}_min", f"{x_label}_max", "samples", "dtype", *numbers]
    rows = []
    for r in runs:
        low, high, samples = _grid(r.result)
        rows.append(
            [str(r.path), r.result.model, r.experiment, len(r.result.sweeps), low, high, samples,
             r.manifest.get("dtype"), *[r.summary.get(k) for k in numbers]]
        )
    return columns, rows


def _cell(value: Any, *, markdown: bool) -> str:
    if value is None:
        return "n/a" if markdown else ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3f}" if markdown else repr(value)
    text = str(value)
    return text.replace("|", "\\|") if markdown else text


def markdown(runs: Sequence[Run]) -> str:
    """The Markdown report: a table of the runs, what its numbers mean, and the figure."""
    columns, rows = table(runs)
    experiment = runs[0].experiment
    models = ", ".join(dict.fromkeys(r.result.model for r in runs))
    lines = [
        f"# {experiment}: {models}",
        "",
        f"{len(runs)} run(s) of the {experiment} experiment; numbers recomputed from each run's results.json.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" if k < 4 or columns[k] == "dtype" else "---:" for k in range(len(columns))) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v, markdown=True) for v in row) + " |" for row in rows]
    lines.append("")
    if any(v is None for row in rows for v in row):
        lines += ["n/a: the run's range does not hold the value the number is read at.", ""]
    lines += [f"- `{k}`: {DEFINITIONS[k]}" for k in columns if k in DEFINITIONS]
    lines += ["", "![models compared](comparison.png)", ""]
    return "\n".join(lines)


def csv_text(runs: Sequence[Run]) -> str:
    """The summary table as CSV, full precision."""
    import csv
    import io

    columns, rows = table(runs)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(v, markdown=False) for v in row])
    return buffer.getvalue()


# --------------------------------------------------------------------------- figures


def _common_grid(sweeps: Sequence[Sweep]) -> tuple[np.ndarray, list[Sweep]]:
    """The most common x grid among ``sweeps`` and the sweeps on it (a run uses one grid)."""
    grids = Counter(tuple(np.round(s.x, 12)) for s in sweeps)
    x = np.array(grids.most_common(1)[0][0])
    return x, [s for s in sweeps if len(s.x) == len(x) and np.allclose(s.x, x)]


def _count_items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def _count_curve(sweep: Sweep) -> metrics.CountCurve:
    numeric = [i for i, lab in enumerate(sweep.labels) if lab.isdigit()]
    labels = np.array([int(sweep.labels[i]) for i in numeric])
    return metrics.CountCurve(sweep.x, sweep.probs[:, numeric], labels, int(sweep.truth or 0))


def _proportional_count(sweep: Sweep) -> np.ndarray:
    """The count if the model counted time: n·c, or n − 1 + c when a single event is scaled."""
    n = float(int(sweep.truth or 0))
    if sweep.meta.get("event"):
        return n - 1 + sweep.x
    return n * sweep.x


def comparison_figure(runs: Sequence[Run]) -> Any:
    """The models side by side on one experiment (counting/events or boolean): a matplotlib figure."""
    from contllm import plotting  # selects a headless backend where there is no display

    if runs[0].experiment in COUNT_EXPERIMENTS:
        fig = _count_comparison(runs, plotting.plt)
    else:
        fig = _boolean_comparison(runs, plotting.plt)
    names = " vs ".join(dict.fromkeys(r.label for r in runs))
    fig.suptitle(f"{runs[0].experiment}: {names}", fontsize=12)
    return fig


def _count_comparison(runs: Sequence[Run], plt: Any) -> Any:
    fig, (sens, implied, acc) = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    h = metrics.default_thresholds()
    references: list[tuple[np.ndarray, np.ndarray]] = []
    for k, r in enumerate(runs):
        color = colors(k % 10)
        sweeps = r.result.sweeps
        curves = [_count_curve(s) for s in sweeps]
        observed = metrics.observed_time_sensitivity(curves, h)
        sens.plot(h, observed, "-", color=color, lw=2, label=f"{r.label}: observed")
        if all(np.isclose(s.x, 1.0, atol=1e-6).any() for s in sweeps):
            counterfactual = metrics.counterfactual_time_sensitivity(curves, h)
            sens.plot(h, counterfactual, "--", color=color, lw=1.5, label=f"{r.label}: counterfactual (c = 1)")
        x, same = _common_grid(sweeps)
        n_items = _count_items(len(same)) if len(same) == len(sweeps) else f"{len(same)} of {_count_items(len(sweeps))}"
        expected = np.nanmean([s.implied_value() for s in same], axis=0)
        implied.plot(x, expected, "-o", ms=3, color=color, label=f"{r.label} ({n_items})")
        ideal = np.mean([_proportional_count(s) for s in same], axis=0)
        if not any(len(x) == len(rx) and np.allclose(x, rx) and np.allclose(ideal, ry) for rx, ry in references):
            references.append((x, ideal))
        correct = np.mean([[lab == s.truth for lab in s.argmax_labels()] for s in same], axis=0)
        acc.plot(x, correct, "-o", ms=3, color=color, label=f"{r.label} ({n_items})")
    for n, (x, ideal) in enumerate(references):
        label = "count proportional to time (n·c; n−1+c with one event scaled)" if n == 0 else None
        implied.plot(x, ideal, ":", color="0.4", lw=1.2, label=label)
    x_name = "duration factor c"
    sens.set(xlabel="threshold h", ylabel="share of counts 1..n found", ylim=(-0.02, 1.02),
             title="time sensitivity (solid: observed on the sweep; dashed: at c = 1)")
    implied.set(xlabel=x_name, ylabel="mean implied count E[k]", title="implied count E[k] over digits")
    acc.set(xlabel=x_name, ylabel="share of items with argmax digit = n", ylim=(-0.02, 1.02),
            title="accuracy of the argmax digit")
    for ax in (sens, implied, acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.title.set_fontsize(9)
    return fig


def _share_of_one(sweep: Sweep) -> np.ndarray:
    p1, p0 = sweep.column("1"), sweep.column("0")
    total = p0 + p1
    return p1 / np.where(total > 0, total, np.nan)


#: Boolean items by how the truth value moves from the first operator to the second.
TRANSITIONS = {"flips": ((0, 1), (1, 0)), "stays": ((1, 1), (0, 0))}


def _boolean_comparison(runs: Sequence[Run], plt: Any) -> Any:
    fig, (flips, stays, bars) = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for k, r in enumerate(runs):
        color = colors(k % 10)
        for ax, kind in ((flips, "flips"), (stays, "stays")):
            for (before, after), style in zip(TRANSITIONS[kind], ("-", "--")):
                chosen = [
                    s for s in r.result.sweeps
                    if (int(s.meta.get("truth_first", -1)), int(s.meta.get("truth_second", -1))) == (before, after)
                ]
                if not chosen:
                    continue
                x, same = _common_grid(chosen)
                share = np.nanmean([_share_of_one(s) for s in same], axis=0)
                ax.plot(x, share, style, color=color, lw=1.8,
                        label=f"{r.label}: {before} → {after} ({_count_items(len(same))})")
    width = 0.8 / len(runs)
    positions = np.arange(2)
    for k, r in enumerate(runs):
        values = [r.summary.get("accuracy_at_alpha_0"), r.summary.get("accuracy_at_alpha_1")]
        heights = [np.nan if v is None else v for v in values]
        offset = positions - 0.4 + width * (k + 0.5)
        bars.bar(offset, heights, width, color=colors(k % 10), label=r.label)
        for xpos, v in zip(offset, values):
            bars.annotate("n/a" if v is None else f"{v:.2f}", (xpos, 0 if v is None else v),
                          ha="center", va="bottom", fontsize=7)
    bars.set_xticks(positions, ["alpha = 0\n(first operator)", "alpha = 1\n(second operator)"])
    # Headroom above 1 keeps the legend off the bars.
    bars.set(ylabel="truth-table accuracy (P(1) vs P(0))", ylim=(0, 1.3), yticks=np.linspace(0, 1, 6),
             title="truth-table accuracy at the ends")
    bars.legend(fontsize=7, loc="upper center", ncol=min(len(runs), 3))
    for ax, kind in ((flips, "flips"), (stays, "stays")):
        ax.set(xlabel="interpolation alpha", ylabel="mean P(1) / (P(0) + P(1))", ylim=(-0.02, 1.02),
               title=f"items whose truth value {kind} (first → second operator)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in (flips, stays, bars):
        ax.title.set_fontsize(9)
    bars.grid(alpha=0.3, axis="y")
    return fig


# --------------------------------------------------------------------------- writing


def _check_out(out: Path, run_paths: Sequence[Path], force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"--out {out} exists and is not a directory")
    resolved = out.resolve()
    for path in run_paths:
        if path.resolve() == resolved:
            raise RunDirectoryError(f"--out {out} is one of the runs; write the report to another directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RunDirectoryError(
            f"{out} already holds files; use --force to replace the report's files there "
            f"({', '.join(REPORT_FILES)}; nothing else is touched)"
        )


def write_report(run_dirs: Sequence[str | Path], out: str | Path, *, force: bool = False) -> list[Path]:
    """Compare finished runs of one experiment: summary.md, summary.csv, comparison.png/.pdf in ``out``.

    run_dirs: directories written by ``contllm run``. out: created if needed; when it already
    holds files, only ``force`` lets the report's own files there be replaced (nothing is
    deleted). Everything is read and checked before anything is written. Returns the paths
    written. Raises RunDirectoryError naming the directory that is wrong.
    """
    from contllm import plotting
    from contllm.runs import atomic_write_text

    out = Path(out)
    runs = load_runs(run_dirs)
    _check_out(out, [r.path for r in runs], force)
    md, csv = markdown(runs), csv_text(runs)
    fig = comparison_figure(runs)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = [atomic_write_text(out / "summary.md", md), atomic_write_text(out / "summary.csv", csv)]
        paths += plotting.save_figure(fig, out / "comparison")
    finally:
        plotting.plt.close(fig)
    return paths
