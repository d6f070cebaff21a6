"""The hooked attention function: eager attention with hook points between its steps.

The attention points of :mod:`contllm.internals.hookpoints` (``hook_rot_q``, ``hook_rot_k``,
``hook_duration_bias``, ``hook_attn_scores``, ``hook_pattern``) live inside the attention
function, which transformers calls with the queries and keys after the rotary embedding,
the values and the additive mask. While :func:`contllm.internals.intervention.hooks` has one of them
hooked, the model runs :func:`hooked_attention_forward`, registered with transformers'
``AttentionInterface`` under :data:`IMPLEMENTATION`: the eager computation (softmax of
q.k x scale, softcapped where the family caps, plus the continuous-time mask) in float32 at
least, with the hooks between its steps, on the layers with hooks; every other layer runs
the implementation it had (eager, sdpa, or contllm's float32 state wrapping one of them).
In a hooked forward on a shared prefix (:mod:`contllm.internals.prefixed`) the rows after the
prefix run :func:`hooked_prefix_attention`, the same computation over the prefix's keys and
their own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from contllm.core.attention import stock_eager, switched_attention
from contllm.core.families import attention_modules
from contllm.core.prefix import ROUTED, attend_shared
from contllm.errors import UnsupportedModelError
from contllm.internals.hookpoints import Point
from contllm.internals.prefixed import layout_of

__all__ = ["IMPLEMENTATION", "hooked_attention_forward", "hooked_prefix_attention", "install", "underlying"]

#: The name under which the hooked attention function is registered with transformers.
IMPLEMENTATION = "contllm_hooks"


#: apply(point, value) -> the value after the point's hooks.
Apply = Callable[[Point, torch.Tensor], torch.Tensor]


@dataclass(eq=False)
class _AttentionHooks:
    """The attention points of one hooks context on one attention module, and the implementation it had before."""

    apply: Apply
    parts: dict[str, Point]
    original: str
    net: nn.Module


#: The hooks on each attention module, outermost context first; entries leave with their context.
_SITES: weakref.WeakKeyDictionary[nn.Module, list[_AttentionHooks]] = weakref.WeakKeyDictionary()


def _apply_attention(entries: list[_AttentionHooks], part: str, value: torch.Tensor) -> torch.Tensor:
    for entry in entries:
        if part in entry.parts:
            value = entry.apply(entry.parts[part], value)
    return value


def _heads_last(entries: list[_AttentionHooks], part: str, x: torch.Tensor) -> torch.Tensor:
    """Apply ``part``'s hooks to [batch, heads, pos, d] values in TransformerLens's [batch, pos, heads, d] layout."""
    if not any(part in e.parts for e in entries):
        return x
    return _apply_attention(entries, part, x.transpose(1, 2)).transpose(1, 2)


def hooked_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered attention function: eager attention with the hook points between its steps.

    query [batch, heads, q, d], key and value [batch, kv_heads, k, d] as the family's attention
    module passes them (rotary applied); ``attention_mask`` the additive continuous-time
    mask. A module without attention hooks runs the implementation it had instead.
    """
    entries = _SITES.get(module)
    if not entries:
        raise UnsupportedModelError(f"{type(module).__name__} has no attention hooks registered for {IMPLEMENTATION}")
    if not any(e.parts for e in entries):
        original = entries[0].original
        function = (
            stock_eager(module)
            if original == "eager"
            else ALL_ATTENTION_FUNCTIONS.get_interface(original, stock_eager(module))
        )
        return function(module, query, key, value, attention_mask, **kwargs)
    work = torch.promote_types(query.dtype, torch.float32)
    q = _heads_last(entries, "rot_q", query.to(work))
    k = _heads_last(entries, "rot_k", key.to(work))
    return _attend(entries, module, query.dtype, q, k, value.to(work), attention_mask, kwargs)


