"""docs/models.md's measured tables, regenerated: the whole built-in sets per model, and every model under both protocols.

    .venv/bin/python scripts/models_page.py                      # the whole-set runs still missing, then the tables
    .venv/bin/python scripts/models_page.py --models qwen2.5-coder-1.5b
    .venv/bin/python scripts/models_page.py --page-only          # the tables from the runs already made

Two kinds of record feed the page:

- **the whole built-in sets**: ``contllm run EXPERIMENT --model MODEL --no-item-figures --out
  OUT/MODEL-EXPERIMENT`` for every experiment of ``EXPERIMENTS``, every item of its built-in set,
  the experiment's default options (the contllm protocol), one run at a time so that each has the
  machine to itself. A run whose summary exists is not run again; one interrupted is resumed.
  Its wall time and the load averages before and after are kept beside it
  (OUT/MODEL-EXPERIMENT.time.json);
- **the atlas's audits** (``scripts/atlas.py``, runs/atlas/MODEL-PROTOCOL): every model under both
  protocols, as many items as each audit's budget gave.

Both are read through the same columns (``COLUMNS``: the experiment's ``summary.json`` keys and
how the page names them), with today's definitions of every number. The script writes
docs/measured/models.json (every value, the runs' times and loads, the date, the machine and
the command) and rewrites the tables of docs/models.md between their marks
(``<!-- models:whole -->``, ``<!-- models:audits:EXPERIMENT -->``); every cell is a quote
(``models.*``, docs/quotes.py), so the unit tests fail while the page and the record differ.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The models whose whole built-in sets the page reports (the default model and the larger one).
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: The models and protocols of the atlas's audits.
AUDITED = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
PROTOCOLS = ("contllm", "paper")
MEASURED = ROOT / "docs" / "measured" / "models.json"
PAGE = ROOT / "docs" / "models.md"
#: The duration sweeps' values (counting and events read out the same numbers).
SWEEP = {
    "accuracy_at_1": "accuracy at c = 1",
    "mean_spearman_implied_vs_factor": "Spearman of E[k] vs c",
    "pure_peak_rate": "pure peak rate",
    "chance_peak_rate": "chance peak rate",
    "unpure_peak_rate": "unpure peak rate",
    "auc_observed_time_sensitivity": "observed time-sensitivity AUC",
    "auc_counterfactual_time_sensitivity": "counterfactual AUC",
}
#: Per experiment: the summary.json keys the tables show, and each one's column heading.
COLUMNS: dict[str, dict[str, str]] = {
    "counting": SWEEP,
    "events": SWEEP,
    "boolean": {
        "accuracy_at_alpha_0": "accuracy at alpha 0",
        "accuracy_at_alpha_1": "accuracy at alpha 1",
        "mean_total_variation_p1": "mean total variation of P(1)",
        "mean_max_jump_p1": "mean largest step of P(1)",
    },
    "interpolation": {
        "accuracy_at_alpha_0": "accuracy at alpha 0",
        "accuracy_at_alpha_1": "accuracy at alpha 1",
        "crossover_share": "crossover share (first/second items)",
        "flip_share": "flip share",
        "mean_max_jump_yes_share": "mean largest step of the yes-share",
        "variation_share": "variation share",
        "mean_lipschitz": "mean Lipschitz",
    },
    "linearity": {
        "all_mean_r2": "R² of the chord, real",
        "all_mean_r2_baseline": "R², random direction",
        "interpolation_mean_r2": "R² word interpolation, real",
        "boolean_mean_r2": "R² Boolean, real",
        "prompt_mean_r2": "R² whole prompt, real",
        "all_mean_max_deviation": "mean max \\|p - chord\\|, real",
        "all_mean_max_deviation_baseline": "mean max \\|p - chord\\|, random",
    },
    "sums": {
        "accuracy_at_1": "accuracy at c = 1",
        "mean_spearman": "Spearman of the implied sum vs c",
        "median_slope_ratio": "median slope ratio",
        "valid_rate": "valid rate",
        "successful_rate": "successful",
        "strongly_successful_rate": "strongly successful",
        "completely_successful_rate": "completely successful",
    },
}
EXPERIMENTS = tuple(COLUMNS)


def duration(seconds: float) -> str:
    from docs.quotes import duration as written

    return written(seconds)


def number(value: object) -> str:
    """A summary value as the tables write it: three decimals, "-" where it is undefined."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.3f}"


def whole_run(model: str, experiment: str, out: Path) -> dict:
    """Run (or resume) one experiment over its whole built-in set unless its summary exists; its wall time and load."""
    from scripts.atlas import timed

    folder = out / f"{model}-{experiment}"
    timing = out / f"{model}-{experiment}.time.json"
    if (folder / "summary.json").is_file() and timing.is_file():
        return json.loads(timing.read_text(encoding="utf-8"))
    command = [sys.executable, "-m", "contllm", "run", experiment, "--model", model, "--no-item-figures"]
    command += ["--out", str(folder)] + (["--resume"] if folder.exists() else [])
    record = timed(command, out / f"{model}-{experiment}")
    print(f"  {duration(record['seconds'])}", flush=True)
    return record


def values(summary: dict, experiment: str) -> dict[str, object]:
    return {key: summary.get(key) for key in COLUMNS[experiment]}


