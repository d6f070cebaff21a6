"""What every summary figure must give a reader, checked on a drawn figure (tests of each experiment's figures use it).

The first panel states its finding as a sentence (its left title); no legend covers any
panel's data area; no two level tick labels of an axis overlap; no panel title runs into another or
off the figure; each panel has one
y-axis (no twin axes sharing a panel's place); the paper's measures, where a figure has
them, are its last panels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def data_axes(fig: Any) -> list[Any]:
    """The figure's panels, in the order they were made (colour bars left out)."""
    return [ax for ax in fig.get_axes() if not hasattr(ax, "_colorbar") and ax.get_label() != "<colorbar>"]


def legends(fig: Any) -> Iterator[Any]:
    """Every legend of the figure: its panels', its own and its subfigures'."""
    for ax in fig.get_axes():
        if ax.get_legend() is not None:
            yield ax.get_legend()
    stack = [fig]
    while stack:
        current = stack.pop()
        yield from current.legends
        stack += list(getattr(current, "subfigs", []))


def check_readable(fig: Any) -> str:
    """Assert the house style on ``fig`` (see the module's docstring); returns the first panel's sentence."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = data_axes(fig)
    assert axes, "the figure has no panel"
    places = [tuple(np.round(ax.get_position().bounds, 4)) for ax in axes]
    assert len(set(places)) == len(places), "two y-axes share a panel (a twin axis)"
    for legend in legends(fig):
        box = legend.get_window_extent(renderer).shrunk(0.98, 0.98)
        for ax in axes:
            area = ax.get_window_extent(renderer)
            assert not box.overlaps(area), f"a legend ({legend.get_title().get_text()!r}) covers a panel's data area"
    for ax in axes:  # the tick labels of an axis each keep to their own place (rotated ones are laid out to fit)
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            level = [t for t in ticks if t.get_visible() and t.get_text() and t.get_rotation() % 180 == 0]
            boxes = [t.get_window_extent(renderer) for t in level]
            for k, box in enumerate(boxes):
                assert not any(box.overlaps(other) for other in boxes[k + 1 :]), (
                    f"two tick labels overlap: {[t.get_text() for t in level]}"
                )
    titles = [t.get_window_extent(renderer) for ax in axes for t in (ax.title, ax._left_title) if t.get_text()]
    page = fig.bbox
    for k, box in enumerate(titles):
        assert not any(box.overlaps(other) for other in titles[k + 1 :]), "two panel titles overlap"
        assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1, "a panel title runs off the figure"
    sentence = axes[0].get_title(loc="left")
    assert sentence and sentence[0].isupper() and len(sentence.split()) >= 5, (
        f"no finding on the first panel: {sentence!r}"
    )
    return sentence


def paper_panels(fig: Any) -> list[int]:
    """The positions among the panels of those titled as the paper's measures."""
    return [k for k, ax in enumerate(data_axes(fig)) if "(the paper's" in ax.get_title(loc="left")]
