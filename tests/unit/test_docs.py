"""The documentation cannot fall behind the code: what docs/hooks.py generates, and the front page.

The command reference is generated from the registry when the site is built; these tests
check that it holds every experiment and every option with its help, that an option
without help stops it, that every public name of ``contllm`` has an API page, that pages
others add reach the navigation, and that the README stays a front page whose links and
commands hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")

import contllm
from contllm import registry
from contllm.experiments.base import Experiment
from contllm.experiments.options import Option
from tests.unit.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

hooks = load_script(DOCS / "hooks.py", "contllm_docs_hooks")


@pytest.fixture(scope="module")
def commands_page() -> str:
    return hooks.commands_page()


def test_every_experiment_and_option_is_in_the_command_reference(commands_page: str) -> None:
    names = registry.names()
    assert len(names) >= 13
    for name in names:
        experiment = registry.get(name)
        section = commands_page.split(f"\n### {name}\n", 1)[1].split("\n### ", 1)[0]
        assert experiment.help.strip() and experiment.help.replace("|", "\\|") in section
        assert f"contllm run {name} [OPTIONS]" in section  # the command's own --help
        for option in experiment.options:
            assert option.help.strip(), f"{name}: {option.cli_flag} has no help"
            row = f"| `{option.cli_flag}` | {option.kind} | {option.help.replace('|', chr(92) + '|')} |"
            assert row in section, f"{name}: {option.cli_flag} missing from the command reference"
            assert option.cli_flag.split("/")[0] in section.split("```text", 1)[1], (
                f"{name}: {option.cli_flag} not in --help"
            )
    for command in ("run", "models", "report"):
        assert f"## contllm {command}\n" in commands_page
    assert f"Usage: contllm {command} [OPTIONS]" in commands_page


@dataclass
class _Config:
    factor: float = 0.5


class _Undocumented(Experiment):
    name = "undocumented"
    help = "An experiment whose option has no help."
    Config = _Config
    options = (Option("factor", "float", "  "),)


UNDOCUMENTED = _Undocumented()


def test_an_option_without_help_stops_the_build() -> None:
    with pytest.raises(hooks.UndocumentedOption, match="--factor"):
        hooks.check_documented("undocumented", UNDOCUMENTED)
    registry.register("undocumented", f"{__name__}:UNDOCUMENTED")
    try:
        with pytest.raises(hooks.UndocumentedOption, match="undocumented"):
            hooks.commands_page()
    finally:
        registry.unregister("undocumented")


def test_every_public_name_of_contllm_has_an_api_page() -> None:
    griffe = pytest.importorskip("griffe")
    package = griffe.load("contllm", search_paths=[str(ROOT)], resolve_aliases=False)
    modules = hooks.public_modules()
    assert "contllm.core.signal" in modules and "contllm.experiments.counting" in modules
    assert not [m for m in modules if any(part.startswith("_") for part in m.split("."))]
    defined: dict[str, str] = {}
    for module in modules:
        obj: Any = package if module == "contllm" else package[module.removeprefix("contllm.")]
        for name, member in obj.members.items():
            if not member.is_alias:
                defined.setdefault(name, module)
    missing = [name for name in contllm.__all__ if name not in defined]
    assert not missing, f"public names of contllm with no API page: {missing}"
    assert hooks.api_page("contllm.core.signal") == "# `contllm.core.signal`\n\n::: contllm.core.signal\n"


def test_the_navigation_takes_pages_that_exist_and_adds_the_others(tmp_path: Path) -> None:
    (tmp_path / "index.md").write_text("# home\n")
    (tmp_path / "extra.md").write_text("# a page someone added\n")
    config = {
        "docs_dir": str(tmp_path),
        "nav": [{"Home": "index.md"}, {"Not yet": "missing.md"}, {"Group": ["missing-too.md"]}],
    }
    nav = hooks.on_config(config)["nav"]
    flat = str(nav)
    assert "missing.md" not in flat and "missing-too.md" not in flat and "Group" not in flat
    assert {"More": ["extra.md"]} in nav
    assert any("API reference" in entry for entry in nav if isinstance(entry, dict))


def test_executed_notebooks_are_required_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setattr(hooks, "EXECUTED", tmp_path)
    monkeypatch.setattr(hooks, "UNRUN", tmp_path / "unrun")
    monkeypatch.delenv("CONTLLM_DOCS_EXECUTED", raising=False)
    stored = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert [path for _, path in hooks.notebook_sources()] == stored  # without a run: the stored ones
    assert not (tmp_path / "unrun").exists()  # the navigation alone writes nothing
    shown = hooks.notebook_pages()
    assert [name for name, _ in shown] == [p.name for p in stored]
    for (_, path), original in zip(shown, stored):  # without a run: the stored ones, saying so first
        cells = json.loads(path.read_text())["cells"]
        assert cells[0]["cell_type"] == "markdown" and "without its outputs" in "".join(cells[0]["source"])
        assert "pytest tests/notebooks" in "".join(cells[0]["source"])
        assert cells[1:] == json.loads(original.read_text())["cells"]
        assert path.parents[1] == tmp_path / "unrun"  # served as notebooks/<name>
    (tmp_path / stored[0].name).write_text(stored[0].read_text())
    assert hooks.notebook_sources()[0][1] == tmp_path / stored[0].name  # an executed copy wins
    monkeypatch.setenv("CONTLLM_DOCS_EXECUTED", "1")
    with pytest.raises(hooks.PluginError, match=stored[1].name):
        hooks.notebook_sources()


def _measured_rows(text: str) -> list[str]:
    """Table rows with a measured number (a decimal or a percentage) after the first cell."""
    return [
        line
        for line in text.splitlines()
        if line.startswith("|") and re.search(r"\d+\.\d+|\d+%", "|".join(line.split("|")[2:]))
    ]


def test_the_readme_is_a_front_page_whose_links_and_numbers_hold() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    assert "bash scripts/setup.sh && .venv/bin/contllm run counting" in readme
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest" in readme
    assert "Language Models Are Implicitly Continuous" in readme and "ICLR 2025" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    for row in _measured_rows(readme):  # a measured table the docs do not hold may not live only here
        assert row in pages, f"README row not in the docs: {row}"
    assert _measured_rows("| | a | b |\n| counting: accuracy | 43.1% | 0.994 |") == [
        "| counting: accuracy | 43.1% | 0.994 |"
    ]


# ---------------------------------------------------------------- quoted numbers (docs/quotes.py)

quotes = load_script(DOCS / "quotes.py", "contllm_docs_quotes")

#: A sentence about a default run, the main job or the defaults ...
ABOUT_DEFAULTS = re.compile(
    r"\bdefaults?\b[^.]*?\b(?:run|job)\b|\bmain job\b|\bwith (?:the|its|every) defaults?\b|\bby default\b", re.I
)
#: ... that states a count of items or knob values, or a time ...
STATED = re.compile(
    r"(?<![\w.\-])\d[\d,]*(?:\.\d+)?\s*(?:items?|duration factors|factors|alphas|values of alpha|values|problems|paths"
    r"|s|min|seconds|minutes)\b"
)
#: ... is about the default model unless it names another one.
OTHER_MODEL = re.compile(r"smollm|gemma|1\.5b", re.I)


def _sentences(text: str) -> list[str]:
    """The sentences of a page outside its quotes and code blocks (a table row or a list item ends one)."""
    text = re.sub(r"```.*?```", "", quotes.QUOTE.sub("", text), flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.) )", text):  # paragraphs, list items, table rows
        out += re.split(r"(?<=[.;:])\s+(?=[A-Z(])", " ".join(block.split()))
    return out


def unquoted_default_numbers(text: str) -> list[str]:
    """Sentences that state a number about a default run or the defaults without quoting it from its source."""
    return [s for s in _sentences(text) if ABOUT_DEFAULTS.search(s) and STATED.search(s) and not OTHER_MODEL.search(s)]


def test_every_quoted_number_is_what_its_source_holds_now() -> None:
    """A page's quoted text equals the recorded main job's or the registry's value (docs/quotes.py)."""
    known = quotes.values()
    assert "main_job.end_to_end" in known and known["default.counting.items"] == "130"
    stale = []
    for page in quotes.pages():
        for key, text in quotes.quotes(page.read_text()):
            assert key in known, f"{page.relative_to(ROOT)} quotes {key!r}, which no source holds"
            if text != known[key]:
                stale.append(f"{page.relative_to(ROOT)}: {key} says {text!r}, its source {known[key]!r}")
    assert not stale, "run `python docs/quotes.py --write`:\n" + "\n".join(stale)
    misplaced = [
        f"{page.relative_to(ROOT)}: {line}" for page in quotes.pages() for line in quotes.misplaced(page.read_text())
    ]
    assert not misplaced, "a quote may not start a line nor sit in a code span:\n" + "\n".join(misplaced)


