"""Loading a causal LM and its tokenizer: an embedded alias, a local directory or a Hugging Face id.

Nothing here touches the network for an alias or a local directory. A Hugging Face id
goes through transformers' normal resolution (the local cache when ``HF_HUB_OFFLINE=1``).
Weights are read only from safetensors (or, through the cache, GGUF), never from pickle files.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from contllm.core.families import FAMILIES, family_of
from contllm.errors import ContllmError, ModelLoadError, UnsupportedModelError
from contllm.models.autodtype import is_auto
from contllm.models.cache import cache_entry_problems, cache_root, read_record
from contllm.models.catalog import (
    DEFAULT_MODEL,
    REGISTRY,
    LoadedModel,
    ModelInfo,
    ModelListing,
    count_parameters,
    known_aliases,
    resolve,
)
from contllm.models.conversion import ensure_cached
from contllm.rundir.distributed import check_device_map
from contllm.settings import DTYPE_NAMES, FLOAT64_NAMES

# --------------------------------------------------------------------------- options

_DTYPE_NAMES: dict[str, torch.dtype] = {
    name: getattr(torch, dtype) for name, dtype in {**DTYPE_NAMES, **FLOAT64_NAMES}.items()
}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """A torch dtype from a name (float32, fp32, bfloat16, bf16, float16, fp16, float64, fp64) or a torch dtype.

    None gives float32: the continuity invariants are checked in float32, on every device.
    float64 (the Python API's only; runs take the others) gives float64 outputs, for checks
    by finite differences. ModelLoadError for anything else.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.strip().lower().removeprefix("torch.")]
    if is_auto(dtype):
        raise ModelLoadError(
            "dtype 'auto' is chosen by contllm.load (it times the loaded model in float32 and bfloat16); "
            f"load_model takes {', '.join(_DTYPE_NAMES)} or the torch dtypes"
        )
    raise ModelLoadError(f"unsupported dtype {dtype!r}; allowed: {', '.join(_DTYPE_NAMES)} or the torch dtypes")


