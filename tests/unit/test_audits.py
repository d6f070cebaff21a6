"""contllm.audit on a tiny random model: the card's numbers, its bootstrap intervals, resume, the pages."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

import contllm
from contllm import ContinuousLM, ExperimentError, RunDirectoryError, registry
from contllm.audits import Card, bootstrap, compare, load_card
from contllm.audits.studies import STUDIES
from contllm.experiments.base import Experiment, Metric
from contllm.experiments.records import Record, Records
from contllm.rundir.report import load_run
from tests.unit.tiny import tiny_lm, word_level_tokenizer

pytestmark = pytest.mark.unit

#: Digits, the read-out words and some words of every experiment's prompts; everything else is <unk>.
WORDS = (
    [str(d) for d in range(10)]
    + """false true yes no Yes No AND OR XOR NAND NOR XNOR IMPLIES What is the truth
value of ? Answer : Question contains words . " cat dog sun box pen apples bananas How many has and more the
Are Do Can There are steps actions took""".split()
)

#: Items per experiment (linearity: paths per source), sums included.
COUNTS = {"counting": 3, "events": 2, "boolean": 3, "interpolation": 3, "linearity": 1, "sums": 2, "circuit": 2}
RESAMPLES = 200
#: Fields that say when or how long, not what was found.
TIMES = {"created", "seconds"}


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = ["<unk>", *dict.fromkeys(WORDS)]
    assert len(vocab) <= 97
    return word_level_tokenizer(vocab, digits=True)


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return tiny_lm("llama", word_tokenizer())


@pytest.fixture(scope="module")
def audited(lm: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> tuple[Card, Path]:
    out = tmp_path_factory.mktemp("audit") / "tiny"
    card = contllm.audit(lm, counts=COUNTS, out=out, model="tiny-llama", device="cpu", resamples=RESAMPLES)
    return card, out


def without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def test_audit_is_exported_lazily_from_the_package() -> None:
    assert "audit" in contllm.__all__ and contllm.audit.__module__ == "contllm.audits.run"


def test_every_number_of_the_card_is_its_runs_summary_with_the_declared_meaning(audited: tuple[Card, Path]) -> None:
    card, out = audited
    assert [f.experiment for f in card.findings] == [s.experiment for s in STUDIES]
    assert json.loads((out / "card.json").read_text()) == json.loads(json.dumps(card.to_dict()))
    for study, finding in zip(STUDIES, card.findings):
        summary = json.loads((out / finding.run / "summary.json").read_text())
        records = load_run(out / finding.run).result.records
        paths = 3 * COUNTS["linearity"] if study.per_source else COUNTS[study.experiment]
        assert finding.items == len(records) == summary["items"] == paths
        assert [n.metric for n in finding.numbers] == list(study.metrics)
        assert [n.role for n in finding.numbers] == ["headline"] + ["paper"] * len(study.paper)
        declared = {m.name: m for m in registry.get(study.experiment).metrics}
        for n in finding.numbers:
            value = summary.get(n.metric)
            assert n.value == (None if value is None or np.isnan(value) else value), (study.experiment, n.metric)
            assert (n.direction, n.meaning) == (declared[n.metric].direction, declared[n.metric].meaning)
        assert finding.figure == f"{finding.run}/figures/summary.png" and (out / finding.figure).is_file()
        assert (finding.explorer is not None) == (out / finding.run / "explorer.html").is_file()
        assert finding.sentence.endswith(".")
    assert card.plan["budget"] is None and [s["count"] for s in card.plan["shares"]] == list(COUNTS.values())
    assert card.bootstrap == {"resamples": RESAMPLES, "level": 0.95, "seed": 0, "over": "items"}


def direct_bootstrap(experiment: Any, result: Any, metric: str, resamples: int, seed: int) -> tuple[Any, Any]:
    """The percentile bootstrap written out: resample the records, take the experiment's summary of each resample."""
    records = list(result.records)
    rows = np.random.default_rng(seed).integers(0, len(records), size=(resamples, len(records)))
    values = []
    for row in rows:
        value = experiment.summary(dataclasses.replace(result, records=[records[i] for i in row])).get(metric)
        values.append(np.nan if value is None else float(value))
    finite = np.array(values)[np.isfinite(values)]
    if not finite.size:
        return None, None
    low, high = np.percentile(finite, [2.5, 97.5])
    return float(low), float(high)


