"""A toy experiment registered inside the test runs end to end through the one runner.

It is the "adding an experiment" example of the README: one module-level ``EXPERIMENT``
and one registry line give it ``contllm run``, its --help, a run directory, --resume
and ``contllm report``, with nothing else touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contllm import registry
from contllm.cli.commands import app
from contllm.experiments.base import Experiment, RunContext
from contllm.experiments.options import Option

pytestmark = pytest.mark.integration

PROMPTS = {
    "sky": "The colour of the clear sky is",
    "grass": "The colour of fresh grass is",
    "snow": "The colour of new snow is",
}


@dataclass
class ShrinkConfig:
    factor: float = 0.5


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass
class ShrinkResult:
    records: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records}


class ShrinkExperiment(Experiment):
    name = "toy-shrink"
    help = "The last word shrunk: how much of the top next token's probability is left."
    Config = ShrinkConfig
    options = (Option("factor", "float", "Duration of the last word. [default: 0.5]"),)
    engine = True

    def items(self, config: ShrinkConfig) -> Sequence[Prompt]:
        return [Prompt(k, v) for k, v in PROMPTS.items()]

    def run(self, lm: Any, config: ShrinkConfig, items: Sequence[Prompt], context: RunContext) -> Iterator[tuple[str, Any]]:
        for item in items:
            signal = lm.signal(item.text)
            last = signal.find(item.text.split()[-1])
            probs = context.evaluate([signal, signal.scale(last, config.factor)])
            top = int(probs[0].argmax())
            yield item.id, {"id": item.id, "token": top, "full": float(probs[0, top]), "shrunk": float(probs[1, top])}

    def decode(self, data: dict[str, Any]) -> dict[str, Any]:
        return dict(data)

    def encode(self, record: dict[str, Any]) -> dict[str, Any]:
        return record

    def result(self, model: str, config: ShrinkConfig, records: Sequence[dict[str, Any]]) -> ShrinkResult:
        return ShrinkResult({r["id"]: r for r in records})

    def load_result(self, data: dict[str, Any]) -> ShrinkResult:
        return ShrinkResult(data["records"])

    def tables(self, result: ShrinkResult) -> dict[str, Any]:
        return {"results": (["id", "token", "full", "shrunk"], list(result.records.values()))}

    def summary(self, result: ShrinkResult) -> dict[str, Any]:
        kept = [r["shrunk"] / r["full"] for r in result.records.values()]
        return {"items": len(kept), "mean_kept": sum(kept) / len(kept)}

    def figures(self, result: ShrinkResult, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        from contllm.plotting import plt

        fig, ax = plt.subplots()
        ax.bar(list(result.records), [r["shrunk"] / r["full"] for r in result.records.values()])
        yield "summary", fig


EXPERIMENT = ShrinkExperiment()


@pytest.fixture
def registered() -> Iterator[None]:
    registry.register("toy-shrink", __name__)
    yield
    registry.unregister("toy-shrink")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_registered_experiment_gets_the_cli_run_directory_resume_and_report(registered: None, tmp_path: Path) -> None:
    listing = invoke("run", "--help")
    assert "toy-shrink" in listing.output and "how much of the top next token" in " ".join(listing.output.split())
    assert "--factor" in invoke("run", "toy-shrink", "--help").output
    bad = invoke("run", "toy-shrink", "--factor", "x", "--out", str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "--factor must be a number" in bad.output and not (tmp_path / "bad").exists()

    out = tmp_path / "run"
    first = invoke("run", "toy-shrink", "--items", "2", "--out", str(out))
    assert first.exit_code == 0, first.output
    for name in ("config.json", "manifest.json", "results.json", "results.csv", "summary.json", "figures/summary.png"):
        assert (out / name).is_file(), name
    records = sorted(p.name for p in (out / "items").glob("*.json"))
    assert records == ["grass.json", "sky.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 2 and 0.0 < summary["mean_kept"] < 10.0
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"

    # Resume: a lost record is recomputed, the others are read back untouched.
    kept = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "items").glob("*.json")}
    (out / "items" / "grass.json").unlink()
    again = invoke("run", "toy-shrink", "--items", "2", "--out", str(out), "--resume")
    assert again.exit_code == 0, again.output
    assert "1 items already finished" in again.output
    sky = out / "items" / "sky.json"
    assert (sky.stat().st_mtime_ns, sky.read_bytes()) == kept["sky.json"]
    assert (out / "items" / "grass.json").read_bytes() == kept["grass.json"][1]
    assert json.loads((out / "summary.json").read_text()) == summary

    other = tmp_path / "other"
    assert invoke("run", "toy-shrink", "--items", "2", "--factor", "0.25", "--out", str(other)).exit_code == 0
    report = invoke("report", str(out), str(other), "--out", str(tmp_path / "report"))
    assert report.exit_code == 0, report.output
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "toy-shrink" in md and "mean_kept" in md
    assert not (tmp_path / "report" / "comparison.png").exists()  # the toy draws no comparison


def test_an_unregistered_name_is_refused_after_cleanup(tmp_path: Path) -> None:
    result = invoke("run", "toy-shrink", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "unknown experiment 'toy-shrink'" in result.output
