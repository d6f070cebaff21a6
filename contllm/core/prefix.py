"""A prefix shared by a batch: computed once at batch size 1, attended by every row without copies.

Signals that agree on their first P tokens (same token or embedding, same duration, same
time) have the same keys and values there in every layer: the prefix runs once with
batch size 1 and its KV cache is kept (:class:`SharedPrefix`). The rest of each signal then
runs as one batch whose queries attend to the prefix keys and to their own keys.

Attention over the two parts is one softmax split in two: with scores s = q.k x scale
(softcapped where the family caps them) plus the continuous-time mask,

    out = (sum_prefix e^(s - m) v + sum_own e^(s - m) v) / (sum_prefix e^(s - m) + sum_own e^(s - m)),

m the largest score of the row over both parts. The prefix keys keep batch size 1: the
scores against them are one matrix product of every row's queries with the same keys,
and no copy of the prefix is made per row (repeating a cached prefix along the batch
copies prefix x rows keys in every layer, and grouped-query attention copies them again
per query head). The function is registered with transformers' ``AttentionInterface``
under :data:`IMPLEMENTATION` and reached through the keyword argument ``contllm_prefix``,
which transformers passes from ``model(...)`` to every attention call; it runs in float32
(float64 for a float64 model) whatever the model's dtype and returns the query's dtype.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from contllm.core.attention import attention_modules
from contllm.core.forward import SHARED_PREFIX, forward_batch
from contllm.core.forward import SharedKeys as SharedKeys  # re-exported: the keys this module computes and attends
from contllm.core.forward import shared_attention as shared_attention  # re-exported
from contllm.core.signal import Signal, pad_signals
from contllm.errors import UnsupportedModelError

#: The name under which the shared-prefix attention is registered with transformers.
IMPLEMENTATION = SHARED_PREFIX


@dataclass
class SharedPrefix:
    """A shared prefix run once with batch size 1: its source signal, its length, its keys and their time origin.

    origin: the time subtracted from the prefix's position ids (see
    :func:`contllm.core.forward.forward_batch`); every row
    that attends to these keys must use the same one.
    """

    source: Signal
    length: int
    keys: SharedKeys
    origin: float = 0.0

    @classmethod
    def compute(cls, lm: Any, source: Signal, length: int, origin: float = 0.0) -> SharedPrefix:
        """Run the first ``length`` tokens of ``source`` (positions moved by ``origin``) and keep every layer's keys and values."""
        head = slice_signal(source, 0, length)
        # No position of the prefix is read: project none of them onto the vocabulary.
        no_columns = torch.empty(0, dtype=torch.long, device=lm.device)
        _, context = forward_batch(lm, pad_signals([head]), logits_to_keep=no_columns, use_cache=True, origin=origin)
        assert context is not None
        modules = attention_modules(lm.model)
        layers = context.cache.layers
        if len(layers) != len(modules):
            raise UnsupportedModelError(
                f"the KV cache has {len(layers)} layers for {len(modules)} attention modules; "
                "a shared prefix needs one per module - use Engine(lm, prefix_cache=False)"
            )
        for index, layer in enumerate(layers):
            kept = layer.get_seq_length()
            if type(layer) is not DynamicLayer or kept != length:
                raise UnsupportedModelError(
                    f"layer {index} of the KV cache ({type(layer).__name__}) keeps {kept} of the {length} prefix keys; "
                    "a shared prefix needs every key kept - use Engine(lm, prefix_cache=False)"
                )
        keys = SharedKeys(
            {m: (layer.keys, layer.values) for m, layer in zip(modules, layers)}, context.times, context.durations
        )
        return cls(source, length, keys, origin)

    def serves(self, signal: Signal, length: int, lm: Any) -> bool:
        """Whether this prefix is the first ``length`` tokens of ``signal``."""
        return length == self.length and bool(same_tokens([self.source, signal], length, lm).all().item())


