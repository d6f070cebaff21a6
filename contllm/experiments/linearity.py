"""Output-space linearity: how far an interpolation sweep's read-out is from the chord between its ends.

Interpolating an input in embedding space from A (alpha = 0) to B (alpha = 1) moves the
output distribution p(alpha). If the model carried the linearity of its embedding space
into its outputs, p(alpha) would lie on the chord (1 - alpha) p(0) + alpha p(1). For
each item this experiment measures, over the read-out tokens and the interior alphas,
the largest and the mean |p(alpha) - chord(alpha)|, the same for the read-out logits,
and R^2 of the chord as a fit of p(alpha). The same numbers are taken on a baseline path
that leaves A along a random direction of the same length as B - A (per token, seeded
by the run's seed and the item's place in the item list), with the same durations and
times: the chord of an arbitrary direction, against which the real one is compared.

Items come from three sources: word interpolations of the ``interpolation`` experiment
(yes/no read out), operator interpolations of ``boolean`` (0/1 and false/true), and
whole-prompt interpolations between two prompts written here (the union of the top
tokens at both ends read out). "Logits" of a read-out are its log-probabilities centred
over the read-out labels: the logits up to the one shift per row that a softmax ignores
(for a label spelled by several tokens, the log of their summed probability).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from contllm.audits import studies
from contllm.core.interpolate import interpolate_spans, mix
from contllm.core.signal import Signal
from contllm.errors import ExperimentError, SignalError
from contllm.experiments import boolean as boolean_exp
from contllm.experiments import word_interpolation as word_exp
from contllm.experiments.base import Experiment, Metric, RunContext, Table, option_table
from contllm.experiments.options import METHOD, Option
from contllm.experiments.records import Record, RecordList, Records
from contllm.experiments.sweeps import MAX_SAMPLES, check_method

SOURCES = ("interpolation", "boolean", "prompt")
PREFIX = {"interpolation": "word", "boolean": "bool", "prompt": "prompt"}

#: Whole-prompt pairs (name, first, second): every token differs or may; equal token counts
#: on SmolLM2's tokenizer (unequal ones are aligned in time like any span).
PROMPT_PAIRS = (
    ("capital", "The capital city of France is", "The largest city of Japan is"),
    ("season", "In winter the weather is usually", "In summer the days are usually"),
    ("animal", "The dog chased the", "The cat watched the"),
    ("arithmetic", "Two plus two equals", "Three times three equals"),
    ("colour", "The colour of the sky is", "The colour of the grass is"),
    ("opposite", "The opposite of hot is", "The opposite of up is"),
)

#: Probabilities below this are clipped before a logarithm.
FLOOR = 1e-30
MEASURES = ("max_deviation", "mean_deviation", "max_logit_deviation", "mean_logit_deviation", "r2")


class PromptPair(NamedTuple):
    """A row of :data:`PROMPT_PAIRS`: two prompts whose embeddings a path joins (``first`` at alpha 0)."""

    id: str
    first: str
    second: str


@dataclass(frozen=True)
class LinearityItem:
    """One path: ``ref`` is a WordItem (interpolation), a BooleanItem (boolean) or a PromptPair (prompt)."""

    id: str
    source: str
    ref: Any
    place: int = 0  # the item's index in the experiment's item list (seeds its baseline)


@dataclass
class LinearityConfig:
    """Options of the linearity experiment.

    samples: values of alpha, evenly spaced over [0, 1] (at least 3: both ends and an inside).
    method: "linear" or "slerp" (real and baseline paths alike).
    per_source: items taken from each source, spread over it (0: every item).
    sources: which of interpolation, boolean, prompt (None: all three).
    top: tokens read at each end of a whole-prompt path (their union is read along it).
    """

    samples: int = 11
    method: str = "linear"
    per_source: int = 6
    sources: tuple[str, ...] | None = None
    top: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or not 3 <= self.samples <= MAX_SAMPLES:
            raise ExperimentError(
                f"--samples must be an integer from 3 to {MAX_SAMPLES} (both ends and an inside), got {self.samples!r}"
            )
        check_method(self.method)
        if isinstance(self.per_source, bool) or not isinstance(self.per_source, int) or self.per_source < 0:
            raise ExperimentError(f"--per-source must be an integer >= 0 (0: every item), got {self.per_source!r}")
        if isinstance(self.top, bool) or not isinstance(self.top, int) or not 1 <= self.top <= 100:
            raise ExperimentError(f"--top must be an integer from 1 to 100, got {self.top!r}")
        if self.sources is not None:
            self.sources = tuple(dict.fromkeys(self.sources))
            unknown = [s for s in self.sources if s not in SOURCES]
            if unknown:
                raise ExperimentError(
                    f"--sources: unknown source(s) {', '.join(unknown)}; sources are {', '.join(SOURCES)}"
                )

    def alphas(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.samples)


def _spread(items: Sequence[Any], n: int) -> list[Any]:
    """``n`` items spread evenly over ``items`` (all of them when n is 0 or covers them)."""
    if n == 0 or n >= len(items):
        return list(items)
    return [items[k * len(items) // n] for k in range(n)]


def _word_subset(items: Sequence[Any], n: int) -> list[Any]:
    """``n`` word items over pairs spread evenly, cycling through the question groups."""
    if n == 0 or n >= len(items):
        return list(items)
    pairs: dict[str, list[Any]] = {}
    for item in items:
        pairs.setdefault(item.pair, []).append(item)
    names = list(pairs)
    chosen = []
    for k in range(n):
        questions = pairs[names[k * len(names) // n]]
        chosen.append(questions[(2 * k + (k // 4) % 2) % len(questions)])
    return list(dict.fromkeys(chosen))


def linearity_items(config: LinearityConfig) -> list[LinearityItem]:
    """The items of every chosen source, in source order."""
    out: list[LinearityItem] = []
    for source in config.sources or SOURCES:
        if source == "interpolation":
            refs = _word_subset(word_exp.word_items(word_exp.InterpolationConfig()), config.per_source)
        elif source == "boolean":
            refs = _spread(boolean_exp.boolean_items(boolean_exp.BooleanConfig()), config.per_source)
        else:
            refs = _spread([PromptPair(*p) for p in PROMPT_PAIRS], config.per_source)
        out += [LinearityItem(f"{PREFIX[source]}-{ref.id}", source, ref, len(out) + k) for k, ref in enumerate(refs)]
    return out


@dataclass
class ReadoutPath(Record, what="linearity record"):
    """One item's read-out along the real path and the baseline path: probabilities [S, K] of the labels."""

    item_id: str
    source: str
    alphas: np.ndarray
    labels: list[str]
    real: np.ndarray
    baseline: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        shape = (len(self.alphas), len(self.labels))
        if self.real.shape != shape or self.baseline.shape != shape:
            raise ExperimentError(f"malformed linearity record {self.item_id}: probabilities not shaped {shape}")


