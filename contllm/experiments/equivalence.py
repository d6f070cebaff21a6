"""Duration-repetition equivalence: is one apple lasting 3 steps read as three apples?

The counting experiment shows that four 0.75-long apples read as about three apples. This
one asks the converse over a grid: a word repeated m times (m = 1..max copies), every copy
lasting d steps, inside the counting prompt; the digits 0-9 are read out. A model that
counts time would read m copies of duration d as m·d copies, so the contours of the
implied count E[k] over (m, d) would follow the hyperbolas m·d = const. Where m·d is an
integer k within the grid, the read-out at (m, d) is compared with the plain prompt of k
copies (the cell (k, 1)) by KL divergence, and, as a baseline, with m copies at d = 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from contllm import metrics
from contllm.core.signal import Signal
from contllm.data import CountingItem, load_counting
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table, option_table
from contllm.experiments.counting import CountingConfig, render_item
from contllm.experiments.records import IntArray, Record, RecordList, Records
from contllm.experiments.sweeps import SweepPlan, run_plan, sweep_options, sweep_values

#: Digits are read out, so no grid may ask for more than nine copies.
MOST_COPIES = 9

#: Probabilities below this are clipped before a logarithm (KL of distributions with zeros).
FLOOR = 1e-12


@dataclass
class EquivalenceConfig(CountingConfig):
    """Options of the equivalence experiment.

    template, chat: the counting prompt (see :class:`CountingConfig`); {words} holds the copies.
    low, high, samples: the per-copy durations d, evenly spaced (1.0 added when inside;
        the range must hold 1.0, the plain prompts every cell is compared with).
    max_copies: copies m = 1..max_copies (at most 9: the digits are read out).
    per_category: words per category of the counting dataset (13 categories; 1..10).
    """

    low: float = 0.25
    high: float = 3.0
    samples: int = 12
    max_copies: int = 6
    per_category: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.low <= 1.0 <= self.high:
            raise ExperimentError(
                f"the duration range {self.low:g},{self.high:g} must hold 1 (the plain prompts every cell is compared with)"
            )
        if isinstance(self.max_copies, bool) or not 1 <= self.max_copies <= MOST_COPIES:
            raise ExperimentError(
                f"--max-copies must be between 1 and {MOST_COPIES} (digits are read out), got {self.max_copies}"
            )
        if isinstance(self.per_category, bool) or not 1 <= self.per_category <= 10:
            raise ExperimentError(
                f"--per-category must be between 1 and 10 (words per category), got {self.per_category}"
            )

    def copies(self) -> np.ndarray:
        """The copies m [M]: 1..max_copies."""
        return np.arange(1, self.max_copies + 1)

    def durations(self) -> np.ndarray:
        """The per-copy durations d [D], 1.0 among them."""
        return sweep_values(self.low, self.high, self.samples)


@dataclass
class Grid(Record, what="equivalence record"):
    """One word's read-out over the grid: probabilities [M, D, K] of the labels for m copies of duration d."""

    item_id: str
    copies: IntArray
    durations: np.ndarray
    labels: list[str]
    probs: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        expected = (len(self.copies), len(self.durations), len(self.labels))
        if self.probs.shape != expected:
            raise ExperimentError(
                f"malformed equivalence record {self.item_id}: probs shaped {self.probs.shape}, expected {expected}"
            )

    def digits(self) -> np.ndarray:
        """The digit distribution [M, D, K], renormalised over the labels."""
        mass = self.probs.sum(axis=-1, keepdims=True)
        return self.probs / np.where(mass > 0, mass, np.nan)

    def implied(self) -> np.ndarray:
        """The implied count E[k] [M, D] over the digit labels."""
        return self.digits() @ np.array([float(label) for label in self.labels])

    def product(self) -> np.ndarray:
        """m·d [M, D]: the count of a model that counts time."""
        return np.outer(self.copies, self.durations)

    def unit_column(self) -> int:
        """The column of d = 1 (the plain prompts); ExperimentError when the grid has none."""
        hits = np.flatnonzero(np.isclose(self.durations, 1.0, atol=1e-9))
        if not len(hits):
            raise ExperimentError(f"item {self.item_id}: the grid has no d = 1 column")
        return int(hits[0])


