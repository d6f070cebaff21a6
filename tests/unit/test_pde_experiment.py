"""The pde probe as a registered experiment: options, points as items, the runner and the command line, on a tiny model."""

from __future__ import annotations

import collections
import json
import re
import shutil
from pathlib import Path

import pytest

from contllm import ContinuousLM, ExperimentError, registry
from contllm.pde import EXPERIMENT, PDEConfig, PDEResult, run_pde
from contllm.pde.experiment import select_prompts, shipped_prompts, shipped_text, step_id
from contllm.pde.figures import FIGURES
from contllm.pde.result import CSV_COLUMNS, PROFILE_COLUMNS
from contllm.rundir.files import csv_text
from contllm.rundir.outputs import result_tables
from contllm.rundir.runner import context_for
from tests.unit.tiny import VOCAB, tiny_lm, word_level_tokenizer

pytestmark = pytest.mark.unit

#: Two points besides the stock model, on two prompts: the cheapest run that has every part.
OPTIONS = {"times": "0,0.5", "variants": "attention,hidden", "prompts": "2"}
POINTS = ["stock-T0", "attention-T0.5", "hidden-T0.5"]


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    """A tiny random Llama with a word-level tokenizer over the shipped text's most common words."""
    text = shipped_text() + " " + " ".join(p.text for p in shipped_prompts())
    counts = collections.Counter(re.findall(r"\w+|[^\w\s]+", text))
    vocab = ["<unk>"] + [w for w, _ in counts.most_common(VOCAB - 1)]
    return tiny_lm("llama", word_level_tokenizer(vocab))


@pytest.fixture(scope="module")
def full_run(lm: ContinuousLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from contllm.rundir.runner import run

    out = tmp_path_factory.mktemp("pde") / "run"
    return run("pde", options=OPTIONS, lm=lm, model="tiny-llama", out=out, formats="png,pdf")


def records_of(path: Path) -> dict[str, dict]:
    """Each point's saved record (items/<id>.json, as the runner keeps it), without its wall time."""
    out = {}
    for file in (path / "items").glob("*.json"):
        saved = json.loads(file.read_text())
        record = EXPERIMENT.decode(saved["record"])
        record.pop("seconds")
        out[saved["id"]] = record
    return out


def without_seconds(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


# ---------------------------------------------------------------------------- the declaration


def test_the_experiment_is_registered_with_its_options_and_points_as_items() -> None:
    assert registry.get("pde") is EXPERIMENT
    assert EXPERIMENT.engine is False and EXPERIMENT.unit == "point"
    flags = [o.cli_flag for o in EXPERIMENT.options]
    assert flags == ["--times", "--dynamics", "--variants", "--layer", "--head", "--spacing", "--rho",
                     "--wave-speed", "--long-range", "--prompts"]
    assert all(o.help for o in EXPERIMENT.options)
    config = EXPERIMENT.config()
    assert config == PDEConfig()
    items = EXPERIMENT.items(config)
    assert [i.id for i in items][:3] == ["stock-T0", "attention-T0.1", "attention-T0.4"]
    assert len(items) == 1 + 7 * 3 and len({i.id for i in items}) == len(items)
    assert [i.id for i in EXPERIMENT.items(EXPERIMENT.config(OPTIONS))] == POINTS
    assert [(i.variant, i.T) for i in EXPERIMENT.items(EXPERIMENT.config(OPTIONS))] == [
        ("stock", 0.0), ("attention", 0.5), ("hidden", 0.5)]


def test_options_are_read_into_the_config() -> None:
    config = EXPERIMENT.config({"times": "16,1", "dynamics": "wave", "wave_speed": "0.5", "rho": "-2", "layer": "-1",
                                "head": "3", "spacing": "index", "long_range": "8", "variants": "matched,attention",
                                "prompts": "code,capital"})
    assert config.times == (0.0, 1.0, 16.0)
    assert config.variants == ("attention", "matched")
    assert (config.dynamics, config.wave_speed, config.rho, config.layer, config.head) == ("wave", 0.5, -2.0, -1, 3)
    assert (config.spacing, config.long_range, config.prompts) == ("index", 8, "code,capital")
    assert config.dynamics_at("attention", 2.0).c == 0.5
    data = EXPERIMENT.config_dict(config)
    assert data["times"] == [0.0, 1.0, 16.0] and data["wave_speed"] == 0.5 and json.dumps(data)
    # A spec file gives typed values.
    assert EXPERIMENT.config({"times": [0, 4], "layer": 2}).times == (0.0, 4.0)


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"times": "0,-1"}, "pseudo-times must be finite and >= 0, got -1"),
        ({"times": "a,b"}, "--times must be a number, got 'a'"),
        ({"times": "1,1.0000001"}, "too close to tell apart"),
        ({"dynamics": "heat"}, "dynamics must be one of diffusion, wave, reaction"),
        ({"variants": "attention,foo"}, "unknown variant(s) foo"),
        ({"spacing": "log"}, "spacing must be one of time, index"),
        ({"layer": "1,2"}, "--layer must be an integer"),
        ({"wave_speed": "0"}, "wave speed c must be > 0"),
        ({"long_range": "0"}, "long_range must be >= 1"),
        ({"prompts": "nope,code"}, "unknown pde prompt(s) nope; the prompts are capital, days"),
        ({"prompts": "99"}, "asked for 99 items but the dataset has 8"),
        ({"samples": "3"}, "--samples do not apply to the pde experiment"),
    ],
)
def test_bad_options_are_named_before_a_model_loads(options: dict, needle: str) -> None:
    with pytest.raises(ExperimentError) as info:
        EXPERIMENT.config(options)
    assert needle in str(info.value)


