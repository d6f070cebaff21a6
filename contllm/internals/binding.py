"""Hooks bound to the signals they were made for, and hooks added to a model until reset.

A hook context (:func:`contllm.internals.intervention.hooks`) is made for one batch of
signals; while it is open on a model (:data:`OPEN`), a context opened inside for other
signals is refused, naming what differs (:func:`signal_difference`). Hooks added with
:func:`add_hook` stay with their ``lm`` until :func:`reset_hooks`; each context opened for
that ``lm`` applies them first (:func:`merged`), and nothing sits on the model between calls.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from contllm.core.families import model_of
from contllm.core.signal import Signal
from contllm.errors import SignalError
from contllm.internals.hookpoints import resolve_names

if TYPE_CHECKING:
    from contllm.internals.hookrun import HookFn, Run

__all__ = ["OPEN", "add_hook", "added_hooks", "hooks_on", "merged", "opened", "reset_hooks", "signal_difference"]


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int:
    """The first index along dim 0 where ``a`` and ``b`` (same length) differ."""
    differs = (a != b).reshape(a.shape[0], -1).any(dim=1)
    return int(torch.nonzero(differs)[0])


def signal_difference(made: Sequence[Signal], run: Sequence[Signal]) -> str | None:
    """What tells ``run`` apart from ``made`` (None: the same signals), in words: the count, then the first
    signal that differs and how (its token count, token ids, embeddings, durations or times)."""
    if len(made) != len(run):
        return f"{len(made)} signals there, {len(run)} here"
    for b, (x, y) in enumerate(zip(made, run)):
        if x is y:
            continue
        if len(x) != len(y):
            return f"signal {b} has {len(x)} tokens there, {len(y)} here"
        for what, u, v in (("token ids", x.token_ids, y.token_ids), ("embeddings", x.embeds, y.embeds)):
            if (u is None) != (v is None):
                return f"signal {b} is given by {what} in one and not in the other"
            if u is not None and v is not None:
                u, v = u.cpu(), v.cpu()
                if u.dtype != v.dtype:
                    return f"signal {b}'s {what} are {u.dtype} there, {v.dtype} here"
                if not torch.equal(u, v):
                    return f"signal {b}'s {what} differ at token {_first_difference(u, v)}"
        for what, u, v in (("durations", x.durations, y.durations), ("times", x.times, y.times)):
            if not torch.equal(u, v):
                i = _first_difference(u, v)
                return f"signal {b}'s {what} differ at token {i} ({float(u[i]):.6g} there, {float(v[i]):.6g} here)"
    return None


#: The hook contexts open on each model, outermost first (they leave with their context).
OPEN: weakref.WeakKeyDictionary[nn.Module, list[Run]] = weakref.WeakKeyDictionary()

#: Hooks added with :func:`add_hook`, per ``lm``: (names, fn, direction), in the order they were added.
_ADDED: weakref.WeakKeyDictionary[Any, list[tuple[tuple[str, ...], HookFn, str]]] = weakref.WeakKeyDictionary()


def add_hook(lm: Any, name: Any, fn: HookFn, dir: Literal["fwd", "bwd"] = "fwd") -> None:
    """Add a hook function that every later hooked forward of ``lm`` applies, until :func:`reset_hooks`.

    name: an activation name, a short form, a predicate ``fn(name) -> bool`` or a list of
    them (TransformerLens's ``add_hook(name, hook, dir)``); fn: ``fn(activation, hook)``
    for "fwd", ``fn(grad, hook)`` for "bwd". Nothing is registered on the model here: each
    call that runs hooks (``run_with_cache``, ``run_with_hooks``, gradients, a patch, and
    ``lm.logits`` while hooks are added) installs them for its forward, bound to its own
    signals, before its own hooks, and removes them after. A backward hook fires only in
    forwards that keep the autograd graph. SignalError for an unknown name, a target of
    another kind, a fn that is not callable, or another ``dir``.
    """
    if dir not in ("fwd", "bwd"):
        raise SignalError(f"add_hook: dir must be 'fwd' or 'bwd', got {dir!r}")
    if not callable(fn):
        raise SignalError(f"add_hook: the hook must be a function fn(activation, hook), got {type(fn).__name__}")
    names = tuple(resolve_names(lm, name, what="add_hook's name"))
    _ADDED.setdefault(lm, []).append((names, fn, dir))


def added_hooks(lm: Any, dir: str | None = None) -> list[tuple[tuple[str, ...], HookFn, str]]:
    """The hooks added to ``lm`` with :func:`add_hook` ((names, fn, direction), oldest first); ``dir`` picks one direction."""
    return [h for h in _ADDED.get(lm, []) if dir is None or h[2] == dir]


def reset_hooks(lm: Any) -> None:
    """Remove every hook added to ``lm`` with :func:`add_hook` (contexts that are open keep theirs until they close)."""
    _ADDED.pop(lm, None)


def hooks_on(lm: Any) -> bool:
    """Whether a forward of ``lm`` now runs named hooks: hooks were added to it, or a hook context is open on its model."""
    return bool(_ADDED.get(lm)) or bool(OPEN.get(model_of(lm)))


def merged(
    added: list[tuple[tuple[str, ...], HookFn, str]], dir: str, given: dict[str, list[HookFn]]
) -> dict[str, list[HookFn]]:
    """name -> hook functions: the added hooks of direction ``dir`` first, then those ``given``."""
    out: dict[str, list[HookFn]] = {}
    for names, fn, d in added:
        if d == dir:
            for name in names:
                out.setdefault(name, []).append(fn)
    for name, fns in given.items():
        out.setdefault(name, []).extend(fns)
    return out


@contextmanager
def opened(net: nn.Module, run: Run) -> Iterator[None]:
    """``run`` listed among the contexts open on ``net`` while the context lasts."""
    OPEN.setdefault(net, []).append(run)
    try:
        yield
    finally:
        left = [r for r in OPEN.get(net, []) if r is not run]
        if left:
            OPEN[net] = left
        else:
            OPEN.pop(net, None)
