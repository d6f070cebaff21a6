"""The objects of one hooked forward: what a hook function is told and what the run keeps.

:class:`Hook` (a point's name, its layer as a :class:`LayerIndex`, the batch's times and
durations), :class:`HookState` (what a context yields), :class:`Run` (the hook functions of
one context, bound to its batch), :func:`replacement` (the one check of what a hook function
returns) and :func:`backward` (a backward hook function on a tensor).
:mod:`contllm.internals.sites` installs them on the model's points and
:mod:`contllm.internals.intervention` opens the context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from contllm.core.families import family_of
from contllm.core.signal import Signal, SignalBatch
from contllm.errors import SignalError, UnsupportedModelError
from contllm.internals.hookpoints import Point
from contllm.internals.prefixed import layout_of, rest_reader

__all__ = ["Hook", "HookFn", "HookState", "LayerIndex", "Run", "backward", "changed", "replacement"]

#: fn(activation, hook) -> a replacement of the same shape, or None to keep the activation.
HookFn = Callable[[torch.Tensor, "Hook"], "torch.Tensor | None"]


class LayerIndex(int):
    """A decoder layer's index: an int (``hook.layer == 3``) that can also be called, ``hook.layer()``, as
    TransformerLens's ``HookPoint.layer()`` is."""

    def __call__(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return str(int(self))


@dataclass(frozen=True)
class Hook:
    """What a hook function gets besides the activation: the point and the batch being run.

    name: the activation name; layer: its decoder layer, a :class:`LayerIndex` (an int,
    also callable as ``hook.layer()``, TransformerLens's spelling), or None for the
    embeddings and the final norm; batch: the left-padded :class:`~contllm.core.signal.SignalBatch`
    of the signals the hooks were made for, which are the signals the forward runs (padding
    tokens have duration 0); signals: those signals.
    """

    name: str
    layer: LayerIndex | None
    batch: SignalBatch = field(repr=False)
    signals: tuple[Signal, ...] = field(repr=False)

    @property
    def times(self) -> torch.Tensor:
        """float64 [batch, pos]: the time of every column of the activation (padding sits at its row's start)."""
        return self.batch.times

    @property
    def durations(self) -> torch.Tensor:
        """float64 [batch, pos]: the duration of every column (0 for padding)."""
        return self.batch.durations

    @property
    def pad_left(self) -> torch.Tensor:
        """long [batch]: padding columns before each signal's first token."""
        return self.batch.pad_left

    @property
    def real(self) -> torch.Tensor:
        """bool [batch, pos]: True at the columns that hold a token of the signal, False at padding."""
        return torch.arange(self.batch.width)[None, :] >= self.batch.pad_left[:, None]

    def columns(self, index: int) -> torch.Tensor:
        """The column of token ``index`` (negative: from each signal's end) in every row: long [batch]."""
        lengths = self.batch.lengths.to(torch.long)
        return self.batch.pad_left.to(torch.long) + (index if index >= 0 else lengths + index)


@dataclass
class HookState:
    """One :func:`hooks` context: the names hooked and those a forward has reached so far."""

    batch: SignalBatch
    names: list[str]
    fired: set[str] = field(default_factory=set)

    def check_reached(self) -> None:
        """UnsupportedModelError naming the hooked points that no forward reached."""
        missing = [n for n in self.names if n not in self.fired]
        if missing:
            raise UnsupportedModelError(f"the forward never reached {', '.join(missing)}")


class Run:
    """The hook functions of one context, applied at a point: shape checks, replacements, backward hooks."""

    def __init__(
        self,
        known: dict[str, Point],
        fwd: dict[str, list[HookFn]],
        bwd: dict[str, list[HookFn]],
        graph: set[str],
        batch: SignalBatch,
        signals: tuple[Signal, ...],
        net: nn.Module,
        owner: Any = None,
        optional: dict[str, list[HookFn]] | None = None,
    ) -> None:
        self.known, self.fwd, self.bwd, self.graph_names = known, fwd, bwd, graph
        #: Backward hooks attached only where the forward keeps the autograd graph (added with add_hook).
        self.optional = optional or {}
        self.batch, self.signals, self.owner = batch, signals, owner
        self.net, self.family = net, family_of(net)
        self.state = HookState(batch, [n for n in known if n in fwd or n in bwd or n in self.optional])
        self._hooks: dict[str, Hook] = {}

    def hook(self, point: Point) -> Hook:
        if point.name not in self._hooks:
            layer = None if point.layer is None else LayerIndex(point.layer)
            self._hooks[point.name] = Hook(point.name, layer, self.batch, self.signals)
        return self._hooks[point.name]

    def graph(self, point: Point) -> bool:
        """Whether ``point``'s value must sit in the autograd graph (a backward hook or a gradient reads it)."""
        name = point.name
        return torch.is_grad_enabled() and (name in self.bwd or name in self.optional or name in self.graph_names)

    def rebuild(self, point: Point, new: torch.Tensor, old: torch.Tensor) -> bool:
        """Whether the module must go on from ``new``, a view of its value: replaced, or read by a gradient."""
        return changed(new, old) or self.graph(point)

    def _check(self, point: Point, value: torch.Tensor) -> None:
        rows, width = len(self.batch), self.batch.width
        pos = value.shape[2] if point.axis == "pattern" else (value.shape[1] if value.ndim > 1 else -1)
        if value.shape[0] != rows or pos != width:
            raise SignalError(
                f"{point.name}: the hooks were made for {rows} signals padded to {width} tokens, but this forward "
                f"has values of shape {tuple(value.shape)}; run the forward of the hooks' own signals inside the context "
                "(run_with_hooks, run_with_cache)"
            )

    def apply(self, point: Point, value: torch.Tensor) -> torch.Tensor:
        """``value`` after every forward hook on ``point``; backward hooks attached to the result.

        In a forward on a shared prefix (:mod:`contllm.internals.prefixed`) the prefix's own
        forward only keeps the value, and the forward after it hands the hooks the full batch's
        value and goes on from its own part of what they leave.
        """
        shared = layout_of(self.net)
        if shared is None:
            return self._apply(point, value)
        if shared.recording:
            shared.keep(point.name, value)
            return value
        fns = self.fwd.get(point.name, ())
        readers = [rest_reader(fn) for fn in fns]
        if fns and all(readers) and not self.graph(point) and not self.optional.get(point.name):
            # Every hook function here reads the rows after the prefix alone (run_with_cache's): no full batch.
            for reader in readers:
                assert reader is not None
                reader(value, shared)
            self.state.fired.add(point.name)
            return value
        return shared.narrow(point, self._apply(point, shared.widen(point, value)), value)

    def _apply(self, point: Point, value: torch.Tensor) -> torch.Tensor:
        self._check(point, value)
        hook = self.hook(point)
        if self.graph(point) and not value.requires_grad:
            # Nothing before the point takes a gradient (a duration bias when durations are not asked for):
            # its value enters the graph here.
            value = value.detach().requires_grad_(True)
        for fn in self.fwd.get(point.name, ()):
            new = fn(value, hook)
            if new is not None:
                value = replacement(point.name, new, value)
        self.state.fired.add(point.name)
        if value.requires_grad:
            for fn in self.optional.get(point.name, ()):
                value.register_hook(backward(fn, hook))
        for fn in self.bwd.get(point.name, ()):
            if not value.requires_grad:
                raise SignalError(
                    f"{point.name}: backward hooks need a forward that keeps gradients; "
                    "run it with run_with_hooks(..., bwd_hooks=...) or grad=True"
                )
            value.register_hook(backward(fn, hook))
        return value

    def apply_kept(self, point: Point, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the value after the hooks, the value before them), for a point computed beside its module.

        A hook function may edit the activation in place and return None or it, as
        TransformerLens's do; where one did, the second is a copy taken before the hooks ran,
        so that :func:`changed` sees the edit (a point the module reads itself sees it anyway).
        """
        if not self.fwd.get(point.name):
            return self.apply(point, value), value
        before = value.detach().clone()
        new = self.apply(point, value)
        return new, (value if torch.equal(before, value.detach()) else before)


def replacement(name: str, new: Any, value: torch.Tensor, what: str = "a hook function") -> torch.Tensor:
    """What a hook function at the point ``name`` returned instead of ``value``, in ``value``'s dtype and device.

    The one check of every hook function's return, forward and backward: a floating-point
    tensor of ``value``'s shape, holding data (not on the meta device) on a device it can be
    moved from; another floating-point dtype or device is converted. SignalError naming the
    point otherwise (None, "keep the value", is the caller's to handle).
    """
    keep = "or None to keep it"
    if not isinstance(new, torch.Tensor) or new.shape != value.shape:
        got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
        raise SignalError(
            f"{name}: {what} returned {got}; return a tensor of the activation's shape {tuple(value.shape)}, {keep}"
        )
    if value.is_floating_point() and not new.is_floating_point():
        raise SignalError(
            f"{name}: {what} returned a {new.dtype} tensor; return floating-point values ({value.dtype}), {keep}"
        )
    if new.device.type == "meta":
        raise SignalError(
            f"{name}: {what} returned a tensor on the meta device, which holds no values; "
            f"return values (on {value.device}), {keep}"
        )
    try:
        return new.to(device=value.device, dtype=value.dtype)
    except (RuntimeError, NotImplementedError) as err:
        raise SignalError(
            f"{name}: {what} returned a tensor on {new.device} that cannot be moved to the activation's device "
            f"{value.device} ({str(err).splitlines()[0] if str(err) else type(err).__name__}); {keep}"
        ) from err


def backward(fn: HookFn, hook: Hook) -> Callable[[torch.Tensor], torch.Tensor | None]:
    def call(grad: torch.Tensor) -> torch.Tensor | None:
        new = fn(grad, hook)
        return None if new is None else replacement(hook.name, new, grad, "a backward hook function")

    return call


def changed(new: torch.Tensor, old: torch.Tensor) -> bool:
    """Whether a hook function gave a new tensor rather than the value itself."""
    return new is not old
