"""Matplotlib set-up and saving figures (headless: the Agg backend when no display exists).

The figures themselves live beside their experiments (``contllm.experiments.figures``,
``contllm.depth.figures``, ``contllm.pde.figures``) and take result data; this module
only saves what they return.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from contllm.files import file_mode, note_written

if not os.environ.get("DISPLAY") and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")

import matplotlib.pyplot as plt

__all__ = ["plt", "save_figure"]


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
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{ext}", dir=final.parent)
            os.close(fd)
            try:
                os.chmod(tmp, file_mode())  # the mode of any new file, not the temporary file's 0600
                fig.savefig(tmp, dpi=dpi, format=ext[1:])
                os.replace(tmp, final)
                note_written(final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            paths.append(final)
    finally:
        if close:
            plt.close(fig)
    return paths
