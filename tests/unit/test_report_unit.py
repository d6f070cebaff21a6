"""``contllm report`` on fake run directories (numpy results, no model): bad input and the files written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.errors import RunDirectoryError
from contllm.experiments import save
from contllm.experiments.sweeps import ExperimentResult, Sweep
from contllm.rundir.report import REPORT_FILES, write_report
from tests.unit.test_cli import one_line_error

pytestmark = pytest.mark.unit

runner = CliRunner()


def counting_result(model: str, x: np.ndarray) -> ExperimentResult:
    """Digit curves peaked near n * c, as a model that counts time would give."""
    sweeps = []
    digits = np.arange(10)
    for k, n in enumerate((2, 3, 4)):
        logits = -((digits[None, :] - n * x[:, None]) ** 2)
        probs = 0.9 * np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        meta = {"word": "apple", "n": n, "category": "fruit"}
        sweeps.append(Sweep(f"count-{k:03d}", x, [str(d) for d in digits], probs, str(n), meta))
    return ExperimentResult("counting", model, {"samples": len(x)}, sweeps, x_label="factor")


def boolean_result(model: str) -> ExperimentResult:
    x = np.linspace(0.0, 1.0, 5)
    truth = {"AND": lambda a, b: a & b, "XOR": lambda a, b: a ^ b}
    sweeps = []
    for a, b in ((0, 0), (0, 1), (1, 0), (1, 1)):
        first, second = truth["AND"](a, b), truth["XOR"](a, b)
        p1 = (1 - x) * (0.2 + 0.6 * first) + x * (0.2 + 0.6 * second)
        probs = np.stack([0.9 - p1, p1, np.full_like(x, 0.05), np.full_like(x, 0.05)], axis=1)
        meta = {"first": "AND", "second": "XOR", "a": a, "b": b, "truth_first": first,
                "truth_second": second, "method": "linear"}
        sweeps.append(Sweep(f"AND-XOR-{a}{b}", x, ["0", "1", "false", "true"], probs, None, meta))
    return ExperimentResult("boolean", model, {"samples": 5}, sweeps, x_label="alpha")


def fake_run(directory: Path, result: ExperimentResult, *, status: str = "finished") -> Path:
    save(result, directory, figures=False)
    (directory / "config.json").write_text(json.dumps({"experiment": result.experiment, "model": result.model}))
    manifest = {"model": result.model, "dtype": "float32", "status": status}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


@pytest.fixture
def two_counting_runs(tmp_path: Path) -> list[Path]:
    return [
        fake_run(tmp_path / "a", counting_result("tiny-a", np.linspace(0.1, 1.0, 6))),
        fake_run(tmp_path / "b", counting_result("tiny-b", np.sort(np.append(np.linspace(0.2, 1.5, 8), 1.0)))),
    ]


def report(*args: str):
    return runner.invoke(app, ["report", *args])


def test_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = report(str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    one_line_error(result, "is not a run directory (no config.json, manifest.json, results.json)")
    assert "give directories written by 'contllm run'" in result.output
    assert not (tmp_path / "out").exists()


def test_missing_results_and_missing_directory(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    (two_counting_runs[1] / "results.json").unlink()
    result = report(*map(str, two_counting_runs), "--out", str(tmp_path / "out"))
    one_line_error(result, f"{two_counting_runs[1]} is not a run directory (no results.json)")
    one_line_error(report(str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")), "(it does not exist)")
    assert not (tmp_path / "out").exists()


def test_unfinished_run(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "half", counting_result("tiny-a", np.linspace(0.1, 1.0, 4)), status="running")
    result = report(str(run), "--out", str(tmp_path / "out"))
    one_line_error(result, f"{run} is an unfinished run (status 'running')")
    assert f"'contllm run counting --out {run} --resume'" in result.output
    assert not (tmp_path / "out").exists()


def test_malformed_results(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    (two_counting_runs[0] / "results.json").write_text('{"experiment": "counting"')
    one_line_error(report(*map(str, two_counting_runs), "--out", str(tmp_path / "out")), "cannot read results.json")
    (two_counting_runs[0] / "results.json").write_text('{"experiment": "counting", "model": "m", "config": {}, "sweeps": []}')
    one_line_error(report(*map(str, two_counting_runs), "--out", str(tmp_path / "out")), "results.json is malformed")


def test_different_experiments_are_refused(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    boolean = fake_run(tmp_path / "bool", boolean_result("tiny-a"))
    result = report(str(two_counting_runs[0]), str(boolean), "--out", str(tmp_path / "out"))
    one_line_error(
        result,
        f"runs of different experiments cannot be compared: {two_counting_runs[0]} (counting), {boolean} (boolean); "
        "give runs of one experiment",
    )
    assert not (tmp_path / "out").exists()


def test_same_run_twice_is_refused(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    run = str(two_counting_runs[0])
    one_line_error(report(run, run, "--out", str(tmp_path / "out")), "is given twice")


def test_occupied_out_needs_force_and_keeps_other_files(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    one_line_error(report(*map(str, two_counting_runs), "--out", str(out)), f"{out} already holds files; use --force")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    forced = report(*map(str, two_counting_runs), "--out", str(out), "--force")
    assert forced.exit_code == 0, forced.output
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == sorted([*REPORT_FILES, "notes.txt"])


def test_out_must_not_be_a_run(two_counting_runs: list[Path]) -> None:
    run = str(two_counting_runs[0])
    one_line_error(report(run, "--out", run, "--force"), "is one of the runs")


def test_counting_report_files(tmp_path: Path, two_counting_runs: list[Path]) -> None:
    out = tmp_path / "report"
    result = report(*map(str, two_counting_runs), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(Path(line).name for line in result.stdout.splitlines()) == sorted(REPORT_FILES)

    md = (out / "summary.md").read_text()
    assert "tiny-a" in md and "tiny-b" in md and "| run | model | experiment | items |" in md
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["model"] for r in rows] == ["tiny-a", "tiny-b"]
    assert [r["items"] for r in rows] == ["3", "3"]
    assert rows[1]["factor_max"] == "1.5" and rows[1]["samples"] == "9"
    for row in rows:
        assert 0.0 <= float(row["auc_observed_time_sensitivity"]) <= 1.0
        assert float(row["mean_spearman_implied_vs_factor"]) > 0.9
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "comparison.pdf").read_bytes()[:5] == b"%PDF-"


def test_range_without_factor_one_gives_na(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path / "a", counting_result("m", np.linspace(0.1, 1.0, 4))),
        fake_run(tmp_path / "b", counting_result("m", np.linspace(0.1, 0.5, 4))),
    ]
    paths = write_report(runs, tmp_path / "out")
    assert {p.name for p in paths} == set(REPORT_FILES)
    rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert rows[0]["accuracy_at_1"] != "" and rows[1]["accuracy_at_1"] == ""
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "n/a" in md
    # The same model twice: the legend tells the runs apart by directory.
    from contllm.rundir.report import load_runs

    assert [r.label for r in load_runs(runs)] == ["m (a)", "m (b)"]


def test_boolean_report(tmp_path: Path) -> None:
    runs = [fake_run(tmp_path / name, boolean_result(name)) for name in ("tiny-a", "tiny-b")]
    write_report(runs, tmp_path / "out")
    rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert [float(r["accuracy_at_alpha_0"]) for r in rows] == [1.0, 1.0]
    assert [float(r["accuracy_at_alpha_1"]) for r in rows] == [1.0, 1.0]
    assert (tmp_path / "out" / "comparison.png").stat().st_size > 10_000


def test_no_runs() -> None:
    with pytest.raises(RunDirectoryError, match="no run directories given"):
        write_report([], Path("unused"))


def test_runs_are_ordered_by_each_metrics_declared_direction(tmp_path: Path) -> None:
    from contllm import registry
    from contllm.rundir.report import load_runs, ranked

    x = np.linspace(0.1, 1.0, 4)
    off = counting_result("off-by-one", x)
    for s in off.sweeps:  # every count read one too high: accuracy at factor 1 falls to 0
        s.probs = np.roll(s.probs, 1, axis=1)
    runs = [fake_run(tmp_path / "off", off), fake_run(tmp_path / "good", counting_result("good", x))]
    write_report(runs, tmp_path / "out")
    rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert [r["model"] for r in rows] == ["good", "off-by-one"]  # accuracy_at_1: higher is better
    assert float(rows[0]["accuracy_at_1"]) > float(rows[1]["accuracy_at_1"])
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "- `accuracy_at_1` (higher is better):" in md and "- `accuracy_at_1`: good (" in md

    smooth, rough = boolean_result("smooth"), boolean_result("rough")
    for s in rough.sweeps:  # P(1) jumps back and forth along alpha
        s.probs[1::2, 1] = np.clip(s.probs[1::2, 1] + 0.3, 0, 1)
    pair = load_runs([fake_run(tmp_path / "rough", rough), fake_run(tmp_path / "smooth", smooth)])
    jump = next(m for m in registry.get("boolean").metrics if m.name == "mean_max_jump_p1")
    assert jump.direction == "lower"
    assert [r.model for r in ranked(pair, jump)] == ["smooth", "rough"]
    summary = json.loads((tmp_path / "smooth" / "summary.json").read_text())
    assert summary["metrics"]["mean_max_jump_p1"]["direction"] == "lower is better"


def test_a_number_the_experiment_describes_a_run_by_is_one_column(two_counting_runs: list[Path]) -> None:
    from contllm.rundir.report import load_runs, table

    for run in two_counting_runs:  # a summary that also carries the samples (as patching's carries its factor)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "samples": 9}))
    columns, rows = table(load_runs(two_counting_runs))
    assert columns.count("samples") == 1, columns
    assert len(set(columns)) == len(columns)
    assert all(len(row) == len(columns) for row in rows)


def test_the_truth_column_of_an_interpolation_holds_each_ends_answer(tmp_path: Path) -> None:
    """results.csv of a Boolean run: the first operator's truth value at alpha 0, the second's at alpha 1, none between."""
    run = fake_run(tmp_path / "bool", boolean_result("tiny"))
    with (run / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        a, b = int(row["item"][-2]), int(row["item"][-1])
        alpha = float(row["alpha"])
        expected = {0.0: str(a & b), 1.0: str(a ^ b)}.get(alpha, "")
        assert row["truth"] == expected, row
    assert {r["truth"] for r in rows if float(r["alpha"]) in (0.0, 1.0)} == {"0", "1"}
    # a duration sweep keeps its one truth on every row
    counting = fake_run(tmp_path / "count", counting_result("tiny", np.linspace(0.1, 1.0, 4)))
    with (counting / "results.csv").open() as f:
        assert {(r["item"], r["truth"]) for r in csv.DictReader(f)} == {
            ("count-000", "2"), ("count-001", "3"), ("count-002", "4")
        }


def test_runs_of_different_items_are_compared_on_the_shared_ones_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x = np.linspace(0.1, 1.0, 6)
    whole = counting_result("tiny-a", x)
    part = counting_result("tiny-b", x)
    part.records = [s for s in part.records if s.item_id != "count-001"]
    runs = [fake_run(tmp_path / "a", whole), fake_run(tmp_path / "b", part)]
    with caplog.at_level("WARNING", logger="contllm"):
        result = report(str(runs[0]), str(runs[1]), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "different items (tiny-a 3, tiny-b 2)" in warned[0] and "the 2 items" in warned[0]
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "**Note:** the runs hold different items" in md
    with (tmp_path / "out" / "summary.csv").open() as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    assert rows["tiny-a"]["items"] == rows["tiny-b"]["items"] == "2"
    # the same model on the same two items: the same numbers
    assert rows["tiny-a"]["mean_spearman_implied_vs_factor"] == rows["tiny-b"]["mean_spearman_implied_vs_factor"]
    # runs of the same items: no warning, no note
    caplog.clear()
    with caplog.at_level("WARNING", logger="contllm"):
        same = report(str(runs[0]), str(fake_run(tmp_path / "c", counting_result("tiny-c", x))), "--out",
                      str(tmp_path / "out2"))
    assert same.exit_code == 0 and not caplog.records
    assert "Note" not in (tmp_path / "out2" / "summary.md").read_text()


def test_runs_that_share_no_item_are_refused(tmp_path: Path) -> None:
    x = np.linspace(0.1, 1.0, 4)
    other = counting_result("tiny-b", x)
    for s in other.sweeps:
        s.item_id = s.item_id.replace("count", "other")
    runs = [fake_run(tmp_path / "a", counting_result("tiny-a", x)), fake_run(tmp_path / "b", other)]
    one_line_error(report(str(runs[0]), str(runs[1]), "--out", str(tmp_path / "out")), "the runs share no item")
    assert not (tmp_path / "out").exists()
