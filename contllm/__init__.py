"""contllm: probe the implicit continuity of pretrained language models.

Start from :func:`load` (an embedded alias, a Hugging Face id or a local directory), or
:func:`wrap` a transformers model and tokenizer you already hold; build :class:`Signal`
objects from text; edit durations by character spans; evaluate with :class:`ContinuousLM`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contllm.exports import lazy_exports

if TYPE_CHECKING:  # the names as type checkers see them; at run time each loads on first use
    from contllm.cards.auditing import audit
    from contllm.errors import (
        ContllmError,
        ExperimentError,
        ModelLoadError,
        RunDirectoryError,
        SignalError,
        UnsupportedModelError,
    )
    from contllm.explorer import explore
    from contllm.families import FAMILIES, Family, family_of
    from contllm.lm import ContinuousLM, Generation, wrap
    from contllm.loading import load
    from contllm.models import DEFAULT_MODEL
    from contllm.report import Run, load_run
    from contllm.signal import Signal, SignalBatch, pad_signals

__version__ = "0.1.0"

# Importing contllm loads neither torch nor transformers (so `contllm --help` answers at
# once); a name's module is imported when the name is first used.
__getattr__, _lazy = lazy_exports(
    __name__,
    {
        "contllm.cards.auditing": ("audit",),
        "contllm.errors": (
            "ContllmError",
            "ExperimentError",
            "ModelLoadError",
            "RunDirectoryError",
            "SignalError",
            "UnsupportedModelError",
        ),
        "contllm.explorer": ("explore",),
        "contllm.families": ("FAMILIES", "Family", "family_of"),
        "contllm.lm": ("ContinuousLM", "Generation", "wrap"),
        "contllm.loading": ("load",),
        "contllm.models": ("DEFAULT_MODEL",),
        "contllm.report": ("Run", "load_run"),
        "contllm.signal": ("Signal", "SignalBatch", "pad_signals"),
    },
)
__all__ = _lazy
