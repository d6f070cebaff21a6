"""Which attention heads carry the count when the counted words are shortened: a circuit, head by head.

Each counting, events or sums item runs twice, as its dataset's experiment builds it: with
the span's tokens (the counted words, the event sentences, the scaled number) at duration c
(the *short* run, ``--factor``) and at duration 1 (the *plain* run). The change to locate is
that of the implied count E[k] over the digits 0-9 (for sums, the expected first digit of
the answer), plain minus short; every share below is a part of it (1: all of it).

A duration reaches the model two ways: as the bias log d of its key's logits in every
head (``attn.hook_duration_bias``) and through the times, which move every later position.
Two shares split the change between them: *every bias restored* (the plain durations at
the short run's times: every head weighs the span as full-length) and *times restored*
(the short durations at the plain run's times).

Per head (every layer, every head), from one backward of the short run:

- the *estimate*: the first-order change from patching the head's output
  (``attn.hook_z``, every position) from the plain run, sum of dE[k]/dz x (z plain -
  z short) (attribution patching);
- the *bias estimate*: the first-order change from restoring the head's duration bias at
  the span's keys alone, sum of dE[k]/d bias x (-log c).

Then the ``--top`` heads with the largest estimates are patched exactly, alone (one
forward each, in one batch) and together: the first k of them for k = 0 .. top. The
latter's digit probabilities are the explorer's rows (the slider adds one head at a time)
and ``half`` is the smallest k that brings back half of the change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from contllm import registry
from contllm.audits.studies import Study, circuit_finding
from contllm.core.families import decoder_layers, head_counts
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table, option_table
from contllm.experiments.datasets import DatasetPrompts
from contllm.experiments.records import ItemRecords, Record

#: Patched rows per forward; each row is the tokens after the shared prefix.
ROWS = 64
#: The points read per head: each head's output (patched) and its duration bias (differentiated).
Z = "attn.hook_z"
BIAS = "attn.hook_duration_bias"
DIGITS = [str(k) for k in range(10)]


@dataclass
class CircuitConfig(DatasetPrompts):
    """Options of the circuit experiment.

    dataset: "counting", "events" or "sums"; its experiment builds each prompt and names the span.
    data, template, chat: that experiment's prompt options (None: its defaults).
    factor: the duration factor c of the short run (the plain run has 1).
    top: how many heads, by largest estimate, are patched exactly (one forward each).
    first: how many items of the dataset (its first N, balanced over category/kind and n); 0: all.
    """

    factor: float = 0.5
    top: int = 8
    first: int = 4

    def __post_init__(self) -> None:
        self.check_dataset()
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)):
            raise ExperimentError(f"--factor must be a number, got {self.factor!r}")
        if not (0 < self.factor < 1 or 1 < self.factor <= 100) or not math.isfinite(self.factor):
            raise ExperimentError(
                f"--factor must be a positive duration factor other than 1 (at most 100), got {self.factor!r}"
            )
        if isinstance(self.top, bool) or not isinstance(self.top, int) or not 1 <= self.top <= 64:
            raise ExperimentError(f"--top must be an integer from 1 to 64, got {self.top!r}")
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 0:
            raise ExperimentError(f"--first must be an integer >= 0 (0: every item), got {self.first!r}")
        self.dataset_config()


@dataclass
class CircuitRecord(Record, what="circuit record"):
    """One item's circuit.

    factor: c. tokens: the span's text, token by token. plain, short: E[k] of the two runs.
    every_bias, times: the shares of the change that every head's duration bias restored,
    and the times restored, bring back. estimate, bias_estimate: each head's estimated share
    [layers, heads] (module docstring). top: the heads patched exactly ("L14H5"), largest
    estimate first; patched: each one's exact share alone. x: 0 .. top (heads patched
    together); labels: the digits; probs [top + 1][10]: the digit probabilities with the
    first k heads patched; shares [top + 1]: their shares of the change. half: the smallest
    k whose share is at least 0.5 (None: none of them).
    """

    item_id: str
    factor: float
    tokens: list[str]
    plain: float
    short: float
    every_bias: float
    times: float
    estimate: np.ndarray
    bias_estimate: np.ndarray
    top: list[str]
    patched: list[float]
    x: list[float]
    labels: list[str]
    probs: list[list[float]]
    shares: list[float]
    half: int | None
    truth: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        k = len(self.top)
        if len(self.patched) != k or len(self.x) != k + 1 or len(self.probs) != k + 1 or len(self.shares) != k + 1:
            raise ValueError("top, patched, x, probs and shares disagree in length")
        if self.estimate.ndim != 2 or self.estimate.shape != self.bias_estimate.shape:
            raise ValueError("estimate and bias_estimate must both be [layers, heads]")


class CircuitResult(ItemRecords[CircuitRecord], record=CircuitRecord):
    """Every item's circuit from one run (``items``), with the configuration that made it."""


