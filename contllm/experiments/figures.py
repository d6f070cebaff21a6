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
from contllm.plotting import plt

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
    """One item: the probability of each label against the knob; with ``counts``, E[k] and the argmax count too.

    what: a line saying what the item is (its word, its events, its operators).
    """
    # Fixed margins rather than constrained layout: a run draws one such figure per item, and
    # solving the layout took a third of each figure's time.
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    fig.subplots_adjust(left=0.09, right=0.9, bottom=0.12, top=0.86)
    item_panel(ax, result, sweep, counts=counts)
    ax.set_title(f"{result.model} · {result.experiment} · {sweep.item_id}\n{what}", fontsize=9)
    return fig


def item_panel(ax: Any, result: Result, sweep: Sweep, *, counts: bool, proportional: bool = False) -> None:
    """One item's curves on ``ax``; with ``counts`` a twin axis with E[k], the argmax count and (``proportional``) n·c."""
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(sweep.labels):
        width = 2.6 if label == sweep.truth else 1.4
        ax.plot(sweep.x, sweep.probs[:, j], "-", lw=width, color=colors(j % 10), label=f"{label}")
    ax.set_xlabel(_x_name(result))
    ax.set_ylabel("probability")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if not counts:
        ax.legend(fontsize=8, loc="best", title="label")
        return
    implied = sweep.implied_value()
    twin = ax.twinx()
    twin.plot(sweep.x, implied, "k--", lw=2, label="implied count E[k]")
    argmax = [float(v) for v in sweep.argmax_labels()]
    twin.plot(sweep.x, argmax, "ks", ms=4, alpha=0.6, label="argmax count")
    if proportional:
        twin.plot(
            sweep.x,
            _proportional_count(sweep),
            ":",
            color="0.3",
            lw=1.5,
            label="count proportional to time (n·c)"
            if not sweep.meta.get("event")
            else "count proportional to time (n−1+c)",
        )
    twin.set_ylabel("count")
    if proportional:
        twin.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax.legend(handles + h2, labels + l2, fontsize=7, ncol=2, loc="upper left", title="label (true count bold)")


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
    return chosen, f"{chosen.item_id}: n = {n}, median of {_count_items(len(same))} by counts 1..{n} reached as argmax"