def test_the_intervals_are_a_bootstrap_over_items_computed_directly(audited: tuple[Card, Path]) -> None:
    card, out = audited
    checked = 0
    for finding in card.findings:
        run = load_run(out / finding.run)
        experiment = registry.get(finding.experiment)
        for n in finding.numbers:
            low, high = direct_bootstrap(experiment, run.result, n.metric, RESAMPLES, seed=0)
            if low is None:
                assert n.low is None and n.high is None
                continue
            assert n.low == pytest.approx(low, rel=1e-9, abs=1e-12), (finding.experiment, n.metric)
            assert n.high == pytest.approx(high, rel=1e-9, abs=1e-12), (finding.experiment, n.metric)
            checked += 1
    assert checked >= 6


@dataclasses.dataclass
class Point(Record, what="point"):
    item_id: str
    value: float


@dataclasses.dataclass
class Points(Records[Point], record=Point):
    pass


class Medians(Experiment[Point, Points]):
    """A summary that is no mean over items (a median), and one that is (a mean), for the bootstrap's two paths."""

    name = "medians"
    result_type = Points
    metrics = Metric.table(
        """
        median  higher  the median of the values
        mean    higher  the mean of the values
        """
    )

    def summary(self, result: Points) -> dict[str, Any]:
        values = [p.value for p in result.records]
        return {"median": float(np.median(values)), "mean": float(np.mean(values))}


def test_a_summary_that_is_no_mean_over_items_is_bootstrapped_resample_by_resample() -> None:
    values = [0.1, 0.9, 0.4, 0.35, 2.0, 0.0, 0.7]
    result = Points("medians", "m", {}, [Point(f"p{k}", v) for k, v in enumerate(values)])
    found = bootstrap(Medians(), result, ["median", "mean"], resamples=300, seed=3)
    rows = np.random.default_rng(3).integers(0, len(values), size=(300, len(values)))
    for name, reduce in (("median", np.median), ("mean", np.mean)):
        drawn = [reduce([values[i] for i in row]) for row in rows]
        assert found[name] == pytest.approx(tuple(np.percentile(drawn, [2.5, 97.5])), rel=1e-12)
    assert found["median"] != found["mean"]


