"""``contllm generate``: edits in the span language, JSON lines per step, one-line errors before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM, load
from contllm.cli.commands import app
from tests.unit.tiny import word_directory

pytestmark = pytest.mark.unit

runner = CliRunner()
PROMPT = "the cat sat on a mat"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return word_directory(tmp_path_factory.mktemp("word-llama"))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--scale", "dog=0.5"], "--scale dog=0.5: 'dog' is not a word of the prompt; its words are: a, cat, mat"),
        (["--scale", "cat"], "--scale cat: write WORD=FACTOR"),
        (["--scale", "cat=-1"], "the factor must lie in 0..1e+07"),
        (["--scale", "cat=half"], "the factor 'half' is not a number"),
        (["--scale", "3:99=0.5"], "the span 3:99 is not a non-empty span inside the prompt of 20 characters"),
        (["--delete", "ca"], "'ca' is not a word of the prompt"),
        (["--max-new-tokens", "1000000000"], "--max-new-tokens must lie in 0..4096"),
        (["--max-new-tokens", "many"], "--max-new-tokens must be an integer, got 'many'"),
        # one reading of counts, seeds and numbers, as `contllm run` has
        (["-n", "\u0662"], "--max-new-tokens must be an integer, got '\u0662'"),
        (["-n", "1_0"], "--max-new-tokens must be an integer, got '1_0'"),
        (["-n", "\u00b2"], "--max-new-tokens must be an integer"),
        (["--duration", "1e-320"], "--duration: '1e-320' is too close to 0"),
        (["--duration", "1_0"], "--duration must be a number, got '1_0'"),
        (["--sample", "--seed", "99999999999999999999999", "-n", "2"], "--seed must be an integer from 0 to"),
        (["--sample", "--seed", "-1"], "--seed must be an integer from 0 to"),
        (["--sample", "--seed", "\u0663"], "--seed must be an integer, got '\u0663'"),
        (["--sample", "--top-k", "\u0663"], "--top-k must be an integer"),
        # times past what a signal holds, refused before the model loads
        (["--duration", "1e30"], "would end at time 2e+31, past 1e+07"),
        (["--duration", "1e6", "-n", "12"], "12 generated tokens of duration 1000000.0 would end at time 1.2e+07"),
        (["--scale", "cat=1e30"], "the factor must lie in 0..1e+07"),
        (["--scale", "cat=1e-320"], "the factor 1e-320 is too close to 0"),
        (["--stop", "\udcff"], "--stop is not valid UTF-8 text"),
        (["--duration", "-2"], "duration must be finite and >= 0"),
        (["--temperature", "0.5"], "temperature applies only when sampling"),
        (["--sample", "--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--sample", "--top-k", "0"], "top_k must be an integer >= 1"),
        (["--top", "0"], "--top must be >= 1"),
        (["--dtype", "int8"], "--dtype must be float32, bfloat16, float16 or auto"),
        (["--bogus"], "No such option '--bogus'"),
        (["--duration"], "Option '--duration' requires an argument"),
        (["--model", "/no/such/model/dir"], "/no/such/model/dir"),
    ],
)
def test_bad_edits_and_options_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["generate", PROMPT, *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.output


def test_json_lines_are_the_python_apis_steps(model_dir: Path) -> None:
    args = [
        "generate",
        PROMPT,
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--scale",
        "cat=0.5",
        "--delete",
        "on",
        "--duration",
        "0.7",
        "--max-new-tokens",
        "4",
        "--no-eos",
        "--json",
        "--top",
        "3",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    lm: ContinuousLM = load(str(model_dir), device="cpu")
    signal = lm.signal(PROMPT)
    signal = signal.scale(signal.find("cat"), 0.5).delete(signal.find("on"))
    expected = lm.generate(signal, 4, duration=0.7, probs=3, stop_at_eos=False)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["token_id"] for r in rows] == expected.token_ids
    assert [r["time"] for r in rows] == pytest.approx([signal.end + 0.7 * k for k in range(1, 5)])
    for row, step in zip(rows, expected.steps):
        assert row["probability"] == pytest.approx(step.probability, abs=1e-6)
        assert [t["token_id"] for t in row["top"]] == [i for i, _ in step.top]
        assert [t["token"] for t in row["top"]] == [lm.tokenizer.decode([i]) for i, _ in step.top]
    text = runner.invoke(app, ["generate", PROMPT, "--model", str(model_dir), "--device", "cpu", "-n", "4", "--no-eos"])
    assert (
        text.exit_code == 0 and text.stdout.strip() == lm.generate(lm.signal(PROMPT), 4, stop_at_eos=False).text.strip()
    )
