"""Hooked forwards on a shared prefix: the prefix runs once, and the hooks still see every position.

Signals that share their first P tokens (:func:`contllm.core.prefix.shared_prefix_len`) have
the same activations there at every point. A hooked forward of them without gradients
(:func:`contllm.internals.activations.forward_reads`) runs those P tokens once at batch size
1, keeping the value of every hooked point (:attr:`Layout.recording`, no hook function is
called), and then the rest of each signal as one batch that attends to the prefix's keys
(:mod:`contllm.core.prefix`). At each hooked point of that second forward the hook functions
get the value a full forward of the padded batch has there, [batch, P + rest, ...]: each
row's padding, then the prefix's values, then its own (:meth:`Layout.widen`); what they leave
is cut back to the rows after the prefix (:meth:`Layout.narrow`).

Points inside the attention function take the same path: the rows after the prefix run the
hooked attention over the prefix's keys and their own (:mod:`contllm.internals.hooked_attention`),
rotated queries and keys are widened along their positions as any other point, and patterns,
scores and duration biases [batch, heads, query, key] along both axes: each row's queries
after the prefix over every key of the full batch, and the prefix's own queries as its forward
gave them, over the prefix's keys, with every key a full forward hides from them (padding, the
rest) at the value it has there: 0 in a pattern, the mask's minimum in scores and biases.

A hook function that only reads positions after the prefix may say so: :func:`reads_rest` gives
it a second function that takes the rest's own value and the layout, called instead of it with
no full batch built (``run_with_cache``'s recording does this).

A hook function that changes a value of the prefix's part (a head ablated at every position)
would change what the prefix computes after it: :meth:`Layout.narrow` raises
:class:`PrefixChanged`, and the call runs again as one full forward of the whole batch, so the
hook functions up to that point are called a second time. Backward hooks never take this path.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from contllm.errors import UnsupportedModelError
from contllm.internals.hookpoints import Point

__all__ = ["SHARED", "Layout", "PrefixChanged", "layout_of", "reads_rest", "rest_reader", "suspended"]


class PrefixChanged(Exception):
    """A hook function changed a value in the shared prefix's part: the call needs a full forward."""


