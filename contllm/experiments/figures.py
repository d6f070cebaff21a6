"""Figures of sweep results (counting, events, boolean): one item, a run's summary, runs compared.

Every function takes result data (an :class:`~contllm.experiments.sweeps.ExperimentResult`
or its sweeps, read by attribute) and returns a matplotlib figure; nothing is saved here
(:func:`contllm.plotting.save_figure` does that).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from contllm import metrics
from contllm.plotting import finding, heading, label_bars, legend_outside, paper_title, plt, shortened
from contllm.wording import first_holding

Result = Any  # an ExperimentResult: experiment, model, x_label, sweeps
Sweep = Any  # a Sweep: item_id, x, labels, probs, truth, meta


class Compared(NamedTuple):
    """One run in a comparison: its legend label, its result and its summary numbers."""

    label: str
    result: Result
    summary: dict[str, Any]


def _x_name(result: Result) -> str:
    return "duration factor c" if result.x_label == "factor" else "interpolation alpha"


def item_figure(result: Result, sweep: Sweep, what: str, *, counts: bool) -> Any:
    """One item: the probability of each label against the knob; with ``counts`` a panel below with E[k], the argmax
    count and the count proportional to time.

    what: a line saying what the item is (its word, its events, its operators).
    """
    # Fixed margins rather than constrained layout: a run draws one such figure per item, and
    # solving the layout took a third of each figure's time.
    if not counts:
        fig, ax = plt.subplots(figsize=(8.5, 4.5))
        fig.subplots_adjust(left=0.09, right=0.8, bottom=0.12, top=0.86)
        item_panel(ax, result, sweep)
        ax.set_title(f"{result.model} · {result.experiment} · {sweep.item_id}\n{what}", fontsize=9)
        return fig
    fig, (ax, below) = plt.subplots(2, 1, figsize=(8.5, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    fig.subplots_adjust(left=0.09, right=0.76, bottom=0.08, top=0.9, hspace=0.12)
    item_panel(ax, result, sweep)
    ax.set_xlabel("")
    count_panel(below, result, sweep)
    ax.set_title(f"{result.model} · {result.experiment} · {sweep.item_id}\n{what}", fontsize=9)
    return fig


def item_panel(ax: Any, result: Result, sweep: Sweep) -> None:
    """One item's curves on ``ax``: each label's probability against the knob, the true label bold, the most probable
    label at each value dotted black; the legend to the right."""
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(sweep.labels):
        width = 2.8 if label == sweep.truth else 1.3
        ax.plot(sweep.x, sweep.probs[:, j], "-", lw=width, color=colors(j % 10), label=f"{label}")
    top = sweep.probs.max(axis=1)
    ax.plot(sweep.x, top, "o", ms=3.5, color="black", label="most probable")
    ax.set_xlabel(_x_name(result))
    ax.set_ylabel("probability")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    legend_outside(ax, title="label (bold: the true one)" if sweep.truth is not None else "label")


def count_panel(ax: Any, result: Result, sweep: Sweep) -> None:
    """One counting item's counts on ``ax``: E[k], the most probable count and the count proportional to time."""
    ax.plot(sweep.x, sweep.implied_value(), "k-", lw=2, label="predicted count E[k]")
    ax.plot(
        sweep.x, [float(v) for v in sweep.argmax_labels()], "s", color="tab:blue", ms=4, label="most probable count"
    )
    ax.plot(sweep.x, _proportional_count(sweep), ":", color="0.3", lw=1.5, label=_proportional_name(sweep))
    ax.set(xlabel=_x_name(result), ylabel="count", ylim=(0, None))
    ax.grid(alpha=0.3)
    legend_outside(ax)


def _proportional_name(sweep: Sweep) -> str:
    return (
        "n − 1 + c: the count if it followed time"
        if sweep.meta.get("event")
        else "n × c: the count if it followed time"
    )


