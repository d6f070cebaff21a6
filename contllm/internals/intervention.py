"""Hook functions under continuous inputs: the one installer of named hooks on a model, and their removal.

:func:`hooks` is a context manager. While it lasts, every forward of the model calls
``fn(activation, hook)`` at each named point (:mod:`contllm.internals.hookpoints`) it was given;
``fn`` may return a replacement (a floating-point tensor of the same shape, converted to
the activation's dtype and device), or None to leave the activation as it is; anything
else raises SignalError naming the point. It may also edit the activation in place (and
return None or the activation itself), as TransformerLens's hook functions often do: the
edit takes effect at every point.
``hook`` is a :class:`Hook`: the point's name and layer, and the padded batch the
forward runs (each column's time and duration, each row's padding). Backward hooks
``fn(grad, hook)`` are attached to the activation's tensor in the autograd graph, so they
fire when a gradient passes through it and vanish with the graph. On exit, also when the
body or a hook raises, every hook is removed and the model has its own attention
implementation back: nothing outlives the context.

Hooks are bound to the signals they were made for. Contexts open on one model at once
(``lm.hooks(signals)`` around ``lm.run_with_cache(signals)``, whose own context records the
values) must be made for the same signals, token for token: the same token ids or
embeddings, durations and times. A context for any other signals raises SignalError on
entering, naming what differs (:func:`signal_difference`), before anything runs; a forward
that no context announces (the model called directly inside the context) must have the
context's batch shape (rows x padded width), or SignalError at the first hooked point.

Hooks added with :func:`add_hook` (``lm.add_hook``) stay until :func:`reset_hooks`: every
context opened for that ``lm`` (every ``run_with_cache``, ``run_with_hooks``, gradients and
patch, and ``lm.logits`` while any are added) applies them first, bound to its own
signals; between calls nothing is registered on the model.

Most points are a module's input or output. The attention points live inside the
attention function: while one is hooked, the layers that carry it run
:func:`contllm.internals.hooked_attention.hooked_attention_forward`. The norm points (``hook_scale``,
``hook_normalized``) and the per-head ``hook_result`` are computed beside their module: a
replacement moves the module's output by the change it makes (so a replacement equal to the
value changes nothing, exactly), and where a gradient must reach one of them the output
is rebuilt from it (the same value to float rounding).

Each kind of point (its ``site``) has one installer function, looked up in :data:`contllm.internals.sites.SITES`;
installers register through :mod:`contllm.internals.hooks`, the raw-layer API every other module
that changes a model's computation uses as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from contllm.core.engine import check_signals
from contllm.core.families import model_of
from contllm.core.signal import Signal, pad_signals
from contllm.errors import SignalError
from contllm.internals.binding import (
    OPEN,
    add_hook,
    added_hooks,
    hooks_on,
    merged,
    opened,
    reset_hooks,
    signal_difference,
)
from contllm.internals.hookpoints import Point, points, resolve_names
from contllm.internals.hookrun import Hook, HookFn, HookState, LayerIndex, Run, replacement
from contllm.internals.sites import LATER, SITES, group

__all__ = [
    "Hook",
    "HookFn",
    "HookState",
    "LayerIndex",
    "add_hook",
    "added_hooks",
    "hooks",
    "hooks_on",
    "replacement",
    "reset_hooks",
    "signal_difference",
]


# ---------------------------------------------------------------------- the context


def _pairs(lm: Any, given: Any, what: str) -> dict[str, list[HookFn]]:
    """{name: [fn, ...]} of a list of (name | short form | predicate | list of them, fn) pairs.

    The one check of the hook pairs every entry point takes (run_with_hooks, hooks,
    gradients): SignalError naming ``what`` for anything but a list of pairs (one pair
    alone is taken too), a pair whose fn is not callable, or a target that names no
    activation (:func:`contllm.internals.hookpoints.resolve_names`).
    """
    if given is None:
        return {}
    if isinstance(given, tuple) and len(given) == 2 and callable(given[1]):
        given = [given]
    if callable(given) or isinstance(given, (str, bytes, torch.Tensor)) or not isinstance(given, Iterable):
        shown = getattr(given, "__name__", None) or repr(given)[:60]
        raise SignalError(
            f"{what} must be a list of (name or predicate, fn) pairs with fn(activation, hook), got "
            f"{type(given).__name__} {shown}; e.g. {what}=[('blocks.0.hook_resid_post', fn)]"
        )
    out: dict[str, list[HookFn]] = {}
    known = points(lm)
    for i, item in enumerate(given):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1])):
            raise SignalError(
                f"{what} must be a list of (name or predicate, fn) pairs with fn(activation, hook), got {item!r}"
            )
        for name in resolve_names(lm, item[0], what=f"the target of {what}[{i}]", known=known):
            out.setdefault(name, []).append(item[1])
    return out


@contextmanager
def hooks(
    lm: Any,
    signals: Signal | Sequence[Signal],
    fwd_hooks: Any = (),
    bwd_hooks: Any = (),
    *,
    graph: Sequence[str] = (),
) -> Iterator[HookState]:
    """Call hook functions at named activations of ``lm`` for forwards of ``signals``, while the context lasts.

    lm: a ContinuousLM; signals: the batch the forwards inside run (left-padded by
    :func:`contllm.pad_signals`). The hooks are bound to these signals: a context opened
    inside for other signals (``run_with_cache``, ``run_with_hooks``, gradients or ``patch``
    of other signals) raises SignalError naming what differs (:func:`signal_difference`), and
    a forward of another shape raises SignalError at the first hooked point. fwd_hooks: (target, fn) pairs: target an activation name, a short form
    (``("resid_post", 5)``), a predicate ``fn(name) -> bool`` or a list of them; fn(activation,
    hook) returns a replacement or None. bwd_hooks: (target, fn) pairs with fn(grad, hook),
    attached to the activations' tensors (they need a forward that keeps gradients).
    graph: names whose values must sit in the autograd graph (gradients are read there).
    Yields a :class:`HookState`. Hooks are registered on entering and removed on exit,
    also when the body raises. The outermost context of ``lm`` also applies the hooks
    added with :func:`add_hook`, before its own (backward ones only where the forward keeps
    the autograd graph).

    SignalError on entering for signals :func:`contllm.core.engine.check_signals` refuses, hooks
    that are not a list of (target, fn) pairs (a bare function), a target that is no name,
    short form or predicate (a number, None), or an unknown name; and in the forward, naming
    the point, for a hook function (forward or backward) that returns anything but None or
    a floating-point tensor of the value's shape that holds data (:func:`replacement`).
    """
    items = tuple(check_signals(signals, single_ok=True))
    fwd, bwd = _pairs(lm, fwd_hooks, "fwd_hooks"), _pairs(lm, bwd_hooks, "bwd_hooks")
    net = model_of(lm)
    open_now = list(OPEN.get(net, []))
    for other in open_now:
        difference = signal_difference(other.signals, items)
        if difference is not None:
            raise SignalError(
                f"the hooks open on this model were made for other signals ({difference}); inside lm.hooks(signals, "
                "...) run the forward of those very signals, or leave the context first"
            )
    optional: dict[str, list[HookFn]] = {}
    if not any(other.owner is lm for other in open_now):
        # The outermost context of this lm applies the hooks added to it, before its own.
        added = added_hooks(lm)
        fwd = merged(added, "fwd", fwd)
        optional = merged(added, "bwd", {})
    known = points(lm)
    batch = pad_signals(list(items))
    run = Run(known, fwd, bwd, set(graph), batch, items, net, lm, optional)
    groups: dict[tuple[str, int], dict[str, Point]] = {}
    for name in run.state.names:
        site, module, key = group(known[name])
        groups.setdefault((site, module), {})[key] = known[name]
    with ExitStack() as stack:
        for (site, _), parts in sorted(groups.items(), key=lambda group: LATER.get(group[0][0], 0)):
            SITES[site](run, parts, stack)
        stack.enter_context(opened(net, run))
        yield run.state
