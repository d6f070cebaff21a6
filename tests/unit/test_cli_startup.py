"""The command line answers at once: help pages and --version import no torch, transformers or matplotlib.

Help reads the experiments' declarations from contllm/cli/index.json; the index must
equal what the experiments declare (regenerate it with ``python -m contllm.cli.index``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import contllm
from contllm import logs, registry
from contllm.cli import index as cli_index
from contllm.cli.commands import app

pytestmark = pytest.mark.unit

HEAVY = ("torch", "transformers", "matplotlib")

# Runs the command line in a fresh interpreter and reports which heavy packages it imported.
PROBE = """
import json, sys
args, watched = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
from contllm.cli.commands import main
sys.argv = ["contllm", *args]
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
heavy = sorted({m.split(".")[0] for m in sys.modules} & watched)
print("PROBE " + json.dumps({"code": code, "heavy": heavy}))
"""


def probe(*args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """The command line in a fresh interpreter (with ``env`` added to the environment): its exit code, the heavy
    packages it imported, and what it wrote to stdout and stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args)), json.dumps(HEAVY)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("PROBE "), done.stdout + done.stderr
    return json.loads(last[len("PROBE "):]), done.stdout + done.stderr


@pytest.mark.parametrize(
    "args,shows",
    [
        (["--help"], "Commands:"),
        (["run", "--help"], "Experiments:"),
        (["run", "counting", "--help"], "--samples INTEGER"),
        (["run", "boolean", "--help"], "--method [linear|slerp]"),
        (["models", "--help"], "--cache-dir"),
        (["report", "--help"], "--out"),
        (["figures", "--help"], "--formats"),
        (["audit", "--help"], "--budget TIME"),
        (["run", "counting", "--help"], "--formats [png|pdf],..."),
        (["--version"], f"contllm {contllm.__version__}"),
    ],
)
def test_help_and_version_import_nothing_heavy(args: list[str], shows: str) -> None:
    result, output = probe(*args)
    assert result["code"] == 0, output
    assert shows in output
    assert result["heavy"] == [], f"contllm {' '.join(args)} imported {result['heavy']}"


def test_a_run_does_import_the_experiment() -> None:
    # The probe can see heavy imports: a value only the experiment can judge is checked by it.
    result, output = probe("run", "counting", "--range", "0,1", "--samples", "2", "--out", "/nonexistent/never-written")
    assert result["code"] == 2 and "duration factors must be positive" in output, output
    assert "torch" in result["heavy"]


#: Usage errors of every command: each is one line, exit status 2, before torch is imported.
USAGE_ERRORS = [
    (["bogus"], "No such command 'bogus'"),
    (["--bogus"], "No such option: --bogus"),
    (["report"], "Missing argument 'RUN_DIR...'"),
    (["report", "somewhere"], "Missing option '--out'"),
    (["figures"], "Missing argument 'RUN_DIR'"),
    (["figures", "somewhere", "--formats", "jpg"], "unknown figure format 'jpg'"),
    (["models", "--bogus"], "No such option: --bogus"),
    (["run", "juggling"], "unknown experiment 'juggling'"),
    (["run", "counting", "--bogus"], "option(s) --bogus do not apply to the counting experiment"),
    (["run", "counting", "--samples"], "Option '--samples' requires an argument"),
    (["run", "counting", "--samples", "ten"], "--samples must be an integer, got 'ten'"),
    (["run", "counting", "--samples", "\u00b2"], "--samples must be an integer"),
    (["run", "counting", "--seed", "\u0662"], "--seed must be an integer"),
    (["run", "counting", "--seed", "99999999999999999999999"], "--seed must be an integer from 0 to"),
    (["run", "counting", "--range", "1,2,3"], "--range must be 'MIN,MAX'"),
    (["run", "counting", "--range", "5e-324,1e-300"], "too close to 0"),
    (["run", "counting", "--items", "0"], "item count must be positive"),
    (["run", "counting", "--formats", "jpg"], "unknown figure format 'jpg'"),
    (["run", "counting", "--max-batch-tokens", "x"], "--max-batch-tokens must be an integer"),
    (["run", "counting", "--device-map", "everywhere"], "unknown device_map 'everywhere'"),
    (["run", "counting", "--dtype", "int8"], "dtype must be a name (float32, fp32, bfloat16"),
    (["run", "counting", "--resume", "--force"], "--resume and --force contradict each other"),
    (["run", "counting", "--out", "/dev/null/run"], "is not a directory"),
    (["run", "boolean", "--method", "cubic"], "--method must be 'linear' or 'slerp'"),
    (["run", "depth", "--eps", "small"], "--eps must be a number"),
    (["run", "pde", "--times", "nan"], "must be a finite number"),
    (["generate"], "Missing argument 'PROMPT'"),
    (["generate", "hi", "--bogus"], "No such option '--bogus'"),
    (["generate", "hello there", "--sample", "--seed", "99999999999999999999999", "-n", "2"], "--seed must be an"),
    (["generate", "hello there", "-n", "\u0662"], "--max-new-tokens must be an integer"),
    (["generate", "hello there", "--duration", "1e30"], "past 1e+07"),
    (["generate", "hello there", "--duration", "1e6", "-n", "12"], "past 1e+07"),
    (["generate", "hello there", "--scale", "there=1e30"], "the factor must lie in 0..1e+07"),
    (["generate", "hello there", "--duration", "1e-320"], "too close to 0"),
]


