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
Layout = Literal["stacked", "per_head"]
NormKind = Literal["rms", "layer"]


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
        :func:`contllm.core.precision.float32_state` runs in float32 for a half-precision
        model (a query or key rounded to bfloat16 moves every attention logit it enters).
    heads, kv_heads: config attributes of the query and key/value head counts; a family
        without grouped queries has kv_heads None (as many key/value heads as queries).
    rotary: path of the rotary embedding module from the causal-LM model (None: no rotary).
    ln1, ln2: names of the norms inside a decoder layer that feed the attention and the MLP
        (ln2 None: one norm feeds both, as in Phi).
    attention_out_norm, mlp_out_norm: norms applied to the attention and MLP outputs before
        they join the residual stream (Gemma 2 and 3), or None.
    parallel: whether attention and MLP read the same residual stream (no residual between
        them): a bool, or the name of the config attribute that says so.
    qkv: the query, key and value projections inside the attention module, or one fused
        projection whose output holds all three, laid out as ``qkv_layout`` says: "stacked"
        ([queries | keys | values] along the last dimension) or "per_head" (for each head,
        its query, key and value side by side).
    mlp_in: the MLP's first projection (whose output goes through the activation; the gate
        of a gated MLP); mlp_up: the gated MLP's other input projection (None: not gated; the
        same name as mlp_in: one fused projection holding [gate | up]); mlp_out: the MLP's
        last projection (its input is the activation inside the MLP).
    norm_kind: "rms" (root-mean-square norms) or "layer" (mean-centred LayerNorm), with
        ``norm_offset`` added to the norms' weights (Gemma stores 1 + weight as weight).
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
    rotary: str | None = "model.rotary_emb"
    ln1: str = "input_layernorm"
    ln2: str | None = "post_attention_layernorm"
    attention_out_norm: str | None = None
    mlp_out_norm: str | None = None
    parallel: bool | str = False
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    qkv_layout: Layout = "stacked"
    mlp_in: str = "gate_proj"
    mlp_up: str | None = "up_proj"
    mlp_out: str = "down_proj"
    norm_kind: NormKind = "rms"
    norm_offset: float = 0.0
    notes: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",)),
    Family("mistral", ("mistral",), windows="config", notes="sliding window applied in time units"),
    Family("gemma", ("gemma",), norm_offset=1.0, notes="embedding scale lives in the embedding module"),
    Family(
        "gemma2",
        ("gemma2",),
        windows="layer_types",
        backends=("eager",),
        ln2="pre_feedforward_layernorm",
        attention_out_norm="post_attention_layernorm",
        mlp_out_norm="post_feedforward_layernorm",
        norm_offset=1.0,
        notes="logit softcapping comes before the mask; local and global layers alternate",
    ),
    Family(
        "gemma3",
        ("gemma3_text",),
        windows="layer_types",
        ln2="pre_feedforward_layernorm",
        attention_out_norm="post_attention_layernorm",
        mlp_out_norm="post_feedforward_layernorm",
        norm_offset=1.0,
        notes="separate rotary bases for local and global layers; local layers slide",
    ),
    Family(
        "phi",
        ("phi",),
        norm="model.final_layernorm",
        attention_output="dense",
        ln2=None,
        parallel=True,
        mlp_in="fc1",
        mlp_up=None,
        mlp_out="fc2",
        norm_kind="layer",
        notes="partial rotary",
    ),
    Family(
        "phi3",
        ("phi3",),
        windows="config",
        float32_projections=("qkv_proj",),
        qkv=("qkv_proj",),
        mlp_in="gate_up_proj",
        mlp_up="gate_up_proj",
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
        rotary="gpt_neox.rotary_emb",
        parallel="use_parallel_residual",
        qkv=("query_key_value",),
        qkv_layout="per_head",
        mlp_in="dense_h_to_4h",
        mlp_up=None,
        mlp_out="dense_4h_to_h",
        norm_kind="layer",
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
        rotary=None,
        ln1="ln_1",
        ln2="ln_2",
        qkv=("c_attn",),
        mlp_in="c_fc",
        mlp_up=None,
        mlp_out="c_proj",
        norm_kind="layer",
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


def model_and_family(model: Any) -> tuple[nn.Module, Family]:
    """The transformers model (:func:`model_of`) and its family's table entry (:func:`family_of`)."""
    net = model_of(model)
    return net, family_of(net)


def submodule(model: nn.Module, path: str, what: str, family: Family) -> nn.Module:
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
    net, family = model_and_family(model)
    layers = submodule(net, family.layers, "decoder layers", family)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(
            f"{family.name}: {type(net).__name__}.{family.layers} is a {type(layers).__name__}, "
            "not a non-empty ModuleList of decoder layers"
        )
    return layers


def final_norm(model: Any) -> nn.Module:
    """The norm between the last decoder layer and the vocabulary head of a causal LM (or a ContinuousLM)."""
    net, family = model_and_family(model)
    return submodule(net, family.norm, "final norm", family)


def child(module: nn.Module, name: str, what: str, where: str) -> nn.Module:
    """The submodule ``name`` of ``module``; UnsupportedModelError naming ``what`` and ``where`` and the submodules there."""
    found = getattr(module, name, None)
    if not isinstance(found, nn.Module):
        raise UnsupportedModelError(
            f"{where} ({type(module).__name__}) has no {what} {name!r}; its submodules are "
            f"{', '.join(n for n, _ in module.named_children())}"
        )
    return found


def _layer_parts(model: Any, attribute: str, what: str) -> list[nn.Module]:
    """The submodule named by the family table's ``attribute`` in each decoder layer, in layer order."""
    net, family = model_and_family(model)
    name = getattr(family, attribute)
    return [
        child(layer, name, f"{what} module", f"{family.name}: decoder layer {index}")
        for index, layer in enumerate(decoder_layers(net))
    ]


def attention_modules(model: Any) -> list[nn.Module]:
    """The self-attention module of each decoder layer, in layer order (one per layer)."""
    return _layer_parts(model, "attention", "attention")


def mlp_modules(model: Any) -> list[nn.Module]:
    """The feed-forward (MLP) module of each decoder layer, in layer order (one per layer)."""
    return _layer_parts(model, "mlp", "MLP")


def attention_outputs(model: Any) -> list[nn.Module]:
    """The output projection of each layer's attention module (the family's ``attention_output``), in layer order."""
    family = family_of(model_of(model))
    return [
        child(
            attention, family.attention_output, "output projection", f"{family.name}: the attention module of layer {i}"
        )
        for i, attention in enumerate(attention_modules(model))
    ]


def parallel_blocks(model: Any) -> bool:
    """Whether the decoder layers of ``model`` feed attention and MLP the same residual stream (the family's ``parallel``)."""
    net, family = model_and_family(model)
    if isinstance(family.parallel, str):
        return bool(getattr(net.config, family.parallel, False))
    return family.parallel


def rotary_module(model: Any) -> nn.Module | None:
    """The rotary embedding module of a causal LM (the family's ``rotary``), or None for a family without one."""
    net, family = model_and_family(model)
    return None if family.rotary is None else submodule(net, family.rotary, "rotary embedding", family)


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