def unquoted_numbers(text: str) -> list[str]:
    """The numbers a page states outside quotes, code (blocks and spans) and names (a digit inside a word: SmolLM2,
    0.5B, 270M, 7-14B; a probability's name: P(1)), and outside the method's own constants (its 95% intervals)."""
    text = re.sub(r"^(    |\t).*$", "", text, flags=re.M)  # indented code blocks
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", quotes.QUOTE.sub("", text))
    text = re.sub(r"\(images/[^)]*\)|P\(\w+\)", "", text)  # figure paths; P(1), P(yes): names of probabilities
    words = re.sub(r"[\w.\-]*[A-Za-z][\w.\-]*", "", text).replace("95%", "")
    return re.findall(r"\d[\d.,]*", words)


def test_the_atlas_states_numbers_only_through_quotes() -> None:
    """docs/atlas.md: every number comes from docs/measured/atlas.json (the test above checks each is current)."""
    page = (DOCS / "atlas.md").read_text()
    assert unquoted_numbers(page) == [], "quote them from docs/measured/atlas.json (scripts/atlas.py writes it)"
    assert sum(key.startswith("atlas.") for key, _ in quotes.quotes(page)) >= 16  # four models x two protocols x 2
    assert unquoted_numbers("R² rose from 0.31 to <!--q:a.b-->0.5<!--/q--> on SmolLM2-135M") == ["0.31"]


