"""The result of the attention-dynamics probe: records per (variant, T), saved and summarised.

Each record holds the text measures (perplexity, mean KL to the stock model, top-1
agreement, entropy), the per-prompt measures and the attention statistics (the pooled
distance profile m(d), its exponential and power-law fits, per-layer means and fits).
:class:`PDEResult` writes results.json, results.csv (tidy rows) and profiles.csv, gives a
summary with a verdict on the shape of the profile, and draws the figures.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contllm.errors import ExperimentError

FIGURES = ("outputs", "profiles", "fits", "attention")
CSV_COLUMNS = ("variant", "T", "group", "quantity", "key", "value")


def jsonable(value: Any) -> Any:
    """Numbers, arrays and tensors as JSON values (non-finite numbers as null)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.floating, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def as_array(values: Any) -> np.ndarray:
    """A float array from JSON lists (null reads as NaN)."""
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


def _mean(values: Any) -> float:
    array = as_array(values)
    return float(np.nanmean(array)) if array.size and np.isfinite(array).any() else float("nan")


@dataclass
class PDEResult:
    """Every (variant, T) record of one model; ``records[0]`` is the stock model (T = 0)."""

    model: str
    config: dict[str, Any]
    n_layers: int
    text_tokens: int
    prompts: list[str]
    records: list[dict[str, Any]]

    # ------------------------------------------------------------------ access
    @property
    def stock(self) -> dict[str, Any]:
        return self.records[0]

    def variants(self) -> list[str]:
        return list(dict.fromkeys(r["variant"] for r in self.records if r["variant"] != "stock"))

    def sweep(self, variant: str) -> list[dict[str, Any]]:
        """The records of one variant in order of T, starting from the stock model at T = 0."""
        if variant not in self.variants():
            raise ExperimentError(f"no variant {variant!r} in this result; its variants are {', '.join(self.variants())}")
        return [self.stock] + sorted((r for r in self.records if r["variant"] == variant), key=lambda r: r["T"])

    def table(self, variant: str) -> list[dict[str, Any]]:
        """One row of headline numbers per T (see :meth:`summary`)."""
        rows = []
        for r in self.sweep(variant):
            fits = r["attention"]["fits"]
            exp_fit, pow_fit = fits["exponential"] or {}, fits["power"] or {}
            layers = r["attention"]["layers"]
            rows.append({
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
            })
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
            f"{first['delta_aic']:.1f} at T=0 -> {last['delta_aic']:.1f} at T={last['T']:g}; most power-like at "
            f"T={best['T']:g}, ΔAIC {best['delta_aic']:.1f}); AIC prefers {first['preferred']} at T=0 and "
            f"{last['preferred']} at T={last['T']:g}"
        )

    def summary(self) -> dict[str, Any]:
        """Headline numbers per variant and T, and the verdict of each attention variant."""
        out: dict[str, Any] = {
            "model": self.model,
            "text_tokens": self.text_tokens,
            "prompts": len(self.prompts),
            "dynamics": self.config.get("dynamics"),
            "verdict": self.verdict("attention") if "attention" in self.variants() else self.verdict(self.variants()[0]),
            "verdicts": {v: self.verdict(v) for v in self.variants()},
        }
        for variant in self.variants():
            out[variant] = self.table(variant)
        return out

    # ------------------------------------------------------------------ saving
    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows: text and prompt measures, attention means per layer, fit parameters."""
        out: list[dict[str, Any]] = []

        def add(r: dict[str, Any], group: str, quantity: str, key: Any, value: Any) -> None:
            out.append({"variant": r["variant"], "T": r["T"], "group": group, "quantity": quantity, "key": key,
                        "value": "" if value is None else value})

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
        out = []
        for r in self.records:
            for d, (m, c) in enumerate(zip(r["attention"]["profile"], r["attention"]["counts"])):
                if c:
                    out.append({"variant": r["variant"], "T": r["T"], "d": d, "m": "" if m is None else m, "count": c})
        return out

    def to_dict(self) -> dict[str, Any]:
        return jsonable({
            "experiment": "pde",
            "model": self.model,
            "config": self.config,
            "n_layers": self.n_layers,
            "text_tokens": self.text_tokens,
            "prompts": self.prompts,
            "records": self.records,
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PDEResult:
        try:
            return cls(
                model=str(data["model"]), config=dict(data["config"]), n_layers=int(data["n_layers"]),
                text_tokens=int(data["text_tokens"]), prompts=[str(p) for p in data["prompts"]],
                records=list(data["records"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExperimentError(f"malformed pde result: {exc}") from None

    @classmethod
    def load(cls, directory: str | Path) -> PDEResult:
        """Read results.json from a run directory (or the file itself)."""
        path = Path(directory)
        path = path / "results.json" if path.is_dir() else path
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise ExperimentError(f"cannot read {path}: {exc}") from None

    def save(self, directory: str | Path) -> list[Path]:
        """results.json, results.csv and profiles.csv under ``directory``."""
        from contllm.runs import atomic_write_json, atomic_write_text

        directory = Path(directory)
        return [
            atomic_write_json(directory / "results.json", self.to_dict()),
            atomic_write_text(directory / "results.csv", _csv(self.rows(), CSV_COLUMNS)),
            atomic_write_text(directory / "profiles.csv", _csv(self.profile_rows(), ("variant", "T", "d", "m", "count"))),
        ]

    # ------------------------------------------------------------------ figures
    def plot(self, name: str = "outputs") -> Any:
        """One figure: "outputs", "profiles", "fits" or "attention" (see :mod:`contllm.pde.figures`)."""
        from contllm.pde import figures

        if name not in FIGURES:
            raise ExperimentError(f"unknown pde figure {name!r}; the figures are {', '.join(FIGURES)}")
        return getattr(figures, f"{name}_figure")(self)

    def save_figures(self, directory: str | Path) -> list[Path]:
        """Every figure as PNG and PDF under ``directory``."""
        from contllm.plotting import save_figure

        paths: list[Path] = []
        for name in FIGURES:
            paths += save_figure(self.plot(name), Path(directory) / name)
        return paths


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
