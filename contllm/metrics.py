"""Metrics over read-out curves: counting and event sensitivity, calibration, smoothness.

A *count curve* is one dataset item swept over a duration factor c: ``factors`` [S]
(strictly increasing, unitless multiples of the original duration), ``probs`` [S, K]
(the model's next-token probability of each label at each factor, in [0, 1]),
``labels`` [K] (distinct integers such as 0..9) and ``n``, the true count (>= 1).

The paper-style metrics (the paper's section on counting and events): for a threshold h in [0, 1] a label is
*found* if its probability reaches h (``>=``) at some factor of the sweep. The *observed
time sensitivity* at h is the share of the expected counts {1..n} found on the sweep,
the *counterfactual* one the same share read only at c = 1; both are averaged over
items and summarised by their area under the curve over h. Expected counts that are
not among the labels (n = 12 with digit labels) can never be found and count as
missing, so such items cap the sensitivity below 1.

Smoothness metrics take any curve y [S] (or [S, K], measured per column and reduced by
the maximum) over x [S], in the units of y.

Every function accepts lists, numpy arrays or CPU/GPU torch tensors, and raises
:class:`~contllm.errors.ExperimentError` naming the input that was wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from contllm.errors import ExperimentError

__all__ = [
    "CountCalibration",
    "CountCurve",
    "LinearFit",
    "PeakRates",
    "Smoothness",
    "area_under_curve",
    "argmax_coverage",
    "count_calibration",
    "counterfactual_time_sensitivity",
    "default_thresholds",
    "derivative",
    "found_counts",
    "implied_count",
    "iou",
    "iou_curve",
    "linear_fit",
    "lipschitz",
    "lipschitz_estimates",
    "max_jump",
    "mean_iou",
    "observed_time_sensitivity",
    "peak_rates",
    "peaking",
    "range_excursion",
    "smoothness",
    "spearman",
    "total_variation",
]

#: Slack allowed on probabilities computed in low precision (1.0000001 is still 1).
_PROB_SLACK = 1e-6


# --------------------------------------------------------------------------- inputs


def _to_numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, possibly on a GPU or in bfloat16
        values = values.detach().cpu()
        if values.is_floating_point():
            values = values.double()
        values = values.numpy()
    return np.asarray(values)


def _floats(values: Any, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
    try:
        array = _to_numpy(values).astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise ExperimentError(f"{name} must be numeric; could not convert it ({exc})") from exc
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if array.ndim not in allowed:
        want = " or ".join(f"{d}-D" for d in allowed)
        raise ExperimentError(f"{name} must be {want}, got shape {array.shape}")
    if array.size == 0:
        raise ExperimentError(f"{name} is empty; it needs at least one value")
    if not np.isfinite(array).all():
        bad = np.argwhere(~np.isfinite(array)).tolist()
        raise ExperimentError(f"{name} must be finite; NaN or inf at indices {bad[:10]}")
    return array


def _increasing(values: Any, name: str, min_len: int = 1) -> np.ndarray:
    array = _floats(values, name, 1)
    if array.shape[0] < min_len:
        raise ExperimentError(f"{name} needs at least {min_len} samples, got {array.shape[0]}")
    steps = np.diff(array)
    if (steps <= 0).any():
        at = int(np.argmax(steps <= 0))
        raise ExperimentError(
            f"{name} must be strictly increasing; {name}[{at}] = {array[at]:g} is followed by {array[at + 1]:g}"
        )
    return array


def _labels(values: Any, name: str = "labels") -> np.ndarray:
    array = _floats(values, name, 1)
    if not np.array_equal(array, np.round(array)):
        raise ExperimentError(f"{name} must be integers, got {array.tolist()}")
    ints = array.astype(np.int64)
    if np.unique(ints).shape[0] != ints.shape[0]:
        raise ExperimentError(f"{name} must be distinct, got {ints.tolist()}")
    return ints


def _probs(values: Any, name: str = "probs") -> np.ndarray:
    array = _floats(values, name, 2)
    if (array < -_PROB_SLACK).any() or (array > 1 + _PROB_SLACK).any():
        raise ExperimentError(
            f"{name} must be probabilities in [0, 1]; found values from {array.min():g} to {array.max():g}"
        )
    return np.clip(array, 0.0, 1.0)


def _count(n: Any, name: str = "n", minimum: int = 1) -> int:
    try:
        value = float(n)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(n, (bool, np.bool_)) or not value.is_integer() or value < minimum:
        raise ExperimentError(f"{name} must be an integer >= {minimum}, got {n!r}")
    return int(value)


def _threshold(h: Any) -> float:
    try:
        value = float(h)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise ExperimentError(f"threshold must lie in [0, 1], got {h!r}")
    return value


def _thresholds(values: Any) -> np.ndarray:
    array = _floats(values, "thresholds", 1)
    if (array < 0).any() or (array > 1).any():
        raise ExperimentError(f"thresholds must lie in [0, 1]; got values from {array.min():g} to {array.max():g}")
    return array


def _curve(values: Any, name: str, length: int | None = None) -> np.ndarray:
    """Curve values as [S, K] (a 1-D curve becomes one column)."""
    array = _floats(values, name, (1, 2))
    if array.ndim == 1:
        array = array[:, None]
    if array.shape[0] < 2:
        raise ExperimentError(f"{name} needs at least 2 samples to be a curve, got {array.shape[0]}")
    if length is not None and array.shape[0] != length:
        raise ExperimentError(f"{name} has {array.shape[0]} samples but x has {length}; they must match")
    return array


# --------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class CountCurve:
    """One item's read-out over a sweep of duration factors, validated once.

    factors: float [S], strictly increasing duration factors c (unitless).
    probs: float [S, K], probability of each label at each factor, in [0, 1].
    labels: int [K], distinct labels (e.g. the digits 0..9).
    n: the true count, an integer >= 1.
    """

    factors: np.ndarray
    probs: np.ndarray
    labels: np.ndarray
    n: int

    def __post_init__(self) -> None:
        factors = _increasing(self.factors, "factors")
        probs = _probs(self.probs)
        labels = _labels(self.labels)
        if probs.shape != (factors.shape[0], labels.shape[0]):
            raise ExperimentError(
                f"probs has shape {probs.shape} but factors has {factors.shape[0]} samples and "
                f"labels has {labels.shape[0]} entries; expected "
                f"{(factors.shape[0], labels.shape[0])}"
            )
        object.__setattr__(self, "factors", factors)
        object.__setattr__(self, "probs", probs)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "n", _count(self.n))

    @property
    def expected(self) -> frozenset[int]:
        """The expected counts {1..n}."""
        return frozenset(range(1, self.n + 1))


#: An item: a :class:`CountCurve` or a tuple (factors, probs, labels, n).
Item = CountCurve | tuple[Any, Any, Any, int]


def _items(items: Iterable[Item]) -> list[CountCurve]:
    curves = []
    for index, item in enumerate(items):
        if isinstance(item, CountCurve):
            curves.append(item)
            continue
        try:
            factors, probs, labels, n = item
        except (TypeError, ValueError) as exc:
            raise ExperimentError(f"item {index} must be a CountCurve or a tuple (factors, probs, labels, n)") from exc
        try:
            curves.append(CountCurve(factors, probs, labels, n))
        except ExperimentError as exc:
            raise ExperimentError(f"item {index}: {exc}") from exc
    if not curves:
        raise ExperimentError("items is empty; the metric needs at least one item")
    return curves


def _found(peak: np.ndarray, labels: np.ndarray, threshold: float) -> frozenset[int]:
    return frozenset(int(k) for k in labels[peak >= threshold])


def found_counts(factors: Any, probs: Any, labels: Any, threshold: float) -> frozenset[int]:
    """Labels whose probability reaches ``threshold`` (>=) at some factor of the sweep.

    factors: [S] strictly increasing; probs: [S, K] in [0, 1]; labels: [K] distinct ints;
    threshold: in [0, 1]. Returns a frozenset of labels.
    """
    curve = CountCurve(factors, probs, labels, 1)
    return _found(curve.probs.max(axis=0), curve.labels, _threshold(threshold))


def _sensitivity(curves: list[CountCurve], thresholds: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    """Mean over items of the share of {1..n} found in ``rows`` (each item's [S', K] probs)."""
    shares = np.empty((len(curves), thresholds.shape[0]))
    for i, (curve, probs) in enumerate(zip(curves, rows)):
        wanted = np.isin(curve.labels, np.arange(1, curve.n + 1))
        found = probs.max(axis=0)[None, :] >= thresholds[:, None]  # [H, K]
        shares[i] = (found & wanted).sum(axis=1) / curve.n  # labels are distinct
    return shares.mean(axis=0)


def observed_time_sensitivity(items: Sequence[Item], thresholds: Any) -> np.ndarray:
    """Share of the expected counts {1..n} found anywhere on the sweep, averaged over items.

    items: (factors [S], probs [S, K], labels [K], n) tuples or :class:`CountCurve`;
    thresholds: [H] in [0, 1]. Returns float [H] in [0, 1].
    """
    curves = _items(items)
    return _sensitivity(curves, _thresholds(thresholds), [c.probs for c in curves])


def counterfactual_time_sensitivity(
    items: Sequence[Item], thresholds: Any, *, at: float = 1.0, atol: float = 1e-6
) -> np.ndarray:
    """Like :func:`observed_time_sensitivity`, but reading each item only at factor c = ``at``.

    Every item must have a factor within ``atol`` of ``at`` (the nearest one is used);
    otherwise this raises rather than read a different factor silently.
    Returns float [H] in [0, 1].
    """
    curves = _items(items)
    rows = []
    for index, curve in enumerate(curves):
        distance = np.abs(curve.factors - at)
        nearest = int(np.argmin(distance))
        if distance[nearest] > atol:
            raise ExperimentError(
                f"item {index} has no factor within {atol:g} of c = {at:g} (nearest is "
                f"{curve.factors[nearest]:g}); include c = {at:g} in the sweep"
            )
        rows.append(curve.probs[nearest : nearest + 1])
    return _sensitivity(curves, _thresholds(thresholds), rows)


def default_thresholds(num: int = 101) -> np.ndarray:
    """Evenly spaced thresholds from 0 to 1 inclusive: float [num], num >= 2."""
    return np.linspace(0.0, 1.0, _count(num, "num", minimum=2))


def area_under_curve(thresholds: Any, values: Any) -> float:
    """Trapezoid-rule area of ``values`` over h in [0, 1].

    thresholds: [H] strictly increasing, starting at 0 and ending at 1 (so areas from
    different grids are comparable); values: [H]. For values in [0, 1] the area is in [0, 1].
    """
    h = _increasing(_thresholds(thresholds), "thresholds", min_len=2)
    y = _floats(values, "values", 1)
    if y.shape != h.shape:
        raise ExperimentError(f"values has {y.shape[0]} entries but thresholds has {h.shape[0]}; they must match")
    if h[0] != 0.0 or h[-1] != 1.0:
        raise ExperimentError(f"thresholds must span [0, 1] exactly; they run from {h[0]:g} to {h[-1]:g}")
    return float(np.sum(np.diff(h) * (y[1:] + y[:-1]) / 2.0))


def iou(found: Iterable[int], n: int) -> float:
    """Intersection over union of a found set of labels and the expected counts {1..n}.

    found: ints; n: integer >= 0. When both sets are empty (nothing found, n = 0) they
    agree perfectly and the IoU is 1.0. Returns a float in [0, 1].
    """
    found_set = {int(k) for k in found}
    expected = set(range(1, _count(n, minimum=0) + 1))
    union = found_set | expected
    if not union:
        return 1.0
    return len(found_set & expected) / len(union)


def mean_iou(items: Sequence[Item], threshold: float) -> float:
    """IoU of each item's found set at ``threshold`` with {1..n}, averaged over items."""
    return float(iou_curve(items, [_threshold(threshold)])[0])


