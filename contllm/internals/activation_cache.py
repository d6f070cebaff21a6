"""The activations of one forward, and the helpers that take the residual stream apart.

An :class:`ActivationCache` holds, per name and signal, the values
:func:`contllm.internals.activations.run_with_cache` kept at the read positions (float64 for a
float64 model, float32 otherwise, on the CPU until :meth:`~ActivationCache.to` moves them). It
is indexed by full name or by TransformerLens's short forms (``cache["resid_post", 5]``, a
negative layer counting from the last), ``keys()``, ``items()`` and iteration give its names,
and its helpers return stacks of components with their labels, as TransformerLens's do:

- :meth:`~ActivationCache.stack_activation`: one activation of every layer, stacked;
- :meth:`~ActivationCache.accumulated_resid`: the residual stream before each layer (and
  after the last), [components, batch, k, hidden];
- :meth:`~ActivationCache.decompose_resid`: the embeddings and every attention and MLP
  output, whose sum is the residual stream;
- :meth:`~ActivationCache.stack_head_results`: every head's write to the residual stream;
- :meth:`~ActivationCache.apply_ln_to_stack`: a stack through a norm with the scale this
  forward had (linear, so components still add up);
- :meth:`~ActivationCache.logit_lens`: each layer's residual stream through the final norm
  and the unembedding.

Signals of different token counts give rows of different lengths. ``cache[name]`` then
pads them on the left with zeros, as the forward's own batch is padded: [batch, k_max, ...]
with signal b's k_b rows last, and for patterns, scores and duration biases
[batch, heads, k_max, tokens_max] with queries and keys both padded on the left (so key j of
signal b sits at column tokens_max - tokens_b + j, where a hook function sees it).
:attr:`~ActivationCache.real` marks the rows that hold a read position; every helper keeps
padding at 0; ``cache.rows(name)`` gives each signal's values without padding.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView
from dataclasses import dataclass, field
from typing import Any

import torch

from contllm.core.engine import evaluation
from contllm.core.families import decoder_layers, family_of, final_norm, head_counts, model_of, parallel_blocks
from contllm.errors import SignalError
from contllm.internals.hookpoints import act_name, point

__all__ = ["ActivationCache", "pad_rows", "unembed"]

Stack = torch.Tensor | tuple[torch.Tensor, list[str]]

#: The points whose values are [heads, query, key] per signal (the others are [k, *shape]).
PATTERN_POINTS = ("attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_duration_bias")


def pad_rows(rows: list[torch.Tensor], pattern: bool = False) -> torch.Tensor:
    """One tensor per signal stacked into [batch, ...], ragged ones padded on the left with zeros.

    Per-position values [k_i, *shape] -> [batch, k_max, *shape]; with ``pattern``,
    [heads, k_i, tokens_i] -> [batch, heads, k_max, tokens_max] (queries and keys padded).
    """
    if all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    dims = (1, 2) if pattern else (0,)
    full = list(rows[0].shape)
    for d in dims:
        full[d] = max(int(r.shape[d]) for r in rows)
    out = rows[0].new_zeros((len(rows), *full))
    for b, r in enumerate(rows):
        if any(r.shape[d] != full[d] for d in range(r.ndim) if d not in dims):
            raise SignalError(f"the signals' values have shapes that padding cannot join ({tuple(r.shape)})")
        where = tuple(slice(full[d] - r.shape[d], None) if d in dims else slice(None) for d in range(r.ndim))
        out[b][where] = r
    return out


def unembed(lm: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [..., vocab] (float32, on the device of ``hidden``) of residual-stream values [..., hidden] through
    the final norm and head.

    Gemma's final logit softcap is applied where the config has one; a half-precision
    model reads through the engine's float32 state.
    """
    model = lm.model
    with torch.no_grad(), evaluation(lm):
        x = final_norm(model)(hidden.to(device=lm.device, dtype=lm.state_dtype))
        head = model.get_output_embeddings()
        logits = head(x.to(head.weight.dtype)).float()
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits.to(hidden.device)


