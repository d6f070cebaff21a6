"""Files read back, mutated at random: a card and a run directory are read or refused in one line, never a traceback.

The toolkit reads back what it wrote: a card (``contllm audit --compare``), a run's
config.json, manifest.json and results.json (``contllm report``, ``contllm figures``,
:func:`contllm.load_run`). Each starts here from a valid file, made as the toolkit makes it
without a model (the card's classes and ``to_dict``, a run's outputs through
:func:`contllm.experiments.save`), and Hypothesis changes it: a value replaced by another
JSON type, a number spelled as a string, NaN or infinity, a list, null, a key deleted or
added, a value nested one level deeper. Every command must then exit 0 or 2 (one line on
stderr, no traceback) and every function return or raise the toolkit's own error; a
refused command creates nothing (its --out does not exist, the run directory is as it
was). The explicit regressions are the three cards of issue 48, each run through a real
``python -m contllm`` process.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from contllm import __version__
from contllm.audits import reference
from contllm.audits.budget import Calibration, Plan, Share
from contllm.audits.card import Card, Finding, Number, load_card
from contllm.cli.commands import app
from contllm.errors import ContllmError, ExperimentError, RunDirectoryError
from contllm.experiments import save
from contllm.rundir import schemas
from contllm.rundir.files import atomic_write_json, parse_json, read_json
from contllm.rundir.report import load_run
from contllm.rundir.runs import record_name
from tests.unit.test_report_unit import counting_result

pytestmark = pytest.mark.unit

runner = CliRunner()


def examples(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# ---------------------------------------------------------------------------- valid files, as the toolkit writes them


def valid_card() -> Card:
    """A card as an audit builds it: a plan with its calibration, two findings (one number undefined), references."""
    plan = Plan(
        600.0,
        42.5,
        8.0,
        480.0,
        [Share("counting", 3, 100.0), Share("boolean", 3, 50.25)],
        {"sums": "did not fit in the budget"},
        Calibration(16, 2048, 1.5, 0.25),
    )
    refs = reference.load()
    counting = [
        Number(
            "pure_peak_rate",
            "headline",
            0.25,
            0.083,
            0.5,
            "higher",
            "counts that peak",
            reference.values(refs, "contllm", "counting", "pure_peak_rate"),
        ),
        Number("pure_improvement_over_chance", "paper", 0.66, 0.33, 1.0, "higher", "over chance", {}),
    ]
    boolean = [Number("accuracy", "headline", None, None, None, "higher", "the truth value is most probable", {})]
    findings = [
        Finding(
            "counting",
            "counting",
            3,
            "No sign of counting.",
            counting,
            "counting/figures/summary.png",
            "counting/explorer.html",
            2.77,
        ),
        Finding("boolean", "boolean", 3, "Undefined on three items.", boolean, None, None, None),
    ]
    return Card(
        model="tiny-llama",
        protocol="contllm",
        plan=plan.to_dict(),
        findings=findings,
        bootstrap={"resamples": 50, "level": 0.95, "seed": 0, "over": "items"},
        reference=reference.about(refs),
        versions={"contllm": __version__},
        seconds={"runs": {"counting": 2.77, "boolean": None}, "total": 11.5, "resumed": False},
        created="2026-11-28T03:52:16+00:00",
    )


def write_card(directory: Path, card: Card) -> Path:
    atomic_write_json(directory / "card.json", card.to_dict())  # as contllm.audit writes it
    return directory / "card.json"


def write_run(directory: Path) -> Path:
    """A finished counting run: its outputs through save (as the runner writes them), records, config and manifest."""
    result = counting_result("tiny-a", np.linspace(0.1, 1.0, 6))
    save(result, directory, figures=False)
    from contllm import registry

    experiment = registry.get("counting")
    for record in result.records:
        atomic_write_json(
            directory / "items" / record_name(record.item_id),
            {"id": record.item_id, "record": experiment.encode(record)},
        )
    options = {
        "data": None,
        "data_sha256": None,
        "template": None,
        "low": 0.1,
        "high": 1.0,
        "samples": 6,
        "chat": False,
        "protocol": "contllm",
        "selection": "contllm",
    }
    atomic_write_json(
        directory / "config.json",
        {
            "experiment": "counting",
            "model": "tiny-a",
            "dtype": None,
            "items": "3",
            "seed": 0,
            "max_batch_tokens": None,
            "group_bytes": 402653184,
            "options": options,
        },
    )
    manifest = {
        "model": "tiny-a",
        "model_type": "llama",
        "family": "llama",
        "weights_sha256": None,
        "source": None,
        "device": "cpu",
        "dtype": "float32",
        "attn_implementation": "eager",
        "versions": {"python": "3.11.7", "contllm": __version__, "gguf": None},
        "commit": None,
        "cpu": {"capability": "AVX2", "amx": False, "cores": 2, "name": "AMD EPYC"},
        "command": "contllm run counting",
        "started": "2026-11-28T03:52:04+00:00",
        "status": "finished",
        "outputs": ["results.csv", "results.json", "summary.json"],
        "finished": "2026-11-28T03:52:07+00:00",
        "items": 3,
        "seconds": {"load": None, "evaluation": 0.54, "outputs": 2.213},
    }
    atomic_write_json(directory / "manifest.json", manifest)
    return directory


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("read-back")
    (root / "good").mkdir()
    return {"card": write_card(root / "good", valid_card()), "run": write_run(root / "run")}


# ---------------------------------------------------------------------------- mutations

#: Values put in place of another: every JSON type, numbers as strings, paths out of a directory, odd numbers.
REPLACEMENT = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["0.5", "3", "nan", "", "/etc/passwd", "../../outside", "a\x00b", "higher", "finished", 10**400]),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from(["value", "x", ""]), st.integers(0, 9), max_size=2),
)
KINDS = ("replace", "nan", "string", "list", "null", "delete", "nest", "add key")


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``value`` (the first two items of each list only, so that long arrays do not crowd out the rest)."""
    yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths(inner, (*at, key))
    elif isinstance(value, list):
        for k, inner in enumerate(value[:2]):
            yield from paths(inner, (*at, k))


