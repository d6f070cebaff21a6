"""The paper's metrics as its analysis code computes them, each checked on hand-built probability curves against a
value worked out here from the definition (never from contllm's own code): IoU against the threshold, the pure and
unpure peak rates and their improvement over chance, the Lipschitz estimates with their breakdown, the sums outcome
classes, the variation, and the paper's coverage."""

from __future__ import annotations

import numpy as np
import pytest

from contllm import metrics, registry
from contllm.experiments.sums import SumRecord, SumsResult
from contllm.experiments.sweeps import ExperimentResult, Sweep
from contllm.experiments.word_interpolation import summarize_sweeps, variation

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
    # the paper's Lipschitz, per item and answer: the ramps P(yes) and P(no) of the smooth sweep give 1 each; the
    # bump's steepest difference is the backward one, 0.75 / 0.5 = 1.5, over a range of 0.75 in both: 2 each
    assert summary["mean_lipschitz"] == pytest.approx((1 + 1 + 2 + 2) / 4)


# ---------------------------------------------------------------------------- peak rates


def peaks_by_definition(probs: np.ndarray) -> set[int]:
    """The digits d in 0..9 whose probability is at least every other digit's at some factor."""
    found = set()
    for d in range(10):
        for row in probs:
            if all(row[d] >= row[e] for e in range(10) if e != d):
                found.add(d)
                break
    return found


def count_sweep(item_id: str, rows: list[dict[int, float]], n: int, **meta: object) -> Sweep:
    probs = np.zeros((len(rows), 10))
    for i, row in enumerate(rows):
        for digit, p in row.items():
            probs[i, digit] = p
    return Sweep(item_id, np.linspace(0.25, 1.0, len(rows)), [str(k) for k in range(10)], probs, str(n), dict(meta))


#: n = 2: the most probable digit is 0, then 1, then 3, so three digits peak but one count: unpure 3/2, pure 1/2.
UNPURE = count_sweep("unpure", [{0: 0.5, 1: 0.2}, {1: 0.6, 2: 0.3}, {3: 0.7, 2: 0.2}], 2)
#: n = 3: digits 1 and 2 tie at the first factor (a tie peaks for both), 3 wins the second: pure = unpure = 1.
TIED = count_sweep("tied", [{1: 0.4, 2: 0.4, 3: 0.1}, {3: 0.9}], 3)


def test_the_peak_rates_and_their_improvement_over_chance_follow_the_papers_definition() -> None:
    rates, expected = {}, {"pure": [], "unpure": [], "chance": [], "pure_ratio": [], "unpure_ratio": []}
    for s in (UNPURE, TIED):
        n = int(s.truth)
        peaks = peaks_by_definition(s.probs)
        pure, unpure = len(peaks & set(range(1, n + 1))) / n, len(peaks) / n
        for key, value in (("pure", pure), ("unpure", unpure), ("chance", 1 / n), ("pure_ratio", pure / (1 / n)),
                           ("unpure_ratio", unpure / (1 / n))):
            expected[key].append(value)
    assert peaks_by_definition(UNPURE.probs) == {0, 1, 3} and peaks_by_definition(TIED.probs) == {1, 2, 3}
    assert expected["pure"] == [0.5, 1.0] and expected["unpure"] == [1.5, 1.0]  # unpure differs from pure
    got = metrics.peak_rates([metrics.count_curve(s) for s in (UNPURE, TIED)])
    rates = {"pure": got.pure, "unpure": got.unpure, "chance": got.chance, "pure_ratio": got.pure_improvement,
             "unpure_ratio": got.unpure_improvement}
    assert rates == pytest.approx({k: float(np.mean(v)) for k, v in expected.items()})
    # by hand: pure (0.5 + 1) / 2, unpure (1.5 + 1) / 2, chance (1/2 + 1/3) / 2; ratios (1 + 3) / 2 and (3 + 3) / 2
    assert rates == pytest.approx({"pure": 0.75, "unpure": 1.25, "chance": 5 / 12, "pure_ratio": 2.0,
                                   "unpure_ratio": 3.0})