def test_an_interrupted_audit_resumed_ends_with_the_same_card(
    lm: ContinuousLM, audited: tuple[Card, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card, out = audited
    boolean = registry.get("boolean")
    original = type(boolean).run

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        for k, pair in enumerate(original(self, *args, **kwargs)):
            if k == 1:
                raise KeyboardInterrupt
            yield pair

    monkeypatch.setattr(type(boolean), "run", interrupted)
    again = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt):
        contllm.audit(lm, counts=COUNTS, out=again, model="tiny-llama", device="cpu", resamples=RESAMPLES)
    assert len(list((again / "boolean" / "items").glob("*.json"))) == 1 and not (again / "card.json").exists()
    assert not (again / "interpolation").exists()
    monkeypatch.undo()
    with pytest.raises(RunDirectoryError, match="--resume"):
        contllm.audit(lm, counts=COUNTS, out=again, model="tiny-llama", device="cpu")
    kept = json.loads((again / "audit.json").read_text())["seconds"]  # written as runs finished, and at the stop
    assert set(kept["runs"]) == {"counting", "events"} and kept["spent"] >= sum(kept["runs"].values())
    resumed = contllm.audit(lm, out=again, resume=True, model="tiny-llama", device="cpu", resamples=RESAMPLES)
    assert resumed.seconds["resumed"] and resumed.seconds["runs"]["counting"] == kept["runs"]["counting"]  # kept
    assert resumed.seconds["total"] >= kept["spent"] + resumed.seconds["runs"]["boolean"]
    first = without_times(json.loads((out / "card.json").read_text()))
    assert without_times(json.loads((again / "card.json").read_text())) == first


def test_a_resumed_audit_refuses_other_settings_before_anything_loads(audited: tuple[Card, Path]) -> None:
    _, out = audited
    with pytest.raises(RunDirectoryError, match="protocol"):
        contllm.audit("never-loaded", out=out, resume=True, model="tiny-llama", protocol="paper")
    with pytest.raises(RunDirectoryError, match="model"):
        contllm.audit("never-loaded", out=out, resume=True)
    with pytest.raises(RunDirectoryError, match="budget"):
        contllm.audit("never-loaded", out=out, resume=True, model="tiny-llama", budget="5m")
    with pytest.raises(ExperimentError, match="budget or counts"):
        contllm.audit("never-loaded", budget="5m", counts=COUNTS, out=out / "x")
    with pytest.raises(ExperimentError, match="missing: events"):
        contllm.audit("never-loaded", counts={"counting": 2}, out=out / "x")
    with pytest.raises(ExperimentError, match="no experiment 'depth'"):
        contllm.audit("never-loaded", counts={**COUNTS, "depth": 1}, out=out / "x")
    with pytest.raises(ExperimentError, match="counting always runs"):
        contllm.audit("never-loaded", budget="5m", include="sums,counting", out=out / "x")
    with pytest.raises(ExperimentError, match="no experiment 'depth'"):
        contllm.audit("never-loaded", budget="5m", include=["depth"], out=out / "x")
    with pytest.raises(ExperimentError, match="include applies to a budget"):
        contllm.audit("never-loaded", counts=COUNTS, include="sums", out=out / "x")
    with pytest.raises(RunDirectoryError, match="include"):
        contllm.audit("never-loaded", out=out, resume=True, model="tiny-llama", include="circuit")
    assert not (out / "x").exists()


def test_to_pandas_has_a_row_per_number(audited: tuple[Card, Path]) -> None:
    card, _ = audited
    table = card.to_pandas()
    assert len(table) == sum(len(f.numbers) for f in card.findings)
    head = table[table.role == "headline"].set_index("experiment")
    assert head.loc["counting", "metric"] == "pure_peak_rate"
    assert head.loc["counting", "value"] == card.finding("counting").headline.value
    assert set(table.columns) >= {"model", "experiment", "metric", "value", "low", "high", "direction", "items"}


def test_the_pages_escape_their_data_and_link_every_run(audited: tuple[Card, Path], tmp_path: Path) -> None:
    card, out = audited
    page = (out / "card.html").read_text()
    assert "<script src" not in page and "http://" not in page and "https://" not in page
    for finding in card.findings:
        assert f'href="./{finding.run}/"' in page or f'href="{finding.run}/"' in page
        if finding.explorer:
            assert f'href="{finding.explorer}"' in page
    assert page.count("data:image/png;base64,") == len(card.findings)
    data = page.split('id="card-data">')[1].split("</script>")[0]
    assert json.loads(data) == json.loads(json.dumps(card.to_dict()))
    # A hostile model name stays text: escaped in the markup and in the data.
    hostile = dataclasses.replace(load_card(out), model='</script><script>alert(1)</script>"')
    other = tmp_path / "other"
    other.mkdir()
    (other / "card.json").write_text(json.dumps(hostile.to_dict()))
    written = compare([out, other / "card.json"], tmp_path / "compared")
    html = written.read_text()
    assert "<script>alert(1)" not in html and html.count("<script") == 1
    assert "tiny-llama" in html and "&lt;/script&gt;" in html
    with pytest.raises(RunDirectoryError, match="twice"):
        compare([out, out / "card.json"], tmp_path / "c2")
    with pytest.raises(RunDirectoryError, match="exists"):
        compare([out, other], tmp_path / "compared")


def test_the_papers_protocol_reaches_every_experiment_that_takes_it(lm: ContinuousLM, tmp_path: Path) -> None:
    counts = {"counting": 2, "events": 2, "boolean": 2, "interpolation": 2, "linearity": 1}
    card = contllm.audit(lm, counts=counts, out=tmp_path / "paper", protocol="paper", model="tiny", resamples=50)
    assert card.protocol == "paper"
    for finding in card.findings:
        options = json.loads((tmp_path / "paper" / finding.run / "config.json").read_text())["options"]
        assert options.get("protocol") == ("paper" if finding.experiment != "linearity" else None)
    samples = json.loads((tmp_path / "paper" / "counting" / "config.json").read_text())["options"]["samples"]
    assert samples == 100  # the paper's sweep


def test_a_card_states_the_dtype_auto_picked_and_a_resumed_audit_finds_it(
    audited: tuple[Card, Path], tmp_path: Path
) -> None:
    from contllm.audits.page import card_page
    from contllm.audits.run import recorded_choice
    from contllm.models.autodtype import decide
    from contllm.rundir.runs import MANIFEST

    card, out = audited
    assert card.dtype_choice is None and recorded_choice(out) is None  # a dtype given by name
    choice = decide(0.5, 0.3, 0.004, "cpu <b>x</b>").to_dict()
    page = card_page(dataclasses.replace(card, dtype_choice=choice), out)
    assert "<b>dtype</b>: bfloat16 (--dtype auto): " in page and "cpu &lt;b&gt;x&lt;/b&gt;" in page
    # The runs' manifests record the choice; a resumed audit reads it there rather than timing again.
    copy = tmp_path / "audit"
    for s in STUDIES:
        if (out / s.experiment / MANIFEST).is_file():
            (copy / s.experiment).mkdir(parents=True)
            manifest = json.loads((out / s.experiment / MANIFEST).read_text())
            (copy / s.experiment / MANIFEST).write_text(json.dumps({**manifest, "dtype_choice": choice}))
    assert recorded_choice(copy) == choice
