"""Bad input on the command line and in spec files: one line, exit status 2, and nothing on disk changes.

Every case here is refused before a model loads, so the table runs in the unit tier. The
output root holds a finished-looking run and a file of the user's; after each refused
command every byte and every modification time under it is as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contllm.cli.commands import app

pytestmark = pytest.mark.unit

CLI_CASES = [
    # experiments and run options
    (["run", "juggling"], "unknown experiment 'juggling'"),
    (["run", "counting", "--samples", "ten"], "--samples must be an integer"),
    (["run", "counting", "--samples", "0"], "samples must be an integer >= 1"),
    (["run", "counting", "--samples", "-3"], "samples must be an integer >= 1"),
    (["run", "counting", "--samples", "10000000"], "samples must be at most 10000"),
    (["run", "counting", "--samples", "1"], "one sample needs a range with min == max"),
    (["run", "counting", "--range", "0.5,0.5"], "range 0.5,0.5 holds one value"),
    (["run", "counting", "--range", "nan,1"], "--range must be finite"),
    (["run", "counting", "--range", "0.1,inf"], "--range must be finite"),
    (["run", "counting", "--range", "1,2,3"], "--range must be 'MIN,MAX'"),
    (["run", "counting", "--range", "a,b"], "--range must be two numbers"),
    (["run", "counting", "--range", "2,1"], "range min 2.0 is larger than max 1.0"),
    (["run", "counting", "--range", "0,1"], "duration factors must be positive"),
    (["run", "counting", "--template", "{words"], "malformed template"),
    (["run", "counting", "--template", "plain"], "the template has no {words} field"),
    (["run", "counting", "--template", "\udcff {words}"], "the template is not valid UTF-8 text"),
    (["run", "counting", "--items", "0"], "item count must be positive"),
    (["run", "counting", "--items", "999"], "asked for 999 items but the dataset has 130"),
    (["run", "counting", "--items", "count-001,nope"], "unknown item id 'nope'"),
    (["run", "counting", "--items", ","], "item spec lists no ids"),
    (["run", "counting", "--seed", "abc"], "--seed must be an integer, got 'abc'"),
    (["run", "counting", "--seed", "\u0662"], "--seed must be an integer, got '\u0662'"),
    (["run", "counting", "--seed", "1_0"], "--seed must be an integer, got '1_0'"),
    (["run", "counting", "--max-batch-tokens", "\u0663"], "--max-batch-tokens must be an integer"),
    (["run", "counting", "--items", "\u0662"], "unknown item id '\u0662'"),
    (["run", "counting", "--samples", "1_0"], "--samples must be an integer, got '1_0'"),
    (["run", "counting", "--range", "0.5,1_0"], "--range must be two numbers"),
    (["run", "counting", "--range", "5e-324,1e-300"], "--range: '5e-324' is too close to 0"),
    (["run", "counting", "--range", "0.5,\u0661"], "--range must be two numbers"),
    (["run", "counting", "--max-batch-tokens", "0"], "--max-batch-tokens must be an integer >= 1"),
    (["run", "counting", "--max-batch-tokens", "-5"], "--max-batch-tokens must be an integer >= 1"),
    (["run", "counting", "--device-map", "everywhere"], "unknown device_map 'everywhere'"),
    (["run", "counting", "--event", "2"], "option(s) --event do not apply to the counting experiment"),
    (["run", "counting", "--eps", "0.1"], "option(s) --eps do not apply to the counting experiment"),
    (["run", "counting", "--resume", "--force"], "--resume and --force contradict each other"),
    (["run", "events", "--event", "-1"], "event must be 0"),
    (["run", "events", "--event", "99"], "event 99 does not exist"),
    (["run", "events", "--event", "two"], "--event must be an integer"),
    (["run", "boolean", "--operators", "AND"], "at least two different operators"),
    (["run", "boolean", "--operators", "AND,NOPE"], "unknown Boolean operator 'NOPE'"),
    (["run", "boolean", "--method", "cubic"], "method must be 'linear' or 'slerp'"),
    (["run", "boolean", "--range", "-0.5,1"], "alpha range must lie within 0,1"),
    (["run", "boolean", "--template", "{a} {b}"], "the template has no {op} field"),
    (["run", "depth", "--eps", "0"], "eps"),
    (["run", "depth", "--eps", "small"], "eps must be a number"),
    (["run", "depth", "--alphas", "3"], "alpha"),
    (["run", "depth", "--layer", "a"], "layer must be an integer"),
    (["run", "depth", "--items", "nowhere"], "unknown item id 'nowhere'"),
    (["run", "depth", "--max-batch-tokens", "64"], "option(s) --max-batch-tokens do not apply to the depth experiment"),
    (["run", "pde", "--times", "-1"], "pseudo-times must be finite and >= 0"),
    (["run", "pde", "--times", "nan"], "times must be a finite number"),
    (["run", "pde", "--dynamics", "reaction", "--times", "1e9"], "T must be at most 2500"),
    (["run", "pde", "--dynamics", "explosion"], "dynamics must be one of"),
    (["run", "pde", "--variants", "colour"], "unknown variant(s) colour"),
    (["run", "pde", "--long-range", "0"], "long_range must be >= 1"),
    (["run", "pde", "--spacing", "log"], "spacing must be one of"),
    (["run", "pde", "--items", "stock-T7"], "unknown item id 'stock-T7'"),
    (["run", "pde", "--samples", "3"], "option(s) --samples do not apply to the pde experiment"),
    (["report"], "Missing argument 'RUN_DIR...'"),
    (["figures"], "Missing argument 'RUN_DIR'"),
    (["report", "somewhere"], "Missing option '--out'"),
    (["nonsense"], "No such command 'nonsense'"),
]

SPEC_CASES = [
    ("models = [", "is not valid TOML"),
    ("colour = 3\n[[experiment]]\nname = 'counting'\n", "unknown key(s) colour"),
    ("models = []\n[[experiment]]\nname = 'counting'\n", "'models' must be a non-empty list"),
    ("models = [3]\n[[experiment]]\nname = 'counting'\n", "'models' must be a non-empty list"),
    ("[[experiment]]\nname = 'juggling'\n", "name must be one of counting, events, boolean, depth, pde"),
    ("[[experiment]]\nname = 'counting'\nlabel = '..'\n", "label '..' must be a plain directory name"),
    ("[[experiment]]\nname = 'counting'\nlabel = '../escape'\n", "must be a plain directory name"),
    ("[[experiment]]\nname = 'counting'\nlabel = 7\n", "label 7 must be a plain directory name"),
    ("[[experiment]]\nname = 'counting'\nsamples = 'ten'\n", "--samples must be an integer, got 'ten'"),
    ("[[experiment]]\nname = 'counting'\nsamples = 3.7\n", "--samples must be an integer, got 3.7"),
    ("[[experiment]]\nname = 'counting'\nsamples = true\n", "--samples must be an integer, got True"),
    ("[[experiment]]\nname = 'counting'\nsamples = 100000000\n", "samples must be at most 10000"),
    ("[[experiment]]\nname = 'counting'\nchat = 'no'\n", "--chat must be true or false"),
    ("seed = 'abc'\n[[experiment]]\nname = 'counting'\n", "'seed' must be an integer"),
    ("out = 42\n[[experiment]]\nname = 'counting'\n", "'out' must be a string"),
    ("dtype = 16\n[[experiment]]\nname = 'counting'\n", "'dtype' must be a string"),
    ("item_figures = 'no'\n[[experiment]]\nname = 'counting'\n", "'item_figures' must be true or false"),
    ("max_batch_tokens = -5\n[[experiment]]\nname = 'counting'\n", "'max_batch_tokens' must be >= 1"),
    ("[[experiment]]\nname = 'counting'\nitems = 1.5\n", "'items' must be a count or a string of ids"),
    ("[[experiment]]\nname = 'counting'\nrange = [0.2]\n", "must be 'MIN,MAX'"),
    ("[[experiment]]\nname = 'events'\nevent = 99\n", "event 99 does not exist"),
    ("[[experiment]]\nname = 'boolean'\noperators = 'AND'\n", "at least two different operators"),
    ("[[experiment]]\nname = 'pde'\ntimes = [1, -2]\n", "pseudo-times must be finite and >= 0"),
    ("[[experiment]]\nname = 'depth'\nsamples = 3\n", "unknown key(s) samples"),
]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An output root that holds a finished-looking run and a file of the user's."""
    run = tmp_path / "root" / "smollm2-135m" / "counting"
    (run / "items").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"experiment": "counting", "model": "smollm2-135m"}))
    (run / "manifest.json").write_text(json.dumps({"status": "finished"}))
    (run / "items" / "count-001.json").write_text('{"id": "count-001", "record": {}}')
    (tmp_path / "root" / "notes.txt").write_text("keep me")
    return tmp_path / "root"


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def refused(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args,needle", CLI_CASES, ids=[" ".join(a[:3]) for a, _ in CLI_CASES])
def test_a_bad_command_line_is_one_line_and_changes_nothing(args: list[str], needle: str, root: Path) -> None:
    before = snapshot(root)
    out = ["--out", str(root / "new")] if args[0] == "run" and len(args) > 1 else []
    result = CliRunner().invoke(app, [*args, *out])
    refused(result, needle)
    assert result.output.startswith("error: ")
    assert snapshot(root) == before


@pytest.mark.parametrize("text,needle", SPEC_CASES)
def test_a_bad_spec_is_one_line_and_changes_nothing(text: str, needle: str, root: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    before = snapshot(root)
    refused(CliRunner().invoke(app, ["run", str(spec), "--out", str(root)]), needle)
    assert snapshot(root) == before


def test_force_into_a_directory_of_other_runs_changes_nothing(root: Path) -> None:
    (root / "config.json").write_text(json.dumps({"experiment": "counting", "model": "m"}))
    before = snapshot(root)
    refused(CliRunner().invoke(app, ["run", "counting", "--out", str(root), "--force"]), "it holds other runs")
    assert snapshot(root) == before


def test_force_over_a_run_of_another_experiment_changes_nothing(root: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    before = snapshot(root)
    refused(CliRunner().invoke(app, ["run", "events", "--out", str(run), "--force"]), "it is a run of 'counting'")
    assert snapshot(root) == before


def test_an_out_under_a_file_is_refused_before_anything_loads(root: Path) -> None:
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--out", str(root / "notes.txt" / "run")])
    refused(result, "notes.txt is not a directory")
    assert "loaded" not in result.output and snapshot(root) == before


# ---------------------------------------------------------------------------- values refused before the model loads

EARLY_CASES = {
    "samples-superscript": (["run", "counting", "--samples", "\u00b2"], "--samples must be an integer"),
    "samples-two-signs": (["run", "counting", "--samples", "+-5"], "--samples must be an integer"),
    "samples-5000-digits": (["run", "counting", "--samples", "9" * 5000], "--samples must be an integer"),
    "seed-past-2**63": (["run", "counting", "--seed", "99999999999999999999999"], "seed must be an integer from 0"),
    "range-factor-past-1e7": (["run", "counting", "--range", "0.5,2e7", "--samples", "2"], "--range must lie within"),
    "range-1e308": (["run", "counting", "--range", "1e308,1e308", "--samples", "1"], "--range must lie within"),
    "eps-subnormal": (["run", "depth", "--eps", "1e-320"], "too close to 0"),
    "translation-range": (["run", "translation", "--range", "-1e9,1e9"], "--range must lie within"),
    "device-meta": (["run", "counting", "--device", "meta"], "device 'meta' cannot hold a model"),
    "device-xla": (["run", "counting", "--device", "xla"], "device 'xla' cannot hold a model"),
    "template-conversion": (["run", "counting", "--template", "{words!r}", "--samples", "2"],
                            "template fields take no conversion or format, got {words!r}"),
    "attribution-first-past-the-dataset": (["run", "attribution", "--first", "100000", "--steps", "8"],
                                           "--first 100000: the counting dataset has 130 items"),
}


@pytest.mark.parametrize("args,needle", EARLY_CASES.values(), ids=EARLY_CASES.keys())
def test_a_value_that_fails_only_in_the_model_is_refused_before_it_loads(args: list[str], needle: str, root: Path) -> None:
    before = snapshot(root)
    result = CliRunner().invoke(app, [*args, "--items", "1", "--out", str(root / "new")])
    refused(result, needle)
    assert "loaded" not in result.output and snapshot(root) == before


def test_a_very_long_value_is_quoted_not_echoed(root: Path) -> None:
    result = CliRunner().invoke(app, ["run", "counting", "--items", "x" * 100_000, "--out", str(root / "new")])
    refused(result, "unknown item id")
    assert len(result.output) < 500


@pytest.mark.parametrize("out,needle", [("", "must be a path"), ("dangling", "symbolic link to nothing"),
                                        ("/proc/contllm-run", "cannot create")])
def test_an_out_that_cannot_hold_a_run_is_refused_before_the_model_loads(out: str, needle: str, tmp_path: Path) -> None:
    if out == "dangling":
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
        out = str(tmp_path / "dangling")
    result = CliRunner().invoke(app, ["run", "counting", "--items", "1", "--samples", "2", "--out", out])
    refused(result, needle)
    assert "loaded" not in result.output and not (tmp_path / "nowhere").exists()


def test_a_linked_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    run, victim = tmp_path / "R", tmp_path / "V"
    run.mkdir()
    victim.write_text("precious\n")
    (run / ".lock").symlink_to(victim)
    result = CliRunner().invoke(app, ["run", "counting", "--items", "1", "--samples", "2", "--out", str(run)])
    refused(result, ".lock is a symbolic link")
    assert victim.read_text() == "precious\n"


NESTED = "[" * 200_000 + "]" * 200_000


def test_a_deeply_nested_data_file_is_one_line(root: Path, tmp_path: Path) -> None:
    data = tmp_path / "items.json"
    data.write_text(NESTED)
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--data", str(data), "--out", str(root / "new")])
    refused(result, "nested too deeply")
    assert snapshot(root) == before


def test_a_deeply_nested_config_is_one_line_on_resume(root: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    (run / "config.json").write_text(NESTED)
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--resume", "--items", "1", "--out", str(run)])
    refused(result, "nested too deeply")
    assert snapshot(root) == before


def test_a_deeply_nested_results_file_is_one_line_in_report(root: Path, tmp_path: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    (run / "results.json").write_text(NESTED)
    (run / "manifest.json").write_text(json.dumps({"status": "finished"}))
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "report")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "nested too deeply" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [b"", b"\x00" * 40])
def test_a_model_with_an_empty_or_corrupt_weights_file_is_one_line(content: bytes, tmp_path: Path, root: Path) -> None:
    from contllm.models import cache_root

    source = cache_root() / "smollm2-135m"
    if not (source / "config.json").is_file():
        pytest.skip("smollm2-135m is not converted")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((source / name).read_bytes())
    (model / "model.safetensors").write_bytes(content)
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--model", str(model), "--items", "1", "--samples", "2",
                                      "--out", str(root / "new")])
    refused(result, "not valid safetensors")
    assert snapshot(root) == before


SPEC_COLLISIONS = {
    "same-directory-name": ("models = ['/x/a/smol', '/x/b/smol']\n", "would share the directory 'smol'"),
    "same-model-twice": ("models = ['smollm2-135m', 'smollm2-135m']\n", "model 'smollm2-135m' is listed twice"),
    "unknown-second-model": ("models = ['smollm2-135m', 'no-such-model']\n", "unknown model 'no-such-model'"),
    "label-300-characters": ("models = ['smollm2-135m']\nlabel = '" + "l" * 300 + "'\n", "at most 100 characters"),
}


@pytest.mark.parametrize("head,needle", SPEC_COLLISIONS.values(), ids=SPEC_COLLISIONS.keys())
def test_a_spec_is_checked_whole_before_the_first_model_loads(head: str, needle: str, root: Path, tmp_path: Path) -> None:
    label = ""
    if "label" in head:
        head, label = head.split("\n", 1)[0] + "\n", head.split("\n", 1)[1]
    spec = tmp_path / "spec.toml"
    spec.write_text(f"{head}[[experiment]]\nname = 'counting'\nitems = 1\nsamples = 2\n{label}")
    before = snapshot(root)
    for extra in ([], ["--force"]):
        result = CliRunner().invoke(app, ["run", str(spec), "--out", str(root), *extra])
        refused(result, needle)
        assert "loaded" not in result.output and snapshot(root) == before


# ---------------------------------------------------------------------------- counts in data files, the run's folder


PAPER_DIGITS = {
    "sums-item-superscript": ("f.json", [{"template": "{item_1} and {item_2}?", "fields": {"item_1": "\u00b2",
                                                                                           "item_2": 3},
                                          "shrink_1": True}], "sums", "field 'fields.item_1': must be a whole number >= 0"),
    "sums-item-arabic": ("f.json", [{"template": "{item_1} and {item_2}?", "fields": {"item_1": "\u0663",
                                                                                      "item_2": 3},
                                     "shrink_1": True}], "sums", "field 'fields.item_1': must be a whole number >= 0"),
    "counting-repetitions-superscript": ("f.csv", "word,category,category_with_article,repetitions\n"
                                                  "apple,fruits,a fruit,\u00b2\n", "counting",
                                         "field 'repetitions': must be a whole number from 1 to 9"),
    "counting-repetitions-underscore": ("f.csv", "word,category,category_with_article,repetitions\n"
                                                 "apple,fruits,a fruit,0_3\n", "counting",
                                        "field 'repetitions': must be a whole number from 1 to 9"),
}


@pytest.mark.parametrize("name,rows,experiment,needle", PAPER_DIGITS.values(), ids=PAPER_DIGITS.keys())
def test_counts_in_a_paper_data_file_are_ascii_digits(name: str, rows: object, experiment: str, needle: str,
                                                       root: Path, tmp_path: Path) -> None:
    data = tmp_path / name
    data.write_text(rows if isinstance(rows, str) else json.dumps(rows), encoding="utf-8")
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", experiment, "--protocol", "paper", "--data", str(data),
                                      "--out", str(root / "new")])
    refused(result, needle)
    assert snapshot(root) == before