def iou_curve(items: Sequence[Item], thresholds: Any) -> np.ndarray:
    """:func:`mean_iou` at each threshold: float [H] in [0, 1] (the paper's IoU against the peak threshold).

    The found set holds every label (expected or not) whose probability reaches h on the sweep.
    """
    curves = _items(items)
    h = _thresholds(thresholds)
    out = np.empty(h.shape[0])
    for j, threshold in enumerate(h):
        out[j] = np.mean([iou(_found(c.probs.max(axis=0), c.labels, float(threshold)), c.n) for c in curves])
    return out


@dataclass(frozen=True)
class PeakRates:
    """The paper's peak rates: which digits a sweep brings up as the most probable one, averaged over items.

    A label *peaks* when at some factor its probability is at least every other label's
    (ties peak together). Per item, with n the true count: pure = the number of counts
    1..n that peak, over n; unpure = the number of labels that peak, counts or not (0, or
    more than n), over n, so it may exceed 1; chance = 1/n, the pure rate of a sweep that
    only ever shows one count. pure_improvement and unpure_improvement are each item's rate
    over its chance (rate x n: 1 when one count peaks, 1.5 when three of n = 2 labels do).
    Every field is the mean over items.
    """

    pure: float
    unpure: float
    chance: float
    pure_improvement: float
    unpure_improvement: float