@dataclass
class ActivationCache:
    """Activations read by :func:`~contllm.internals.activations.run_with_cache`, per signal.

    values: {name: one tensor per signal}: [k_i, *shape] for per-position points (shape as
        :mod:`contllm.internals.hookpoints` lists it), [heads, k_i, tokens_i] for patterns, scores and
        duration biases (queries at the read positions, keys over the whole signal); float64
        for a float64 model, float32 otherwise.
    positions: the token indices read of each signal (k_i of them, in [0, tokens_i)).
    times: float64 [k_i] per signal, the time of each read position.
    logits: [k_i, vocab] per signal at the read positions, in the dtype ``lm.logits`` gives.
    lm: the model that ran (the helpers read its norms and unembedding), or None.
    has_batch_dim: False after :meth:`remove_batch_dim`: ``cache[name]`` is then the one
        signal's values, without the batch dimension (TransformerLens's attribute).
    """

    values: dict[str, list[torch.Tensor]]
    positions: list[list[int]]
    times: list[torch.Tensor]
    logits: list[torch.Tensor]
    lm: Any = field(default=None, repr=False, compare=False)
    has_batch_dim: bool = field(default=True, compare=False)

    def __repr__(self) -> str:
        shown = ", ".join(list(self.values)[:4]) + (", ..." if len(self.values) > 4 else "")
        return f"ActivationCache({len(self)} signals, {len(self.values)} names: {shown})"

    def __contains__(self, name: object) -> bool:
        try:
            return self._name(name) in self.values
        except SignalError:
            return False

    def __len__(self) -> int:
        """The number of signals (TransformerLens's ``len(cache)`` counts names: use ``len(cache.names)``)."""
        return len(self.positions)

    def __iter__(self) -> Iterator[str]:
        """The cached names, in forward order (as TransformerLens's cache iterates its keys)."""
        return iter(self.values)

    @property
    def names(self) -> list[str]:
        return list(self.values)

    def keys(self) -> KeysView[str]:
        """The cached names, in forward order."""
        return self.values.keys()

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """(name, ``cache[name]``) for every cached name, in forward order (ragged batches padded, see the module)."""
        return [(name, self[name]) for name in self.values]

    def _name(self, key: Any) -> str:
        """The full name of ``key``; a negative layer in a short form counts from the last layer (needs the model)."""
        if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[1], int) and not isinstance(key[1], bool):
            if key[1] < 0:
                count = self._count()
                if key[1] < -count:
                    raise SignalError(f"layer {key[1]} is outside the model's {count} layers")
                key = (key[0], key[1] + count, *key[2:])
        return act_name(key)

    def __getitem__(self, key: Any) -> torch.Tensor:
        """``key`` (a name or a short form such as ``("resid_post", 5)``) for every signal, stacked: [batch, k, ...].

        Rows of different lengths are padded on the left with zeros (module docstring;
        :attr:`real` marks the real rows); after :meth:`remove_batch_dim`, the one signal's
        values without the batch dimension.
        """
        name = self._name(key)
        rows = self.rows(name)
        if not self.has_batch_dim:
            return rows[0]
        return pad_rows(rows, pattern=name.endswith(PATTERN_POINTS))

    def rows(self, key: Any) -> list[torch.Tensor]:
        """``key`` as one tensor per signal, without padding; SignalError naming the cached names for any other."""
        name = self._name(key)
        if name not in self.values:
            raise SignalError(f"{name!r} was not cached; this cache holds {', '.join(self.values) or 'nothing'}")
        return self.values[name]

    @property
    def real(self) -> torch.Tensor:
        """bool [batch, k_max] ([k] without the batch dimension): True where ``cache[name]`` holds a read position of
        the signal, False at the left padding of a shorter one."""
        counts = [len(p) for p in self.positions]
        width = max(counts)
        mask = torch.arange(width)[None, :] >= torch.tensor([width - k for k in counts])[:, None]
        return mask if self.has_batch_dim else mask[0]

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch dimension of a one-signal cache (TransformerLens's): ``cache[name]`` is then [k, ...].

        The helpers' stacks lose it too ([components, k, hidden]). Changes this cache and
        returns it; SignalError for a cache of several signals.
        """
        if len(self) != 1:
            raise SignalError(f"remove_batch_dim needs a cache of one signal; this one holds {len(self)}")
        self.has_batch_dim = False
        return self

    def to(self, device: str | torch.device) -> ActivationCache:
        """Move every cached value, logit and time to ``device`` (TransformerLens's ``cache.to``); returns this cache.

        The helpers then compute on that device (the model's norms and unembedding are read
        on the model's device and their results moved).
        """
        where = torch.device(device)
        self.values = {name: [r.to(where) for r in rows] for name, rows in self.values.items()}
        self.logits = [r.to(where) for r in self.logits]
        self.times = [r.to(where) for r in self.times]
        return self

    # ------------------------------------------------------------------ the residual stream
    def _model(self) -> Any:
        if self.lm is None:
            raise SignalError("this cache holds no model; build it with run_with_cache(lm, ...)")
        return self.lm

    def _count(self) -> int:
        return len(decoder_layers(self._model()))

    def _last(self, layer: int | None) -> int:
        """The layer a helper stops before: None and -1 mean after the last one (TransformerLens's convention)."""
        count = self._count()
        last = count if layer is None or layer == -1 else layer
        if not 0 <= last <= count:
            raise SignalError(f"layer {layer} is outside the model's {count} layers")
        return last

    def _stack(self, parts: list[tuple[str, Any]], return_labels: bool) -> Stack:
        stacked = torch.stack([self[key] if not isinstance(key, torch.Tensor) else key for _, key in parts])
        return (stacked, [label for label, _ in parts]) if return_labels else stacked

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None) -> torch.Tensor:
        """``activation_name`` (a short form: "z", "pattern", "resid_post", "scale", ...) of every layer before
        ``layer`` (-1 or None: every layer), stacked: [layers, *the value's shape] (TransformerLens's).

        sublayer_type: "ln1" or "ln2" for the norms' "scale" and "normalized". SignalError for a
        layer outside the model, layer 0 (nothing to stack) or a name not cached.
        """
        last = self._last(layer)
        if last == 0:
            raise SignalError(
                "stack_activation(layer=0) stacks no layer; give a layer from 1 up, or -1 for every layer"
            )
        keys = [
            (activation_name, i) if sublayer_type is None else (activation_name, i, sublayer_type) for i in range(last)
        ]
        return torch.stack([self[k] for k in keys])

    def accumulated_resid(
        self, layer: int | None = None, *, incl_mid: bool = False, apply_ln: bool = False, return_labels: bool = False
    ) -> Stack:
        """The residual stream entering layers 0..``layer`` (None: every layer, then after the last one).

        Returns [components, batch, k, hidden] (with labels "0_pre", "0_mid", ..., "final_post"
        when ``return_labels``); incl_mid adds each layer's ``hook_resid_mid`` between its
        attention and MLP; apply_ln puts the stack through the final norm's scale of this
        forward (:meth:`apply_ln_to_stack`). Needs those names in the cache.
        """
        count = self._count()
        last = self._last(layer)
        parts: list[tuple[str, Any]] = []
        for i in range(last + 1):
            if i == count:
                parts.append(("final_post", ("resid_post", count - 1)))
                continue
            parts.append((f"{i}_pre", ("resid_pre", i)))
            if incl_mid and i < last:
                parts.append((f"{i}_mid", ("resid_mid", i)))
        out = self._stack(parts, return_labels)
        return self._ln(out, apply_ln)

    def decompose_resid(
        self,
        layer: int | None = None,
        *,
        mlp_input: bool = False,
        mode: str = "all",
        incl_embeds: bool = True,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Stack:
        """The parts whose sum is the residual stream entering ``layer`` (None or -1: after the last layer).

        Components: "embed" (and "pos_embed" for learned positions) unless ``incl_embeds`` is
        False, then "{i}_attn_out" and "{i}_mlp_out" for every earlier layer; mlp_input adds
        the layer's own "{layer}_attn_out" (the MLP's input, sequential families only); mode
        "attn" or "mlp" keeps only the attention or only the MLP outputs (TransformerLens's;
        "all" by default). Returns [components, batch, k, hidden] (and the labels). Needs the
        attention and MLP outputs in the cache, and ``hook_embed`` and ``hook_pos_embed`` for
        learned positions, ``blocks.0.hook_resid_pre`` for the others: "embed" is what enters
        the first layer (the embeddings with any scale the model applies to them, as Gemma's
        base model does in some transformers releases).
        """
        lm = self._model()
        count = self._count()
        last = self._last(layer)
        if mode not in ("all", "attn", "mlp"):
            raise SignalError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        if mlp_input and (last == count or parallel_blocks(lm)):
            raise SignalError("mlp_input needs a layer of a sequential family (its MLP reads resid_mid)")
        parts: list[tuple[str, Any]] = []
        if incl_embeds:
            if family_of(model_of(lm)).position_table is not None:
                parts += [("embed", "hook_embed"), ("pos_embed", "hook_pos_embed")]
            else:
                parts.append(("embed", ("resid_pre", 0)))
        for i in range(last):
            if mode != "mlp":
                parts.append((f"{i}_attn_out", ("attn_out", i)))
            if mode != "attn":
                parts.append((f"{i}_mlp_out", ("mlp_out", i)))
        if mlp_input and mode != "mlp":
            parts.append((f"{last}_attn_out", ("attn_out", last)))
        if not parts:
            raise SignalError("decompose_resid has no component to stack (no layer before this one, no embeddings)")
        return self._ln(self._stack(parts, return_labels), apply_ln)

    def stack_head_results(
        self,
        layer: int | None = None,
        *,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Stack:
        """Every head's write to the residual stream in layers before ``layer`` (None or -1: all): [layers x heads, batch, k, hidden].

        Labels "L{i}H{h}"; incl_remainder adds "remainder", the residual stream entering
        ``layer`` (after the last layer for None) minus every head's result. Needs
        ``attn.hook_result`` of those layers (and the residual stream for the remainder).
        """
        count = self._count()
        last = self._last(layer)
        heads = head_counts(self._model())[0]
        parts: list[tuple[str, Any]] = []
        for i in range(last):
            result = self[("result", i)]  # [batch, k, heads, hidden] ([k, heads, hidden] without the batch dimension)
            parts += [(f"L{i}H{h}", result.select(-2, h)) for h in range(heads)]
        if not parts and not incl_remainder:
            raise SignalError(
                "stack_head_results(layer=0) stacks no head; give a layer from 1 up, or -1 for every layer"
            )
        if incl_remainder:
            resid = self[("resid_post", count - 1)] if last == count else self[("resid_pre", last)]
            total = torch.stack([t for _, t in parts]).sum(0) if parts else torch.zeros_like(resid)
            parts.append(("remainder", resid - total))
        return self._ln(self._stack(parts, return_labels), apply_ln)

    def apply_ln_to_stack(
        self, stack: torch.Tensor, layer: int | None = None, *, mlp_input: bool = False
    ) -> torch.Tensor:
        """``stack`` [..., batch, k, hidden] through a norm of this forward, linearly: the components still add up.

        layer None: the final norm; otherwise layer ``layer``'s ln1 (ln2 with ``mlp_input``).
        Each component is centred (LayerNorm families), divided by the norm's scale at that
        position in this forward (``hook_scale``, which must be cached) and multiplied by the
        norm's weight; the norm's bias (LayerNorm) belongs to no component and is left out.
        Padding rows of a ragged batch (scale 0) stay 0. Computed in the stack's dtype
        (float32 at least) on its device.
        """
        lm = self._model()
        key = "scale" if layer is None else ("scale", layer, "ln2" if mlp_input else "ln1")
        scale = self[key]  # [batch, k, 1]
        family = family_of(model_of(lm))
        norm = point(lm, act_name(key)).module
        x = stack.to(torch.promote_types(stack.dtype, torch.float32))
        if family.norm_kind == "layer":
            x = x - x.mean(-1, keepdim=True)
        weight: Any = norm.weight
        weight = weight.detach().to(device=x.device, dtype=x.dtype) + family.norm_offset
        scale = scale.to(device=x.device, dtype=x.dtype)
        padding = scale == 0  # a real position's scale is sqrt(variance + eps) > 0
        return torch.where(padding, torch.zeros_like(x), x / scale.masked_fill(padding, 1.0) * weight)

    def _ln(self, out: Stack, apply_ln: bool) -> Stack:
        if not apply_ln:
            return out
        if isinstance(out, tuple):
            return self.apply_ln_to_stack(out[0]), out[1]
        return self.apply_ln_to_stack(out)

    def logit_lens(self, *, return_labels: bool = False) -> Stack:
        """Logits [layers + 1, batch, k, vocab] of the residual stream entering each layer and leaving the last,
        each through the final norm (with its own scale) and the unembedding; the last row is the model's output.

        Needs every ``hook_resid_pre`` and the last ``hook_resid_post`` in the cache.
        """
        stack, labels = self.accumulated_resid(return_labels=True)  # type: ignore[misc]
        logits = unembed(self._model(), stack)
        if not bool(self.real.all()):
            logits = logits * self.real.to(logits.device)[..., None]  # padding stays 0
        return (logits, labels) if return_labels else logits