def test_a_group_budget_in_other_digits_is_one_line(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTLLM_GROUP_BYTES", "\u00b2")
    refused(CliRunner().invoke(app, ["run", "counting", "--out", str(root / "new")]),
            "CONTLLM_GROUP_BYTES must be a whole number of bytes >= 1")


def test_an_out_under_a_link_to_nothing_is_refused_before_the_model_loads(root: Path, tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    result = CliRunner().invoke(app, ["run", "counting", "--items", "1", "--samples", "2",
                                      "--out", str(tmp_path / "dangling" / "run")])
    refused(result, "dangling is a symbolic link to nothing")
    assert "loaded" not in result.output and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("manifest,needle", [("{", "not valid JSON"), ("[]", "holds no JSON object"),
                                             ("", "not valid JSON")])
def test_resume_with_an_unreadable_manifest_says_how_to_recover(manifest: str, needle: str, root: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    (run / "manifest.json").write_text(manifest)
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--resume", "--items", "1", "--out", str(run)])
    refused(result, needle)
    assert f"remove {run / 'manifest.json'} to resume" in result.output and "--force" in result.output
    assert "loaded" not in result.output and snapshot(root) == before


def test_resume_with_an_unreadable_config_says_to_start_over(root: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    (run / "config.json").write_text("{")
    result = CliRunner().invoke(app, ["run", "counting", "--resume", "--items", "1", "--out", str(run)])
    refused(result, "use --force to start over")


def test_a_folder_where_a_run_writes_a_file_is_refused_before_the_model_loads(root: Path) -> None:
    run = root / "smollm2-135m" / "counting"
    (run / "results.json").mkdir()
    before = snapshot(root)
    result = CliRunner().invoke(app, ["run", "counting", "--resume", "--items", "1", "--out", str(run)])
    refused(result, "results.json is not a file, where a run writes one")
    assert snapshot(root) == before

