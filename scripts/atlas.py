"""The continuity atlas: every embedded model audited under both protocols, compared, and docs/atlas.md regenerated.

    .venv/bin/python scripts/atlas.py                  # the audits still missing, then the comparison and the page
    .venv/bin/python scripts/atlas.py --budget 10m     # each audit's time budget (default 6m; see LARGER)
    .venv/bin/python scripts/atlas.py --page-only      # the comparison and the page from the audits already made

Each audit is ``contllm audit MODEL --protocol P --budget B --out OUT/MODEL-P`` (OUT: runs/atlas;
``--include sums,circuit`` where INCLUDE says),
one at a time so that each has the machine to itself; one whose card exists is not run again,
and one interrupted is resumed. Its wall time and the load averages before and after are kept
beside it (OUT/MODEL-P.time.json). Then ``contllm audit --compare`` sets the cards side by side
in OUT/compared (compare.html and the atlas's figures), and this script writes:

- docs/measured/atlas.json: per audit its headline numbers with their 95% intervals and item
  counts, wall time and load; the atlas's sentence per number; the date, machine and command.
  docs/quotes.py reads it: docs/atlas.md quotes its values as ``atlas.<key>``, and the unit
  tests fail while the page differs from it;
- docs/images/atlas/<experiment>.png: the figure of each experiment's headline number;
- the table of docs/atlas.md, between its ``<!-- atlas:table -->`` marks, and the quoted values of
  its prose (``python docs/quotes.py --write``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: Audits that run the optional studies (sums, circuit) whatever their budget (``contllm audit --include``): the
#: paper's protocol on the Qwen models, where a budget large enough for them to join by themselves would take more
#: than an hour on a 2-core CPU (the equal shares must first give counting its comfortable count).
INCLUDE = {("qwen2.5-coder-0.5b", "paper"): "sums,circuit", ("qwen2.5-coder-1.5b", "paper"): "sums,circuit"}
#: Audits whose smallest plan needs more than the default budget on a 2-core CPU, and the budget they get, the load,
#: the calibration and the card covered: the paper's protocol on the Qwen models with sums and circuit (on the
#: 1.5B the calibration alone takes about 70 s, the five others at their smallest count about 8 minutes, sums'
#: four problems about 8 more).
LARGER = {("qwen2.5-coder-0.5b", "paper"): "9m", ("qwen2.5-coder-1.5b", "paper"): "25m"}
PROTOCOLS = ("contllm", "paper")
MEASURED = ROOT / "docs" / "measured" / "atlas.json"
IMAGES = ROOT / "docs" / "images" / "atlas"
PAGE = ROOT / "docs" / "atlas.md"
TABLE_START, TABLE_END = "<!-- atlas:table -->", "<!-- /atlas:table -->"
#: The experiments of the table, in the card's order, and how a column names each.
COLUMNS = {
    "counting": "counting",
    "events": "events",
    "boolean": "Boolean",
    "interpolation": "word interpolation",
    "linearity": "linearity",
    "sums": "sums",
    "circuit": "circuit",
}


def load_average() -> float:
    return os.getloadavg()[0]


def timed(command: list[str], stem: Path, **extra: object) -> dict:
    """Run ``command`` (output appended to STEM.log); its wall time and the load averages before and after, with
    ``extra``, written to STEM.time.json and returned."""
    print(" ".join(command[1:]), flush=True)
    before, started = load_average(), time.perf_counter()
    with open(stem.with_name(stem.name + ".log"), "a", encoding="utf-8") as log:
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    record = {
        "seconds": round(time.perf_counter() - started, 1),
        "load_before": round(before, 2),
        "load_after": round(load_average(), 2),
        **extra,
    }
    stem.with_name(stem.name + ".time.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def audit(model: str, protocol: str, out: Path, budget: str) -> dict:
    """Run (or resume) one audit unless its card exists; its wall time and load, kept beside it."""
    folder = out / f"{model}-{protocol}"
    timing = out / f"{model}-{protocol}.time.json"
    if (folder / "card.json").is_file() and timing.is_file():
        return json.loads(timing.read_text(encoding="utf-8"))
    command = [sys.executable, "-m", "contllm", "audit", model, "--protocol", protocol, "--budget", budget]
    included = INCLUDE.get((model, protocol))
    command += ["--include", included] if included else []
    command += ["--out", str(folder)] + (["--resume"] if folder.exists() else [])
    return timed(command, out / f"{model}-{protocol}", budget=budget)


def duration(seconds: float) -> str:
    from docs.quotes import duration as written

    return written(seconds)


def cell(number: dict, items: int) -> str:
    """A headline number as the table writes it: value [low, high] (three significant digits), n items."""

    def text(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3g}"

    interval = f" [{text(number['low'])}, {text(number['high'])}]" if number["low"] is not None else ""
    return f"{text(number['value'])}{interval}, {items} items"


def measure(out: Path, budget: str, models: tuple[str, ...]) -> dict:
    """Everything the page quotes, from the audits under ``out`` and their comparison."""
    from contllm.audits import atlas
    from contllm.audits.card import load_card
    from contllm.hardware import describe

    audits, quotes, cards = [], {}, []
    total = 0.0
    for model in models:
        for protocol in PROTOCOLS:
            folder = out / f"{model}-{protocol}"
            timing = json.loads((out / f"{model}-{protocol}.time.json").read_text(encoding="utf-8"))
            card = load_card(folder)
            cards.append((f"{model} ({protocol})", card, folder))
            total += timing["seconds"]
            key = f"atlas.{model}.{protocol}"
            quotes[f"{key}.seconds"] = duration(timing["seconds"])
            quotes[f"{key}.load"] = f"{timing['load_before']:.1f} / {timing['load_after']:.1f}"
            quotes[f"{key}.budget"] = timing["budget"]
            numbers = {}
            for finding in card.findings:
                head = finding.headline
                numbers[finding.experiment] = {
                    "metric": head.metric,
                    "value": head.value,
                    "low": head.low,
                    "high": head.high,
                    "items": finding.items,
                }
                quotes[f"{key}.{finding.experiment}"] = cell(numbers[finding.experiment], finding.items)
                quotes[f"{key}.{finding.experiment}.metric"] = head.metric
            audits.append({"model": model, "protocol": protocol, **timing, "headline": numbers})
    trends = {}
    for entry in atlas.entries(cards):
        if entry.role == "headline":
            trends[entry.experiment] = {"metric": entry.metric, "sentence": entry.sentence, "detail": entry.detail}
            quotes[f"atlas.trend.{entry.experiment}"] = entry.sentence
            quotes[f"atlas.trend.{entry.experiment}.detail"] = entry.detail
    quotes["atlas.total"] = duration(total)
    quotes["atlas.budget"] = budget
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    quotes["atlas.date"] = date
    machine = f"{platform.machine()}, {describe()}"
    quotes["atlas.machine"] = machine
    command = f"python scripts/atlas.py --budget {budget}"
    quotes["atlas.command"] = command
    return {
        "date": date,
        "machine": machine,
        "command": command,
        "budget": budget,
        "total_seconds": round(total, 1),
        "audits": audits,
        "trends": trends,
        "quotes": quotes,
    }


def table(measured: dict) -> str:
    """The page's table: one row per model and protocol, one column per experiment, every cell a quote."""
    present = [e for e in COLUMNS if any(e in a["headline"] for a in measured["audits"])]
    lines = [
        "| model | protocol | "
        + " | ".join(COLUMNS[e] for e in present)
        + " | budget | wall time | load before / after |",
        "|---|---|" + "---|" * len(present) + "---|---|---|",
    ]
    for a in measured["audits"]:
        key = f"atlas.{a['model']}.{a['protocol']}"
        cells = [
            f"<!--q:{key}.{e}-->{measured['quotes'][f'{key}.{e}']}<!--/q-->" if e in a["headline"] else "not run"
            for e in present
        ]
        timing = [
            f"<!--q:{key}.{what}-->{measured['quotes'][f'{key}.{what}']}<!--/q-->"
            for what in ("budget", "seconds", "load")
        ]
        lines.append(f"| {a['model']} | {a['protocol']} | " + " | ".join(cells + timing) + " |")
    metrics = sorted({(e, a["headline"][e]["metric"]) for a in measured["audits"] for e in a["headline"]})
    named = "; ".join(f"{COLUMNS.get(e, e)}: `{m}`" for e, m in metrics)
    lines += [
        "",
        f"Each cell: the headline number, its 95% bootstrap interval over items, and the item count ({named}).",
    ]
    return "\n".join(lines)