def test_prompts_are_selected_by_the_one_rule() -> None:
    ids = [p.id for p in shipped_prompts()]
    assert [p.id for p in select_prompts(None)] == ids
    assert [p.id for p in select_prompts("3")] == ids[:3]
    assert [p.id for p in select_prompts("code,capital")] == ["code", "capital"]


# ---------------------------------------------------------------------------- through the runner


def test_a_run_writes_its_directory(full_run: Path) -> None:
    for file in ("config.json", "manifest.json", "results.json", "results.csv", "profiles.csv", "summary.json"):
        assert (full_run / file).is_file(), file
    assert sorted(p.stem for p in (full_run / "items").glob("*.json")) == sorted(POINTS)
    for figure in FIGURES:
        for ext in ("png", "pdf"):
            assert (full_run / "figures" / f"{figure}.{ext}").stat().st_size > 1000, figure
    result = PDEResult.load(full_run)
    assert result.model == "tiny-llama" and result.prompts == ["capital", "days"] and result.n_layers == 3
    assert result.text_tokens == result.stock["text"]["tokens"] > 300
    assert result.stock["text"]["kl"] == 0 and result.stock["text"]["top1"] == 1
    table = result.table("attention")
    assert [r["T"] for r in table] == [0.0, 0.5]
    assert table[1]["kl_text"] > 0 and table[1]["attention_entropy"] > table[0]["attention_entropy"]
    columns, rows = result_tables(EXPERIMENT, result)["results"]
    assert columns == [*CSV_COLUMNS, "experiment", "model"]
    assert (full_run / "results.csv").read_text().splitlines()[0] == ",".join(columns)
    assert (full_run / "profiles.csv").read_text().splitlines()[0] == ",".join(PROFILE_COLUMNS)
    assert (full_run / "results.csv").read_text() == csv_text(columns, list(rows))
    assert (full_run / "results.csv").read_text().splitlines()[1].endswith(",pde,tiny-llama")
    summary = json.loads((full_run / "summary.json").read_text())
    assert "power-law decay" in summary["verdict"] and set(summary["verdicts"]) == {"attention", "hidden"}
    rows = [r["delta_aic"] for r in summary["attention"] if r["delta_aic"] is not None]
    assert summary["delta_aic_shift"] == pytest.approx(rows[-1] - rows[0])
    assert summary["kl_prompts_at_max_T"] == pytest.approx(summary["attention"][-1]["kl_prompts"])
    assert summary["kl_prompts_at_max_T"] > 0
    assert set(summary["metrics"]) == {m.name for m in EXPERIMENT.metrics}
    assert json.loads((full_run / "config.json").read_text())["options"]["prompts"] == "2"