def test_the_models_page_states_its_measurements_only_through_quotes() -> None:
    """docs/models.md's measured section: every number comes from docs/measured/models.json (scripts/models_page.py),
    the names of the conditions a column reads at (c = 1, alpha 0) aside."""
    page = (DOCS / "models.md").read_text()
    section = page[page.index("## What the paper's experiments show") : page.index("### The default model")]
    named = re.sub(r"c = 1\b|alpha [01]\b", "", section)
    assert unquoted_numbers(named) == [], "quote them from docs/measured/models.json (scripts/models_page.py writes it)"
    keys = [key for key, _ in quotes.quotes(section)]
    assert sum(key.startswith("models.whole.") for key in keys) >= 2 * 6 * 3  # two models x six experiments
    assert sum(key.startswith("models.audit.") for key in keys) >= 8 * 5 * 4  # four models x two protocols
    assert "old definitions" not in page and "predate" not in section


def test_the_readme_quotes_the_main_job() -> None:
    readme = dict(quotes.quotes((ROOT / "README.md").read_text()))
    assert {"main_job.end_to_end", "main_job.evaluation", "main_job.machine", "main_job.date"} <= set(readme)


def test_a_page_states_numbers_of_a_default_run_only_through_quotes() -> None:
    found = [
        f"{page.relative_to(ROOT)}: {s[:160]}"
        for page in quotes.pages()
        for s in unquoted_default_numbers(page.read_text())
    ]
    assert not found, (
        "quote these from their source (docs/quotes.py), or name the model they were measured on:\n" + "\n".join(found)
    )
    assert unquoted_default_numbers("The default counting run took 12 s.") == ["The default counting run took 12 s."]
    assert unquoted_default_numbers("With the defaults (10 factors).") == ["With the defaults (10 factors)."]
    assert not unquoted_default_numbers("With the defaults (<!--q:default.counting.values-->10<!--/q--> factors).")
    assert not unquoted_default_numbers("On SmolLM2 the default counting run took 12 s.")


def test_quotes_render_the_current_value_and_refuse_an_unknown_key() -> None:
    text = "the run took <!--q:x.time-->1 min<!--/q--> on <!--q:x.cpu-->an old CPU<!--/q-->."
    assert quotes.render(text, lambda: {"x.time": "2 min 05 s", "x.cpu": "a 2-core CPU"}) == (
        "the run took <!--q:x.time-->2 min 05 s<!--/q--> on <!--q:x.cpu-->a 2-core CPU<!--/q-->."
    )
    with pytest.raises(quotes.UnknownQuote, match="x.cpu"):
        quotes.render(text, lambda: {"x.time": "1 min"})
    assert (
        quotes.render(text, lambda: {"x.time": "2 min", "x.cpu": "a CPU"}, keep_marks=False)
        == "the run took 2 min on a CPU."
    )
    assert quotes.misplaced(
        "<!--q:a-->1<!--/q--> s\nthe `<!--q:b-->x<!--/q-->` option\n`code` <!--q:c-->2<!--/q-->"
    ) == [
        "<!--q:a-->1<!--/q--> s",
        "the `<!--q:b-->x<!--/q-->` option",
    ]
    assert quotes.duration(48.4) == "48 s" and quotes.duration(185.0) == "3 min 05 s"


#: A usage line of a bare ``contllm run NAME`` (every option at its default) with what it says it runs.
BARE_RUN = re.compile(r"^\s*(?:\$ )?contllm run ([a-z][\w-]*)\s+#?\s*(.+)$")
#: "130 items", "70 passages", "32 problems", "13 words", "8 counting items", "16 prompts" ... and "in 10 steps".
BARE_ITEMS = re.compile(r"\b(\d+) (?:\w+ )?(?:items|passages|problems|words|prompts)\b")
BARE_STEPS = re.compile(r"\bin (\d+) steps\b")