def integer_cells(grid: Grid) -> list[tuple[int, int, int]]:
    """The cells (row, column, reference row) where m·d is an integer k among the copies, d != 1.

    The reference row is the row of k copies; its cell in the d = 1 column is the plain
    prompt of k copies that the cell is compared with.
    """
    row_of = {int(m): i for i, m in enumerate(grid.copies)}
    unit = grid.unit_column()
    cells = []
    for i, m in enumerate(grid.copies):
        for j, d in enumerate(grid.durations):
            k = round(float(m * d))
            if j != unit and abs(m * d - k) < 1e-9 and k in row_of:
                cells.append((i, j, row_of[k]))
    return cells


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) in nats of two distributions [K] (clipped at :data:`FLOOR`)."""
    p = np.clip(p, FLOOR, None)
    q = np.clip(q, FLOOR, None)
    return float(np.sum(p * (np.log(p) - np.log(q))))


def measures(grid: Grid) -> dict[str, float]:
    """One word's numbers: how E[k] follows m·d, and how close (m, d) reads to m·d plain copies.

    slope, r2: E[k] fitted on m·d over the cells with m·d <= max copies; spearman_product and
    spearman_copies: rank correlation of E[k] with m·d and with m alone over the whole grid;
    mae_product: mean |E[k] - m·d| over the cells with m·d <= max copies; kl_product: mean
    KL(cell || k plain copies) over :func:`integer_cells`; kl_same_copies: the same cells
    against m plain copies (what ignoring the duration would give); argmax_agreement: share
    of those cells whose argmax digit equals that of k plain copies; accuracy_at_1: share of
    m whose argmax digit at d = 1 is m.
    """
    implied, product, p = grid.implied(), grid.product(), grid.digits()
    inside = product <= grid.copies.max() + 1e-9
    fit = metrics.linear_fit(product[inside], implied[inside]) if np.ptp(product[inside]) > 0 else None
    copies = np.broadcast_to(grid.copies[:, None], product.shape)
    unit = grid.unit_column()
    cells = integer_cells(grid)
    kl = [kl_divergence(p[i, j], p[r, unit]) for i, j, r in cells]
    same = [kl_divergence(p[i, j], p[i, unit]) for i, j, _ in cells]
    agree = [int(np.argmax(p[i, j])) == int(np.argmax(p[r, unit])) for i, j, r in cells]
    labels = np.array([float(label) for label in grid.labels])
    nan = float("nan")
    return {
        "slope": fit.slope if fit else nan,
        "r2": fit.r2 if fit else nan,
        "spearman_product": metrics.spearman(product.ravel(), implied.ravel()) if product.size > 1 else nan,
        "spearman_copies": metrics.spearman(copies.ravel(), implied.ravel()) if product.size > 1 else nan,
        "mae_product": float(np.mean(np.abs(implied[inside] - product[inside]))),
        "kl_product": float(np.mean(kl)) if kl else nan,
        "kl_same_copies": float(np.mean(same)) if same else nan,
        "argmax_agreement": float(np.mean(agree)) if agree else nan,
        "accuracy_at_1": float(np.mean(labels[np.argmax(p[:, unit], axis=-1)] == grid.copies)),
        "integer_cells": len(cells),
    }


MEASURES = (
    "slope",
    "r2",
    "spearman_product",
    "spearman_copies",
    "mae_product",
    "kl_product",
    "kl_same_copies",
    "argmax_agreement",
    "accuracy_at_1",
)


@dataclass
class EquivalenceResult(Records[Grid], record=Grid):
    """Every word's grid from one run (``grids``), with the configuration that made it."""

    grids = RecordList()
    grid = Records.record

    def common(self) -> list[Grid]:
        """The grids on the most common (copies, durations) grid (a run uses one)."""
        key = Counter((tuple(g.copies), tuple(np.round(g.durations, 12))) for g in self.grids).most_common(1)[0][0]
        return [g for g in self.grids if (tuple(g.copies), tuple(np.round(g.durations, 12))) == key]

    def mean_implied(self) -> tuple[Grid, np.ndarray]:
        """A grid of the common shape and the mean E[k] [M, D] over the words on it."""
        grids = self.common()
        return grids[0], np.nanmean([g.implied() for g in grids], axis=0)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Tidy rows: one per item, copies, duration and label."""
        for g in self.grids:
            for i, m in enumerate(g.copies):
                for j, d in enumerate(g.durations):
                    for k, label in enumerate(g.labels):
                        yield {
                            "item": g.item_id,
                            "word": g.meta.get("word", ""),
                            "copies": int(m),
                            "duration": float(d),
                            "copies_x_duration": float(m * d),
                            "label": label,
                            "probability": float(g.probs[i, j, k]),
                        }


ROW_COLUMNS = ["item", "word", "copies", "duration", "copies_x_duration", "label", "probability"]


def select_words(items: Sequence[CountingItem], per_category: int) -> list[CountingItem]:
    """The first ``per_category`` words of each category, in the dataset's order."""
    seen: Counter[str] = Counter()
    chosen = []
    for item in items:
        if seen[item.category] < per_category:
            seen[item.category] += 1
            chosen.append(item)
    return chosen


