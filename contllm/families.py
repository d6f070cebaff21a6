"""One declarative entry per supported model family.

Everything that differs between families and matters for continuous inputs is read
from this table: how positions enter the model (rotary float positions, or a learned
table that must be interpolated), where sliding windows come from, and which attention
implementations accept the additive float mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from contllm.errors import UnsupportedModelError

Positions = Literal["rotary", "learned"]
Windows = Literal["none", "config", "layer_types"]


@dataclass(frozen=True)
class Family:
    """How a model family takes continuous-time inputs.

    positions: "rotary" (float times are the position ids) or "learned" (an absolute
        position table at ``position_table``, interpolated linearly between rows).
    windows: "none"; "config" (``config.sliding_window`` applies to every layer, one
        mask); or "layer_types" (``config.layer_types`` names each layer's kind, one mask
        per kind, the sliding kind windowed by ``config.sliding_window``).
    backends: attention implementations that add a float 4D mask to the logits.
    notes: quirks worth knowing, shown in docs and errors.
    """

    name: str
    model_types: tuple[str, ...]
    positions: Positions = "rotary"
    windows: Windows = "none"
    backends: tuple[str, ...] = ("eager", "sdpa")
    position_table: str | None = None
    notes: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",)),
    Family("mistral", ("mistral",), windows="config", notes="sliding window applied in time units"),
    Family("gemma", ("gemma",), notes="embedding scale lives in the embedding module"),
    Family(
        "gemma2",
        ("gemma2",),
        windows="layer_types",
        backends=("eager",),
        notes="logit softcapping comes before the mask; local and global layers alternate",
    ),
    Family(
        "gemma3",
        ("gemma3_text",),
        windows="layer_types",
        notes="separate rotary bases for local and global layers; local layers slide",
    ),
    Family("phi", ("phi",), notes="partial rotary"),
    Family("phi3", ("phi3",), windows="config", notes="long-context rope picks frequencies from max(position) + 1"),
    Family("qwen2", ("qwen2",), windows="layer_types"),
    Family("qwen3", ("qwen3",), windows="layer_types"),
    Family("gpt_neox", ("gpt_neox",), notes="partial rotary"),
    Family("gpt2", ("gpt2",), positions="learned", position_table="transformer.wpe"),
)

SLIDING_LAYER_TYPE = "sliding_attention"
FULL_LAYER_TYPE = "full_attention"


def supported_model_types() -> list[str]:
    """Every ``config.model_type`` that contllm supports, sorted."""
    return sorted(t for f in FAMILIES for t in f.model_types)


def family_of(config: Any) -> Family:
    """The family entry for a model or its config; UnsupportedModelError for any other."""
    config = getattr(config, "config", config)
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise UnsupportedModelError(
        f"model type {model_type!r} is not supported; supported model types: {', '.join(supported_model_types())}"
    )


def layer_windows(family: Family, config: Any) -> dict[str, float | None] | float | None:
    """The sliding window of each kind of layer, in time units.

    Returns a dict {layer type: window or None} for "layer_types" families, otherwise a
    single window (None: no window) that applies to every layer.
    """
    if family.windows == "none":
        return None
    window = getattr(config, "sliding_window", None)
    if family.windows == "config":
        return None if window is None else float(window)
    kinds = list(dict.fromkeys(getattr(config, "layer_types", None) or [FULL_LAYER_TYPE]))
    out: dict[str, float | None] = {}
    for kind in kinds:
        if kind == FULL_LAYER_TYPE:
            out[kind] = None
        elif kind == SLIDING_LAYER_TYPE:
            if window is None:
                raise UnsupportedModelError(f"{family.name}: a sliding layer but no config.sliding_window")
            out[kind] = float(window)
        else:
            raise UnsupportedModelError(
                f"{family.name}: layer type {kind!r} is not supported "
                f"(supported: {FULL_LAYER_TYPE}, {SLIDING_LAYER_TYPE})"
            )
    return out
