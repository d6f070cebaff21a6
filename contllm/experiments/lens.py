"""Logit lens of the count: E[k] and the top digit read at every layer along a duration sweep.

Each counting item's word is scaled by every factor c of the sweep; the residual stream
at the read position after each decoder layer (``blocks.{i}.hook_resid_post``) goes
through the model's final norm and unembedding (and Gemma's final logit softcap where
the config has one), and the digits 0-9 are read out as the counting experiment reads
them. The last row is the model's own output, through the run's engine. Where along
depth the implied count starts to follow c is where duration has become count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from contllm import metrics
from contllm.errors import ExperimentError
from contllm.experiments.base import Metric, RunContext, Table
from contllm.experiments.inside import (
    Prompt,
    SweepInsideConfig,
    SweepInsideExperiment,
    digit_sets,
    implied_counts,
    layer_cache,
    prompt_of,
    sweep_inside_options,
)
from contllm.experiments.records import IntArray, ItemRecords, Record
from contllm.internals.activation_cache import unembed


@dataclass
class LensRecord(Record, what="lens record"):
    """One item's lens: factors [S]; counts, top [layers + 1, S] (E[k] and the most probable digit; the last
    row is the model's output); lens_max_dp: largest probability difference between the last layer's lens and
    the model's output (the lens's own check)."""

    item_id: str
    factors: np.ndarray
    counts: np.ndarray
    top: IntArray
    lens_max_dp: float
    truth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def spearman(self) -> np.ndarray:
        """Spearman correlation of each row's E[k] with the factor: [layers + 1]."""
        return np.array([metrics.spearman(self.factors, row) for row in self.counts])


class LensResult(ItemRecords[LensRecord], record=LensRecord):
    """Every item's lens from one run (``items``), with the configuration that made it."""


def lens_item(lm: Any, item_id: str, prompt: Prompt, factors: np.ndarray, evaluate: Any) -> LensRecord:
    signals, names, cache = layer_cache(lm, prompt, factors, "hook_resid_post")
    sets = digit_sets(lm)
    stacked = torch.stack([cache[name][:, 0] for name in names])  # [layers, S, hidden]
    lens_logits = unembed(lm, stacked)
    counts, probs = implied_counts(lens_logits, sets)
    output = evaluate(signals).float().cpu()
    out_counts, out_probs = implied_counts(torch.log(output.clamp_min(1e-30)), sets)
    lens_dp = float((torch.softmax(lens_logits[-1], dim=-1) - output).abs().max())
    all_counts = np.vstack([counts, out_counts[None]])
    top = np.vstack([probs.argmax(-1), out_probs.argmax(-1)[None]])
    return LensRecord(
        item_id, np.asarray(factors, dtype=np.float64), all_counts, top, lens_dp, prompt.truth, dict(prompt.meta)
    )


class LensExperiment(SweepInsideExperiment[LensRecord, LensResult]):
    name = "lens"
    help = "Logit lens of the count: E[k] and the top digit at every layer along a duration sweep."
    description = (
        "Each counting item's word is scaled by every factor c of --range; the residual stream at the read "
        "position after each layer goes through the final norm and unembedding and the digits 0-9 are read out. "
        "The last row is the model's output. Item ids are the counting dataset's; --first N takes its first N."
    )
    Config = SweepInsideConfig
    options = sweep_inside_options(2)
    figure = "lens_figure"
    result_type = LensResult
    metrics = Metric.table(
        """
        output_spearman        higher  Spearman correlation of the output E[k] with c, mean over items
        first_following_layer  lower   first layer whose lens E[k] follows c: mean Spearman correlation 0.8 or more, and a range over the sweep at least half the output's
        lens_max_dp            lower   largest probability difference between the last layer's lens and the model's output
        """
    )

    def run_item(self, lm: Any, config: SweepInsideConfig, item: Any, context: RunContext) -> LensRecord:
        return lens_item(lm, item.id, prompt_of(lm, item, config), config.factors(), context.evaluate)

    def tables(self, result: LensResult) -> dict[str, Table]:
        rows = [
            {
                "item": r.item_id,
                "layer": "output" if i == len(r.counts) - 1 else i,
                "factor": float(c),
                "implied_count": float(r.counts[i, j]),
                "top_digit": int(r.top[i, j]),
            }
            for r in result.items
            for i in range(len(r.counts))
            for j, c in enumerate(r.factors)
        ]
        return {"results": (["item", "layer", "factor", "implied_count", "top_digit"], rows)}

    def summary(self, result: LensResult) -> dict[str, Any]:
        """Spearman of E[k] with c and its range over the sweep, at the output and per layer; the first layer that
        follows c; the lens check."""
        if not result.items:
            raise ExperimentError("the result holds no items")
        rhos = np.array([r.spearman() for r in result.items])
        spans = np.array([np.ptp(r.counts, axis=1) for r in result.items])
        with np.errstate(all="ignore"):
            mean = np.nanmean(rhos, axis=0)
            span = np.nanmean(spans, axis=0)
        # Rank order alone is noise where E[k] hardly moves: a following layer also moves half as far as the output.
        following = np.flatnonzero((mean[:-1] >= 0.8) & (span[:-1] >= 0.5 * span[-1]))
        return {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(result.items),
            "output_spearman": float(mean[-1]),
            "first_following_layer": int(following[0]) if len(following) else None,
            "spearman_by_layer": [round(float(v), 4) for v in mean[:-1]],
            "output_range": float(span[-1]),
            "range_by_layer": [round(float(v), 4) for v in span[:-1]],
            "lens_max_dp": max(r.lens_max_dp for r in result.items),
        }


EXPERIMENT = LensExperiment()
