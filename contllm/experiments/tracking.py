"""Open-vocabulary tracking, shared by tokens, scaling and translation.

A prompt is edited by a knob (a word interpolated into another, a span's duration
scaled, every duration scaled, every time shifted) and the full next-token distribution
is evaluated at every value of the knob. Which tokens matter is known only after the
sweep: a token is *tracked* when its probability exceeds the threshold at some value.
A :class:`Track` keeps the tracked tokens' curves, the most probable token at each
value, and distances between whole distributions (total variation from the reference
value - the plain prompt - and along the sweep, and the largest change of any token's
probability), so the vocabulary-wide picture survives keeping only a few columns.

:class:`TrackingExperiment` holds what the three experiments share: items, records,
result, tables and figures. Each item is evaluated by one engine call of its own, so a
record depends on its item alone and a resumed run reproduces it bitwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from contllm.core.signal import Signal
from contllm.data.user import Row, read_rows, unique_ids
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table
from contllm.experiments.records import Record, RecordList, Records

DEFAULT_THRESHOLD = 0.05
#: Smallest threshold: at most 1/threshold tokens exceed it at one value of the knob.
MIN_THRESHOLD = 1e-3
#: Distances drawn on a log axis are clipped here (0 at the reference itself).
FLOOR = 1e-10
BUILT_IN = Path(__file__).resolve().parents[1] / "data" / "tokens.json"
ROWS = (
    "id, prompt, span (text of the prompt to edit), "
    "to (optional: interpolate span into it; without it the span's duration is scaled)"
)


# ---------------------------------------------------------------------------- items
@dataclass(frozen=True)
class PromptItem:
    """A prompt to sweep; ``span`` (a whole-word text of the prompt) and ``to`` say how ``tokens`` edits it."""

    id: str
    prompt: str
    span: str | None = None
    to: str | None = None

    @property
    def edit(self) -> str:
        """The kind of edit: "interpolate" (span -> to in embedding space) or "scale" (the span's duration)."""
        return "interpolate" if self.to is not None else "scale"

    def span_at(self) -> tuple[int, int]:
        """Character span of the first whole-word occurrence of ``span`` in the prompt."""
        found = find_span(self.prompt, self.span or "")
        if found is None:
            raise ExperimentError(f"item {self.id}: {self.span!r} does not occur as whole words in {self.prompt!r}")
        return found


def find_span(text: str, needle: str) -> tuple[int, int] | None:
    """The first whole-word occurrence of ``needle`` in ``text`` (None when there is none)."""
    if not needle:
        return None
    match = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", text)
    return None if match is None else (match.start(), match.end())


def read_items(path: str | Path, *, edits: bool) -> list[PromptItem]:
    """Items from a dataset file (rows: :data:`ROWS`); with ``edits`` the span is required and checked."""
    rows = read_rows(path)
    return unique_ids([_item(row, edits) for row in rows], str(path))


def _item(row: Row, edits: bool) -> PromptItem:
    item_id = row.get("id", str, default=f"row-{row.number}")
    prompt = row.get("prompt", str)
    if not edits:
        return PromptItem(item_id, prompt)
    span = row.get(
        "span", str, check=lambda s: None if find_span(prompt, s) else "does not occur as whole words in the prompt"
    )
    to = row.get("to", str, default=None, check=lambda t: "equals the span" if t == span else None)
    return PromptItem(item_id, prompt, span, to)


def load_items(data: str | None, *, edits: bool) -> list[PromptItem]:
    """The items of ``data`` (a dataset file) or the built-in ones (contllm/data/tokens.json)."""
    return read_items(data if data is not None else BUILT_IN, edits=edits)


# ---------------------------------------------------------------------------- records
@dataclass
class Track(Record, what="tracking record"):
    """One item's sweep, reduced to the tokens that mattered.

    x: the knob's values [S] (named ``knob``); token_ids / labels: the tracked tokens
    [K] (decoded text); probs: their probabilities [S, K]; top_ids / top_labels /
    top_probs: the most probable token at each value [S]; reference: the knob's value
    of the plain prompt (None when it is not on the sweep); tv: total variation distance
    of each whole distribution from the reference one [S]; max_dp: the largest
    |p(x) - p(reference)| over the vocabulary [S]; step_tv: total variation between
    neighbouring values [S - 1]; meta: facts about the item.
    """

    item_id: str
    knob: str
    x: np.ndarray
    token_ids: list[int]
    labels: list[str]
    probs: np.ndarray
    top_ids: list[int]
    top_labels: list[str]
    top_probs: np.ndarray
    reference: float | None
    tv: np.ndarray | None
    max_dp: np.ndarray | None
    step_tv: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        s = len(self.x)
        self.probs = self.probs.reshape(s, len(self.token_ids))  # [] of no values still has K columns
        if len(self.top_ids) != s or len(self.top_probs) != s or len(self.step_tv) != max(s - 1, 0):
            raise ExperimentError(f"malformed tracking record {self.item_id}: per-value fields of unequal length")

    @property
    def argmax_changes(self) -> bool:
        """Whether the most probable token differs somewhere on the sweep."""
        return len(set(self.top_ids)) > 1


def vocabulary_labels(tokenizer: Any, size: int) -> tuple[str, ...]:
    """The decoded text of token ids 0..size-1 (ids the tokenizer lacks read as "<id N>")."""
    from contllm.core.readout import decoded_vocabulary

    known = decoded_vocabulary(tokenizer)
    return tuple(known[:size]) + tuple(f"<id {i}>" for i in range(len(known), size))


def track(
    item_id: str,
    knob: str,
    x: np.ndarray,
    probs: torch.Tensor,
    labels: Sequence[str],
    *,
    threshold: float,
    reference: float | None,
    meta: dict[str, Any] | None = None,
    candidates: int | None = None,
) -> Track:
    """Reduce full next-token distributions probs [S, vocab] over the knob's values x [S] to a :class:`Track`.

    A token is tracked when its probability exceeds ``threshold`` at some value; tracked
    tokens are ordered by their largest probability (then by id). ``reference``: the
    value whose distribution the others are compared with (None: none on the sweep).
    candidates: only ids below it may be tracked (None: every id).
    """
    p = probs.detach().to(device="cpu", dtype=torch.float64)
    if p.ndim != 2 or p.shape[0] != len(x):
        raise ExperimentError(f"item {item_id}: expected distributions [{len(x)}, vocab], got {tuple(p.shape)}")
    if not bool(torch.isfinite(p).all()):
        raise ExperimentError(f"item {item_id}: the model produced non-finite probabilities")
    peak = p.max(dim=0).values
    tracked = torch.nonzero(peak[:candidates] > threshold).flatten().tolist()
    tracked.sort(key=lambda i: (-float(peak[i]), i))
    top = p.argmax(dim=1)
    ref_index = None
    if reference is not None:
        hits = np.flatnonzero(np.isclose(x, reference, rtol=0, atol=1e-12))
        ref_index = int(hits[0]) if len(hits) else None
    tv = max_dp = None
    if ref_index is not None:
        diff = (p - p[ref_index]).abs()
        tv, max_dp = (0.5 * diff.sum(dim=1)).numpy(), diff.max(dim=1).values.numpy()
    return Track(
        item_id=item_id,
        knob=knob,
        x=np.asarray(x, dtype=np.float64),
        token_ids=tracked,
        labels=[labels[i] for i in tracked],
        probs=p[:, tracked].numpy(),
        top_ids=top.tolist(),
        top_labels=[labels[i] for i in top.tolist()],
        top_probs=p.gather(1, top[:, None])[:, 0].numpy(),
        reference=None if ref_index is None else float(x[ref_index]),
        tv=tv,
        max_dp=max_dp,
        step_tv=(0.5 * (p[1:] - p[:-1]).abs().sum(dim=1)).numpy(),
        meta=dict(meta or {}),
    )


@dataclass
class TrackResult(Records[Track], record=Track):
    """Every item's :class:`Track` of one tracking experiment on one model (``tracks``), with its configuration."""

    tracks = RecordList()
    track = Records.record


# ---------------------------------------------------------------------------- the shared experiment
@dataclass
class TrackPlan:
    """What one item becomes before it runs: the knob's values [S], one signal per value, the reference value, and
    the ids that may be tracked (``candidates``: those below it; None: all)."""

    knob: str
    x: np.ndarray
    signals: list[Signal]
    reference: float | None
    meta: dict[str, Any] = field(default_factory=dict)
    candidates: int | None = None

    def track(self, item_id: str, probs: torch.Tensor, labels: Sequence[str], threshold: float) -> Track:
        """The :class:`Track` of this plan's distributions probs [S, vocab] (:func:`track`)."""
        return track(
            item_id,
            self.knob,
            self.x,
            probs,
            labels,
            threshold=threshold,
            reference=self.reference,
            meta=self.meta,
            candidates=self.candidates,
        )


def check_threshold(threshold: float) -> None:
    if not MIN_THRESHOLD <= threshold < 1:
        raise ExperimentError(f"--threshold must lie in [{MIN_THRESHOLD:g}, 1), got {threshold:g}")


class TrackingExperiment(Experiment[Track, TrackResult]):
    """An experiment whose items are sweeps read over the whole vocabulary (tokens, scaling, translation).

    Subclasses set the :class:`Experiment` attributes and implement :meth:`items`,
    :meth:`sweep` and :meth:`summary`; the config has ``threshold``.
    """

    engine: ClassVar[bool] = True
    shardable: ClassVar[bool] = True
    result_type = TrackResult
    explorer = True
    metrics = Metric.table(
        """
        mean_max_step_tv      lower  largest total variation between neighbouring values of the knob, mean over items (smoothness)
        mean_path_tv          lower  total variation summed along the sweep, mean over items
        share_argmax_changes  lower  share of items whose most probable token changes on the sweep
        """
    )
    #: Which distance from the reference the figures draw: "tv" or "max_dp".
    distance: ClassVar[str] = "tv"

    def sweep(self, lm: Any, item: Any, config: Any) -> TrackPlan:
        """The signals of one item's sweep."""
        raise NotImplementedError

    def run(self, lm: Any, config: Any, items: Sequence[Any], context: RunContext) -> Iterator[tuple[str, Track]]:
        labels: tuple[str, ...] | None = None
        for item in items:
            plan = self.sweep(lm, item, config)
            probs = context.evaluate(plan.signals)
            if labels is None:
                labels = vocabulary_labels(lm.tokenizer, int(probs.shape[-1]))
            yield item.id, plan.track(item.id, probs, labels, config.threshold)

    def tables(self, result: TrackResult) -> dict[str, Table]:
        """results.csv: every tracked token's probability at each value; values.csv: top token and distances per value."""

        def curves() -> Iterator[dict[str, Any]]:
            for t in result.tracks:
                for k, x in enumerate(t.x):
                    for j, (tid, label) in enumerate(zip(t.token_ids, t.labels)):
                        yield {
                            "item": t.item_id,
                            "knob": t.knob,
                            "x": float(x),
                            "token_id": tid,
                            "token": label,
                            "probability": float(t.probs[k, j]),
                        }

        def values() -> Iterator[dict[str, Any]]:
            for t in result.tracks:
                for k, x in enumerate(t.x):
                    yield {
                        "item": t.item_id,
                        "knob": t.knob,
                        "x": float(x),
                        "top_id": t.top_ids[k],
                        "top_token": t.top_labels[k],
                        "top_probability": float(t.top_probs[k]),
                        "tv_from_reference": "" if t.tv is None else float(t.tv[k]),
                        "max_abs_dp": "" if t.max_dp is None else float(t.max_dp[k]),
                    }

        return {
            "results": (["item", "knob", "x", "token_id", "token", "probability"], curves()),
            "values": (
                ["item", "knob", "x", "top_id", "top_token", "top_probability", "tv_from_reference", "max_abs_dp"],
                values(),
            ),
        }

    def common_summary(self, result: TrackResult) -> dict[str, Any]:
        """Numbers every tracking experiment reports: tracked tokens, argmax changes, distances along the sweep."""
        tracks = result.tracks
        if not tracks:
            raise ExperimentError("the result holds no items")
        out: dict[str, Any] = {
            "experiment": result.experiment,
            "model": result.model,
            "items": len(tracks),
            "threshold": result.config.get("threshold"),
        }
        counts = [len(t.token_ids) for t in tracks]
        out["mean_tracked_tokens"] = float(np.mean(counts))
        out["max_tracked_tokens"] = int(max(counts))
        out["share_argmax_changes"] = float(np.mean([t.argmax_changes for t in tracks]))
        far = [float(t.tv.max()) for t in tracks if t.tv is not None]
        if far:
            out["mean_max_tv_from_reference"] = float(np.mean(far))
        steps = [t.step_tv for t in tracks if len(t.step_tv)]
        if steps:
            out["mean_path_tv"] = float(np.mean([s.sum() for s in steps]))
            out["mean_max_step_tv"] = float(np.mean([s.max() for s in steps]))
        return out

    def report_columns(self, result: TrackResult) -> dict[str, Any]:
        """Each knob's range and samples (the first item of each knob)."""
        out: dict[str, Any] = {}
        for t in result.tracks:
            if f"{t.knob}_min" not in out:
                out.update(
                    {
                        f"{t.knob}_min": float(t.x.min()),
                        f"{t.knob}_max": float(t.x.max()),
                        f"{t.knob}_samples": len(t.x),
                    }
                )
        return out

    def describe(self, t: Track) -> str:
        return str(t.meta.get("prompt", t.item_id))

    def summary_figure(self, result: TrackResult) -> Any:
        return summary_figure(result, self.distance)

    def item_figure(self, result: TrackResult, record: Track) -> Any:
        return item_figure(result, record, self.describe(record))

    def comparison(self, results: Sequence[tuple[str, TrackResult]]) -> Any:
        return comparison_figure(results, self.distance)


# ---------------------------------------------------------------------------- figures
#: Tracked tokens drawn in colour with a legend entry; the rest are drawn thin and grey.
NAMED = 10
_KNOB_NAMES = {
    "alpha": "interpolation alpha",
    "factor": "duration factor of the span",
    "s": "duration scale s (every token)",
    "tau": "time shift tau",
}
_DISTANCE_NAMES = {"tv": "total variation from the reference", "max_dp": "max |dp| from the reference"}
#: The same, in a summary figure's words.
_PLAIN_DISTANCES = {
    "tv": "how far the output is from the plain\nprompt's (total variation)",
    "max_dp": "largest change of any token's probability\nfrom the plain prompt's",
}


def _knob_name(knob: str) -> str:
    return _KNOB_NAMES.get(knob, knob)


def _grid(tracks: Sequence[Track]) -> tuple[np.ndarray, list[Track]]:
    """The first track's values and the tracks that share them."""
    x = tracks[0].x
    return x, [t for t in tracks if len(t.x) == len(x) and np.allclose(t.x, x)]


def _distance(t: Track, distance: str) -> np.ndarray | None:
    return t.tv if distance == "tv" else t.max_dp


def item_figure(result: TrackResult, t: Track, what: str) -> Any:
    """One item: every tracked token's probability against the knob (top), distances from the reference (bottom)."""
    from contllm.plotting import legend_outside, plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, constrained_layout=True, gridspec_kw={"height_ratios": [3, 1.3]}
    )
    colors = plt.get_cmap("tab10")
    for j, label in enumerate(t.labels):
        if j < NAMED:
            top.plot(t.x, t.probs[:, j], "-", lw=1.6, color=colors(j % 10), label=repr(label))
        else:
            top.plot(t.x, t.probs[:, j], "-", lw=0.7, color="0.6")
    top.plot(t.x, t.top_probs, "k:", lw=1.2, label="top-1 (any token)")
    threshold = result.config.get("threshold")
    if isinstance(threshold, (int, float)):
        top.axhline(float(threshold), color="0.5", ls="--", lw=0.8)
    more = len(t.labels) - NAMED
    legend_outside(top, title=f"tracked tokens{f' (+{more} in grey)' if more > 0 else ''}")
    top.set_ylabel("probability")
    top.set_ylim(-0.02, 1.02)
    top.grid(alpha=0.3)
    top.set_title(f"{result.model} · {result.experiment} · {t.item_id}\n{what}", fontsize=9)
    if t.tv is not None and t.max_dp is not None:
        bottom.semilogy(t.x, np.maximum(t.tv, FLOOR), "-o", ms=2.5, label="total variation")
        bottom.semilogy(t.x, np.maximum(t.max_dp, FLOOR), "-s", ms=2.5, label="max |dp| over the vocabulary")
        bottom.axvline(float(t.reference), color="0.5", ls=":", lw=0.8)  # type: ignore[arg-type]
        legend_outside(bottom)
        bottom.set_ylabel("from the\nreference", fontsize=8)
    else:
        bottom.text(
            0.5,
            0.5,
            "the reference (plain prompt) is not on this sweep",
            ha="center",
            va="center",
            transform=bottom.transAxes,
            fontsize=8,
        )
    bottom.grid(alpha=0.3)
    bottom.set_xlabel(_knob_name(t.knob))
    return fig


