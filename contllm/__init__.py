"""contllm: probe the implicit continuity of pretrained language models.

Start from :func:`load` (an embedded alias, a Hugging Face id or a local directory), or
:func:`wrap` a transformers model and tokenizer you already hold; build :class:`Signal`
objects from text; edit durations by character spans; evaluate with :class:`ContinuousLM`.
"""

from __future__ import annotations

import inspect
from typing import Any

from contllm.errors import (
    ContllmError,
    ExperimentError,
    ModelLoadError,
    RunDirectoryError,
    SignalError,
    UnsupportedModelError,
)
from contllm.families import FAMILIES, Family, family_of
from contllm.lm import ContinuousLM, Generation, wrap
from contllm.models import DEFAULT_MODEL, load_model
from contllm.signal import Signal, SignalBatch, pad_signals

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "FAMILIES",
    "ContinuousLM",
    "ContllmError",
    "ExperimentError",
    "Family",
    "Generation",
    "ModelLoadError",
    "RunDirectoryError",
    "Signal",
    "SignalBatch",
    "SignalError",
    "UnsupportedModelError",
    "family_of",
    "load",
    "pad_signals",
    "wrap",
]


def load(name: str = DEFAULT_MODEL, **options: Any) -> ContinuousLM:
    """Load a model (embedded alias, Hugging Face id or local directory) ready for continuous inputs.

    Options are those of :func:`contllm.models.load_model` (device, dtype,
    attn_implementation, device_map, max_memory, cache_dir, trust_remote_code); a bad
    name or option raises ModelLoadError (UnsupportedModelError for an attention
    implementation contllm cannot use) naming it, before any weights are read.
    """
    known = [k for k, p in inspect.signature(load_model).parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ModelLoadError(f"load() got unknown option(s) {', '.join(unknown)}; options: {', '.join(known)}")
    loaded = load_model(name, **options)
    return ContinuousLM(loaded.model, loaded.tokenizer, loaded.info)