def write_page(measured: dict) -> None:
    text = PAGE.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    PAGE.write_text(text[:start] + "\n" + table(measured) + "\n" + text[end:], encoding="utf-8")


def copy_figures(out: Path, measured: dict) -> None:
    """The compared atlas's figure of each experiment's headline number, as docs/images/atlas/<experiment>.png."""
    from contllm.audits import atlas
    from contllm.audits.card import load_card

    cards = [
        (
            f"{a['model']} ({a['protocol']})",
            load_card(out / f"{a['model']}-{a['protocol']}"),
            out / f"{a['model']}-{a['protocol']}",
        )
        for a in measured["audits"]
    ]
    IMAGES.mkdir(parents=True, exist_ok=True)
    for entry in atlas.entries(cards):
        source = out / "compared" / atlas.ATLAS / f"{entry.name}.png"
        if entry.role == "headline" and source.is_file():
            shutil.copyfile(source, IMAGES / f"{entry.experiment}.png")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="6m", help="each audit's time budget (default 6m)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "atlas", help="where the audits go")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model aliases")
    parser.add_argument("--page-only", action="store_true", help="no audit: the comparison and the page only")
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not args.page_only:
        for model in models:
            for protocol in PROTOCOLS:
                audit(model, protocol, args.out, LARGER.get((model, protocol), args.budget))
    folders = [str(args.out / f"{m}-{p}") for m in models for p in PROTOCOLS]
    compare = [sys.executable, "-m", "contllm", "audit", "--compare", *folders, "--out", str(args.out / "compared")]
    subprocess.run([*compare, "--force"], check=True, stdin=subprocess.DEVNULL)
    measured = measure(args.out, args.budget, models)
    MEASURED.write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
    copy_figures(args.out, measured)
    write_page(measured)
    from docs.quotes import write

    write()  # every quote of every page, docs/atlas.md's prose included, from the new measurement
    print(
        f"wrote {MEASURED.relative_to(ROOT)}, {PAGE.relative_to(ROOT)} and {IMAGES.relative_to(ROOT)}/ "
        f"in {duration(time.perf_counter() - started)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
