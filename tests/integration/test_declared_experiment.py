"""An experiment that declares itself in one file gets every part of the toolkit, with no other file touched.

The toy (tests/toy_experiment.py) declares its items, its sweep, its explorer page and its
audit study; registered at run time, it runs through the runner, resumes, writes its
``explorer.html``, is compared by ``contllm report`` and becomes a finding on an audit's
card. tests/integration/test_toy_experiment.py covers the command line's side (--help, a
malformed value, resume through ``contllm run``) for a toy without a page or a study.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM, registry
from contllm.audits.card import build_card
from contllm.audits.page import card_page
from contllm.audits.run import fixed_plan
from contllm.audits.studies import STUDIES, study
from contllm.cli.commands import app
from contllm.errors import ExperimentError
from contllm.rundir.runner import run
from tests import toy_experiment
from tests.toy_experiment import NAME

pytestmark = pytest.mark.integration

AUDITED = ["counting", "events", "boolean", "interpolation", "linearity", "sums", "circuit"]


@pytest.fixture
def registered() -> Iterator[None]:
    registry.register(NAME, toy_experiment.__name__)
    yield
    registry.unregister(NAME)


def explorer_data(path: Path) -> dict:
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', path.read_text(), re.S)
    assert match, f"no data block in {path}"
    return json.loads(match.group(1).replace("<\\/", "</"))


def toy_run(lm: ContinuousLM, out: Path, samples: int, **kwargs: object) -> Path:
    return run(
        NAME, lm=lm, out=out, model="smollm2-135m", options={"samples": str(samples)}, item_figures=False, **kwargs
    )


def test_a_declared_experiment_runs_resumes_explores_reports_and_is_audited(
    registered: None, smollm: ContinuousLM, tmp_path: Path
) -> None:
    audit = tmp_path / "audit"
    out = toy_run(smollm, audit / NAME, 4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert sorted(p.stem for p in (out / "items").glob("*.json")) == [item.id for item in toy_experiment.ITEMS]

    # Its explorer page: every item, the knob it sweeps and its own paragraph.
    data = explorer_data(out / "explorer.html")
    assert data["experiment"] == NAME and data["knob"] == "factor"
    assert data["about"].startswith(toy_experiment.EXPERIMENT.explorer_text)
    items = data["runs"][0]["items"]
    assert [item["id"] for item in items] == [item.id for item in toy_experiment.ITEMS]
    assert all(len(item["x"]) == len(item["probs"]) >= 4 and item["labels"][:2] == ["0", "1"] for item in items)

    # --resume: a lost record is computed again, the others are read back untouched.
    kept = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "items").glob("*.json")}
    (out / "items" / "toy-dog.json").unlink()
    summary = (out / "summary.json").read_text()
    assert toy_run(smollm, out, 4, resume=True) == out
    for name, (mtime, content) in kept.items():
        path = out / "items" / name
        assert path.read_bytes() == content and (name == "toy-dog.json" or path.stat().st_mtime_ns == mtime)
    assert (out / "summary.json").read_text() == summary
    assert toy_run(smollm, out, 4, resume=True) == out  # finished: nothing left to do
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"

    # contllm report over two runs of it: its table and one page with both runs.
    other = toy_run(smollm, tmp_path / "other", 3)
    report = tmp_path / "report"
    done = CliRunner().invoke(app, ["report", str(out), str(other), "--out", str(report)])
    assert done.exit_code == 0, done.output
    assert NAME in (report / "summary.md").read_text() and "pure_peak_rate" in (report / "summary.md").read_text()
    assert [r["name"] for r in explorer_data(report / "explorer.html")["runs"]] == [
        f"smollm2-135m ({NAME})",
        "smollm2-135m (other)",
    ]

    # Its audit study: last in the audit's order, and a finding of its own on the card.
    assert [s.experiment for s in STUDIES] == [*AUDITED, NAME] and study(NAME) is toy_experiment.EXPERIMENT.study
    card = build_card(
        audit, fixed_plan({NAME: 3}), model="smollm2-135m", protocol="contllm", run_seconds={NAME: 1.0}, resamples=50
    )
    (finding,) = card.findings
    run_summary = json.loads(summary)
    assert finding.experiment == NAME and finding.items == 3
    assert finding.sentence == toy_experiment.finding(run_summary, {})
    assert [(n.metric, n.role) for n in finding.numbers] == [("pure_peak_rate", "headline"), ("accuracy_at_1", "paper")]
    assert finding.numbers[0].value == pytest.approx(run_summary["pure_peak_rate"])
    assert finding.explorer == f"{NAME}/explorer.html"
    assert finding.sentence in card_page(card, audit)


def test_the_audit_forgets_an_unregistered_study() -> None:
    assert [s.experiment for s in STUDIES] == AUDITED
    with pytest.raises(ExperimentError, match="an audit has no experiment 'toy-count'"):
        study(NAME)
