"""Matplotlib set-up, the house style of a summary figure, and saving figures (headless: Agg when no display exists).

The figures themselves live beside their experiments (``contllm.experiments.figures``,
``contllm.depth.figures``, ``contllm.pde.figures``) and take result data; this module
gives them one way to read and saves what they return.

Every experiment's summary figure reads the same way, for someone who has not read the
paper: the first panel states the finding as a sentence (:func:`finding`), every legend
sits outside the data (:func:`legend_outside`, or a figure legend), each panel has one
y-axis, and the paper's own measures come last, named in plain words with the paper's
name after them (:func:`paper_title`). The figure's heading says which model, experiment
and how many items (:func:`heading`).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from contllm.rundir.files import file_mode, note_written, write_error

if not os.environ.get("DISPLAY") and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")

import matplotlib.pyplot as plt

__all__ = [
    "finding",
    "heading",
    "label_bars",
    "legend_outside",
    "paper_title",
    "plt",
    "save_figure",
    "shortened",
    "worded",
]


def finding(ax: Any, sentence: str, detail: str = "") -> None:
    """Title the first panel of a summary figure with what it shows, as a sentence (``detail``: the numbers behind it,
    a smaller line under it)."""
    ax.set_title(sentence, loc="left", fontsize=11, fontweight="bold", pad=20 if detail else 6)
    if detail:
        ax.annotate(
            detail,
            xy=(0, 1),
            xycoords="axes fraction",
            xytext=(0, 5),
            textcoords="offset points",
            fontsize=8.5,
            color="0.25",
            va="bottom",
            ha="left",
        )


def worded(value: float, ladder: Sequence[tuple[float, str]], below: str, unknown: str) -> str:
    """The sentence of the first step of ``ladder`` ((threshold, sentence), highest threshold first) that ``value``
    reaches; ``below`` under every step, ``unknown`` for a value that is not a finite number
    (:class:`contllm.wording.Ladder`, which the findings declare, called once)."""
    from contllm.wording import Ladder

    return Ladder(tuple(ladder), below, unknown)(value)


def label_bars(ax: Any, values: Any, text: str = "{:.2f}", positions: Any = None) -> None:
    """Each bar's value written over it (``text`` formats it; "n/a" for a missing one). values, positions: sequences
    of numbers [bars] (positions None: 0, 1, ...)."""
    for x, v in zip(range(len(values)) if positions is None else positions, values):
        known = v is not None and math.isfinite(v)
        ax.annotate(text.format(v) if known else "n/a", (x, v if known else 0), ha="center", va="bottom", fontsize=8)


def paper_title(ax: Any, plain: str, paper_name: str) -> None:
    """Title a panel of the paper's measures: the plain words first, the paper's name after them."""
    ax.set_title(f"{plain}\n(the paper's {paper_name})", loc="left", fontsize=9)


def heading(fig: Any, model: str, experiment: str, count: int, unit: str = "items") -> None:
    """The figure's heading: model, experiment and how many items (or prompts, pairs, ...) it holds."""
    what = unit[:-1] if count == 1 and unit.endswith("s") else unit
    fig.suptitle(f"{model} · {experiment} · {count} {what}", fontsize=9, color="0.35", x=0.01, ha="left")


def shortened(text: object, limit: int = 32) -> str:
    """``str(text)`` cut to ``limit`` characters with an ellipsis: a word or id from a data file in a title or legend
    (a long one would squeeze the panels to nothing)."""
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 1] + "…"


def legend_outside(ax: Any, *, title: str | None = None, **options: Any) -> Any:
    """The legend of ``ax`` to the right of its axes, clear of the data (None when nothing is labelled)."""
    if not ax.get_legend_handles_labels()[0] and "handles" not in options:
        return None
    options = {"fontsize": 7.5, "title_fontsize": 7.5, "frameon": False, **options}
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, title=title, **options)


#: Resolution of each raster format (None: a vector format's own).
DPI = {"png": 120, "pdf": None}


def save_figure(
    fig: Any, stem: str | Path, *, close: bool = True, formats: Sequence[str] = ("png", "pdf")
) -> list[Path]:
    """Save ``fig`` as stem.<format> for each of ``formats`` (keys of :data:`DPI`), each through a unique temporary name and a rename.

    Two processes saving the same figure never share a temporary file. Closes the figure
    (also when saving fails) unless ``close`` is false. Returns the paths, in the order of ``formats``.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for fmt in formats:
            ext, dpi = f".{fmt}", DPI[fmt]
            final = stem.with_name(stem.name + ext)
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{ext}", dir=final.parent)
            except OSError as exc:
                raise write_error(final, exc) from None
            os.close(fd)
            try:
                os.chmod(tmp, file_mode())  # the mode of any new file, not the temporary file's 0600
                fig.savefig(tmp, dpi=dpi, format=ext[1:])
                os.replace(tmp, final)
                note_written(final)
            except BaseException as exc:
                Path(tmp).unlink(missing_ok=True)
                if isinstance(exc, OSError):
                    raise write_error(final, exc) from None
                raise
            paths.append(final)
    finally:
        if close:
            plt.close(fig)
    return paths