def peaking(curve: CountCurve) -> frozenset[int]:
    """The labels that are at least as probable as every other label at some factor of the sweep (ties all count)."""
    top = curve.probs.max(axis=1, keepdims=True)  # [S, 1]
    return frozenset(int(k) for k in curve.labels[(curve.probs >= top).any(axis=0)])


def peak_rates(items: Sequence[Item]) -> PeakRates:
    """:class:`PeakRates` of count curves."""
    curves = _items(items)
    pure, unpure, chance = [], [], []
    for curve in curves:
        peaks = peaking(curve)
        pure.append(len(peaks & curve.expected) / curve.n)
        unpure.append(len(peaks) / curve.n)
        chance.append(1.0 / curve.n)
    ratio = [p / c for p, c in zip(pure, chance)], [u / c for u, c in zip(unpure, chance)]
    return PeakRates(*(float(np.mean(v)) for v in (pure, unpure, chance, *ratio)))


def argmax_coverage(items: Sequence[Item]) -> float:
    """Share of the expected counts {1..n} that are the most probable label at some factor (a tie counts for every
    label in it), averaged over items: the pure peak rate of :func:`peak_rates`. Returns [0, 1]."""
    return peak_rates(items).pure


def implied_count(probs: Any, labels: Any) -> np.ndarray:
    """Expected label E[k] = sum_k k p_k / sum_k p_k at each sample.

    probs: [S, K] in [0, 1]; labels: [K] distinct ints. The probabilities are
    renormalised over the label set, so mass on other tokens does not pull E[k] to 0.
    Raises if a sample puts no mass on any label. Returns float [S], in label units.
    """
    p = _probs(probs)
    k = _labels(labels)
    if p.shape[1] != k.shape[0]:
        raise ExperimentError(f"probs has {p.shape[1]} columns but labels has {k.shape[0]} entries; they must match")
    mass = p.sum(axis=1)
    if (mass <= 0).any():
        bad = np.flatnonzero(mass <= 0).tolist()
        raise ExperimentError(f"probs puts no mass on any label at samples {bad[:10]}; E[k] is undefined there")
    return (p @ k.astype(np.float64)) / mass


