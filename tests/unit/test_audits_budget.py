"""The audit's budget planner: reading a budget, sharing it, and estimating what each experiment computes."""

from __future__ import annotations

from typing import Any

import pytest

from contllm import ContinuousLM, ExperimentError
from contllm.audits.budget import MARGIN, Bounds, Estimate, Probe, allocate, budget_text, least_budget, parse_budget
from contllm.audits.run import dry_run, make_plan, study_config
from contllm.audits.studies import STUDIES
from contllm.core.chunks import FORWARD_OVERHEAD
from contllm.core.engine import Engine
from contllm.data import select_items
from contllm.rundir.runner import compute_records, context_for
from tests.unit.test_audits import word_tokenizer
from tests.unit.tiny import tiny_lm

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return tiny_lm("llama", word_tokenizer())


@pytest.mark.parametrize(
    "text,seconds",
    [("10m", 600), ("90s", 90), ("1h", 3600), ("1m30s", 90), ("2.5m", 150), (" 3M ", 180), ("1h5m", 3900), (45, 45)],
)
def test_a_budget_reads_as_seconds(text: Any, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "m", "10x", "5m5m", "-1m", "10s", "1e3s", True, None, "nan", "5m 3"])
def test_a_budget_that_is_no_time_or_too_short_is_refused(text: Any) -> None:
    with pytest.raises(ExperimentError, match="--budget"):
        parse_budget(text)


def test_budget_text_writes_what_parse_budget_reads() -> None:
    for seconds in (30, 90, 180, 600, 3725):
        assert parse_budget(budget_text(seconds)) == seconds
    assert budget_text(180) == "3m" and budget_text(90) == "1m30s"


def linear(costs: dict[str, tuple[float, float]]) -> Any:
    return lambda name, count: costs[name][0] + costs[name][1] * count


def test_equal_shares_what_a_capped_experiment_leaves_goes_to_the_others() -> None:
    bounds = {"a": Bounds(2, 100, 4), "b": Bounds(2, 5, 4), "c": Bounds(1, 100, 2)}
    seconds = linear({"a": (1.0, 1.0), "b": (0.0, 1.0), "c": (2.0, 0.5)})
    counts, left_out = allocate(60.0, bounds, seconds)
    assert left_out == {} and counts["b"] == 5  # capped at its dataset's size
    # b takes 5 s of its 20 s share; a and c share the other 55 s (a: 27 s, c: 27.5 s), and the
    # half second a leaves unused buys c one more unit
    assert counts == {"a": 26, "b": 5, "c": 52}
    assert sum(seconds(n, k) for n, k in counts.items()) == 60.0


def test_an_experiment_whose_minimum_costs_more_than_a_share_gets_it_and_the_others_the_rest() -> None:
    bounds = {"slow": Bounds(1, 10, 2), "a": Bounds(4, 100, 8), "b": Bounds(4, 100, 8)}
    seconds = linear({"slow": (0.0, 40.0), "a": (0.0, 1.0), "b": (0.0, 2.0)})
    counts, _ = allocate(90.0, bounds, seconds)  # an equal share (30 s) is less than slow's minimum (40 s)
    assert counts == {"slow": 1, "a": 26, "b": 12}  # a and b share 50 s: 25 s each, then 1 s left over to a
    assert sum(seconds(n, k) for n, k in counts.items()) <= 90.0


def test_the_smallest_audit_that_does_not_fit_is_refused_with_what_it_needs() -> None:
    bounds = {"a": Bounds(4, 100, 8), "b": Bounds(4, 100, 8)}
    with pytest.raises(ExperimentError, match=r"needs about 80 s .* larger --budget"):
        allocate(30.0, bounds, linear({"a": (0.0, 10.0), "b": (0.0, 10.0)}))


def test_a_refusal_names_the_smallest_budget_that_fits() -> None:
    """The budget it names, after 70 s spent (load, calibration) and 8 s kept for the card, gives the runs enough."""
    bounds = {"a": Bounds(4, 100, 8), "b": Bounds(4, 100, 8)}
    seconds = linear({"a": (0.0, 10.0), "b": (0.0, 10.0)})

    def least(needed: float) -> float:
        return least_budget(70.0, 8.0, needed)

    with pytest.raises(ExperimentError, match=r"needs about 80 s .* give --budget 3m or more$"):
        allocate(30.0, bounds, seconds, least=least)
    # 180 s: (180 - 78) x 0.85 = 86.7 s for the runs, enough; 120 s would leave 35.7 s.
    counts, _ = allocate((least(80.0) - 78.0) * MARGIN, bounds, seconds, least=least)
    assert counts == {"a": 4, "b": 4}
    assert (least(80.0) - 60.0 - 78.0) * MARGIN < 80.0  # a minute less would not do


