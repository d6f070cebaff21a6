"""Figures of the experiments inside the model (patching, lens, attention-mass): data in, figures out, none saved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contllm.plotting import finding, heading, legend_outside, plt


def _from_end(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """[layers, positions] arrays of different widths, aligned at their last column and averaged (NaN-aware)."""
    width = max(a.shape[1] for a in arrays)
    stacked = np.full((len(arrays), arrays[0].shape[0], width), np.nan)
    for k, a in enumerate(arrays):
        stacked[k, :, width - a.shape[1] :] = a
    with np.errstate(all="ignore"):
        return np.nanmean(stacked, axis=0)


def _shares(ax: Any, values: np.ndarray, xlabels: Sequence[str], xname: str) -> Any:
    image = ax.imshow(values, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(xlabels)))
    ax.set_xticklabels(xlabels, rotation=60, fontsize=7, ha="right")
    ax.set_xlabel(xname)
    ax.set_ylabel("layer")
    return image


def patching_finding(records: Sequence[Any]) -> tuple[str, str]:
    """The sentence a patching figure opens with: the first layer whose residual stream at the read position, patched
    from the plain run, restores half of the change in E[k] (mean over items), and the change itself."""
    change = float(np.mean([r.plain - r.scaled for r in records]))
    last = np.nanmean([r.resid[:, -1] for r in records], axis=0)
    reached = np.flatnonzero(last >= 0.5)
    detail = (
        f"predicted count {np.mean([r.scaled for r in records]):.2f} at c = {records[0].factor:g}, "
        f"{np.mean([r.plain for r in records]):.2f} at c = 1: a change of {change:+.2f} (mean over {len(records)} items)"
    )
    if abs(change) < 0.1:
        return "Shortening the word barely changes the count here, so there is little to locate", detail
    if len(reached):
        return f"From layer {int(reached[0])} on, the read position carries the change in the count", detail
    return "No single residual patch at the read position restores half of the change in the count", detail


def patching_figure(result: Any, records: Sequence[Any] | None = None) -> Any:
    """Restored share of the change in E[k]: residual stream (layer x position) and heads (layer x head)."""
    records = list(result.items if records is None else records)
    one = len(records) == 1
    resid = _from_end([r.resid for r in records])
    width = resid.shape[1]
    if one:
        xlabels = [repr(t) for t in records[0].tokens]
    else:
        xlabels = [f"{k - width + 1}" if k < width - 1 else "read" for k in range(width)]
    heads = [r.heads for r in records if r.heads.size]
    fig, axes = plt.subplots(
        1, 2 if heads else 1, figsize=(13 if heads else 7.5, 5), squeeze=False, constrained_layout=True
    )
    image = _shares(axes[0, 0], resid, xlabels, "token" if one else "position, counted back from the read position")
    finding(axes[0, 0], *patching_finding(records))
    if heads:
        mean = np.nanmean(heads, axis=0)
        _shares(axes[0, 1], mean, [str(h) for h in range(mean.shape[1])], "head")
        axes[0, 1].set_title(
            "Each attention head's output patched alone\n(all patched positions)", loc="left", fontsize=9
        )
    fig.colorbar(
        image, ax=axes[0, -1], label="share of the change in the count restored\nby patching from the plain run"
    )
    first = records[0]
    heading(fig, result.model, f"patching c = {first.factor:g} with c = 1", len(records))
    return fig


def lens_finding(counts: np.ndarray, factors: Sequence[float]) -> tuple[str, str]:
    """The sentence a lens figure opens with: the first layer whose E[k] spans, over the factors, half of what the
    output's spans; an output spanning under 0.2 of a count reads as the count hardly moving."""
    spans = np.nanmax(counts, axis=1) - np.nanmin(counts, axis=1)
    output = float(spans[-1])
    detail = f"the output's predicted count spans {output:.2f} over c = {min(factors):g}..{max(factors):g}"
    if not np.isfinite(output) or output < 0.2:
        return "The model's count hardly moves with c at its output", detail
    reached = np.flatnonzero(spans >= 0.5 * output)
    layer = int(reached[0]) if len(reached) else len(spans) - 1
    return f"The count starts to follow c at layer {layer} of {len(spans) - 1}", detail