def plan_grid(lm: Any, item: CountingItem, config: EquivalenceConfig) -> tuple[SweepPlan, np.ndarray, np.ndarray]:
    """The signals of one word's grid, row-major over (m, d), and the copies and durations."""
    from contllm.core.readout import digits

    copies, durations = config.copies(), config.durations()
    signals = []
    for m in copies:
        rendered = render_item(lm, replace(item, n=int(m)), config)
        base = Signal.from_text(lm.tokenizer, rendered.text, add_special_tokens=not config.chat)
        signals += [base.scale(rendered.spans["words"], float(d)) for d in durations]
    product = np.outer(copies, durations).ravel()
    meta = {"word": item.word, "category": item.category}
    return SweepPlan(item.id, product, signals, digits(lm.tokenizer), meta=meta), copies, durations


def run_grid(lm: Any, item: CountingItem, config: EquivalenceConfig, evaluate: Any) -> Grid:
    """Evaluate one word's grid in one call of ``evaluate`` (signals -> distributions [S, vocab])."""
    plan, copies, durations = plan_grid(lm, item, config)
    sweep = run_plan(plan, evaluate)
    probs = sweep.probs.reshape(len(copies), len(durations), len(sweep.labels))
    return Grid(item.id, copies, durations, sweep.labels, probs, sweep.meta)


