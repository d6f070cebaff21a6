"""The continuous attention: an additive float mask and float positions.

Integrating attention over a piecewise-constant signal with the rectangle rule gives

    attn(i) = sum_j [t_j <= t_i] d_j exp(s_ij) v_j / sum_j [t_j <= t_i] d_j exp(s_ij),

which is the stock softmax attention with an additive bias log(d_j) and a causal mask
by time. Both go into the model as a 4D float ``attention_mask`` (one per kind of layer
where layers differ), which transformers hands unchanged to its eager and sdpa
attention functions on every supported family; rotary families take the float times as
``position_ids``. Nothing in transformers is copied or forked. The one patch needed,
for learned absolute position tables (GPT-2), is scoped by :func:`continuous_positions`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from contllm.core.families import Family, attention_modules, layer_windows, model_of
from contllm.errors import UnsupportedModelError
from contllm.internals.hooks import replaced_module

# Re-exported: the attention modules and the model behind a ContinuousLM are read from the
# family table, and contllm.pde and contllm.core.precision import them from here.
__all__ = [
    "InterpolatedPositions",
    "attention_modules",
    "continuous_positions",
    "model_masks",
    "model_of",
    "stock_eager",
    "switched_attention",
    "time_mask",
]


def time_mask(
    query_times: torch.Tensor,
    key_times: torch.Tensor,
    key_durations: torch.Tensor,
    *,
    window: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The additive attention mask of continuous time.

    query_times: [batch, queries]; key_times, key_durations: [batch, keys] (durations >= 0).
    window: keys with t_i - t_j >= window are hidden (transformers' sliding window, in time
        units), or None.
    Returns [batch, 1, queries, keys] in ``dtype``: log(d_j) where key j is visible to
    query i (t_j <= t_i, inside the window, d_j > 0), else ``finfo(dtype).min``. The
    minimum rather than -inf keeps a fully hidden row (a padding query) finite.
    """
    # Compare in float64: the bookkeeping of times must not round (bf16 turns 1000.3 into 1000).
    qt = query_times.to(torch.float64)[:, :, None]
    kt = key_times.to(torch.float64).to(qt.device)[:, None, :]
    durations = key_durations.to(torch.float64).to(qt.device)
    visible = (kt <= qt) & (durations > 0)[:, None, :]
    if window is not None:
        visible &= (qt - kt) < window
    # The bias in float32 (where every mask but a float64 one ends), or float64 for a float64 mask.
    kept = torch.float64 if dtype == torch.float64 else torch.float32
    bias = torch.log(durations.clamp_min(torch.finfo(torch.float64).tiny)).to(kept)[:, None, :]
    mask = torch.where(visible, bias, torch.tensor(torch.finfo(dtype).min, dtype=kept, device=qt.device))
    return mask[:, None].to(dtype)


def model_masks(
    family: Family,
    config: Any,
    query_times: torch.Tensor,
    key_times: torch.Tensor,
    key_durations: torch.Tensor,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The ``attention_mask`` argument for a model of ``family``: one 4D mask, or one per layer type."""
    windows = layer_windows(family, config)
    if isinstance(windows, dict):
        built: dict[float | None, torch.Tensor] = {}
        out = {}
        for kind, window in windows.items():
            if window not in built:
                built[window] = time_mask(query_times, key_times, key_durations, window=window, dtype=dtype).to(device)
            out[kind] = built[window]
        return out
    return time_mask(query_times, key_times, key_durations, window=windows, dtype=dtype).to(device)


class InterpolatedPositions(nn.Module):
    """A learned position table read at float positions by linear interpolation.

    At integer positions it returns the table's rows bitwise; positions outside the
    table are clamped to its ends.
    """

    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table = table

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if not positions.is_floating_point():
            return self.table(positions)
        weight = self.table.weight
        p = positions.to(torch.float32).clamp(0, weight.shape[0] - 1)
        lo = p.floor()
        frac = (p - lo).to(weight.dtype).unsqueeze(-1)
        lo = lo.long()
        hi = (lo + 1).clamp(max=weight.shape[0] - 1)
        return weight[lo] * (1 - frac) + weight[hi] * frac


def _owner(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent_path, _, name = path.rpartition(".")
    for root in (model, getattr(model, "base_model", model)):
        try:
            parent = root.get_submodule(parent_path) if parent_path else root
        except AttributeError:
            parent = None
        if parent is not None and isinstance(getattr(parent, name, None), nn.Module):
            return parent, name
        if isinstance(getattr(root, name, None), nn.Module):
            return root, name
    raise AttributeError(f"no position table at {path!r} in {type(model).__name__}")


@contextmanager
def continuous_positions(model: nn.Module, family: Family) -> Iterator[None]:
    """Let ``model`` take float position ids for as long as the context lasts.

    Rotary families already accept float positions and are left untouched. A learned
    table is swapped for an :class:`InterpolatedPositions` view of itself and put back
    on exit, also when the body raises.
    """
    if family.positions != "learned":
        yield
        return
    assert family.position_table is not None
    parent, name = _owner(model, family.position_table)
    original = getattr(parent, name)
    if isinstance(original, InterpolatedPositions):  # already inside an outer context
        yield
        return
    with replaced_module(parent, name, InterpolatedPositions(original)):
        yield


def stock_eager(module: nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The eager attention function of the modeling file that defines ``module``'s class."""
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if function is None:
        raise UnsupportedModelError(
            f"{type(module).__name__} has no eager attention function in {type(module).__module__}"
        )
    return function


@contextmanager
def switched_attention(model: nn.Module, modules: Sequence[nn.Module], name: str) -> Iterator[dict[int, str]]:
    """Point ``model`` and its attention ``modules`` at the attention function registered as ``name``.

    Yields the implementation each config had before, by ``id(config)``; every config gets
    it back on exit, also when the body raises.
    """
    configs: list[Any] = []
    for config in [getattr(model, "config", None), *(getattr(m, "config", None) for m in modules)]:
        if config is not None and all(config is not c for c in configs):
            configs.append(config)
    saved = {id(config): config._attn_implementation for config in configs}
    try:
        for config in configs:
            config._attn_implementation = name
        yield saved
    finally:
        for config in configs:
            config._attn_implementation = saved[id(config)]