#: What each knob does to the prompt, in a finding's words.
_KNOB_DOES = {
    "alpha": "a word turns into another",
    "factor": "a word lasts shorter or longer",
    "s": "all of time is squeezed or stretched",
    "tau": "every time is shifted",
}
#: Largest change of any token's probability that counts as none (float rounding): under translation (max |dp|
#: from tau = 0), what a rotary family must stay within.
UNCHANGED = 1e-4


def tracking_finding(tracks: Sequence[Track], distance: str) -> tuple[str, str]:
    """The sentence a tracking summary opens with, and the numbers behind it (over the tracks of the first knob).

    max_dp: the largest change of any token's probability from the reference; up to
    :data:`UNCHANGED` reads as "unchanged". tv: the mean over items of the largest total
    variation from the reference M and of the largest step between neighbouring values J;
    M under 0.05 reads as "hardly changes", J up to half of M as "gradually", else "in jumps".
    """
    knob = tracks[0].knob if tracks else ""
    does = _KNOB_DOES.get(knob, f"{knob} moves")
    values = [d for t in tracks if (d := _distance(t, distance)) is not None and t.knob == knob]
    if not values:
        return f"The output as {does}", "the plain prompt is not on the sweep: no distance from it"
    if distance == "max_dp":
        largest = float(max(v.max() for v in values))
        detail = (
            f"largest change of any token's probability from the plain prompt: {largest:.1e} over {len(values)} items"
        )
        if largest <= UNCHANGED:
            return f"The output does not change as {does}, beyond float rounding", detail
        return f"The output changes as {does}", detail
    reach = float(np.mean([v.max() for v in values]))
    jump = float(np.mean([np.abs(np.diff(v)).max() if len(v) > 1 else 0.0 for v in values]))
    detail = (
        f"total variation from the plain prompt reaches {reach:.2f}; largest step between neighbouring values "
        f"{jump:.2f} (means over {len(values)} items)"
    )
    if reach < 0.05:
        return f"The output hardly changes as {does}", detail
    if jump <= 0.5 * reach:
        return f"The output moves gradually as {does}", detail
    return f"The output moves in jumps as {does}", detail


