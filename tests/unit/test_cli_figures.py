"""Figures off the critical path: --formats, the item figures a run draws by itself, and ``contllm figures RUN_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM, settings
from contllm.cli.commands import app
from contllm.errors import ExperimentError, RunDirectoryError
from contllm.experiments.counting import CountingConfig
from contllm.rundir import runner
from contllm.rundir.report import draw_figures
from contllm.rundir.spec import load_spec
from contllm.settings import RunSettings, figure_formats
from tests.unit.test_cli import one_line_error
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit

CONFIG = CountingConfig(samples=3, low=0.5, high=1.5)


def tiny_run(out: Path, **settings: object) -> Path:
    """A finished counting run of a tiny model: two items, three factors each."""
    from contllm.rundir.runner import run

    lm = ContinuousLM(tiny_model("llama"), digit_tokenizer())
    return run("counting", config=CONFIG, lm=lm, model="tiny-llama", items="2", out=out, **settings)


def figures_of(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir / "figures")) for p in (run_dir / "figures").rglob("*") if p.is_file()}


def listed(run_dir: Path) -> set[str]:
    return set(json.loads((run_dir / "manifest.json").read_text())["outputs"])


# ---------------------------------------------------------------------------- --formats


def test_figure_formats_are_read_in_the_order_given_each_once() -> None:
    assert RunSettings().formats == ("png",)
    assert figure_formats("png,pdf") == ("png", "pdf") and figure_formats(" PDF , png,pdf,") == ("pdf", "png")
    assert RunSettings(formats=["pdf"]).formats == ("pdf",)


@pytest.mark.parametrize(
    "value,needle",
    [
        ("jpg", "unknown figure format 'jpg'; choose among png, pdf"),
        ("png,svg", "unknown figure format 'svg'"),
        ("", "names no figure format"),
        (",", "names no figure format"),
        (3, "takes figure formats (png, pdf), comma-separated; got 3"),
        (["png", None], "takes figure formats"),
    ],
)
def test_bad_figure_formats_are_refused(value: object, needle: str) -> None:
    with pytest.raises(ExperimentError, match=None) as info:
        RunSettings(formats=value)  # type: ignore[arg-type]
    assert needle in str(info.value)


@pytest.mark.parametrize("value", ["jpg", "png,tiff", ""])
def test_bad_formats_stop_a_run_in_one_line_before_the_model_loads(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr("contllm.rundir.runner.run", no_run)
    out = tmp_path / "run"
    one_line_error(CliRunner().invoke(app, ["run", "counting", "--formats", value, "--out", str(out)]), "--formats")
    assert not out.exists()


@pytest.mark.parametrize(
    "text,needle",
    [
        ('formats = "gif"\n[[experiment]]\nname = "counting"\n', "'formats': unknown figure format 'gif'"),
        ('formats = 1\n[[experiment]]\nname = "counting"\n', "'formats' takes figure formats"),
    ],
)
def test_a_specs_formats_are_checked(text: str, needle: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    with pytest.raises(ExperimentError, match=None) as info:
        load_spec(spec)
    assert needle in str(info.value)
    one_line_error(CliRunner().invoke(app, ["run", str(spec)]), needle)
    spec.write_text('formats = ["png", "pdf"]\n[[experiment]]\nname = "counting"\n')
    assert {e.settings.formats for e in load_spec(spec).entries} == {("png", "pdf")}
    one_line_error(CliRunner().invoke(app, ["run", str(spec), "--formats", "bmp"]), "unknown figure format 'bmp'")


# ---------------------------------------------------------------------------- what a run draws


def test_a_default_run_writes_the_summary_figure_as_png_only(tmp_path: Path) -> None:
    out = tiny_run(tmp_path / "run")
    # Two items: at most ITEM_FIGURES_UP_TO, so each item's figure is drawn as well.
    assert figures_of(out) == {"summary.png", "items/count-001.png", "items/count-002.png"}
    for name in ("config.json", "results.json", "results.csv", "summary.json", "explorer.html"):
        assert (out / name).is_file(), name
    assert {f"figures/{name}" for name in figures_of(out)} <= listed(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["seconds"]["load"] is None  # the model came loaded
    assert manifest["seconds"]["evaluation"] > 0 and manifest["seconds"]["outputs"] > 0


def test_a_large_run_draws_the_summary_only_and_figures_draws_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for where in (settings, runner):  # two items are now a large run
        monkeypatch.setattr(where, "ITEM_FIGURES_UP_TO", 1)
    with caplog.at_level("INFO", logger="contllm"):
        out = tiny_run(tmp_path / "run")
    assert figures_of(out) == {"summary.png"}
    assert (out / "explorer.html").is_file() and "explorer.html" in listed(out)
    assert f"item figures not drawn (2 items; a run draws them by itself up to 1): contllm figures {out}" in caplog.text

    done = CliRunner().invoke(app, ["figures", str(out), "--items", "count-002"])
    assert done.exit_code == 0, done.output
    assert figures_of(out) == {"summary.png", "items/count-002.png"}
    assert done.stdout.split() == [str(out / "figures" / "summary.png"), str(out / "figures" / "items" / "count-002.png")]

    done = CliRunner().invoke(app, ["figures", str(out), "--formats", "png,pdf"])
    assert done.exit_code == 0, done.output
    expected = {f"{stem}.{ext}" for stem in ("summary", "items/count-001", "items/count-002") for ext in ("png", "pdf")}
    assert figures_of(out) == expected
    for name in expected:
        assert (out / "figures" / name).stat().st_size > 1000, name
    # The manifest lists every file drawn, so --force removes them with the run.
    assert {f"figures/{name}" for name in expected} <= listed(out)
    tiny_run(out, force=True)
    assert figures_of(out) == {"summary.png"}
    # --item-figures draws them during the run whatever its size.
    assert figures_of(tiny_run(tmp_path / "drawn", item_figures=True)) == {
        "summary.png", "items/count-001.png", "items/count-002.png"
    }


def test_no_item_figures_and_pdf_on_request(tmp_path: Path) -> None:
    out = tiny_run(tmp_path / "run", item_figures=False, formats="pdf,png")
    assert figures_of(out) == {"summary.png", "summary.pdf"}


# ---------------------------------------------------------------------------- contllm figures, refused


def test_figures_refuses_what_is_not_a_finished_run(tmp_path: Path) -> None:
    out = tiny_run(tmp_path / "run", item_figures=False)
    for args, needle in (
        ([str(out), "--formats", "svg"], "unknown figure format 'svg'"),
        ([str(out), "--items", "count-009"], "unknown item id 'count-009'"),
        ([str(out), "--items", "3"], "asked for 3 items but the dataset has 2"),
        ([str(tmp_path / "nowhere")], "is not a run directory (it does not exist)"),
    ):
        one_line_error(CliRunner().invoke(app, ["figures", *args]), needle)
    assert figures_of(out) == {"summary.png"}
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    with pytest.raises(RunDirectoryError, match="is an unfinished run"):
        draw_figures(out)

