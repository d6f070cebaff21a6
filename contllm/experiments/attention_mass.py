"""Attention mass on the scaled tokens: which heads follow the log(c) bias and which compensate.

Scaling a token's duration by c adds log(c) to every attention logit on it
(:mod:`contllm.core.attention`). For each counting item and each factor c of the sweep, the
attention probabilities of the read position (``blocks.{i}.attn.hook_pattern``) are summed
over the scaled tokens: the *mass* m(c) of each layer and head. A head whose scores do
not change passes the bias straight through, so its odds m / (1 - m) are c times those
at c = 1: its slope of logit(m) against log(c) is 1. A slope near 0 means the head
compensates (its mass stays put); above 1, it amplifies. Patterns come from the eager
attention (a model loaded with sdpa runs it for this experiment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contllm.errors import ExperimentError
from contllm.experiments.base import Metric, RunContext, Table
from contllm.experiments.inside import (
    Prompt,
    SweepInsideConfig,
    SweepInsideExperiment,
    layer_cache,
    prompt_of,
    sweep_inside_options,
)
from contllm.experiments.records import ItemRecords, Record

#: Mass is clipped to [EPS, 1 - EPS] before its logit is taken.
EPS = 1e-9
#: A head "follows" the bias when its slope lies within this distance of 1, "compensates" below COMPENSATES.
FOLLOWS = 0.25
COMPENSATES = 0.5


@dataclass
class MassRecord(Record, what="attention-mass record"):
    """One item: factors [S]; mass [S, layers, heads] on the scaled tokens at the read position; slopes
    [layers, heads] of logit(mass) against log(c) (least squares over the sweep)."""

    item_id: str
    factors: np.ndarray
    mass: np.ndarray
    slopes: np.ndarray
    scaled: list[int]
    truth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class MassResult(ItemRecords[MassRecord], record=MassRecord):
    """Every item's attention mass from one run (``items``), with the configuration that made it."""


def log_odds_slopes(factors: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Least-squares slope of logit(mass) [S, ...] against log(factors) [S]: [...]."""
    x = np.log(np.asarray(factors, dtype=np.float64))
    m = np.clip(mass, EPS, 1 - EPS)
    y = np.log(m) - np.log1p(-m)
    xc = x - x.mean()
    return np.tensordot(xc, y - y.mean(axis=0), axes=(0, 0)) / float(xc @ xc)


def mass_item(lm: Any, item_id: str, prompt: Prompt, factors: np.ndarray) -> MassRecord:
    _, names, cache = layer_cache(lm, prompt, factors, "attn.hook_pattern")
    scaled = list(prompt.scaled)
    # [S, heads, 1, tokens] per layer -> mass [S, layers, heads]
    mass = np.stack([cache[name][:, :, 0, scaled].sum(-1).double().numpy() for name in names], axis=1)
    return MassRecord(
        item_id,
        np.asarray(factors, dtype=np.float64),
        mass,
        log_odds_slopes(factors, mass),
        scaled,
        prompt.truth,
        dict(prompt.meta),
    )


class AttentionMassExperiment(SweepInsideExperiment[MassRecord, MassResult]):
    name = "attention-mass"
    help = "Per layer and head, the attention the read position pays to the scaled tokens as c varies, against log(c)."
    description = (
        "Each counting item's word is scaled by every factor c of --range; the read position's attention "
        "probabilities are summed over the scaled tokens in every layer and head, and the slope of their log-odds "
        "against log(c) says whether a head follows the log(c) bias (1) or compensates (0). Item ids are the "
        "counting dataset's; --first N takes its first N."
    )
    Config = SweepInsideConfig
    options = sweep_inside_options(2)
    figure = "attention_mass_figure"
    result_type = MassResult
    metrics = Metric.table(
        f"""
        median_slope        higher  median over heads of the slope of logit(mass) against log(c) (1: the bias alone)
        share_following     higher  share of heads whose slope lies within {FOLLOWS} of 1
        share_compensating  lower   share of heads whose slope is below {COMPENSATES}
        """
    )

    def figure_options(self) -> dict[str, Any]:
        return {"follows": FOLLOWS, "compensates": COMPENSATES}

    def run_item(self, lm: Any, config: SweepInsideConfig, item: Any, context: RunContext) -> MassRecord:
        return mass_item(lm, item.id, prompt_of(lm, item, config), config.factors())

    def tables(self, result: MassResult) -> dict[str, Table]:
        rows = [
            {
                "item": r.item_id,
                "factor": float(c),
                "layer": i,
                "head": h,
                "mass": float(r.mass[j, i, h]),
                "slope": float(r.slopes[i, h]),
            }
            for r in result.items
            for j, c in enumerate(r.factors)
            for i in range(r.mass.shape[1])
            for h in range(r.mass.shape[2])
        ]
        return {"results": (["item", "factor", "layer", "head", "mass", "slope"], rows)}

    def summary(self, result: MassResult) -> dict[str, Any]:
        """Median slope over heads (mean over items), shares that follow and compensate, the extreme heads."""
        if not result.items:
            raise ExperimentError("the result holds no items")
        slopes = np.nanmean([r.slopes for r in result.items], axis=0)
        flat = slopes.flatten()
        heads = slopes.shape[1]
        low, high = int(np.nanargmin(flat)), int(np.nanargmax(flat))
        return {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(result.items),
            "median_slope": float(np.nanmedian(flat)),
            "share_following": float(np.mean(np.abs(flat - 1) <= FOLLOWS)),
            "share_compensating": float(np.mean(flat < COMPENSATES)),
            "most_compensating_head": f"L{low // heads}H{low % heads}",
            "min_slope": float(flat[low]),
            "most_amplifying_head": f"L{high // heads}H{high % heads}",
            "max_slope": float(flat[high]),
            "median_slope_by_layer": [round(float(v), 4) for v in np.nanmedian(slopes, axis=1)],
        }


EXPERIMENT = AttentionMassExperiment()
