"""The one forward of continuous signals through the stock model, and the contexts it runs in.

Every evaluation in contllm - ``lm.logits`` and ``probs`` (the engine's chunks and shared
prefix), generation, activations and hooks, gradients, attribution's duration path and
the keyword arguments of the nnsight bridge - builds the stock model's inputs here and
calls the model through :func:`stock_forward`:

- input embeddings: the model's own embedding module (Gemma's scale included) or the
  embeddings a signal gives (:func:`embeddings`, :func:`input_embeds`);
- the attention mask: the continuous-time 4D mask of :func:`contllm.core.attention.model_masks`
  (the log-duration bias and the causal mask by time, per layer type where layers slide);
- position ids: the query times minus the time origin, subtracted in float64 (the
  signal's times) and rounded once to float32 (:func:`model_inputs`).

The dtype rule. S is the state dtype, ``lm.state_dtype``: the model's own dtype, or
float32 inside :func:`contllm.core.precision.float32_state` (how the engine runs a bfloat16 or
float16 model). Embeddings are built in S, position ids in float32, and the mask in
:func:`mask_dtype`: float32 under eager attention (eager adds it to float32 scores and
loses nothing), S under sdpa (sdpa wants the query's dtype); ``keep_float64`` makes it
float64 for a float64 state whatever the attention. Per case:

=======================  ==========  =============  ===========  ==============================
model                    S           eager mask     sdpa mask    logits of the read positions
=======================  ==========  =============  ===========  ==============================
float32                  float32     float32        float32      the model's head
bfloat16/float16, the    float32     float32        float32      float32 head
engine's float32 state
bfloat16/float16 as      its own     float32        its own      float32 head (the engine),
stock (float32_state                                             the model's head (the bridge)
off; the bridge)
float64                  float64     float32        float64      the model's float64 head
float64, keep_float64    float64     float64        float64      the model's float64 head
=======================  ==========  =============  ===========  ==============================

``keep_float64`` is attribution's duration path (float64 gradients of the log-durations,
checked against float64 finite differences); every other caller (the engine, generation,
activations, gradients, the bridge) keeps the rule without it.
The logits column is :func:`evaluation`'s (:func:`contllm.core.precision.float32_readout`
replaces a half-precision head only); the bridge (:mod:`contllm.internals.interop`) runs
the model as it is. The engine and ``lm.gradients`` return what they read in
:func:`contllm.core.precision.output_dtype`: float64 for a float64 model, float32 otherwise.

:func:`evaluation` is the context every forward runs in (continuous positions, inference
mode or, with ``grad``, the autograd graph with frozen parameters; the float32 state and
read-out of a half-precision model) and :func:`differentiable` its differentiable form.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from contllm.core.attention import attention_modules, continuous_positions, model_masks, switched_attention
from contllm.core.families import rotary_module
from contllm.core.precision import float32_readout, float32_state
from contllm.core.signal import SignalBatch
from contllm.errors import SignalError, UnsupportedModelError
from contllm.internals.hooks import cache_keyword, cache_of, output_hook

__all__ = [
    "SHARED_PREFIX",
    "Context",
    "SharedKeys",
    "differentiable",
    "embeddings",
    "evaluation",
    "forward",
    "forward_batch",
    "frozen",
    "input_embeds",
    "mask_dtype",
    "model_inputs",
    "patched",
    "rotary_gradients",
    "shared_attention",
    "stock_forward",
]

#: The name the shared-prefix attention (:func:`contllm.core.prefix.shared_prefix_attention`) is registered under.
SHARED_PREFIX = "contllm_shared_prefix"


@dataclass
class Context:
    """Keys already in a KV cache: their times and durations [batch, keys]."""

    cache: Any
    times: torch.Tensor
    durations: torch.Tensor


@dataclass
class SharedKeys:
    """The prefix keys and values of every attention module, at batch size 1.

    layers: {attention module: (keys, values)}, each [1, kv_heads, prefix, head_dim].
    times, durations: float64 [1, prefix] of the prefix tokens.
    """

    layers: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]]
    times: torch.Tensor
    durations: torch.Tensor

    def __len__(self) -> int:
        return int(self.times.shape[1])


@contextmanager
def shared_attention(model: nn.Module) -> Iterator[None]:
    """Point ``model``'s attention at the shared-prefix attention while the context lasts."""
    with switched_attention(model, attention_modules(model), SHARED_PREFIX):
        yield


