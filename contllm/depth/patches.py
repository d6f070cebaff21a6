"""Scoped patches of the layer stack: every change is a context manager that restores the model on exit.

* :func:`scaled_updates`: layers compute h + alpha f_l(h), alpha in [0, 2];
* :func:`half_steps`: a layer takes two Euler half steps instead of one step;
* :func:`injected`: a perturbation is added to a layer's input;
* :func:`recording`: h_0 .. h_L of every forward are collected;
* :func:`replayed`: early layers return what they returned in a trace (a shortcut for
  forwards whose changes all lie later).

Hooks are removed on exit, also when the body raises; with none active the model is the
stock one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch

from contllm.depth.stack import LayerCall, LayerStack, Trace, check_no_cache
from contllm.errors import ExperimentError
from contllm.internals.hooks import (
    first_output,
    hidden_of,
    input_hook,
    output_hook,
    replace_first_output,
    replaced_forward,
    with_hidden,
)

ALPHA_RANGE = (0.0, 2.0)

Rule = Callable[[LayerCall, torch.Tensor, torch.Tensor], torch.Tensor]


@contextmanager
def _layer_rules(stack: LayerStack, rules: Mapping[int, Rule]) -> Iterator[None]:
    """Replace layer l's output by rules[l](call, h, Φ_l(h)) for as long as the context lasts."""

    def hook_for(rule: Callable) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            h = hidden_of(args, kwargs)
            return replace_first_output(output, rule(LayerCall(module, args, kwargs), h, first_output(output)))

        return hook

    with ExitStack() as hooks:
        for index, rule in rules.items():
            hooks.enter_context(output_hook(stack.layers[index], hook_for(rule)))
        yield


def check_alpha(alpha: float) -> float:
    """alpha as a float in [0, 2]; ExperimentError otherwise."""
    low, high = ALPHA_RANGE
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ExperimentError(f"alpha must be a number in [{low:g}, {high:g}], got {alpha!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ExperimentError(f"alpha must lie in [{low:g}, {high:g}], got {alpha!r}")
    return value


Alpha = float | Sequence[float]


@contextmanager
def scaled_updates(stack: LayerStack, alpha: Alpha | Mapping[int, Alpha]) -> Iterator[None]:
    """Layers compute h + alpha f_l(h) instead of h + f_l(h) while the context lasts.

    alpha: one value for every layer, or {layer: alpha} for some (others unchanged);
    each in [0, 2]. A value may also be a sequence of one alpha per batch row (for
    :meth:`LayerStack.forward_rows`). Layers with alpha = 1 are left untouched, so their
    output is bitwise the stock one; alpha = 0 returns the layer's input exactly.
    """
    alphas = {i: alpha for i in range(stack.n_layers)} if not isinstance(alpha, Mapping) else dict(alpha)
    rules: dict[int, Callable] = {}
    for layer, value in alphas.items():
        index = stack.layer_index(layer)
        if isinstance(value, (int, float, np.integer, np.floating)):
            a: Any = check_alpha(value)
            if a == 1.0:
                continue
        else:
            per_row = [check_alpha(v) for v in value]
            if all(v == 1.0 for v in per_row):
                continue
            a = torch.tensor(per_row, dtype=torch.float64)[:, None, None]

        def rule(call: LayerCall, h: torch.Tensor, out: torch.Tensor, a: Any = a) -> torch.Tensor:
            weight = a.to(device=h.device, dtype=h.dtype) if isinstance(a, torch.Tensor) else a
            # lerp is exact at both ends: h at 0, Φ(h) at 1.
            return torch.lerp(h, out, weight)

        rules[index] = rule
    with _layer_rules(stack, rules):
        yield


def half_step(
    call: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Two Euler half steps of the update of ``call`` (Φ): h' = h + f(h)/2, h'' = h' + f(h')/2.

    out: Φ(h) when already known. Returns h''.
    """
    out = call(h) if out is None else out
    middle = torch.lerp(h, out, 0.5)
    return torch.lerp(middle, call(middle), 0.5)


@contextmanager
def half_steps(stack: LayerStack, layers: Iterable[int] | None = None) -> Iterator[None]:
    """Each chosen layer (None: all) takes two half steps instead of one step while the context lasts."""
    chosen = range(stack.n_layers) if layers is None else [stack.layer_index(i) for i in layers]

    def rule(call: LayerCall, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        check_no_cache(call.args, call.kwargs)
        return half_step(call, h, out)

    with _layer_rules(stack, {i: rule for i in chosen}):
        yield


@contextmanager
def injected(stack: LayerStack, layer: int, delta: torch.Tensor) -> Iterator[None]:
    """Add delta to the input of ``layer`` while the context lasts.

    delta: [tokens, hidden] for every batch row, or [rows, tokens, hidden], one per row.
    """
    index = stack.layer_index(layer)

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        h = hidden_of(args, kwargs)
        return with_hidden(args, kwargs, h + delta.to(device=h.device, dtype=h.dtype))

    with input_hook(stack.layers[index], hook):
        yield


@contextmanager
def recording(stack: LayerStack) -> Iterator[list[torch.Tensor]]:
    """Yield a list that fills with h_0 .. h_L ([batch, tokens, hidden] each) during forwards in the context."""
    states: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        states.append(hidden_of(args, kwargs).detach())

    with ExitStack() as hooks:
        for module in [*stack.layers, stack.norm]:
            hooks.enter_context(input_hook(module, hook))
        yield states


@contextmanager
def replayed(stack: LayerStack, trace: Trace, upto: int) -> Iterator[None]:
    """Layers 0 .. upto - 1 return what they returned in ``trace`` instead of computing it.

    For forwards of the same prompt whose changes all lie at layer ``upto`` or later:
    the earlier layers would compute exactly the recorded values, so the result is the
    same and the forward costs only the layers from ``upto`` on. Hooks on the replayed
    layers still fire. The layers' own ``forward`` is restored on exit.
    """
    if not 0 <= upto <= stack.n_layers or len(trace.outputs) != stack.n_layers:
        raise ExperimentError(f"cannot replay {upto} of {stack.n_layers} layers from this trace")

    def copy(output: Any, rows: int) -> Any:
        # A fresh tensor per call, repeated over the batch rows of the forward.
        if isinstance(output, torch.Tensor):
            return output.expand(rows, *output.shape[1:]).clone()
        if isinstance(output, (tuple, list)):
            return type(output)(copy(o, rows) for o in output)
        return output

    def replay(output: Any) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return copy(output, hidden_of(args, kwargs).shape[0])

        return forward

    with ExitStack() as patches:
        for index in range(upto):
            patches.enter_context(replaced_forward(stack.layers[index], replay(trace.outputs[index])))
        yield
