"""dtype="auto" on SmolLM2-135M: the choice, its stated reason, the same numbers as the named dtype, and a run of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import contllm
from contllm import ContinuousLM
from contllm.errors import RunDirectoryError
from contllm.models.autodtype import CALIBRATION_PROMPTS, DtypeChoice

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def auto() -> ContinuousLM:
    return contllm.load("smollm2-135m", dtype="auto", device="cpu")


def test_auto_picks_float32_or_bfloat16_and_states_the_measured_numbers(auto: ContinuousLM) -> None:
    choice = auto.info.dtype_choice
    assert isinstance(choice, DtypeChoice) and choice.dtype in ("float32", "bfloat16")
    assert auto.dtype == getattr(torch, choice.dtype) and auto.info.dtype == auto.dtype
    assert choice.float32_seconds > 0 and choice.bfloat16_seconds > 0 and 0 <= choice.max_prob_diff < 1
    reason = choice.reason
    assert reason.startswith(f"{choice.dtype} (")
    assert f"bfloat16 {choice.bfloat16_seconds:.3f} s vs float32 {choice.float32_seconds:.3f} s" in reason
    assert f"{choice.max_prob_diff:.2g}" in reason and "0.01" in reason and "10% faster" in reason
    assert re.search(r"cpu: .+, \d+ cores, \d+ torch threads$", reason), reason
    # The rule, read back from the numbers the reason states.
    fast = choice.bfloat16_seconds <= 0.9 * choice.float32_seconds
    assert (choice.dtype == "bfloat16") == (fast and choice.max_prob_diff <= 1e-2)
    # "a few seconds" on 2 cores: the bfloat16 load and at most eight reads of five short prompts.
    assert choice.seconds is not None and choice.seconds < 60


def test_auto_gives_the_numbers_of_its_dtype_named(auto: ContinuousLM, smollm: ContinuousLM) -> None:
    named = smollm if auto.info.dtype_choice.dtype == "float32" else contllm.load("smollm2-135m", dtype="bfloat16")
    assert named.dtype == auto.dtype
    signals = [auto.signal(p) for p in ("1, 2, 3, 4, 5,", "The cat sat on the", *CALIBRATION_PROMPTS[:2])]
    assert torch.equal(auto.probs(signals), named.probs(signals))
    assert torch.equal(auto.logits(signals, positions="all")[0], named.logits(signals, positions="all")[0])


def test_a_run_on_an_auto_model_records_the_dtype_it_picked_and_why(auto: ContinuousLM, tmp_path: Path) -> None:
    from contllm.rundir.runner import run

    out = run(
        "counting",
        options={"samples": "2"},
        lm=auto,
        model="smollm2-135m",
        items="1",
        out=tmp_path / "run",
        item_figures=False,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["dtype"] == auto.info.dtype_choice.dtype
    assert manifest["dtype_choice"] == json.loads(json.dumps(auto.info.dtype_choice.to_dict()))
    assert manifest["cpu"]["threads"] == torch.get_num_threads()


def test_a_run_with_dtype_auto_records_auto_and_the_choice_and_a_resume_keeps_it(
    smollm: ContinuousLM, tmp_path: Path
) -> None:
    from contllm.rundir.runner import run

    out = tmp_path / "run"
    said: list[str] = []
    options = dict(options={"samples": "2"}, model="smollm2-135m", items="1", out=out, item_figures=False)
    run("counting", dtype="auto", device="cpu", say=said.append, **options)
    config = json.loads((out / "config.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    assert config["dtype"] == "auto"
    choice = manifest["dtype_choice"]
    assert manifest["dtype"] == choice["dtype"] and choice["dtype"] in ("float32", "bfloat16")
    timings = f"bfloat16 {choice['bfloat16_seconds']:.3f} s vs float32 {choice['float32_seconds']:.3f} s"
    assert timings in choice["reason"]
    # A resumed run keeps the dtype its manifest records, untimed: here the other one, written in by hand.
    other = "bfloat16" if choice["dtype"] == "float32" else "float32"
    (out / "manifest.json").write_text(json.dumps({**manifest, "dtype_choice": {**choice, "dtype": other}}))
    said.clear()
    run("counting", dtype="auto", device="cpu", say=said.append, resume=True, **options)
    resumed = json.loads((out / "manifest.json").read_text())
    assert resumed["dtype"] == other and resumed["dtype_choice"]["dtype"] == other
    assert f"dtype auto: resuming in {other}, as picked when the run started" in said
    # A model given to the resumed run (as a spec or an audit gives theirs) must have the recorded dtype.
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "dtype_choice": {**choice, "dtype": "bfloat16"}}))
    with pytest.raises(RunDirectoryError, match="picked bfloat16 when it started, and the model given is float32"):
        run("counting", dtype="auto", lm=smollm, resume=True, **options)
