"""Matplotlib set-up and saving figures (headless: the Agg backend when no display exists).

The figures themselves live beside their experiments (``contllm.experiments.figures``,
``contllm.depth.figures``, ``contllm.pde.figures``) and take result data; this module
only saves what they return.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

from contllm.files import file_mode, note_written

if not os.environ.get("DISPLAY") and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")

import matplotlib.pyplot as plt

__all__ = ["plt", "save_figure"]


def save_figure(fig: Any, stem: str | Path, *, close: bool = True) -> list[Path]:
    """Save ``fig`` as stem.png and stem.pdf, each through a unique temporary name and a rename.

    Two processes saving the same figure never share a temporary file. Closes the figure
    (also when saving fails) unless ``close`` is false. Returns the two paths.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for ext, dpi in ((".png", 120), (".pdf", None)):
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