def measure(out: Path, atlas: Path, models: tuple[str, ...]) -> dict:
    """Every value the tables show, from the whole-set runs under ``out`` and the audits under ``atlas``."""
    from contllm.hardware import describe

    quotes: dict[str, str] = {}
    whole = []
    for model in models:
        for experiment in EXPERIMENTS:
            folder = out / f"{model}-{experiment}"
            if not (folder / "summary.json").is_file():
                continue
            summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
            timing = json.loads((out / f"{model}-{experiment}.time.json").read_text(encoding="utf-8"))
            key = f"models.whole.{model}.{experiment}"
            row = {"model": model, "experiment": experiment, "items": summary["items"], **timing}
            row["values"] = values(summary, experiment)
            quotes[f"{key}.items"] = str(summary["items"])
            quotes[f"{key}.seconds"] = duration(timing["seconds"])
            quotes[f"{key}.load"] = f"{timing['load_before']:.2f} / {timing['load_after']:.2f}"
            for name, value in row["values"].items():
                quotes[f"{key}.{name}"] = number(value)
            whole.append(row)
    # How much longer each experiment's run took on the larger model than on the smaller one.
    small, large = MODELS
    seconds = {(row["model"], row["experiment"]): row["seconds"] for row in whole}
    ratios = [
        seconds[large, e] / seconds[small, e] for e in EXPERIMENTS if (small, e) in seconds and (large, e) in seconds
    ]
    if ratios:
        quotes["models.whole.ratio"] = f"{min(ratios):.1f} to {max(ratios):.1f}"
    audits = []
    for model in AUDITED:
        for protocol in PROTOCOLS:
            folder = atlas / f"{model}-{protocol}"
            if not (folder / "audit.json").is_file():
                continue
            seconds = json.loads((folder / "audit.json").read_text(encoding="utf-8"))["seconds"]["runs"]
            for experiment in EXPERIMENTS:
                summary_file = folder / experiment / "summary.json"
                if not summary_file.is_file():
                    continue
                summary = json.loads(summary_file.read_text(encoding="utf-8"))
                key = f"models.audit.{model}.{protocol}.{experiment}"
                row = {"model": model, "protocol": protocol, "experiment": experiment, "items": summary["items"]}
                row["seconds"] = seconds.get(experiment)
                row["values"] = values(summary, experiment)
                quotes[f"{key}.items"] = str(summary["items"])
                quotes[f"{key}.seconds"] = "-" if row["seconds"] is None else duration(row["seconds"])
                for name, value in row["values"].items():
                    quotes[f"{key}.{name}"] = number(value)
                audits.append(row)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.machine()}, {describe()}"
    quotes["models.date"] = date
    quotes["models.machine"] = machine
    return {"date": date, "machine": machine, "whole": whole, "audits": audits, "quotes": quotes}


def quoted(measured: dict, key: str) -> str:
    return f"<!--q:{key}-->{measured['quotes'][key]}<!--/q-->"


def whole_table(measured: dict) -> str:
    """One row per model and experiment of the whole sets: items, what was measured, wall time, load."""
    lines = [
        "| model | experiment | items | what was measured, from `summary.json` | wall time | load before / after |",
        "|---|---|---|---|---|---|",
    ]
    for row in measured["whole"]:
        key = f"models.whole.{row['model']}.{row['experiment']}"
        what = "; ".join(
            f"{title} {quoted(measured, f'{key}.{name}')}" for name, title in COLUMNS[row["experiment"]].items()
        )
        cells = [row["model"], row["experiment"], quoted(measured, f"{key}.items"), what]
        cells += [quoted(measured, f"{key}.seconds"), quoted(measured, f"{key}.load")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def audit_table(measured: dict, experiment: str) -> str:
    """One row per model and protocol of the audits that ran ``experiment``, one column per value."""
    columns = COLUMNS[experiment]
    lines = [
        "| model | protocol | items | " + " | ".join(columns.values()) + " | run time |",
        "|---|---|---|" + "---|" * len(columns) + "---|",
    ]
    for row in measured["audits"]:
        if row["experiment"] != experiment:
            continue
        key = f"models.audit.{row['model']}.{row['protocol']}.{experiment}"
        cells = [row["model"], row["protocol"], quoted(measured, f"{key}.items")]
        cells += [quoted(measured, f"{key}.{name}") for name in columns]
        cells.append(quoted(measured, f"{key}.seconds"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_between(text: str, mark: str, body: str) -> str:
    start_mark, end_mark = f"<!-- {mark} -->", f"<!-- /{mark} -->"
    start, end = text.index(start_mark) + len(start_mark), text.index(end_mark)
    return text[:start] + "\n" + body + "\n" + text[end:]


def write_page(measured: dict) -> None:
    text = PAGE.read_text(encoding="utf-8")
    text = replace_between(text, "models:whole", whole_table(measured))
    for experiment in EXPERIMENTS:
        text = replace_between(text, f"models:audits:{experiment}", audit_table(measured, experiment))
    PAGE.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model aliases (whole sets)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "whole", help="where the whole-set runs go")
    parser.add_argument("--atlas", type=Path, default=ROOT / "runs" / "atlas", help="the atlas's audits")
    parser.add_argument("--page-only", action="store_true", help="no run: the tables from the runs already made")
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        for model in models:
            for experiment in EXPERIMENTS:
                whole_run(model, experiment, args.out)
    measured = measure(args.out, args.atlas, MODELS)
    MEASURED.write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8")
    write_page(measured)
    from docs.quotes import write

    write()
    print(f"wrote {MEASURED.relative_to(ROOT)} and {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