# ---------------------------------------------------------------------- inputs
def mask_dtype(lm: Any, *, keep_float64: bool = False) -> torch.dtype:
    """The dtype of the attention mask on ``lm`` now (the module docstring's rule).

    float64 for a float64 state with ``keep_float64``; else float32 under eager attention and
    the state dtype under sdpa.
    """
    state = lm.state_dtype
    if keep_float64 and state == torch.float64:
        return torch.float64
    # sdpa wants the mask in the query's dtype; eager adds it in float32 and loses nothing.
    return torch.float32 if lm.attn_implementation == "eager" else state


def embeddings(
    lm: Any, token_ids: torch.Tensor | None, embeds: torch.Tensor | None, given: torch.Tensor | None = None
) -> torch.Tensor:
    """Input embeddings [rows, tokens, hidden] in the state dtype on the model's device.

    token_ids: long [rows, tokens] looked up in the model's embedding module; embeds:
    [rows, tokens, hidden] given embeddings; given: bool [rows], the rows whose embeddings
    are given (None: every row's, when ``embeds`` is given).
    """
    if embeds is not None and (given is None or bool(given.all())):
        return embeds.to(device=lm.device, dtype=lm.state_dtype)
    assert token_ids is not None
    out = lm.model.get_input_embeddings()(token_ids.to(lm.device)).to(lm.state_dtype)
    if embeds is not None and given is not None:
        rows = given.to(lm.device)[:, None, None]
        out = torch.where(rows, embeds.to(device=lm.device, dtype=out.dtype), out)
    return out


def input_embeds(lm: Any, batch: SignalBatch) -> torch.Tensor:
    """The input embeddings of a padded batch (:func:`embeddings`), checked against the model.

    SignalError for a token id outside the vocabulary or embeds of another width than the model's hidden size.
    """
    weight = lm.model.get_input_embeddings().weight
    vocab, hidden = weight.shape[0], weight.shape[-1]
    ids = batch.token_ids
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise SignalError(
            f"token ids from {int(ids.min())} to {int(ids.max())} in the batch; the model's vocabulary has "
            f"{vocab} tokens, so token_ids must lie in [0, {vocab})"
        )
    if batch.embeds is not None and batch.embeds.shape[-1] != hidden:
        raise SignalError(f"embeds are {batch.embeds.shape[-1]} wide, but the model's hidden size is {hidden}")
    return embeddings(lm, batch.token_ids, batch.embeds, batch.has_embeds)


def model_inputs(
    lm: Any,
    embeds: torch.Tensor,
    query_times: torch.Tensor,
    key_times: torch.Tensor,
    key_durations: torch.Tensor,
    *,
    origin: float = 0.0,
    keep_float64: bool = False,
) -> dict[str, Any]:
    """The keyword arguments ``inputs_embeds``, ``attention_mask`` and ``position_ids`` of a stock forward.

    The mask (:func:`contllm.core.attention.model_masks`, in :func:`mask_dtype`) lets each query
    see the keys at or before its time; the position ids are ``query_times - origin``,
    subtracted in the times' float64 and rounded once to float32.
    """
    mask = model_masks(
        lm.family,
        lm.model.config,
        query_times,
        key_times,
        key_durations,
        dtype=mask_dtype(lm, keep_float64=keep_float64),
        device=lm.device,
    )
    return {
        "inputs_embeds": embeds,
        "attention_mask": mask,
        "position_ids": (query_times - origin).to(device=lm.device, dtype=torch.float32),
    }


# ---------------------------------------------------------------------- the forward
def stock_forward(lm: Any, **kwargs: Any) -> Any:
    """The stock model's forward on keyword arguments (:func:`model_inputs` and more), with float positions.

    The one call of the stock model on continuous inputs: a learned position table is read
    at float times for the call (:func:`contllm.core.attention.continuous_positions`; a no-op
    inside an outer :func:`patched` and for rotary families).
    """
    with continuous_positions(lm.model, lm.family):
        return lm.model(**kwargs)


