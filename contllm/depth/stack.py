"""The layer stack of a stock causal LM, read along depth: h_0 .. h_L and each layer as a function of h.

:class:`LayerStack` finds the decoder layers and the final norm through the family
table (:mod:`contllm.core.families`); :meth:`LayerStack.trace` runs one prompt and records
every layer's input, the arguments it was called with (a :class:`LayerCall`, Φ_l as a
function of h) and what it returned. Forwards never use a KV cache: the probes call a
layer again with the arguments it got, which would append to a cache twice.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from contllm.core.families import decoder_layers, final_norm, model_of
from contllm.errors import ExperimentError, UnsupportedModelError
from contllm.internals.hooks import first_output, hidden_of, input_hook, output_hook, with_hidden


def layer_index(layer: int, n_layers: int) -> int:
    """``layer`` (negative from the end) as an index 0 .. n_layers - 1; ExperimentError outside the model."""
    n = n_layers
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -n <= int(layer) < n:
        raise ExperimentError(f"layer {layer} is outside the model; it has {n} layers (0 to {n - 1}, or -{n} to -1)")
    return int(layer) % n


def check_no_cache(args: tuple, kwargs: dict) -> None:
    """ExperimentError when a layer was called with use_cache=True (the probes call layers twice)."""
    if kwargs.get("use_cache"):
        raise ExperimentError("depth probes call layers twice and cannot run with a KV cache; pass use_cache=False")


@dataclass
class LayerCall:
    """One decoder layer with the arguments it received in a forward: Φ_l as a function of h.

    Calling it runs the layer's ``forward`` directly (no hooks fire) on new hidden states
    [batch, tokens, hidden] with the same attention mask, position embeddings and other
    arguments, and returns the layer's hidden-state output.
    """

    layer: torch.nn.Module
    args: tuple
    kwargs: dict

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        args, kwargs = with_hidden(self.args, self.kwargs, h)
        return first_output(self.layer.forward(*args, **kwargs))

    def update(self, h: torch.Tensor) -> torch.Tensor:
        """f_l(h) = Φ_l(h) - h."""
        return self(h) - h


@dataclass
class Trace:
    """A stock forward of one prompt, read along depth.

    input_ids: [tokens]. states: [layers + 1, tokens, hidden], h_0 (the first layer's
    input) to h_L (the final norm's input), in the model's dtype. calls: one
    :class:`LayerCall` per layer. logits: [tokens, vocab], float32. keep: [tokens] bool,
    the positions that enter statistics (all but the first, by default). outputs: what
    each layer returned (a tensor or a tuple), for :func:`replayed`.
    """

    input_ids: torch.Tensor
    states: torch.Tensor
    calls: list[LayerCall]
    logits: torch.Tensor
    keep: torch.Tensor
    outputs: list[Any] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.calls)

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[-1])

    def h(self, layer: int) -> torch.Tensor:
        """h_layer with a batch dimension: [1, tokens, hidden]."""
        return self.states[layer][None]

    def updates(self) -> torch.Tensor:
        """f_l(h_l) = h_{l+1} - h_l for every layer: [layers, tokens, hidden]."""
        return self.states[1:] - self.states[:-1]


class LayerStack:
    """The decoder layers of a stock causal LM, with hooks to read and rewrite the residual stream.

    model: a transformers causal LM of a supported family (tiny random ones included),
    or a ContinuousLM (its ``.model`` is used).
    """

    def __init__(self, model: Any) -> None:
        self.model: Any = model_of(model)  # a transformers causal LM: its methods are not nn.Module's
        self.layers = decoder_layers(model)
        self.norm = final_norm(model)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def layer_index(self, layer: int) -> int:
        """A layer index (negative from the end) checked against the model; ExperimentError outside."""
        return layer_index(layer, self.n_layers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [tokens, vocab] (float32) of one prompt, input_ids [tokens], without a KV cache."""
        return self.forward_rows(input_ids, 1)[0]

    def forward_rows(self, input_ids: torch.Tensor, rows: int) -> torch.Tensor:
        """Logits [rows, tokens, vocab] (float32) of one prompt repeated in ``rows`` batch rows.

        Patches that act per row (several alphas, several perturbations) then cost one
        batched forward instead of one forward each.
        """
        ids = input_ids.reshape(1, -1).expand(rows, -1).to(self.device)
        with torch.no_grad():
            return self.model(input_ids=ids, use_cache=False).logits.float()

    def trace(self, input_ids: torch.Tensor, *, skip_first: bool = True) -> Trace:
        """Run one prompt and record every layer's input, its call arguments and the logits."""
        inputs: dict[int, torch.Tensor] = {}
        calls: dict[int, LayerCall] = {}
        outputs: dict[int, Any] = {}
        final: list[torch.Tensor] = []

        def recorder(index: int) -> Callable:
            def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
                inputs[index] = hidden_of(args, kwargs).detach()
                calls[index] = LayerCall(module, args, kwargs)

            return hook

        def output_recorder(index: int) -> Callable:
            def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
                outputs[index] = output

            return hook

        def norm_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            final.append(hidden_of(args, kwargs).detach())

        with ExitStack() as hooks:
            for i, layer in enumerate(self.layers):
                hooks.enter_context(input_hook(layer, recorder(i)))
                hooks.enter_context(output_hook(layer, output_recorder(i)))
            hooks.enter_context(input_hook(self.norm, norm_hook))
            logits = self.forward(input_ids)
        if len(inputs) != self.n_layers or len(final) != 1:
            raise UnsupportedModelError(
                f"expected each of {self.n_layers} layers and the final norm to run once; "
                f"saw {len(inputs)} layers and {len(final)} norm calls"
            )
        for call in calls.values():
            check_no_cache(call.args, call.kwargs)
        states = torch.stack([inputs[i][0] for i in range(self.n_layers)] + [final[0][0]])
        keep = torch.ones(states.shape[1], dtype=torch.bool)
        if skip_first and len(keep) > 1:
            keep[0] = False
        ordered = range(self.n_layers)
        return Trace(
            input_ids.reshape(-1).cpu(),
            states,
            [calls[i] for i in ordered],
            logits,
            keep,
            [outputs[i] for i in ordered],
        )