def chord(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The chord between the first and last rows of y [S, K] over x [S]."""
    t = ((x - x[0]) / (x[-1] - x[0]))[:, None]
    return (1 - t) * y[:1] + t * y[-1:]


def centred_logits(p: np.ndarray) -> np.ndarray:
    """Log-probabilities [S, K] centred over the labels: the read-out's logits up to a shift per row."""
    logp = np.log(np.clip(p, FLOOR, None))
    return logp - logp.mean(axis=1, keepdims=True)


def chord_measures(x: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Distance of a read-out p [S, K] over alphas x [S] from its chord.

    max_deviation / mean_deviation: largest and mean |p - chord| over the interior alphas and
    every label; the same on :func:`centred_logits` (max/mean_logit_deviation); r2: 1 - SS of
    p - chord over SS of p about its mean over alpha (all alphas and labels; NaN for a flat read-out).
    """
    inner = slice(1, len(x) - 1)
    dev = np.abs(p - chord(x, p))[inner]
    z = centred_logits(p)
    zdev = np.abs(z - chord(x, z))[inner]
    total = float(((p - p.mean(axis=0, keepdims=True)) ** 2).sum())
    residual = float(((p - chord(x, p)) ** 2).sum())
    return {
        "max_deviation": float(dev.max()),
        "mean_deviation": float(dev.mean()),
        "max_logit_deviation": float(zdev.max()),
        "mean_logit_deviation": float(zdev.mean()),
        "r2": 1.0 - residual / total if total > 1e-12 else float("nan"),
    }


def measures(path: ReadoutPath) -> dict[str, float]:
    """:func:`chord_measures` of the real path and, suffixed ``_baseline``, of the baseline path."""
    real = chord_measures(path.alphas, path.real)
    base = chord_measures(path.alphas, path.baseline)
    return {**real, **{f"{k}_baseline": v for k, v in base.items()}}


def baseline_seed(seed: int, place: int) -> int:
    """The seed of an item's random direction: from the run's seed and the item's place."""
    return int(np.random.SeedSequence([seed % 2**32, place]).generate_state(1)[0])


def baseline_signals(
    real: Sequence[Signal], alphas: np.ndarray, method: str, generator: torch.Generator
) -> tuple[list[Signal], float]:
    """The baseline path: from A = real[0] along a random direction of |B - A| per token; the same durations and times.

    Returns the signals and the norm of B - A over the whole path (the baseline's too).
    """
    start, end = real[0].embeds, real[-1].embeds
    assert start is not None and end is not None
    diff = (end - start).float().cpu()
    noise = torch.randn(diff.shape, generator=generator, dtype=torch.float32)
    noise = noise / noise.norm(dim=-1, keepdim=True).clamp_min(1e-12) * diff.norm(dim=-1, keepdim=True)
    target = start + noise.to(device=start.device, dtype=start.dtype)
    out = [
        Signal.from_embeds(mix(start, target, float(a), method), s.durations, times=s.times)  # type: ignore[arg-type]
        for s, a in zip(real, alphas)
    ]
    return out, float(diff.norm())


def real_path(lm: Any, item: LinearityItem, config: LinearityConfig) -> tuple[list[Signal], Any, dict[str, Any]]:
    """The item's real path (one signal per alpha), its token sets (None: top tokens) and facts worth saving."""
    if item.source == "interpolation":
        plan = word_exp.plan_item(
            lm, item.ref, word_exp.InterpolationConfig(method=config.method, samples=config.samples)
        )
    elif item.source == "boolean":
        plan = boolean_exp.plan_item(
            lm, item.ref, boolean_exp.BooleanConfig(method=config.method, samples=config.samples)
        )
    else:
        pair = item.ref
        ends = [
            Signal.from_text(lm.tokenizer, text).embedded(lm.model.get_input_embeddings())
            for text in (pair.first, pair.second)
        ]
        try:
            signals = [
                interpolate_spans(
                    ends[0],
                    (0, len(pair.first)),
                    ends[1],
                    (0, len(pair.second)),
                    float(a),
                    method=config.method,  # type: ignore[arg-type]
                )
                for a in config.alphas()
            ]
        except SignalError as err:
            raise ExperimentError(f"item {item.id}: {err}") from None
        meta = {"first": pair.first, "second": pair.second, "tokens_first": len(ends[0]), "tokens_second": len(ends[1])}
        return signals, None, meta
    return plan.signals, plan.token_sets, dict(plan.meta)


def run_path(lm: Any, item: LinearityItem, config: LinearityConfig, evaluate: Any, seed: int) -> ReadoutPath:
    """Both paths of one item in one call of ``evaluate`` (signals -> distributions [N, vocab])."""
    alphas = config.alphas()
    real, sets, meta = real_path(lm, item, config)
    generator = torch.Generator().manual_seed(baseline_seed(seed, item.place))
    base, norm = baseline_signals(real, alphas, config.method, generator)
    probs = evaluate(real + base).float().cpu()
    if sets is None:
        ends = torch.cat([probs[0].topk(config.top).indices, probs[len(real) - 1].topk(config.top).indices]).tolist()
        ids = list(dict.fromkeys(int(i) for i in ends))
        labels = [lm.tokenizer.decode([i]) for i in ids]
        gathered = probs[:, ids]
        meta["token_ids"] = ids
    else:
        labels = list(sets.labels)
        gathered = sets.gather(probs)
    values = gathered.numpy().astype(np.float64)
    if not np.isfinite(values).all():
        raise ExperimentError(f"item {item.id}: the model produced non-finite probabilities")
    meta.update({"method": config.method, "direction_norm": norm, "baseline_seed": baseline_seed(seed, item.place)})
    n = len(real)
    return ReadoutPath(item.id, item.source, alphas, labels, values[:n], values[n:], meta)


@dataclass
class LinearityResult(Records[ReadoutPath], record=ReadoutPath):
    """Every item's paths from one run (``paths``), with the configuration that made it."""

    paths = RecordList()
    path = Records.record

    def rows(self) -> Iterator[dict[str, Any]]:
        """Tidy rows: one per item, path, alpha and label."""
        for p in self.paths:
            for kind, values in (("real", p.real), ("baseline", p.baseline)):
                for k, a in enumerate(p.alphas):
                    for j, label in enumerate(p.labels):
                        yield {
                            "item": p.item_id,
                            "source": p.source,
                            "path": kind,
                            "alpha": float(a),
                            "label": label,
                            "probability": float(values[k, j]),
                        }


def summarize_paths(paths: Sequence[ReadoutPath]) -> dict[str, Any]:
    """Each measure's mean over items, real and baseline, for all items and per source (``<source>_mean_<measure>``)."""
    out: dict[str, Any] = {}
    per_item = [(p.source, measures(p)) for p in paths]
    for group in ("all", *SOURCES):
        chosen = [m for source, m in per_item if group in ("all", source)]
        if not chosen:
            continue
        out[f"{group}_items"] = len(chosen)
        for key in MEASURES:
            for suffix in ("", "_baseline"):
                values = [m[key + suffix] for m in chosen if np.isfinite(m[key + suffix])]
                out[f"{group}_mean_{key}{suffix}"] = float(np.mean(values)) if values else float("nan")
    return out


class LinearityExperiment(Experiment[ReadoutPath, LinearityResult]):
    name = "linearity"
    help = "How far interpolation sweeps' read-outs are from the chord between their ends, against a random direction."
    description = (
        "For word interpolations (yes/no), Boolean operator interpolations (0/1, false/true) and whole-prompt "
        "interpolations (top tokens at both ends), measures max and mean |p(alpha) - chord| over the read-out, "
        "the same on the read-out logits, and R^2 of the chord, for the real path and for a baseline that leaves "
        "the start along a random direction of the same length. Item ids look like word-apples-bananas-yellow, "
        "bool-AND-OR-00, prompt-capital; --per-source picks how many of each (0: all)."
    )
    Config = LinearityConfig
    options = (
        Option("samples", "int", "Values of alpha over 0..1 (at least 3). [default: 11]"),
        METHOD,
        *option_table(
            """
            per_source  int    Items from each source, spread over it; 0 takes all. [default: 6]
            sources     words  Comma-separated sources among interpolation,boolean,prompt. [default: all]
            top         int    Top tokens read at each end of a whole-prompt path. [default: 5]
            """
        ),
    )
    engine = shardable = True
    unit = "path"
    study = studies.Study(
        "linearity",
        "all_mean_r2",
        (),
        studies.linearity_finding,
        minimum=1,
        comfortable=2,
        maximum=10,
        per_source=True,
        protocol=False,
    )
    metrics = Metric.table(
        """
        all_mean_max_deviation        lower   largest |p(alpha) - chord| over the read-out on the real path, mean over items
        all_mean_r2                   higher  R² of the chord against the real path's read-out, mean over items
        all_mean_max_logit_deviation  lower   largest |centred logit - chord| on the real path, mean over items
        """
    )
    result_type = LinearityResult

    def items(self, config: LinearityConfig) -> Sequence[LinearityItem]:
        return linearity_items(config)

    def check(self, lm: Any, config: LinearityConfig) -> None:
        word_config = word_exp.InterpolationConfig(method=config.method, samples=config.samples)
        for item in linearity_items(config):
            if item.source == "interpolation":
                word_exp.check_item(lm, item.ref, word_config)

    def run(
        self, lm: Any, config: LinearityConfig, items: Sequence[LinearityItem], context: RunContext
    ) -> Iterator[tuple[str, ReadoutPath]]:
        for item in items:
            yield item.id, run_path(lm, item, config, context.evaluate, context.seed)

    def tables(self, result: LinearityResult) -> dict[str, Table]:
        per_item = [{"item": p.item_id, "source": p.source, **measures(p)} for p in result.paths]
        columns = ["item", "source", *MEASURES, *(f"{m}_baseline" for m in MEASURES)]
        return {
            "results": (["item", "source", "path", "alpha", "label", "probability"], result.rows()),
            "items": (columns, per_item),
        }

    def summary(self, result: LinearityResult) -> dict[str, Any]:
        """See :func:`summarize_paths`."""
        if not result.paths:
            raise ExperimentError("the result holds no paths")
        return {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(result.paths),
            **summarize_paths(result.paths),
        }

    def report_columns(self, result: LinearityResult) -> dict[str, Any]:
        return {"samples": len(result.paths[0].alphas) if result.paths else None, "method": result.config.get("method")}

    def summary_figure(self, result: LinearityResult) -> Any:
        return summary_figure(result)

    def item_figure(self, result: LinearityResult, record: ReadoutPath) -> Any:
        return item_figure(result, record)

    def comparison(self, results: Sequence[tuple[str, LinearityResult]]) -> Any:
        return comparison_figure([(label, r, self.summary(r)) for label, r in results])


# ------------------------------------------------------------------------------ figures


def item_figure(result: LinearityResult, path: ReadoutPath) -> Any:
    """One item: each label's probability and centred logit along the real path (solid), its chord (dotted) and the baseline (dashed)."""
    from contllm.plotting import plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    x = path.alphas
    for ax, transform in ((left, lambda p: p), (right, centred_logits)):
        real, base = transform(path.real), transform(path.baseline)
        for j, label in enumerate(path.labels[:10]):
            color = colors(j % 10)
            ax.plot(x, real[:, j], "-", color=color, lw=1.8, label=repr(label))
            ax.plot(x, chord(x, real)[:, j], ":", color=color, lw=1)
            ax.plot(x, base[:, j], "--", color=color, lw=1, alpha=0.6)
        ax.set_xlabel("alpha")
        ax.grid(alpha=0.3)
    left.set(ylabel="probability", title="probabilities (solid: real, dotted: chord, dashed: random direction)")
    right.set(ylabel="log-probability centred over the labels", title="logits of the read-out (centred)")
    left.legend(fontsize=7, ncol=2, title="label")
    for ax in (left, right):
        ax.title.set_fontsize(9)
    m = measures(path)
    what = path.meta.get("question") or ""
    fig.suptitle(
        f"{result.model} · linearity · {path.item_id} {what}\n"
        f"max |p - chord| {m['max_deviation']:.3g} (random direction {m['max_deviation_baseline']:.3g}); "
        f"R² {m['r2']:.3f} ({m['r2_baseline']:.3f})",
        fontsize=10,
    )
    return fig


def _bars(ax: Any, groups: list[str], runs: Sequence[tuple[str, dict[str, Any]]], key: str, title: str) -> None:
    """Grouped bars of ``<group>_mean_<key>`` (filled: real, hatched: baseline), one colour per run."""
    from contllm.plotting import legend_outside, plt

    colors = plt.get_cmap("tab10")
    width = 0.8 / (2 * len(runs))
    positions = np.arange(len(groups))
    for k, (label, summary) in enumerate(runs):
        for b, suffix in enumerate(("", "_baseline")):
            values = [summary.get(f"{g}_mean_{key}{suffix}", np.nan) for g in groups]
            offset = positions - 0.4 + width * (2 * k + b + 0.5)
            ax.bar(
                offset,
                values,
                width,
                color=colors(k % 10),
                alpha=1.0 if not suffix else 0.45,
                hatch=None if not suffix else "//",
                label=f"{label}{': random direction' if suffix else ': the real path'}",
            )
    ax.set_xticks(positions, groups, fontsize=8, rotation=20)
    ax.set_title(title, loc="left", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    legend_outside(ax)


def _profiles(ax: Any, paths: Sequence[ReadoutPath]) -> None:
    """Mean max-over-labels |p - chord| against alpha, per source: real solid, baseline dashed."""
    from contllm.plotting import legend_outside, plt

    colors = plt.get_cmap("tab10")
    for k, source in enumerate(SOURCES):
        chosen = [p for p in paths if p.source == source]
        if not chosen:
            continue
        x = chosen[0].alphas
        same = [p for p in chosen if len(p.alphas) == len(x)]
        for values, style, what in (
            (lambda p: p.real, "-", "real path"),
            (lambda p: p.baseline, "--", "random direction"),
        ):
            dev = np.mean([np.abs(values(p) - chord(p.alphas, values(p))).max(axis=1) for p in same], axis=0)
            ax.plot(x, dev, style, color=colors(k), lw=1.8, label=f"{source}: {what}")
    ax.set(
        xlabel="alpha: first input (0) → second (1)",
        ylabel="distance from the straight line\n(largest over labels, mean over items)",
    )
    ax.grid(alpha=0.3)
    legend_outside(ax)


def linearity_finding(summary: dict[str, Any]) -> tuple[str, str]:
    """The sentence a linearity summary opens with, and the numbers behind it: the mean largest distance of the
    read-out from the straight line between its ends (the chord), on the real path and on a random direction; up to
    0.05 reads as "close to the straight line", under three quarters of the random direction's as "bends less than a
    random direction", else "bends as much as a random direction"."""
    deviation = summary.get("all_mean_max_deviation", float("nan"))
    base = summary.get("all_mean_max_deviation_baseline", float("nan"))
    r2, r2_base = summary.get("all_mean_r2", float("nan")), summary.get("all_mean_r2_baseline", float("nan"))
    detail = (
        f"largest distance from the straight line: {deviation:.3f} on the real path, {base:.3f} on a random "
        f"direction; R² of the line {r2:.2f} against {r2_base:.2f} (means over items)"
    )
    if not np.isfinite(deviation):
        return "The read-out along the path between two inputs", detail
    if deviation <= 0.05:
        return "Between two inputs the output stays close to the straight line between its ends", detail
    if np.isfinite(base) and deviation < 0.75 * base:
        return "Between two inputs the output bends, but less than along a random direction", detail
    return "Between two inputs the output bends as much as along a random direction", detail


def summary_figure(result: LinearityResult) -> Any:
    """First, the finding: the distance from the straight line between the ends (the chord) along alpha, real path
    against a random direction; then per source the mean largest distance and the mean R², real against random."""
    from contllm.plotting import finding, heading, plt

    summary = summarize_paths(result.paths)
    groups = [g for g in ("all", *SOURCES) if f"{g}_items" in summary]
    fig, (prof, dev, r2) = plt.subplots(
        1, 3, figsize=(19, 5), constrained_layout=True, gridspec_kw={"width_ratios": [1.4, 1, 1]}
    )
    _profiles(prof, result.paths)
    finding(prof, *linearity_finding(summary))
    _bars(dev, groups, [(result.model, summary)], "max_deviation", "Largest distance from the straight line (mean)")
    _bars(r2, groups, [(result.model, summary)], "r2", "How well the straight line fits, R² (mean)")
    heading(fig, result.model, "linearity", len(result.paths), "paths")
    return fig


def comparison_figure(runs: Sequence[tuple[str, LinearityResult, dict[str, Any]]]) -> Any:
    """Runs side by side: mean max |p - chord| and mean R² per source, real and random direction."""
    from contllm.plotting import plt

    fig, (dev, r2) = plt.subplots(1, 2, figsize=(13, 4.6), constrained_layout=True)
    groups = [g for g in ("all", *SOURCES) if any(f"{g}_items" in s for _, _, s in runs)]
    labelled = [(label, summary) for label, _, summary in runs]
    _bars(dev, groups, labelled, "max_deviation", "mean of max |p(alpha) - chord|")
    _bars(r2, groups, labelled, "r2", "mean R² of the chord fit")
    fig.suptitle("linearity: " + " vs ".join(dict.fromkeys(label for label, _, _ in runs)), fontsize=12)
    return fig


EXPERIMENT = LinearityExperiment()