def forward(
    lm: Any,
    embeds: torch.Tensor,
    times: torch.Tensor,
    durations: torch.Tensor,
    *,
    logits_to_keep: int | torch.Tensor = 0,
    context: Context | None = None,
    use_cache: bool = False,
    prefix: SharedKeys | None = None,
    origin: float = 0.0,
    keep_float64: bool = False,
) -> tuple[torch.Tensor, Context | None]:
    """One forward of input embeddings [rows, tokens, hidden] at ``times`` and ``durations`` [rows, tokens].

    Returns the logits and, with a cache (``context`` or ``use_cache``), the extended
    context. The arguments are :func:`forward_batch`'s; ``keep_float64`` is the dtype
    rule's (module docstring).
    """
    if prefix is not None and (context is not None or use_cache):
        raise SignalError("forward_batch takes a shared prefix or a cache, not both")
    if origin != 0 and not lm.relative_positions:
        raise SignalError(
            f"forward_batch: origin {origin:g} given, but this {lm.family.name} model sees absolute positions; "
            "only a model with relative positions (lm.relative_positions) may move its time origin"
        )
    key_times, key_durations = times, durations
    cache = None
    extra: dict[str, Any] = {}
    if prefix is not None:
        rows = embeds.shape[0]
        key_times = torch.cat([prefix.times.expand(rows, -1), times], dim=1)
        key_durations = torch.cat([prefix.durations.expand(rows, -1), durations], dim=1)
        extra["contllm_prefix"] = prefix
    elif context is not None:
        key_times = torch.cat([context.times, times], dim=1)
        key_durations = torch.cat([context.durations, durations], dim=1)
        cache = context.cache
    elif use_cache:
        # A cache built without a config keeps every key: windows are applied in time by the mask.
        cache = DynamicCache()
    inputs = model_inputs(lm, embeds, times, key_times, key_durations, origin=origin, keep_float64=keep_float64)
    if isinstance(logits_to_keep, torch.Tensor):
        logits_to_keep = logits_to_keep.to(lm.device)
    with shared_attention(lm.model) if prefix is not None else nullcontext():
        out = stock_forward(
            lm,
            **inputs,
            use_cache=cache is not None,
            logits_to_keep=logits_to_keep,
            **{cache_keyword(lm.model): cache},
            **extra,
        )
    new_context = None
    if cache is not None:
        new_context = Context(cache_of(out), key_times, key_durations)
    return out.logits, new_context


def forward_batch(
    lm: Any,
    batch: SignalBatch,
    *,
    logits_to_keep: int | torch.Tensor = 0,
    context: Context | None = None,
    use_cache: bool = False,
    prefix: SharedKeys | None = None,
    origin: float = 0.0,
) -> tuple[torch.Tensor, Context | None]:
    """One forward of a padded batch of signals; returns logits and (with a cache) the extended context.

    logits_to_keep: 0 for every column, k for the last k, or a 1-D tensor of columns.
    context: keys already in a cache, one row per batch row (earlier generation steps).
    use_cache: start a cache (returned in the context).
    prefix: keys of a prefix shared by every row, at batch size 1, attended through
        :func:`contllm.core.prefix.shared_prefix_attention` (no cache is kept then).
    origin: a time subtracted from every position id (not from the times the mask
        compares), for models that see positions only through their differences
        (:func:`contllm.core.families.relative_positions`): float32 positions near zero
        are finer (ulp 1.5e-5 at 180, 1.9e-6 at 20). A shared prefix's keys must have
        been computed with the same origin. Anything but 0 on another model is an error.
    Call inside :func:`evaluation` (or :func:`patched`). SignalError for a prefix with a
    cache, an origin on a model with absolute positions, and the inputs
    :func:`input_embeds` refuses.
    """
    embeds = input_embeds(lm, batch)
    return forward(
        lm,
        embeds,
        batch.times,
        batch.durations,
        logits_to_keep=logits_to_keep,
        context=context,
        use_cache=use_cache,
        prefix=prefix,
        origin=origin,
    )