def hooked_prefix_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """The hooked attention of the rows after a shared prefix (:data:`contllm.core.prefix.ROUTED` while hooks are on).

    Takes :func:`contllm.core.prefix.shared_prefix_attention`'s arguments: the rows' own
    queries, keys and values [batch, heads, width, d], the prefix's keys and values in
    ``contllm_prefix`` and the mask over [prefix, own] keys. The eager computation of
    :func:`hooked_attention_forward` runs over every key of the full batch in its columns'
    order, and each point's hooks get the full batch's value (:class:`~contllm.internals.prefixed.Layout`).
    A module without attention hooks runs the plain shared-prefix attention.
    """
    entries = _SITES.get(module)
    if not entries or not any(e.parts for e in entries):
        return attend_shared(module, query, key, value, attention_mask, **kwargs)
    layout = layout_of(entries[0].net)
    prefix = kwargs.pop("contllm_prefix", None)
    if layout is None or layout.recording or prefix is None or not isinstance(attention_mask, torch.Tensor):
        raise UnsupportedModelError(
            f"{type(module).__name__}: attention hooks on a shared prefix run only in a hooked forward of one"
        )
    prefix_keys, prefix_values = prefix.layers[module]
    work = torch.promote_types(query.dtype, torch.float32)
    q = _heads_last(entries, "rot_q", query.to(work))
    k = layout.keys(prefix_keys.to(work), _heads_last(entries, "rot_k", key.to(work)))
    v = layout.keys(prefix_values.to(work), value.to(work))
    return _attend(entries, module, query.dtype, q, k, v, layout.mask(attention_mask), kwargs)


def _attend(
    entries: list[_AttentionHooks],
    module: nn.Module,
    dtype: torch.dtype,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: Any,
    kwargs: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention of queries ``q`` [batch, heads, q, d] over keys and values ``k``, ``v`` [batch, kv_heads, k, d]
    in the working dtype, with the hooks of the duration biases, scores and pattern; the output in ``dtype``."""
    work = q.dtype
    groups = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    # Older transformers leave GPT-2's scale to its eager function: 1 / sqrt(head_dim) by default.
    scaling = kwargs.get("scaling") or getattr(module, "scaling", None) or q.shape[-1] ** -0.5
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        # A float64 or half mask keeps its minimum finite in the working dtype.
        bias = attention_mask.to(work).clamp_min(torch.finfo(work).min)
        if any("duration_bias" in e.parts for e in entries):
            bias = _apply_attention(entries, "duration_bias", bias.expand(-1, scores.shape[1], -1, -1).clone())
        scores = scores + bias
    scores = _apply_attention(entries, "attn_scores", scores)
    pattern = _apply_attention(entries, "pattern", torch.softmax(scores, dim=-1))
    dropout = float(kwargs.get("dropout") or 0.0)
    mixed = nn.functional.dropout(pattern, p=dropout, training=module.training) if dropout else pattern
    out = torch.matmul(mixed, values).transpose(1, 2).contiguous()
    return out.to(dtype), pattern.to(dtype)


AttentionInterface.register(IMPLEMENTATION, hooked_attention_forward)
# Masks for this implementation are built like eager ones (additive).
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _leave(module: nn.Module, entry: _AttentionHooks) -> None:
    entries = [e for e in _SITES.get(module, []) if e is not entry]
    _SITES[module] = entries
    if not entries:
        _SITES.pop(module, None)
        ROUTED.pop(module, None)


def underlying(net: nn.Module) -> str | None:
    """The attention implementation ``net`` runs: the one it had before a hooks context switched it to
    :data:`IMPLEMENTATION` (None where its modules had different ones), else its own."""
    current = getattr(net.config, "_attn_implementation", None)
    if current != IMPLEMENTATION:
        return current
    found = {entries[0].original for m in attention_modules(net) if (entries := _SITES.get(m))}
    return found.pop() if len(found) == 1 else None


def install(apply: Apply, by_module: dict[nn.Module, dict[str, Point]], stack: ExitStack, net: nn.Module) -> None:
    """Register the attention points ({attention module: {part: point}}) and point ``net`` at the hooked
    attention function until ``stack`` closes; every other attention module runs the implementation it had."""
    modules = attention_modules(net)
    current = getattr(net.config, "_attn_implementation", None) or "eager"
    for module in modules:
        entries = _SITES.setdefault(module, [])
        original = entries[0].original if current == IMPLEMENTATION and entries else current
        entry = _AttentionHooks(apply, by_module.get(module, {}), original, net)
        entries.append(entry)
        ROUTED[module] = hooked_prefix_attention
        stack.callback(_leave, module, entry)
    if current != IMPLEMENTATION:
        stack.enter_context(switched_attention(net, modules, IMPLEMENTATION))
