"""Activation patching between a word at duration c and at duration 1: where does duration become count?

Each counting item runs twice: with every occurrence of the word scaled by c (the
*scaled* run) and at c = 1 (the *plain* run). The two agree on every token before the
first scaled one, so only the tokens from there to the read position differ inside the
model. One site at a time, the scaled run gets the plain run's activation there:

- the residual stream (``blocks.{i}.hook_resid_post``) of each layer at each of those
  tokens (layers x positions);
- each attention head's output (its head of ``blocks.{i}.attn.hook_z``) at all of
  those tokens at once (layers x heads).

A site's *restored share* is (E[k] patched - E[k] scaled) / (E[k] plain - E[k] scaled):
1 where the site carries the whole change of the implied count, 0 where it carries
none. The tokens before the scaled ones run once per item as a shared prefix. Two checks
run with every item: the scaled run patched with its own activations everywhere (max
|dp| must be 0) and with the plain run's last-layer residual at every position (must
give the plain run's output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from contllm.core.engine import evaluation
from contllm.core.families import decoder_layers, head_counts
from contllm.core.prefix import SharedPrefix, slice_signal
from contllm.core.signal import Signal, pad_signals
from contllm.errors import ExperimentError
from contllm.experiments.base import Metric, RunContext, Table, option_table
from contllm.experiments.inside import (
    InsideConfig,
    InsideExperiment,
    Prompt,
    digit_sets,
    implied_counts,
    inside_options,
    prompt_of,
)
from contllm.experiments.records import ItemRecords, Record
from contllm.internals.activations import Patch, patch, recording

#: Patched rows per forward; each row is the few tokens after the shared prefix.
ROWS = 64


@dataclass
class PatchingConfig(InsideConfig):
    """Options of the patching experiment (and :class:`~contllm.experiments.inside.InsideConfig`'s).

    factor: the duration factor c of the scaled run (the plain run has 1).
    heads: also patch each attention head's output (layers x heads more forwards).
    """

    factor: float = 0.5
    heads: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.factor, (int, float)) and 0 < self.factor and self.factor != 1):
            raise ExperimentError(f"--factor must be a positive duration factor other than 1, got {self.factor!r}")


@dataclass
class PatchRecord(Record, what="patching record"):
    """One item's patching.

    positions: the token indices patched (first scaled token to the read position);
    tokens: their text. plain, scaled: E[k] of the two runs; plain_probs, scaled_probs:
    their digit probabilities [10]. resid: restored share [layers, positions]; heads:
    restored share [layers, heads] (empty without --heads). self_max_dp: largest
    probability change from patching the scaled run with its own activations;
    last_layer_max_dp: largest probability difference between the plain run and the
    scaled run patched with the plain run's last-layer residual at every position.
    """

    item_id: str
    factor: float
    positions: list[int]
    tokens: list[str]
    plain: float
    scaled: float
    plain_probs: list[float]
    scaled_probs: list[float]
    resid: np.ndarray
    heads: np.ndarray
    self_max_dp: float
    last_layer_max_dp: float
    truth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


class PatchingResult(ItemRecords[PatchRecord], record=PatchRecord):
    """Every item's patching from one run (``items``), with the configuration that made it."""


Row = dict[str, tuple[list[int], torch.Tensor]]


def forward_rows(
    lm: Any, shared: SharedPrefix, tails: Sequence[Signal], rows: Sequence[Row], shapes: dict[str, tuple[int, ...]]
) -> torch.Tensor:
    """Last-position logits [rows, vocab] of ``tails`` after the shared prefix, row r patched as ``rows[r]`` says.

    A row maps activation names to (tail positions, values [k, *shape]); names a row does
    not list are left alone in it.
    """
    names = sorted({name for row in rows for name in row})
    patches = []
    for name in names:
        empty = torch.empty(0, *shapes[name])
        patches.append(
            Patch(
                name,
                [list(row[name][0]) if name in row else [] for row in rows],
                [row[name][1] if name in row else empty for row in rows],
            )
        )
    with patch(lm, list(tails), patches):
        logits, _ = lm.forward_batch(pad_signals(list(tails)), logits_to_keep=1, prefix=shared.keys)
    return logits[:, -1].float().cpu()


def patch_item(lm: Any, item_id: str, prompt: Prompt, factor: float, *, heads: bool) -> PatchRecord:
    """The patching record of one prompt at duration factor ``factor`` (see the module docstring)."""
    plain, scaled = prompt.signal, prompt.at(factor)
    start = min(prompt.scaled)
    positions = list(range(start, len(plain)))
    layers = len(decoder_layers(lm))
    resid = [f"blocks.{i}.hook_resid_post" for i in range(layers)]
    zs = [f"blocks.{i}.attn.hook_z" for i in range(layers)] if heads else []
    names = resid + zs
    tail = [p - start for p in positions]
    plain_tail, scaled_tail = slice_signal(plain, start), slice_signal(scaled, start)
    sets = digit_sets(lm)
    with evaluation(lm):
        shared = SharedPrefix.compute(lm, plain, start)
        # The values patched in come from the very forward path the patched rows take.
        with recording(lm, [scaled_tail, plain_tail], names, [tail, tail]) as stored:
            runs = lm.forward_batch(pad_signals([scaled_tail, plain_tail]), logits_to_keep=1, prefix=shared.keys)[0]
        shapes = {name: tuple(stored[name][0].shape[1:]) for name in names}

        def value(run: int, name: str) -> torch.Tensor:
            return stored[name][run]

        checks = forward_rows(
            lm,
            shared,
            [scaled_tail, scaled_tail],
            [
                {name: (tail, value(0, name)) for name in names},
                {resid[-1]: (tail, value(1, resid[-1]))},
            ],
            shapes,
        )
        rows: list[Row] = []
        for name in resid:
            for k, p in enumerate(tail):
                rows.append({name: ([p], value(1, name)[k : k + 1])})
        head_count = head_counts(lm)[0] if heads else 0
        for name in zs:
            for h in range(head_count):
                mixed = value(0, name).clone()
                mixed[:, h] = value(1, name)[:, h]
                rows.append({name: (tail, mixed)})
        logits = torch.cat(
            [runs[:, -1].float().cpu()]
            + [
                forward_rows(lm, shared, [scaled_tail] * len(rows[k : k + ROWS]), rows[k : k + ROWS], shapes)
                for k in range(0, len(rows), ROWS)
            ]
        )
    counts, probs = implied_counts(logits, sets)
    before, after = torch.softmax(logits[:2], dim=-1), torch.softmax(checks, dim=-1)
    e_scaled, e_plain = float(counts[0]), float(counts[1])
    change = e_plain - e_scaled
    shares = (counts[2:] - e_scaled) / change if change != 0 else np.full(len(counts) - 2, np.nan)
    n_resid = layers * len(tail)
    return PatchRecord(
        item_id=item_id,
        factor=float(factor),
        positions=positions,
        tokens=prompt.pieces(positions),
        plain=e_plain,
        scaled=e_scaled,
        plain_probs=probs[1].tolist(),
        scaled_probs=probs[0].tolist(),
        resid=shares[:n_resid].reshape(layers, len(tail)),
        heads=shares[n_resid:].reshape(len(zs), head_count) if heads else np.zeros((0, 0)),
        self_max_dp=float((after[0] - before[0]).abs().max()),
        last_layer_max_dp=float((after[1] - before[1]).abs().max()),
        truth=prompt.truth,
        meta=dict(prompt.meta),
    )


class PatchingExperiment(InsideExperiment[PatchRecord, PatchingResult]):
    name = "patching"
    help = "Activation patching between a word at duration c and at 1: which layer, position and head carry the count."
    description = (
        "Each counting item runs with every occurrence of the word scaled by --factor c and at c = 1; the scaled "
        "run gets the plain run's residual stream at one layer and position (from the first scaled token to the "
        "read position), or one attention head's output, at a time. A site's restored share is how much of the "
        "change in the implied count E[k] it brings back (1: all of it). Item ids are the counting dataset's "
        "(count-001, ...); --first N takes its first N items."
    )
    Config = PatchingConfig
    options = (
        *option_table(
            """
            factor  float                      Duration factor c of the scaled run. [default: 0.5]
            heads   bool   --heads/--no-heads  Also patch each attention head's output.
            """
        ),
        *inside_options(2),
    )
    figure = "patching_figure"
    result_type = PatchingResult
    metrics = Metric.table(
        """
        self_patch_max_dp    lower   largest probability change from patching a run with its own activations (0 expected)
        last_layer_max_dp    lower   largest difference to the plain run after patching its last-layer residual (0 expected)
        mean_change          higher  E[k] at c = 1 minus E[k] at c, mean over items: the effect being located
        last_position_layer  lower   first layer whose residual at the read position restores half of the change (mean over items)
        max_head_share       higher  largest restored share of a single attention head (mean over items)
        """
    )

    def run_item(self, lm: Any, config: PatchingConfig, item: Any, context: RunContext) -> PatchRecord:
        return patch_item(lm, item.id, prompt_of(lm, item, config), config.factor, heads=config.heads)

    def tables(self, result: PatchingResult) -> dict[str, Table]:
        rows = [
            {
                "item": r.item_id,
                "site": "resid",
                "layer": i,
                "position": p,
                "token": r.tokens[k],
                "head": "",
                "share": float(r.resid[i, k]),
            }
            for r in result.items
            for i in range(r.resid.shape[0])
            for k, p in enumerate(r.positions)
        ]
        rows += [
            {
                "item": r.item_id,
                "site": "head",
                "layer": i,
                "position": "",
                "token": "",
                "head": h,
                "share": float(r.heads[i, h]),
            }
            for r in result.items
            for i in range(r.heads.shape[0])
            for h in range(r.heads.shape[1])
        ]
        return {"results": (["item", "site", "layer", "position", "token", "head", "share"], rows)}

    def summary(self, result: PatchingResult) -> dict[str, Any]:
        """The checks' worst values, the mean change located, where the read position takes it, the strongest head."""
        if not result.items:
            raise ExperimentError("the result holds no items")
        items = result.items
        out: dict[str, Any] = {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(items),
            "factor": items[0].factor,
        }
        out["self_patch_max_dp"] = max(r.self_max_dp for r in items)
        out["last_layer_max_dp"] = max(r.last_layer_max_dp for r in items)
        out["mean_change"] = float(np.mean([r.plain - r.scaled for r in items]))
        out["mean_plain_count"] = float(np.mean([r.plain for r in items]))
        out["mean_scaled_count"] = float(np.mean([r.scaled for r in items]))
        last = np.nanmean([r.resid[:, -1] for r in items], axis=0)
        reached = np.flatnonzero(last >= 0.5)
        out["last_position_layer"] = int(reached[0]) if len(reached) else None
        with_heads = [r for r in items if r.heads.size]
        out["max_head_share"] = float(np.mean([np.nanmax(r.heads) for r in with_heads])) if with_heads else None
        if with_heads:
            mean = np.nanmean([r.heads for r in with_heads], axis=0)
            layer, head = np.unravel_index(int(np.nanargmax(mean)), mean.shape)
            out["strongest_head"] = f"L{layer}H{head}"
        return out

    def report_columns(self, result: PatchingResult) -> dict[str, Any]:
        return {"factor": result.config.get("factor"), "heads": result.config.get("heads")}


EXPERIMENT = PatchingExperiment()
