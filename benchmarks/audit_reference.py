"""The reference numbers of ``contllm audit``: each embedded model audited at fixed counts, into the package's data.

Usage (from the repository root; one model at a time, each in this process)::

    python benchmarks/audit_reference.py --models smollm2-135m,qwen2.5-coder-0.5b [--protocol contllm]

For every model it runs ``contllm.audit`` with the counts of :data:`COUNTS` (the audit's
own settings otherwise: the experiments' default options under the protocol) into
``build/audit-reference/<model>-<protocol>`` (an interrupted measurement continues there),
then writes the card's numbers, the date, the machine and this command into
``contllm/data/audit_reference.json`` (an entry of the same model and protocol is
replaced; the others are kept). Cards of every audit then show these numbers beside
their own. The load average is printed before and after each model and recorded, since
other processes only ever add time (the numbers themselves do not depend on it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

from contllm import logs
from contllm.audits import reference
from contllm.audits.run import audit
from contllm.hardware import cpu_capability
from contllm.rundir.files import atomic_write_text

#: Items per experiment (linearity: paths per source); more than a 3-minute budget gives on
#: a 2-core CPU, so that the reference intervals are narrower than a quick audit's.
COUNTS = {"counting": 40, "events": 16, "boolean": 24, "interpolation": 40, "linearity": 2, "sums": 8}

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "contllm" / "data" / reference.FILE


def machine() -> dict[str, object]:
    cap = cpu_capability()
    return {
        "cpu": cap["name"],
        "capability": cap["capability"],
        "cores": cap["cores"],
        "torch_threads": cap["threads"],
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--protocol", default="contllm", choices=("contllm", "paper"))
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "audit-reference")
    args = parser.parse_args()
    logs.configure(0)  # the audits' news on stderr, as the command line shows it
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        out = args.out / f"{model}-{args.protocol}"
        print(f"{model}: load average before {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
        started = time.perf_counter()
        card = audit(model, counts=COUNTS, out=out, protocol=args.protocol, device="cpu", resume=out.is_dir())
        load = os.getloadavg()
        print(
            f"{model}: {time.perf_counter() - started:.0f} s; load average after {' '.join(f'{v:.2f}' for v in load)}"
        )
        command = f"python benchmarks/audit_reference.py --models {model} --protocol {args.protocol}"
        entry = reference.entry(
            card, command, {**machine(), "load_average_after": [round(v, 2) for v in load]}, dt.date.today().isoformat()
        )
        data = json.loads(FILE.read_text(encoding="utf-8")) if FILE.is_file() else {"audits": []}
        data["about"] = (
            "Reference numbers of contllm audit, written by benchmarks/audit_reference.py: each embedded model "
            "audited at fixed counts; every number is the run's summary with a 95% bootstrap interval over items."
        )
        data["audits"] = [a for a in data["audits"] if (a["model"], a["protocol"]) != (model, args.protocol)]
        data["audits"].append(entry)
        atomic_write_text(FILE, json.dumps(data, indent=1) + "\n")
        for f in card.findings:
            print(
                f"  {f.experiment} ({f.items} items): "
                + ", ".join(
                    f"{n.metric} {n.value:.3f} [{n.low:.3f}, {n.high:.3f}]"
                    if n.value is not None and n.low is not None
                    else f"{n.metric} {n.value}"
                    for n in f.numbers
                )
            )
    print(FILE)


if __name__ == "__main__":
    main()