def test_resume_skips_every_finished_point(lm: ContinuousLM, full_run: Path) -> None:
    from contllm.rundir.runner import run

    stamps = {p.name: p.stat().st_mtime_ns for p in (full_run / "items").glob("*.json")}
    before = PDEResult.load(full_run).records
    run("pde", options=OPTIONS, lm=lm, model="tiny-llama", out=full_run, resume=True)
    assert {p.name: p.stat().st_mtime_ns for p in (full_run / "items").glob("*.json")} == stamps
    assert PDEResult.load(full_run).records == before


def test_a_resumed_run_recomputes_the_reference_and_lost_points_exactly(lm: ContinuousLM, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    shutil.copytree(full_run, out)
    for lost in ("stock-T0", "attention-T0.5"):
        (out / "items" / f"{lost}.json").unlink()
    said: list[str] = []
    run("pde", options=OPTIONS, lm=lm, model="tiny-llama", out=out, resume=True, say=said.append)
    assert records_of(out) == records_of(full_run)
    assert without_seconds(PDEResult.load(out).records) == without_seconds(PDEResult.load(full_run).records)
    assert [line.split(":")[0] for line in said if line.startswith("  ") and ": ppl " in line] == ["  stock-T0", "  attention-T0.5"]


def test_a_run_of_some_points_measures_them_as_the_whole_run_does(lm: ContinuousLM, full_run: Path, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = run("pde", options=OPTIONS, lm=lm, model="tiny-llama", items="hidden-T0.5", out=tmp_path / "run")
    assert records_of(out) == {"hidden-T0.5": records_of(full_run)["hidden-T0.5"]}
    result = PDEResult.load(out)
    assert result.stock is None and [r["T"] for r in result.table("hidden")] == [0.5]
    assert json.loads((out / "summary.json").read_text())["verdict"] == "too few fitted profiles for a verdict"
    assert (out / "figures" / "summary.png").is_file()


def test_run_pde_in_python_equals_the_runner(lm: ContinuousLM, full_run: Path) -> None:
    saved = PDEResult.load(full_run)
    done = {step_id(r["variant"], r["T"]): r for r in saved.records if r["variant"] != "attention"}
    seen: list[str] = []
    result = run_pde(lm, EXPERIMENT.config(OPTIONS), skip=done, on_step=lambda key, record: seen.append(key),
                     model_name="tiny-llama")
    assert seen == ["attention-T0.5"]  # records already done are reused as they are
    assert without_seconds(result.records) == without_seconds(saved.records)
    assert result.config == saved.config
    assert (result.n_layers, result.text_tokens, result.prompts) == (saved.n_layers, saved.text_tokens, saved.prompts)


@pytest.mark.parametrize("options,needle", [
    ({"layer": "3"}, "layer 3 is outside the model; it has 3 layers"),
    ({"head": "-5"}, "head -5 is outside the model; it has 4 heads per layer"),
])
def test_a_scope_outside_the_model_is_refused_before_anything_is_written(
    lm: ContinuousLM, tmp_path: Path, options: dict, needle: str
) -> None:
    from contllm.rundir.runner import run

    with pytest.raises(ExperimentError, match=re.escape(needle)):
        EXPERIMENT.check(lm, EXPERIMENT.config(options))
    with pytest.raises(ExperimentError, match=re.escape(needle)):
        run("pde", options={**OPTIONS, **options}, lm=lm, model="tiny-llama", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_run_of_no_points_measures_nothing(lm: ContinuousLM) -> None:
    assert list(EXPERIMENT.run(lm, EXPERIMENT.config(OPTIONS), [], context_for(lm))) == []


# ---------------------------------------------------------------------------- results as data


def test_records_and_results_round_trip_as_data(full_run: Path) -> None:
    data = json.loads((full_run / "results.json").read_text())
    result = EXPERIMENT.load_result(data)
    assert result.to_dict() == data
    record = json.loads((full_run / "items" / "stock-T0.json").read_text())["record"]
    assert EXPERIMENT.decode(EXPERIMENT.encode(record)) == record
    broken = {k: v for k, v in record.items() if k != "attention"}
    with pytest.raises(ExperimentError, match="malformed pde record: a pde record lacks attention"):
        EXPERIMENT.decode(broken)
    with pytest.raises(ExperimentError, match=r"lacks text\.perplexity"):
        EXPERIMENT.decode({**record, "text": {"tokens": 3}})
    with pytest.raises(ExperimentError, match="malformed pde result"):
        EXPERIMENT.load_result({**data, "records": [broken]})
    with pytest.raises(ExperimentError, match="counting"):
        EXPERIMENT.load_result({**data, "experiment": "counting"})
    tables = EXPERIMENT.tables(result)
    assert list(tables) == ["results", "profiles"]
    assert tuple(tables["results"][0]) == CSV_COLUMNS and tuple(tables["profiles"][0]) == PROFILE_COLUMNS
    assert EXPERIMENT.summary(result) == result.summary()
    rebuilt = EXPERIMENT.result("tiny-llama", EXPERIMENT.config(OPTIONS), result.records)
    assert rebuilt.to_dict() == data


def test_figures_and_the_comparison_are_drawn_from_results(full_run: Path) -> None:
    from contllm.plotting import plt

    result = PDEResult.load(full_run)
    drawn = list(EXPERIMENT.figures(result, per_item=True))
    assert [name for name, _ in drawn] == list(FIGURES) and FIGURES[0] == "summary"
    figure = EXPERIMENT.comparison([("one", result), ("two", result)])
    assert figure is not None and len(figure.axes) == 4
    assert EXPERIMENT.comparison([]) is None
    for _, fig in drawn:
        plt.close(fig)
    plt.close(figure)


# ---------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "pde", "--times", "0,-1"], "pseudo-times must be finite and >= 0, got -1"),
        (["run", "pde", "--times", "a,b"], "--times must be a number, got 'a'"),
        (["run", "pde", "--dynamics", "heat"], "dynamics must be one of diffusion, wave, reaction"),
        (["run", "pde", "--variants", "attention,foo"], "unknown variant(s) foo"),
        (["run", "pde", "--spacing", "log"], "spacing must be one of time, index"),
        (["run", "pde", "--layer", "1,2"], "--layer must be an integer"),
        (["run", "pde", "--wave-speed", "0"], "wave speed c must be > 0"),
        (["run", "pde", "--long-range", "0"], "long_range must be >= 1"),
        (["run", "pde", "--prompts", "nope"], "unknown pde prompt(s) nope"),
        (["run", "pde", "--items", "nope"], "unknown item id 'nope'; ids look like 'stock-T0', 'attention-T0.1'"),
        (["run", "pde", "--samples", "3"], "--samples do not apply to the pde experiment"),
        (["run", "pde", "--eps", "0.1"], "--eps do not apply to the pde experiment"),
        (["run", "counting", "--times", "1"], "--times do not apply to the counting experiment"),
    ],
)
def test_bad_pde_options_give_one_line_and_status_2(args: list[str], needle: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from contllm.cli.commands import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output
    assert not out.exists()