@dataclass
class Layout:
    """Where the shared prefix sits in each row of the full padded batch, and its values at the hooked points.

    length: the prefix's tokens (P); pad: long [batch], each row's padding columns (the same
    before the prefix in the full batch and before the rest in the batch after it); width:
    the padded width of the rest; hidden: the value the attention mask gives a hidden key
    (the minimum of its dtype), which scores and duration biases hold there. values: point
    name -> its value over the prefix ([1, P, ...], or [1, heads, P, P] inside attention),
    kept while ``recording`` (the prefix's own forward).
    """

    length: int
    pad: torch.Tensor
    width: int
    hidden: float = torch.finfo(torch.float32).min
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    recording: bool = True
    _index: dict[torch.device, list[_Rows]] = field(default_factory=dict, repr=False)
    _rows: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def _groups(self, device: torch.device) -> list[_Rows]:
        """The rows of the batch grouped by their padding, each group with its columns (:class:`_Rows`)."""
        if device not in self._index:
            p, width = self.length, self.width
            pads = [int(x) for x in self.pad]
            groups = []
            for pad in sorted(set(pads)):
                rows = [b for b, x in enumerate(pads) if x == pad]
                full = torch.arange(p + width)
                inside = (full >= pad) & (full < pad + p)
                source = torch.where(full < pad, full, torch.where(inside, width + full - pad, full - p))
                rest = torch.arange(width)
                rest = torch.where(rest < pad, rest, rest + p)
                order = torch.where(source >= width, source - width, source + p)
                every = len(rows) == len(pads)
                groups.append(
                    _Rows(
                        None if every else torch.tensor(rows, device=device),
                        pad,
                        {"source": source.to(device), "rest": rest.to(device), "order": order.to(device)},
                    )
                )
            self._index[device] = groups
        return self._index[device]

    def _take(self, value: torch.Tensor, columns: str, dim: int) -> torch.Tensor:
        """``value`` [batch, ...] at each row's ``columns`` along ``dim``: "source" (the full batch's columns in
        [rest, prefix] side by side), "rest" (the rest's columns in the full batch) or "order" (the full batch's
        columns in [prefix, rest] side by side)."""
        groups = self._groups(value.device)
        if len(groups) == 1:
            return value.index_select(dim, groups[0].columns[columns])
        shape = list(value.shape)
        shape[dim] = len(groups[0].columns[columns])
        out = value.new_empty(shape)
        for group in groups:
            assert group.rows is not None
            part = value.index_select(0, group.rows).index_select(dim, group.columns[columns])
            out.index_copy_(0, group.rows, part)
        return out

    def _prefix_part(self, full: torch.Tensor, dim: int) -> list[torch.Tensor]:
        """The prefix's columns of ``full`` along ``dim``, one view per group of rows."""
        return [
            (full if g.rows is None else full.index_select(0, g.rows)).narrow(dim, g.pad, self.length)
            for g in self._groups(full.device)
        ]

    def keep(self, name: str, value: torch.Tensor) -> None:
        """The prefix's value at the point ``name`` [1, P, ...], from its own forward."""
        self.values[name] = value.detach()

    def keys(self, prefix: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """Every key of the full batch in its columns' order [batch, heads, P + width, ...], from the prefix's
        ``prefix`` [1, heads, P, ...] and the rest's ``own`` [batch, heads, width, ...]."""
        side = torch.cat([prefix.to(own.dtype).expand(len(own), *prefix.shape[1:]), own], dim=2)
        return self._take(side, "order", 2)

    def mask(self, mask: torch.Tensor) -> torch.Tensor:
        """An attention mask of the rest [batch, 1, width, P + width] over [prefix, rest] keys, its keys put in the
        full batch's columns' order."""
        return self._take(mask, "order", 3)

    def _prefix_rows(self, point: Point, like: torch.Tensor) -> torch.Tensor:
        """The prefix's queries at an attention point in the full batch [batch, heads, P, P + width]: its own
        values at its keys' columns, and a hidden key's value at every other column."""
        value = self.values.get(point.name)
        if value is None:
            raise UnsupportedModelError(f"the shared prefix's forward never reached {point.name}")
        rows, heads, p = len(like), like.shape[1], self.length
        fill = 0.0 if point.part == "pattern" else max(self.hidden, torch.finfo(like.dtype).min)
        out = like.new_full((rows, heads, p, like.shape[3]), fill)
        for group in self._groups(like.device):
            where = slice(None) if group.rows is None else group.rows
            out[where, :, :, group.pad : group.pad + p] = value.to(like.dtype)
        self._rows[point.name] = out
        return out

    def widen(self, point: Point, value: torch.Tensor) -> torch.Tensor:
        """The full batch's value [batch, P + width, ...] from the rest's ``value`` [batch, width, ...]; inside
        attention [batch, heads, P + width, P + width] from the rest's queries over every key
        [batch, heads, width, P + width]."""
        if point.axis == "pattern":
            return self._take(torch.cat([value, self._prefix_rows(point, value)], dim=2), "source", 2)
        prefix = self.values.get(point.name)
        if prefix is None:
            raise UnsupportedModelError(f"the shared prefix's forward never reached {point.name}")
        side = torch.cat([value, prefix.to(value.dtype).expand(len(value), *prefix.shape[1:])], dim=1)
        return self._take(side, "source", 1)

    def narrow(self, point: Point, full: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The rest's part of ``full`` after the hooks (``value`` itself where they changed nothing there).

        PrefixChanged when the prefix's part of ``full`` differs from what :meth:`widen` put there.
        """
        groups = self._groups(full.device)
        if point.axis == "pattern":
            rows, dim = self._rows.pop(point.name), 2
            expected = [rows if g.rows is None else rows.index_select(0, g.rows) for g in groups]
        else:
            kept, dim = self.values[point.name].to(full.dtype), 1
            expected = [kept] * len(groups)
        same = all(torch.equal(f, e.expand_as(f)) for f, e in zip(self._prefix_part(full, dim), expected))
        if not same:
            raise PrefixChanged(point.name)
        out = self._take(full, "rest", dim)
        return value if torch.equal(out, value) else out


@dataclass(frozen=True)
class _Rows:
    """Rows of the batch with the same padding: their indices (None: every row), the padding, and their columns
    (:meth:`Layout._take`)."""

    rows: torch.Tensor | None
    pad: int
    columns: dict[str, torch.Tensor]


#: The layout of the hooked forward running on a model now, if it runs on a shared prefix.
SHARED: weakref.WeakKeyDictionary[nn.Module, Layout] = weakref.WeakKeyDictionary()


@contextmanager
def suspended(net: nn.Module) -> Iterator[None]:
    """No shared-prefix layout on ``net`` while the context lasts: a full forward run from inside a hook function of a
    forward on a shared prefix sees its own values, not that forward's layout."""
    layout = SHARED.pop(net, None)
    try:
        yield
    finally:
        if layout is not None:
            SHARED[net] = layout


def layout_of(net: Any) -> Layout | None:
    """The shared-prefix layout of the hooked forward running on ``net`` now (None: a full forward)."""
    return SHARED.get(net)


#: The attribute of a hook function that holds its reader of the rows after a shared prefix (:func:`reads_rest`).
_REST = "contllm_rest_reader"

#: reader(value, layout): a value of the rows after the prefix ([batch, width, ...], or [batch, heads, width,
#: P + width] inside attention, keys in the full batch's order) and the layout that places them.
RestReader = Callable[[torch.Tensor, Layout], None]


def reads_rest(fn: Any, reader: RestReader) -> Any:
    """Mark the hook function ``fn`` as one that reads, and never changes, positions after any shared prefix:
    in a forward on a shared prefix ``reader`` is called instead of it, with the rest's own value (no full batch
    is built for it). Returns ``fn``."""
    setattr(fn, _REST, reader)
    return fn


def rest_reader(fn: Any) -> RestReader | None:
    """The reader :func:`reads_rest` gave ``fn`` (None: a hook function that needs the full batch)."""
    return getattr(fn, _REST, None)