@dataclass(frozen=True)
class LinearFit:
    """Least-squares line y ~ slope * x + intercept, with its coefficient of determination."""

    slope: float
    intercept: float
    r2: float


def _paired(x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """x [S] and y [S] as float arrays of one length S >= 2; ExperimentError naming ``what`` otherwise."""
    xs = _floats(x, "x", 1)
    ys = _floats(y, "y", 1)
    if xs.shape != ys.shape:
        raise ExperimentError(f"x has {xs.shape[0]} samples but y has {ys.shape[0]}; they must match")
    if xs.shape[0] < 2:
        raise ExperimentError(f"{what} needs at least 2 samples, got {xs.shape[0]}")
    return xs, ys


def linear_fit(x: Any, y: Any) -> LinearFit:
    """Ordinary least-squares fit of y [S] on x [S] (S >= 2, x not constant).

    r2 = 1 - SS_res / SS_tot. A flat y (every value equal) is fitted exactly by the line
    slope 0, intercept y, so its r2 is defined as 1.0.
    """
    xs, ys = _paired(x, y, "a line")
    if np.ptp(xs) == 0:
        raise ExperimentError(f"x is constant ({xs[0]:g}); the slope is undefined")
    if np.ptp(ys) == 0:
        return LinearFit(slope=0.0, intercept=float(ys[0]), r2=1.0)
    dx = xs - xs.mean()
    dy = ys - ys.mean()
    slope = float(dx @ dy / (dx @ dx))
    intercept = float(ys.mean() - slope * xs.mean())
    residual = ys - (slope * xs + intercept)
    r2 = float(1.0 - (residual @ residual) / (dy @ dy))
    return LinearFit(slope=slope, intercept=intercept, r2=r2)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing the average of the ranks they span."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    average = np.cumsum(counts) - (counts - 1) / 2.0
    return average[inverse.reshape(-1)]


def spearman(x: Any, y: Any) -> float:
    """Spearman rank correlation of x [S] and y [S] (S >= 2), average ranks for ties.

    Returns a float in [-1, 1], or nan when x or y is constant (no ordering to correlate).
    """
    xs, ys = _paired(x, y, "a rank correlation")
    rx = _ranks(xs) - (xs.shape[0] + 1) / 2.0
    ry = _ranks(ys) - (ys.shape[0] + 1) / 2.0
    if not rx.any() or not ry.any():
        return float("nan")
    return float(np.clip(rx @ ry / np.sqrt((rx @ rx) * (ry @ ry)), -1.0, 1.0))


@dataclass(frozen=True)
class CountCalibration:
    """How well the implied count E[k] follows the scaled count n * c.

    mae: mean |E[k] - n c| in counts. fit: E[k] fitted against n c (a calibrated model
    has slope 1, intercept 0). rank_correlation: Spearman of E[k] with c (positive when
    E[k] rises with the factor; nan when E[k] is constant).
    """

    mae: float
    fit: LinearFit
    rank_correlation: float


def count_calibration(factors: Any, implied: Any, n: int) -> CountCalibration:
    """Compare E[k] [S] at each factor c [S] (S >= 2, strictly increasing) with n * c."""
    c = _increasing(factors, "factors", min_len=2)
    expected = _floats(implied, "implied", 1)
    if expected.shape != c.shape:
        raise ExperimentError(f"implied has {expected.shape[0]} samples but factors has {c.shape[0]}; they must match")
    target = _count(n) * c
    return CountCalibration(
        mae=float(np.mean(np.abs(expected - target))),
        fit=linear_fit(target, expected),
        rank_correlation=spearman(c, expected),
    )


# --------------------------------------------------------------------------- smoothness


def total_variation(y: Any) -> float:
    """Sum of |y[i+1] - y[i]| for y [S] (S >= 2), or the largest column sum for y [S, K]."""
    curve = _curve(y, "y")
    return float(np.abs(np.diff(curve, axis=0)).sum(axis=0).max())


def max_jump(y: Any) -> float:
    """Largest |y[i+1] - y[i]| over samples (and columns, for y [S, K])."""
    curve = _curve(y, "y")
    return float(np.abs(np.diff(curve, axis=0)).max())


def derivative(x: Any, y: Any) -> np.ndarray:
    """dy/dx at every sample by finite differences: one-sided at the two ends, central inside.

    x: [S] strictly increasing (S >= 2); y: [S] or [S, K]. Returns [S, K] (a 1-D y as one
    column), in units of y per unit of x.
    """
    xs = _increasing(x, "x", min_len=2)
    curve = _curve(y, "y", length=xs.shape[0])
    out = np.empty_like(curve)
    out[0] = (curve[1] - curve[0]) / (xs[1] - xs[0])
    out[-1] = (curve[-1] - curve[-2]) / (xs[-1] - xs[-2])
    out[1:-1] = (curve[2:] - curve[:-2]) / (xs[2:] - xs[:-2])[:, None]
    return out


def lipschitz_estimates(x: Any, y: Any) -> np.ndarray:
    """The paper's Lipschitz estimate of each column: the largest |dy/dx| (:func:`derivative`) over the column's range
    max(y) - min(y).

    x: [S] strictly increasing; y: [S] or [S, K]. Returns [K], in units of the range per
    unit of x (a straight ramp over x in [0, 1] gives 1 whatever its height); NaN for a
    flat column, whose range is 0.
    """
    slopes = np.abs(derivative(x, y)).max(axis=0)
    spread = np.ptp(_curve(y, "y"), axis=0)
    out = np.full(spread.shape, np.nan)
    np.divide(slopes, spread, out=out, where=spread > 0)
    return out


def lipschitz(x: Any, y: Any) -> float:
    """The largest of :func:`lipschitz_estimates` over the columns of y [S] or [S, K]; 0 when every column is flat."""
    estimates = lipschitz_estimates(x, y)
    moving = np.isfinite(estimates)
    return float(estimates[moving].max()) if moving.any() else 0.0


def range_excursion(y: Any) -> float:
    """How far y leaves the interval spanned by its first and last values (0 if never).

    y: [S] or [S, K] (maximum over columns), in the units of y. Meant for
    interpolations, whose endpoints are the two pure inputs.
    """
    curve = _curve(y, "y")
    low = np.minimum(curve[0], curve[-1])
    high = np.maximum(curve[0], curve[-1])
    above = curve.max(axis=0) - high
    below = low - curve.min(axis=0)
    return float(max(0.0, above.max(), below.max()))


@dataclass(frozen=True)
class Smoothness:
    """Smoothness of a curve; see the functions of the same names for units."""

    total_variation: float
    max_jump: float
    lipschitz: float
    range_excursion: float


def smoothness(x: Any, y: Any) -> Smoothness:
    """All smoothness metrics of y [S] or [S, K] over x [S] (strictly increasing, S >= 2)."""
    xs = _increasing(x, "x", min_len=2)
    curve = _curve(y, "y", length=xs.shape[0])
    return Smoothness(
        total_variation=total_variation(curve),
        max_jump=max_jump(curve),
        lipschitz=lipschitz(xs, curve),
        range_excursion=range_excursion(curve),
    )


def count_curve(sweep: Any) -> CountCurve:
    """The :class:`CountCurve` of a sweep (x, labels, probs, truth) read over its digit labels."""
    numeric = [i for i, lab in enumerate(sweep.labels) if lab.isascii() and lab.isdigit()]
    labels = np.array([int(sweep.labels[i]) for i in numeric])
    return CountCurve(sweep.x, sweep.probs[:, numeric], labels, int(sweep.truth or 0))
