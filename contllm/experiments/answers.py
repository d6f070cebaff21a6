"""Yes/no questions about a word moved into another: the question groups, the yes-share, the variation, and the figures.

The word-interpolation experiment (:mod:`contllm.experiments.word_interpolation`) reads
P(yes) and P(no) along alpha; what it measures of one sweep and how it draws them live
here, beside the groups of questions that give its answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contllm.experiments.sweeps import ExperimentResult, Sweep
from contllm.wording import mean_finding

#: Question groups: which of the two words the answer is "yes" for (first word, second word).
GROUPS = ("both", "neither", "first", "second")
ANSWERS = {"both": (True, True), "neither": (False, False), "first": (True, False), "second": (False, True)}


def yes_share(sweep: Sweep) -> np.ndarray:
    """P(yes) / (P(yes) + P(no)) along the sweep [S]."""
    yes, no = sweep.column("yes"), sweep.column("no")
    total = yes + no
    return yes / np.where(total > 0, total, np.nan)


#: The paper counts an interpolation as varying when its variation reaches this.
VARIATION_LEVEL = 0.05


def variation(sweep: Sweep) -> float:
    """The paper's variation of one interpolation: how far P(yes) or P(no) leaves the range of its two ends (0 if never)."""
    from contllm import metrics

    return metrics.range_excursion(sweep.probs)


#: The paper's question groups for its Lipschitz breakdown: "one" joins first and second.
PAPER_GROUPS = {"neither": "neither", "first": "one", "second": "one", "both": "both"}


def lipschitz_breakdown(sweeps: Sequence[Sweep]) -> dict[str, Any]:
    """The paper's Lipschitz estimates: one per item and answer (yes, no), averaged.

    Each estimate is the largest |dP/dalpha| of the answer's curve by finite differences
    (central inside, one-sided at the ends) over that curve's range max(P) - min(P)
    (:func:`~contllm.metrics.lipschitz_estimates`); a flat curve (range 0) has none.
    Returns mean_lipschitz (every estimate), mean_lipschitz_<group> for the groups
    neither, one (first and second) and both, mean_lipschitz_<answer> for yes and no, and
    lipschitz_by_group_and_answer ({group: {answer: mean}}); keys without estimates are left out.
    """
    from contllm import metrics

    rows: list[tuple[str | None, str, float]] = []
    for s in sweeps:
        if len(s.x) < 2:
            continue
        estimates = metrics.lipschitz_estimates(s.x, s.probs[:, [s.labels.index("yes"), s.labels.index("no")]])
        group = PAPER_GROUPS.get(str(s.meta.get("group")))
        rows += [(group, answer, float(e)) for answer, e in zip(("yes", "no"), estimates) if np.isfinite(e)]

    def mean(keep: Any) -> float | None:
        values = [e for g, a, e in rows if keep(g, a)]
        return float(np.mean(values)) if values else None

    out: dict[str, Any] = {}
    table: dict[str, dict[str, float]] = {}
    for name, keep in [
        ("mean_lipschitz", lambda g, a: True),
        *[(f"mean_lipschitz_{g}", lambda g_, a, g=g: g_ == g) for g in ("neither", "one", "both")],
        *[(f"mean_lipschitz_{a}", lambda g, a_, a=a: a_ == a) for a in ("yes", "no")],
    ]:
        value = mean(keep)
        if value is not None:
            out[name] = value
    for g in ("neither", "one", "both"):
        cells = {a: mean(lambda g_, a_, g=g, a=a: g_ == g and a_ == a) for a in ("yes", "no")}
        if any(v is not None for v in cells.values()):
            table[g] = {a: v for a, v in cells.items() if v is not None}
    if table:
        out["lipschitz_by_group_and_answer"] = table
    return out


# ------------------------------------------------------------------------------ figures


def _groups(sweeps: Sequence[Sweep]) -> dict[str, list[Sweep]]:
    out: dict[str, list[Sweep]] = {}
    for group in (*GROUPS, None):
        chosen = [s for s in sweeps if s.meta.get("group") == group]
        if chosen:
            out["unknown" if group is None else group] = chosen
    return out