def count_summary_figure(result: Result) -> Any:
    """Counting or events across items: mean E[k] and mean probability of the true count against the factor, per true count."""
    by_n: dict[int, list[Sweep]] = defaultdict(list)
    for s in result.sweeps:
        by_n[int(s.truth or 0)].append(s)
    fig, ((one, left), (right, sensitivity)) = plt.subplots(2, 2, figsize=(14, 9), constrained_layout=True)
    chosen, why = representative(result.sweeps)
    item_panel(one, result, chosen, counts=True, proportional=True)
    one.set_title(f"one item ({why})", fontsize=10)
    threshold_panel(sensitivity, result.sweeps)
    cmap = plt.get_cmap("viridis")
    ns = sorted(by_n)
    for k, n in enumerate(ns):
        color = cmap(k / max(1, len(ns) - 1))
        x = by_n[n][0].x
        same_grid = [s for s in by_n[n] if len(s.x) == len(x) and np.allclose(s.x, x)]
        implied = np.nanmean([s.implied_value() for s in same_grid], axis=0)
        truth_p = np.mean([s.column(str(n)) if str(n) in s.labels else np.zeros_like(x) for s in same_grid], axis=0)
        left.plot(x, implied, "-o", ms=3, color=color, label=f"n = {n} ({len(same_grid)} items)")
        left.plot(x, n * x, ":", color=color, lw=1)
        right.plot(x, truth_p, "-o", ms=3, color=color, label=f"n = {n}")
    left.set_xlabel(_x_name(result))
    left.set_ylabel("mean implied count E[k]")
    left.set_title("implied count (dotted: n·c)", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.set_xlabel(_x_name(result))
    right.set_ylabel("mean probability of the true count n")
    right.set_ylim(-0.02, 1.02)
    right.set_title("probability of the true count", fontsize=10)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(f"{result.model} · {result.experiment} · {len(result.sweeps)} items", fontsize=12)
    return fig


def threshold_panel(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """The paper's time-sensitivity figure on ``ax``: observed and counterfactual time sensitivity and IoU against the peak threshold h."""
    curves = [metrics.count_curve(s) for s in sweeps]
    h = metrics.default_thresholds()
    observed = metrics.observed_time_sensitivity(curves, h)
    ax.plot(
        h, observed, "-", color="tab:blue", lw=2, label=f"observed (AUC {metrics.area_under_curve(h, observed):.3f})"
    )
    if all(np.isclose(s.x, 1.0).any() for s in sweeps):
        counterfactual = metrics.counterfactual_time_sensitivity(curves, h)
        ax.plot(
            h,
            counterfactual,
            "--",
            color="tab:orange",
            lw=2,
            label=f"counterfactual, c = 1 only (AUC {metrics.area_under_curve(h, counterfactual):.3f})",
        )
    iou = metrics.iou_curve(curves, h)
    ax.plot(h, iou, ":", color="tab:green", lw=2, label=f"IoU with 1..n (AUC {metrics.area_under_curve(h, iou):.3f})")
    ax.set(xlabel="peak threshold h", ylabel="share", xlim=(0, 1), ylim=(-0.02, 1.02))
    ax.set_title("time sensitivity and IoU against the threshold", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def boolean_summary_figure(result: Result) -> Any:
    """Boolean across items: P(1) / (P(0) + P(1)) against alpha, one panel per operator pair."""
    by_pair: dict[str, list[Sweep]] = defaultdict(list)
    for s in result.sweeps:
        by_pair[f"{s.meta.get('first')} -> {s.meta.get('second')}"].append(s)
    pairs = sorted(by_pair)
    cols = min(4, len(pairs))
    rows = int(np.ceil(len(pairs) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False, constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for ax, pair in zip(axes.flat, pairs):
        for k, s in enumerate(sorted(by_pair[pair], key=lambda s: (s.meta.get("a"), s.meta.get("b")))):
            p1, p0 = s.column("1"), s.column("0")
            share = p1 / np.where(p0 + p1 > 0, p0 + p1, np.nan)
            label = f"({s.meta.get('a')},{s.meta.get('b')}): {s.meta.get('truth_first')}->{s.meta.get('truth_second')}"
            ax.plot(s.x, share, "-", color=colors(k), lw=1.6, label=label)
        ax.set_title(pair, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("alpha")
        ax.set_ylabel("P(1) / (P(0) + P(1))")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, title="inputs: truth", title_fontsize=6)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.axis("off")
    fig.suptitle(f"{result.model} · boolean interpolation · {len(result.sweeps)} items", fontsize=12)
    return fig


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
        for xpos, v in zip(offset, values):
            bars.annotate(
                "n/a" if v is None else f"{v:.2f}", (xpos, 0 if v is None else v), ha="center", va="bottom", fontsize=7
            )
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


# ------------------------------------------------------------------------------ sums


def read_share(record: Any) -> np.ndarray:
    """(implied sum - b) / a [S]: how much of the scaled number the sum holds (c on the line; nan when a = 0)."""
    if record.scaled == 0:
        return np.full(len(record.x), np.nan)
    return (record.implied() - record.other) / record.scaled


def sums_item_figure(result: Any, record: Any) -> Any:
    """A sums problem: the implied sum and the greedy answer against c with the line a·c + b; the first digit below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True, constrained_layout=True)
    top.plot(record.x, record.implied(), "k-o", ms=3, label="implied sum")
    top.plot(record.x, record.greedy(), "s", color="tab:blue", ms=4, alpha=0.7, label="greedy answer")
    top.plot(record.x, record.line(), "--", color="tab:orange", label=f"{record.scaled}·c + {record.other}")
    top.axhline(record.truth, color="0.5", ls=":", lw=1, label=f"true sum {record.truth}")
    top.set_ylabel("sum")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    colors = plt.get_cmap("tab10")
    first = record.first_digit()
    for j, label in enumerate(record.labels):
        bold = label == str(record.truth)[0]
        bottom.plot(record.x, first[:, j], "-", lw=2.6 if bold else 1.2, color=colors(j), label=label)
    bottom.set(xlabel="duration factor c of the scaled number", ylabel="P(first digit)", ylim=(-0.02, 1.02))
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7, ncol=5, title="first digit (true one bold)", title_fontsize=7)
    problem = str(record.meta.get("problem", ""))
    top.set_title(f"{result.model} · sums · {record.item_id}: {record.scaled} scaled\n{problem[:110]}", fontsize=9)
    return fig


def sums_summary_figure(result: Any, outcomes: Sequence[dict[str, bool]], names: Sequence[str]) -> Any:
    """Across problems: how much of the scaled number the implied sum holds, and which answers are written, against c;
    the share of problems per outcome (``outcomes``: each record's valid, successful, strongly and completely successful)."""
    x, records = result.common()
    fig, (left, right, rates) = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    valid = [o for o in outcomes if o["valid"]]
    values = [np.mean([o["valid"] for o in outcomes])] + [
        np.mean([o[k] for o in valid]) if valid else np.nan for k in names[1:]
    ]
    rates.bar(range(4), values, color=["0.5", "tab:blue", "tab:green", "tab:purple"])
    for k, v in enumerate(values):
        rates.annotate(
            "n/a" if not np.isfinite(v) else f"{v:.2f}",
            (k, 0 if not np.isfinite(v) else v),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    rates.set_xticks(range(4), ["valid\n(of all)", "successful\n(of valid)", "strongly", "completely"])
    rates.set(ylim=(0, 1.1), ylabel="share of problems", title=f"outcomes ({len(valid)} of {len(outcomes)} valid)")
    shares = np.array([read_share(r) for r in records])
    for row in shares:
        left.plot(x, row, "-", color="0.8", lw=0.8)
    low, median, high = np.nanpercentile(shares, [25, 50, 75], axis=0)
    left.fill_between(x, low, high, color="0.4", alpha=0.25, label="25-75% of problems")
    left.plot(x, median, "k-o", ms=3, lw=2, label=f"median over {len(records)} problems")
    left.plot(x, x, "--", color="tab:orange", label="read as c times the number (a·c + b)")
    # An answer with a digit too many puts a problem far off the scale; the median keeps its place.
    left.set(
        xlabel="duration factor c of the scaled number a",
        ylabel="(implied sum − b) / a",
        ylim=(-1.0, 3.0),
        title="share of the scaled number in the implied sum (clipped to -1..3)",
    )
    greedy = np.array([r.greedy() for r in records])
    truth = np.array([[r.truth] for r in records])
    other = np.array([[r.other] for r in records])
    right.plot(x, np.mean(greedy == truth, axis=0), "-o", ms=3, label="greedy answer = a + b")
    right.plot(x, np.mean(greedy == other, axis=0), "-s", ms=3, label="greedy answer = b (a left out)")
    right.set(
        xlabel="duration factor c of the scaled number a",
        ylabel="share of problems",
        ylim=(-0.02, 1.02),
        title="answers written",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in (left, right, rates):
        ax.title.set_fontsize(9)
    fig.suptitle(f"{result.model} · sums · {len(result.records)} problems", fontsize=12)
    return fig


def sums_comparison_figure(results: Sequence[tuple[str, Any]]) -> Any:
    """Runs side by side: the median share of the scaled number and the accuracy against c."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for k, (label, result) in enumerate(results):
        x, records = result.common()
        left.plot(
            x,
            np.nanmedian([read_share(r) for r in records], axis=0),
            "-o",
            ms=3,
            color=colors(k % 10),
            label=f"{label} ({len(records)} problems)",
        )
        right.plot(
            x, np.mean([r.greedy() == r.truth for r in records], axis=0), "-o", ms=3, color=colors(k % 10), label=label
        )
    grid = np.concatenate([result.common()[0] for _, result in results])
    left.plot(np.sort(grid), np.sort(grid), "--", color="0.4", label="a·c + b")
    left.set(xlabel="duration factor c", ylabel="median (implied sum − b) / a", title="share of the scaled number")
    right.set(
        xlabel="duration factor c", ylabel="share of problems", ylim=(-0.02, 1.02), title="greedy answer = true sum"
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("sums: " + " vs ".join(dict.fromkeys(label for label, _ in results)), fontsize=12)
    return fig
