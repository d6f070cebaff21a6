"""The card: what an audit found, as data (card.json) with bootstrap confidence intervals over items.

A :class:`Card` holds one :class:`Finding` per experiment: the sentence of what was found,
the headline number and the paper's numbers (:class:`Number`), each read from the run's own
summary with a percentile bootstrap interval over its items (:func:`bootstrap`) and the
reference numbers of the embedded models measured at the audit's settings
(:mod:`contllm.audits.reference`), the run's summary figure and its explorer page.
Each number's direction and meaning come from the experiment's declared metrics.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contllm.errors import ExperimentError, RunDirectoryError
from contllm.rundir.files import parse_json

#: The confidence level of every interval on a card.
LEVEL = 0.95


# ---------------------------------------------------------------------------- bootstrap


def _value(summary: Mapping[str, Any], name: str) -> float:
    value = summary.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float("nan")
    return float(value)


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """The bootstrap's resamples: ``resamples`` rows of ``n`` item indices drawn with replacement [resamples, n]."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap(
    experiment: Any,
    result: Any,
    names: Sequence[str],
    *,
    resamples: int = 1000,
    level: float = LEVEL,
    seed: int = 0,
) -> dict[str, tuple[float | None, float | None]]:
    """Percentile bootstrap intervals over items of the metrics ``names`` of ``experiment.summary(result)``.

    Each resample draws the result's records with replacement (:func:`resample_indices`) and
    takes the experiment's own summary of them; the interval holds the central ``level`` of
    those values (NaN values, a resample where a metric is undefined, left out; None where
    every one is). A metric that the summary computes as the mean over items of each item's
    own value (the summary of all items equals the NaN-skipping mean of the one-item
    summaries) is resampled from those item values, which gives the same numbers without
    computing a summary per resample; any other metric is summarised resample by resample.
    """
    records = list(result.records)
    n = len(records)
    if n == 0:
        raise ExperimentError("a bootstrap needs at least one item")
    index = resample_indices(n, resamples, seed)
    full = experiment.summary(result)
    singles: list[Mapping[str, Any]] | None
    try:
        singles = [experiment.summary(dataclasses.replace(result, records=[r])) for r in records]
    except ExperimentError:  # a summary that needs more than one item
        singles = None
    out: dict[str, tuple[float | None, float | None]] = {}
    slow: list[str] = []
    for name in names:
        values = None if singles is None else np.array([_value(s, name) for s in singles])
        if values is not None and _is_item_mean(_value(full, name), values):
            with warnings.catch_warnings():  # a resample with no defined value is NaN, and left out
                warnings.simplefilter("ignore", RuntimeWarning)
                drawn = np.nanmean(values[index], axis=1)
            out[name] = _interval(drawn, level)
        else:
            slow.append(name)
    if slow:
        drawn_rows = [
            experiment.summary(dataclasses.replace(result, records=[records[i] for i in row])) for row in index
        ]
        for name in slow:
            out[name] = _interval(np.array([_value(s, name) for s in drawn_rows]), level)
    return {name: out[name] for name in names}


def _is_item_mean(full: float, values: np.ndarray) -> bool:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return bool(math.isnan(full))
    return bool(math.isfinite(full) and math.isclose(full, float(finite.mean()), rel_tol=1e-9, abs_tol=1e-12))


def _interval(drawn: np.ndarray, level: float) -> tuple[float | None, float | None]:
    finite = drawn[np.isfinite(drawn)]
    if not finite.size:
        return None, None
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


# ---------------------------------------------------------------------------- the card


@dataclass
class Number:
    """One number of a finding: a metric of the run's summary with its interval and the reference models' values.

    role: "headline" or "paper". value: the summary's value (None where undefined); low,
    high: its bootstrap interval. direction, meaning: the experiment's declaration.
    reference: model -> {"value", "low", "high", "items"} measured on the embedded models.
    """

    metric: str
    role: str
    value: float | None
    low: float | None
    high: float | None
    direction: str
    meaning: str
    reference: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Finding:
    """One experiment of the audit: its run, what was found, its numbers (headline first), figure and explorer.

    run, figure, explorer: paths relative to the audit directory (figure and explorer None
    where the run has none). items: how many records the run holds. seconds: the run's
    wall time in this audit (None where a resumed audit found it finished).
    """

    experiment: str
    run: str
    items: int
    sentence: str
    numbers: list[Number]
    figure: str | None = None
    explorer: str | None = None
    seconds: float | None = None

    @property
    def headline(self) -> Number:
        return self.numbers[0]


