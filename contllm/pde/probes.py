"""What the dynamics do: output distributions, perplexity, and the attention distance profile.

* :func:`output_measures`: KL(p_T || p_0), top-1 agreement and entropy of next-token
  distributions against the stock ones.
* :func:`perplexity`: exp of the mean next-token loss of a text.
* :class:`AttentionRecorder`: sees every layer's attention rows in a forward and keeps,
  per layer, the distance profile m(d) (the mean over queries of the weight on the key d
  tokens back, the attention-sink key left out), the long-range mass beyond a distance D,
  the row entropy and any negative mass.
* :func:`fit_exponential` and :func:`fit_power_law`: m(d) ≈ A exp(-d / ℓ) and
  m(d) ≈ B d^(-α), least squares on log m, each with R² (on log m) and AIC.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from contllm.pde.dynamics import DynamicsError

_TINY = torch.finfo(torch.float64).tiny


# ---------------------------------------------------------------------------- outputs


def output_measures(logits: torch.Tensor, reference: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row KL(p || p_ref) (nats), top-1 agreement (0/1) and entropy of p (nats).

    logits, reference: [..., vocab] (the dynamics' and the stock model's logits).
    Returns tensors of shape [...] in float64.
    """
    log_p = torch.log_softmax(logits.to(torch.float64), dim=-1)
    log_q = torch.log_softmax(reference.to(torch.float64), dim=-1)
    p = log_p.exp()
    return {
        "kl": (p * (log_p - log_q)).sum(dim=-1).clamp_min(0.0),
        "top1": (logits.argmax(dim=-1) == reference.argmax(dim=-1)).to(torch.float64),
        "entropy": -(p * log_p).sum(dim=-1),
    }


def perplexity(logits: torch.Tensor, token_ids: torch.Tensor) -> float:
    """exp(mean -log p(token_{i+1} | ..i)) over a text. logits: [tokens, vocab]; token_ids: [tokens]."""
    if logits.shape[0] != token_ids.shape[0] or token_ids.shape[0] < 2:
        raise DynamicsError(
            f"perplexity needs logits for each of >= 2 tokens, got {tuple(logits.shape)} for {token_ids.shape[0]} tokens"
        )
    log_p = torch.log_softmax(logits[:-1].to(torch.float64), dim=-1)
    nll = -log_p.gather(-1, token_ids[1:, None].to(log_p.device)).squeeze(-1)
    return float(torch.exp(nll.mean()))


# ---------------------------------------------------------------------------- the distance profile


