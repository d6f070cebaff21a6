"""``contllm.load``: a model by name, wrapped for continuous inputs (kept apart so that importing contllm stays light)."""

from __future__ import annotations

import inspect
from typing import Any

from contllm.errors import ModelLoadError
from contllm.lm import ContinuousLM
from contllm.models import DEFAULT_MODEL, load_model


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
