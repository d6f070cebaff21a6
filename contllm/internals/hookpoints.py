"""The hook vocabulary: every named activation point of a model, resolved through the family table.

Names follow TransformerLens, so that what users know from it carries over; each is
resolved through :mod:`contllm.core.families` (layer stack, norms, projections, MLP parts), so
every supported family speaks them. Values are handed to hook functions for the whole
left-padded batch, in TransformerLens's layouts:

=======================================  ==========================================================  ===============================
name                                     what                                                        value
=======================================  ==========================================================  ===============================
``hook_embed``                           the input embeddings (the token embedding module's output,  [batch, pos, hidden]
                                         Gemma's scale included)
``hook_pos_embed``                       learned position rows read at the (float) times (GPT-2)     [batch, pos, hidden]
``blocks.{i}.hook_resid_pre``            the residual stream entering layer i                        [batch, pos, hidden]
``blocks.{i}.ln1.hook_scale``            the norm before attention: its divisor sqrt(mean(x^2)+eps)  [batch, pos, 1]
                                         (x centred first for LayerNorm)
``blocks.{i}.ln1.hook_normalized``       x / scale, before the norm's weight and bias                [batch, pos, hidden]
``blocks.{i}.attn.hook_q``               queries: the query projection's output, per head            [batch, pos, heads, head_dim]
``blocks.{i}.attn.hook_k`` / ``hook_v``  keys and values, per key/value head (grouped, not expanded) [batch, pos, kv_heads, head_dim]
``blocks.{i}.attn.hook_rot_q``           queries after the rotary embedding (and q-norm)             [batch, pos, heads, head_dim]
``blocks.{i}.attn.hook_rot_k``           keys after the rotary embedding (and k-norm)                [batch, pos, kv_heads, head_dim]
``blocks.{i}.attn.hook_duration_bias``   the continuous-time term added to the attention logits:     [batch, heads, query, key]
                                         log d_j where key j is visible to the query, the dtype's
                                         minimum where it is not (later in time, outside a window,
                                         zero duration)
``blocks.{i}.attn.hook_attn_scores``     the logits entering the softmax: q.k x scale (softcapped    [batch, heads, query, key]
                                         where the family caps) + the duration bias
``blocks.{i}.attn.hook_pattern``         the attention probabilities                                 [batch, heads, query, key]
``blocks.{i}.attn.hook_z``               each head's output before the output projection            [batch, pos, heads, head_dim]
``blocks.{i}.attn.hook_result``          each head's write to the residual stream (its z through     [batch, pos, heads, hidden]
                                         its block of the output projection, without the bias)
``blocks.{i}.hook_attn_out``             what attention adds to the residual stream (after Gemma 2   [batch, pos, hidden]
                                         and 3's post-attention norm)
``blocks.{i}.hook_resid_mid``            the residual stream between attention and MLP (not in       [batch, pos, hidden]
                                         parallel families: Phi, GPT-NeoX with a parallel residual)
``blocks.{i}.ln2.hook_scale``            the norm before the MLP (none in Phi), as for ln1           [batch, pos, 1]
``blocks.{i}.ln2.hook_normalized``                                                                   [batch, pos, hidden]
``blocks.{i}.mlp.hook_pre``              the MLP's pre-activation (the gate of a gated MLP)          [batch, pos, d_mlp]
``blocks.{i}.mlp.hook_pre_linear``       the gated MLP's linear input (gated families only)          [batch, pos, d_mlp]
``blocks.{i}.mlp.hook_post``             the activation inside the MLP (the last projection's input) [batch, pos, d_mlp]
``blocks.{i}.hook_mlp_out``              what the MLP adds to the residual stream                    [batch, pos, hidden]
``blocks.{i}.hook_resid_post``           the residual stream leaving layer i                         [batch, pos, hidden]
``ln_final.hook_scale``                  the final norm's divisor                                    [batch, pos, 1]
``ln_final.hook_normalized``             the final norm's x / scale, before its weight and bias      [batch, pos, hidden]
``ln_final.hook_out``                    the final norm's output (what the unembedding reads)        [batch, pos, hidden]
=======================================  ==========================================================  ===============================

``hook_duration_bias`` is contllm's own: at unit durations it is 0 wherever a key is
visible, and it is where a token's duration enters the model besides its time (the
rotary position of every later token). Grouped-query heads are handled as TransformerLens
handles them: keys and values keep their key/value heads, scores, patterns, z and
results are per query head (query head h reads key/value head h // (heads / kv_heads)).
:func:`act_name` turns TransformerLens's short forms (``("resid_post", 5)``,
``("pattern", 3)``, ``("scale", 2, "ln1")``, ``"scale"``) into full names.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from contllm.core.families import (
    Family,
    attention_modules,
    child,
    decoder_layers,
    family_of,
    final_norm,
    head_counts,
    model_and_family,
    model_of,
    parallel_blocks,
    submodule,
)
from contllm.errors import SignalError, UnsupportedModelError

__all__ = ["Point", "act_name", "hook_names", "point", "points", "resolve_names"]

Axis = Literal["pos", "pattern"]
Site = Literal[
    "embed", "pos_embed", "layer_in", "output", "resid_mid", "norm", "qkv", "attention", "z", "result", "mlp_in",
    "mlp_post",
]  # fmt: skip

#: TransformerLens's short forms (``act_name``) -> the name's tail after ``blocks.{i}.``.
SHORT_NAMES = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "rot_q": "attn.hook_rot_q",
    "rot_k": "attn.hook_rot_k",
    "scores": "attn.hook_attn_scores",
    "attn_scores": "attn.hook_attn_scores",
    "duration_bias": "attn.hook_duration_bias",
    "pattern": "attn.hook_pattern",
    "attn": "attn.hook_pattern",
    "z": "attn.hook_z",
    "result": "attn.hook_result",
    "pre": "mlp.hook_pre",
    "pre_linear": "mlp.hook_pre_linear",
    "post": "mlp.hook_post",
}


@dataclass(frozen=True)
class Point:
    """One named activation point: where it lives and the shape of its values.

    site: how it is reached (:mod:`contllm.internals.intervention` installs one kind of hook per site);
    module: the module that carries it; part: which value at that module ("q", "scale",
    "pattern", ...); owner: a second module the site needs (the decoder layer of
    ``hook_resid_mid``, the causal LM of the embeddings); shape: the trailing shape of one
    position's value ([heads] for patterns, whose values are [batch, heads, query, key]);
    axis: "pos" ([batch, pos, *shape]) or "pattern" ([batch, heads, query, key]).
    """

    name: str
    layer: int | None
    site: Site
    module: nn.Module
    shape: tuple[int, ...]
    part: str = ""
    owner: nn.Module | None = None
    axis: Axis = "pos"


def _width(module: nn.Module, side: Literal["in", "out"]) -> int:
    """The input or output width of a matmul module (nn.Linear stores [out, in], transformers' Conv1D [in, out])."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise UnsupportedModelError(f"{type(module).__name__} has no weight to read its width from")
    out, inp = (
        (weight.shape[0], weight.shape[1]) if isinstance(module, nn.Linear) else (weight.shape[1], weight.shape[0])
    )
    return int(inp if side == "in" else out)


def _norm_points(prefix: str, layer: int | None, norm: nn.Module, hidden: int, *, out: bool = False) -> list[Point]:
    found = [
        Point(f"{prefix}.hook_scale", layer, "norm", norm, (1,), "scale"),
        Point(f"{prefix}.hook_normalized", layer, "norm", norm, (hidden,), "normalized"),
    ]
    if out:
        found.append(Point(f"{prefix}.hook_out", layer, "norm", norm, (hidden,), "out"))
    return found


def _block(family: Family, net: nn.Module, i: int, layer: nn.Module, attention: nn.Module) -> list[Point]:
    """The points of decoder layer i, in the order the forward reaches them."""
    where = f"{family.name}: decoder layer {i}"
    heads, kv_heads = head_counts(net.config)
    output = child(attention, family.attention_output, "output projection", f"{where}'s attention")
    head_dim = _width(output, "in") // heads
    hidden = _width(output, "out")
    mlp = child(layer, family.mlp, "MLP module", where)
    mlp_out = child(mlp, family.mlp_out, "MLP output projection", f"{where}'s MLP")
    d_mlp = _width(mlp_out, "in")
    name = f"blocks.{i}"
    found = [Point(f"{name}.hook_resid_pre", i, "layer_in", layer, (hidden,))]
    found += _norm_points(f"{name}.ln1", i, child(layer, family.ln1, "norm", where), hidden)
    projections = [child(attention, p, "projection", f"{where}'s attention") for p in family.qkv]
    for k, (part, count) in enumerate((("q", heads), ("k", kv_heads), ("v", kv_heads))):
        module = projections[k] if len(projections) == 3 else projections[0]
        found.append(Point(f"{name}.attn.hook_{part}", i, "qkv", module, (count, head_dim), part))
    if family.rotary is not None:
        found.append(Point(f"{name}.attn.hook_rot_q", i, "attention", attention, (heads, head_dim), "rot_q"))
        found.append(Point(f"{name}.attn.hook_rot_k", i, "attention", attention, (kv_heads, head_dim), "rot_k"))
    for part in ("duration_bias", "attn_scores", "pattern"):
        found.append(Point(f"{name}.attn.hook_{part}", i, "attention", attention, (heads,), part, axis="pattern"))
    found.append(Point(f"{name}.attn.hook_z", i, "z", output, (heads, head_dim), "z"))
    found.append(Point(f"{name}.attn.hook_result", i, "result", output, (heads, hidden), "result"))
    sums = child(layer, family.attention_out_norm, "norm", where) if family.attention_out_norm else attention
    found.append(Point(f"{name}.hook_attn_out", i, "output", sums, (hidden,)))
    ln2 = child(layer, family.ln2, "norm", where) if family.ln2 else None
    if not parallel_blocks(net):
        if ln2 is None:
            raise UnsupportedModelError(f"{where}: a sequential layer without a norm before its MLP (family ln2)")
        found.append(Point(f"{name}.hook_resid_mid", i, "resid_mid", ln2, (hidden,), owner=layer))
    if ln2 is not None:
        found += _norm_points(f"{name}.ln2", i, ln2, hidden)
    first = child(mlp, family.mlp_in, "MLP input projection", f"{where}'s MLP")
    found.append(Point(f"{name}.mlp.hook_pre", i, "mlp_in", first, (d_mlp,), "pre"))
    if family.mlp_up is not None:
        up = child(mlp, family.mlp_up, "MLP input projection", f"{where}'s MLP")
        found.append(Point(f"{name}.mlp.hook_pre_linear", i, "mlp_in", up, (d_mlp,), "pre_linear"))
    found.append(Point(f"{name}.mlp.hook_post", i, "mlp_post", mlp_out, (d_mlp,), "post"))
    sums = child(layer, family.mlp_out_norm, "norm", where) if family.mlp_out_norm else mlp
    found.append(Point(f"{name}.hook_mlp_out", i, "output", sums, (hidden,)))
    found.append(Point(f"{name}.hook_resid_post", i, "output", layer, (hidden,)))
    return found


#: The points of each model's decoder layers and final norm, with the signature they were built
#: for (:func:`_signature`): :func:`points` reuses them while the signature holds. The embedding
#: points are built on every call: their owner is the model itself, which a kept reference
#: would keep alive.
_TABLES: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[Any, ...], list[Point]]] = weakref.WeakKeyDictionary()


