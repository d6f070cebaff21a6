"""The result of the attention-dynamics probe: records per (variant, T), as data.

Each record holds the text measures (perplexity, mean KL to the stock model, top-1
agreement, entropy), the per-prompt measures and the attention statistics (the pooled
distance profile m(d), its exponential and power-law fits, per-layer means and fits).
:class:`PDEResult` gives tidy rows (results.csv), the profile rows (profiles.csv), a
headline table per variant and a summary with a verdict on the shape of the profile.
Nothing here writes a file or draws: :mod:`contllm.rundir.runner` writes what
:meth:`PDEResult.to_dict` and the tables give, :mod:`contllm.pde.figures` draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contllm.errors import ExperimentError
from contllm.experiments.records import Records
from contllm.rundir.files import as_array, jsonable, read_json

#: Columns of results.csv (tidy rows, see :meth:`PDEResult.rows`) and of profiles.csv.
CSV_COLUMNS = ("variant", "T", "group", "quantity", "key", "value")
PROFILE_COLUMNS = ("variant", "T", "d", "m", "count")


def _mean(values: Any) -> float:
    array = as_array(values)
    return float(np.nanmean(array)) if array.size and np.isfinite(array).any() else float("nan")


@dataclass
class PDEResult(Records[dict[str, Any]], what="pde result"):
    """Every (variant, T) record of one model, in item order (the stock model, T = 0, first when run).

    experiment: "pde"; config: the probe's options as data (:meth:`PDEConfig.to_dict`);
    records: plain data (:func:`check_record`). n_layers: decoder layers of the model.
    text_tokens: tokens of the measured text. prompts: ids of the prompts whose measures
    each record lists, in that order.
    """

    n_layers: int
    text_tokens: int
    prompts: list[str]

    # ------------------------------------------------------------------ access
    @property
    def stock(self) -> dict[str, Any] | None:
        """The stock model's record (T = 0), or None in a run that selected points without it."""
        return next((r for r in self.records if r["variant"] == "stock"), None)

    def variants(self) -> list[str]:
        return list(dict.fromkeys(r["variant"] for r in self.records if r["variant"] != "stock"))

    def sweep(self, variant: str) -> list[dict[str, Any]]:
        """The records of one variant in order of T, starting from the stock model at T = 0 when present."""
        if variant not in self.variants():
            raise ExperimentError(
                f"no variant {variant!r} in this result; its variants are {', '.join(self.variants())}"
            )
        head = [] if self.stock is None else [self.stock]
        return head + sorted((r for r in self.records if r["variant"] == variant), key=lambda r: r["T"])

    def table(self, variant: str) -> list[dict[str, Any]]:
        """One row of headline numbers per T (see :meth:`summary`)."""
        rows = []
        for r in self.sweep(variant):
            fits = r["attention"]["fits"]
            exp_fit, pow_fit = fits["exponential"] or {}, fits["power"] or {}
            layers = r["attention"]["layers"]
            rows.append(
                {
                    "T": r["T"],
                    "perplexity": r["text"]["perplexity"],
                    "kl_text": r["text"]["kl"],
                    "top1_text": r["text"]["top1"],
                    "kl_prompts": _mean(r["prompts"]["kl"]),
                    "top1_prompts": _mean(r["prompts"]["top1"]),
                    "entropy_prompts": _mean(r["prompts"]["entropy"]),
                    "attention_entropy": _mean(layers["entropy"]),
                    "long_range_mass": _mean(layers["long_range_mass"]),
                    "sink_mass": _mean(layers["sink_mass"]),
                    "negative_mass": _mean(layers["negative_mass"]),
                    "decay_length": exp_fit.get("scale"),
                    "exponent": pow_fit.get("scale"),
                    "r2_exponential": exp_fit.get("r2"),
                    "r2_power": pow_fit.get("r2"),
                    "aic_exponential": exp_fit.get("aic"),
                    "aic_power": pow_fit.get("aic"),
                    "delta_aic": fits["delta_aic"],
                    "preferred": fits["preferred"],
                }
            )
        return rows

    def verdict(self, variant: str = "attention") -> str:
        """Whether the dynamics move the distance profile from exponential toward power-law decay."""
        if variant not in self.variants():
            return f"no {variant} sweep in this run"
        rows = [r for r in self.table(variant) if r["delta_aic"] is not None]
        if len(rows) < 2:
            return "too few fitted profiles for a verdict"
        first, last = rows[0], rows[-1]
        best = min(rows, key=lambda r: r["delta_aic"])
        trend = "toward" if last["delta_aic"] < first["delta_aic"] else "away from"
        kind = self.config.get("dynamics", "diffusion") if variant == "attention" else variant
        return (
            f"{kind}: the profile moves {trend} power-law decay (ΔAIC = AIC_power - AIC_exp "
            f"{first['delta_aic']:.1f} at T={first['T']:g} -> {last['delta_aic']:.1f} at T={last['T']:g}; most power-like at "
            f"T={best['T']:g}, ΔAIC {best['delta_aic']:.1f}); AIC prefers {first['preferred']} at T={first['T']:g} and "
            f"{last['preferred']} at T={last['T']:g}"
        )

    def summary(self) -> dict[str, Any]:
        """Headline numbers per variant and T, and the verdict of each attention variant."""
        variants = self.variants()
        out: dict[str, Any] = {
            "model": self.model,
            "text_tokens": self.text_tokens,
            "prompts": len(self.prompts),
            "dynamics": self.config.get("dynamics"),
            "verdict": self.verdict("attention" if "attention" in variants or not variants else variants[0]),
            "verdicts": {v: self.verdict(v) for v in variants},
        }
        for variant in variants:
            out[variant] = self.table(variant)
        out.update(self.headline("attention" if "attention" in variants or not variants else variants[0]))
        return out

    def headline(self, variant: str) -> dict[str, float]:
        """Scalars of one variant's sweep for reports: the prompts' KL against the stock model at the largest T
        ("kl_prompts_at_max_T") and how far ΔAIC moves from the first to the last fitted T ("delta_aic_shift",
        negative: toward power-law decay). A number the sweep cannot give is left out."""
        if variant not in self.variants():
            return {}
        rows = self.table(variant)
        out: dict[str, float] = {}
        if rows and rows[-1]["kl_prompts"] is not None:
            out["kl_prompts_at_max_T"] = float(rows[-1]["kl_prompts"])
        fitted = [r["delta_aic"] for r in rows if r["delta_aic"] is not None]
        if len(fitted) >= 2:
            out["delta_aic_shift"] = float(fitted[-1] - fitted[0])
        return out

    # ------------------------------------------------------------------ tables
    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows (:data:`CSV_COLUMNS`): text and prompt measures, attention means per layer, fit parameters."""
        out: list[dict[str, Any]] = []

        def add(r: dict[str, Any], group: str, quantity: str, key: Any, value: Any) -> None:
            out.append(
                {
                    "variant": r["variant"],
                    "T": r["T"],
                    "group": group,
                    "quantity": quantity,
                    "key": key,
                    "value": "" if value is None else value,
                }
            )

        for r in self.records:
            for quantity, value in r["text"].items():
                add(r, "text", quantity, "", value)
            for quantity, values in r["prompts"].items():
                for name, value in zip(self.prompts, values):
                    add(r, "prompt", quantity, name, value)
            for quantity, values in r["attention"]["layers"].items():
                for layer, value in enumerate(values):
                    add(r, "layer", quantity, layer, value)
            for model in ("exponential", "power"):
                for quantity, value in (r["attention"]["fits"][model] or {}).items():
                    if quantity != "model":
                        add(r, f"fit_{model}", quantity, "", value)
        return out

    def profile_rows(self) -> list[dict[str, Any]]:
        """m(d) and its count per record and distance d (:data:`PROFILE_COLUMNS`), where a query had a key at d."""
        out = []
        for r in self.records:
            for d, (m, c) in enumerate(zip(r["attention"]["profile"], r["attention"]["counts"])):
                if c:
                    out.append({"variant": r["variant"], "T": r["T"], "d": d, "m": "" if m is None else m, "count": c})
        return out

    # ------------------------------------------------------------------ data
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = jsonable(super().to_dict())  # non-finite numbers as null
        return data

    def check_loaded(self) -> None:
        if self.experiment != "pde":
            raise ValueError(f"it is a result of the {self.experiment!r} experiment")
        for record in self.records:
            check_record(record)

    @classmethod
    def load(cls, directory: str | Path) -> PDEResult:
        """Read results.json from a run directory (or the file itself)."""
        path = Path(directory)
        return cls.from_dict(read_json(path / "results.json" if path.is_dir() else path))


#: What every record holds, by section (what :func:`check_record` asks of a saved one).
RECORD_KEYS = {
    "text": ("tokens", "perplexity", "kl", "top1", "entropy"),
    "prompts": ("kl", "top1", "entropy"),
    "attention": ("profile", "counts", "fit_range", "fits", "layers", "layer_fits"),
}


def check_record(record: Any) -> dict[str, Any]:
    """``record`` itself when it has every part of a (variant, T) record; ValueError naming what is missing."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
    missing = [k for k in ("variant", "T", *RECORD_KEYS) if k not in record]
    missing += [
        f"{section}.{k}"
        for section, keys in RECORD_KEYS.items()
        if isinstance(record.get(section), dict)
        for k in keys
        if k not in record[section]
    ]
    missing += [s for s in RECORD_KEYS if s in record and not isinstance(record[s], dict)]
    if missing:
        raise ValueError(f"a pde record lacks {', '.join(missing)}")
    if (
        not isinstance(record["variant"], str)
        or isinstance(record["T"], bool)
        or not isinstance(record["T"], (int, float))
    ):
        raise ValueError(
            f"a pde record needs a variant name and a number T, got {record['variant']!r}, {record['T']!r}"
        )
    return record


__all__ = ["CSV_COLUMNS", "PROFILE_COLUMNS", "RECORD_KEYS", "PDEResult", "check_record"]