def test_the_counting_summary_reports_the_ratio_under_the_papers_name_and_the_difference_under_another() -> None:
    result = ExperimentResult("counting", "m", {}, [UNPURE, TIED])
    summary = registry.get("counting").summary(result)
    assert summary["pure_peak_rate"] == pytest.approx(0.75) and summary["unpure_peak_rate"] == pytest.approx(1.25)
    assert summary["pure_improvement_over_chance"] == pytest.approx(2.0)  # the mean of each item's ratio
    assert summary["unpure_improvement_over_chance"] == pytest.approx(3.0)
    assert summary["chance_peak_rate"] == pytest.approx(5 / 12)
    assert summary["pure_peak_gain"] == pytest.approx(0.75 - 5 / 12)  # a difference, under its own name
    assert summary["unpure_peak_gain"] == pytest.approx(1.25 - 5 / 12)
    declared = {m.name for m in registry.get("counting").metrics}
    assert {"pure_peak_rate", "unpure_peak_rate", "pure_improvement_over_chance"} <= declared
    assert "argmax_coverage" not in summary and "argmax_coverage" not in declared


# ---------------------------------------------------------------------------- Lipschitz


def lipschitz_by_definition(x: list[float], y: list[float]) -> float:
    """The largest |derivative| (forward at the first point, central inside, backward at the last) over max - min."""
    n = len(x)
    slopes = [(y[1] - y[0]) / (x[1] - x[0])]
    slopes += [(y[i + 1] - y[i - 1]) / (x[i + 1] - x[i - 1]) for i in range(1, n - 1)]
    slopes.append((y[-1] - y[-2]) / (x[-1] - x[-2]))
    return max(abs(s) for s in slopes) / (max(y) - min(y))


X5 = [0.0, 0.25, 0.5, 0.75, 1.0]
#: (group, P(yes), P(no)) of three interpolations; the "both" item's P(yes) is flat and gives no estimate.
CURVES = [
    ("first", [0.8, 0.8, 0.4, 0.2, 0.2], [0.1, 0.1, 0.3, 0.5, 0.6]),
    ("neither", [0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.5, 0.5, 0.5, 0.1]),
    ("both", [0.7, 0.7, 0.7, 0.7, 0.7], [0.2, 0.1, 0.2, 0.1, 0.2]),
]


def yes_no_sweep(k: int, group: str, yes: list[float], no: list[float]) -> Sweep:
    answers = {"first": (True, False), "second": (False, True), "neither": (False, False), "both": (True, True)}[group]
    meta = {"group": group, "answer_first": answers[0], "answer_second": answers[1]}
    return Sweep(f"q{k}", np.array(X5), ["yes", "no"], np.array([yes, no]).T, None, meta)


