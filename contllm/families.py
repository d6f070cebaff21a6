"""One declarative entry per supported model family.

Everything that differs between families and matters for continuous inputs is read
from this table: how positions enter the model (rotary float positions, or a learned
table that must be interpolated), where sliding windows come from, and which attention
implementations accept the additive float mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

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
    backends: attention implementations that add a float 4D mask to the logits; loading
        picks "sdpa" where it is listed, else the first.
    layers: path of the decoder layers' ModuleList from the causal-LM model.
    norm: path of the norm between the last decoder layer and the vocabulary head.
    attention: name of the self-attention submodule inside one decoder layer.
    mlp: name of the feed-forward (MLP) submodule inside one decoder layer.
    attention_output: name of the output projection inside the attention module (its
        input is the heads' outputs side by side, [..., heads x head_dim]).
    float32_projections: names of the query and key projections inside the attention
        module (a fused query/key/value projection where the family has one), which
        :func:`contllm.precision.float32_state` runs in float32 for a half-precision
        model (a query or key rounded to bfloat16 moves every attention logit it enters).
    heads, kv_heads: config attributes of the query and key/value head counts; a family
        without grouped queries has kv_heads None (as many key/value heads as queries).
    notes: quirks worth knowing, shown in docs and errors.
    """

    name: str
    model_types: tuple[str, ...]
    positions: Positions = "rotary"
    windows: Windows = "none"
    backends: tuple[str, ...] = ("eager", "sdpa")
    position_table: str | None = None
    layers: str = "model.layers"
    norm: str = "model.norm"
    attention: str = "self_attn"
    mlp: str = "mlp"
    attention_output: str = "o_proj"
    float32_projections: tuple[str, ...] = ("q_proj", "k_proj")
    heads: str = "num_attention_heads"
    kv_heads: str | None = "num_key_value_heads"
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
    Family("phi", ("phi",), norm="model.final_layernorm", attention_output="dense", notes="partial rotary"),
    Family(
        "phi3",
        ("phi3",),
        windows="config",
        float32_projections=("qkv_proj",),
        notes="long-context rope picks frequencies from max(position) + 1",
    ),
    Family("qwen2", ("qwen2",), windows="layer_types"),
    Family("qwen3", ("qwen3",), windows="layer_types"),
    Family(
        "gpt_neox",
        ("gpt_neox",),
        layers="gpt_neox.layers",
        norm="gpt_neox.final_layer_norm",
        attention="attention",
        attention_output="dense",
        float32_projections=("query_key_value",),
        kv_heads=None,
        notes="partial rotary",
    ),
    Family(
        "gpt2",
        ("gpt2",),
        positions="learned",
        position_table="transformer.wpe",
        layers="transformer.h",
        norm="transformer.ln_f",
        attention="attn",
        attention_output="c_proj",
        float32_projections=("c_attn",),
        heads="n_head",
        kv_heads=None,
    ),
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