@pytest.mark.parametrize("args,shows", USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_usage_errors_are_one_line_before_torch_is_imported(args: list[str], shows: str) -> None:
    result, output = probe(*args)
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("PROBE ")]
    assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: ") and shows in lines[0], output
    assert result["heavy"] == [], f"contllm {' '.join(args)} imported {result['heavy']} before its usage error"


def test_a_spec_with_a_malformed_value_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    for text, shows in (("models = [", "is not valid TOML"),
                        ("[[experiment]]\nname = 'counting'\nsamples = 'ten'\n", "--samples must be an integer"),
                        ("[[experiment]]\nname = 'boolean'\nmethod = 'cubic'\n", "--method must be 'linear'"),
                        ("[[experiment]]\nname = 'counting'\n[[experiment]]\nname = 'juggling'\n", "name must be")):
        spec.write_text(text)
        result, output = probe("run", str(spec), "--out", str(tmp_path / "o"))
        assert result["code"] == 2 and shows in output and result["heavy"] == [], (text, output, result)
    spec.write_text("[[experiment]]\nname = 'counting'\n")
    result, output = probe("run", str(spec), "--formats", "jpg", "--out", str(tmp_path / "o"))
    assert result["code"] == 2 and "unknown figure format" in output and result["heavy"] == [], output


def test_the_index_equals_the_experiments_declarations() -> None:
    held = json.loads(cli_index.INDEX_PATH.read_text(encoding="utf-8"))
    assert held == json.loads(json.dumps(cli_index.build())), (
        "contllm/cli/index.json differs from the experiments' declarations; "
        "rewrite it with `python -m contllm.cli.index`"
    )


def test_help_pages_from_the_index_equal_those_of_the_imported_experiments() -> None:
    from contllm.cli.run import experiment_command

    for name in registry.names():
        fast = experiment_command(name, indexed=True)
        slow = experiment_command(name, indexed=False)
        assert [p.opts for p in fast.params] == [p.opts for p in slow.params], name
        assert fast.help == slow.help, name


def test_option_types_and_defaults_show() -> None:
    page = CliRunner().invoke(app, ["run", "counting", "--help"]).output
    flat = " ".join(page.split())
    assert "--samples INTEGER" in page and "--range MIN,MAX" in page
    assert "--seed INTEGER" in page and "--max-batch-tokens INTEGER" in page
    assert "--dtype [float32|bfloat16|float16|auto]" in page and "[default: float32]" in flat
    default_model = cli_index.models(indexed=False)[0]  # read from contllm.models, not from the index
    assert default_model == "qwen2.5-coder-0.5b" and f"[default: {default_model}]" in flat
    assert " TEXT " not in page.split("--samples")[1].split("\n")[0]


def test_version_is_the_installed_distributions() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"contllm {metadata.version('contllm')}"


def test_quiet_and_verbose_set_the_contllm_loggers_level() -> None:
    try:
        for flag, level in (("-q", logging.WARNING), ("-v", logging.DEBUG), (None, logging.INFO)):
            args = [flag, "models", "--help"] if flag else ["models", "--help"]
            assert CliRunner().invoke(app, args).exit_code == 0
            assert logs.LOGGER.level == level, flag
        both = CliRunner().invoke(app, ["-q", "-v", "models", "--help"])
        assert both.exit_code == 2 and "exclude each other" in both.output
    finally:
        logs.LOGGER.setLevel(logging.NOTSET)
        for handler in [h for h in logs.LOGGER.handlers if not isinstance(h, logging.NullHandler)]:
            logs.LOGGER.removeHandler(handler)


def test_news_goes_through_the_contllm_logger(caplog: pytest.LogCaptureFixture) -> None:
    from contllm.rundir.runner import context_for

    context = context_for(object(), evaluate=lambda signals: None)
    with caplog.at_level(logging.INFO, logger="contllm"):
        context.say("three items left")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("contllm", logging.INFO, "three items left")]
    with caplog.at_level(logging.WARNING, logger="contllm"):
        caplog.clear()
        context.say("not shown")
    assert caplog.records == []