# ---------------------------------------------------------------------- contexts
@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Record gradients (also under an outer ``no_grad``) with every parameter of ``model`` frozen; restored on exit."""
    thawed = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in thawed:
            p.requires_grad_(False)
        with torch.enable_grad():
            yield
    finally:
        for p in thawed:
            p.requires_grad_(True)


@contextmanager
def patched(lm: Any, *, grad: bool = False) -> Iterator[Any]:
    """``lm.model``, able to take continuous inputs, for as long as the context lasts.

    In inference mode; with ``grad``, recording the autograd graph instead, with every
    parameter frozen (gradients reach the inputs and activations, never the weights).
    """
    with continuous_positions(lm.model, lm.family), frozen(lm.model) if grad else torch.inference_mode():
        yield lm.model


@contextmanager
def rotary_gradients(lm: Any) -> Iterator[None]:
    """Let gradients reach the position ids through the model's rotary embedding while the context lasts.

    Some transformers releases compute the rotary table under ``torch.no_grad``. Where the
    table then comes back without a graph while the positions have one, it is recomputed
    from the module's own inverse frequencies and attention scaling (per layer type where
    the module keeps one per type) and added as ``table + (recomputed - recomputed.detach())``:
    the values stay the stock ones bit for bit, the gradient is the recomputation's.
    UnsupportedModelError when the recomputation does not match the module's output.
    """
    module = rotary_module(lm)
    if module is None:
        yield
        return

    def after(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        positions = args[1] if len(args) > 1 else kwargs.get("position_ids")
        cos, sin = output
        if cos.requires_grad or not isinstance(positions, torch.Tensor) or not positions.requires_grad:
            return None
        kind = args[2] if len(args) > 2 else kwargs.get("layer_type")
        prefix = f"{kind}_" if kind else ""
        inv_freq = getattr(module, f"{prefix}inv_freq")
        scale = float(getattr(module, f"{prefix}attention_scaling", 1.0))
        freqs = positions[..., None].float() * inv_freq.to(device=positions.device, dtype=torch.float32)
        angles = torch.cat((freqs, freqs), dim=-1)
        table = [(angles.cos() * scale).to(cos.dtype), (angles.sin() * scale).to(sin.dtype)]
        if any(t.shape != o.shape or not torch.allclose(t.detach(), o, atol=1e-4) for t, o in zip(table, output)):
            raise UnsupportedModelError(
                f"{type(module).__name__} computes its table without gradients, and not as contllm can recompute it; "
                "duration gradients need a transformers release whose rotary embedding keeps them"
            )
        return tuple(o + (t - t.detach()) for o, t in zip(output, table))

    with output_hook(module, after):
        yield


@contextmanager
def evaluation(
    lm: Any,
    *,
    float32: bool = True,
    projections: bool | None = None,
    grad: bool = False,
) -> Iterator[None]:
    """The context every evaluation of ``lm`` runs in: the engine's, ``generate``'s, gradients' and attribution's.

    The model takes continuous inputs, in inference mode (with ``grad``: recording the
    autograd graph of the inputs, its parameters frozen, gradients reaching the position
    ids through the rotary embedding, :func:`rotary_gradients`); a half-precision model
    reads its outputs through a float32 head and, with ``float32``, keeps its state in
    float32 between half-precision matmuls (:mod:`contllm.core.precision`), its query and key
    projections in float32 too unless ``projections`` is False (None:
    :data:`contllm.core.precision.FLOAT32_PROJECTIONS`). A float32 or float64 model reads
    through its own head (the module docstring's dtype rule). All is undone on exit.
    """
    state = float32_state(lm, float32_projections=projections) if float32 else nullcontext()
    with (
        patched(lm, grad=grad),
        rotary_gradients(lm) if grad else nullcontext(),
        float32_readout(lm.model),
        state,
    ):
        yield


def differentiable(lm: Any) -> Any:
    """The context of a differentiable run: :func:`evaluation` with ``grad``.

    Continuous positions; the autograd graph recorded (also under an outer ``no_grad``)
    with every parameter frozen; gradients reaching float position ids through the rotary
    embedding; a half-precision model in its float32 state with a float32 read-out (a
    float32 or float64 model reads through its own head). Undone on exit, also on an exception.
    """
    return evaluation(lm, grad=True)
