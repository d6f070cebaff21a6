"""Data written to escape the run or to break its pages: item ids, prompts, labels and model names.

A ``--data`` file or an edited ``results.json`` may hold any string. Runs of a tiny model
with such files must write nothing outside their directory (no folder made of an id
either), and every page they write must parse, in a real HTML5 parser, into the same
script elements and the same data whatever the strings hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from contllm import ContinuousLM
from contllm.cli.commands import app
from contllm.experiments.counting import CountingConfig
from contllm.rundir.files import data_name
from contllm.rundir.runner import run
from tests.unit.test_attribution import word_tokenizer
from tests.unit.test_sums import digit_tokenizer
from tests.unit.tiny import tiny_model

pytestmark = pytest.mark.unit

html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (pip install -e '.[test]')")

#: Ids that name a place outside the run, or a folder inside it.
ESCAPING_IDS = ["../../../outside/pwn_run", "/tmp/abs_pwn", "a/b/c", "..", "x/../../y"]
#: Strings that end a script element, open a comment or inject markup, as HTML parsers read them.
HOSTILE = [
    "<!--<script>",
    "</script><script>window.pwned=1</script>",
    "<img src=x onerror=window.pwned=1>",
    "]]></script><!--",
    "&lt;&amp;\u2028\u2029'\"`",
]


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def counting_rows(path: Path, ids: list[str], word: str = "apple") -> Path:
    path.write_text("".join(json.dumps({"id": i, "word": word, "n": 2}) + "\n" for i in ids))
    return path


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"), digit_tokenizer())


def check_inside(run_dir: Path, root: Path, before: set[Path]) -> None:
    """Every new file under ``root`` lies in ``run_dir``; figures/items/ holds files and no folder; the manifest lists only paths inside."""
    new = files_under(root) - before
    assert new and all(p.resolve().is_relative_to(run_dir.resolve()) for p in new), sorted(new)
    items = run_dir / "figures" / "items"
    if items.is_dir():
        assert all(p.is_file() for p in items.iterdir()), sorted(items.iterdir())
    for listed in json.loads((run_dir / "manifest.json").read_text())["outputs"]:
        assert (run_dir / listed).resolve().is_relative_to(run_dir.resolve()), listed


# ---------------------------------------------------------------------------- point 1: names


def test_item_ids_from_a_data_file_name_no_file_outside_the_run(lm: ContinuousLM, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    data = counting_rows(tmp_path / "t.jsonl", ESCAPING_IDS)
    before = files_under(tmp_path)
    out = run("counting", options={"data": str(data), "samples": "2"}, lm=lm, model="tiny", out=root / "o",
              item_figures=True)
    check_inside(out, tmp_path, before)
    assert not (tmp_path / "outside").exists() and not Path("/tmp/abs_pwn.png").exists()
    pictures = sorted(p.name for p in (out / "figures" / "items").iterdir())
    assert pictures == sorted(f"{data_name(i)}.png" for i in ESCAPING_IDS)


def test_the_issues_command_line_writes_nothing_outside_the_run(tmp_path: Path) -> None:
    """`contllm run counting --data t.jsonl --items 1 --samples 2 --out o`, a model directory of a tiny model."""
    model = tmp_path / "model"
    tiny_model("llama").save_pretrained(model)
    digit_tokenizer().save_pretrained(model)
    work = tmp_path / "work"
    work.mkdir()
    data = counting_rows(work / "t.jsonl", ["../../../outside/pwn_run"])
    before = files_under(tmp_path)
    result = CliRunner().invoke(app, ["run", "counting", "--model", str(model), "--device", "cpu", "--data", str(data),
                                      "--items", "1", "--samples", "2", "--item-figures", "--out", str(work / "o")])
    assert result.exit_code == 0, result.output
    check_inside(work / "o", tmp_path, before)
    assert not (tmp_path / "outside").exists() and not Path("outside").exists()
    listed = json.loads((work / "o" / "manifest.json").read_text())["outputs"]
    assert f"figures/items/{data_name('../../../outside/pwn_run')}.png" in listed


def test_attribution_pages_of_escaping_ids_stay_in_the_run(tmp_path: Path) -> None:
    events = [{"id": item_id, "events": ["Anna eats an apple.", "Anna eats a pear."],
               "question": "How many things did Anna do?", "answer_prefix": "Answer:"} for item_id in ESCAPING_IDS[:2]]
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    root = tmp_path / "root"
    root.mkdir()
    before = files_under(tmp_path)
    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    out = run("attribution", options={"dataset": "events", "data": str(data), "first": "2", "steps": "8"}, lm=lm,
              model="tiny", out=root / "o", item_figures=True)
    check_inside(out, tmp_path, before)
    written = sorted(p.name for p in (out / "figures" / "items").iterdir())
    assert written == sorted(f"{data_name(i)}.{ext}" for i in ESCAPING_IDS[:2] for ext in ("html", "png"))
    assert not (tmp_path / "outside").exists()


def test_contllm_figures_after_an_id_is_edited_into_results_json_stays_in_the_run(lm: ContinuousLM,
                                                                                  tmp_path: Path) -> None:
    out = run("counting", config=CountingConfig(samples=2, low=0.5, high=1.0), lm=lm, model="tiny", items="1",
              out=tmp_path / "root" / "o", item_figures=False)
    results = json.loads((out / "results.json").read_text())
    results["sweeps"][0]["item_id"] = "../../../outside/pwn_fig"
    (out / "results.json").write_text(json.dumps(results))
    before = files_under(tmp_path)
    result = CliRunner().invoke(app, ["figures", str(out)])
    assert result.exit_code == 0, result.output
    check_inside(out, tmp_path, before)
    assert (out / "figures" / "items" / f"{data_name('../../../outside/pwn_fig')}.png").is_file()
    assert not (tmp_path / "outside").exists() and not (tmp_path / "root" / "outside").exists()


def test_a_figure_name_out_of_the_run_is_refused_by_the_writer(lm: ContinuousLM, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: an experiment that names an item figure by its raw id cannot write outside either."""
    from contllm import registry
    from contllm.errors import RunDirectoryError
    from contllm.rundir.outputs import save

    out = run("counting", config=CountingConfig(samples=2, low=0.5, high=1.0), lm=lm, model="tiny", items="1",
              out=tmp_path / "root" / "o", item_figures=False)
    experiment = registry.get("counting")
    result = experiment.load_result(json.loads((out / "results.json").read_text()))
    raw = experiment.figures

    def figures(result: Any, *, per_item: bool = True) -> Any:
        for name, fig in raw(result, per_item=per_item):
            yield ("items/../../../outside/raw" if name.startswith("items/") else name), fig

    monkeypatch.setattr(experiment, "figures", figures)
    with pytest.raises(RunDirectoryError, match="is not inside"):
        save(result, tmp_path / "again", formats=["figures"])
    assert not (tmp_path / "outside").exists()