def mutate(data: st.DataObject, value: Any) -> Any:
    """``value`` changed in one to three places, as Hypothesis draws them."""
    value = copy.deepcopy(value)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        where = data.draw(st.sampled_from(list(paths(value))), label="where")
        kind = data.draw(st.sampled_from(KINDS), label="kind")
        if kind == "add key" and not (where and isinstance(get(value, where), dict)):
            kind = "replace"
        old = get(value, where)
        if kind == "delete" and where:
            parent = get(value, where[:-1])
            del parent[where[-1]]
            continue
        value = put(value, where, changed(data, kind, old))
    return value


def changed(data: st.DataObject, kind: str, old: Any) -> Any:
    """What a mutation of ``kind`` puts in place of ``old``."""
    if kind == "replace":
        return data.draw(REPLACEMENT, label="new")
    if kind == "nan":
        return data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="non-finite")
    if kind == "string":
        return old if isinstance(old, str) else json.dumps(old)
    if kind == "list":
        return [old]
    if kind == "nest":
        return {"value": old}
    if kind == "add key":
        return {**old, data.draw(st.sampled_from(["extra", "value", "figure"]), label="key"): 1}
    return None if kind == "null" else {}  # null; the whole file deleted: an empty object


def get(value: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        value = value[step]
    return value


def put(value: Any, where: tuple[Any, ...], new: Any) -> Any:
    if not where:
        return new
    get(value, where[:-1])[where[-1]] = new
    return value


def write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value))  # NaN and infinity as Python's json writes them: NaN, Infinity


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refused_in_one_line(result: Any) -> None:
    """Exit status 2 with one line "error: ...", no traceback."""
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------- properties