#: Rotary kinds whose frequencies are fixed by the config alone, so attention depends only
#: on differences of positions. "dynamic" and "longrope" choose frequencies from the
#: largest position seen, so moving every position by a constant changes them.
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def _rope_types(config: Any) -> list[str]:
    """Every ``rope_type`` in a config's rotary parameters (one dict, or one per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return ["unknown"]
    tables = [p for p in params.values() if isinstance(p, dict)] or [params]
    return [str(p.get("rope_type", p.get("type", "default"))) for p in tables]


def relative_positions(family: Family, config: Any) -> bool:
    """Whether the model sees positions only through their differences.

    True for a rotary family whose every rotary kind is in :data:`STATIC_ROPE_TYPES`:
    adding a constant to every position id leaves its outputs unchanged in exact
    arithmetic, so the engine may move the time origin to where float32 positions are
    finest. False for learned position tables and for rotary kinds that pick their
    frequencies from the largest position (Phi-3's long-context rope, dynamic scaling).
    """
    return family.positions == "rotary" and all(t in STATIC_ROPE_TYPES for t in _rope_types(config))


def model_of(model: Any) -> nn.Module:
    """The transformers model itself, given it or anything holding it as ``.model`` (a ContinuousLM)."""
    if isinstance(model, nn.Module):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module):
        return inner
    raise UnsupportedModelError(f"expected a ContinuousLM or a transformers model, got {type(model).__name__}")


def _submodule(model: nn.Module, path: str, what: str, family: Family) -> nn.Module:
    """The module at ``path`` from the causal LM, or from its base model when given that instead."""
    _, _, inner_path = path.partition(".")
    # A bare base model (LlamaModel rather than LlamaForCausalLM) holds the path without its first step.
    for root, rel in ((model, path), (getattr(model, "base_model", None), inner_path)):
        if not isinstance(root, nn.Module) or not rel:
            continue
        try:
            return root.get_submodule(rel)
        except AttributeError:
            continue
    raise UnsupportedModelError(
        f"{family.name}: no {what} at {type(model).__name__}.{path} (the family table's path); "
        f"the model's top-level modules are {', '.join(n for n, _ in model.named_children())}"
    )


def decoder_layers(model: Any) -> nn.ModuleList:
    """The decoder layers of a causal LM (or a ContinuousLM), in order, as the family table places them."""
    net = model_of(model)
    family = family_of(net)
    layers = _submodule(net, family.layers, "decoder layers", family)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(
            f"{family.name}: {type(net).__name__}.{family.layers} is a {type(layers).__name__}, "
            "not a non-empty ModuleList of decoder layers"
        )
    return layers


def final_norm(model: Any) -> nn.Module:
    """The norm between the last decoder layer and the vocabulary head of a causal LM (or a ContinuousLM)."""
    net = model_of(model)
    family = family_of(net)
    return _submodule(net, family.norm, "final norm", family)


def _layer_parts(model: Any, attribute: str, what: str) -> list[nn.Module]:
    """The submodule named by the family table's ``attribute`` in each decoder layer, in layer order."""
    net = model_of(model)
    family = family_of(net)
    name = getattr(family, attribute)
    found = []
    for index, layer in enumerate(decoder_layers(net)):
        module = getattr(layer, name, None)
        if not isinstance(module, nn.Module):
            raise UnsupportedModelError(
                f"{family.name}: decoder layer {index} ({type(layer).__name__}) has no {what} module "
                f"{name!r}; its submodules are {', '.join(n for n, _ in layer.named_children())}"
            )
        found.append(module)
    return found


def attention_modules(model: Any) -> list[nn.Module]:
    """The self-attention module of each decoder layer, in layer order (one per layer)."""
    return _layer_parts(model, "attention", "attention")


def mlp_modules(model: Any) -> list[nn.Module]:
    """The feed-forward (MLP) module of each decoder layer, in layer order (one per layer)."""
    return _layer_parts(model, "mlp", "MLP")


def attention_outputs(model: Any) -> list[nn.Module]:
    """The output projection of each layer's attention module (the family's ``attention_output``), in layer order."""
    family = family_of(model_of(model))
    found = []
    for index, attention in enumerate(attention_modules(model)):
        module = getattr(attention, family.attention_output, None)
        if not isinstance(module, nn.Module):
            raise UnsupportedModelError(
                f"{family.name}: the attention module of layer {index} ({type(attention).__name__}) has no output "
                f"projection {family.attention_output!r}; its submodules are "
                f"{', '.join(n for n, _ in attention.named_children())}"
            )
        found.append(module)
    return found


def head_counts(config: Any) -> tuple[int, int]:
    """(query heads, key/value heads) of a model's config (or of a model, or a ContinuousLM)."""
    if not hasattr(config, "model_type"):
        config = model_of(config).config
    family = family_of(config)
    heads = getattr(config, family.heads, None)
    if not isinstance(heads, int) or heads < 1:
        raise UnsupportedModelError(f"{family.name}: config.{family.heads} is {heads!r}, not a head count")
    kv_heads = getattr(config, family.kv_heads, None) if family.kv_heads else None
    return heads, int(kv_heads) if kv_heads else heads


@dataclass(frozen=True)
class Sizes:
    """The sizes a memory estimate needs, read from a model's text config."""

    hidden: int
    heads: int
    layers: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def sizes(lm: Any) -> Sizes:
    """:class:`Sizes` of ``lm.model``'s text config (missing key/value heads: the query heads; head width: hidden / heads)."""
    config = lm.model.config.get_text_config()
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    return Sizes(
        hidden=hidden,
        heads=heads,
        layers=int(config.num_hidden_layers),
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        vocab=int(config.vocab_size),
    )
