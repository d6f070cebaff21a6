"""Reference numbers: the audit of each embedded model, at the audit's settings, shipped with the package.

``contllm/data/audit_reference.json`` is written by ``benchmarks/audit_reference.py``
(never by hand): one entry per (model, protocol) audit, with the date, the machine, the
command, the counts and every number of its card with its interval. A card shows them
beside its own numbers, so that a user reads "your model: 0.82; Qwen2.5-Coder-0.5B: 0.84".
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

#: The file of reference numbers, in the package's data.
FILE = "audit_reference.json"


def load() -> dict[str, Any] | None:
    """The shipped reference numbers, or None where the package holds none."""
    source = resources.files("contllm.data").joinpath(FILE)
    if not source.is_file():
        return None
    data = json.loads(source.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) and isinstance(data.get("audits"), list) else None


def values(refs: dict[str, Any] | None, protocol: str, experiment: str, metric: str) -> dict[str, dict[str, Any]]:
    """model -> {"value", "low", "high", "items"} of ``metric`` of ``experiment`` in the reference audits under ``protocol``."""
    out: dict[str, dict[str, Any]] = {}
    for entry in (refs or {}).get("audits", []):
        if entry.get("protocol") != protocol:
            continue
        number = entry.get("numbers", {}).get(experiment, {}).get(metric)
        if isinstance(number, dict):
            out[str(entry.get("model"))] = dict(number)
    return out


def about(refs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where the reference numbers come from: the file and, per audit, its model, protocol, date, machine and counts."""
    if refs is None:
        return None
    keys = ("model", "protocol", "measured", "machine", "counts", "command")
    return {
        "file": f"contllm/data/{FILE}",
        "audits": [{k: entry.get(k) for k in keys} for entry in refs.get("audits", [])],
    }


def entry(card: Any, command: str, machine: dict[str, Any], measured: str) -> dict[str, Any]:
    """A card as one entry of the reference file (what ``benchmarks/audit_reference.py`` writes)."""
    return {
        "model": card.model,
        "protocol": card.protocol,
        "measured": measured,
        "machine": machine,
        "command": command,
        "counts": {f.experiment: f.items for f in card.findings},
        "numbers": {
            f.experiment: {
                n.metric: {"value": n.value, "low": n.low, "high": n.high, "items": f.items} for n in f.numbers
            }
            for f in card.findings
        },
    }