def test_the_lipschitz_estimate_is_per_item_and_answer_with_its_breakdown() -> None:
    estimates = []  # (paper group, answer, estimate)
    for group, yes, no in CURVES:
        paper_group = "one" if group in ("first", "second") else group
        for answer, curve in (("yes", yes), ("no", no)):
            if max(curve) > min(curve):
                estimates.append((paper_group, answer, lipschitz_by_definition(X5, curve)))
    # by hand: first item yes 1.2 / 0.6 = 2, no 0.8 / 0.5 = 1.6; neither: the ramp 1, no 1.6 / 0.4 = 4; both: no 0.4 / 0.1
    assert [e for _, _, e in estimates] == pytest.approx([2.0, 1.6, 1.0, 4.0, 4.0])
    summary = summarize_sweeps([yes_no_sweep(k, *c) for k, c in enumerate(CURVES)])

    def mean(keep) -> float:
        return float(np.mean([e for g, a, e in estimates if keep(g, a)]))

    assert summary["mean_lipschitz"] == pytest.approx(mean(lambda g, a: True)) == pytest.approx(2.52)
    per_item_max = np.mean([2.0, 4.0, 4.0])  # contllm's former number: the larger of yes and no per item
    assert abs(summary["mean_lipschitz"] - per_item_max) > 0.5
    for g in ("neither", "one", "both"):
        assert summary[f"mean_lipschitz_{g}"] == pytest.approx(mean(lambda g_, a, g=g: g_ == g))
    for a in ("yes", "no"):
        assert summary[f"mean_lipschitz_{a}"] == pytest.approx(mean(lambda g, a_, a=a: a_ == a))
    assert (summary["mean_lipschitz_one"], summary["mean_lipschitz_neither"], summary["mean_lipschitz_both"]) == \
        pytest.approx((1.8, 2.5, 4.0))
    assert (summary["mean_lipschitz_yes"], summary["mean_lipschitz_no"]) == pytest.approx((1.5, 3.2))
    table = summary["lipschitz_by_group_and_answer"]
    assert set(table) == {"neither", "one", "both"} and set(table["both"]) == {"no"}  # the flat P(yes) has none
    assert table["neither"] == pytest.approx({"yes": 1.0, "no": 4.0})
    assert table["one"] == pytest.approx({"yes": 2.0, "no": 1.6}) and table["both"] == pytest.approx({"no": 4.0})


# ---------------------------------------------------------------------------- sums


def outcomes_by_definition(first_digit: dict[float, dict[int, float]], scaled: int, other: int) -> dict[str, bool]:
    """The paper's outcome classes of one problem, written out from their definition with plain loops."""
    unshrunk = int(str(other + scaled)[0])
    shrunk = {int(str(other + int(str(scaled)[0]))[0]), int(str(other + int(str(scaled)[1]))[0])}
    others = {int(str(other + x)[0]) for x in range(10)} - shrunk - {unshrunk}

    def p(c: float, d: int) -> float:
        return first_digit[c].get(d, 0.0)

    def s(c: float) -> float:
        return sum(p(c, d) for d in shrunk)

    last = 1.0
    valid = p(last, unshrunk) > s(last) and all(p(last, unshrunk) > p(last, o) for o in others)
    factors = [c for c in first_digit if c <= 1.0]
    successful = valid and any(s(c) > p(c, unshrunk) for c in factors)
    strongly = successful and any(s(c) > p(c, unshrunk) and all(s(c) > p(c, o) for o in others) for c in factors)
    completely = strongly and not any(s(c) > p(c, unshrunk) and any(p(c, o) > s(c) for o in others) for c in factors)
    return {"valid": valid, "successful": successful, "strongly_successful": strongly,
            "completely_successful": completely}


#: (scaled a, other b, first-digit probabilities by factor). Outputs: a = 23, b = 45 -> true "6", shrunk {"4"},
#: other {"5"}; 36 + 48 -> "8", {"5"}, {"4"}; 15 + 72 -> "8", {"7"}, none; 38 + 65 -> "1", {"6", "7"}, none.
PROBLEMS = [
    (23, 45, {0.1: {4: 0.6, 6: 0.3, 5: 0.1}, 0.4: {6: 0.3, 4: 0.35, 5: 0.35}, 0.7: {6: 0.6, 4: 0.3}, 1.0: {6: 0.7, 4: 0.2, 5: 0.1}}),
    (36, 48, {0.1: {5: 0.4, 8: 0.2, 4: 0.4}, 0.4: {5: 0.35, 8: 0.3, 4: 0.35}, 0.7: {8: 0.6, 5: 0.3}, 1.0: {8: 0.5, 5: 0.3, 4: 0.2}}),
    (15, 72, {0.1: {7: 0.9}, 0.4: {7: 0.8}, 0.7: {7: 0.6, 8: 0.3}, 1.0: {8: 0.4, 7: 0.45}}),
    (38, 65, {0.1: {6: 0.3, 7: 0.3, 1: 0.4}, 0.4: {1: 0.5, 6: 0.2}, 0.7: {1: 0.7}, 1.0: {1: 0.6, 6: 0.2, 7: 0.2}}),
    (23, 45, {0.1: {4: 0.6, 6: 0.3, 5: 0.1}, 0.4: {4: 0.4, 6: 0.1, 5: 0.5}, 0.7: {6: 0.7}, 1.0: {6: 0.8, 4: 0.1, 5: 0.1}}),
]


