"""Records as data: one generic to_dict/from_dict (contllm.experiments.base.Record) for every experiment's records.

The JSON a record writes is what the hand-written conversions of each record class wrote
before (same keys in the same order, same value shapes), so that run directories written
before still resume and load; a malformed file is one ExperimentError "malformed <what>".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from contllm.errors import ExperimentError
from contllm.experiments.base import Metric, option_table
from contllm.experiments.records import IntArray, ItemRecords, Record, RecordList, Records
from contllm.rundir.files import jsonable

pytestmark = pytest.mark.unit


@dataclass
class Inner(Record, what="inner record"):
    count: int
    values: np.ndarray


@dataclass
class Example(Record, what="example record"):
    item_id: str
    x: np.ndarray
    top: IntArray
    tv: np.ndarray | None
    offsets: list[tuple[int, int]]
    inner: Inner
    score: float
    flag: bool
    truth: str | None = None
    steps: list[list[float] | None] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def check_loaded(self) -> None:
        if len(self.top) != len(self.x):
            raise ExperimentError(f"malformed example record {self.item_id}: top and x differ in length")


@dataclass
class ExampleResult(Records[Example], record=Example):
    examples = RecordList()
    example = Records.record
    x_label: str = "factor"


def example(**changes: Any) -> Example:
    values: dict[str, Any] = {
        "item_id": "a",
        "x": np.array([0.5, 1.0]),
        "top": np.array([3, 4]),
        "tv": None,
        "offsets": [(0, 1), (1, 3)],
        "inner": Inner(2, np.array([[1.0, math.nan]])),
        "score": 0.25,
        "flag": True,
        "truth": "3",
        "steps": [[0.5, 0.5], None],
        "meta": {"word": "apple", "n": np.int64(3)},
    }
    return Example(**{**values, **changes})


def through_json(data: dict[str, Any]) -> Any:
    """``data`` as a run directory holds it (non-finite numbers as null)."""
    return json.loads(json.dumps(jsonable(data)))


def test_to_dict_writes_plain_json_data_field_by_field() -> None:
    data = example().to_dict()
    assert list(data) == ["item_id", "x", "top", "tv", "offsets", "inner", "score", "flag", "truth", "steps", "meta"]
    assert data["x"] == [0.5, 1.0] and data["top"] == [3, 4] and all(isinstance(v, int) for v in data["top"])
    assert data["tv"] is None and data["offsets"] == [[0, 1], [1, 3]]
    assert data["inner"]["count"] == 2 and data["inner"]["values"][0][0] == 1.0 and math.isnan(data["inner"]["values"][0][1])
    assert data["meta"] == {"word": "apple", "n": 3} and type(data["meta"]["n"]) is int
    assert json.dumps(jsonable(data))  # JSON-able as it is


def test_a_record_round_trips_through_json() -> None:
    record = example(tv=np.array([0.0, 0.125]))
    back = Example.from_dict(through_json(record.to_dict()))
    assert back.x.dtype == np.float64 and back.top.dtype == np.int64 and back.tv is not None
    assert np.array_equal(back.top, record.top) and np.allclose(back.tv, [0.0, 0.125])
    assert back.offsets == [(0, 1), (1, 3)] and back.inner.count == 2 and math.isnan(back.inner.values[0, 1])
    assert back.steps == [[0.5, 0.5], None] and back.truth == "3" and back.flag is True
    assert through_json(back.to_dict()) == through_json(record.to_dict())


def test_optional_fields_defaults_and_null() -> None:
    data = example().to_dict()
    for key in ("truth", "steps", "meta"):
        del data[key]
    back = Example.from_dict(data)
    assert back.truth is None and back.steps == [] and back.meta == {}
    back = Example.from_dict({**example().to_dict(), "meta": None, "score": None, "tv": None})
    assert back.meta == {} and math.isnan(back.score) and back.tv is None  # null: the default, NaN, None


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"item_id": None}, "item_id must be a str"),
        ({"x": "0.5,1.0"}, "x must be a list of numbers"),
        ({"x": [[0.5], [1.0, 2.0]]}, "malformed example record"),
        ({"top": [3.5, None]}, "malformed example record"),
        ({"offsets": [[0, 1, 2]]}, r"offsets\[0\] must hold 2 values"),
        ({"flag": "yes"}, "flag must be a bool"),
        ({"meta": [1, 2]}, "meta must be an object"),
        ({"inner": {"count": 1}}, "malformed inner record: missing 'values'"),
        ({"top": [3]}, "malformed example record a: top and x differ"),
    ],
)
def test_a_malformed_record_is_one_error_naming_what(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ExperimentError, match=needle):
        Example.from_dict({**example().to_dict(), **change})


def test_a_missing_field_or_a_non_object_is_malformed() -> None:
    data = example().to_dict()
    del data["x"]
    with pytest.raises(ExperimentError, match="malformed example record: missing 'x'"):
        Example.from_dict(data)
    with pytest.raises(ExperimentError, match="malformed example record: expected a JSON object, got list"):
        Example.from_dict([1, 2])


def test_records_write_extra_fields_before_the_records_under_their_name() -> None:
    result = ExampleResult("toy", "tiny", {"low": 0.1}, [example(), example(item_id="b")], x_label="alpha")
    data = result.to_dict()
    assert list(data) == ["experiment", "model", "config", "x_label", "examples"] and ExampleResult.key == "examples"
    back = ExampleResult.from_dict(through_json(data))
    assert back.x_label == "alpha" and [r.item_id for r in back.examples] == ["a", "b"]
    assert back.example("b") is back.records[1] and back.record("a").item_id == "a"
    with pytest.raises(ExperimentError, match="no item 'c'"):
        back.example("c")
    without = {k: v for k, v in data.items() if k != "examples"}
    with pytest.raises(ExperimentError, match="malformed results file: missing 'examples'"):
        ExampleResult.from_dict(without)
    with pytest.raises(ExperimentError, match="malformed example record"):
        ExampleResult.from_dict({**data, "examples": [{"item_id": "a"}]})


def test_item_records_are_called_items() -> None:
    class Items(ItemRecords[Example], record=Example):
        pass

    result = Items("toy", "tiny", {}, [example()])
    assert Items.key == "items" and result.items == result.records and result.item("a").item_id == "a"
    assert list(result.to_dict()) == ["experiment", "model", "config", "items"]


# ---------------------------------------------------------------------------- the experiments' records


def expected(record: Record, data: dict[str, Any]) -> None:
    """``record`` writes ``data`` (keys in order) and reads it back to the same data."""
    assert record.to_dict() == data and list(record.to_dict()) == list(data)
    assert type(record).from_dict(through_json(data)).to_dict() == data


def test_the_experiments_records_write_what_they_wrote_before() -> None:
    from contllm.experiments.attribution import ItemAttribution
    from contllm.experiments.equivalence import Grid
    from contllm.experiments.lens import LensRecord
    from contllm.experiments.linearity import ReadoutPath
    from contllm.experiments.sums import SumRecord
    from contllm.experiments.sweeps import Sweep
    from contllm.experiments.tracking import Track

    probs = np.array([[0.25, 0.75], [0.5, 0.5]])
    expected(
        Sweep("i", np.array([0.5, 1.0]), ["0", "1"], probs, "1", {"n": 2}),
        {"item_id": "i", "x": [0.5, 1.0], "labels": ["0", "1"], "probs": [[0.25, 0.75], [0.5, 0.5]], "truth": "1",
         "meta": {"n": 2}},
    )
    expected(
        LensRecord("i", np.array([1.0]), np.array([[2.5]]), np.array([[3]]), 0.0, 2),
        {"item_id": "i", "factors": [1.0], "counts": [[2.5]], "top": [[3]], "lens_max_dp": 0.0, "truth": 2, "meta": {}},
    )
    expected(
        Grid("w", np.arange(1, 3), np.array([1.0]), ["1"], np.ones((2, 1, 1))),
        {"item_id": "w", "copies": [1, 2], "durations": [1.0], "labels": ["1"], "probs": [[[1.0]], [[1.0]]], "meta": {}},
    )
    expected(
        ReadoutPath("i", "boolean", np.array([0.0, 1.0]), ["a"], np.ones((2, 1)), np.zeros((2, 1))),
        {"item_id": "i", "source": "boolean", "alphas": [0.0, 1.0], "labels": ["a"], "real": [[1.0], [1.0]],
         "baseline": [[0.0], [0.0]], "meta": {}},
    )
    expected(
        SumRecord("s", np.array([1.0]), ["0", "1"], [[[0.5, 0.5]], [None]], ["10"], 10, 7, 3),
        {"item_id": "s", "x": [1.0], "labels": ["0", "1"], "steps": [[[0.5, 0.5]], [None]], "answers": ["10"],
         "truth": 10, "scaled": 7, "other": 3, "meta": {}},
    )
    expected(
        ItemAttribution("i", "count", "ab", [(0, 1), (1, 2)], [1], np.array([0.5]), np.array([0.25]),
                        np.array([0.125]), [1], 2.0, 1.0, 1.5, 32, 0.0),
        {"item_id": "i", "readout": "count", "text": "ab", "offsets": [[0, 1], [1, 2]], "tokens": [1],
         "attribution": [0.5], "occlusion": [0.25], "shrink": [0.125], "span": [1], "full": 2.0, "baseline": 1.0,
         "start": 1.5, "steps": 32, "floor": 0.0, "truth": None, "meta": {}},
    )
    track = Track("i", "s", np.array([1.0]), [], [], np.zeros((1, 0)), [7], ["x"], np.array([0.5]), None, None, None,
                  np.zeros(0))
    expected(
        track,
        {"item_id": "i", "knob": "s", "x": [1.0], "token_ids": [], "labels": [], "probs": [[]], "top_ids": [7],
         "top_labels": ["x"], "top_probs": [0.5], "reference": None, "tv": None, "max_dp": None, "step_tv": [],
         "meta": {}},
    )
    assert Track.from_dict(track.to_dict()).probs.shape == (1, 0)  # no tracked token: still one row per value


def test_depth_and_pde_results_keep_their_keys() -> None:
    from contllm.depth.result import DepthResult
    from contllm.pde.result import PDEResult

    depth = DepthResult(experiment="depth", model="m", config={}, records=[], n_layers=2, layers=[0, 1])
    assert list(depth.to_dict()) == ["experiment", "model", "config", "n_layers", "layers", "token_strings", "records"]
    pde = PDEResult(experiment="pde", model="m", config={}, records=[], n_layers=1, text_tokens=3, prompts=["p"])
    assert list(pde.to_dict()) == ["experiment", "model", "config", "n_layers", "text_tokens", "prompts", "records"]
    with pytest.raises(ExperimentError, match="malformed pde result: it is a result of the 'depth' experiment"):
        PDEResult.from_dict({**pde.to_dict(), "experiment": "depth"})


# ---------------------------------------------------------------------------- declaration tables


def test_metric_and_option_tables() -> None:
    metrics = Metric.table(
        """
        accuracy  higher  share of items answered right
        mean_tv   lower   total variation, mean over items
        """
    )
    assert metrics == (Metric("accuracy", "higher", "share of items answered right"),
                       Metric("mean_tv", "lower", "total variation, mean over items"))
    options = option_table(
        """
        first  int                     Items: the first N; 0 for all. [default: 2]
        chat   bool  --chat/--no-chat  Wrap prompts in the model's chat template.
        """
    )
    assert [(o.name, o.kind, o.flag, o.help) for o in options] == [
        ("first", "int", None, "Items: the first N; 0 for all. [default: 2]"),
        ("chat", "bool", "--chat/--no-chat", "Wrap prompts in the model's chat template."),
    ]
    with pytest.raises(ExperimentError, match="direction must be 'higher' or 'lower'"):
        Metric.table("accuracy  better  share of items")
    with pytest.raises(ExperimentError, match="kind must be one of"):
        option_table("first  number  Items.")
    with pytest.raises(ExperimentError, match="needs a name, a kind and a help"):
        option_table("first  int")
