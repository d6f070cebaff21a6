"""Build-time parts of the documentation site (an MkDocs hook file; see mkdocs.yml).

Three kinds of page are made here rather than written by hand, so that they cannot go
stale (and every page's quoted numbers are filled in from their one source, docs/quotes.py):

- ``reference/commands.md``: every registered experiment with every option, read from
  the registry (the ``Option`` declarations) and from the command line's own ``--help``.
  An option without help text stops the build.
- ``reference/api/<module>.md``: one page per public module of ``contllm``, rendered by
  mkdocstrings from the docstrings.
- ``notebooks/<name>.ipynb``: the notebooks of ``notebooks/``, with the outputs of the run
  the test tier made (``tests/notebooks`` writes them to ``build/notebooks/``); without
  such a run, the stored notebooks without outputs, unless ``CONTLLM_DOCS_EXECUTED=1``
  asks for the executed ones (CI sets it), in which case a missing one stops the build.

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

    from contllm.cli import app

    done = CliRunner().invoke(app, args, prog_name="contllm", terminal_width=88)
    if done.exit_code != 0:
        raise PluginError(f"`contllm {' '.join(args)}` exited with {done.exit_code}: {done.output.strip()}")
    return done.output.rstrip()


def top_commands() -> list[str]:
    """The commands of ``contllm`` other than ``run``, as the command line lists them."""
    import click
    import typer

    from contllm.cli import app

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


# ---------------------------------------------------------------- notebooks


def notebook_sources() -> list[tuple[str, Path]]:
    """(name, path of the notebook to show) for each notebook: the executed copy when there is one."""
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
    generated = {COMMANDS_PAGE}
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
    more = [p.name for p in sorted(docs.glob("*.md")) if p.name not in listed]
    if more:
        nav.append({"More": more})
    nav.append({"Notebooks": [f"notebooks/{name}" for name, _ in notebook_sources()]})
    nav.append({"API reference": [{m: f"reference/api/{m}.md"} for m in public_modules()]})
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
    for module in public_modules():
        files.append(File.generated(config, f"reference/api/{module}.md", content=api_page(module)))
    for name, path in notebook_sources():
        # a plain File (not a generated one), which mkdocs-jupyter knows how to wrap
        files.append(File(f"notebooks/{name}", str(path.parents[1]), config["site_dir"], config["use_directory_urls"]))
    return files