class EquivalenceExperiment(Experiment[Grid, EquivalenceResult]):
    name = "equivalence"
    help = "A word repeated m times, each copy lasting d steps: is m copies of d read as m·d copies?"
    description = (
        "For each word, the counting prompt with m = 1..max-copies copies of the word, every copy lasting d "
        "steps (d over --range); the digits 0-9 are read out. Reports E[k] over (m, d) against the hyperbolas "
        "m·d = const and the KL divergence between (m, d) and m·d plain copies where m·d is an integer. "
        "Items are counting words, one per category by default (ids like count-001; 13 items)."
    )
    Config = EquivalenceConfig
    options = (
        *sweep_options("the per-copy duration d", "0.25,3", 12),
        *option_table(
            f"""
            max_copies    int  Copies m = 1..N of the word (N <= {MOST_COPIES}). [default: 6]
            per_category  int  Words per category of the counting dataset (1-10; 13 categories). [default: 1]
            """
        ),
    )
    engine = shardable = True
    unit = "word"
    result_type = EquivalenceResult
    metrics = Metric.table(
        """
        mean_spearman_product  higher  rank correlation of E[k] with m·d over the grid, mean over words
        mean_mae_product       lower   mean |E[k] - m·d| over cells with m·d <= max copies, mean over words
        mean_kl_product        lower   mean KL((m, d) || m·d plain copies) over integer cells, mean over words
        """
    )

    def items(self, config: EquivalenceConfig) -> Sequence[CountingItem]:
        return select_words(load_counting(), config.per_category)

    def run_item(self, lm: Any, config: EquivalenceConfig, item: CountingItem, context: RunContext) -> Grid:
        return run_grid(lm, item, config, context.evaluate)

    def tables(self, result: EquivalenceResult) -> dict[str, Table]:
        per_item = [{"item": g.item_id, "word": g.meta.get("word", ""), **measures(g)} for g in result.grids]
        return {
            "results": (ROW_COLUMNS, result.rows()),
            "items": (["item", "word", *MEASURES, "integer_cells"], per_item),
        }

    def summary(self, result: EquivalenceResult) -> dict[str, Any]:
        """The per-word :func:`measures` averaged over words, prefixed ``mean_``."""
        if not result.grids:
            raise ExperimentError("the result holds no grids")
        per_item = [measures(g) for g in result.grids]
        out: dict[str, Any] = {"experiment": result.experiment, "model": result.model, "items": len(per_item)}
        for key in MEASURES:
            values = [m[key] for m in per_item if np.isfinite(m[key])]
            out[f"mean_{key}"] = float(np.mean(values)) if values else float("nan")
        return out

    def report_columns(self, result: EquivalenceResult) -> dict[str, Any]:
        grid = result.common()[0] if result.grids else None
        if grid is None:
            return {"d_min": None, "d_max": None, "samples": None, "max_copies": None}
        return {
            "d_min": float(grid.durations.min()),
            "d_max": float(grid.durations.max()),
            "samples": len(grid.durations),
            "max_copies": int(grid.copies.max()),
        }

    def summary_figure(self, result: EquivalenceResult) -> Any:
        return summary_figure(result)

    def item_figure(self, result: EquivalenceResult, record: Grid) -> Any:
        return item_figure(result, record)

    def comparison(self, results: Sequence[tuple[str, EquivalenceResult]]) -> Any:
        return comparison_figure(results)


# ------------------------------------------------------------------------------ figures


def _edges(values: np.ndarray) -> np.ndarray:
    """Cell edges around sorted centres [N] (midpoints inside, half a step outside)."""
    if len(values) == 1:
        return np.array([values[0] - 0.5, values[0] + 0.5])
    mid = (values[1:] + values[:-1]) / 2
    return np.concatenate([[values[0] - (mid[0] - values[0])], mid, [values[-1] + (values[-1] - mid[-1])]])


def heatmap(ax: Any, grid: Grid, implied: np.ndarray, title: str) -> Any:
    """E[k] [M, D] over (d, m) on ``ax``, its contours at the integers (solid) and m·d = 1..M (dashed)."""
    copies, durations = grid.copies.astype(float), grid.durations
    top = float(copies.max())
    mesh = ax.pcolormesh(
        _edges(durations), _edges(copies), implied, cmap="viridis", vmin=0, vmax=max(top, 1.0), shading="flat"
    )
    if len(copies) > 1 and len(durations) > 1:
        levels = np.arange(1, int(top) + 1)
        lines = ax.contour(durations, copies, implied, levels=levels, colors="white", linewidths=1.2)
        ax.clabel(lines, fmt="%d", fontsize=7)
    d = np.linspace(_edges(durations)[0], _edges(durations)[-1], 200)
    for c in range(1, int(top) + 1):
        ax.plot(d, c / d, "--", color="orange", lw=1)
        if c / d[-1] >= _edges(copies)[0]:
            ax.text(
                d[-1], c / d[-1], f" m·d={c}", color="darkorange", fontsize=6, va="center", ha="left", clip_on=False
            )
    ax.set_xlim(_edges(durations)[0], _edges(durations)[-1])
    ax.set_ylim(_edges(copies)[0], _edges(copies)[-1])
    ax.set_xlabel("duration per copy d")
    ax.set_ylabel("copies m")
    ax.set_yticks(copies)
    ax.set_title(title, fontsize=9)
    return mesh


def item_figure(result: EquivalenceResult, grid: Grid) -> Any:
    """One word: E[k] over (m, d), contours solid, hyperbolas m·d = const dashed."""
    from contllm.plotting import plt

    fig, ax = plt.subplots(figsize=(6.5, 4.8), constrained_layout=True)
    numbers = measures(grid)
    title = (
        f'{result.model} · equivalence · {grid.item_id} "{grid.meta.get("word", "")}"\n'
        f"white: E[k] contours; dashed: m·d = const; KL to m·d plain copies {numbers['kl_product']:.3g}"
    )
    fig.colorbar(heatmap(ax, grid, grid.implied(), title), ax=ax, label="implied count E[k]")
    return fig


