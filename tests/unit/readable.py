"""What every summary figure must give a reader, checked on a drawn figure (tests of each experiment's figures use it).

The first panel states its finding as a sentence (its left title); no legend covers any
panel's data area; no two level tick labels of an axis overlap; no panel title runs into another or
off the figure, nor any text written on a panel off it; each panel has one
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
    for ax in axes:  # a note written on a panel (the line under a title, a label) stays on the figure
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert not text.get_text() or (box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1), (
                f"a text runs off the figure: {text.get_text()!r}"
            )
    sentence = axes[0].get_title(loc="left")
    assert sentence and sentence[0].isupper() and len(sentence.split()) >= 5, (
        f"no finding on the first panel: {sentence!r}"
    )
    return sentence


def paper_panels(fig: Any) -> list[int]:
    """The positions among the panels of those titled as the paper's measures."""
    return [k for k, ax in enumerate(data_axes(fig)) if "(the paper's" in ax.get_title(loc="left")]


def check_labels_clear(ax: Any) -> int:
    """Assert that the labels written at data points of ``ax`` (its annotations placed in data coordinates) stay
    inside the panel and clear of each other, of every marker and of every error bar; returns how many there are."""
    from matplotlib.collections import LineCollection
    from matplotlib.text import Text

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72
    area = ax.get_window_extent(renderer)
    labels = [t for t in ax.texts if getattr(t, "xycoords", None) == "data" and t.get_text()]
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the words only (an annotation's adds its line)
    marks = []  # (x0, y0, x1, y1) of every marker and error-bar segment, in display units
    for line in ax.lines:
        if line.get_marker() in (None, "", "None", "none"):
            continue
        half = line.get_markersize() * scale / 2
        for x, y in ax.transData.transform(np.column_stack([np.asarray(d, dtype=float) for d in line.get_data()])):
            marks.append((x - half, y - half, x + half, y + half))
    for collection in ax.collections:
        if isinstance(collection, LineCollection):
            width = max(collection.get_linewidths()) * scale / 2
            for segment in collection.get_segments():
                (x0, y0), (x1, y1) = ax.transData.transform(np.asarray(segment, dtype=float))
                marks.append((min(x0, x1) - width, min(y0, y1), max(x0, x1) + width, max(y0, y1)))
    for k, (label, box) in enumerate(zip(labels, boxes)):
        name = label.get_text()
        assert area.x0 <= box.x0 and box.x1 <= area.x1 and area.y0 <= box.y0 and box.y1 <= area.y1, (
            f"the label {name!r} runs out of its panel"
        )
        for other, text in zip(boxes[k + 1 :], labels[k + 1 :]):
            assert not box.overlaps(other), f"the labels {name!r} and {text.get_text()!r} overlap"
        for x0, y0, x1, y1 in marks:
            assert box.x1 <= x0 or x1 <= box.x0 or box.y1 <= y0 or y1 <= box.y0, (
                f"the label {name!r} covers a marker or an error bar"
            )
    return len(labels)
