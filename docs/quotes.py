"""Numbers the pages quote from one source: the measured default run and the experiments' defaults.

A page (README.md or any page under docs/) quotes a value as

    <!--q:main_job.end_to_end-->2 min 31 s<!--/q-->

which reads as plain text wherever Markdown is shown. The key names the source:

- ``main_job.*``: the default run as ``benchmarks/main_job.py --record`` measured it last
  (``docs/measured/main_job.json``: date, machine, command, times, summary);
- ``atlas.*``: the continuity atlas as ``scripts/atlas.py`` measured it last
  (``docs/measured/atlas.json``: every audit's headline numbers, wall times and load, the
  atlas's sentence per experiment, date, machine and command);
- ``models.*``: docs/models.md's measured tables as ``scripts/models_page.py`` read them last
  (``docs/measured/models.json``: the whole built-in sets' runs and every audit's summary
  values, the runs' wall times and load, date and machine);
- ``default.<experiment>.*``: what the experiment registry declares (``items`` built in,
  ``samples``, ``values`` of the knob per item, ``range``; ``paper_samples``), and
  ``default.model``, the model a run loads when none is named.

The documentation site is built with every quote replaced by the current value
(docs/hooks.py), a unit test fails while any page's quoted text differs from it
(tests/unit/test_docs.py), and ``python docs/quotes.py --write`` rewrites the quoted text of
every page after a new measurement. A quote never starts a line (Markdown would take the
comment for a block of HTML) nor sits in a code span.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "measured"
MAIN_JOB = MEASURED / "main_job.json"
ATLAS = MEASURED / "atlas.json"
MODELS = MEASURED / "models.json"
QUOTE = re.compile(r"<!--q:([A-Za-z0-9_.\-]+)-->(.*?)<!--/q-->", re.S)


class UnknownQuote(KeyError):
    """A page quotes a key that no source holds."""


def duration(seconds: float) -> str:
    """How the pages write a wall time: "48 s", "3 min 05 s"."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60:02d} s"


def main_job_values(path: Path = MAIN_JOB) -> dict[str, str]:
    """The quotable values of the recorded main job (empty when it has not been recorded)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    seconds = data["seconds"]
    summary = data["summary"]
    out = {
        "date": data["date"],
        "machine": data["machine"]["description"],
        "cpu": data["machine"]["cpu"],
        "load": f"{data['load_average']['before']:.1f} before, {data['load_average']['after']:.1f} after",
        "command": data["command"],
        "model": data["model"],
        "items": str(data["items"]),
        "dtype": data["dtype"],
        "end_to_end": duration(seconds["end_to_end"]),
        "evaluation": duration(seconds["evaluation"]),
        "load_model": duration(seconds["load"]),
        "outputs": duration(seconds["outputs"]),
        "overhead": f"{data['overhead']:.2f}x",
        "efficiency": f"{data['efficiency']:.2f}",
        "matmul_rate": f"{data['matmul_gflops']:.0f} GFLOP/s",
        "tflop": f"{data['tflop']:.1f}",
        "cache": data["cache"],
        "peak_memory": f"{data['peak_rss_gb']:.1f} GB",
    }
    for name, value in summary.items():
        if isinstance(value, float):
            out[name] = f"{value:.3f}"
    return {f"main_job.{k}": v for k, v in out.items()}


def recorded_quotes(path: Path) -> dict[str, str]:
    """The ``quotes`` of a measured record (empty when it has not been recorded)."""
    if not path.is_file():
        return {}
    return {str(k): str(v) for k, v in json.loads(path.read_text())["quotes"].items()}


def atlas_values(path: Path = ATLAS) -> dict[str, str]:
    """The quotable values of the recorded atlas (empty when it has not been recorded)."""
    return recorded_quotes(path)


def models_values(path: Path = MODELS) -> dict[str, str]:
    """The quotable values of docs/models.md's measured tables (empty when they have not been recorded)."""
    return recorded_quotes(path)


def default_values() -> dict[str, str]:
    """``default.<experiment>.<what>`` for every registered experiment, read from its config class."""
    from contllm import registry
    from contllm.experiments.sweeps import DurationSweepConfig, sweep_values
    from contllm.models import DEFAULT_MODEL

    out: dict[str, str] = {"default.model": DEFAULT_MODEL}
    for name in registry.names():
        experiment = registry.get(name)
        config_class = getattr(experiment, "Config", None)
        config = config_class() if config_class is not None else None
        key = f"default.{name}"
        try:
            out[f"{key}.items"] = str(len(list(experiment.items(config))))
        except (AttributeError, TypeError, NotImplementedError):
            pass
        samples = getattr(config, "samples", None)
        if isinstance(samples, int):
            out[f"{key}.samples"] = str(samples)
            low, high = getattr(config, "low", None), getattr(config, "high", None)
            if isinstance(low, float) and isinstance(high, float):
                out[f"{key}.range"] = f"{low:g} to {high:g}"
                include = 1.0 if isinstance(config, DurationSweepConfig) else None
                out[f"{key}.values"] = str(len(sweep_values(low, high, samples, include=include)))
        paper = getattr(config_class, "PAPER_SAMPLES", None)
        if isinstance(paper, int) and any(option.name == "protocol" for option in experiment.options):
            out[f"{key}.paper_samples"] = str(paper)
    return out


@cache
def values() -> dict[str, str]:
    """Every quotable key and its text."""
    return {**main_job_values(), **atlas_values(), **models_values(), **default_values()}


def quotes(text: str) -> Iterator[tuple[str, str]]:
    """(key, quoted text) of every quote in ``text``."""
    for match in QUOTE.finditer(text):
        yield match.group(1), match.group(2)


def render(text: str, lookup: Callable[[], dict[str, str]] = values, *, keep_marks: bool = True) -> str:
    """``text`` with every quote's text replaced by the current value; UnknownQuote for a key no source holds.

    keep_marks: keep the quote's comments around the value (the pages' source); False leaves
    the value alone (the built site).
    """
    known = lookup()

    def current(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in known:
            raise UnknownQuote(f"unknown quoted value {key!r}")
        return f"<!--q:{key}-->{known[key]}<!--/q-->" if keep_marks else known[key]

    return QUOTE.sub(current, text)


def misplaced(text: str) -> list[str]:
    """Lines where a quote would not read as text: at the start of a line (Markdown takes the
    comment for an HTML block there) or inside a code span (shown verbatim)."""
    return [
        line
        for line in text.splitlines()
        if line.startswith("<!--q:") or any(line[: m.start()].count("`") % 2 for m in re.finditer("<!--q:", line))
    ]


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def write() -> list[Path]:
    """Rewrite the quoted text of every page from the sources; returns the pages that changed."""
    changed = []
    for page in pages():
        text = page.read_text()
        new = render(text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def _main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python docs/quotes.py --write   (rewrite every page's quoted values from their sources)")
        return 2
    for page in write():
        print(page.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
