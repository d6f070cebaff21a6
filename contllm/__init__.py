"""contllm: probe the implicit continuity of pretrained language models.

Start from :func:`load` (an embedded alias, a Hugging Face id or a local directory), or
:func:`wrap` a transformers model and tokenizer you already hold; build :class:`Signal`
objects from text; edit durations by character spans; evaluate with :class:`ContinuousLM`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from contllm.exports import lazy_exports

if TYPE_CHECKING:  # the names as type checkers see them; at run time each loads on first use
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
    from contllm.models import DEFAULT_MODEL
    from contllm.report import Run, load_run
    from contllm.signal import Signal, SignalBatch, pad_signals

__version__ = "0.1.0"

# Importing contllm loads neither torch nor transformers (so `contllm --help` answers at
# once); a name's module is imported when the name is first used.
__getattr__, _lazy = lazy_exports(
    __name__,
    {
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
        "contllm.models": ("DEFAULT_MODEL",),
        "contllm.report": ("Run", "load_run"),
        "contllm.signal": ("Signal", "SignalBatch", "pad_signals"),
    },
)
__all__ = sorted([*_lazy, "load"])


def load(name: str | None = None, **options: Any) -> ContinuousLM:
    """Load a model (embedded alias, Hugging Face id or local directory) ready for continuous inputs.

    name: the model; None means :data:`contllm.models.DEFAULT_MODEL`. Options are those
    of :func:`contllm.models.load_model` (device, dtype, attn_implementation, device_map,
    max_memory, cache_dir, trust_remote_code); a bad name or option raises ModelLoadError
    (UnsupportedModelError for an attention implementation contllm cannot use) naming it,
    before any weights are read.
    """
    from contllm.errors import ModelLoadError
    from contllm.lm import ContinuousLM
    from contllm.models import DEFAULT_MODEL, load_model

    known = [k for k, p in inspect.signature(load_model).parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ModelLoadError(f"load() got unknown option(s) {', '.join(unknown)}; options: {', '.join(known)}")
    loaded = load_model(DEFAULT_MODEL if name is None else name, **options)
    return ContinuousLM(loaded.model, loaded.tokenizer, loaded.info)
