"""Matplotlib figures of experiment results (headless: the Agg backend is used when no display exists)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

if not os.environ.get("DISPLAY") and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from contllm.experiments.base import ExperimentResult, Sweep  # noqa: E402

COUNT_EXPERIMENTS = ("counting", "events")


def _x_name(result: ExperimentResult) -> str:
    return "duration factor c" if result.x_label == "factor" else "interpolation alpha"


def _item_title(result: ExperimentResult, sweep: Sweep) -> str:
    meta = sweep.meta
    if result.experiment == "counting":
        what = f'"{meta.get("word")}" x {meta.get("n")}'
    elif result.experiment == "events":
        which = "all events" if not meta.get("event") else f"event {meta.get('event')}"
        what = f"{meta.get('kind')}, {meta.get('n')} events, {which} scaled"
    else:
        what = f"{meta.get('first')} -> {meta.get('second')} on ({meta.get('a')}, {meta.get('b')}), {meta.get('method')}"
    return f"{result.model} · {result.experiment} · {sweep.item_id}\n{what}"


def item_figure(result: ExperimentResult, sweep: Sweep) -> Any:
    """One item: the probability of each label against the knob, with the argmax and E[k] marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(sweep.labels):
        width = 2.6 if label == sweep.truth else 1.4
        ax.plot(sweep.x, sweep.probs[:, j], "-", lw=width, color=colors(j % 10), label=f"{label}")
    ax.set_xlabel(_x_name(result))
    ax.set_ylabel("probability")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if result.experiment in COUNT_EXPERIMENTS:
        implied = sweep.implied_value()
        twin = ax.twinx()
        twin.plot(sweep.x, implied, "k--", lw=2, label="implied count E[k]")
        argmax = [float(v) for v in sweep.argmax_labels()]
        twin.plot(sweep.x, argmax, "ks", ms=4, alpha=0.6, label="argmax count")
        twin.set_ylabel("count")
        twin.set_ylim(-0.3, 9.3)
        handles, labels = ax.get_legend_handles_labels()
        h2, l2 = twin.get_legend_handles_labels()
        ax.legend(handles + h2, labels + l2, fontsize=7, ncol=2, loc="upper left", title="label (true count bold)")
    else:
        ax.legend(fontsize=8, loc="best", title="label")
    ax.set_title(_item_title(result, sweep), fontsize=9)
    return fig


def summary_figure(result: ExperimentResult) -> Any:
    """Across items: for counting and events, mean E[k] and mean probability of the true count
    against the factor, one line per true count; for boolean, P(1) against alpha per operator pair."""
    if result.experiment in COUNT_EXPERIMENTS:
        return _count_summary(result)
    return _boolean_summary(result)


def _count_summary(result: ExperimentResult) -> Any:
    by_n: dict[int, list[Sweep]] = defaultdict(list)
    for s in result.sweeps:
        by_n[int(s.truth or 0)].append(s)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
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


def _boolean_summary(result: ExperimentResult) -> Any:
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


def save_figure(fig: Any, stem: str | Path) -> list[Path]:
    """Save ``fig`` as stem.png and stem.pdf (written to temporary names, then renamed); closes it."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, dpi in ((".png", 120), (".pdf", None)):
        final = stem.with_suffix(ext)
        tmp = final.with_name(f".{final.name}.tmp{ext}")
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, final)
        paths.append(final)
    plt.close(fig)
    return paths


def save_all(result: ExperimentResult, directory: str | Path, *, per_item: bool = True) -> list[Path]:
    """The summary figure and (optionally) one figure per item, under ``directory``."""
    directory = Path(directory)
    paths = save_figure(summary_figure(result), directory / "summary")
    if per_item:
        for s in result.sweeps:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in s.item_id)
            paths += save_figure(item_figure(result, s), directory / "items" / safe)
    return paths
