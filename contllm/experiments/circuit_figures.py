"""Figures of the circuit experiment: data in, figures out, none saved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contllm.plotting import finding, heading, legend_outside, plt


def circuit_finding(records: Sequence[Any]) -> tuple[str, str]:
    """The sentence a circuit figure opens with: how many heads bring back half of the change in E[k], and the change."""
    change = float(np.mean([r.plain - r.short for r in records]))
    halves = [r.half for r in records if r.half is not None]
    detail = (
        f"E[k] {np.mean([r.short for r in records]):.2f} at c = {records[0].factor:g}, "
        f"{np.mean([r.plain for r in records]):.2f} at c = 1; alone, every bias restored "
        f"{np.mean([r.every_bias for r in records]):.0%}, the times {np.mean([r.times for r in records]):.0%}"
    )
    if abs(change) < 0.1:
        return "Shortening the words barely changes the count here", detail
    if not halves:
        return f"No {len(records[0].top)} heads patched together bring back half of the change", detail
    if len(halves) == len(records) and len(set(halves)) == 1:
        return f"The outputs of {halves[0]} head{'s' if halves[0] != 1 else ''} bring back half of the change", detail
    return f"The outputs of {np.mean(halves):.1f} heads (mean) bring back half of the change", detail


def _heads(fig: Any, ax: Any, values: np.ndarray, label: str) -> None:
    top = float(np.abs(values).max()) or 1.0
    image = ax.imshow(
        values, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-top, vmax=top, interpolation="nearest"
    )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(image, ax=ax, label=label)


def circuit_figure(result: Any, records: Sequence[Any] | None = None) -> Any:
    """Four panels: each head's estimated share (layer x head), the estimate against exact patching of the top heads,
    the share brought back as the top heads are patched together, and each head's estimated duration-bias share."""
    records = list(result.items if records is None else records)
    fig, grid = plt.subplots(2, 2, figsize=(13, 9.5), constrained_layout=True)
    axes = grid.ravel()
    _heads(
        fig,
        axes[0],
        np.mean([r.estimate for r in records], axis=0),
        "estimated share of the change\n(the head's output from c = 1)",
    )
    finding(axes[0], *circuit_finding(records))
    estimates, exact = [], []
    for r in records:
        for label, share in zip(r.top, r.patched):
            layer, head = (int(v) for v in label[1:].split("H"))
            estimates.append(float(r.estimate[layer, head]))
            exact.append(share)
            if len(records) == 1:
                axes[1].annotate(label, (estimates[-1], share), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes[1].scatter(estimates, exact, s=14, alpha=0.7)
    low, high = min(estimates + exact + [0.0]), max(estimates + exact + [0.0])
    axes[1].plot([low, high], [low, high], color="0.5", lw=0.8, ls=":")
    axes[1].set_xlabel("estimate (one backward)")
    axes[1].set_ylabel("exact share (one forward per head)")
    axes[1].set_title("Per head: the estimate against patching it", loc="left", fontsize=9)
    for r in records:
        axes[2].plot(r.x, r.shares, marker="o", ms=3, lw=1, alpha=0.8, label=r.item_id if len(records) <= 8 else None)
    axes[2].axhline(0.5, color="0.5", lw=0.8, ls=":")
    axes[2].set_xlabel("heads patched together (largest estimate first)")
    axes[2].set_ylabel("share of the change brought back")
    axes[2].set_title("The top heads' outputs patched together", loc="left", fontsize=9)
    if len(records) <= 8:
        legend_outside(axes[2], title="item")
    _heads(
        fig,
        axes[3],
        np.mean([r.bias_estimate for r in records], axis=0),
        "estimated share of the change\n(the head's duration bias restored)",
    )
    axes[3].set_title("Each head's duration bias restored alone (estimate)", loc="left", fontsize=9)
    heading(fig, result.model, f"circuit at c = {records[0].factor:g}", len(records))
    return fig