def bare_run_claims(text: str) -> list[tuple[str, str, str]]:
    """(experiment, what, stated) for each number a page's bare ``contllm run NAME`` usage line states."""
    claims = []
    for block in re.findall(r"```.*?```", text, flags=re.S):
        for line in block.splitlines():
            match = BARE_RUN.match(line)
            if match is None or match.group(2).startswith("-"):
                continue
            name, comment = match.groups()
            first = BARE_ITEMS.search(comment)  # the run's own count comes first ("16 prompts: 12 words ...")
            claims += [(name, "items", first.group(1))] if first else []
            claims += [(name, "values", m.group(1)) for m in BARE_STEPS.finditer(comment)]
    return claims


def test_usage_lines_of_a_bare_run_state_the_registrys_defaults() -> None:
    """`contllm run counting   # 130 items, c = 0.1 ... 1 in 10 steps`: the numbers are the registry's."""
    known = quotes.values()
    claims = [(page, *c) for page in quotes.pages() for c in bare_run_claims(page.read_text())]
    assert len(claims) >= 6
    wrong = [
        f"{page.relative_to(ROOT)}: `contllm run {name}` says {stated} {what}, the registry {known.get(f'default.{name}.{what}')}"
        for page, name, what, stated in claims
        if known.get(f"default.{name}.{what}") != stated
    ]
    assert not wrong, "\n".join(wrong)
    assert bare_run_claims(
        "```\ncontllm run counting   # 12 items, in 3 steps\ncontllm run counting --items 5  # 5 items\n```"
    ) == [
        ("counting", "items", "12"),
        ("counting", "values", "3"),
    ]


def test_the_api_front_page_names_every_public_symbol() -> None:
    front = (DOCS / hooks.API_FRONT).read_text()
    missing = [name for name in contllm.__all__ if f"`{name}`" not in front]
    assert not missing, f"docs/{hooks.API_FRONT} does not name {missing}"
    assert front.count("```python") >= 4  # an example for each kind of use


def test_the_api_reference_is_grouped_and_every_module_is_in_one_group(tmp_path: Path) -> None:
    groups = hooks.api_groups()
    assert list(groups) == ["User API", "Experiments", "Extending", "Internals"]
    placed = [m for found in groups.values() for m in found]
    assert sorted(placed) == sorted(hooks.public_modules())  # each module once
    assert groups["User API"][:3] == ["contllm", "contllm.loading", "contllm.lm"]
    assert "contllm.experiments.counting" in groups["Experiments"] and "contllm.depth.figures" in groups["Experiments"]
    assert "contllm.registry" in groups["Extending"] and "contllm.core.engine" in groups["Internals"]
    (tmp_path / "index.md").write_text("# home\n")
    (tmp_path / hooks.API_FRONT).write_text("# API\n")
    nav = hooks.on_config({"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}]})["nav"]
    reference = next(entry["API reference"] for entry in nav if isinstance(entry, dict) and "API reference" in entry)
    assert reference[0] == hooks.API_FRONT and [next(iter(g)) for g in reference[1:]] == list(groups)
    assert not any("More" in entry for entry in nav if isinstance(entry, dict))  # the front page is not "more"


def _docstrings() -> list[tuple[str, str]]:
    griffe = pytest.importorskip("griffe")
    package = griffe.load("contllm", search_paths=[str(ROOT)], resolve_aliases=False)
    found: list[tuple[str, str]] = []
    stack: list[Any] = [package]
    while stack:
        obj = stack.pop()
        if obj.docstring is not None:
            found.append((obj.path, obj.docstring.value))
        stack += [m for m in obj.members.values() if not m.is_alias]
    return found


def test_every_docstring_renders_as_markdown() -> None:
    """No reST table rule, role or '::' literal marker is left in any docstring after the docs' conversion."""
    convert = load_script(DOCS / "griffe_docstrings.py", "contllm_docstrings")
    rule = re.compile(r"^\s*=+(\s+=+)+\s*$")
    role = re.compile(r":(func|class|meth|data|attr|mod|exc|obj):`")
    docstrings = _docstrings()
    assert any(rule.match(line) for _, text in docstrings for line in text.splitlines())  # there are tables to convert
    for path, text in docstrings:
        out = convert.markdown_docstring(text)
        lines = out.splitlines()
        assert not [line for line in lines if rule.match(line)], f"{path}: a reST table is left"
        assert not role.search(out), f"{path}: a reST role is left"
        assert not [line for line in lines if line.rstrip().endswith("::") and "```" not in out], (
            f"{path}: '::' is left"
        )
    table = convert.markdown_docstring(
        "Names:\n\n====  ==========\nname  what\n====  ==========\n``a``   the first\n      and more\n``b``   second\n"
        "====  ==========\n\nSee :meth:`the forward <contllm.lm.ContinuousLM.forward_batch>` and :func:`~contllm.load`."
    )
    assert "| name | what |\n|---|---|\n| ``a`` | the first and more |\n| ``b`` | second |" in table
    assert "See `the forward` and `contllm.load`." in table