# ---------------------------------------------------------------------------- point 2: pages


def parsed(page: Path) -> tuple[Any, list[Any]]:
    """The page's tree (html5lib) and its script elements."""
    tree = html5lib.parse(page.read_bytes(), namespaceHTMLElements=False)
    return tree, tree.findall(".//script")


def page_data(page: Path) -> dict[str, Any]:
    """The explorer's data as a browser would read it: the one JSON script element, parsed."""
    tree, scripts = parsed(page)
    assert [s.get("type") for s in scripts] == ["application/json", None], [s.attrib for s in scripts]
    assert scripts[0].get("id") == "explorer-data"
    assert not tree.findall(".//img") and "pwned" not in (scripts[1].text or "")
    return json.loads(scripts[0].text)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_prompts_and_ids_leave_the_run_page_whole(hostile: str, lm: ContinuousLM, tmp_path: Path) -> None:
    data = counting_rows(tmp_path / "t.jsonl", [f"id{hostile}"], word=f"w{hostile}")
    out = run("counting", options={"data": str(data), "samples": "2"}, lm=lm, model=f"model{hostile}",
              out=tmp_path / "o", item_figures=False)
    shown = page_data(out / "explorer.html")
    item = shown["runs"][0]["items"][0]
    assert item["id"] == f"id{hostile}" and f"w{hostile}" in item["prompt"] and item["span"] == f"w{hostile}"
    assert shown["runs"][0]["name"] == f"model{hostile}"
    sweeps = json.loads((out / "results.json").read_text())["sweeps"]
    assert item["probs"] == sweeps[0]["probs"] and item["labels"] == sweeps[0]["labels"]