class AttentionRecorder:
    """Accumulates, per layer, statistics of the attention rows a forward produces.

    long_range: D of the long-range mass (the mass on keys more than D tokens back).
    The attention sink of a sequence is its first key that any query sees; it is left out
    of the profile and of the long-range mass (it holds most of the mass in most heads
    and would hide the shape of the rest).
    """

    def __init__(self, n_layers: int, long_range: int = 32) -> None:
        self.n_layers = n_layers
        self.long_range = int(long_range)
        self.sums: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64) for _ in range(n_layers)]
        self.counts: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64) for _ in range(n_layers)]
        self.rows = np.zeros(n_layers)
        self.entropy = np.zeros(n_layers)
        self.long_mass = np.zeros(n_layers)
        self.sink_mass = np.zeros(n_layers)
        self.negative_mass = np.zeros(n_layers)

    def add(self, layer: int, weights: torch.Tensor, support: torch.Tensor) -> None:
        """weights: [batch, heads, queries, keys] (float64); support: bool, broadcastable to it."""
        weights = weights.detach().to("cpu", torch.float64)
        batch, heads, queries, keys = weights.shape
        support = torch.broadcast_to(support.detach().cpu(), weights.shape)
        seen = support.any(dim=2, keepdim=True)  # [batch, heads, 1, keys]
        sink = torch.arange(keys)[None, None, None, :] == seen.to(torch.int8).argmax(dim=-1, keepdim=True)
        own = torch.arange(keys - queries, keys)  # key index of each query
        distance = (own[:, None] - torch.arange(keys)[None, :]).expand(batch, heads, queries, keys)
        valid = support & ~sink & (distance >= 0)
        has_row = support.any(dim=-1)
        size = keys
        if self.sums[layer].numel() < size:
            grow = size - self.sums[layer].numel()
            self.sums[layer] = torch.cat([self.sums[layer], torch.zeros(grow, dtype=torch.float64)])
            self.counts[layer] = torch.cat([self.counts[layer], torch.zeros(grow, dtype=torch.float64)])
        d = distance[valid]
        self.sums[layer][:size] += torch.bincount(d, weights=weights[valid], minlength=size)[:size]
        self.counts[layer][:size] += torch.bincount(d, minlength=size)[:size].to(torch.float64)
        n_rows = float(has_row.sum())
        p = torch.where(support, weights.clamp_min(0.0), 0.0)
        entropy = -torch.where(p > 0, p * torch.log(p.clamp_min(_TINY)), 0.0).sum(dim=-1)
        far = torch.where(valid & (distance > self.long_range), weights, 0.0).sum(dim=-1)
        at_sink = torch.where(sink & support, weights, 0.0).sum(dim=-1)
        negative = torch.where(support, weights.clamp_max(0.0), 0.0).sum(dim=-1)
        self.rows[layer] += n_rows
        self.entropy[layer] += float(entropy[has_row].sum())
        self.long_mass[layer] += float(far[has_row].sum())
        self.sink_mass[layer] += float(at_sink[has_row].sum())
        self.negative_mass[layer] += float(negative[has_row].sum())

    def profile(self, layers: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """m(d) for d = 0, 1, ... (NaN where no query has a key at d) and the count of (query, head) pairs per d.

        layers: the layers to pool (each layer's m(d) averaged with equal weight), None for all.
        """
        picks = list(range(self.n_layers)) if layers is None else list(layers)
        size = max(self.sums[i].numel() for i in picks)
        total = np.zeros(size)
        counts = np.zeros(size)
        layers_with = np.zeros(size)
        for i in picks:
            s = np.zeros(size)
            c = np.zeros(size)
            s[: self.sums[i].numel()] = self.sums[i].numpy()
            c[: self.counts[i].numel()] = self.counts[i].numpy()
            total += np.where(c > 0, s / np.where(c > 0, c, 1), 0.0)
            layers_with += c > 0
            counts += c
        profile = np.where(layers_with > 0, total / np.maximum(layers_with, 1), np.nan)
        return profile, counts / max(1, len(picks))

    def layer_means(self) -> dict[str, np.ndarray]:
        """Per layer: mean row entropy, long-range mass, sink mass and negative mass (per row)."""
        rows = np.maximum(self.rows, 1)
        return {
            "entropy": self.entropy / rows,
            "long_range_mass": self.long_mass / rows,
            "sink_mass": self.sink_mass / rows,
            "negative_mass": self.negative_mass / rows,
        }


# ---------------------------------------------------------------------------- fits


@dataclass
class Fit:
    """A least-squares fit of log m(d) on d = d_min..d_max.

    model: "exponential" (m = A exp(-d / scale); scale is the decay length ℓ in tokens) or
    "power" (m = A d^(-scale); scale is the exponent α). r2: of log m. aic: n log(RSS / n) + 2 k
    with k = 3 (two coefficients and the noise variance). n: points used.
    """

    model: str
    amplitude: float
    scale: float
    r2: float
    aic: float
    rss: float
    n: int

    def predict(self, d: np.ndarray) -> np.ndarray:
        d = np.asarray(d, dtype=np.float64)
        if self.model == "exponential":
            return self.amplitude * np.exp(-d / self.scale) if self.scale != 0 else np.full_like(d, np.nan)
        return self.amplitude * d ** (-self.scale)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Slope, intercept, RSS and R² of y ≈ slope x + intercept."""
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    rss = float(residual @ residual)
    tss = float(((y - y.mean()) ** 2).sum())
    return float(slope), float(intercept), rss, (1.0 - rss / tss) if tss > 0 else float("nan")


def _points(m: np.ndarray, d_min: int, d_max: int | None) -> tuple[np.ndarray, np.ndarray]:
    d = np.arange(len(m), dtype=np.float64)
    keep = (d >= max(1, d_min)) & np.isfinite(m) & (m > 0)
    if d_max is not None:
        keep &= d <= d_max
    return d[keep], np.log(m[keep])


def _aic(rss: float, n: int) -> float:
    return n * math.log(max(rss, 1e-300) / n) + 2 * 3


def fit_exponential(m: np.ndarray, d_min: int = 1, d_max: int | None = None) -> Fit | None:
    """m(d) ≈ A exp(-d / ℓ) on d_min..d_max (None if fewer than 3 usable points)."""
    d, y = _points(m, d_min, d_max)
    if len(d) < 3:
        return None
    slope, intercept, rss, r2 = _fit_line(d, y)
    scale = -1.0 / slope if slope != 0 else math.inf
    return Fit("exponential", math.exp(intercept), scale, r2, _aic(rss, len(d)), rss, len(d))


def fit_power_law(m: np.ndarray, d_min: int = 1, d_max: int | None = None) -> Fit | None:
    """m(d) ≈ B d^(-α) on d_min..d_max (None if fewer than 3 usable points)."""
    d, y = _points(m, d_min, d_max)
    if len(d) < 3:
        return None
    slope, intercept, rss, r2 = _fit_line(np.log(d), y)
    return Fit("power", math.exp(intercept), -slope, r2, _aic(rss, len(d)), rss, len(d))


def compare_fits(m: np.ndarray, d_min: int = 1, d_max: int | None = None) -> dict[str, Any]:
    """Both fits and which decay the AIC prefers ("exponential", "power", or None without fits)."""
    exp_fit, pow_fit = fit_exponential(m, d_min, d_max), fit_power_law(m, d_min, d_max)
    better = None
    if exp_fit is not None and pow_fit is not None:
        better = "power" if pow_fit.aic < exp_fit.aic else "exponential"
    return {
        "exponential": None if exp_fit is None else exp_fit.to_dict(),
        "power": None if pow_fit is None else pow_fit.to_dict(),
        "preferred": better,
        "delta_aic": None if better is None else float(pow_fit.aic - exp_fit.aic),  # type: ignore[union-attr]
    }