def expected_count(logits: torch.Tensor, sets: Any) -> torch.Tensor:
    """E[k] over the digits 0-9, renormalised over them: [...] from logits [..., vocab] (differentiable)."""
    probs = sets.gather(torch.softmax(logits.double(), dim=-1))
    return (probs * torch.arange(10, dtype=probs.dtype)).sum(-1) / probs.sum(-1)


def digit_probs(logits: torch.Tensor, sets: Any) -> np.ndarray:
    """The digits' probabilities [..., 10], renormalised over them."""
    probs = sets.gather(torch.softmax(logits.double(), dim=-1))
    return (probs / probs.sum(-1, keepdim=True)).cpu().numpy()


def parse_head(label: str) -> tuple[int, int]:
    """(layer, head) of a label "L14H5"."""
    layer, head = label[1:].split("H")
    return int(layer), int(head)


def find_circuit(
    lm: Any,
    item_id: str,
    signal: Any,
    span: Sequence[int],
    truth: int,
    meta: Mapping[str, Any],
    config: CircuitConfig,
    sets: Any = None,
) -> CircuitRecord:
    """The circuit record of one prompt (see the module docstring); ``sets``: the digits' token sets (None: the
    tokenizer's, :func:`contllm.core.readout.digits`)."""
    from contllm.core.engine import evaluation
    from contllm.core.prefix import SharedPrefix, slice_signal
    from contllm.core.signal import pad_signals
    from contllm.experiments.patching import forward_rows
    from contllm.internals.activations import recording

    if sets is None:
        from contllm.core.readout import digits

        sets = digits(lm.tokenizer)
    keys = list(span)
    short = signal.scale_tokens(keys, float(config.factor))
    layers, (heads, _) = len(decoder_layers(lm)), head_counts(lm)
    logits = lm.logits([signal, short, short.with_times(signal.times), signal.with_times(short.times)])
    e_plain, e_short, e_times, e_every = (float(v) for v in expected_count(logits, sets))
    change = e_plain - e_short
    if change == 0:
        raise ExperimentError(
            f"item {item_id}: E[k] does not change between c = {config.factor:g} and 1; nothing to locate"
        )
    zs = [f"blocks.{layer}.{Z}" for layer in range(layers)]
    biases = [f"blocks.{layer}.{BIAS}" for layer in range(layers)]
    grads = lm.gradients(short, lambda out: expected_count(out, sets), wrt=[*zs, *biases])
    # The two runs agree on every token before the span's first: only the tails from there on differ
    # inside the model, so they run after one shared prefix, and patching a head's output there is
    # patching it everywhere.
    start = min(keys)
    tails = [slice_signal(short, start), slice_signal(signal, start)]
    tail = list(range(len(signal) - start))
    with evaluation(lm):
        shared = SharedPrefix.compute(lm, signal, start)
        with recording(lm, tails, zs, [tail, tail]) as stored:
            lm.forward_batch(pad_signals(tails), logits_to_keep=1, prefix=shared.keys)
        short_z, plain_z = [stored[n][0] for n in zs], [stored[n][1] for n in zs]
        lift = -math.log(config.factor)
        estimate, bias_estimate = np.zeros((layers, heads)), np.zeros((layers, heads))
        for layer in range(layers):
            dz = grads.activations[zs[layer]][0][start:].double()  # [tail tokens, heads, d_head]
            estimate[layer] = (dz * (plain_z[layer] - short_z[layer]).double()).sum(dim=(0, 2)).numpy() / change
            db = grads.activations[biases[layer]][0].double()  # [heads, queries, keys]
            bias_estimate[layer] = (db[:, :, keys].sum(dim=(1, 2)) * lift).numpy() / change
        order = np.argsort(-estimate, axis=None, kind="stable")[: config.top]
        chosen = [(int(i), int(h)) for i, h in zip(*np.unravel_index(order, estimate.shape))]
        steps = [[pair] for pair in chosen] + [chosen[:k] for k in range(len(chosen) + 1)]
        shapes = {n: tuple(short_z[layer].shape[1:]) for layer, n in enumerate(zs)}
        rows = []
        for step in steps:
            row: dict[str, tuple[list[int], torch.Tensor]] = {}
            for layer, head in step:
                mixed = row[zs[layer]][1] if zs[layer] in row else short_z[layer].clone()
                mixed[:, head] = plain_z[layer][:, head]
                row[zs[layer]] = (tail, mixed)
            rows.append(row)
        patched = torch.cat(
            [
                forward_rows(lm, shared, [tails[0]] * len(rows[k : k + ROWS]), rows[k : k + ROWS], shapes)
                for k in range(0, len(rows), ROWS)
            ]
        )
    counts = expected_count(patched, sets).numpy()
    alone, together = counts[: len(chosen)], counts[len(chosen) :]
    shares = (together - e_short) / change
    reached = [k for k, s in enumerate(shares) if s >= 0.5]
    assert signal.text is not None and signal.offsets is not None
    return CircuitRecord(
        item_id=item_id,
        factor=float(config.factor),
        tokens=[signal.text[a:b] for a, b in (signal.offsets[i] for i in keys)],
        plain=e_plain,
        short=e_short,
        every_bias=(e_every - e_short) / change,
        times=(e_times - e_short) / change,
        estimate=estimate,
        bias_estimate=bias_estimate,
        top=[f"L{layer}H{head}" for layer, head in chosen],
        patched=[float(v) for v in (alone - e_short) / change],
        x=[float(k) for k in range(len(chosen) + 1)],
        labels=list(DIGITS),
        probs=digit_probs(patched[len(chosen) :], sets).tolist(),
        shares=[float(v) for v in shares],
        half=reached[0] if reached else None,
        truth=int(truth),
        meta=dict(meta),
    )