def lens_figure(result: Any, records: Sequence[Any] | None = None) -> Any:
    """E[k] read through the final norm and unembedding at every layer (rows) along the duration sweep (columns)."""
    records = list(result.items if records is None else records)
    grid = [
        r for r in records if len(r.factors) == len(records[0].factors) and np.allclose(r.factors, records[0].factors)
    ]
    counts = np.nanmean([r.counts for r in grid], axis=0)
    factors = grid[0].factors
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    image = left.imshow(counts, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=9, interpolation="nearest")
    left.set_xticks(range(len(factors)))
    left.set_xticklabels([f"{c:g}" for c in factors], fontsize=8)
    left.set_xlabel("duration factor c")
    left.set_ylabel("layer (last row: the model's output)")
    finding(left, *lens_finding(counts, factors))
    if len(grid) == 1:
        top = grid[0].top
        for i in range(top.shape[0]):
            for j in range(top.shape[1]):
                left.text(j, i, str(int(top[i, j])), ha="center", va="center", fontsize=6, color="white")
    fig.colorbar(image, ax=left, label="predicted count E[k] read at that layer")
    cmap = plt.get_cmap("magma")
    layers = counts.shape[0]
    for i in sorted({0, layers // 4, layers // 2, 3 * layers // 4, layers - 2, layers - 1}):
        right.plot(
            factors,
            counts[i],
            "-o",
            ms=3,
            color=cmap(i / max(1, layers)),
            label=f"layer {i}" if i < layers - 1 else "output",
        )
    right.set_xlabel("duration factor c")
    right.set_ylabel("predicted count E[k]")
    right.set_title("Some layers' rows as curves", loc="left", fontsize=9)
    right.grid(alpha=0.3)
    legend_outside(right)
    heading(fig, result.model, "logit lens of the count", len(grid))
    return fig


def attention_mass_finding(slopes: np.ndarray, follows: float, compensates: float) -> tuple[str, str]:
    """The sentence an attention-mass figure opens with: whether most heads follow the log-duration bias (slope within
    ``follows`` of 1) or make up for it (slope below ``compensates``), or neither."""
    flat = slopes[np.isfinite(slopes)]
    following = float(np.mean(np.abs(flat - 1) <= follows)) if flat.size else float("nan")
    compensating = float(np.mean(flat < compensates)) if flat.size else float("nan")
    detail = (
        f"median slope {np.median(flat) if flat.size else float('nan'):.2f}; {following:.0%} of heads within "
        f"{follows} of 1 (follow), {compensating:.0%} below {compensates} (compensate)"
    )
    if following >= 0.5:
        return "Most heads pay the shortened words attention in proportion to their duration", detail
    if compensating >= 0.5:
        return "Most heads make up for the shortened duration and attend to the words anyway", detail
    return "Heads differ: some follow the words' duration, others make up for it", detail


def attention_mass_figure(result: Any, records: Sequence[Any] | None, *, follows: float, compensates: float) -> Any:
    """Per layer and head: slope of the log-odds of the mass on the scaled tokens against log(c); mass curves.
    follows, compensates: the slopes that count as following the duration bias (within ``follows`` of 1) and as
    making up for it (below ``compensates``), as the experiment declares them."""
    records = list(result.items if records is None else records)
    slopes = np.nanmean([r.slopes for r in records], axis=0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    image = left.imshow(slopes, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-1, vmax=3, interpolation="nearest")
    left.set_xlabel("head")
    left.set_ylabel("layer")
    finding(left, *attention_mass_finding(slopes, follows, compensates))
    fig.colorbar(
        image, ax=left, label="slope of logit(mass) against log c\n(1: follows the duration, 0: makes up for it)"
    )
    first = records[0]
    mass = np.nanmean([r.mass for r in records if r.mass.shape == first.mass.shape], axis=0)
    flat = slopes.flatten()
    order = np.argsort(flat)
    picks = list(order[:3]) + list(order[len(order) // 2 : len(order) // 2 + 1]) + list(order[-3:])
    heads = slopes.shape[1]
    colors = plt.get_cmap("coolwarm")
    for k, index in enumerate(picks):
        i, h = divmod(int(index), heads)
        right.plot(
            first.factors,
            mass[:, i, h],
            "-o",
            ms=3,
            color=colors(k / max(1, len(picks) - 1)),
            label=f"L{i}H{h} (slope {slopes[i, h]:.2f})",
        )
    c = np.asarray(first.factors)
    base = mass[np.argmin(np.abs(c - 1.0))].mean() if np.isclose(c, 1.0).any() else None
    if base is not None:
        odds = base / max(1e-12, 1 - base)
        right.plot(c, c * odds / (1 + c * odds), "k:", lw=1.5, label="mean head, duration bias only")
    right.set_xscale("log")
    right.set_xlabel("duration factor c (log scale)")
    right.set_ylabel("attention mass on the scaled tokens\n(read position)")
    right.set_title("The three lowest, the median and the three highest slopes", loc="left", fontsize=9)
    right.grid(alpha=0.3)
    legend_outside(right, title="layer, head")
    heading(fig, result.model, "attention mass on the scaled tokens", len(records))
    return fig