#: Attention modules whose calls on a shared prefix another function serves while it is set here: {module: a
#: function of :func:`shared_prefix_attention`'s arguments}. :mod:`contllm.internals.hooked_attention` sets it for
#: the modules of a hooks context, whose points inside attention must see these calls; it computes with
#: :func:`attend_shared` where a module has none.
ROUTED: weakref.WeakKeyDictionary[nn.Module, Callable[..., tuple[torch.Tensor, Any]]] = weakref.WeakKeyDictionary()


def shared_prefix_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """The registered function: :func:`attend_shared`, or the function :data:`ROUTED` gives ``module``."""
    return ROUTED.get(module, attend_shared)(module, query, key, value, attention_mask, **kwargs)


def attend_shared(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    contllm_prefix: SharedKeys | None = None,
    scaling: float | None = None,
    softcap: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of a batch over a shared prefix and its own keys.

    query: [batch, heads, width, head_dim]; key, value: [batch, kv_heads, width, head_dim]
    (this batch's own tokens); attention_mask: float [batch, 1, width, prefix + width]
    (the continuous-time mask over prefix and own keys). Returns [batch, width, heads,
    head_dim] in the query's dtype.
    """
    if contllm_prefix is None:
        raise UnsupportedModelError(f"{IMPLEMENTATION} attention called without contllm_prefix")
    if dropout or any(kwargs.get(name) is not None for name in ("head_mask", "s_aux", "position_bias")):
        raise UnsupportedModelError(
            f"{type(module).__name__}: the shared-prefix attention takes no dropout, head mask or sinks"
        )
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 4:
        raise UnsupportedModelError("the shared-prefix attention needs the 4D continuous-time mask")
    prefix_keys, prefix_values = contllm_prefix.layers[module]
    dtype = query.dtype
    work = torch.promote_types(dtype, torch.float32)  # float32, or float64 for a float64 model
    batch, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    length = prefix_keys.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    # Query heads grouped under the key head they read: [kv_heads, batch, group, width, dim].
    q = query.to(work).view(batch, kv_heads, group, width, dim).transpose(0, 1)
    mask = attention_mask.to(work)[:, 0][None, :, None]  # [1, batch, 1, width, prefix + width]

    rows = q.reshape(kv_heads, batch * group * width, dim)
    shared = torch.bmm(rows, prefix_keys[0].to(work).transpose(1, 2)).view(kv_heads, batch, group, width, length)
    own = torch.matmul(q.reshape(kv_heads, batch, group * width, dim), key.to(work).transpose(0, 1).transpose(2, 3))
    own = own.view(kv_heads, batch, group, width, width)
    total = None
    if torch.is_grad_enabled():
        # A forward that records its graph (gradients by the rows' own inputs): the same steps out of place, and
        # the softmax over both parts at once.
        parts = []
        for scores, part in ((shared, mask[..., :length]), (own, mask[..., length:])):
            scores = scores * scale
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            parts.append(scores + part)
        weights = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
        shared, own = weights[..., :length], weights[..., length:]
    else:
        for scores, part in ((shared, mask[..., :length]), (own, mask[..., length:])):
            scores.mul_(scale)
            if softcap is not None:
                scores.div_(softcap).tanh_().mul_(softcap)
            scores.add_(part)
        top = torch.maximum(shared.amax(-1, keepdim=True), own.amax(-1, keepdim=True))
        shared.sub_(top).exp_()
        own.sub_(top).exp_()
        total = shared.sum(-1, keepdim=True) + own.sum(-1, keepdim=True)
    out = torch.bmm(shared.reshape(kv_heads, batch * group * width, length), prefix_values[0].to(work))
    out = out.view(kv_heads, batch, group, width, dim)
    own_values = value.to(work).transpose(0, 1)
    out += torch.matmul(own.reshape(kv_heads, batch, group * width, width), own_values).view_as(out)
    if total is not None:
        out /= total
    # [kv_heads, batch, group, width, dim] -> [batch, width, heads, dim], heads ordered (kv head, group).
    return out.permute(1, 3, 0, 2, 4).reshape(batch, width, heads, dim).to(dtype), None


AttentionInterface.register(IMPLEMENTATION, shared_prefix_attention)
# Masks are always given in 4D; should transformers build one, it is additive like eager's.
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def model_state(lm: Any, settings: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """What a kept shared prefix depends on: compared with ``==``, it differs after any change the engine can see.

    Every parameter and buffer of the model (the tensor object itself, so that a
    replaced one never matches by a recycled id, and its in-place version counter), every
    module that carries forward hooks or an instance-level ``forward`` (with the hooks'
    handles and the override), torch's global forward hooks, the model's attention
    implementation, dtype and device, and ``settings`` (the engine's own).
    """
    model = lm.model
    tensors = tuple((t, t._version) for t in (*model.parameters(), *model.buffers()))
    hooked = tuple(
        (m, tuple(m._forward_hooks), tuple(m._forward_pre_hooks), m.__dict__.get("forward"))
        for m in model.modules()
        if m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__
    )
    hooks_everywhere = (
        tuple(torch.nn.modules.module._global_forward_hooks),
        tuple(torch.nn.modules.module._global_forward_pre_hooks),
    )
    where = (getattr(model.config, "_attn_implementation", None), lm.dtype, str(lm.device))
    return (_Identity(tensors), _Identity(hooked), hooks_everywhere, where, settings)


class _Identity:
    """A tuple compared element by element with ``is`` for objects and ``==`` for the rest (tensors have no plain ``==``)."""

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and _same(self.items, other.items)

    __hash__ = None  # type: ignore[assignment]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (torch.Tensor, torch.nn.Module)) or callable(a):
        return a is b
    return bool(a == b)


def shared_prefix_len(signals: Sequence[Signal], lm: Any, *, before: int | None = None) -> int:
    """Tokens at the start that every signal shares (token, duration and time), leaving each at least one more.

    before: the prefix ends at or before this token index (the first one read), or None.
    """
    limit = min(len(s) for s in signals) - 1
    if before is not None:
        limit = min(limit, before)
    if limit <= 0:
        return 0
    same = same_tokens(signals, limit, lm)
    return int(same.long().cumprod(0).sum())


def same_tokens(signals: Sequence[Signal], limit: int, lm: Any) -> torch.Tensor:
    """bool [limit]: token i (i < limit) is the same input in every signal."""
    durations = torch.stack([s.durations[:limit] for s in signals])
    times = torch.stack([s.times[:limit] for s in signals])
    same = (durations == durations[:1]).all(0) & (times == times[:1]).all(0)
    if all(s.embeds is None for s in signals):
        ids = torch.stack([s.token_ids[:limit] for s in signals])  # type: ignore[index]
        return same & (ids == ids[:1]).all(0)
    # Compare what the model will see: embeddings in its state dtype, given or looked up.
    embedding = lm.model.get_input_embeddings()
    rows = []
    for s in signals:
        if s.embeds is not None:
            rows.append(s.embeds[:limit].to(device=lm.device, dtype=lm.state_dtype))
        else:
            assert s.token_ids is not None
            rows.append(embedding(s.token_ids[:limit].to(lm.device)).to(lm.state_dtype))
    stacked = torch.stack(rows)
    return same & (stacked == stacked[:1]).all(0).all(-1).cpu()


def slice_signal(signal: Signal, lo: int, hi: int | None = None) -> Signal:
    """Tokens [lo, hi) of ``signal`` (hi None: to its end), at their own times."""
    hi = len(signal) if hi is None else hi
    return Signal(
        durations=signal.durations[lo:hi],
        token_ids=None if signal.token_ids is None else signal.token_ids[lo:hi],
        embeds=None if signal.embeds is None else signal.embeds[lo:hi],
        explicit_times=signal.times[lo:hi],
    )
