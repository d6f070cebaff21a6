"""explorer.html: the data it carries equals the records, it fetches nothing, every sweep shape gets one."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from contllm.experiments.sums import SumRecord, SumsResult
from contllm.experiments.sweeps import ExperimentResult, Sweep
from contllm.experiments.tracking import Track, TrackResult
from contllm.rundir.explorer import PAGE_PARTS, about, explorer_data, page
from contllm.rundir.outputs import WRITERS, save

pytestmark = pytest.mark.unit

DIGITS = [str(d) for d in range(10)]


def sweep_result(items: int = 2, samples: int = 5) -> ExperimentResult:
    rng = np.random.default_rng(0)
    records = []
    for i in range(items):
        probs = rng.dirichlet(np.ones(10), size=samples)
        meta = {
            "prompt": f'"apple apple apple" contains 3 words.\n"{"pear " * (i + 2)}" contains ',
            "tokens": 14,
            "edited": [9, 10],
            "edited_tokens": [" pear", " pear"],
            "word": "pear",
            "n": i + 2,
        }
        records.append(Sweep(f"count-{i + 1:03d}", np.linspace(0.2, 1.5, samples), DIGITS, probs, str(i + 2), meta))
    return ExperimentResult("counting", "tiny", {}, records, x_label="factor")


def embedded_data(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', html, re.S)
    assert match, "no data block"
    return json.loads(match.group(1).replace("<\\/", "</"))


def test_the_page_carries_the_records_and_fetches_nothing(tmp_path: Path) -> None:
    result = sweep_result()
    save(result, tmp_path, formats=["results", "explorer"])
    html = (tmp_path / "explorer.html").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    data = embedded_data(html)
    assert data["knob"] == "factor" and data["experiment"] == "counting"
    items = data["runs"][0]["items"]
    for item, record in zip(items, results["sweeps"]):
        assert item["id"] == record["item_id"] and item["x"] == record["x"] and item["probs"] == record["probs"]
        assert item["labels"] == record["labels"] and item["truth"] == record["truth"]
        assert item["edited"] == [9, 10] and item["scales"] is True
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(|fetch\(|XMLHttpRequest", html)
    assert "<script>" in html and "<style>" in html and "explorer" in WRITERS


def test_the_expected_count_n_times_c_the_truth_and_what_the_page_shows() -> None:
    from contllm.experiments.counting import EXPERIMENT

    result = sweep_result(2)
    data = explorer_data([("run", result)])
    assert data["about"].startswith(EXPERIMENT.explorer_text) and "token strip" in data["about"]
    for item, record in zip(data["runs"][0]["items"], result.records):
        digits = np.arange(10)
        np.testing.assert_allclose(item["expected"], record.probs @ digits / record.probs.sum(axis=1))
        np.testing.assert_allclose(item["proportional"], record.meta["n"] * record.x)
        assert item["truths"] == [record.truth] * len(record.x)
        assert item["expected_truths"] == [float(record.truth)] * len(record.x)
        assert item["expected_name"].startswith("E[k]") and item["prompt_end"] is None
    record = result.records[0]
    record.meta["event"] = 2  # one event of n scaled: the count that would follow time is n - 1 + c
    item = explorer_data([("run", result)])["runs"][0]["items"][0]
    np.testing.assert_allclose(item["proportional"], record.meta["n"] - 1 + record.x)
    assert about("unregistered") == PAGE_PARTS  # an experiment the registry does not know: the page's parts alone
    assert explorer_data([("run", ExperimentResult("unregistered", "tiny", {}, result.records))]) is None


def test_an_interpolation_shows_its_truth_at_the_ends_and_its_second_prompt_at_the_far_end() -> None:
    x = np.linspace(0.0, 1.0, 5)
    p1 = np.linspace(0.2, 0.7, 5)
    probs = np.stack([0.8 - p1, p1, np.full_like(x, 0.1), np.full_like(x, 0.1)], axis=1)
    meta = {
        "first": "AND",
        "second": "OR",
        "truth_first": 0,
        "truth_second": 1,
        "prompt": "What is 0 AND 1?",
        "prompt_tokens": 6,
        "edited": [3],
        "edited_tokens": [" AND"],
        "prompt_second": "What is 0 OR 1?",
        "prompt_tokens_second": 6,
        "edited_second": [3],
        "edited_tokens_second": [" OR"],
    }
    result = ExperimentResult(
        "boolean", "tiny", {}, [Sweep("AND-OR-01", x, ["0", "1", "false", "true"], probs, None, meta)], x_label="alpha"
    )
    item = explorer_data([("run", result)])["runs"][0]["items"][0]
    assert item["truths"] == ["0", None, None, None, "1"]
    assert item["expected_truths"] == [0.0, None, None, None, 1.0]
    assert item["expected_name"] == "P(1) / (P(0) + P(1))"
    np.testing.assert_allclose(item["expected"], p1 / (0.8 - p1 + p1))
    assert item["proportional"] is None and item["scales"] is False
    assert (item["prompt"], item["span"], item["tokens"]) == ("What is 0 AND 1?", "AND", 6)
    assert (item["prompt_end"], item["span_end"], item["tokens_end"], item["edited_end"]) == (
        "What is 0 OR 1?",
        "OR",
        6,
        [3],
    )
    yes_no = Sweep(
        "w", x, ["yes", "no"], np.stack([p1, 1 - p1], axis=1), None, {"truth_first": "yes", "truth_second": "no"}
    )
    item = explorer_data([("run", ExperimentResult("interpolation", "tiny", {}, [yes_no], x_label="alpha"))])
    item = item["runs"][0]["items"][0]
    assert item["expected_name"] == "P(yes) / (P(yes) + P(no))" and item["expected_truths"][::4] == [1.0, 0.0]


def test_a_prompt_holding_a_closing_tag_cannot_end_the_data_early() -> None:
    result = sweep_result(1)
    result.records[0].meta["prompt"] = "</script><script>alert(1)</script>"
    html = page(explorer_data([("run", result)]))
    assert html.count("</script>") == 2  # the data block's and the code's own
    assert embedded_data(html)["runs"][0]["items"][0]["prompt"] == "</script><script>alert(1)</script>"


def test_tracks_and_sums_become_items_too() -> None:
    x = np.array([0.5, 1.0, 2.0])
    track = Track(
        "t-1",
        "s",
        x,
        [5, 7],
        ["a", "b"],
        np.array([[0.6, 0.1], [0.5, 0.2], [0.1, 0.7]]),
        [5, 5, 7],
        ["a", "a", "b"],
        np.array([0.6, 0.5, 0.7]),
        1.0,
        None,
        None,
        np.array([0.1, 0.5]),
        {"prompt": "a b c", "tokens": 3, "edited": [0, 1, 2], "edited_tokens": ["a", " b", " c"]},
    )
    tracked = explorer_data([("run", TrackResult("scaling", "tiny", {}, [track]))])
    item = tracked["runs"][0]["items"][0]
    assert tracked["knob"] == "s" and item["labels"] == ["a", "b"] and item["probs"][2] == [0.1, 0.7] and item["scales"]
    track.meta = {"prompt": "The capital of France is", "span": "France", "tokens": 1}  # a tokens run: the span's size
    item = explorer_data([("run", TrackResult("tokens", "tiny", {}, [track]))])["runs"][0]["items"][0]
    assert item["tokens"] is None and item["span"] == "France"
    steps = [[[0.9] + [0.0] * 9, None, [0.0, 1.0] + [0.0] * 8]]
    record = SumRecord("sum-1", x, DIGITS, steps, ["4", "", "1"], 4, 2, 2, {"prompt": "2+2="})
    summed = explorer_data([("run", SumsResult("sums", "tiny", {}, [record]))])
    probs = summed["runs"][0]["items"][0]["probs"]
    assert probs[0][0] == 0.9 and probs[1] == [0.0] * 10 and probs[2][1] == 1.0


def test_a_report_page_holds_every_run_and_non_finite_values_become_gaps() -> None:
    first, second = sweep_result(2), sweep_result(1)
    second.records[0].probs[1, 3] = np.nan
    data = explorer_data([("smollm", first), ("gemma", second)])
    assert [run["name"] for run in data["runs"]] == ["smollm", "gemma"]
    assert data["runs"][1]["items"][0]["probs"][1][3] is None
    assert "NaN" not in page(data)


def test_results_without_a_read_out_get_no_page() -> None:
    class Depth:
        experiment, model, records = "depth", "tiny", []

    assert explorer_data([("run", Depth())]) is None


def test_explore_sweeps_once_and_the_slider_shows_each_factor() -> None:
    import contllm
    from contllm import ContinuousLM, SignalError
    from tests.unit.tiny import tiny_tokenizer, word_llama

    lm = ContinuousLM(word_llama(3), tiny_tokenizer())
    signal = lm.signal("the cat sat on a mat")
    spans = signal.find("cat")
    found = contllm.explore(lm, signal, spans, factors=[0.25, 1.0, 2.0], top=4)
    assert found.x == [0.25, 1.0, 2.0] and len(found.labels) == 4
    for k, factor in enumerate(found.x):
        expected = lm.probs(signal.scale(spans, factor))
        ids = [lm.tokenizer.convert_tokens_to_ids(label) for label in found.labels]
        assert found.probs[k] == pytest.approx([float(expected[i]) for i in ids], abs=1e-6)
    box = found.widget()
    slider, view = box.children
    slider.value = 2  # the third factor, as a user drags it
    shown = {html.unescape(label): p for label, p in re.findall(r'data-label="([^"]*)">([0-9.]+)<', view.value)}
    assert shown == {label: f"{p:.4f}" for label, p in zip(found.labels, found.probs[2])}
    with pytest.raises(SignalError, match="factors must be finite numbers >= 0"):
        contllm.explore(lm, signal, spans, factors=[-1.0])
    with pytest.raises(SignalError, match="explore takes a Signal"):
        contllm.explore(lm, "the cat", spans)


def test_a_page_of_the_default_counting_runs_shape_stays_under_2_mb() -> None:
    # 130 items x 10 duration factors x 10 digits, float32 probabilities and a few-shot prompt,
    # as `contllm run counting` writes them (docs/explorer.md has the size of a real run).
    result = sweep_result(130, 10)
    for record in result.records:
        record.probs = record.probs.astype(np.float32).astype(np.float64)
        record.meta["prompt"] = '"cat cat cat cat" contains 4 words.\n' * 16
        record.meta["tokens"] = 186
    assert len(page(explorer_data([("smollm2-135m", result)])).encode()) < 2_000_000
