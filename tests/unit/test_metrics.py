"""Metrics: every expected value below is worked out by hand in the comments."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from contllm.errors import ExperimentError
from contllm.metrics import (
    CountCurve,
    area_under_curve,
    argmax_coverage,
    count_calibration,
    counterfactual_time_sensitivity,
    default_thresholds,
    found_counts,
    implied_count,
    iou,
    linear_fit,
    lipschitz,
    max_jump,
    mean_iou,
    observed_time_sensitivity,
    range_excursion,
    smoothness,
    spearman,
    total_variation,
)

pytestmark = pytest.mark.unit

FACTORS = [0.5, 1.0, 1.5]
LABELS = [0, 1, 2, 3, 4]

# Item A, n = 2: the argmax walks 1 -> 2 -> 3 as c grows.
# Peak probability per label: 0: 0.1, 1: 0.7, 2: 0.6, 3: 0.5, 4: 0.1.
ITEM_A = (
    FACTORS,
    [[0.1, 0.7, 0.1, 0.05, 0.05], [0.0, 0.2, 0.6, 0.1, 0.1], [0.0, 0.1, 0.3, 0.5, 0.1]],
    LABELS,
    2,
)
# Item B, n = 3: the model overcounts at c = 1; the true count 3 only appears at c = 0.5.
# Peaks: 0: 0.0, 1: 0.1, 2: 0.2, 3: 0.6, 4: 0.9.
ITEM_B = (
    FACTORS,
    [[0.0, 0.1, 0.2, 0.6, 0.1], [0.0, 0.0, 0.1, 0.2, 0.7], [0.0, 0.0, 0.0, 0.1, 0.9]],
    LABELS,
    3,
)
# Item C, n = 1: the argmax is 0 at c = 0.5 and 1 at c = 1; at c = 1.5 labels 1 and 2 tie.
# Peaks: 0: 0.8, 1: 0.6, 2: 0.4, 3: 0.1, 4: 0.0.
ITEM_C = (
    FACTORS,
    [[0.8, 0.2, 0.0, 0.0, 0.0], [0.3, 0.6, 0.1, 0.0, 0.0], [0.1, 0.4, 0.4, 0.1, 0.0]],
    LABELS,
    1,
)
ITEMS = [ITEM_A, ITEM_B, ITEM_C]


@pytest.fixture
def strict_numerics():
    """Turn every numpy floating-point event and every warning into an error."""
    with np.errstate(all="raise"), warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# --------------------------------------------------------------------------- counting


def test_found_counts_per_item() -> None:
    assert found_counts(*ITEM_A[:3], 0.5) == {1, 2, 3}
    assert found_counts(*ITEM_B[:3], 0.5) == {3, 4}
    assert found_counts(*ITEM_C[:3], 0.5) == {0, 1}
    # "Reaches" is inclusive: 0.6 is found at h = 0.6, not above it.
    assert found_counts(*ITEM_A[:3], 0.6) == {1, 2}
    assert found_counts(*ITEM_A[:3], 0.61) == {1}
    assert found_counts(*ITEM_A[:3], 0.0) == set(LABELS)
    assert found_counts(*ITEM_A[:3], 1.0) == set()


def test_iou_by_hand() -> None:
    assert iou({1, 2, 3}, 2) == pytest.approx(2 / 3)
    assert iou({3, 4}, 3) == pytest.approx(1 / 4)  # {3} over {1, 2, 3, 4}
    assert iou({0, 1}, 1) == pytest.approx(1 / 2)
    assert iou(set(), 2) == 0.0
    assert iou({1, 2}, 2) == 1.0
    assert iou(set(), 0) == 1.0  # both empty: defined as perfect agreement


def test_mean_iou_over_items() -> None:
    # h = 0.5: (2/3 + 1/4 + 1/2) / 3 = 17/36.
    assert mean_iou(ITEMS, 0.5) == pytest.approx(17 / 36)
    # h = 0: all five labels are found; 2/5, 3/5 and 1/5 average to 2/5.
    assert mean_iou(ITEMS, 0.0) == pytest.approx(2 / 5)


def test_observed_and_counterfactual_sensitivity() -> None:
    thresholds = [0.0, 0.5, 1.0]
    # h = 0.5, observed: A finds {1, 2} of {1, 2} -> 1; B finds {3} of {1, 2, 3} -> 1/3;
    # C finds {1} -> 1. Mean 7/9. Nothing reaches probability 1.
    observed = observed_time_sensitivity(ITEMS, thresholds)
    np.testing.assert_allclose(observed, [1.0, 7 / 9, 0.0])
    # At c = 1 only: A finds {2} -> 1/2; B finds {4} -> 0; C finds {1} -> 1. Mean 1/2.
    counterfactual = counterfactual_time_sensitivity(ITEMS, thresholds)
    np.testing.assert_allclose(counterfactual, [1.0, 0.5, 0.0])
    # The item whose true count only shows at c < 1: found on the sweep, not at c = 1.
    assert observed_time_sensitivity([ITEM_B], [0.5])[0] == pytest.approx(1 / 3)
    assert counterfactual_time_sensitivity([ITEM_B], [0.5])[0] == 0.0
    # Area: 0.5 * (1 + 7/9) / 2 + 0.5 * (7/9 + 0) / 2 = 23/36.
    assert area_under_curve(thresholds, observed) == pytest.approx(23 / 36)
    assert area_under_curve(thresholds, counterfactual) == pytest.approx(0.5)


def test_counterfactual_reads_the_factor_within_tolerance() -> None:
    factors = [0.5, 1.0 + 1e-9, 1.5]
    item = (factors, ITEM_B[1], LABELS, 3)
    assert counterfactual_time_sensitivity([item], [0.5])[0] == 0.0
    # Reading at c = 0.5 instead recovers the true count 3.
    assert counterfactual_time_sensitivity([item], [0.5], at=0.5)[0] == pytest.approx(1 / 3)


def test_items_may_be_count_curves() -> None:
    curves = [CountCurve(*item) for item in ITEMS]
    np.testing.assert_allclose(
        observed_time_sensitivity(curves, [0.5]), observed_time_sensitivity(ITEMS, [0.5])
    )
    assert curves[0].expected == {1, 2}


def test_torch_inputs_are_accepted() -> None:
    factors, probs, labels, n = ITEM_A
    item = (torch.tensor(factors), torch.tensor(probs, dtype=torch.bfloat16), torch.tensor(labels), n)
    assert found_counts(*item[:3], 0.5) == {1, 2, 3}


def test_step_sensitivity_area() -> None:
    h = default_thresholds(11)  # 0.0, 0.1, ..., 1.0
    step = np.where(h <= 0.5 + 1e-12, 1.0, 0.0)  # 1 at h = 0 .. 0.5, 0 at 0.6 .. 1
    # Five full intervals of width 0.1 (0.5) plus one falling trapezoid 0.1 * (1 + 0) / 2.
    assert area_under_curve(h, step) == pytest.approx(0.55)
    assert area_under_curve([0.0, 1.0], [1.0, 1.0]) == pytest.approx(1.0)


def test_argmax_coverage() -> None:
    # A: argmaxes {1, 2, 3} cover {1, 2}; B: {3, 4} covers 1/3; C: {0, 1, 2} (labels 1 and 2
    # tie at c = 1.5, and a tie counts for both) covers {1}. Mean 7/9.
    assert argmax_coverage(ITEMS) == pytest.approx(7 / 9)
    assert argmax_coverage([ITEM_B]) == pytest.approx(1 / 3)


def test_expected_counts_outside_the_labels_are_never_found() -> None:
    probs = np.full((2, 3), 0.9)
    assert observed_time_sensitivity([([0.5, 1.0], probs, [0, 1, 2], 4)], [0.5])[0] == 0.5


def test_implied_count_renormalises_over_labels() -> None:
    # Row 1: 0.7 * 1 + 0.1 * 2 + 0.05 * 3 + 0.05 * 4 = 1.25 (mass 1).
    # Row 2: mass 0.5 on labels 1 and 2 equally -> 1.5, not 0.75.
    probs = [[0.1, 0.7, 0.1, 0.05, 0.05], [0.0, 0.25, 0.25, 0.0, 0.0]]
    np.testing.assert_allclose(implied_count(probs, LABELS), [1.25, 1.5])


def test_linear_fit_of_a_line_is_exact() -> None:
    x = np.array([0.0, 0.5, 1.0, 2.0])
    fit = linear_fit(x, 3.0 * x - 1.0)
    assert fit.slope == pytest.approx(3.0)
    assert fit.intercept == pytest.approx(-1.0)
    assert fit.r2 == pytest.approx(1.0)


def test_linear_fit_of_a_noisy_curve() -> None:
    # x mean 1.5, y mean 1.5; Sxy = 4, Sxx = 5 -> slope 0.8, intercept 0.3.
    # Residuals -0.3, 0.9, -0.9, 0.3 -> SS_res 1.8; SS_tot 5 -> R^2 = 0.64.
    fit = linear_fit([0, 1, 2, 3], [0, 2, 1, 3])
    assert fit.slope == pytest.approx(0.8)
    assert fit.intercept == pytest.approx(0.3)
    assert fit.r2 == pytest.approx(0.64)


def test_count_calibration() -> None:
    perfect = count_calibration(FACTORS, [1.0, 2.0, 3.0], 2)  # n c = 1, 2, 3
    assert perfect.mae == pytest.approx(0.0)
    assert perfect.fit.slope == pytest.approx(1.0)
    assert perfect.fit.intercept == pytest.approx(0.0, abs=1e-12)
    assert perfect.rank_correlation == pytest.approx(1.0)
    # E[k] = 1.5, 2, 2.5 against 1, 2, 3: errors 0.5, 0, 0.5 -> MAE 1/3; E = 0.5 n c + 1.
    damped = count_calibration(FACTORS, [1.5, 2.0, 2.5], 2)
    assert damped.mae == pytest.approx(1 / 3)
    assert damped.fit.slope == pytest.approx(0.5)
    assert damped.fit.intercept == pytest.approx(1.0)
    assert damped.fit.r2 == pytest.approx(1.0)


def test_spearman_with_ties() -> None:
    # Ranks of x with the tie averaged: 1, 2.5, 2.5, 4; ranks of y: 1, 3, 2, 4.
    # Centred: (-1.5, 0, 0, 1.5) and (-1.5, 0.5, -0.5, 1.5): 4.5 / sqrt(4.5 * 5) = sqrt(0.9).
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
    assert spearman([0.1, 0.5, 1.0], [1.0, 10.0, 11.0]) == pytest.approx(1.0)
    assert spearman([0.1, 0.5, 1.0], [3.0, 2.0, -5.0]) == pytest.approx(-1.0)


# --------------------------------------------------------------------------- smoothness


def test_curve_with_one_jump() -> None:
    x = [0.0, 1.0, 1.5, 3.0]
    y = [0.0, 0.0, 2.0, 2.0]
    assert total_variation(y) == pytest.approx(2.0)
    assert max_jump(y) == pytest.approx(2.0)
    # Finite differences: forward (0 - 0) / 1 = 0, central (2 - 0) / 1.5 = 4/3 and (2 - 0) / 2 = 1,
    # backward 0; the steepest, 4/3, divided by the range 2.
    assert lipschitz(x, y) == pytest.approx(2 / 3)
    assert range_excursion(y) == 0.0
    s = smoothness(x, y)
    assert (s.total_variation, s.max_jump, s.lipschitz, s.range_excursion) == pytest.approx(
        (2.0, 2.0, 2 / 3, 0.0)
    )


def test_lipschitz_ignores_the_curve_height() -> None:
    x = np.linspace(0.0, 1.0, 5)
    assert lipschitz(x, 10.0 * x) == pytest.approx(1.0)
    assert lipschitz(x, 0.01 * x) == pytest.approx(1.0)


def test_columns_reduce_by_their_maximum() -> None:
    x = [0.0, 1.0, 1.5, 3.0]
    # Column 0 is the jump above (TV 2, jump 2, Lipschitz 2/3); column 1 climbs 0, 3, 6, 9
    # (TV 9, jump 3; differences 3, 6 / 1.5 = 4, 6 / 2 = 3, 3 / 1.5 = 2: steepest 4 over range 9 -> 4/9).
    y = np.array([[0.0, 0.0], [0.0, 3.0], [2.0, 6.0], [2.0, 9.0]])
    s = smoothness(x, y)
    assert s.total_variation == pytest.approx(9.0)
    assert s.max_jump == pytest.approx(3.0)
    assert s.lipschitz == pytest.approx(2 / 3)
    assert s.range_excursion == 0.0


def test_range_excursion() -> None:
    assert range_excursion([0.2, 0.9, 0.5]) == pytest.approx(0.4)  # above max(0.2, 0.5)
    assert range_excursion([0.5, -0.1, 0.2]) == pytest.approx(0.3)  # below min(0.5, 0.2)
    assert range_excursion([0.0, 0.3, 0.6, 1.0]) == 0.0
    assert range_excursion(np.array([[0.0, 1.0], [0.5, 1.2], [1.0, 1.0]])) == pytest.approx(0.2)


def test_flat_curves_raise_no_warnings(strict_numerics) -> None:
    x = [0.0, 0.5, 1.0]
    zeros = np.zeros(3)
    s = smoothness(x, zeros)
    assert (s.total_variation, s.max_jump, s.lipschitz, s.range_excursion) == (0.0, 0.0, 0.0, 0.0)
    assert smoothness(x, np.zeros((3, 4))).lipschitz == 0.0
    fit = linear_fit(x, zeros)
    assert (fit.slope, fit.intercept, fit.r2) == (0.0, 0.0, 1.0)
    assert math.isnan(spearman(x, zeros))
    calibration = count_calibration(x[1:], [0.0, 0.0], 3)
    assert math.isnan(calibration.rank_correlation)
    assert calibration.fit.r2 == 1.0
    assert observed_time_sensitivity([(x, np.zeros((3, 10)), range(10), 2)], [0.0, 0.5]).tolist() == [1.0, 0.0]


def test_the_hand_examples_raise_no_warnings(strict_numerics) -> None:
    observed_time_sensitivity(ITEMS, default_thresholds())
    counterfactual_time_sensitivity(ITEMS, default_thresholds())
    mean_iou(ITEMS, 0.3)
    argmax_coverage(ITEMS)
    implied_count(ITEM_A[1], LABELS)
    spearman([1, 2, 2, 3], [1, 3, 2, 4])


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: found_counts(FACTORS, ITEM_A[1], [0, 1, 2], 0.5), "probs has shape"),
        (lambda: found_counts(FACTORS[:2], ITEM_A[1], LABELS, 0.5), "probs has shape"),
        (lambda: found_counts([1.0, 0.5, 1.5], ITEM_A[1], LABELS, 0.5), "strictly increasing"),
        (lambda: found_counts(FACTORS, ITEM_A[1], LABELS, 1.5), "threshold"),
        (lambda: found_counts(FACTORS, ITEM_A[1], [0, 1, 2, 3, 3], 0.5), "distinct"),
        (lambda: found_counts(FACTORS, ITEM_A[1], [0, 1, 2, 3, 4.5], 0.5), "integers"),
        (lambda: found_counts(FACTORS, np.full((3, 5), np.nan), LABELS, 0.5), "NaN"),
        (lambda: found_counts(FACTORS, np.full((3, 5), 2.0), LABELS, 0.5), r"\[0, 1\]"),
        (lambda: found_counts([], np.zeros((0, 5)), LABELS, 0.5), "empty"),
        (lambda: observed_time_sensitivity([], [0.5]), "empty"),
        (lambda: observed_time_sensitivity(ITEMS, []), "empty"),
        (lambda: observed_time_sensitivity(ITEMS, [0.5, 1.2]), "thresholds"),
        (lambda: observed_time_sensitivity([ITEM_A, (*ITEM_B[:3], 0)], [0.5]), "item 1: n"),
        (lambda: observed_time_sensitivity([ITEM_A[:3]], [0.5]), "item 0"),
        (lambda: counterfactual_time_sensitivity([([0.5, 1.5], np.zeros((2, 5)), LABELS, 2)], [0.5]), "c = 1"),
        (lambda: area_under_curve([0.0, 0.5, 1.0], [1.0, 0.0]), "must match"),
        (lambda: area_under_curve([0.1, 0.5, 1.0], [1.0, 0.5, 0.0]), "span"),
        (lambda: area_under_curve([0.0, 0.5, 0.5, 1.0], [1.0, 0.5, 0.5, 0.0]), "strictly increasing"),
        (lambda: iou({1}, -1), "n must be"),
        (lambda: implied_count([[0.0, 0.0, 0.0]], [0, 1, 2]), "no mass"),
        (lambda: implied_count([[0.5, 0.5]], [0, 1, 2]), "must match"),
        (lambda: linear_fit([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]), "x is constant"),
        (lambda: linear_fit([0.0, 1.0], [0.0, 1.0, 2.0]), "must match"),
        (lambda: linear_fit([0.0], [0.0]), "at least 2"),
        (lambda: linear_fit([0.0, float("nan")], [0.0, 1.0]), "NaN"),
        (lambda: spearman([0.0, 1.0], [0.0]), "must match"),
        (lambda: count_calibration(FACTORS, [1.0, 2.0], 2), "must match"),
        (lambda: lipschitz([0.0, 1.0, 2.0], [0.0, 1.0]), "must match"),
        (lambda: lipschitz([0.0, 0.0, 2.0], [0.0, 1.0, 2.0]), "strictly increasing"),
        (lambda: total_variation([1.0]), "at least 2"),
        (lambda: max_jump(np.zeros((2, 2, 2))), "1-D or 2-D"),
        (lambda: range_excursion(["a", "b"]), "numeric"),
        (lambda: default_thresholds(1), "num must be"),
    ],
)
def test_bad_input_raises_experiment_error(call, message) -> None:
    with pytest.raises(ExperimentError, match=message):
        call()