@dataclass
class Card:
    """What an audit found about one model (card.json): one :class:`Finding` per experiment.

    model, protocol: as audited. plan: the audit's plan (:class:`~contllm.audits.budget.Plan`
    as data: budget, calibration, counts). bootstrap: resamples, level and seed of the
    intervals. reference: where the reference numbers come from (file, date, machine,
    models), None without them. dtype_choice: what ``--dtype auto`` measured and picked
    (:meth:`contllm.models.autodtype.DtypeChoice.to_dict`, from the runs' manifests), None
    for a dtype given by name. seconds and created: times (a resumed audit's differ).
    """

    model: str
    protocol: str
    plan: dict[str, Any]
    findings: list[Finding]
    bootstrap: dict[str, Any]
    reference: dict[str, Any] | None = None
    dtype_choice: dict[str, Any] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    def finding(self, experiment: str) -> Finding:
        for f in self.findings:
            if f.experiment == experiment:
                return f
        raise ExperimentError(
            f"the card has no {experiment!r}; it holds {', '.join(f.experiment for f in self.findings)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Card:
        """A card from its :meth:`to_dict` data (card.json); ExperimentError "not a card: <field>: expected ..." when
        it does not hold to the card's schema (:data:`contllm.rundir.schemas.CARD`)."""
        from contllm.rundir.schemas import CARD, validate

        validate(data, CARD, "not a card", ExperimentError)
        findings = [Finding(**{**f, "numbers": [Number(**n) for n in f["numbers"]]}) for f in data["findings"]]
        return cls(**{**data, "findings": findings})

    def to_pandas(self) -> Any:
        """One row per number: model, protocol, experiment, items, metric, role, value, low, high, direction, and a
        column ``reference: MODEL`` per reference model. Raises MissingDependencyError without pandas."""
        try:
            import pandas as pd
        except ImportError:
            from contllm.errors import MissingDependencyError

            raise MissingDependencyError("to_pandas needs pandas; install it with: pip install pandas") from None
        rows = []
        for f in self.findings:
            for n in f.numbers:
                row = {
                    "model": self.model,
                    "protocol": self.protocol,
                    "experiment": f.experiment,
                    "items": f.items,
                    "metric": n.metric,
                    "role": n.role,
                    "value": n.value,
                    "low": n.low,
                    "high": n.high,
                    "direction": n.direction,
                }
                row.update({f"reference: {m}": ref.get("value") for m, ref in n.reference.items()})
                rows.append(row)
        return pd.DataFrame(rows)


def load_card(path: str | Path) -> Card:
    """The card of an audit: ``path`` is its card.json or the audit directory; RunDirectoryError when there is none."""
    path = Path(path)
    file = path / "card.json" if path.is_dir() else path
    if not file.is_file():
        raise RunDirectoryError(f"{path} holds no card (no {file.name}); give a card.json or an audit directory")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirectoryError(f"cannot read {file} ({exc})") from None
    from contllm.rundir.schemas import CARD

    data = parse_json(text, f"{file} is not a card", schema=CARD)
    try:
        return Card.from_dict(data)
    except ExperimentError as exc:
        raise RunDirectoryError(f"{file} is {exc}") from None


def _number(value: Any) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) else float(value)


def build_card(
    out: Path,
    plan: Any,
    *,
    model: str,
    protocol: str,
    run_seconds: Mapping[str, float | None],
    resamples: int = 1000,
    seed: int = 0,
) -> Card:
    """The card of the audit in ``out``: every run of ``plan`` read back (:func:`~contllm.rundir.report.load_run`) and bootstrapped."""
    from contllm import __version__, registry
    from contllm.audits import reference
    from contllm.audits.studies import study
    from contllm.rundir.report import load_run
    from contllm.rundir.runs import now

    refs = reference.load()
    findings = []
    dtype_choice = None
    for share in plan.shares:
        s = study(share.experiment)
        experiment = registry.get(s.experiment)
        run = load_run(out / s.experiment)
        dtype_choice = dtype_choice or run.manifest.get("dtype_choice")
        intervals = bootstrap(experiment, run.result, s.metrics, resamples=resamples, seed=seed)
        declared = {m.name: m for m in experiment.metrics}
        numbers = []
        for role, name in [("headline", s.headline), *[("paper", p) for p in s.paper]]:
            if name not in declared:
                raise ExperimentError(f"{s.experiment} declares no metric {name!r}; its metrics: {', '.join(declared)}")
            low, high = intervals[name]
            numbers.append(
                Number(
                    name,
                    role,
                    _number(run.summary.get(name)),
                    low,
                    high,
                    declared[name].direction,
                    declared[name].meaning,
                    reference.values(refs, protocol, s.experiment, name),
                )
            )
        figure = Path(s.experiment) / "figures" / "summary.png"
        explorer = Path(s.experiment) / "explorer.html"
        findings.append(
            Finding(
                s.experiment,
                s.experiment,
                len(run.result.records),
                s.finding(run.summary, intervals),
                numbers,
                figure.as_posix() if (out / figure).is_file() else None,
                explorer.as_posix() if (out / explorer).is_file() else None,
                run_seconds.get(s.experiment),
            )
        )
    return Card(
        model=model,
        protocol=protocol,
        plan=plan.to_dict(),
        findings=findings,
        bootstrap={"resamples": resamples, "level": LEVEL, "seed": seed, "over": "items"},
        reference=reference.about(refs),
        dtype_choice=dtype_choice,
        versions={"contllm": __version__},
        seconds={"runs": dict(run_seconds)},
        created=now(),
    )
