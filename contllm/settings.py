"""How a run is made, apart from the experiment's own options: one typed declaration.

:class:`RunSettings` is built by the command line, by spec files and from Python, and
checked once, when it is made (:meth:`RunSettings.check_for` adds what depends on the
experiment). :meth:`RunSettings.recorded` is what config.json keeps of it and what
``--resume`` compares: everything that changes how records are computed. The module
imports nothing heavy, so that the command line's help can read its constants.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from contllm.errors import ExperimentError
from contllm.numerals import as_integer

#: Next-token distributions one batch of items may hold at once, in bytes of float32
#: probabilities: 66 counting items of Qwen2.5-Coder-0.5B (a vocabulary of 151,936), 204 of
#: SmolLM2. A larger batch plans larger forwards (on the 0.5B model, 22 items a batch ran the
#: same items 1.1-1.8x slower than 66, under load), holds more, and saves its records less
#: often. The environment variable CONTLLM_GROUP_BYTES overrides it; a run records the value
#: it used and a resumed run must use the same (the batch decides float summation order).
GROUP_BYTES = 384 * 1024 * 1024
GROUP_BYTES_VARIABLE = "CONTLLM_GROUP_BYTES"


def group_bytes_from_env() -> int:
    """The group budget in bytes: CONTLLM_GROUP_BYTES when set, else :data:`GROUP_BYTES`; ExperimentError for a bad value."""
    text = os.environ.get(GROUP_BYTES_VARIABLE, "").strip()
    if not text:
        return GROUP_BYTES
    value = as_integer(text)
    if value is None or value < 1:
        raise ExperimentError(f"{GROUP_BYTES_VARIABLE} must be a whole number of bytes >= 1, got {_short(text)}")
    return value


#: The figure formats a run can write (matplotlib's names), and the default: a PNG is quick to
#: write and to look at; PDF (vector, for papers) costs about as much again and is written
#: only when asked (``--formats png,pdf``).
FIGURE_FORMATS = ("png", "pdf")
DEFAULT_FORMATS = ("png",)

#: A run of at most this many items draws one figure per item unless told otherwise; a
#: larger run draws the summary figure only (the explorer page shows every item, and
#: ``contllm figures RUN_DIR`` draws the item figures afterwards). Item figures cost about
#: 0.17 s each on a 2-core CPU: as much as evaluating a counting item.
ITEM_FIGURES_UP_TO = 24


def figure_formats(value: str | Sequence[str], what: str = "--formats") -> tuple[str, ...]:
    """``value`` ("png,pdf", or a sequence of names) as a tuple of :data:`FIGURE_FORMATS`, in the order given, each once.

    Case and spaces do not matter. ExperimentError (naming ``what``) for an unknown or empty value.
    """
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, Sequence) or not all(isinstance(part, str) for part in parts):
        raise ExperimentError(f"{what} takes figure formats (png, pdf), comma-separated; got {_short(value)}")
    names: list[str] = []
    for part in parts:
        name = part.strip().lower().lstrip(".")
        if not name:
            continue
        if name not in FIGURE_FORMATS:
            raise ExperimentError(
                f"{what}: unknown figure format {_short(part.strip())}; choose among {', '.join(FIGURE_FORMATS)} (e.g. png,pdf)"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise ExperimentError(f"{what} names no figure format; give png, pdf or png,pdf")
    return tuple(names)


def _default_model() -> str:
    # contllm.models imports torch; the command line's help reads this module's constants without it.
    from contllm.models.catalog import DEFAULT_MODEL

    return DEFAULT_MODEL


#: The precisions a run takes (``--dtype``, specs, :class:`RunSettings`), by every name a user
#: may give, and the dtype each names (torch's dtypes are taken where the model loads:
#: :func:`contllm.models.parse_dtype`, which also takes :data:`FLOAT64_NAMES`).
DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


#: The names of float64, which :func:`contllm.load` takes besides :data:`DTYPE_NAMES` (a
#: float64 model returns float64 logits, probabilities and gradients, for checks by finite
#: differences); runs and the command line keep to :data:`DTYPE_NAMES`.
FLOAT64_NAMES = {"float64": "float64", "fp64": "float64"}


def dtype_name(dtype: str) -> str | None:
    """The dtype ``dtype`` names ("bf16", " torch.bfloat16" -> "bfloat16"), or None for a name of none."""
    return DTYPE_NAMES.get(dtype.strip().lower().removeprefix("torch."))


#: The dtype a run may ask for instead of a name: float32 or bfloat16, whichever this host
#: runs faster without moving the probabilities, timed when the model loads
#: (:mod:`contllm.models.autodtype`; config.json keeps "auto", the manifest the choice).
AUTO_DTYPE = "auto"
#: How the command line shows --dtype's values, and what it says of auto.
DTYPE_METAVAR = "[float32|bfloat16|float16|auto]"
AUTO_DTYPE_HELP = (
    "auto: bfloat16 where a few seconds' calibration at load finds it at least 10% faster here with "
    "probabilities within 1e-2 of float32, else float32"
)


def is_dtype_setting(dtype: str) -> bool:
    """Whether a run takes ``dtype``: a name of :data:`DTYPE_NAMES` or :data:`AUTO_DTYPE` (any case)."""
    return dtype_name(dtype) is not None or dtype.strip().lower() == AUTO_DTYPE


#: Largest seed: torch, numpy and Python's random all take it.
MAX_SEED = 2**63 - 1


def check_seed(value: Any, what: str = "seed") -> int:
    """``value`` as a seed: an integer (or its ASCII digits) from 0 to :data:`MAX_SEED`; ExperimentError naming ``what``."""
    seed = as_integer(value) if isinstance(value, str) else value
    if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
        raise ExperimentError(f"{what} must be an integer, got {_short(value)}")
    if not 0 <= seed <= MAX_SEED:
        raise ExperimentError(f"{what} must be an integer from 0 to {MAX_SEED} (2**63 - 1), got {_short(value)}")
    return seed


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _items_text(items: str | int) -> str:
    """``items`` as config.json records it: a count in its plain spelling ("02" and 2 are "2"), ids as given."""
    if isinstance(items, int) and items.bit_length() > 60:
        raise ExperimentError(f"item count {_short(items)} is larger than any dataset")
    text = str(items).strip()
    count = as_integer(text)
    if count is not None and count <= 0:
        raise ExperimentError(f"item count must be positive, got {count}")
    if text.isascii() and text.isdigit():
        if len(text.lstrip("0")) > 18:
            raise ExperimentError(f"item count {_short(text)} is larger than any dataset")
        return str(int(text))
    return text if isinstance(items, str) else str(items)


def _positive_int(value: Any, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ExperimentError(f"{what} must be an integer >= 1, got {_short(value)}")


@dataclass(frozen=True)
class RunSettings:
    """The settings every run takes; ExperimentError on construction for a value that makes no sense.

    model: what to load and how config.json names it (alias, hub id or directory).
    items: the first N items or comma-separated ids (None: all; a count is kept as text).
    seed: the run's random seed. dtype: float32, bfloat16, float16 or auto (bfloat16 where it is
        faster here and close to float32, else float32: :mod:`contllm.models.autodtype`; None: float32).
    max_batch_tokens: most tokens one forward computes (None: automatic); used by every
        experiment that evaluates the model in batches (the engine and attribution's gradients).
    device_map: "auto" spreads a model over several devices (engine experiments).
    item_figures: also draw one figure per item (None: for runs of at most
        :data:`ITEM_FIGURES_UP_TO` items; see :meth:`draws_item_figures`).
    formats: the figure formats, a tuple of :data:`FIGURE_FORMATS` or a comma-separated
        string ("png,pdf"); PNG only by default.
    group_bytes: the budget of one batch of items (see :data:`GROUP_BYTES`); read from the
        environment when not given.
    """

    model: str = field(default_factory=_default_model)
    items: str | None = None
    seed: int = 0
    dtype: str | None = None
    max_batch_tokens: int | None = None
    device_map: str | None = None
    item_figures: bool | None = None
    formats: tuple[str, ...] = DEFAULT_FORMATS
    group_bytes: int = field(default_factory=group_bytes_from_env)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ExperimentError(f"model must be a name or a directory, got {self.model!r}")
        if self.items is not None:
            if isinstance(self.items, bool) or not isinstance(self.items, (str, int)):
                raise ExperimentError(f"items must be a count or a string of ids, got {_short(self.items)}")
            object.__setattr__(self, "items", _items_text(self.items))
        if isinstance(self.seed, str):  # only Python ints, as the field says; the command line reads its text first
            raise ExperimentError(f"seed must be an integer, got {_short(self.seed)}")
        check_seed(self.seed)
        if self.dtype is not None and (not isinstance(self.dtype, str) or not is_dtype_setting(self.dtype)):
            raise ExperimentError(
                f"dtype must be a name ({', '.join(DTYPE_NAMES)}) or {AUTO_DTYPE}, got {_short(self.dtype)}"
            )
        _positive_int(self.max_batch_tokens, "--max-batch-tokens")
        _positive_int(self.group_bytes, GROUP_BYTES_VARIABLE)
        if self.device_map is not None:
            from contllm.rundir.distributed import check_device_map

            check_device_map(self.device_map)
        if self.item_figures is not None and not isinstance(self.item_figures, bool):
            raise ExperimentError(f"item_figures must be true or false, got {self.item_figures!r}")
        object.__setattr__(self, "formats", figure_formats(self.formats))

    def draws_item_figures(self, items: int) -> bool:
        """Whether a run of ``items`` items draws one figure per item: ``item_figures`` when given, else up to :data:`ITEM_FIGURES_UP_TO` items."""
        return self.item_figures if self.item_figures is not None else items <= ITEM_FIGURES_UP_TO

    def check_for(self, experiment: Any) -> None:
        """ExperimentError when a setting does not apply to ``experiment`` (an :class:`~contllm.experiments.base.Experiment`)."""
        from contllm.rundir.distributed import launch_size

        if not experiment.engine:
            unused = [
                flag
                for flag, value in (("--max-batch-tokens", self.max_batch_tokens), ("--device-map", self.device_map))
                if value is not None
            ]
            if unused:
                raise ExperimentError(f"option(s) {', '.join(unused)} do not apply to the {experiment.name} experiment")
        if not experiment.shardable and launch_size() > 1:
            raise ExperimentError(f"{experiment.name} runs in one process; start it without a launcher")
        if self.dtype is not None and self.dtype.strip().lower() == AUTO_DTYPE and launch_size() > 1:
            raise ExperimentError(
                "--dtype auto times the model in one process, and a launch's processes could pick differently; "
                "give --dtype float32 or bfloat16"
            )

    def recorded(self) -> dict[str, Any]:
        """What config.json keeps and ``--resume`` compares: every setting that changes the records."""
        return {
            "model": self.model,
            "dtype": self.dtype,
            "items": self.items,
            "seed": self.seed,
            "max_batch_tokens": self.max_batch_tokens,
            "group_bytes": self.group_bytes,
        }


#: The names of :class:`RunSettings`' fields: the run options that change how records are made or drawn.
SETTINGS = tuple(f.name for f in fields(RunSettings))