def representative(sweeps: Sequence[Sweep]) -> tuple[Sweep, str]:
    """The item a summary shows whole, and why: of the items with n = 4 (the paper's four apples; else the largest n),
    the median by how many of the counts 1..n are the argmax somewhere on the sweep (ties by item id)."""
    ns = [int(s.truth or 0) for s in sweeps]
    n = 4 if 4 in ns else max(ns)
    same = [s for s in sweeps if int(s.truth or 0) == n]

    def reached(s: Sweep) -> int:
        return len({lab for lab in s.argmax_labels()} & {str(k) for k in range(1, n + 1)})

    ranked = sorted(same, key=lambda s: (reached(s), s.item_id))
    chosen = ranked[(len(ranked) - 1) // 2]
    return (
        chosen,
        f"the median of {_count_items(len(same))} with n = {n}\nby counts reached, not the best",
    )


def count_finding(sweeps: Sequence[Sweep], counted: str = "words") -> tuple[str, str]:
    """The sentence a counting or events summary opens with, and the numbers behind it.

    The share is how far the predicted count E[k] moves over the sweep against how far the
    count proportional to time (n·c) moves, per item (median): 0.6 or more with E[k]
    within half a count of n·c (median of each item's mean distance) reads as "follows
    n × c"; 0.3 or more as "falls as they shrink"; 0.1 or more as "slightly smaller";
    within ±0.1 as no dependence; -0.1 or less as larger counts. ``counted``: what is
    shortened ("words", "events").
    """
    shares = []
    for s in sweeps:
        implied, proportional = s.implied_value(), _proportional_count(s)
        low, high = int(np.argmin(s.x)), int(np.argmax(s.x))
        span = proportional[high] - proportional[low]
        if span > 0:
            shares.append((implied[high] - implied[low]) / span)
    share = float(np.nanmedian(shares)) if shares else float("nan")
    gap = float(np.median([np.nanmean(np.abs(s.implied_value() - _proportional_count(s))) for s in sweeps]))
    detail = (
        f"over the sweep the predicted count moves {share:.2f} as far as n × c does (median over items); "
        f"it lies {gap:.1f} from n × c (median)"
    )
    if not np.isfinite(share):
        return f"The predicted count as the {counted} last shorter or longer", detail
    if share >= 0.6 and gap <= 0.5:
        return f"Shorter {counted}, smaller counts: the predicted count follows n × c", detail
    if share >= 0.3:
        return f"Shorter {counted}, smaller counts: the predicted count falls as the {counted} shrink", detail
    if share >= 0.1:
        return f"Shorter {counted}, slightly smaller counts: the predicted count moves a little with c", detail
    if share > -0.1:
        return f"The predicted count hardly depends on how long the {counted} last", detail
    return f"Shorter {counted}, larger counts: the predicted count rises as the {counted} shrink", detail


def count_summary_figure(result: Result, counted: str = "words") -> Any:
    """Counting or events across items. First, the finding: the mean predicted count E[k] against the factor per true
    count n, beside n × c; then one item whole, the probability of the true count, and last the paper's measures (how
    many counts become likely as c moves, against the threshold; the peak rates against chance)."""
    by_n: dict[int, list[Sweep]] = defaultdict(list)
    for s in result.sweeps:
        by_n[int(s.truth or 0)].append(s)
    fig = plt.figure(figsize=(16, 9.5), constrained_layout=True)
    panels = fig.subplot_mosaic([["finding", "finding", "item"], ["truth", "sensitivity", "peaks"]])
    finding_ax, one, truth_ax = panels["finding"], panels["item"], panels["truth"]
    chosen, why = representative(result.sweeps)
    item_panel(one, result, chosen)
    what = shortened(f"{chosen.meta['word']} × {chosen.truth}" if chosen.meta.get("word") else chosen.item_id)
    one.set_title(f"One item whole: {what}\n({why})", loc="left", fontsize=9)
    cmap = plt.get_cmap("viridis")
    ns = sorted(by_n)
    for k, n in enumerate(ns):
        color = cmap(k / max(1, len(ns) - 1))
        x, same = _common_grid(by_n[n])
        implied = np.nanmean([s.implied_value() for s in same], axis=0)
        truth_p = np.mean([s.column(str(n)) if str(n) in s.labels else np.zeros_like(x) for s in same], axis=0)
        finding_ax.plot(x, implied, "-o", ms=3.5, lw=2, color=color, label=f"n = {n} ({_count_items(len(same))})")
        finding_ax.plot(x, np.mean([_proportional_count(s) for s in same], axis=0), ":", color=color, lw=1.3)
        truth_ax.plot(x, truth_p, "-o", ms=3, color=color, label=f"n = {n}")
    finding_ax.plot(
        [],
        [],
        ":",
        color="0.3",
        label=_proportional_name(chosen).replace("n − 1 + c", "dotted, n − 1 + c").replace("n × c:", "dotted, n × c:"),
    )
    finding(finding_ax, *count_finding(result.sweeps, counted))
    finding_ax.set(
        xlabel=f"{_x_name(result)}: how long every {counted[:-1]} lasts (1 = as written)",
        ylabel="predicted count E[k] (mean over items)",
    )
    finding_ax.set_ylim(bottom=0)
    finding_ax.grid(alpha=0.3)
    legend_outside(finding_ax, title="true count n")
    truth_ax.set(xlabel=_x_name(result), ylabel="probability of the true count n (mean)", ylim=(-0.02, 1.02))
    truth_ax.set_title("How likely the true count stays", loc="left", fontsize=9)
    truth_ax.grid(alpha=0.3)
    legend_outside(truth_ax, title="true count")
    threshold_panel(panels["sensitivity"], result.sweeps)
    peaks_panel(panels["peaks"], result.sweeps)
    heading(fig, result.model, result.experiment, len(result.sweeps))
    return fig


def threshold_panel(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """The paper's time-sensitivity figure on ``ax``: observed and counterfactual time sensitivity and IoU against the
    peak threshold h, in plain words."""
    curves = [metrics.count_curve(s) for s in sweeps]
    h = metrics.default_thresholds()
    observed = metrics.observed_time_sensitivity(curves, h)
    auc = metrics.area_under_curve
    ax.plot(h, observed, "-", color="tab:blue", lw=2, label=f"somewhere as c moves (area {auc(h, observed):.2f})")
    if all(np.isclose(s.x, 1.0).any() for s in sweeps):
        counterfactual = metrics.counterfactual_time_sensitivity(curves, h)
        ax.plot(
            h,
            counterfactual,
            "--",
            color="tab:orange",
            lw=2,
            label=f"at c = 1 only (area {auc(h, counterfactual):.2f})",
        )
    iou = metrics.iou_curve(curves, h)
    ax.plot(h, iou, ":", color="tab:green", lw=2, label=f"overlap with 1..n, IoU (area {auc(h, iou):.2f})")
    ax.set(xlabel="probability threshold h", ylabel="share of the counts 1..n", xlim=(0, 1), ylim=(-0.02, 1.02))
    paper_title(ax, "Counts 1..n whose probability reaches h", "time sensitivity and IoU")
    ax.grid(alpha=0.3)
    legend_outside(ax)


def peaks_panel(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """The paper's peak rates on ``ax``: the counts 1..n (pure) and the digits (unpure) that are the most probable one
    somewhere on the sweep, over n, against the chance rate 1/n; each bar says its improvement over chance (a ratio)."""
    rates = metrics.peak_rates([metrics.count_curve(s) for s in sweeps])
    values = [rates.pure, rates.unpure, rates.chance]
    names = [  # short lines: three labels share the panel's width
        "pure:\na count 1..n\non top",
        "unpure:\nany digit\non top",
        "chance:\none count\n(1/n)",
    ]
    ax.bar(range(3), values, color=["tab:blue", "tab:purple", "0.6"])
    ratios = [rates.pure_improvement, rates.unpure_improvement, 1.0]
    for k, (v, r) in enumerate(zip(values, ratios)):
        ax.annotate(f"{v:.2f}\n×{r:.2f} chance" if k < 2 else f"{v:.2f}", (k, v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(3), names, fontsize=7.5)
    ax.set(ylabel="share of n (mean over items)", ylim=(0, max(1.0, max(values)) * 1.25))
    paper_title(ax, "How many different counts are the top answer as c moves", "peak rates, improvement over chance")
    ax.grid(alpha=0.3, axis="y")


def finding_layout(panels: int, cols: int = 4, size: tuple[float, float] = (4.2, 3.4)) -> tuple[Any, Any, list[Any]]:
    """A figure whose first panel (the finding) takes a row of its own, over ``panels`` more in rows of ``cols``:
    (figure, the finding's axes, the other axes in order). Rows of the grid left empty are left out."""
    rows = max(1, int(np.ceil(panels / cols)))
    fig = plt.figure(figsize=(size[0] * cols + 1.2, size[1] * (rows + 1.15) + 0.6), constrained_layout=True)
    top, bottom = np.asarray(fig.subfigures(2, 1, height_ratios=[1.25, rows])).flat
    first = top.subplots()
    grid = bottom.subplots(rows, cols, squeeze=False)
    rest = list(grid.flat)
    for ax in rest[panels:]:
        ax.remove()
    return fig, first, rest[:panels]


def boolean_finding(sweeps: Sequence[Sweep]) -> tuple[str, str]:
    """The sentence a Boolean summary opens with, and the numbers behind it.

    From the truth-table accuracy at both ends (is P(1) above P(0) where the answer is
    1?) and how far the share P(1) / (P(0) + P(1)) moves toward the second operator's
    answer over the items whose answer flips: a move of 0.3 or more with ends at least
    75% right reads as "follows the operator"; a move of 0.3 or more otherwise as "moves
    with the operator"; less as "barely moves".
    """
    ends = [s for s in sweeps if s.end_truths() is not None and np.isclose(s.x, 0).any() and np.isclose(s.x, 1).any()]
    right = [
        int(_share_at(s, a) > 0.5) == int(t)
        for s in ends
        for a, t in zip((0.0, 1.0), s.end_truths() or ())
        if t is not None
    ]
    accuracy = float(np.mean(right)) if right else float("nan")
    moves = []
    for s in ends:
        first, second = s.end_truths() or (None, None)
        if first is not None and second is not None and first != second:
            toward = 1.0 if second == "1" else -1.0
            moves.append(toward * (_share_at(s, 1.0) - _share_at(s, 0.0)))
    move = float(np.mean(moves)) if moves else float("nan")
    detail = (
        f"truth table right at the ends: {accuracy:.0%}; where the answer flips, P(1) / (P(0) + P(1)) moves "
        f"{move:+.2f} toward the new answer (mean)"
    )
    sentence = first_holding(
        (not np.isfinite(move), "The answer along the path from one operator to the other"),
        (
            move >= 0.3 and accuracy >= 0.75,
            "The answer follows the operator: where the truth value flips, the model's answer flips with it",
        ),
        (move >= 0.3, "The answer moves with the operator, though the model misses part of the truth table"),
        otherwise="The model's answer barely moves as one operator turns into the other",
    )
    return sentence, detail


def _share_at(sweep: Sweep, value: float) -> float:
    p = sweep.at(value)
    p0, p1 = p[sweep.labels.index("0")], p[sweep.labels.index("1")]
    return float(p1 / (p0 + p1)) if p0 + p1 > 0 else float("nan")


#: How a Boolean item's answer goes from the first operator to the second: (first, second) -> (name, colour, style).
MOVES = {
    (0, 1): ("0 → 1 (flips up)", "tab:blue", "-"),
    (1, 0): ("1 → 0 (flips down)", "tab:red", "-"),
    (1, 1): ("1 → 1 (stays 1)", "tab:blue", "--"),
    (0, 0): ("0 → 0 (stays 0)", "tab:red", "--"),
}


def _truths(sweep: Sweep) -> tuple[int, int]:
    first, second = sweep.end_truths() or (None, None)
    return (-1 if first is None else int(first), -1 if second is None else int(second))


def _mark_answers(ax: Any, sweep_truths: Sequence[tuple[int, int]], colors: Sequence[Any], label: bool) -> None:
    """The correct answers at both ends: a ring at (0, first operator's answer) and (1, second's)."""
    for (first, second), color in zip(sweep_truths, colors):
        for x, t in ((0.0, first), (1.0, second)):
            if t in (0, 1):
                ax.plot(
                    [x],
                    [t],
                    "o",
                    ms=9,
                    mfc="none",
                    mec=color,
                    mew=1.8,
                    clip_on=False,
                    label="correct answer" if label else None,
                )
                label = False


def boolean_summary_figure(result: Result) -> Any:
    """Boolean across items. First, the finding: the mean share P(1) / (P(0) + P(1)) against alpha for the items whose
    answer flips or stays, the correct answers ringed at both ends; then one panel per operator pair, each input pair
    a curve with its correct answers ringed; last, the truth-table accuracy at both ends."""
    by_pair: dict[str, list[Sweep]] = defaultdict(list)
    for s in result.sweeps:
        by_pair[f"{s.meta.get('first')} → {s.meta.get('second')}"].append(s)
    pairs = sorted(by_pair)
    fig, first, rest = finding_layout(len(pairs) + 1)
    flat = [first, *rest]
    for (before, after), (name, shade, style) in MOVES.items():
        chosen = [s for s in result.sweeps if _truths(s) == (before, after)]
        if not chosen:
            continue
        x, same = _common_grid(chosen)
        first.plot(
            x,
            np.nanmean([_share_of_one(s) for s in same], axis=0),
            style,
            color=shade,
            lw=2,
            label=f"{name}: {_count_items(len(same))}",
        )
        _mark_answers(first, [(before, after)], [shade], False)
    first.plot([], [], "o", ms=9, mfc="none", mec="0.3", mew=1.8, label="ringed: the correct answer")
    finding(first, *boolean_finding(result.sweeps))
    first.set(xlabel="alpha: first operator (0) → second (1)", ylabel="P(1) / (P(0) + P(1)), mean", ylim=(-0.05, 1.05))
    first.grid(alpha=0.3)
    legend_outside(first, title="answer, first → second operator")
    colors = plt.get_cmap("tab10")
    inputs = sorted({(s.meta.get("a"), s.meta.get("b")) for s in result.sweeps}, key=str)
    for ax, pair in zip(flat[1:], pairs):
        sweeps = sorted(by_pair[pair], key=lambda s: str((s.meta.get("a"), s.meta.get("b"))))
        for s in sweeps:
            color = colors(inputs.index((s.meta.get("a"), s.meta.get("b"))) % 10)
            ax.plot(s.x, _share_of_one(s), "-", color=color, lw=1.6)
            _mark_answers(ax, [_truths(s)], [color], False)
        ax.set_title(pair, fontsize=9, loc="left")
        ax.set(ylim=(-0.05, 1.05), xlabel="alpha", ylabel="P(1) / (P(0) + P(1))")
        ax.grid(alpha=0.3)
    _end_accuracy_panel(flat[-1], result.sweeps)
    handles = [plt.Line2D([], [], color=colors(inputs.index(i) % 10), lw=1.6) for i in inputs]
    # beside the operator pairs' panels, which share its colours
    flat[1].get_figure(root=False).legend(
        handles,
        [f"{a} {b}" for a, b in inputs],
        loc="outside right upper",
        title="inputs a b",
        fontsize=8,
        frameon=False,
    )
    heading(fig, result.model, "boolean interpolation", len(result.sweeps))
    return fig


def _end_accuracy_panel(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """Truth-table accuracy at alpha 0 (first operator) and alpha 1 (second), P(1) against P(0)."""
    values = []
    for at, key in ((0.0, 0), (1.0, 1)):
        right = [
            int(_share_at(s, at) > 0.5) == int(t[key])
            for s in sweeps
            if (t := s.end_truths()) is not None and t[key] is not None and np.isclose(s.x, at).any()
        ]
        values.append(float(np.mean(right)) if right else np.nan)
    ax.bar([0, 1], values, color=["0.5", "0.3"])
    label_bars(ax, values, "{:.0%}")
    ax.set_xticks([0, 1], ["alpha 0\n(first operator)", "alpha 1\n(second operator)"])
    ax.set(ylim=(0, 1.15), ylabel="share of items answered right")
    ax.set_title("Truth table right at the ends\n(P(1) > P(0) where the answer is 1)", loc="left", fontsize=9)
    ax.grid(alpha=0.3, axis="y")


def _common_grid(sweeps: Sequence[Sweep]) -> tuple[np.ndarray, list[Sweep]]:
    """The most common x grid among ``sweeps`` and the sweeps on it (a run uses one grid)."""
    grids = Counter(tuple(np.round(s.x, 12)) for s in sweeps)
    x = np.array(grids.most_common(1)[0][0])
    return x, [s for s in sweeps if len(s.x) == len(x) and np.allclose(s.x, x)]


def _count_items(n: int) -> str:
    return f"{n} item" if n == 1 else f"{n} items"


def _proportional_count(sweep: Sweep) -> np.ndarray:
    """The count if the model counted time: n·c, or n − 1 + c when a single event is scaled."""
    n = float(int(sweep.truth or 0))
    if sweep.meta.get("event"):
        return n - 1 + sweep.x
    return n * sweep.x


def _titled(fig: Any, experiment: str, labels: Sequence[str]) -> Any:
    fig.suptitle(f"{experiment}: {' vs '.join(dict.fromkeys(labels))}", fontsize=12)
    return fig


def count_comparison(runs: Sequence[Compared]) -> Any:
    """Runs of counting or events side by side: time sensitivity, implied count, accuracy."""
    fig, (sens, implied, acc) = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    h = metrics.default_thresholds()
    references: list[tuple[np.ndarray, np.ndarray]] = []
    for k, r in enumerate(runs):
        color = colors(k % 10)
        sweeps = r.result.sweeps
        curves = [metrics.count_curve(s) for s in sweeps]
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
    sens.set(
        xlabel="threshold h",
        ylabel="share of counts 1..n found",
        ylim=(-0.02, 1.02),
        title="time sensitivity (solid: observed on the sweep; dashed: at c = 1)",
    )
    implied.set(xlabel=x_name, ylabel="mean implied count E[k]", title="implied count E[k] over digits")
    acc.set(
        xlabel=x_name,
        ylabel="share of items with argmax digit = n",
        ylim=(-0.02, 1.02),
        title="accuracy of the argmax digit",
    )
    for ax in (sens, implied, acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.title.set_fontsize(9)
    return _titled(fig, runs[0].result.experiment, [r.label for r in runs])


def _share_of_one(sweep: Sweep) -> np.ndarray:
    p1, p0 = sweep.column("1"), sweep.column("0")
    total = p0 + p1
    return p1 / np.where(total > 0, total, np.nan)


#: Boolean items by how the truth value moves from the first operator to the second.
TRANSITIONS = {"flips": ((0, 1), (1, 0)), "stays": ((1, 1), (0, 0))}


def boolean_comparison(runs: Sequence[Compared]) -> Any:
    """Boolean runs side by side (label, result, summary): P(1) where the truth flips or stays, accuracy at the ends."""
    fig, (flips, stays, bars) = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for k, r in enumerate(runs):
        color = colors(k % 10)
        for ax, kind in ((flips, "flips"), (stays, "stays")):
            for (before, after), style in zip(TRANSITIONS[kind], ("-", "--")):
                chosen = [
                    s
                    for s in r.result.sweeps
                    if (int(s.meta.get("truth_first", -1)), int(s.meta.get("truth_second", -1))) == (before, after)
                ]
                if not chosen:
                    continue
                x, same = _common_grid(chosen)
                share = np.nanmean([_share_of_one(s) for s in same], axis=0)
                ax.plot(
                    x,
                    share,
                    style,
                    color=color,
                    lw=1.8,
                    label=f"{r.label}: {before} → {after} ({_count_items(len(same))})",
                )
    width = 0.8 / len(runs)
    positions = np.arange(2)
    for k, r in enumerate(runs):
        values = [r.summary.get("accuracy_at_alpha_0"), r.summary.get("accuracy_at_alpha_1")]
        heights = [np.nan if v is None else v for v in values]
        offset = positions - 0.4 + width * (k + 0.5)
        bars.bar(offset, heights, width, color=colors(k % 10), label=r.label)
        label_bars(bars, heights, positions=offset)
    bars.set_xticks(positions, ["alpha = 0\n(first operator)", "alpha = 1\n(second operator)"])
    # Headroom above 1 keeps the legend off the bars.
    bars.set(
        ylabel="truth-table accuracy (P(1) vs P(0))",
        ylim=(0, 1.3),
        yticks=np.linspace(0, 1, 6),
        title="truth-table accuracy at the ends",
    )
    bars.legend(fontsize=7, loc="upper center", ncol=min(len(runs), 3))
    for ax, kind in ((flips, "flips"), (stays, "stays")):
        ax.set(
            xlabel="interpolation alpha",
            ylabel="mean P(1) / (P(0) + P(1))",
            ylim=(-0.02, 1.02),
            title=f"items whose truth value {kind} (first → second operator)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in (flips, stays, bars):
        ax.title.set_fontsize(9)
    bars.grid(alpha=0.3, axis="y")
    return _titled(fig, runs[0].result.experiment, [r.label for r in runs])