def test_the_valid_files_are_read_back(made: dict[str, Path], tmp_path: Path) -> None:
    assert load_card(made["card"]).to_dict() == json.loads(made["card"].read_text())
    run = load_run(made["run"])
    assert run.experiment == "counting" and len(run.result.records) == 3
    (tmp_path / "other").mkdir()
    other = write_card(tmp_path / "other", valid_card())
    result = runner.invoke(app, ["audit", "--compare", str(made["card"]), str(other), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0 and (tmp_path / "c" / "compare.html").is_file(), result.output


@examples(100)
@given(data=st.data())
def test_a_mutated_card_is_compared_or_refused_in_one_line(made: dict[str, Path], data: st.DataObject) -> None:
    value = mutate(data, json.loads(made["card"].read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad" / "card.json"
        bad.parent.mkdir()
        write(bad, value)
        try:
            load_card(bad)
        except RunDirectoryError:
            pass
        out = Path(tmp) / "compared"
        result = runner.invoke(app, ["audit", "--compare", str(made["card"]), str(bad), "--out", str(out)])
        if result.exit_code == 0:
            assert (out / "compare.html").is_file()
        else:
            refused_in_one_line(result)
            assert not out.exists()


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def mutated_run(made: dict[str, Path], data: st.DataObject, root: Path) -> Path:
    """A copy of the valid run under ``root`` with one of its files mutated."""
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(made["run"], run)
    name = data.draw(st.sampled_from(["config.json", "manifest.json", "results.json"]), label="file")
    write(run / name, mutate(data, json.loads((run / name).read_text())))
    return run


@examples(100)
@given(data=st.data())
def test_load_run_of_a_mutated_run_returns_it_or_raises_the_toolkits_error(
    made: dict[str, Path], data: st.DataObject, scratch: Path
) -> None:
    run = mutated_run(made, data, scratch)
    try:
        loaded = load_run(run)
    except ContllmError:
        return
    assert loaded.experiment == "counting" and isinstance(loaded.summary, dict)


@examples(40)
@given(data=st.data())
def test_a_report_of_a_mutated_run_is_written_or_refused_before_out_exists(
    made: dict[str, Path], data: st.DataObject, scratch: Path
) -> None:
    run = mutated_run(made, data, scratch)
    out = scratch / "report"
    shutil.rmtree(out, ignore_errors=True)
    result = runner.invoke(app, ["report", str(run), "--out", str(out)])
    if result.exit_code == 0:
        assert (out / "summary.md").is_file()
    else:
        refused_in_one_line(result)
        assert not out.exists()


@examples(30)
@given(data=st.data())
def test_figures_of_a_mutated_run_are_drawn_or_refused_before_anything_is_written(
    made: dict[str, Path], data: st.DataObject, scratch: Path
) -> None:
    run = mutated_run(made, data, scratch)
    before = snapshot(run)
    result = runner.invoke(app, ["figures", str(run), "--items", "1"])
    if result.exit_code == 0:
        assert (run / "figures" / "summary.png").is_file()
    else:
        refused_in_one_line(result)
        assert snapshot(run) == before


# ---------------------------------------------------------------------------- the parser and the schemas


@pytest.mark.parametrize(
    "text,field",
    [("NaN", ""), ('{"a": [1, Infinity]}', "a[1]"), ('{"a": {"b c": -Infinity}}', 'a["b c"]'), ('{"x": 1e400}', "x")],
)
def test_nan_and_infinity_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(RunDirectoryError, match="expected a finite number") as caught:
        parse_json(text, "f.json")
    assert str(caught.value).startswith(f"f.json: {field}: " if field else "f.json: expected")
    assert math.isnan(parse_json("NaN", "f.json", non_finite=True))  # where a reader asks for them


def test_every_reader_keeps_its_own_error_type(tmp_path: Path) -> None:
    (tmp_path / "audit.json").write_text('{"model": "m", "protocol": "contllm", "plan": {"spent": "0"}}')
    from contllm.audits.run import read_audit

    with pytest.raises(RunDirectoryError, match=r"audit.json: plan.spent: expected a finite number >= 0, got the"):
        read_audit(tmp_path)
    with pytest.raises(ExperimentError, match=r"not a card: findings\[0\].numbers: expected a list of at least 1"):
        data = valid_card().to_dict()
        data["findings"][0]["numbers"] = []
        Card.from_dict(data)
    spec = tmp_path / "spec.toml"
    spec.write_text("[[experiment]]\nname = 'counting'\nrange = [0.1, inf]\n")
    from contllm.rundir.spec import load_spec

    with pytest.raises(ExperimentError, match=r"experiment\[0\].range\[1\]: expected a finite number, got inf"):
        load_spec(spec)


def test_a_card_may_not_point_outside_its_audit_directory(made: dict[str, Path], tmp_path: Path) -> None:
    data = json.loads(made["card"].read_text())
    for bad in ("/etc/passwd", "../../secret.png", "counting/../../x"):
        data["findings"][0]["figure"] = bad
        write(tmp_path / "card.json", data)
        with pytest.raises(RunDirectoryError, match=r"findings\[0\].figure: expected a relative path inside"):
            load_card(tmp_path / "card.json")


def test_the_schemas_take_what_the_writers_write(made: dict[str, Path]) -> None:
    from contllm.audits.studies import PROTOCOLS
    from contllm.rundir.runs import RunDir

    assert schemas.PROTOCOLS == PROTOCOLS
    # The objects rebuilt as dataclasses hold exactly their fields (a plan's calibration adds its rate).
    for schema, kind, added in [
        (schemas.CARD, Card, ()),
        (schemas.FINDING, Finding, ()),
        (schemas.NUMBER, Number, ()),
        (schemas.PLAN, Plan, ()),
        (schemas.SHARE, Share, ()),
        (schemas.CALIBRATION, Calibration, ("rate",)),
    ]:
        assert list(schema.fields) == [f.name for f in dataclasses.fields(kind)] + list(added), kind
        assert schema.extra is None
    run = made["run"]
    read_json(run / "config.json", schema=schemas.CONFIG)
    read_json(run / "manifest.json", schema=schemas.MANIFEST)
    for record in (run / "items").glob("*.json"):
        read_json(record, schema=schemas.RECORD_FILE)
    plan = Plan(None, 0.0, 0.0, 0.0, [Share("counting", 3, 0.0)])  # a plan of given counts
    schemas.validate(
        {"model": "m", "protocol": "paper", "budget": None, "seed": 0, "dtype": None, "plan": plan.to_dict()},
        schemas.AUDIT,
        "audit.json",
        RunDirectoryError,
    )
    assert RunDir  # the run directory's own readers take the same files (test_runs.py, test_cli_figures.py)


# ---------------------------------------------------------------------------- issue 48, through a real process


def bad_cards(card: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The three cards of issue 48: (content, the field the error must name)."""

    def walk(value: Any, change: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, change) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, change) for v in value]
        return change(value)

    def strings(value: Any) -> Any:
        if isinstance(value, bool) or value is None:
            return value
        return str(value) if isinstance(value, (int, float)) else [value] if isinstance(value, str) else value

    return {
        "strings": (walk(card, strings), "model"),
        "nan": (walk(card, lambda v: math.nan if isinstance(v, float) else v), "plan.budget"),
        "null model": ({**card, "model": None}, "model"),
    }


@pytest.mark.parametrize("case", ["strings", "nan", "null model"])
def test_a_card_that_is_json_but_no_card_is_refused_in_one_line_and_nothing_is_created(
    case: str, made: dict[str, Path], tmp_path: Path
) -> None:
    content, field = bad_cards(json.loads(made["card"].read_text()))[case]
    bad = tmp_path / "bad.json"
    write(bad, content)
    out = tmp_path / "compared"
    done = subprocess.run(
        [sys.executable, "-m", "contllm", "audit", "--compare", str(made["card"]), str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: {bad} is not a card: {field}: expected "), lines[0]
    assert not out.exists()


def test_figures_a_result_reads_but_cannot_draw_are_refused_with_nothing_written(
    made: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    data = json.loads((run / "results.json").read_text())
    data["sweeps"][0]["labels"][0] = "null"  # a digit no count panel can place; the summary passes it over
    write(run / "results.json", data)
    before = snapshot(run)
    result = runner.invoke(app, ["figures", str(run)])
    refused_in_one_line(result)
    assert "cannot be drawn" in result.output and "nothing was written" in result.output
    assert snapshot(run) == before and not (run / ".lock").exists()


def test_a_report_of_a_run_with_nan_is_refused_by_a_real_process(made: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    (run / "results.json").write_text((run / "results.json").read_text().replace("0.1,", "NaN,", 1))
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "contllm", "report", str(run), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {run}: cannot read results.json: ") and "got NaN" in lines[0], lines[0]
    assert not out.exists()