def _mean_share(sweeps: Sequence[Sweep]) -> tuple[np.ndarray, np.ndarray, int]:
    """The most common alpha grid, the mean yes-share on it and how many sweeps it holds."""
    from contllm.experiments.figures import _common_grid

    x, same = _common_grid(sweeps)
    return x, np.nanmean([yes_share(s) for s in same], axis=0), len(same)


def interpolation_finding(sweeps: Sequence[Sweep]) -> tuple[str, str]:
    """The sentence a word-interpolation summary opens with, and the number behind it.

    The move is how far the yes-share goes toward the second word's answer from alpha 0 to
    alpha 1, over the questions true for one word only (groups first and second), mean:
    0.3 or more reads as "crosses over", from 0.1 as "moves a little", less as "barely moves".
    """
    moves = []
    for s in sweeps:
        group = s.meta.get("group")
        if group in ("first", "second") and np.isclose(s.x, 0).any() and np.isclose(s.x, 1).any():
            share = yes_share(s)
            change = share[int(np.argmin(np.abs(s.x - 1)))] - share[int(np.argmin(np.abs(s.x)))]
            moves.append(change if group == "second" else -change)
    return mean_finding("interpolation_moves")(moves)


#: Each question group's colour and what its answers are, in plain words.
GROUP_STYLE = {
    "both": ("tab:green", "yes for both words"),
    "neither": ("tab:red", "no for both words"),
    "first": ("tab:blue", "yes for the first word only"),
    "second": ("tab:purple", "yes for the second word only"),
    "unknown": ("0.4", "answers unknown"),
}


def _ring_answers(ax: Any, group: str, color: Any) -> None:
    """The correct yes-share at both ends of a group's questions (1 for yes, 0 for no), ringed."""
    answers = ANSWERS.get(group)
    if answers is None:
        return
    for x, yes in zip((0.0, 1.0), answers):
        ax.plot([x], [1.0 if yes else 0.0], "o", ms=9, mfc="none", mec=color, mew=1.8, clip_on=False)


