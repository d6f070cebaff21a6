"""Generated bad input: the command line's option values and the dataset readers never crash.

Hypothesis draws option values (numbers of every size and spelling, odd text, lists,
ranges) for every experiment's options and the run options, and dataset files of every
layout (valid rows, broken JSON, deep nesting, stray bytes). Each command must exit 0 or
2, with at most one line on stderr for 2 and never a traceback, and touch nothing
outside its output root; each dataset must read into rows or raise the toolkit's own
error. The model named is an empty directory, so no command loads one: every check that
needs no model is exercised, and a command that passes them all stops at the model with
one line. The number of examples is bounded so that the file runs in well under two
minutes on two cores.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from contllm import registry
from contllm.cli.commands import app
from contllm.data.user import read_rows
from contllm.errors import ContllmError

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=250, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: Text a shell can pass as one argument: no NUL byte, no lone surrogate.
ARGUMENT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
#: Spellings a user might type, and ones a careless or hostile user might.
ODD_NUMBERS = st.sampled_from(["0", "-0", "1", "2", "+-5", "\u00b2", "\u0663", "9" * 5000, "9" * 25, "1e-320", "1e308",
                               "0x10", "1_000", " 3 ", "3.", ".5", "-1e9", "2e7", "nan", "inf", "-1"])
NUMBER = st.one_of(st.integers(-(10**40), 10**40).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   ODD_NUMBERS)
VALUE = st.one_of(
    ODD_NUMBERS,
    NUMBER,
    ARGUMENT,
    st.lists(NUMBER, min_size=0, max_size=4).map(",".join),
    st.sampled_from(["", ",", "a,b", "{words!r}", "{words", "{a} {b} {op}", "AND,OR", "linear", "slerp", "../x",
                     "count-001", "count-001,count-001", "a/b", ".y.tmp", "x" * 3000, "meta", "xla", "cuda:x",
                     "nested.json", "broken.jsonl", "rows.csv", "missing.json"]),
)
#: Files the values above may name (in the working directory, which must stay as it is).
FILES = {"nested.json": "[" * 5000 + "]" * 5000, "broken.jsonl": '{"word": "apple", "n": 3}\n{"word": ',
         "rows.csv": "word,n\napple,99999999999999999999999\n"}
RUN_FLAGS = ["--seed", "--items", "--device", "--dtype", "--max-batch-tokens", "--device-map"]


def _flags(name: str) -> list[str]:
    """The flags of experiment ``name`` that take a value: its own options and the run options."""
    experiment = registry.get(name)
    own = [o.cli_flag for o in experiment.options if o.kind != "bool"]
    return own + [flag for flag in RUN_FLAGS if experiment.engine or flag not in ("--max-batch-tokens", "--device-map")]


#: (experiment, the options given): one to three of its flags, each with a drawn value.
COMMAND = st.sampled_from(registry.names()).flatmap(
    lambda name: st.tuples(st.just(name), st.lists(st.tuples(st.sampled_from(_flags(name)), VALUE), min_size=1, max_size=3))
)


def _tree(path: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under ``path``: modification time and bytes."""
    return {str(p.relative_to(path)): (p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(path.rglob("*"))}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a file that must stay as it is, an empty model directory, the output root and a working directory."""
    box = tmp_path_factory.mktemp("fuzz")
    (box / "outside.txt").write_text("untouched")
    (box / "nomodel").mkdir()
    (box / "root").mkdir()
    (box / "cwd").mkdir()
    for name, text in FILES.items():
        (box / "cwd" / name).write_text(text)
    return box


@FUZZ
@given(command=COMMAND)
def test_generated_option_values_exit_0_or_2_in_one_line_and_touch_nothing_outside(
    sandbox: Path, command: tuple[str, list[tuple[str, str]]]
) -> None:
    name, chosen = command
    args = ["run", name]
    for flag, value in chosen:
        args += [flag, value]
    args += ["--model", str(sandbox / "nomodel"), "--out", str(sandbox / "root" / "run")]
    outside = {k: v for k, v in _tree(sandbox).items() if not k.startswith("root")}
    here = os.getcwd()
    os.chdir(sandbox / "cwd")
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(here)
    assert result.exit_code in (0, 2), (args, result.output, result.exception)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 2:
        assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 1, result.stderr
    assert {k: v for k, v in _tree(sandbox).items() if not k.startswith("root")} == outside


ROW = st.dictionaries(
    st.sampled_from(["id", "text", "question", "answer", "truth", "words", "spans", "a", "b", "x", "items", "pairs"]),
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(), ARGUMENT,
              st.lists(st.one_of(st.integers(-5, 50), ARGUMENT), max_size=4)),
    max_size=6,
)
DOCUMENT = st.one_of(
    st.lists(ROW, max_size=4).map(json.dumps),
    st.dictionaries(st.sampled_from(["items", "rows"]), st.lists(ROW, max_size=3), max_size=2).map(json.dumps),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 3000).map(lambda n: '{"items": ' + "[" * n + "]" * n + "}"),
    ARGUMENT,
    st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
    st.lists(ROW, max_size=4).map(lambda rows: "\n".join(json.dumps(r) for r in rows)),
    st.lists(st.lists(ARGUMENT, min_size=1, max_size=4), max_size=4).map(lambda rows: "\n".join(",".join(r) for r in rows)),
)
DATA_EXPERIMENTS = [name for name in registry.names() if any(o.name == "data" for o in registry.get(name).options)]


@FUZZ
@given(text=DOCUMENT, suffix=st.sampled_from([".json", ".jsonl", ".csv"]), experiment=st.sampled_from(DATA_EXPERIMENTS))
def test_generated_dataset_files_read_or_raise_the_toolkits_error(text: str, suffix: str, experiment: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"items{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            rows = read_rows(path)
        except ContllmError as exc:
            assert str(exc) and "\n" not in str(exc)
        else:
            assert rows
        try:
            registry.get(experiment).config({"data": str(path)})
        except ContllmError as exc:
            assert str(exc)
