"""The paper's metrics: IoU against the threshold, peak rates, the sums outcome classes and the interpolation variation, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from contllm import metrics
from contllm.experiments.sums import success
from contllm.experiments.sweeps import Sweep
from contllm.experiments.word_interpolation import summarize_sweeps, variation
from tests.unit.test_sums import synthetic

pytestmark = pytest.mark.unit

DIGITS = np.arange(10)


def curve(rows: list[dict[int, float]], n: int) -> metrics.CountCurve:
    """A count curve over factors 0.25, 0.5, ... with the given digit probabilities (the rest 0)."""
    probs = np.zeros((len(rows), 10))
    for i, row in enumerate(rows):
        for digit, p in row.items():
            probs[i, digit] = p
    return metrics.CountCurve(np.linspace(0.25, 1.0, len(rows)), probs, DIGITS, n)


def test_iou_against_the_threshold_counts_unexpected_digits_in_the_union() -> None:
    # n = 3: digit 3 peaks at 0.8, digit 2 at 0.6, digit 7 (unexpected) at 0.3
    item = curve([{2: 0.6, 7: 0.3}, {3: 0.8}], 3)
    iou = metrics.iou_curve([item], [0.0, 0.25, 0.5, 0.7, 0.9])
    # h = 0: every digit reaches 0 -> found 0..9, IoU 3/10; h = 0.25: {2, 3, 7} -> 2/4; h = 0.5: {2, 3} -> 2/3
    assert iou == pytest.approx([0.3, 0.5, 2 / 3, 1 / 3, 0.0])
    assert metrics.mean_iou([item], 0.5) == pytest.approx(2 / 3)


def test_peak_rates_pure_unpure_and_chance() -> None:
    # n = 4; argmax 2 then 4 (pure: {2, 4} -> 0.5); digit 3 peaks at the middle factor without winning (unpure adds 3)
    item = curve([{2: 0.5, 3: 0.1}, {2: 0.4, 3: 0.3, 4: 0.2}, {4: 0.9, 3: 0.05}], 4)
    rates = metrics.peak_rates([item, curve([{1: 1.0}, {1: 1.0}], 2)])
    # second item: digit 1 always wins and is flat (no local maximum): pure 1/2, unpure 0
    assert rates.pure == pytest.approx((0.5 + 0.5) / 2)
    assert rates.unpure == pytest.approx((3 / 4 + 0) / 2)  # 2 (at the first factor), 3 (middle), 4 (last)
    assert rates.chance == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert metrics.argmax_coverage([item]) == pytest.approx(0.5)


def test_sums_outcome_classes() -> None:
    # factors 0.5, 1.0, 1.5; a = 20, b = 30 (see synthetic)
    assert success(synthetic(["30", "50", "60"])) == {"valid": True, "successful": True, "strongly_successful": True,
                                                     "completely_successful": True}
    assert success(synthetic(["40", "50", "45"])) == {"valid": True, "successful": True, "strongly_successful": False,
                                                     "completely_successful": False}
    assert success(synthetic(["55", "50", "60"]))["successful"] is False
    assert success(synthetic(["30", "51", "60"])) == {"valid": False, "successful": False,
                                                     "strongly_successful": False, "completely_successful": False}


def sweep(yes: list[float], group: str = "first") -> Sweep:
    yes_ = np.array(yes)
    probs = np.stack([yes_, 1.0 - yes_ - 0.05], axis=1)
    return Sweep("s", np.linspace(0, 1, len(yes)), ["yes", "no"], probs, None,
                 {"group": group, "answer_first": True, "answer_second": False})


def test_variation_is_the_largest_excursion_beyond_the_ends_and_its_share_is_reported() -> None:
    smooth, bump = sweep([0.9, 0.6, 0.3]), sweep([0.8, 0.95, 0.2])
    assert variation(smooth) == 0.0
    assert variation(bump) == pytest.approx(0.15)  # P(yes) rises 0.15 above its larger end
    summary = summarize_sweeps([smooth, bump])
    assert summary["variation_share"] == 0.5 and summary["mean_variation"] == pytest.approx(0.075)
    # normalised Lipschitz: the steepest step over each curve's own range; the smooth ramp gives 1
    assert summary["mean_lipschitz"] == pytest.approx((1.0 + (0.75 / 0.5) / 0.75) / 2)