def _signature(net: nn.Module) -> tuple[Any, ...]:
    """What the points of ``net`` are read from: every module below it (the objects, in order), its family,
    its head counts and whether its blocks are parallel; cheap to compare (modules by identity)."""
    return (
        tuple(m for m in net.modules() if m is not net),
        family_of(net),
        head_counts(net.config),
        parallel_blocks(net),
    )


def points(lm: Any) -> dict[str, Point]:
    """Every activation point of ``lm`` (a ContinuousLM or a transformers model) by name, in forward order.

    The points of the decoder layers and the final norm are built once per model and reused
    until a module of the model is replaced or added, or the config's family, head counts or
    block layout change.
    """
    net: Any = model_of(lm)
    family = family_of(net)
    embedding = net.get_input_embeddings()
    hidden = int(embedding.weight.shape[-1])
    base = getattr(net, "base_model", None)
    if not isinstance(base, nn.Module) or base is net:
        raise UnsupportedModelError(f"{family.name}: {type(net).__name__} has no base model to read its embeddings at")
    found = [Point("hook_embed", None, "embed", base, (hidden,), owner=net)]
    if family.position_table is not None:
        found.append(Point("hook_pos_embed", None, "pos_embed", base, (hidden,), owner=net))
    signature = _signature(net)
    kept = _TABLES.get(net)
    if kept is None or kept[0] != signature:
        layers: list[Point] = []
        for i, (layer, attention) in enumerate(zip(decoder_layers(net), attention_modules(net))):
            layers += _block(family, net, i, layer, attention)
        layers += _norm_points("ln_final", None, final_norm(net), hidden, out=True)
        kept = _TABLES[net] = (signature, layers)
    return {p.name: p for p in (*found, *kept[1])}


