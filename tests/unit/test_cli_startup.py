"""The command line answers at once: help pages and --version import no torch, transformers or matplotlib.

Help reads the experiments' declarations from contllm/cli_index.json; the index must
equal what the experiments declare (regenerate it with ``python -m contllm.cli_index``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from importlib import metadata

import pytest
from typer.testing import CliRunner

import contllm
from contllm import cli_index, logs, registry
from contllm.cli import app

pytestmark = pytest.mark.unit

HEAVY = ("torch", "transformers", "matplotlib")

# Runs the command line in a fresh interpreter and reports which heavy packages it imported.
PROBE = """
import json, sys
args, watched = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
from contllm.cli import main
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


def probe(*args: str) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args)), json.dumps(HEAVY)],
        capture_output=True, text=True, timeout=120,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("PROBE "), done.stdout + done.stderr
    return json.loads(last[len("PROBE "):]), done.stdout


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
    # The probe can see heavy imports: a bad option of a real run is checked by the experiment itself.
    result, output = probe("run", "counting", "--samples", "ten", "--out", "/nonexistent/never-written")
    assert result["code"] == 2, output
    assert "torch" in result["heavy"]


def test_the_index_equals_the_experiments_declarations() -> None:
    held = json.loads(cli_index.INDEX_PATH.read_text(encoding="utf-8"))
    assert held == json.loads(json.dumps(cli_index.build())), (
        "contllm/cli_index.json differs from the experiments' declarations; "
        "rewrite it with `python -m contllm.cli_index`"
    )


def test_help_pages_from_the_index_equal_those_of_the_imported_experiments() -> None:
    from contllm.cli import experiment_command

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
    assert "--dtype [float32|bfloat16|float16]" in page and "[default: float32]" in flat
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
    from contllm.runner import context_for

    context = context_for(object(), evaluate=lambda signals: None)
    with caplog.at_level(logging.INFO, logger="contllm"):
        context.say("three items left")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("contllm", logging.INFO, "three items left")]
    with caplog.at_level(logging.WARNING, logger="contllm"):
        caplog.clear()
        context.say("not shown")
    assert caplog.records == []
