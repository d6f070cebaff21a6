"""Gradients of a read-out with respect to token durations, input embeddings and hooked activations.

A duration enters the model twice: as the log-duration bias of its key in every attention
layer, and through the times of the tokens after it (their rotary positions, or the rows
of a learned position table), since t_i = start + d_1 + ... + d_i. :func:`gradients`
differentiates through both: d readout / d d_i is what changing token i's duration alone
does, its own time and every later time moving with it (for a signal with explicit times
only the bias moves). Input embeddings are those the model's embedding module gives
(Gemma's scale included); an activation is any name of :mod:`contllm.internals.hookpoints`.

The forward runs once, recording the graph with the model's parameters frozen, and is
otherwise the forward of ``lm.logits`` (the engine's float32 state for a half-precision
model, no shared prefix); a float64 model's logits, read-out and gradients stay float64
(:func:`contllm.core.precision.output_dtype`). ``lm.logits`` and the rest of contllm never
record a graph.
Where the model is not differentiable the gradient is one-sided: a key of duration 0 is
outside attention, so its bias takes no gradient (the times it moves still do), and a
learned position table is read by linear interpolation, whose slope jumps at integer
times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

from contllm.core.engine import Positions, check_inputs, check_signals, normalize_positions, read_indices
from contllm.core.forward import differentiable
from contllm.core.forward import (
    rotary_gradients as rotary_gradients,  # re-exported: the one way gradients reach rotary positions
)
from contllm.core.precision import output_dtype
from contllm.core.prefix import SharedPrefix, slice_signal
from contllm.core.signal import Signal
from contllm.errors import SignalError
from contllm.internals.activations import differentiable_batch, forward_reads, shaped, shareable_prefix
from contllm.internals.hookpoints import point, resolve_names
from contllm.internals.intervention import Hook, hooks, hooks_on

__all__ = ["Gradients", "check_readout", "gradients", "readout_values", "rotary_gradients", "wrt_targets"]

#: What ``wrt`` may name besides activations.
INPUTS = ("durations", "embeds")


@dataclass
class Gradients:
    """Gradients of a read-out, one tensor per signal (padding removed).

    values: float32 [batch], the read-out of each signal.
    durations: float64 [tokens_i] per signal: d value / d duration of each token (empty
        when not asked for).
    embeds: float32 [tokens_i, hidden] per signal: d value / d input embedding.
    activations: {name: one tensor per signal}: [tokens_i, *shape] for per-position points,
        [heads, tokens_i, tokens_i] for patterns, scores and duration biases.
    Everything is float64 for a float64 model (values, embeds and activations too).
    """

    values: torch.Tensor
    durations: list[torch.Tensor] = field(default_factory=list)
    embeds: list[torch.Tensor] = field(default_factory=list)
    activations: dict[str, list[torch.Tensor]] = field(default_factory=dict)


def wrt_targets(lm: Any, wrt: Any) -> tuple[list[str], list[str]]:
    """(inputs of :data:`INPUTS`, activation names) that ``wrt`` asks gradients by; SignalError naming ``wrt``.

    wrt: "durations", "embeds", an activation name, a short form or a predicate, or a list
    of them; anything else (a number, None, an empty list) is refused.
    """
    if isinstance(wrt, str) or callable(wrt):
        wanted = [wrt]
    elif isinstance(wrt, Iterable) and not isinstance(wrt, (bytes, torch.Tensor)):
        wanted = list(wrt)
    else:
        shown = repr(wrt)
        raise SignalError(
            f"wrt must be {', '.join(map(repr, INPUTS))}, an activation name (or short form, or predicate) or a "
            f"list of them; got {type(wrt).__name__} {shown[:60] + '...' if len(shown) > 60 else shown}"
        )
    inputs = [w for w in wanted if isinstance(w, str) and w in INPUTS]
    others = [w for w in wanted if not (isinstance(w, str) and w in INPUTS)]
    names = resolve_names(lm, others, what="wrt") if others else []
    if not inputs and not names:
        raise SignalError(f"wrt names nothing to differentiate by; give {', '.join(INPUTS)} or activation names")
    return inputs, names


def check_readout(readout: Any) -> None:
    """SignalError unless ``readout`` is callable (a function of the logits)."""
    if not callable(readout):
        shown = repr(readout)
        raise SignalError(
            "readout must be a function of the logits returning one value per signal, e.g. "
            f"lambda logits: logits.log_softmax(-1)[:, token]; got {type(readout).__name__} "
            f"{shown[:60] + '...' if len(shown) > 60 else shown}"
        )


def readout_values(values: Any, rows: int) -> torch.Tensor:
    """``values``, what a read-out returned for ``rows`` signals, checked: SignalError unless they can be differentiated.

    They must be a floating-point tensor of shape [rows] computed from the logits with
    torch operations (in the autograd graph): not detached, not rebuilt from numbers.
    """
    if not isinstance(values, torch.Tensor) or values.shape != (rows,):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise SignalError(f"readout must return one value per signal, a tensor of shape ({rows},); got {got}")
    if not values.is_floating_point():
        raise SignalError(
            f"readout returned a {values.dtype} tensor; it must return floating-point values computed from "
            "the logits (an integer, boolean or complex value has no gradient)"
        )
    if not values.requires_grad:
        raise SignalError(
            "readout returned values without a gradient: they must be computed from the logits with torch "
            "operations, not detached (.detach(), .item(), .numpy(), torch.tensor(...) of numbers) nor constant"
        )
    return values


def gradients(
    lm: Any,
    signals: Signal | Sequence[Signal],
    readout: Callable[[torch.Tensor], torch.Tensor],
    *,
    positions: Positions = "last",
    wrt: str | Sequence[Any] = INPUTS,
    tokens: Positions | None = None,
) -> Gradients:
    """Gradients of ``readout(logits)`` for each signal with respect to durations, embeddings and activations.

    readout: takes the logits of the batch, float32 (float64 for a float64 model) on the
        CPU, shaped as ``lm.logits`` gives them for ``positions`` with the batch dimension
        kept ([batch, vocab] for "last" or one index, [batch, k, vocab] for a list), and
        returns one value per signal ([batch]), e.g. ``lambda logits: logits.softmax(-1)[:, token]``.
    wrt: "durations", "embeds" and activation names (or short forms, or predicates), one or
        a list.
    tokens: the tokens whose durations and embeddings are asked for ("last", an index or a
        list of indices, negative from each signal's end; None: every token). Their
        gradients come in that order, [k] and [k, hidden] per signal, and are those of
        every token's, picked. Where every chosen token and read position lies after a
        prefix the signals share (:func:`contllm.internals.activations.shareable_prefix`),
        ``wrt`` names no activation and no hooks are on, that prefix runs once without a
        graph (it does not depend on what comes after it) and one forward and backward
        cover the rest: the durations of a few-shot prompt's last line cost about as much
        as a forward of it.
    Returns :class:`Gradients`. Signals do not interact, so each signal's gradients are
    those of its own value. SignalError for a ``wrt`` that names nothing or is no name (a
    number, None), an unknown name, "all" positions, ``tokens`` outside a signal, a
    read-out that is not callable or returns anything but float values with a gradient,
    one per signal (:func:`check_readout`, :func:`readout_values`), or a signal
    ``lm.logits`` would refuse.
    """
    items = check_signals(signals, single_ok=True)
    if normalize_positions(positions) == "all":
        raise SignalError('gradients read chosen positions: give "last", an index or a list of indices, not "all"')
    check_readout(readout)
    inputs, names = wrt_targets(lm, wrt)
    reads = read_indices(items, positions)
    check_inputs(lm, items, reads)
    chosen = None if tokens is None else _chosen(items, tokens)
    p = 0
    if chosen is not None and not names and not hooks_on(lm):
        p = shareable_prefix(lm, items, min(min(row) for row in [*reads, *chosen]))
    graph_batch = differentiable_batch(
        lm, [_after_prefix(s, p) for s in items] if p else items, durations="durations" in inputs
    )
    dtype = output_dtype(lm.dtype)
    durations, embeds = graph_batch.durations, graph_batch.embeds
    assert embeds is not None
    captured: dict[str, torch.Tensor] = {}

    def keep(h: torch.Tensor, hook: Hook) -> None:
        captured[hook.name] = h

    with ExitStack() as stack:
        state = None if p else stack.enter_context(hooks(lm, items, [(name, keep) for name in names], graph=names))
        stack.enter_context(differentiable(lm))
        if p:
            with torch.no_grad():
                prefix = SharedPrefix.compute(lm, items[0], p).keys
            rows = forward_reads(lm, graph_batch, [[i - p for i in row] for row in reads], prefix=prefix)
        else:
            rows = forward_reads(lm, graph_batch, reads)
        logits = shaped(rows, positions)
        assert isinstance(logits, torch.Tensor)  # not "all" positions
        values = readout_values(readout(logits), len(items))
        if state is not None:
            state.check_reached()
        leaves = [t for t, on in ((durations, "durations" in inputs), (embeds, "embeds" in inputs)) if on]
        found = torch.autograd.grad(values.sum(), [*leaves, *(captured[n] for n in names)], allow_unused=True)
    grads = dict(zip([*(w for w in INPUTS if w in inputs), *names], found))
    pads = [int(x) for x in graph_batch.pad_left]

    def rows_of(name: str, g: torch.Tensor | None, like: torch.Tensor) -> list[torch.Tensor]:
        g = torch.zeros_like(like) if g is None else g.detach()
        if name in INPUTS:
            picked = [
                g[b, pad:] if chosen is None else g[b, [pad + i - p for i in chosen[b]]] for b, pad in enumerate(pads)
            ]
            return [x.to(dtype).cpu() if name != "durations" else x.cpu() for x in picked]
        if point(lm, name).axis == "pos":
            return [g[b, pad:].to(dtype).cpu() for b, pad in enumerate(pads)]
        return [g[b][:, pad:, pad:].to(dtype).cpu() for b, pad in enumerate(pads)]

    out = Gradients(values.detach().to(dtype).cpu())
    if "durations" in grads:
        out.durations = rows_of("durations", grads["durations"], durations)
    if "embeds" in grads:
        out.embeds = rows_of("embeds", grads["embeds"], embeds)
    out.activations = {n: rows_of(n, grads[n], captured[n]) for n in names}
    return out


def _chosen(items: Sequence[Signal], tokens: Any) -> list[list[int]]:
    """Each signal's token indices that ``tokens`` chooses (:func:`gradients`); SignalError naming ``tokens``."""
    try:
        return read_indices(items, tokens)
    except (SignalError, TypeError, ValueError) as err:
        raise SignalError(f"tokens: {err}") from None


def _after_prefix(signal: Signal, p: int) -> Signal:
    """The tokens of ``signal`` after its first ``p``, at their own times; where times follow the durations they
    still do, from the time the first ``p`` end at (so that a duration's gradient includes the times it moves)."""
    if signal.explicit_times is not None:
        return slice_signal(signal, p)
    return Signal(
        durations=signal.durations[p:],
        token_ids=None if signal.token_ids is None else signal.token_ids[p:],
        embeds=None if signal.embeds is None else signal.embeds[p:],
        start=float(signal.times[p - 1]),
    )
