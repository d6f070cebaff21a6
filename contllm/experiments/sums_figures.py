"""Figures of the sums experiment: one problem, a run's summary, runs compared (data in, figures out, none saved)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contllm.plotting import finding, heading, label_bars, legend_outside, paper_title, plt
from contllm.wording import first_holding


def read_share(record: Any) -> np.ndarray:
    """(implied sum - b) / a [S]: how much of the scaled number the sum holds (c on the line; nan when a = 0)."""
    if record.scaled == 0:
        return np.full(len(record.x), np.nan)
    return (record.implied() - record.other) / record.scaled


def item_figure(result: Any, record: Any) -> Any:
    """A sums problem: the implied sum and the greedy answer against c with the line a·c + b; the first digit below."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, constrained_layout=True)
    top.plot(record.x, record.implied(), "k-o", ms=3, label="implied sum")
    top.plot(record.x, record.greedy(), "s", color="tab:blue", ms=4, alpha=0.7, label="greedy answer")
    top.plot(record.x, record.line(), "--", color="tab:orange", label=f"{record.scaled}·c + {record.other}")
    top.axhline(record.truth, color="0.5", ls=":", lw=1, label=f"true sum {record.truth}")
    top.set_ylabel("sum")
    top.grid(alpha=0.3)
    legend_outside(top)
    colors = plt.get_cmap("tab10")
    first = record.first_digit()
    for j, label in enumerate(record.labels):
        bold = label == str(record.truth)[0]
        bottom.plot(record.x, first[:, j], "-", lw=2.6 if bold else 1.2, color=colors(j), label=label)
    bottom.set(xlabel="duration factor c of the scaled number", ylabel="P(first digit)", ylim=(-0.02, 1.02))
    bottom.grid(alpha=0.3)
    legend_outside(bottom, title="first digit (true one bold)")
    problem = str(record.meta.get("problem", ""))
    top.set_title(f"{result.model} · sums · {record.item_id}: {record.scaled} scaled\n{problem[:110]}", fontsize=9)
    return fig


def sums_finding(records: Sequence[Any]) -> tuple[str, str]:
    """The sentence a sums summary opens with, and the numbers behind it.

    From the mean rank correlation rho of the implied sum with c and the median share of
    the scaled number the sum moves by per unit of c (the slope of (implied − b) / a; 1 on
    the line a·c + b): rho >= 0.5 with a slope within 0.3 of 1 reads as "about c × a + b",
    with a slope of 0.3 or more as "counts for less"; a slope of 0.1 or more as "a little
    less"; less as "hardly depends".
    """
    from contllm import metrics

    rhos = [metrics.spearman(r.x, r.implied()) for r in records if len(r.x) > 1]
    rho = float(np.nanmean(rhos)) if rhos and not np.all(np.isnan(rhos)) else float("nan")
    slopes = [
        metrics.linear_fit(r.x, share).slope
        for r in records
        if len(r.x) > 1 and np.ptp(r.x) > 0 and np.isfinite(share := read_share(r)).all()
    ]
    slope = float(np.median(slopes)) if slopes else float("nan")
    detail = (
        f"rank correlation of the sum with c: {rho:.2f} (mean); the sum moves by {slope:.2f} of the number per unit "
        "of c (median; 1 on the line a·c + b)"
    )
    sentence = first_holding(
        (not (np.isfinite(rho) and np.isfinite(slope)), "The sum as one number lasts shorter or longer"),
        (rho >= 0.5 and abs(slope - 1) <= 0.3, "A shortened number counts for less: the sum reads about c × a + b"),
        (rho >= 0.5 and slope >= 0.3, "A shortened number counts for less: the sum falls as the number shrinks"),
        (slope >= 0.1, "A shortened number counts a little less in the sum"),
        otherwise="The sum hardly depends on how long the number lasts",
    )
    return sentence, detail


#: The paper's outcome classes in plain words (the keys of contllm.experiments.sums.success).
OUTCOMES = {
    "valid": "valid:\nright at c = 1\n(of all)",
    "successful": "successful:\na shrunk reading\nwins somewhere",
    "strongly_successful": "strongly:\nit beats every\nother digit",
    "completely_successful": "completely:\nno digit ever\nbeats it",
}


def summary_figure(result: Any, outcomes: Sequence[dict[str, bool]], names: Sequence[str]) -> Any:
    """Across problems. First, the finding: how much of the scaled number the implied sum holds against c, beside the
    line c (a·c + b); then which answers are written; last, the paper's outcome rates (``outcomes``: each record's
    valid, successful, strongly and completely successful; ``names``: their keys in order)."""
    x, records = result.common()
    fig, (left, right, rates) = plt.subplots(
        1, 3, figsize=(18, 5.2), constrained_layout=True, gridspec_kw={"width_ratios": [1.5, 1, 1.2]}
    )
    shares = np.array([read_share(r) for r in records])
    for row in shares:
        left.plot(x, row, "-", color="0.8", lw=0.8)
    low, median, high = np.nanpercentile(shares, [25, 50, 75], axis=0)
    left.fill_between(x, low, high, color="0.4", alpha=0.25, label="middle half of the problems")
    left.plot(x, median, "k-o", ms=3, lw=2, label=f"median over {len(records)} problems (grey: each)")
    left.plot(x, x, "--", color="tab:orange", label="c: the number read as c times itself")
    # An answer with a digit too many puts a problem far off the scale; the median keeps its place.
    left.set(
        xlabel="duration factor c: how long the number a lasts (1 = as written)",
        ylabel="(implied sum − b) / a, clipped to −1..3",
        ylim=(-1.0, 3.0),
    )
    finding(left, *sums_finding(records))
    greedy = np.array([r.greedy() for r in records])
    truth = np.array([[r.truth] for r in records])
    other = np.array([[r.other] for r in records])
    right.plot(x, np.mean(greedy == truth, axis=0), "-o", ms=3, label="a + b (the true sum)")
    right.plot(x, np.mean(greedy == other, axis=0), "-s", ms=3, label="b (a left out)")
    right.set(xlabel="duration factor c of a", ylabel="share of problems", ylim=(-0.02, 1.02))
    right.set_title("Which answer the model writes", loc="left", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        legend_outside(ax)
    valid = [o for o in outcomes if o["valid"]]
    values = [np.mean([o["valid"] for o in outcomes])] + [
        np.mean([o[k] for o in valid]) if valid else np.nan for k in names[1:]
    ]
    rates.bar(range(len(values)), values, color=["0.5", "tab:blue", "tab:green", "tab:purple"][: len(values)])
    label_bars(rates, values)
    rates.set_xticks(range(len(values)), [OUTCOMES.get(k, k) for k in names], fontsize=7.5)
    rates.set(
        ylim=(0, 1.1), ylabel=f"share of the {len(valid)} valid problems\n(the first bar: of all {len(outcomes)})"
    )
    paper_title(rates, "How often shrinking the number changes\nthe first digit as predicted", "outcome rates")
    rates.grid(alpha=0.3, axis="y")
    heading(fig, result.model, "sums", len(result.records), "problems")
    return fig


def comparison_figure(results: Sequence[tuple[str, Any]]) -> Any:
    """Runs side by side: the median share of the scaled number and the accuracy against c."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8), constrained_layout=True)
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
        legend_outside(ax)
    fig.suptitle("sums: " + " vs ".join(dict.fromkeys(label for label, _ in results)), fontsize=12)
    return fig
