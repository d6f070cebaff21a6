"""dtype="auto": the rule (a pure function of timings and differences), the measurement, and the load on a tiny Llama."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

import contllm
from contllm.errors import ModelLoadError
from contllm.models import parse_dtype
from contllm.models.autodtype import (
    CALIBRATION_PROMPTS,
    CLEAR_RATIO,
    MAX_PROB_DIFF,
    MIN_GAIN,
    DtypeChoice,
    decide,
    is_auto,
    measure,
)
from tests.unit.tiny import tiny_tokenizer, word_directory, word_llama

pytestmark = pytest.mark.unit

CPU = "cpu: Test CPU, AVX2, no avx512_bf16, no AMX, 2 cores, 2 torch threads"


# ---------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("fp32", "bf16", "diff", "picked"),
    [
        (1.0, 0.5, 0.001, "bfloat16"),  # faster and close
        (1.0, 0.9, 0.001, "bfloat16"),  # exactly the margin: 10% faster
        (1.0, 0.91, 0.001, "float32"),  # 9% faster: within the noise
        (1.0, 1.0, 0.0, "float32"),  # as fast
        (0.15, 0.6, 0.001, "float32"),  # emulated bfloat16: 4x as slow
        (1.0, 0.5, MAX_PROB_DIFF, "bfloat16"),  # exactly the allowed difference
        (1.0, 0.5, 0.0101, "float32"),  # fast, but the probabilities move too much
        (1.0, 0.5, float("nan"), "float32"),  # bfloat16's outputs were not finite
        (1.0, 0.5, float("inf"), "float32"),
    ],
)
def test_bfloat16_only_where_it_is_faster_by_the_margin_and_close(
    fp32: float, bf16: float, diff: float, picked: str
) -> None:
    assert decide(fp32, bf16, diff, CPU).dtype == picked


def test_the_margins_are_parameters() -> None:
    assert decide(1.0, 0.95, 0.001, CPU).dtype == "float32"
    assert decide(1.0, 0.95, 0.001, CPU, min_gain=0.04).dtype == "bfloat16"
    assert decide(1.0, 0.5, 0.02, CPU).dtype == "float32"
    assert decide(1.0, 0.5, 0.02, CPU, max_allowed=0.03).dtype == "bfloat16"
    assert (MIN_GAIN, MAX_PROB_DIFF) == (0.10, 1e-2)


def test_the_reason_states_every_measured_number_and_the_device() -> None:
    choice = decide(0.148, 0.592, 0.017, CPU)
    assert choice.dtype == "float32"
    assert choice.reason.startswith("float32 (bfloat16 is neither enough faster nor close enough)")
    for text in ("bfloat16 0.592 s", "float32 0.148 s", "4.00x as slow", "at least 10% faster", "0.017", "0.01", CPU):
        assert text in choice.reason
    fast = decide(0.2, 0.1, 0.004, CPU)
    assert fast.reason.startswith("bfloat16 (faster and as close as required)")
    assert "50% faster" in fast.reason and "within 0.004" in fast.reason
    slow_but_close = decide(0.2, 0.19, 0.004, CPU)
    assert "bfloat16 is not enough faster" in slow_but_close.reason and "5% faster" in slow_but_close.reason
    far = decide(0.2, 0.1, 0.5, CPU)
    assert "moves the probabilities too much" in far.reason and "up to 0.5" in far.reason
    assert "not finite" in decide(0.2, 0.1, float("nan"), CPU).reason


def test_a_choice_keeps_its_numbers_and_goes_to_json_and_back() -> None:
    choice = decide(0.148, 0.592, float("nan"), CPU)
    assert (choice.float32_seconds, choice.bfloat16_seconds, choice.device) == (0.148, 0.592, CPU)
    assert math.isnan(choice.max_prob_diff) and choice.seconds is None
    data = json.loads(json.dumps(choice.to_dict(), allow_nan=False))
    assert data["requested"] == "auto" and data["dtype"] == "float32" and data["max_prob_diff"] is None
    back = DtypeChoice.from_dict(data)
    assert math.isnan(back.max_prob_diff)
    close = decide(0.2, 0.1, 0.004, CPU)
    assert DtypeChoice.from_dict(json.loads(json.dumps(close.to_dict()))) == close


@pytest.mark.parametrize(
    ("args", "options", "named"),
    [
        ((0.0, 0.5, 0.001), {}, "float32_seconds"),
        ((-1.0, 0.5, 0.001), {}, "float32_seconds"),
        ((float("nan"), 0.5, 0.001), {}, "float32_seconds"),
        ((1.0, float("inf"), 0.001), {}, "bfloat16_seconds"),
        ((1.0, True, 0.001), {}, "bfloat16_seconds"),
        ((1.0, 0.5, -0.1), {}, "max_prob_diff"),
        ((1.0, 0.5, "0.1"), {}, "max_prob_diff"),
        ((1.0, 0.5, 0.001), {"min_gain": 1.0}, "min_gain"),
        ((1.0, 0.5, 0.001), {"max_allowed": -1}, "max_allowed"),
    ],
)
def test_a_value_that_is_no_measurement_is_refused(args: tuple, options: dict, named: str) -> None:
    with pytest.raises(ModelLoadError, match=named):
        decide(*args, CPU, **options)


def test_auto_is_a_word_of_its_own() -> None:
    assert is_auto("auto") and is_auto(" AUTO ") and is_auto("Auto")
    assert not is_auto("autos") and not is_auto(None) and not is_auto(torch.float32) and not is_auto("float32")


def test_load_model_names_where_auto_is_taken() -> None:
    with pytest.raises(ModelLoadError, match="contllm.load"):
        parse_dtype("auto")


def test_auto_with_a_device_map_is_refused_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="device_map"):
        contllm.load(str(tmp_path / "nothing-here"), dtype="auto", device_map="auto")


# ---------------------------------------------------------------------------- measuring and loading


def test_measure_times_both_and_compares_their_probabilities() -> None:
    tokenizer = tiny_tokenizer()
    fp32 = contllm.wrap(word_llama(), tokenizer)
    bf16 = contllm.wrap(word_llama().to(torch.bfloat16), tokenizer)
    before = {k: v.clone() for k, v in fp32.model.state_dict().items()}
    fp32_s, bf16_s, diff, timed = measure(fp32, bf16, rounds=2)
    assert fp32_s > 0 and bf16_s > 0
    # Two rounds, or one where a dtype was twice as fast as the other.
    assert timed == 2 or (timed == 1 and max(fp32_s, bf16_s) >= CLEAR_RATIO * min(fp32_s, bf16_s))
    signals = [fp32.signal(p) for p in CALIBRATION_PROMPTS]
    expected = (bf16.probs([bf16.signal(p) for p in CALIBRATION_PROMPTS]) - fp32.probs(signals)).abs().max()
    assert diff == pytest.approx(float(expected), rel=1e-6) and diff > 0
    assert all(torch.equal(v, fp32.model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ModelLoadError, match="rounds"):
        measure(fp32, bf16, rounds=0)


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return word_directory(tmp_path_factory.mktemp("auto") / "word-llama")


def test_load_auto_keeps_the_model_of_its_choice_unchanged(directory: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(7)
    with caplog.at_level(logging.INFO, logger="contllm"):
        lm = contllm.load(str(directory), dtype="auto", device="cpu")
    after_auto = torch.rand(4)
    choice = lm.info.dtype_choice
    assert isinstance(choice, DtypeChoice) and choice.dtype in ("float32", "bfloat16")
    assert str(lm.dtype) == f"torch.{choice.dtype}" and lm.info.dtype == lm.dtype
    assert choice.seconds is not None and choice.seconds > 0 and choice.rounds in (1, 2, 3)
    assert f"{choice.float32_seconds:.3f} s" in choice.reason and f"{choice.bfloat16_seconds:.3f} s" in choice.reason
    assert choice.device.startswith("cpu: ") and choice.device in choice.reason
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype auto -> ")]
    assert len(lines) == 1 and choice.reason in lines[0]

    torch.manual_seed(7)
    named = contllm.load(str(directory), dtype=choice.dtype, device="cpu")
    assert torch.equal(torch.rand(4), after_auto)  # the calibration draws nothing from the random state
    assert named.info.dtype_choice is None
    signals = [lm.signal(p) for p in ("the cat sat on a mat", "a dog", "the")]
    assert torch.equal(lm.probs(signals), named.probs(signals))
    assert all(torch.equal(v, named.model.state_dict()[k]) for k, v in lm.model.state_dict().items())


def test_where_bfloat16_wins_the_load_is_that_of_dtype_bfloat16(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This CPU may emulate bfloat16: the measured bfloat16 time is halved so that the rule picks it.
    from contllm.models import autodtype

    measured = autodtype.measure

    def bfloat16_twice_as_fast(
        float32_lm: object, bfloat16_lm: object, **options: object
    ) -> tuple[float, float, float, int]:
        fp32, _, diff, timed = measured(float32_lm, bfloat16_lm, **options)  # type: ignore[arg-type]
        return fp32, fp32 / 2, diff, timed

    monkeypatch.setattr(autodtype, "measure", bfloat16_twice_as_fast)
    lm = contllm.load(str(directory), dtype="auto", device="cpu")
    choice = lm.info.dtype_choice
    assert choice.dtype == "bfloat16" and lm.dtype == torch.bfloat16, choice.reason
    assert choice.bfloat16_seconds == choice.float32_seconds / 2 and "50% faster" in choice.reason
    named = contllm.load(str(directory), dtype="bfloat16", device="cpu")
    signals = [lm.signal(p) for p in ("the cat sat on a mat", "a dog", "the")]
    assert torch.equal(lm.probs(signals), named.probs(signals))
    assert all(torch.equal(v, named.model.state_dict()[k]) for k, v in lm.model.state_dict().items())


def test_the_device_is_described_by_the_hardware_module() -> None:
    from contllm.hardware import describe, describe_device

    assert describe_device("cpu") == describe() == describe_device(torch.device("cpu"))
    if torch.cuda.is_available():
        assert describe_device("cuda").startswith("gpu: ")


# ---------------------------------------------------------------------------- runs and cards


def test_a_run_takes_auto_and_config_json_keeps_it() -> None:
    from contllm.errors import ExperimentError
    from contllm.settings import RunSettings

    assert RunSettings(dtype="auto").recorded()["dtype"] == "auto"
    assert RunSettings(dtype=" Auto").dtype == " Auto"
    with pytest.raises(ExperimentError, match="or auto, got 'autox'"):
        RunSettings(dtype="autox")


def test_the_manifest_and_the_card_schemas_hold_a_choice() -> None:
    from contllm.rundir.schemas import CARD, DTYPE_CHOICE, MANIFEST, validate

    for choice in (decide(0.148, 0.592, 0.017, CPU), decide(0.2, 0.1, float("nan"), CPU)):
        data = json.loads(json.dumps(choice.to_dict(), allow_nan=False))
        validate(data, DTYPE_CHOICE, "not a choice", ModelLoadError)
        validate({"dtype": choice.dtype, "dtype_choice": data}, MANIFEST, "not a manifest", ModelLoadError)
    with pytest.raises(ModelLoadError, match="dtype"):
        validate({**data, "dtype": "float16"}, DTYPE_CHOICE, "not a choice", ModelLoadError)
    assert "dtype_choice" in CARD.fields


@pytest.mark.parametrize(
    "args",
    [
        ["run", "counting", "--dtype", "autox"],
        ["audit", "smollm2-135m", "--dtype", "int8"],
        ["generate", "the cat", "--dtype", "autos"],
    ],
)
def test_a_bad_dtype_is_one_line_naming_auto_and_exit_2(args: list[str]) -> None:
    from tests.unit.test_cli_startup import probe

    result, output = probe(*args)
    assert result["code"] == 2 and output.count("error:") == 1 and "or auto" in output, output
    if args[0] == "audit":
        assert result["heavy"] == [], output


@pytest.mark.parametrize("command", [["run", "counting"], ["audit"], ["generate"]])
def test_the_help_offers_auto(command: list[str]) -> None:
    from tests.unit.test_cli_startup import probe

    result, output = probe(*command, "--help")
    assert result["code"] == 0 and "--dtype [float32|bfloat16|float16|auto]" in output, output