def equivalence_finding(result: EquivalenceResult) -> tuple[str, str]:
    """The sentence an equivalence summary opens with, and the numbers behind it.

    From the per-word :func:`measures` averaged over words: the rank correlation of E[k]
    with m·d against the one with m alone, and the mean distance |E[k] − m·d|. A product
    correlation of 0.8 or more with a distance up to 0.75 reads as "counts like m × d";
    a copies correlation above the product's by 0.1 as "follows the copies, not their
    duration"; a slope of E[k] on m·d under 0.1 as "hardly depends"; otherwise "grows with
    m × d, though not one for one".
    """
    numbers = [measures(g) for g in result.grids]
    product = float(np.nanmean([m["spearman_product"] for m in numbers]))
    copies = float(np.nanmean([m["spearman_copies"] for m in numbers]))
    gap = float(np.nanmean([m["mae_product"] for m in numbers]))
    detail = (
        f"rank correlation of the predicted count with m × d: {product:.2f}, with m alone: {copies:.2f}; "
        f"distance from m × d: {gap:.2f} (means over {len(numbers)} words)"
    )
    slope = float(np.nanmean([m["slope"] for m in numbers]))
    if product >= 0.8 and gap <= 0.75:
        return "m copies lasting d each count like m × d copies: the predicted count follows m × d", detail
    if copies > product + 0.1:
        return "The predicted count follows the number of copies, not how long they last", detail
    if not slope >= 0.1:
        return "The predicted count hardly depends on m × d", detail
    return "The predicted count grows with m × d, though not one for one", detail


def summary_figure(result: EquivalenceResult) -> Any:
    """Across words. First, the finding: mean E[k] against m·d, one line per number of copies m; then the mean E[k]
    over the (d, m) grid with the hyperbolas m·d = const."""
    from contllm.plotting import finding, heading, legend_outside, plt

    grid, implied = result.mean_implied()
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(15, 5.4), constrained_layout=True, gridspec_kw={"width_ratios": [1.3, 1]}
    )
    product = grid.product()
    colors = plt.get_cmap("viridis")
    for i, m in enumerate(grid.copies):
        left.plot(product[i], implied[i], "-o", ms=3, color=colors(i / max(1, len(grid.copies) - 1)), label=f"m = {m}")
    top = float(product.max())
    left.plot([0, top], [0, top], ":", color="0.4", label="predicted count = m × d")
    left.set_ylim(0, 9.5)
    left.set_xlabel("m × d: copies of the word times how long each lasts")
    left.set_ylabel("predicted count E[k] (mean over words)")
    left.grid(alpha=0.3)
    finding(left, *equivalence_finding(result))
    legend_outside(left, title="copies")
    n = len(result.common())
    fig.colorbar(
        heatmap(right, grid, implied, f"Mean predicted count over {n} words\n(white: contours; dashed: m × d = const)"),
        ax=right,
        label="predicted count E[k]",
    )
    heading(fig, result.model, "equivalence", len(result.grids), "words")
    return fig


def comparison_figure(results: Sequence[tuple[str, EquivalenceResult]]) -> Any:
    """Runs side by side: each run's mean E[k] heatmap with the hyperbolas."""
    from contllm.plotting import plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.6 * len(results), 4.6), squeeze=False, constrained_layout=True)
    mesh = None
    for ax, (label, result) in zip(axes.flat, results):
        grid, implied = result.mean_implied()
        mesh = heatmap(ax, grid, implied, f"{label}: mean E[k] over {len(result.common())} words")
    if mesh is not None:
        fig.colorbar(mesh, ax=list(axes.flat), label="implied count E[k]")
    fig.suptitle("equivalence: " + " vs ".join(dict.fromkeys(label for label, _ in results)), fontsize=12)
    return fig


EXPERIMENT = EquivalenceExperiment()