def test_an_optional_experiment_joins_only_where_the_others_stay_comfortable() -> None:
    bounds = {"a": Bounds(2, 100, 10), "opt": Bounds(2, 100, 2, optional=True)}
    seconds = linear({"a": (0.0, 1.0), "opt": (0.0, 1.0)})
    counts, left_out = allocate(15.0, bounds, seconds)  # with it, a would get 7 < 10
    assert counts == {"a": 15} and "opt" in left_out
    counts, left_out = allocate(40.0, bounds, seconds)
    assert counts == {"a": 20, "opt": 20} and left_out == {}
    counts, _ = allocate(41.5, bounds, seconds)  # the unused 1.5 s: one more unit, to the first in turn
    assert counts == {"a": 21, "opt": 20}


def test_an_estimate_is_the_line_through_its_two_probes() -> None:
    estimate = Estimate("x", (Probe(2, 300, 0.2), Probe(6, 700, 0.4)))
    assert estimate.tokens(2) == 300 and estimate.tokens(10) == 1100
    assert estimate.seconds(4, rate=0.01) == pytest.approx(500 * 0.01 + 0.3)


class Counting:
    """An evaluator that runs the engine and adds up what its chunks computed, as the planner's cost counts it."""

    def __init__(self, lm: ContinuousLM) -> None:
        self.engine = Engine(lm)
        self.tokens = 0

    def __call__(self, signals: list[Any]) -> Any:
        probs = self.engine.probs(signals)
        previous = None
        for chunk in self.engine.last_stats.chunks:
            self.tokens += FORWARD_OVERHEAD + chunk.rows * chunk.width
            if chunk.prefix_len and chunk.prefix_len != previous:
                self.tokens += chunk.prefix_len
            previous = chunk.prefix_len or previous
        return probs


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.experiment)
def test_a_dry_run_counts_the_tokens_the_run_computes(lm: ContinuousLM, study: Any) -> None:
    count = 2
    estimated, first = dry_run(lm, Engine(lm), study, "contllm", count, group_bytes=1 << 20)
    experiment, config, items = study_config(study, "contllm", count)
    chosen = select_items(experiment.items(config), items)
    evaluate = Counting(lm)
    compute_records(lm, experiment, config, chosen, context_for(lm, evaluate=evaluate, group_bytes=1 << 20))
    assert estimated.count == count and estimated.seconds > 0
    if study.experiment == "circuit":  # hooks and a backward outside the evaluator: the probe's seconds hold them
        assert estimated.tokens == evaluate.tokens == 0 and not first and study.probes is not None
    elif study.experiment == "sums":  # the dry run keeps every greedy answer going: an upper bound
        assert estimated.tokens >= evaluate.tokens > 0 and first
    else:
        assert estimated.tokens == evaluate.tokens > 0 and first


def test_a_plan_fits_its_budget_within_the_bounds_and_says_how_it_was_measured(lm: ContinuousLM) -> None:
    import time

    said: list[str] = []
    plan = make_plan(lm, "contllm", 120.0, time.perf_counter(), said.append)
    assert plan.calibration is not None and plan.calibration.seconds > 0 and plan.calibration.tokens > 0
    assert any("calibration: one forward" in line for line in said)
    assert plan.available == pytest.approx((120.0 - plan.spent - plan.reserved) * MARGIN, abs=1e-3)
    assert sum(s.seconds for s in plan.shares) <= plan.available + 1e-6
    names = [s.experiment for s in plan.shares]
    assert names == [s.experiment for s in STUDIES if s.experiment in names]
    assert set(names) | set(plan.left_out) == {s.experiment for s in STUDIES}
    for share in plan.shares:
        study = next(s for s in STUDIES if s.experiment == share.experiment)
        experiment, config, _ = study_config(study, "contllm", 1)
        size = study.maximum if study.per_source else len(experiment.items(config))
        assert study.bounds(size).minimum <= share.count <= study.bounds(size).maximum


def test_included_studies_are_planned_as_the_others(lm: ContinuousLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """make_plan hands the planner the optional studies as required ones when included (allocate's own tests show
    what that means: they run at their minimum at least, with no comfortable count asked of the others)."""
    import time

    from contllm.audits import run

    seen: list[dict[str, Bounds]] = []
    real = run.allocate

    def spy(available: float, bounds: dict[str, Bounds], seconds: Any, **kwargs: Any) -> Any:
        seen.append(dict(bounds))
        return real(available, bounds, seconds, **kwargs)

    monkeypatch.setattr(run, "allocate", spy)
    optional = [s.experiment for s in STUDIES if s.optional]
    assert optional == ["sums", "circuit"]
    make_plan(lm, "contllm", 60.0, time.perf_counter(), lambda line: None)
    forced = make_plan(lm, "contllm", 60.0, time.perf_counter(), lambda line: None, include=optional)
    plain, included = seen
    assert [n for n, b in plain.items() if b.optional] == optional
    assert not any(b.optional for b in included.values())
    assert {n: (b.minimum, b.maximum) for n, b in plain.items()} == {
        n: (b.minimum, b.maximum) for n, b in included.items()
    }
    assert forced.left_out == {} and {s.experiment for s in forced.shares} == {s.experiment for s in STUDIES}
