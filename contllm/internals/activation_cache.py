"""The activations of one forward, and the helpers that take the residual stream apart.

An :class:`ActivationCache` holds, per name and signal, the values
:func:`contllm.internals.activations.run_with_cache` kept at the read positions (float32, CPU). It is
indexed by full name or by TransformerLens's short forms (``cache["resid_post", 5]``), and
its helpers return stacks of components with their labels, as TransformerLens's do:

- :meth:`~ActivationCache.accumulated_resid`: the residual stream before each layer (and
  after the last), [components, batch, k, hidden];
- :meth:`~ActivationCache.decompose_resid`: the embeddings and every attention and MLP
  output, whose sum is the residual stream;
- :meth:`~ActivationCache.stack_head_results`: every head's write to the residual stream;
- :meth:`~ActivationCache.apply_ln_to_stack`: a stack through a norm with the scale this
  forward had (linear, so components still add up);
- :meth:`~ActivationCache.logit_lens`: each layer's residual stream through the final norm
  and the unembedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from contllm.core.engine import evaluation
from contllm.core.families import decoder_layers, family_of, final_norm, head_counts, model_of, parallel_blocks
from contllm.errors import SignalError
from contllm.internals.hookpoints import act_name, point

__all__ = ["ActivationCache", "unembed"]

Stack = torch.Tensor | tuple[torch.Tensor, list[str]]


def unembed(lm: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [..., vocab] (float32, CPU) of residual-stream values [..., hidden] through the final norm and head.

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
    return logits.cpu()


@dataclass
class ActivationCache:
    """Activations read by :func:`~contllm.internals.activations.run_with_cache`, per signal, in float32 on the CPU.

    values: {name: one tensor per signal}: [k_i, *shape] for per-position points (shape as
        :mod:`contllm.internals.hookpoints` lists it), [heads, k_i, tokens_i] for patterns, scores and
        duration biases (queries at the read positions, keys over the whole signal).
    positions: the token indices read of each signal (k_i of them, in [0, tokens_i)).
    times: float64 [k_i] per signal, the time of each read position.
    logits: float32 [k_i, vocab] per signal at the read positions.
    lm: the model that ran (the helpers read its norms and unembedding), or None.
    """

    values: dict[str, list[torch.Tensor]]
    positions: list[list[int]]
    times: list[torch.Tensor]
    logits: list[torch.Tensor]
    lm: Any = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        shown = ", ".join(list(self.values)[:4]) + (", ..." if len(self.values) > 4 else "")
        return f"ActivationCache({len(self)} signals, {len(self.values)} names: {shown})"

    def __contains__(self, name: object) -> bool:
        try:
            return act_name(name) in self.values
        except SignalError:
            return False

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def names(self) -> list[str]:
        return list(self.values)

    def __getitem__(self, key: Any) -> torch.Tensor:
        """``key`` (a name or a short form such as ``("resid_post", 5)``) for every signal, stacked: [batch, k, ...].

        SignalError when the signals' shapes differ (read them one by one with :meth:`rows`).
        """
        rows = self.rows(key)
        if any(r.shape != rows[0].shape for r in rows):
            raise SignalError(
                f"{act_name(key)}: the signals' values have different shapes "
                f"({', '.join(str(tuple(r.shape)) for r in rows)}); read them one by one with cache.rows(name)"
            )
        return torch.stack(rows)

    def rows(self, key: Any) -> list[torch.Tensor]:
        """``key`` as one tensor per signal; SignalError naming the cached names for any other."""
        name = act_name(key)
        if name not in self.values:
            raise SignalError(f"{name!r} was not cached; this cache holds {', '.join(self.values) or 'nothing'}")
        return self.values[name]

    # ------------------------------------------------------------------ the residual stream
    def _model(self) -> Any:
        if self.lm is None:
            raise SignalError("this cache holds no model; build it with run_with_cache(lm, ...)")
        return self.lm

    def _count(self) -> int:
        return len(decoder_layers(self._model()))

    def _stack(self, parts: list[tuple[str, Any]], return_labels: bool) -> Stack:
        stacked = torch.stack([self[key] if not isinstance(key, torch.Tensor) else key for _, key in parts])
        return (stacked, [label for label, _ in parts]) if return_labels else stacked

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
        last = count if layer is None or layer == -1 else layer
        if not 0 <= last <= count:
            raise SignalError(f"layer {layer} is outside the model's {count} layers")
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
        incl_embeds: bool = True,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Stack:
        """The parts whose sum is the residual stream entering ``layer`` (None: after the last layer).

        Components: "embed" (and "pos_embed" for learned positions) unless ``incl_embeds`` is
        False, then "{i}_attn_out" and "{i}_mlp_out" for every earlier layer; mlp_input adds
        the layer's own "{layer}_attn_out" (the MLP's input, sequential families only).
        Returns [components, batch, k, hidden] (and the labels). Needs the attention and MLP
        outputs in the cache, and ``hook_embed`` and ``hook_pos_embed`` for learned positions,
        ``blocks.0.hook_resid_pre`` for the others: "embed" is what enters the first layer
        (the embeddings with any scale the model applies to them, as Gemma's base model does
        in some transformers releases).
        """
        lm = self._model()
        count = self._count()
        last = count if layer is None else layer
        if not 0 <= last <= count:
            raise SignalError(f"layer {layer} is outside the model's {count} layers")
        if mlp_input and (last == count or parallel_blocks(lm)):
            raise SignalError("mlp_input needs a layer of a sequential family (its MLP reads resid_mid)")
        parts: list[tuple[str, Any]] = []
        if incl_embeds:
            if family_of(model_of(lm)).position_table is not None:
                parts += [("embed", "hook_embed"), ("pos_embed", "hook_pos_embed")]
            else:
                parts.append(("embed", ("resid_pre", 0)))
        for i in range(last):
            parts += [(f"{i}_attn_out", ("attn_out", i)), (f"{i}_mlp_out", ("mlp_out", i))]
        if mlp_input:
            parts.append((f"{last}_attn_out", ("attn_out", last)))
        return self._ln(self._stack(parts, return_labels), apply_ln)

    def stack_head_results(
        self,
        layer: int | None = None,
        *,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        return_labels: bool = False,
    ) -> Stack:
        """Every head's write to the residual stream in layers before ``layer`` (None: all): [layers x heads, batch, k, hidden].

        Labels "L{i}H{h}"; incl_remainder adds "remainder", the residual stream entering
        ``layer`` (after the last layer for None) minus every head's result. Needs
        ``attn.hook_result`` of those layers (and the residual stream for the remainder).
        """
        count = self._count()
        last = count if layer is None else layer
        heads = head_counts(self._model())[0]
        parts: list[tuple[str, Any]] = []
        for i in range(last):
            result = self[("result", i)]  # [batch, k, heads, hidden]
            parts += [(f"L{i}H{h}", result[:, :, h]) for h in range(heads)]
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
        """
        lm = self._model()
        key = "scale" if layer is None else ("scale", layer, "ln2" if mlp_input else "ln1")
        scale = self[key]  # [batch, k, 1]
        family = family_of(model_of(lm))
        norm = point(lm, act_name(key)).module
        x = stack.float()
        if family.norm_kind == "layer":
            x = x - x.mean(-1, keepdim=True)
        weight: Any = norm.weight
        weight = weight.detach().float().cpu() + family.norm_offset
        return x / scale * weight

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
        return (logits, labels) if return_labels else logits
