"""contllm: probe the implicit continuity of pretrained language models.

Start from :func:`load` (an embedded alias, a Hugging Face id or a local directory), or
:func:`wrap` a transformers model and tokenizer you already hold; build :class:`Signal`
objects from text; edit durations by character spans; evaluate with :class:`ContinuousLM`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contllm import moved
from contllm.exports import lazy_exports

if TYPE_CHECKING:  # the names as type checkers see them; at run time each loads on first use
    from contllm.audits.run import audit
    from contllm.core.families import FAMILIES, Family, family_of
    from contllm.core.signal import Signal, SignalBatch, pad_signals
    from contllm.errors import (
        ContllmError,
        ExperimentError,
        ModelLoadError,
        RunDirectoryError,
        SignalError,
        UnsupportedModelError,
    )
    from contllm.lm import ContinuousLM, Generation, wrap
    from contllm.loading import load
    from contllm.models import DEFAULT_MODEL
    from contllm.rundir.explorer import explore
    from contllm.rundir.report import Run, load_run

__version__ = "0.1.0"

moved.install()  # old import paths (contllm.core.engine, contllm.audits, ...) still work

# Importing contllm loads neither torch nor transformers (so `contllm --help` answers at
# once); a name's module is imported when the name is first used.
__getattr__, _lazy = lazy_exports(
    __name__,
    {
        "contllm.audits.run": ("audit",),
        "contllm.errors": (
            "ContllmError",
            "ExperimentError",
            "ModelLoadError",
            "RunDirectoryError",
            "SignalError",
            "UnsupportedModelError",
        ),
        "contllm.rundir.explorer": ("explore",),
        "contllm.core.families": ("FAMILIES", "Family", "family_of"),
        "contllm.lm": ("ContinuousLM", "Generation", "wrap"),
        "contllm.loading": ("load",),
        "contllm.models": ("DEFAULT_MODEL",),
        "contllm.rundir.report": ("Run", "load_run"),
        "contllm.core.signal": ("Signal", "SignalBatch", "pad_signals"),
    },
)
__all__ = _lazy