def sum_record(k: int, scaled: int, other: int, first_digit: dict[float, dict[int, float]]) -> SumRecord:
    x = np.array(sorted(first_digit))
    rows = [[first_digit[c].get(d, 0.0) for d in range(10)] for c in x]
    answer = str(scaled + other)
    return SumRecord(f"p{k}", x, [str(d) for d in range(10)], [rows], [answer[0]] * len(x), scaled + other, scaled,
                     other, {})


def test_the_sums_outcome_rates_follow_the_papers_definition_on_first_digit_probabilities() -> None:
    from contllm.experiments.sums import success

    expected = [outcomes_by_definition(probs, a, b) for a, b, probs in PROBLEMS]
    # by hand: 1 is completely successful; 2 successful only (never above the other output 4); 3 invalid (at c = 1
    # the true digit 8 is below 7); 4 completely, through the two shrunk outputs' sum (0.3 + 0.3 > 0.4);
    # 5 strongly, but at c = 0.4 the other output 5 beats the shrunk sum
    assert [sum(o.values()) for o in expected] == [4, 2, 0, 4, 3]
    records = [sum_record(k, *problem) for k, problem in enumerate(PROBLEMS)]
    assert [success(r) for r in records] == expected
    summary = registry.get("sums").summary(SumsResult("sums", "m", {}, records))
    valid = [o for o in expected if o["valid"]]
    assert summary["valid_rate"] == pytest.approx(len(valid) / len(expected)) == pytest.approx(0.8)
    for key, by_hand in (("successful", 1.0), ("strongly_successful", 0.75), ("completely_successful", 0.5)):
        assert summary[f"{key}_rate"] == pytest.approx(np.mean([o[key] for o in valid])) == pytest.approx(by_hand)


def test_only_factors_up_to_1_make_a_problem_successful() -> None:
    from contllm.experiments.sums import success

    # 23 + 45: the shrunk output 4 wins only at c = 1.5, a stretched number, which the paper's sweep never reaches
    record = sum_record(0, 23, 45, {0.5: {6: 0.8}, 1.0: {6: 0.8, 4: 0.1}, 1.5: {4: 0.9}})
    assert success(record) == {"valid": True, "successful": False, "strongly_successful": False,
                               "completely_successful": False}


# ---------------------------------------------------------------------------- coverage


def test_the_summary_reports_the_papers_coverage_and_its_numbers_over_the_covered_items() -> None:
    covered = count_sweep("a", [{0: 0.5, 1: 0.2}, {1: 0.6}, {3: 0.7}], 2, paper_runs=True)
    missed = count_sweep("b", [{1: 0.4, 2: 0.4}, {3: 0.9}], 3, paper_runs=False)
    summary = registry.get("counting").summary(ExperimentResult("counting", "m", {}, [covered, missed]))
    assert summary["paper_coverage"] == 0.5 and summary["items"] == 2
    inner = summary["paper_items"]
    assert inner["items"] == 1
    # over the covered item alone: digits 0, 1, 3 peak with n = 2
    assert inner["pure_peak_rate"] == pytest.approx(0.5) and inner["unpure_peak_rate"] == pytest.approx(1.5)
    assert summary["pure_peak_rate"] == pytest.approx((0.5 + 1.0) / 2)
    unrecorded = count_sweep("c", [{0: 1.0}, {1: 1.0}], 1)  # a record from before coverage was kept
    assert "paper_coverage" not in registry.get("counting").summary(ExperimentResult("counting", "m", {}, [unrecorded]))
