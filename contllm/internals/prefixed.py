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

A hook function that changes a value of the prefix's part (a head ablated at every position)
would change what the prefix computes after it: :meth:`Layout.narrow` raises
:class:`PrefixChanged`, and the call runs again as one full forward of the whole batch, so the
hook functions up to that point are called a second time. Points inside the attention function
(patterns, scores, duration biases, rotated queries and keys) and backward hooks never take
this path.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from contllm.errors import UnsupportedModelError

__all__ = ["SHARED", "Layout", "PrefixChanged", "layout_of", "suspended"]


class PrefixChanged(Exception):
    """A hook function changed a value in the shared prefix's part: the call needs a full forward."""


@dataclass
class Layout:
    """Where the shared prefix sits in each row of the full padded batch, and its values at the hooked points.

    length: the prefix's tokens (P); pad: long [batch], each row's padding columns (the same
    before the prefix in the full batch and before the rest in the batch after it); width:
    the padded width of the rest. values: point name -> its value over the prefix [1, P, ...],
    kept while ``recording`` (the prefix's own forward).
    """

    length: int
    pad: torch.Tensor
    width: int
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    recording: bool = True

    def _indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(full, rest, prefix): for each column of the full batch, its column in [rest, prefix] side by side
        [batch, P + width]; each column of the rest in the full batch [batch, width]; each prefix token's column
        in the full batch [batch, P]."""
        p, pad = self.length, self.pad.to(torch.long)[:, None]
        full = torch.arange(p + self.width)[None, :].expand(len(pad), -1)
        inside = (full >= pad) & (full < pad + p)
        source = torch.where(full < pad, full, torch.where(inside, self.width + full - pad, full - p))
        rest = torch.arange(self.width)[None, :].expand(len(pad), -1)
        rest = torch.where(rest < pad, rest, rest + p)
        prefix = pad + torch.arange(p)[None, :]
        return source.to(device), rest.to(device), prefix.to(device)

    @staticmethod
    def _along(value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``value`` [batch, columns, ...] at ``index`` [batch, k] along the columns."""
        return torch.take_along_dim(value, index.view(*index.shape, *(1,) * (value.ndim - 2)), dim=1)

    def keep(self, name: str, value: torch.Tensor) -> None:
        """The prefix's value at the point ``name`` [1, P, ...], from its own forward."""
        self.values[name] = value.detach()

    def widen(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """The full batch's value [batch, P + width, ...] from the rest's ``value`` [batch, width, ...]."""
        prefix = self.values.get(name)
        if prefix is None:
            raise UnsupportedModelError(f"the shared prefix's forward never reached {name}")
        source, _, _ = self._indices(value.device)
        side = torch.cat([value, prefix.to(value.dtype).expand(len(value), *prefix.shape[1:])], dim=1)
        return self._along(side, source)

    def narrow(self, name: str, full: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """The rest's part of ``full`` after the hooks (``value`` itself where they changed nothing there).

        PrefixChanged when the prefix's part of ``full`` differs from the prefix's own value.
        """
        _, rest, prefix_columns = self._indices(full.device)
        prefix = self.values[name].to(full.dtype)
        if not torch.equal(self._along(full, prefix_columns), prefix.expand(len(full), *prefix.shape[1:])):
            raise PrefixChanged(name)
        out = self._along(full, rest)
        return value if torch.equal(out, value) else out


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