def hook_names(lm: Any) -> list[str]:
    """Every activation name of ``lm`` (a ContinuousLM or a transformers model), in the order the forward reaches them."""
    return list(points(lm))


_BLOCK = re.compile(r"^blocks\.([0-9]+)\.")


def _unknown(name: Any, known: dict[str, Point]) -> SignalError:
    layers = {p.layer for p in known.values() if p.layer is not None}
    tails = list(dict.fromkeys(_BLOCK.sub("", n) for n in known if _BLOCK.match(n)))
    return SignalError(
        f"no activation named {name!r}; the model has {len(layers)} layers, names are "
        f"blocks.{{i}}.{{{', '.join(tails)}}} for i in 0..{len(layers) - 1}, and "
        f"{', '.join(n for n in known if not _BLOCK.match(n))} (contllm.internals.hookpoints)"
    )


def point(lm: Any, name: str) -> Point:
    """The :class:`Point` named ``name``; SignalError naming the valid names for any other."""
    known = points(lm)
    if not isinstance(name, str) or name not in known:
        raise _unknown(name, known)
    return known[name]


def act_name(key: Any, layer: int | None = None, sub: str | None = None) -> str:
    """The full name of a short form: ``act_name("resid_post", 5)`` -> ``blocks.5.hook_resid_post``.

    key: a full name (returned as it is), a short form ("resid_pre", "attn_out", "q",
    "pattern", "z", "result", "pre", "post", "scale", "normalized", ...), or a tuple
    ``(short, layer)`` / ``(short, layer, "ln1" | "ln2")``. "scale" and "normalized"
    without a layer are the final norm's; "embed" and "pos_embed" have no layer.
    """
    if isinstance(key, tuple):
        if not 1 <= len(key) <= 3:
            raise SignalError(f"an activation key is (name, layer) or (name, layer, 'ln1' | 'ln2'), got {key!r}")
        return act_name(*key)
    if not isinstance(key, str):
        raise SignalError(f"an activation key is a name or a (name, layer) tuple, got {key!r}")
    if key.startswith(("blocks.", "hook_", "ln_final.")):
        return key
    if key in ("embed", "pos_embed"):
        return f"hook_{key}"
    if key in ("scale", "normalized"):
        return f"ln_final.hook_{key}" if layer is None else f"blocks.{layer}.{sub or 'ln1'}.hook_{key}"
    if key not in SHORT_NAMES:
        raise SignalError(
            f"unknown short activation name {key!r}; short names are "
            f"{', '.join([*SHORT_NAMES, 'embed', 'pos_embed', 'scale', 'normalized'])}"
        )
    if layer is None or isinstance(layer, bool) or not isinstance(layer, int):
        raise SignalError(f"{key!r} needs a layer: ({key!r}, layer)")
    return f"blocks.{layer}.{SHORT_NAMES[key]}"