def test_hostile_strings_in_every_field_leave_the_report_page_whole(lm: ContinuousLM, tmp_path: Path) -> None:
    """Every string an edited run gives the report page: ids, labels, prompt, word, tokens, model (the legend)."""
    out = run("counting", config=CountingConfig(samples=2, low=0.5, high=1.0), lm=lm, model="tiny", items="1",
              out=tmp_path / "o", item_figures=False)
    results = json.loads((out / "results.json").read_text())
    sweep = results["sweeps"][0]
    sweep["item_id"] = HOSTILE[0]
    # the even labels stay digits: a counting result needs some to read a count over
    sweep["labels"] = [label if k % 2 == 0 else f"{label}{HOSTILE[k % len(HOSTILE)]}"
                       for k, label in enumerate(sweep["labels"])]
    sweep["meta"].update(prompt=HOSTILE[2], word=HOSTILE[3], edited_tokens=[HOSTILE[4]] * len(sweep["meta"]["edited"]))
    results["model"] = HOSTILE[1]
    (out / "results.json").write_text(json.dumps(results))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "model": HOSTILE[2]}))
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    shown = page_data(tmp_path / "report" / "explorer.html")
    item = shown["runs"][0]["items"][0]
    assert item["id"] == HOSTILE[0] and item["labels"] == sweep["labels"] and shown["runs"][0]["name"] == HOSTILE[2]
    assert item["prompt"] == HOSTILE[2] and item["span"] == HOSTILE[3] and item["edited_tokens"][0] == HOSTILE[4]


def test_an_attribution_page_shows_hostile_text_as_text(tmp_path: Path) -> None:
    hostile = "".join(HOSTILE)
    events = [{"id": f"e{hostile}", "events": [f"Anna eats {HOSTILE[0]}.", f"Anna eats {HOSTILE[2]}."],
               "question": f"How many {HOSTILE[1]}?", "answer_prefix": "Answer:"}]
    data = tmp_path / "t.jsonl"
    data.write_text(json.dumps(events[0]) + "\n")
    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    out = run("attribution", options={"dataset": "events", "data": str(data), "first": "1", "steps": "8"}, lm=lm,
              model=f"m{hostile}", out=tmp_path / "o", item_figures=True)
    page = out / "figures" / "items" / f"{data_name(events[0]['id'])}.html"
    tree, scripts = parsed(page)
    assert scripts == [] and not tree.findall(".//img")
    text = "".join(tree.find(".//div").itertext())
    assert HOSTILE[0] in text and HOSTILE[2] in text
    assert f"m{hostile}" in tree.find(".//h2").text and f"e{hostile}" in tree.find(".//title").text


@pytest.mark.parametrize("meta", [{"edited": ["a"]}, {"edited_tokens": None}, {"edited": 3, "edited_tokens": 7}])
def test_malformed_token_positions_in_an_edited_run_leave_the_report_page_whole(meta: dict, lm: ContinuousLM,
                                                                                tmp_path: Path) -> None:
    out = run("counting", config=CountingConfig(samples=2, low=0.5, high=1.0), lm=lm, model="tiny", items="1",
              out=tmp_path / "o", item_figures=False)
    results = json.loads((out / "results.json").read_text())
    results["sweeps"][0]["meta"].update(meta)
    (out / "results.json").write_text(json.dumps(results))
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    item = page_data(tmp_path / "r" / "explorer.html")["runs"][0]["items"][0]
    assert item["edited"] == [] or "edited" not in meta


# ---------------------------------------------------------------------------- beyond: text no file can hold


def test_a_lone_surrogate_in_a_data_file_is_one_line_before_the_model_loads(tmp_path: Path) -> None:
    data = tmp_path / "t.jsonl"
    data.write_text('{"id": "a\\ud800", "word": "apple", "n": 2}\n')
    result = CliRunner().invoke(app, ["run", "counting", "--data", str(data), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "lone surrogate" in result.output and not (tmp_path / "o").exists()


def test_a_lone_surrogate_edited_into_results_json_is_one_line(lm: ContinuousLM, tmp_path: Path) -> None:
    out = run("counting", config=CountingConfig(samples=2, low=0.5, high=1.0), lm=lm, model="tiny", items="1",
              out=tmp_path / "o", item_figures=False)
    text = (out / "results.json").read_text()
    (out / "results.json").write_text(text.replace('"item_id": "', '"item_id": "\\udc80', 1))
    for args in (["figures", str(out)], ["report", str(out), "--out", str(tmp_path / "r")]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert "lone surrogate" in result.output