def summary_figure(result: ExperimentResult) -> Any:
    """Word interpolation across items. First, the finding: the mean yes-share against alpha per question group, the
    correct answers ringed at both ends; then one panel per group (every item thin, the mean thick); last, the paper's
    measures: how far the answers stray beyond their ends (variation) and how steeply they change (Lipschitz)."""
    from contllm.experiments.figures import finding_layout
    from contllm.plotting import finding, heading, legend_outside, paper_title

    groups = _groups(result.records)
    fig, first, rest = finding_layout(len(groups) + 2)
    for group, sweeps in groups.items():
        color, what = GROUP_STYLE[group]
        x, mean, n = _mean_share(sweeps)
        first.plot(x, mean, "-", color=color, lw=2.2, label=f"{what} ({n})")
        _ring_answers(first, group, color)
    first.plot([], [], "o", ms=9, mfc="none", mec="0.3", mew=1.8, label="ringed: the correct answer")
    finding(first, *interpolation_finding(result.records))
    first.set(
        xlabel="alpha: first word (0) → second word (1)", ylabel="P(yes) / (P(yes) + P(no)), mean", ylim=(-0.05, 1.05)
    )
    first.grid(alpha=0.3)
    legend_outside(first, title="questions")
    for ax, (group, sweeps) in zip(rest, groups.items()):
        color, what = GROUP_STYLE[group]
        for s in sweeps:
            ax.plot(s.x, yes_share(s), "-", color=color, lw=0.7, alpha=0.35)
        x, mean, n = _mean_share(sweeps)
        ax.plot(x, mean, "-", color="black", lw=2.4)
        _ring_answers(ax, group, "black")
        ax.set(xlabel="alpha", ylabel="P(yes) / (P(yes) + P(no))", ylim=(-0.05, 1.05))
        ax.set_title(f"{what[0].upper()}{what[1:]} ({n}; mean black)", loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    variation_histogram(rest[-2], result.records)
    lipschitz_panel(rest[-1], result.records)
    paper_title(rest[-2], "How far P(yes) or P(no) strays beyond its two ends", "variation")
    paper_title(rest[-1], "Steepest change along alpha, over the curve's range", "Lipschitz estimate")
    heading(fig, result.model, "word interpolation", len(result.records))
    return fig


def variation_histogram(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """The paper's variation figure on ``ax``: a histogram of each item's :func:`variation`, the 0.05 level marked."""
    from contllm.plotting import legend_outside

    values = np.array([variation(s) for s in sweeps])
    ax.hist(values, bins=10, range=(0.0, max(0.1, float(values.max()))), color="tab:blue", alpha=0.8)
    share = float(np.mean(values >= VARIATION_LEVEL))
    ax.axvline(VARIATION_LEVEL, color="tab:red", ls="--", lw=1, label=f"{VARIATION_LEVEL}: {share:.0%} of items beyond")
    ax.set(xlabel="largest step beyond the ends' range", ylabel="items")
    ax.grid(alpha=0.3)
    legend_outside(ax)


def lipschitz_panel(ax: Any, sweeps: Sequence[Sweep]) -> None:
    """The paper's Lipschitz estimates on ``ax``: the mean per question group (neither, one word, both) and answer."""
    from contllm.plotting import legend_outside

    table = lipschitz_breakdown(sweeps).get("lipschitz_by_group_and_answer", {})
    groups = [g for g in ("neither", "one", "both") if g in table]
    for k, (answer, color) in enumerate((("yes", "tab:green"), ("no", "tab:red"))):
        values = [table[g].get(answer, np.nan) for g in groups]
        ax.bar(np.arange(len(groups)) - 0.2 + 0.4 * k, values, 0.4, color=color, label=f"P({answer})")
    ax.set_xticks(range(len(groups)), ["one word" if g == "one" else g for g in groups])
    ax.set(xlabel="questions true for", ylabel="largest |dP/dalpha| / range, mean")
    ax.grid(alpha=0.3, axis="y")
    legend_outside(ax)


def comparison_figure(runs: Sequence[tuple[str, ExperimentResult, dict[str, Any]]]) -> Any:
    """Runs side by side: the mean yes-share per group against alpha, and the accuracy at both ends."""
    from contllm.plotting import label_bars, plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    styles = {"both": "-", "neither": ":", "first": "--", "second": "-.", "unknown": (0, (1, 3))}
    for k, (label, result, _) in enumerate(runs):
        for group, sweeps in _groups(result.records).items():
            x, mean, n = _mean_share(sweeps)
            curves.plot(x, mean, linestyle=styles[group], color=colors(k % 10), lw=1.8, label=f"{label}: {group} ({n})")
    curves.set(
        xlabel="alpha (first word -> second)",
        ylabel="mean P(yes) / (P(yes) + P(no))",
        ylim=(-0.02, 1.02),
        title="mean yes-share per question group",
    )
    curves.grid(alpha=0.3)
    curves.legend(fontsize=6, ncol=2)
    width = 0.8 / len(runs)
    positions = np.arange(3)
    keys = ("accuracy_at_alpha_0", "accuracy_at_alpha_1", "crossover_share")
    for k, (label, _, summary) in enumerate(runs):
        values = [summary.get(key) for key in keys]
        offset = positions - 0.4 + width * (k + 0.5)
        bars.bar(offset, [np.nan if v is None else v for v in values], width, color=colors(k % 10), label=label)
        label_bars(bars, [np.nan if v is None else v for v in values], positions=offset)
    bars.set_xticks(positions, ["accuracy at alpha 0", "accuracy at alpha 1", "first/second questions\ncrossing over"])
    bars.set(ylim=(0, 1.3), yticks=np.linspace(0, 1, 6), title="accuracy at the ends and crossover share")
    bars.legend(fontsize=7, loc="upper center", ncol=min(len(runs), 3))
    bars.grid(alpha=0.3, axis="y")
    for ax in (curves, bars):
        ax.title.set_fontsize(9)
    fig.suptitle("interpolation: " + " vs ".join(dict.fromkeys(label for label, _, _ in runs)), fontsize=12)
    return fig
