"""``contllm.load``: a model by name, wrapped for continuous inputs (kept apart so that importing contllm stays light)."""

from __future__ import annotations

import inspect
import time
from dataclasses import replace
from typing import Any

from contllm.errors import ModelLoadError
from contllm.lm import ContinuousLM
from contllm.models import DEFAULT_MODEL, load_model
from contllm.models.autodtype import choose, is_auto


def load(name: str = DEFAULT_MODEL, **options: Any) -> ContinuousLM:
    """Load a model (embedded alias, Hugging Face id or local directory) ready for continuous inputs.

    Options are those of :func:`contllm.models.load_model` (device, dtype,
    attn_implementation, device_map, max_memory, cache_dir, trust_remote_code); a bad
    name or option raises ModelLoadError (UnsupportedModelError for an attention
    implementation contllm cannot use) naming it, before any weights are read.

    dtype="auto" loads the model in float32 and in bfloat16, times both on a few short
    calibration prompts and keeps bfloat16 only where it is at least 10% faster here with
    next-token probabilities within 1e-2 of float32's, else float32 (the same model as
    dtype="float32"); ``lm.info.dtype_choice`` says what was measured and why
    (:mod:`contllm.models.autodtype`), and one line goes to the ``contllm`` logger. It
    takes one device (not device_map).
    """
    known = [k for k, p in inspect.signature(load_model).parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ModelLoadError(f"load() got unknown option(s) {', '.join(unknown)}; options: {', '.join(known)}")
    if is_auto(options.get("dtype")):
        return _load_auto(name, options)
    loaded = load_model(name, **options)
    return ContinuousLM(loaded.model, loaded.tokenizer, loaded.info)


def _load_auto(name: str, options: dict[str, Any]) -> ContinuousLM:
    """dtype="auto": the float32 and bfloat16 loads of ``name``, timed side by side; the one :func:`choose` picks."""
    import torch

    from contllm.logs import note

    if options.get("device_map") is not None:
        raise ModelLoadError(
            "dtype 'auto' times the model on one device; with device_map give the dtype (float32 or bfloat16)"
        )
    loaded = load_model(name, **{**options, "dtype": torch.float32})
    float32_lm = ContinuousLM(loaded.model, loaded.tokenizer, loaded.info)
    started = time.perf_counter()
    cuda = [float32_lm.device.index or 0] if float32_lm.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # the calibration leaves the random state as the float32 load did
        loaded = load_model(name, **{**options, "dtype": torch.bfloat16})
        bfloat16_lm = ContinuousLM(loaded.model, loaded.tokenizer, loaded.info)
        choice = choose(float32_lm, bfloat16_lm)
    choice = replace(choice, seconds=round(time.perf_counter() - started, 3))
    lm = bfloat16_lm if choice.dtype == "bfloat16" else float32_lm
    lm.info = replace(lm.info, dtype_choice=choice)
    note(f"dtype auto -> {choice.reason} (calibrated in {choice.seconds:.1f} s)")
    return lm