#: Device types a model is loaded on (the meta device holds no weights; others are untested).
DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """The device to load on: "auto" (or None) is cuda when available, else cpu."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ModelLoadError(f"unknown device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available; use device='cpu' or 'auto'")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {device!r} requested but MPS is not available; use device='cpu' or 'auto'")
    if resolved.type not in DEVICE_TYPES:
        raise ModelLoadError(
            f"device {device!r} cannot hold a model for contllm; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
        )
    return resolved


def choose_attn_implementation(config: Any, requested: str | None = None) -> str | None:
    """The attention implementation to load with, from the family table's ``backends``.

    Default "sdpa" where the family takes a continuous mask with it, else the family's
    first backend (Gemma 2: "eager"). An explicit choice outside the family's backends
    raises UnsupportedModelError; a model of no supported family gets ``requested`` as
    given (None: transformers decides), and :class:`~contllm.lm.ContinuousLM` names the
    problem when it is wrapped.
    """
    try:
        family = family_of(config)
    except UnsupportedModelError:
        return requested
    if requested is None:
        return "sdpa" if "sdpa" in family.backends else family.backends[0]
    if requested not in family.backends:
        raise UnsupportedModelError(
            f"{family.name} models cannot take a continuous-time mask with attn_implementation={requested!r}; "
            f"use one of {', '.join(map(repr, family.backends))} (or leave it unset)"
        )
    return requested


#: Packages that attention implementations outside contllm's backends would need.
_ATTENTION_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def check_attn_implementation(requested: Any) -> None:
    """Refuse, before anything is read, an ``attn_implementation`` no supported family can use.

    None (the family's default) and the backends of the family table ("eager", "sdpa")
    pass; the family itself is checked later by :func:`choose_attn_implementation`.
    Anything else raises UnsupportedModelError (ModelLoadError for a non-string), saying
    which package it would need when that package is missing.
    """
    if requested is None:
        return
    if not isinstance(requested, str):
        raise ModelLoadError(f"attn_implementation must be a string such as 'sdpa' or 'eager', got {requested!r}")
    usable = sorted({b for f in FAMILIES for b in f.backends})
    if requested in usable:
        return
    package = _ATTENTION_PACKAGES.get(requested)
    missing = ""
    if package is not None and importlib.util.find_spec(package) is None:
        missing = f"it needs the {package} package, which is not installed; and "
    raise UnsupportedModelError(
        f"attn_implementation={requested!r}: {missing}it cannot take contllm's continuous-time mask "
        f"(an additive float mask); use one of {', '.join(map(repr, usable))} or leave it unset"
    )


def _check_options(name: Any, cache_dir: Any, trust_remote_code: Any) -> None:
    if not isinstance(name, (str, os.PathLike)):
        raise ModelLoadError(
            f"name must be an embedded alias, a local directory or a Hugging Face id (a str or path), got "
            f"{type(name).__name__} {name!r}"
        )
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise ModelLoadError(
            f"cache_dir must be a directory path or None, got {type(cache_dir).__name__} {cache_dir!r}"
        )
    if not isinstance(trust_remote_code, bool):
        raise ModelLoadError(f"trust_remote_code must be True or False, got {trust_remote_code!r}")


def _from_pretrained(
    location: str | Path,
    *,
    local_only: bool,
    device: torch.device | None,
    dtype: torch.dtype,
    attn_implementation: str | None,
    device_map: Any,
    trust_remote_code: bool,
    max_memory: Any = None,
) -> tuple[Any, Any, str | None]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if local_only:
        common["local_files_only"] = True
    config = AutoConfig.from_pretrained(location, **common)
    attn = choose_attn_implementation(config, attn_implementation)
    model_kwargs: dict[str, Any] = dict(common, config=config, dtype=dtype, use_safetensors=True)
    if attn is not None:
        model_kwargs["attn_implementation"] = attn
    if device_map is not None:
        model_kwargs["device_map"] = device_map
        if max_memory is not None:
            model_kwargs["max_memory"] = dict(max_memory)
    model = AutoModelForCausalLM.from_pretrained(location, **model_kwargs)
    if device_map is None and device is not None:
        model.to(device)  # type: ignore[arg-type]  # transformers' decorated to() hides its signature
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(location, **common)
    if not getattr(tokenizer, "is_fast", False):
        warnings.warn(
            f"the tokenizer of {location} is not a fast tokenizer: character offsets are unavailable",
            stacklevel=3,
        )
    return model, tokenizer, getattr(model.config, "_attn_implementation", attn)


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", downloads) off inside the block, as they were after it.

    A load says what it did through contllm's logger (``-q`` silences it); a bar that
    transformers draws on stderr would pass through ``-q`` and through a notebook's output.
    """
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _check_placement(model: Any, name: str) -> None:
    """ModelLoadError when a device map left weights off every device (offloaded to the CPU or disk).

    Offloaded weights stay on the meta device between forwards, where the continuous
    inputs cannot be built; the model has to fit in the devices of its map.
    """
    if not any(p.device.type == "meta" for p in model.parameters()):
        return
    placed = sorted({str(v) for v in (getattr(model, "hf_device_map", None) or {}).values()})
    raise ModelLoadError(
        f"the device map put part of {name!r} on {', '.join(placed) or 'no device'}: offloaded weights are not "
        "supported; give the devices room for the whole model (more GPUs, a larger max_memory or a smaller dtype)"
    )


def load_model(
    name: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    trust_remote_code: bool = False,
    max_memory: Mapping[int | str, int | str] | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer, in eval mode.

    name: an embedded alias (see :data:`REGISTRY`; converted once into the cache), a
    local directory (config.json + safetensors + tokenizer files) or a Hugging Face id
    (transformers' resolution; offline it must be in the local HF cache).
    device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:N"; ignored when
    device_map is given (accelerate places the model). dtype: float32 unless given;
    bfloat16 and float16 run in the engine with a float32 state and read-out, float64
    returns float64 logits, probabilities and gradients (:func:`parse_dtype` names them all).
    attn_implementation: default "sdpa", "eager" for families without sdpa.
    device_map: "auto" (or "balanced", "balanced_low_0", "sequential", or a dict of
    module -> device) spreads a model too large for one device over the GPUs (on a
    machine without one, it all stays on the CPU); max_memory (device -> size) limits
    what each device takes. A map that offloads weights (to the CPU next to GPUs, or to
    disk) is refused with ModelLoadError.

    Every option is checked before anything is read or converted: ModelLoadError (or
    UnsupportedModelError for an attention implementation, e.g. "flash_attention_2")
    names the bad one.
    """
    _check_options(name, cache_dir, trust_remote_code)
    check_attn_implementation(attn_implementation)
    check_device_map(device_map, max_memory)
    torch_dtype = parse_dtype(dtype)
    torch_device = resolve_device(device) if device_map is None else None
    if torch_dtype == torch.float64 and torch_device is not None and torch_device.type == "mps":
        raise ModelLoadError("dtype float64 cannot run on 'mps' (MPS has no float64); use device='cpu' or 'cuda'")
    source = resolve(name)
    with quiet_loading():
        return _load_resolved(
            source, torch_device, torch_dtype, attn_implementation, device_map, cache_dir, trust_remote_code, max_memory
        )


def _load_resolved(
    source: Any,
    torch_device: torch.device | None,
    torch_dtype: torch.dtype,
    attn_implementation: str | None,
    device_map: Any,
    cache_dir: Any,
    trust_remote_code: bool,
    max_memory: Any,
) -> LoadedModel:
    weights_sha = None
    location: str | Path
    if source.kind == "alias":
        location = ensure_cached(source.name, cache_dir=cache_dir)
        weights_sha = ((read_record(location) or {}).get("source") or {}).get("sha256")
    elif source.kind == "directory" and source.path is not None:
        location = source.path
    else:
        location = source.name
    try:
        model, tokenizer, attn = _from_pretrained(
            location,
            local_only=source.kind != "hub",
            device=torch_device,
            dtype=torch_dtype,
            attn_implementation=attn_implementation,
            device_map=device_map,
            trust_remote_code=trust_remote_code,
            max_memory=max_memory,
        )
    except ContllmError:
        raise
    except OSError as err:
        hint = ""
        if source.kind == "hub":
            hint = (
                "; offline, a Hugging Face id loads only from the local HF cache (set HF_HUB_OFFLINE=1 to skip "
                f"the network), or pass a local directory or an embedded alias ({known_aliases()})"
            )
        raise ModelLoadError(f"could not load {source.name!r}: {err}{hint}") from err
    except ValueError as err:
        raise ModelLoadError(f"could not load {source.name!r}: {err}") from err
    except SafetensorError as err:  # an empty, cut or corrupt weights file
        raise ModelLoadError(
            f"could not load {source.name!r}: its weights file is not valid safetensors ({err})"
        ) from err
    if device_map is not None:
        _check_placement(model, source.name)
    info = ModelInfo(
        name=source.name,
        alias=source.name if source.kind == "alias" else None,
        family=model.config.model_type,
        n_parameters=count_parameters(model),
        source=str(location),
        weights_sha256=weights_sha,
        device=str(model.device),
        dtype=torch_dtype,
        attn_implementation=attn,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


def list_models(cache_dir: str | os.PathLike[str] | None = None) -> list[ModelListing]:
    """Every embedded alias: family, size, whether its package is installed and its cache entry usable."""
    listings = []
    for entry in REGISTRY.values():
        path = cache_root(cache_dir) / entry.alias
        installed = entry.is_installed()
        sha = None
        if installed and path.is_dir():
            try:
                sha = entry.gguf.current_sha256((read_record(path) or {}).get("source"))
            except (OSError, ImportError):
                sha = None
        cached = not cache_entry_problems(path, source_sha256=sha)
        listings.append(
            ModelListing(
                alias=entry.alias,
                family=entry.family,
                n_parameters=entry.n_parameters,
                description=entry.description,
                installed=installed,
                cached=cached,
                cache_path=path,
                install_command=entry.install_command_for(entry.missing_modules()),
                chat_template_note=entry.chat_template_note,
                gguf_bytes=entry.gguf_bytes,
                cache_bytes=_entry_bytes(path) if cached else None,
            )
        )
    return listings


def _entry_bytes(entry: Path) -> int:
    return sum(int(f.get("size", 0)) for f in (read_record(entry) or {}).get("files", []) if isinstance(f, Mapping))


def _size(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "-"
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.0f} MB"


def format_listings(listings: list[ModelListing]) -> list[str]:
    """The lines of ``contllm models``: one per alias, with the install command of what is missing."""
    width = max([5, *(len(m.alias) for m in listings)])
    lines = [
        f"{'alias':<{width}}  {'family':<11}  {'params':>6}  {'gguf':>7}  {'installed':<9}  {'converted':<10}  install"
    ]
    for m in listings:
        converted = _size(m.cache_bytes) if m.cached else "no"
        lines.append(
            f"{m.alias:<{width}}  {m.family:<11}  {m.n_parameters / 1e6:>5.0f}M  {_size(m.gguf_bytes):>7}  "
            f"{'yes' if m.installed else 'no':<9}  {converted:<10}  {'' if m.installed else m.install_command}".rstrip()
        )
    return lines
