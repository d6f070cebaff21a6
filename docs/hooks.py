"""Build-time parts of the documentation site (an MkDocs hook file; see mkdocs.yml).

Four kinds of page are made here rather than written by hand, so that they cannot go
stale (and every page's quoted numbers are filled in from their one source, docs/quotes.py):

- ``figures.md``: every registered experiment's summary figure and the explorer pictures,
  from ``docs/images/gallery/`` (drawn by ``docs/gallery.py``); a missing one stops the build.
- ``reference/commands.md``: every registered experiment with every option, read from
  the registry (the ``Option`` declarations) and from the command line's own ``--help``.
  An option without help text stops the build.
- ``reference/api/<module>.md``: one page per public module of ``contllm``, rendered by
  mkdocstrings from the docstrings, listed under "API reference" after its front page
  (``api.md``, written by hand) in four groups (:func:`api_groups`).
- ``notebooks/<name>.ipynb``: the notebooks of ``notebooks/``, with the outputs of the run
  the test tier made (``tests/notebooks`` writes them to ``build/notebooks/``); without
  such a run, the stored notebooks without outputs under a first cell that says so and
  how to build with them, unless ``CONTLLM_DOCS_EXECUTED=1`` asks for the executed ones
  (CI sets it), in which case a missing one stops the build.

The navigation is mkdocs.yml's, less the pages that do not exist (yet), plus every other
top-level page under "More" and the generated pages under "Reference" and "Notebooks".
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "contllm"
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
COMMANDS_PAGE = "reference/commands.md"
FIGURES_PAGE = "figures.md"
GALLERY = ROOT / "docs" / "images" / "gallery"


class UndocumentedOption(PluginError):
    """An experiment or option whose help text is missing."""


def _quotes() -> ModuleType:
    """docs/quotes.py (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("contllm_docs_quotes", Path(__file__).with_name("quotes.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quotes = _quotes()


# ---------------------------------------------------------------- the command reference


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _help_text(args: list[str]) -> str:
    from typer.testing import CliRunner

    from contllm.cli.commands import app

    done = CliRunner().invoke(app, args, prog_name="contllm", terminal_width=88)
    if done.exit_code != 0:
        raise PluginError(f"`contllm {' '.join(args)}` exited with {done.exit_code}: {done.output.strip()}")
    return done.output.rstrip()


def top_commands() -> list[str]:
    """The commands of ``contllm`` other than ``run``, as the command line lists them."""
    import click
    import typer

    from contllm.cli.commands import app

    group: Any = typer.main.get_command(app)  # a click group (typer may carry its own click)
    return [name for name in group.list_commands(click.Context(group)) if name != "run"]


def experiment_rows() -> list[tuple[str, Any]]:
    """(name, Experiment) of every registered experiment, in registry order."""
    from contllm import registry

    return [(name, registry.get(name)) for name in registry.names()]


def check_documented(name: str, experiment: Any) -> None:
    """UndocumentedOption when the experiment or one of its options has no help text."""
    if not str(getattr(experiment, "help", "")).strip():
        raise UndocumentedOption(f"experiment {name!r} has no help text")
    for option in experiment.options:
        if not option.help.strip():
            raise UndocumentedOption(f"option {option.cli_flag} of experiment {name!r} has no help text")


def commands_page() -> str:
    """The Markdown of the command reference: every experiment, every option, every --help."""
    lines = [
        "# Command reference",
        "",
        "Generated from the experiment registry and the command line when the site is built:",
        "every registered experiment, each option it declares (`contllm.experiments.options.Option`)",
        "and the full `--help` of each command. An option declared without help text stops the",
        "build.",
        "",
        "## contllm",
        "",
        "```text",
        _help_text(["--help"]),
        "```",
        "",
        "## contllm run",
        "",
        "```text",
        _help_text(["run", "--help"]),
        "```",
        "",
    ]
    for extra in top_commands():
        lines += [f"## contllm {extra}", "", "```text", _help_text([extra, "--help"]), "```", ""]
    lines += ["## Experiments", ""]
    for name, experiment in experiment_rows():
        check_documented(name, experiment)
        lines += [f"### {name}", "", _escape(experiment.help), ""]
        if experiment.options:
            lines += ["| option | kind | help |", "|---|---|---|"]
            for option in experiment.options:
                lines.append(f"| `{option.cli_flag}` | {option.kind} | {_escape(option.help)} |")
        else:
            lines.append("It takes the run options only.")
        lines += ["", f"`contllm run {name} --help`:", "", "```text", _help_text(["run", name, "--help"]), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the figures


def figures_page() -> str:
    """The Markdown of the figures page: every registered experiment's summary figure and the explorer pictures of
    ``docs/gallery.py``'s :data:`EXPLORED`, from ``docs/images/gallery/``; a picture that is missing stops the build."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("contllm_docs_gallery", ROOT / "docs" / "gallery.py")
    assert spec is not None and spec.loader is not None
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    names = [name for name, _ in experiment_rows()]
    wanted = [f"{name}.png" for name in names] + [f"explorer-{name}.png" for name in gallery.EXPLORED]
    missing = [w for w in wanted if not (GALLERY / w).is_file()]
    if missing:
        raise PluginError(
            f"docs/images/gallery/ lacks {', '.join(missing)}; draw them with: python docs/gallery.py runs && "
            "python docs/gallery.py draw && python docs/gallery.py shots"
        )
    lines = [
        "# Figures",
        "",
        "Every experiment's summary figure (`figures/summary.png` of its run directory) and the explorer pages of four",
        "of them, as a small run on SmolLM2-135M draws them. Each summary figure opens with its finding as a sentence,",
        "read off the run's numbers (the sentences and the numbers behind them are defined with each figure's code);",
        "the paper's own measures, where an experiment has them, come last, named in plain words. The pictures are",
        "drawn by `docs/gallery.py` from runs small enough for a CPU (its `RUNS` table; the counting run is the",
        "default one), so their numbers are a small run's, not the measured results of the experiment pages:",
        "",
        "```bash",
        "python docs/gallery.py runs     # one small run per experiment under build/gallery/runs (minutes on a CPU)",
        "python docs/gallery.py draw     # each run's summary figure into docs/images/gallery/",
        "python docs/gallery.py shots    # the explorer pages in headless Chromium into docs/images/gallery/",
        "```",
        "",
        "`tests/integration/test_gallery.py` draws them the same way on smaller runs and checks each figure and",
        "picture.",
        "",
        "## Explorer pages",
        "",
    ]
    for name in gallery.EXPLORED:
        item, at = gallery.SHOWN.get(name, (None, None))
        where = ", ".join(
            p for p in (f"item {item}" if item else "", f"slider at {at:g}" if at is not None else "") if p
        )
        lines += [
            f"### {name}",
            "",
            f"![the {name} explorer{f' ({where})' if where else ''}](images/gallery/explorer-{name}.png)",
            "",
        ]
    lines += ["## Summary figures", ""]
    for name, experiment in experiment_rows():
        lines += [
            f"### {name}",
            "",
            _escape(experiment.help),
            "",
            f"![the {name} summary figure](images/gallery/{name}.png)",
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the API reference


def public_modules() -> list[str]:
    """Dotted names of contllm's public modules: no part starting with "_" (the package itself included)."""
    names = ["contllm"]
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1 and not any(p.startswith("_") for p in parts):
            names.append(".".join(parts))
    return names


def api_page(module: str) -> str:
    return f"# `{module}`\n\n::: {module}\n"


#: The front page of the API reference (written by hand: what to import for what).
API_FRONT = "api.md"

#: Modules a user imports from, and those a new experiment or model family builds on; a module in neither that belongs
#: to a registered experiment goes under "Experiments", every other under "Internals" (so a new module is never lost).
USER_API = (
    "contllm",
    "contllm.loading",
    "contllm.lm",
    "contllm.core.signal",
    "contllm.core.interpolate",
    "contllm.core.readout",
    "contllm.metrics",
    "contllm.internals.activations",
    "contllm.internals.activation_cache",
    "contllm.internals.hookpoints",
    "contllm.internals.intervention",
    "contllm.internals.gradients",
    "contllm.generation",
    "contllm.experiments",
    "contllm.audits",
    "contllm.audits.run",
    "contllm.rundir.report",
    "contllm.rundir.outputs",
    "contllm.rundir.explorer",
    "contllm.internals.interop",
    "contllm.models",
    "contllm.errors",
)
EXTENDING = (
    "contllm.registry",
    "contllm.experiments.base",
    "contllm.experiments.options",
    "contllm.experiments.records",
    "contllm.experiments.sweeps",
    "contllm.experiments.interpolations",
    "contllm.experiments.prompts",
    "contllm.experiments.protocol",
    "contllm.core.families",
    "contllm.plotting",
    "contllm.wording",
    "contllm.rundir.pages",
    "contllm.data.user",
    "contllm.rundir.runner",
)


def _experiment_packages() -> list[str]:
    """Where the registered experiments live: each one's module, or its package when the module is ``.experiment``."""
    from contllm import registry

    out = []
    for entry in registry.EXPERIMENTS.values():
        module = entry.partition(":")[0]
        out.append(module.rsplit(".", 1)[0] if module.endswith(".experiment") else module)
    return out


def api_groups(modules: list[str] | None = None) -> dict[str, list[str]]:
    """The public modules in the API reference's groups, in order: "User API", "Experiments", "Extending", "Internals".

    Experiments: every module of the ``contllm.experiments`` package and of a registered
    experiment's package (``contllm.depth``, ...) that is neither user API nor extending, and
    the packages the experiments draw on (``contllm.attribution``).
    """
    modules = public_modules() if modules is None else modules
    packages = [*_experiment_packages(), "contllm.experiments", "contllm.attribution"]
    groups: dict[str, list[str]] = {"User API": [], "Experiments": [], "Extending": [], "Internals": []}
    for module in modules:
        if module in USER_API:
            groups["User API"].append(module)
        elif module in EXTENDING:
            groups["Extending"].append(module)
        elif any(module == p or module.startswith(p + ".") for p in packages):
            groups["Experiments"].append(module)
        else:
            groups["Internals"].append(module)
    groups["User API"].sort(key=lambda m: USER_API.index(m))
    groups["Extending"].sort(key=lambda m: EXTENDING.index(m))
    return {name: found for name, found in groups.items() if found}


# ---------------------------------------------------------------- notebooks


#: Where a notebook shown without outputs is written, with a first cell saying so.
UNRUN = ROOT / "build" / "docs-notebooks"

#: The first cell of a notebook page built without running the notebook.
UNRUN_NOTE = (
    "**This page shows the notebook without its outputs**: the site was built without running it. "
    "To see the outputs, run the notebooks once (`python -m pytest tests/notebooks`, which writes executed copies "
    "to `build/notebooks/`) and build the site again (`mkdocs build`); each notebook page then shows its last "
    "run's outputs and figures."
)


def unrun_copy(stored: Path) -> Path:
    """A copy of a stored notebook (no outputs) whose first cell says it was not run, and how to see it run."""
    import json

    notebook = json.loads(stored.read_text(encoding="utf-8"))
    note: dict[str, object] = {"cell_type": "markdown", "metadata": {}, "source": [UNRUN_NOTE]}
    if any("id" in cell for cell in notebook.get("cells", [])):
        note["id"] = "contllm-not-run"
    notebook["cells"] = [note, *notebook.get("cells", [])]
    target = UNRUN / "notebooks" / stored.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    return target


def notebook_pages() -> list[tuple[str, Path]]:
    """(name, path of the file the site shows) for each notebook: the executed copy when there is one, else a copy of
    the stored one whose first cell says it shows no outputs (:func:`unrun_copy`, written here)."""
    return [(name, path if path.parent == EXECUTED else unrun_copy(path)) for name, path in notebook_sources()]


def notebook_sources() -> list[tuple[str, Path]]:
    """(name, path of the notebook to show) for each notebook: the executed copy when there is one, else the stored
    one (which the site shows under a note, :func:`notebook_pages`)."""
    require = os.environ.get("CONTLLM_DOCS_EXECUTED") == "1"
    out = []
    for stored in sorted(NOTEBOOKS.glob("*.ipynb")):
        executed = EXECUTED / stored.name
        if executed.is_file() and executed.stat().st_mtime >= stored.stat().st_mtime:
            out.append((stored.name, executed))
        elif require:
            raise PluginError(
                f"no executed copy of {stored.name} newer than the notebook in {EXECUTED}; "
                "run the notebook tests first (pytest tests/notebooks)"
            )
        else:
            out.append((stored.name, stored))
    return out


# ---------------------------------------------------------------- MkDocs events


def _nav_files(nav: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, list):
        for entry in nav:
            found |= _nav_files(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _nav_files(value)
    return found


def _existing(nav: Any, docs: Path) -> Any:
    """The nav without entries whose page is neither written nor generated here."""
    generated = {COMMANDS_PAGE, FIGURES_PAGE}
    if isinstance(nav, str):
        return nav if (docs / nav).is_file() or nav in generated or "://" in nav else None
    if isinstance(nav, list):
        kept = [e for e in (_existing(e, docs) for e in nav) if e not in (None, [], {})]
        return kept
    if isinstance(nav, dict):
        kept = {k: v for k, v in ((k, _existing(v, docs)) for k, v in nav.items()) if v not in (None, [])}
        return kept or None
    return nav


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    nav = _existing(config["nav"] or [], docs)
    listed = _nav_files(nav)
    more = [p.name for p in sorted(docs.glob("*.md")) if p.name not in listed and p.name != API_FRONT]
    if more:
        nav.append({"More": more})
    nav.append({"Notebooks": [f"notebooks/{name}" for name, _ in notebook_sources()]})
    front = [API_FRONT] if (docs / API_FRONT).is_file() else []
    groups = [{name: [{m: f"reference/api/{m}.md"} for m in found]} for name, found in api_groups().items()]
    nav.append({"API reference": [*front, *groups]})
    config["nav"] = nav
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Every quoted number of the page as its source holds it now; an unknown key stops the build."""
    try:
        return str(quotes.render(markdown, keep_marks=False))
    except quotes.UnknownQuote as err:
        raise PluginError(f"{page.file.src_path}: {err}") from err


@event_priority(100)  # before mkdocs-jupyter looks at the files
def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, COMMANDS_PAGE, content=commands_page()))
    files.append(File.generated(config, FIGURES_PAGE, content=figures_page()))
    for module in public_modules():
        files.append(File.generated(config, f"reference/api/{module}.md", content=api_page(module)))
    for name, path in notebook_pages():
        # a plain File (not a generated one), which mkdocs-jupyter knows how to wrap
        files.append(File(f"notebooks/{name}", str(path.parents[1]), config["site_dir"], config["use_directory_urls"]))
    return files