def correlation(records: Sequence[CircuitRecord]) -> float | None:
    """Pearson's r between the estimate and the exact share of the heads patched exactly, over every item."""
    estimates, exact = [], []
    for r in records:
        for label, share in zip(r.top, r.patched):
            layer, head = parse_head(label)
            estimates.append(float(r.estimate[layer, head]))
            exact.append(share)
    if len(exact) < 3 or np.std(estimates) == 0 or np.std(exact) == 0:
        return None
    return float(np.corrcoef(estimates, exact)[0, 1])


class CircuitExperiment(Experiment[CircuitRecord, CircuitResult]):
    name = "circuit"
    help = "Which attention heads carry the count when the words are shortened: every head estimated, the top ones patched."
    description = (
        "Each counting, events or sums item (--dataset) runs with its span at duration c (--factor) and at 1. One backward "
        "of the short run estimates, for every attention head, the share of the change in E[k] that patching its "
        "output from the plain run brings back (and that restoring its duration bias alone does); the --top heads "
        "are patched exactly, alone and together (the explorer's slider adds one head at a time). Two more shares "
        "split the change between the duration bias and the times. For sums, E[k] is the expected first digit of the "
        "answer. Item ids are the dataset's (count-001, story-001, sum-001, ...); --first N takes its first N items."
    )
    explorer = True
    explorer_text = (
        "An item's span runs at duration c; the slider patches the outputs of the heads with the largest "
        "estimated shares from the run at c = 1, one more head at each step (0: the short run, nothing patched)."
    )
    engine = True
    shardable = True
    Config = CircuitConfig
    options = option_table(
        """
        dataset   str    Items and prompts of this experiment: counting, events or sums. [default: counting]
        data      str    Dataset file for the --dataset experiment (where it takes --data). [default: built-in]
        template  str    Prompt template of the --dataset experiment. [default: its own]
        chat      bool   --chat/--no-chat  Wrap prompts in the model's chat template.
        factor    float  Duration factor c of the short run. [default: 0.5]
        top       int    Heads patched exactly, by largest estimate (1-64). [default: 8]
        first     int    Items: the dataset's first N (balanced over category/kind and n); 0 for all. [default: 4]
        """
    )
    result_type = CircuitResult
    #: Optional in an audit (each item takes a backward and several patched forwards, outside the engine): every
    #: item of the dataset is a candidate, and the planner prices it from one and two items run for real.
    study = Study(
        "circuit",
        "heads_for_half",
        (),
        circuit_finding,
        minimum=2,
        comfortable=4,
        maximum=16,
        optional=True,
        protocol=False,
        given=(("first", "0"),),
        probes=(1, 2),
    )
    metrics = Metric.table(
        """
        mean_change           higher  E[k] at c = 1 minus E[k] at c, mean over items: the effect being located
        heads_for_half        lower   heads whose outputs, patched together from c = 1, bring back half of the change (mean over the items where some k does)
        top_share             higher  share of the change the --top heads patched together bring back (mean over items)
        estimate_correlation  higher  Pearson r of the one-backward estimate and the exact share, over the heads patched exactly
        every_bias_share      higher  share every head's duration bias restored brings back (mean over items)
        times_share           higher  share the plain run's times alone bring back (mean over items)
        """
    )

    def items(self, config: CircuitConfig) -> Sequence[Any]:
        return config.first_items(config.first)

    def run_item(self, lm: Any, config: CircuitConfig, item: Any, context: RunContext) -> CircuitRecord:
        plan = registry.get(config.dataset).plan_item(lm, item, config.dataset_config())
        if not plan.edited:
            raise ExperimentError(f"item {item.id}: the prompt has no span to shorten")
        return find_circuit(lm, item.id, plan.signals[0], list(plan.edited), int(plan.truth), plan.meta, config)

    def tables(self, result: CircuitResult) -> dict[str, Table]:
        rows = []
        for r in result.items:
            exact = dict(zip(r.top, r.patched))
            rows += [
                {
                    "item": r.item_id,
                    "layer": layer,
                    "head": head,
                    "estimate": float(r.estimate[layer, head]),
                    "patched": exact.get(f"L{layer}H{head}", ""),
                    "bias_estimate": float(r.bias_estimate[layer, head]),
                }
                for layer in range(r.estimate.shape[0])
                for head in range(r.estimate.shape[1])
            ]
        steps = [
            {"item": r.item_id, "heads": k, "head": r.top[k - 1] if k else "", "share": r.shares[k]}
            for r in result.items
            for k in range(len(r.shares))
        ]
        return {
            "results": (["item", "layer", "head", "estimate", "patched", "bias_estimate"], rows),
            "patched": (["item", "heads", "head", "share"], steps),
        }

    def summary(self, result: CircuitResult) -> dict[str, Any]:
        """The change located, the heads that carry half of it, how well one backward estimates them."""
        if not result.items:
            raise ExperimentError("the result holds no items")
        items = result.items
        halves = [r.half for r in items if r.half is not None]
        mean = np.mean([r.estimate for r in items], axis=0)
        bias = np.mean([r.bias_estimate for r in items], axis=0)
        layer, head = np.unravel_index(int(np.argmax(mean)), mean.shape)
        bias_layer, bias_head = np.unravel_index(int(np.argmax(bias)), bias.shape)
        return {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(items),
            "factor": items[0].factor,
            "top": len(items[0].top),
            "mean_change": float(np.mean([r.plain - r.short for r in items])),
            "heads_for_half": float(np.mean(halves)) if halves else None,
            "items_with_half": len(halves),
            "top_share": float(np.mean([r.shares[-1] for r in items])),
            "estimate_correlation": correlation(items),
            "every_bias_share": float(np.mean([r.every_bias for r in items])),
            "times_share": float(np.mean([r.times for r in items])),
            "strongest_head": f"L{layer}H{head}",
            "strongest_bias_head": f"L{bias_layer}H{bias_head}",
        }

    def report_columns(self, result: CircuitResult) -> dict[str, Any]:
        return {
            "dataset": result.config.get("dataset"),
            "factor": result.config.get("factor"),
            "top": result.config.get("top"),
        }

    def summary_figure(self, result: CircuitResult) -> Any:
        from contllm.experiments.circuit_figures import circuit_figure

        return circuit_figure(result, None)

    def item_figure(self, result: CircuitResult, record: CircuitRecord) -> Any:
        from contllm.experiments.circuit_figures import circuit_figure

        return circuit_figure(result, [record])


EXPERIMENT = CircuitExperiment()
