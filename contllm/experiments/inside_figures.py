"""Figures of the experiments inside the model (patching, lens, attention-mass): data in, figures out, none saved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contllm.plotting import plt


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
        1, 2 if heads else 1, figsize=(11 if heads else 6, 4.6), squeeze=False, constrained_layout=True
    )
    image = _shares(axes[0, 0], resid, xlabels, "token" if one else "position from the read position")
    axes[0, 0].set_title("residual stream (blocks.i.hook_resid_post)", fontsize=9)
    if heads:
        mean = np.nanmean(heads, axis=0)
        _shares(axes[0, 1], mean, [str(h) for h in range(mean.shape[1])], "head")
        axes[0, 1].set_title("attention head outputs, all patched positions", fontsize=9)
    fig.colorbar(image, ax=axes[0, -1], label="share of the change in E[k] restored")
    first = records[0]
    what = (
        f"{first.item_id}, E[k] {first.scaled:.2f} -> {first.plain:.2f}"
        if one
        else (
            f"{len(records)} items, mean E[k] {np.mean([r.scaled for r in records]):.2f} -> "
            f"{np.mean([r.plain for r in records]):.2f}"
        )
    )
    fig.suptitle(f"{result.model} · patching c = {first.factor:g} with c = 1 · {what}", fontsize=10)
    return fig


def lens_figure(result: Any, records: Sequence[Any] | None = None) -> Any:
    """E[k] read through the final norm and unembedding at every layer (rows) along the duration sweep (columns)."""
    records = list(result.items if records is None else records)
    grid = [
        r for r in records if len(r.factors) == len(records[0].factors) and np.allclose(r.factors, records[0].factors)
    ]
    counts = np.nanmean([r.counts for r in grid], axis=0)
    factors = grid[0].factors
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    image = left.imshow(counts, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=9, interpolation="nearest")
    left.set_xticks(range(len(factors)))
    left.set_xticklabels([f"{c:g}" for c in factors], fontsize=8)
    left.set_xlabel("duration factor c")
    left.set_ylabel("layer (last row: the model's output)")
    if len(grid) == 1:
        top = grid[0].top
        for i in range(top.shape[0]):
            for j in range(top.shape[1]):
                left.text(j, i, str(int(top[i, j])), ha="center", va="center", fontsize=6, color="white")
    fig.colorbar(image, ax=left, label="implied count E[k]")
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
    right.set_ylabel("implied count E[k]")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    title = grid[0].item_id if len(grid) == 1 else f"{len(grid)} items"
    fig.suptitle(f"{result.model} · logit lens of the count · {title}", fontsize=10)
    return fig


def attention_mass_figure(result: Any, records: Sequence[Any] | None = None) -> Any:
    """Per layer and head: slope of the log-odds of the mass on the scaled tokens against log(c); mass curves."""
    records = list(result.items if records is None else records)
    slopes = np.nanmean([r.slopes for r in records], axis=0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    image = left.imshow(slopes, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-1, vmax=3, interpolation="nearest")
    left.set_xlabel("head")
    left.set_ylabel("layer")
    left.set_title("slope of logit(mass) against log c (1: follows the bias, 0: compensates)", fontsize=9)
    fig.colorbar(image, ax=left, label="slope")
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
        right.plot(c, c * odds / (1 + c * odds), "k:", lw=1.5, label="mean head, bias only")
    right.set_xscale("log")
    right.set_xlabel("duration factor c (log scale)")
    right.set_ylabel("attention mass on the scaled tokens (read position)")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    title = first.item_id if len(records) == 1 else f"{len(records)} items"
    fig.suptitle(f"{result.model} · attention mass on the scaled tokens · {title}", fontsize=10)
    return fig
