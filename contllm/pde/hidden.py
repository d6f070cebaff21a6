"""The hidden-state variant: causal smoothing of each layer's output along the token axis.

Smoothing hidden states with a two-sided stencil after each layer lets every token read
the tokens after it. The causal form here takes k = ceil(T / 0.25) steps of
τ = T / k of the one-sided (backward) difference

    h_i <- h_i + τ (h_{i-1} - h_i),

with nothing flowing into the first token. After k steps token i holds a binomial
average of itself and the tokens before it (Binomial(k, τ) weights on the lags, the
weight of lags that reach past the first token given to the first token), so no output
depends on a later token. The k steps are applied at once as that lower-triangular
matrix. Tokens a query cannot see itself at (padding, zero durations) are skipped.

With a KV cache, each layer keeps the unsmoothed outputs of the tokens it has seen, so
that a cached continuation smooths exactly as the full forward would.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from contllm.core.families import decoder_layers, model_of
from contllm.internals.hooks import cache_of, first_output, output_hook, replace_first_output
from contllm.pde.dynamics import STEP, DynamicsError


@lru_cache(maxsize=64)
def smoothing_matrix(length: int, T: float) -> torch.Tensor:
    """The k causal smoothing steps on ``length`` tokens as a [length, length] float64 lower-triangular matrix."""
    if T == 0 or length == 0:
        return torch.eye(length, dtype=torch.float64)
    k = math.ceil(T / STEP)
    tau = T / k
    lags = torch.arange(length, dtype=torch.float64)
    log_pmf = (
        math.lgamma(k + 1)
        - torch.lgamma(lags + 1)
        - torch.lgamma((k - lags).clamp_min(0) + 1)
        + lags * math.log(tau)
        + (k - lags) * math.log1p(-tau)
    )
    pmf = torch.where(lags <= k, torch.exp(log_pmf), torch.zeros((), dtype=torch.float64))
    i = lags[:, None]
    j = lags[None, :]
    lag = (i - j).to(torch.long)
    matrix = torch.where(lag >= 0, pmf[lag.clamp_min(0)], torch.zeros((), dtype=torch.float64))
    # Lags that reach past the first token land on it: its weight is P(lag >= i).
    beyond = (1.0 - (torch.cumsum(pmf, 0) - pmf)).clamp_min(0.0)  # P(lag >= i)
    matrix[:, 0] = beyond
    return matrix


def _valid(mask: Any, batch: int, queries: int) -> torch.Tensor:
    """[batch, queries] bool: whether each new token sees itself (False for padding)."""
    if isinstance(mask, dict) or mask is None or not isinstance(mask, torch.Tensor) or mask.ndim != 4:
        return torch.ones(batch, queries, dtype=torch.bool)
    keys = mask.shape[-1]
    own = torch.arange(keys - queries, keys, device=mask.device)
    diagonal = mask[:, 0, -queries:, :][:, torch.arange(queries), own]
    if mask.dtype == torch.bool:
        return diagonal.cpu()
    return (diagonal > torch.finfo(mask.dtype).min).cpu()


class _LayerSmoother:
    def __init__(self, T: float, layer: int) -> None:
        self.T = T
        self.layer = layer
        self.history: torch.Tensor | None = None  # unsmoothed outputs [batch, tokens, hidden]
        self.valid: torch.Tensor | None = None  # [batch, tokens]

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        h = first_output(output)
        batch, queries, _ = h.shape
        valid = _valid(kwargs.get("attention_mask"), batch, queries)
        cache = cache_of(kwargs)
        seen = 0
        if cache is not None and hasattr(cache, "get_seq_length"):
            seen = int(cache.get_seq_length(self.layer)) - queries
        if seen > 0:
            if (
                self.history is None
                or self.valid is None
                or self.history.shape[1] != seen
                or self.history.shape[0] != batch
            ):
                raise DynamicsError(
                    "hidden-state smoothing continued a KV cache it did not see filled; "
                    "open the smoothing context before the prefill"
                )
            history = torch.cat([self.history, h.detach()], dim=1)
            valid_all = torch.cat([self.valid, valid], dim=1)
        else:
            history, valid_all = h.detach(), valid
        self.history, self.valid = history, valid_all
        smoothed = h.clone()
        for b in range(batch):
            keep = torch.nonzero(valid_all[b], as_tuple=True)[0]
            if keep.numel() == 0:
                continue
            matrix = smoothing_matrix(int(keep.numel()), self.T).to(device=h.device)
            new = keep >= history.shape[1] - queries
            rows = matrix[new]
            mixed = (rows.to(torch.float64) @ history[b, keep.to(h.device)].to(torch.float64)).to(h.dtype)
            smoothed[b, keep[new].to(h.device) - (history.shape[1] - queries)] = mixed
        return replace_first_output(output, smoothed)


@contextmanager
def causal_smoothing(model: Any, T: float, *, layer: int | None = None) -> Iterator[None]:
    """Smooth the hidden states after each decoder layer (or one layer) causally over pseudo-time T.

    model: a ContinuousLM or a transformers causal LM. T >= 0 (0 leaves the model stock).
    The hooks are removed on exit, also when the body raises.
    """
    if isinstance(T, bool) or not isinstance(T, (int, float)) or not math.isfinite(T) or T < 0:
        raise DynamicsError(f"pseudo-time T must be a finite number >= 0, got {T!r}")
    net = model_of(model)
    layers = decoder_layers(net)
    n = len(layers)
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n):
        raise DynamicsError(
            f"layer {layer!r} is outside the model; it has {n} layers (0 to {n - 1}, or negative from the end)"
        )
    picks = range(n) if layer is None else [layer % n]
    with ExitStack() as hooks:
        if T > 0:
            for i in picks:
                hooks.enter_context(output_hook(layers[i], _LayerSmoother(float(T), i)))
        yield