def resolve_names(lm: Any, targets: Any, *, what: str = "names", known: dict[str, Point] | None = None) -> list[str]:
    """The activation names ``targets`` selects: a name, a short form, a predicate ``fn(name) -> bool``, or a list of them.

    Returns the names in forward order, each once; SignalError for an unknown name, for
    a predicate that selects nothing, or for a target of another kind (a number, None),
    the message naming the argument as ``what``. known: ``points(lm)`` where the caller
    has it already (a call that resolves many targets reads the model's points once).
    """
    known = points(lm) if known is None else known
    single = isinstance(targets, (str, tuple)) or callable(targets)
    if not single and (isinstance(targets, bytes) or not isinstance(targets, Iterable)):
        raise _bad_target(targets, what)
    items = [targets] if single else list(targets)
    chosen: set[str] = set()
    for item in items:
        if callable(item):
            picked = [n for n in known if item(n)]
            if not picked:
                raise SignalError(f"the predicate {getattr(item, '__name__', item)!r} selects no activation name")
            chosen.update(picked)
            continue
        if not isinstance(item, (str, tuple)):
            raise _bad_target(item, what)
        name = act_name(item)
        if name not in known:
            raise _unknown(name, known)
        chosen.add(name)
    return [n for n in known if n in chosen]


def _bad_target(target: Any, what: str) -> SignalError:
    shown = repr(target)
    shown = shown if len(shown) <= 60 else shown[:60] + "..."
    return SignalError(
        f"{what} must be an activation name, a short form such as ('resid_post', 0), a predicate "
        f"fn(name) -> bool, or a list of them; got {type(target).__name__} {shown}"
    )


def position_module(lm: Any) -> nn.Module:
    """The module at the family's position table path as the model holds it now (swapped while positions are continuous)."""
    net, family = model_and_family(lm)
    if family.position_table is None:
        raise UnsupportedModelError(f"{family.name} has no learned position table")
    return submodule(net, family.position_table, "position table", family)