def summary_figure(result: TrackResult, distance: str) -> Any:
    """Across items. First, the finding: each item's distance from the reference (the plain prompt) against the knob,
    with the mean (tv) or the largest (max_dp) over items; a panel per further knob; last, how many tokens each item
    tracks, and whether its most probable token changes."""
    from contllm.plotting import finding, heading, legend_outside, plt, shortened

    knobs = list(dict.fromkeys(t.knob for t in result.tracks))
    fig, axes = plt.subplots(
        1,
        len(knobs) + 1,
        figsize=(7 * len(knobs) + 6, 5),
        constrained_layout=True,
        squeeze=False,
        gridspec_kw={"width_ratios": [1.5] * len(knobs) + [1]},
    )
    for k, (ax, knob) in enumerate(zip(axes[0], knobs)):
        tracks = [t for t in result.tracks if t.knob == knob and _distance(t, distance) is not None]
        for t in tracks:
            ax.plot(t.x, np.maximum(_distance(t, distance), FLOOR), "-", lw=0.9, alpha=0.7, label=shortened(t.item_id))  # type: ignore[arg-type]
        if tracks:
            x, same = _grid(tracks)
            values = np.array([_distance(t, distance) for t in same])
            line = values.max(axis=0) if distance == "max_dp" else values.mean(axis=0)
            ax.plot(
                x,
                np.maximum(line, FLOOR),
                "k-",
                lw=2.4,
                label=f"{'largest' if distance == 'max_dp' else 'mean'} over {len(same)} items",
            )
        if distance == "max_dp":
            ax.set_yscale("log")
            ax.axhline(UNCHANGED, color="r", ls="--", lw=0.8, label=f"{UNCHANGED:g}: float rounding")
        ax.set_xlabel(_knob_name(knob))
        ax.set_ylabel(_PLAIN_DISTANCES[distance])
        ax.grid(alpha=0.3)
        legend_outside(ax, title="item")
        if k == 0:
            finding(ax, *tracking_finding(result.tracks, distance))
        else:
            ax.set_title(f"The same as {_KNOB_DOES.get(knob, knob)}", loc="left", fontsize=9)
    bars = axes[0][-1]
    counts = [len(t.token_ids) for t in result.tracks]
    changed = [t.argmax_changes for t in result.tracks]
    bars.barh(range(len(counts)), counts, color=["tab:orange" if c else "tab:blue" for c in changed])
    bars.set_yticks(range(len(counts)), [shortened(t.item_id) for t in result.tracks], fontsize=7)
    bars.invert_yaxis()
    bars.set_xlabel(f"tracked tokens (probability above {result.config.get('threshold')} somewhere)")
    bars.set_title("Tokens that become likely along the sweep", loc="left", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:orange", "tab:blue")]
    legend_outside(bars, handles=handles, labels=["the most probable token changes", "it stays"])
    heading(fig, result.model, result.experiment, len(result.tracks))
    return fig


def comparison_figure(results: Sequence[tuple[str, TrackResult]], distance: str) -> Any:
    """Runs side by side: the mean (tv) or largest (max_dp) distance from the reference over items, against the knob."""
    from contllm.plotting import plt

    knobs = list(dict.fromkeys(t.knob for _, r in results for t in r.tracks))
    fig, axes = plt.subplots(
        1, max(1, len(knobs)), figsize=(6 * max(1, len(knobs)), 4.5), constrained_layout=True, squeeze=False
    )
    for ax, knob in zip(axes[0], knobs):
        for label, result in results:
            tracks = [t for t in result.tracks if t.knob == knob and _distance(t, distance) is not None]
            if not tracks:
                continue
            x, same = _grid(tracks)
            values = np.array([_distance(t, distance) for t in same])
            line = values.max(axis=0) if distance == "max_dp" else values.mean(axis=0)
            ax.plot(x, np.maximum(line, FLOOR), "-o", ms=3, label=f"{label} ({result.model}, {len(same)} items)")
        if distance == "max_dp":
            ax.set_yscale("log")
            ax.axhline(1e-4, color="r", ls="--", lw=0.8)
        ax.set_xlabel(_knob_name(knob))
        ax.set_ylabel(("largest " if distance == "max_dp" else "mean ") + _DISTANCE_NAMES[distance])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig
