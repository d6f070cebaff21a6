"""What the command line alone can check is refused up front: one line, exit status 2, before torch loads and before
anything is written, and nothing another process or another run holds is touched.

Digits of other scripts, an --out or a model cache where no directory can be made, an audit to resume that does not
exist, a directory another process holds, a report written over a run's own files, a folder that only looks like a
run (it holds a config.json), and a write that fails in a folder the user can act on.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app
from contllm.errors import RunDirectoryError
from contllm.rundir import files
from contllm.rundir.runs import RunDir
from tests.unit.test_cli_startup import probe
from tests.unit.test_report_unit import counting_result, fake_run

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "contllm"


def cli(*args: str) -> tuple[int, list[str], str]:
    """The real command line in a subprocess: (exit status, its "error: " lines, all it printed)."""
    done = subprocess.run([sys.executable, "-m", "contllm", *args], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    return done.returncode, [line for line in output.splitlines() if line.startswith("error: ")], output


def refused_up_front(args: list[str], says: str, env: dict[str, str] | None = None) -> str:
    """Run the command line in a fresh interpreter: exit 2, one error line holding ``says``, no heavy import."""
    result, output = probe(*args, env=env)
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert result["code"] == 2 and len(errors) == 1, output
    assert says in errors[0], output
    assert "Traceback" not in output and result["heavy"] == [], output
    return errors[0]


# ---------------------------------------------------------------------------- digits


@pytest.mark.parametrize("budget", ["٣m", "３m", "1٠s", "²m", "3m٣0s"])
def test_a_budget_in_digits_of_other_scripts_is_refused(budget: str, tmp_path: Path) -> None:
    refused_up_front(["audit", "smollm2-135m", "--budget", budget, "--out", str(tmp_path / "a")], "--budget takes")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("budget", ["٣m", "３m", "1٠s"])
def test_the_budget_parser_takes_ascii_digits_only(budget: str) -> None:
    from contllm.audits.budget import parse_budget
    from contllm.errors import ExperimentError

    assert parse_budget("3m") == 180.0 and parse_budget("1m30s") == 90.0
    with pytest.raises(ExperimentError, match="--budget takes"):
        parse_budget(budget)


def test_a_character_span_in_digits_of_other_scripts_is_no_span() -> None:
    from contllm.cli.generate import _SPAN

    assert _SPAN.match("3:5") and not _SPAN.match("٣:٥") and not _SPAN.match("３:５")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.value) for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_no_pattern_of_the_package_reads_digits_of_other_scripts() -> None:
    r"""``\d`` in a str pattern matches every script's digits ("٣", "３"); the package writes [0-9], and a digit test is
    ASCII first (str.isdigit() is true of "²" and "٣", which int() then reads or refuses)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _string_constants(path):
            if re.search(r"(?<!\\)\\d", text):
                found.append(f"{path.relative_to(PACKAGE)}:{line}: {text!r}")
        source = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(source, 1):
            for call in ("isdigit()", "isdecimal()", "isnumeric()"):
                if call in line and "isascii()" not in line:
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)


# ---------------------------------------------------------------------------- places where nothing can be made


def test_an_audit_out_in_proc_is_refused_before_the_model_loads() -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    refused_up_front(["audit", "smollm2-135m", "--out", "/proc/contllm-audit"], "cannot create /proc/contllm-audit")


def test_an_audit_out_that_is_a_file_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine")
    refused_up_front(["audit", "smollm2-135m", "--out", str(tmp_path / "file")], "is not a directory")
    assert (tmp_path / "file").read_text() == "mine"


def _cache_places(tmp_path: Path) -> list[str]:
    (tmp_path / "afile").write_text("not a cache")
    places = [str(tmp_path / "afile"), str(tmp_path / "afile" / "below")]
    if Path("/proc/self").is_dir():
        places.append("/proc/contllm-cache")
    return places


@pytest.mark.parametrize(
    "command",
    [
        ["run", "counting", "--model", "smollm2-135m", "--items", "1"],
        ["audit", "smollm2-135m"],
        ["generate", "Hello", "--model", "smollm2-135m"],
    ],
    ids=["run", "audit", "generate"],
)
def test_a_model_cache_where_nothing_can_be_made_is_refused_before_the_model_loads(
    command: list[str], tmp_path: Path
) -> None:
    for place in _cache_places(tmp_path):
        out = tmp_path / "out"
        args = [*command, "--out", str(out)] if command[0] != "generate" else command
        line = refused_up_front(args, "the model cache", env={"CONTLLM_CACHE": place})
        assert place in line and "$CONTLLM_CACHE" in line
        assert not out.exists()
    assert (tmp_path / "afile").read_text() == "not a cache"


def test_a_usable_cache_passes_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from contllm.cli.index import check_cache
    from contllm.errors import ModelLoadError

    monkeypatch.setenv("CONTLLM_CACHE", str(tmp_path / "new" / "cache"))
    check_cache("smollm2-135m")  # a cache that does not exist yet can be made
    check_cache("some/hub-model")  # not an embedded alias: no cache to check
    assert not (tmp_path / "new").exists()  # the check makes nothing
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("CONTLLM_CACHE", str(tmp_path / "afile"))
    with pytest.raises(ModelLoadError, match="cannot hold smollm2-135m"):
        check_cache("smollm2-135m")


# ---------------------------------------------------------------------------- --resume with nothing to resume


@pytest.mark.parametrize("exists", [False, True], ids=["missing", "empty"])
def test_an_audit_resume_with_nothing_to_resume_is_refused(exists: bool, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    if exists:
        out.mkdir()
    refused_up_front(["audit", "smollm2-135m", "--out", str(out), "--resume"], "holds no audit")
    assert out.exists() == exists and (not exists or not any(out.iterdir()))


# ---------------------------------------------------------------------------- a directory another process holds


def test_an_audit_directory_another_process_holds_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from contllm.rundir.locks import Reservation

    out = tmp_path / "audit"
    held = Reservation(out)
    try:
        for extra in ([], ["--resume"], ["--force"]):
            line = refused_up_front(["audit", "smollm2-135m", "--out", str(out), *extra], "another contllm audit")
            assert f"pid {os.getpid()}" in line
        assert [p.name for p in out.iterdir()] == [".lock"]  # nothing written beside the holder's lock
    finally:
        held.release()
    assert not out.exists()  # a reservation that held nothing leaves nothing


def test_a_run_resumed_while_another_process_holds_it_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunDir(run, {"experiment": "counting", "model": "smollm2-135m"}) as held:
        held.save_record("a", {"x": 1})
        line = refused_up_front(
            ["run", "counting", "--model", "smollm2-135m", "--out", str(run), "--resume"], "another contllm process"
        )
        assert f"pid {os.getpid()}" in line


def test_a_run_reserves_its_directory_before_the_model_loads_and_leaves_nothing_when_refused(tmp_path: Path) -> None:
    from contllm.rundir.locks import Reservation

    out = tmp_path / "deep" / "run"
    first = RunDir(out, {"experiment": "counting"}).reserve()
    try:
        assert [p.name for p in out.iterdir()] == [".lock"]
        with pytest.raises(RunDirectoryError, match="another contllm process"):
            RunDir(out, {"experiment": "counting"})  # what a second process checks before its model loads
        with pytest.raises(RunDirectoryError, match="another contllm process"):
            Reservation(out)
    finally:
        first.close()
    assert not (tmp_path / "deep").exists()  # reserved, never opened: the folders it made are gone


# ---------------------------------------------------------------------------- --force and what is a run


def test_a_report_never_writes_over_a_run_even_with_force(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", counting_result("tiny-a", np.linspace(0.1, 1.0, 6)))
    b = fake_run(tmp_path / "b", counting_result("tiny-b", np.linspace(0.2, 1.0, 6)))
    (b / "explorer.html").write_text("<p>b's own explorer</p>")
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    code, errors, output = cli("report", str(a), "--out", str(b), "--force")
    assert code == 2 and len(errors) == 1 and "is a run directory" in errors[0], output
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == before


def test_report_force_replaces_only_what_a_report_wrote(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", counting_result("tiny-a", np.linspace(0.1, 1.0, 6)))
    b = fake_run(tmp_path / "b", counting_result("tiny-b", np.linspace(0.2, 1.0, 6)))
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "explorer.html").write_text("my own page")
    code, errors, output = cli("report", str(a), str(b), "--out", str(folder), "--force")
    assert code == 2 and len(errors) == 1 and "which no report wrote" in errors[0], output
    assert (folder / "explorer.html").read_text() == "my own page"
    report = tmp_path / "report"
    assert CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(report)]).exit_code == 0
    again = CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(report), "--force"])
    assert again.exit_code == 0, again.output  # a report's own files are replaced


def _cache_entry(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "contllm_record.json").write_text(json.dumps({"format": 1}))
    (path / "model.safetensors").write_bytes(b"\0" * 16)
    return path


@pytest.mark.parametrize("mode", ["--force", "--resume", None])
def test_a_model_cache_entry_is_no_run(mode: str | None, tmp_path: Path) -> None:
    from contllm.rundir.runs import is_run_dir

    entry = _cache_entry(tmp_path / "cache" / "smollm2-135m")
    before = {p: p.read_bytes() for p in entry.iterdir()}
    assert not is_run_dir(entry)
    args = ["run", "counting", "--model", "smollm2-135m", "--out", str(entry), *([mode] if mode else [])]
    code, errors, output = cli(*args)  # refused as the run's directory is checked, before the model loads
    assert code == 2 and len(errors) == 1 and "loaded" not in output, output
    assert "not a run directory (it is a contllm model cache entry)" in errors[0] and "None" not in errors[0]
    assert {p: p.read_bytes() for p in entry.iterdir()} == before


def test_a_run_is_recognised_by_its_manifest_or_its_items(tmp_path: Path) -> None:
    from contllm.rundir.runs import is_run_dir

    with RunDir(tmp_path / "run", {"experiment": "counting"}):
        pass
    assert is_run_dir(tmp_path / "run")  # config.json and items/, as a run opens
    (tmp_path / "run" / "config.json").unlink()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    assert is_run_dir(tmp_path / "run")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert not is_run_dir(tmp_path / "model")


# ---------------------------------------------------------------------------- a write that fails


@pytest.mark.parametrize("fails", ["mkstemp", "replace"])
def test_a_failed_write_names_the_file_and_its_folder_not_a_temporary_name(
    fails: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run" / "items"
    folder.mkdir(parents=True)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(folder / ".count-010.json._9we7d_c.tmp"))

    monkeypatch.setattr(tempfile if fails == "mkstemp" else files.os, fails, denied)
    with pytest.raises(PermissionError) as caught:
        files.atomic_write_json(folder / "count-010.json", {"id": "count-010"})
    message = str(caught.value)
    assert f"cannot write count-010.json in {folder}" in message and "Permission denied" in message
    assert ".tmp" not in message and caught.value.filename is None
    monkeypatch.undo()
    assert list(folder.iterdir()) == []  # no temporary file left behind


def test_a_figure_that_cannot_be_written_names_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    from contllm.plotting import save_figure

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / ".summary.png.x.tmp.png"))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError, match=f"cannot write summary.png in {re.escape(str(tmp_path))}"):
        save_figure(plt.figure(), tmp_path / "summary", formats=("png",))
