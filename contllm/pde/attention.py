"""Row dynamics inside a pretrained model's attention, through transformers' AttentionInterface.

:func:`pde_attention` registers nothing new on the model: it points the model's config at
an attention function registered once under :data:`IMPLEMENTATION` and restores the
previous implementation on exit (also when the body raises). That function calls the
family's own eager attention (scaling, softcapping, masks exactly as stock), takes the
weights it returns (after the softmax), lets each row of the layers and heads in scope
evolve by the :class:`~contllm.pde.dynamics.Dynamics` and multiplies the new weights
with the values. Where nothing changes (T = 0, a layer out of scope) it returns the
stock eager result untouched, so logits are bitwise those of the eager model.

A row's support is the set of keys whose mask value is above the dtype's minimum (the
causal mask, a sliding window, padding, or contllm's continuous-time mask); each key's
cell width is exp(mask value), the duration that contllm's mask carries as log(d_j), and
1 for every stock mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from contllm.core.attention import stock_eager, switched_attention
from contllm.core.families import attention_modules, head_counts, model_of
from contllm.pde.dynamics import Dynamics, DynamicsError

#: The name under which the attention function is registered with transformers.
IMPLEMENTATION = "contllm_pde"


@dataclass
class Binding:
    """What one attention module does while a :func:`pde_attention` context is open."""

    layer: int
    dynamics: Dynamics
    in_scope: bool
    head: int | None
    recorder: Any = None


_BINDINGS: dict[nn.Module, Binding] = {}


def row_support(mask: torch.Tensor | None, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Support [batch, 1 or heads, queries, keys] (bool) and cell widths (float64, or None for unit cells).

    mask: the additive float mask the attention function received (hidden keys hold the
    dtype's minimum), a bool mask (True: visible), or None (every key visible).
    """
    batch, _, queries, keys = weights.shape
    if mask is None:
        return torch.ones(1, 1, queries, keys, dtype=torch.bool, device=weights.device), None
    mask = mask[..., -queries:, :keys]
    if mask.dtype == torch.bool:
        return mask, None
    support = mask > torch.finfo(mask.dtype).min
    widths = torch.exp(torch.where(support, mask, torch.zeros((), dtype=mask.dtype)).to(torch.float64))
    return support, (None if bool(torch.all(widths == 1.0)) else widths)


def _repeat_heads(value: torch.Tensor, heads: int) -> torch.Tensor:
    """Values [batch, kv_heads, keys, dim] repeated for each query head sharing them (grouped queries)."""
    return value.repeat_interleave(heads // value.shape[1], dim=1) if value.shape[1] != heads else value


def pde_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered attention function: stock eager, then the bound dynamics on each row in scope."""
    eager = stock_eager(module)
    binding = _BINDINGS.get(module)
    changes = binding is not None and binding.in_scope and not binding.dynamics.identity
    if binding is None or (not changes and binding.recorder is None):
        return eager(module, query, key, value, attention_mask, **kwargs)
    output, weights = eager(module, query, key, value, attention_mask, **kwargs)
    support, widths = row_support(attention_mask, weights)
    if not changes:
        binding.recorder.add(binding.layer, weights.to(torch.float64), support)
        return output, weights
    heads = weights.shape[1]
    values = _repeat_heads(value, heads)
    if binding.head is None:
        new = binding.dynamics.apply(weights, support, widths)
        output = torch.matmul(new.to(value.dtype), values).transpose(1, 2).contiguous()
        full = new
    else:
        h = binding.head
        new = binding.dynamics.apply(weights[:, h : h + 1], support, widths)
        output = output.clone()
        output[:, :, h] = torch.matmul(new[:, 0].to(value.dtype), values[:, h])
        full = weights.to(torch.float64).clone()
        full[:, h] = new[:, 0]
    if binding.recorder is not None:
        binding.recorder.add(binding.layer, full, support)
    return output, full.to(weights.dtype)


AttentionInterface.register(IMPLEMENTATION, pde_attention_forward)
# Masks for this implementation are built like eager ones (additive, dtype minimum where hidden).
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _index(value: int | None, size: int, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
        raise DynamicsError(
            f"{what} {value!r} is outside the model; it has {size} ({what}s 0 to {size - 1}, or negative from the end)"
        )
    return value % size


@contextmanager
def pde_attention(
    model: Any,
    dynamics: Dynamics,
    *,
    layer: int | None = None,
    head: int | None = None,
    recorder: Any = None,
) -> Iterator[list[nn.Module]]:
    """Apply ``dynamics`` to the attention rows of ``model`` while the context lasts.

    model: a ContinuousLM or a transformers causal LM of a family with an eager attention.
    layer: one layer (negative from the end) or None for all; head: one head of each layer
        in scope, or None for all heads.
    recorder: an object with ``add(layer, weights, support)`` that sees every layer's rows
        after the dynamics (e.g. :class:`~contllm.pde.probes.AttentionRecorder`), or None.
    Yields the attention modules (in layer order). On exit the model's attention
    implementation is the one it had before, also when the body raises.
    """
    net = model_of(model)
    modules = attention_modules(net)
    heads, _ = head_counts(net)
    layer = _index(layer, len(modules), "layer")
    head = _index(head, heads, "head") if head is not None else None
    if any(m in _BINDINGS for m in modules):
        raise DynamicsError("attention dynamics are already active on this model; close that context first")
    try:
        for index, module in enumerate(modules):
            _BINDINGS[module] = Binding(index, dynamics, layer is None or layer == index, head, recorder)
        with switched_attention(net, modules, IMPLEMENTATION):
            yield modules
    finally:
        for module in modules:
            _BINDINGS.pop(module, None)
