"""The result of the depth probes: plain data (per-prompt records and their aggregates), no files, no plots.

:class:`PromptDepth` holds every probe on one prompt, :class:`DepthResult` those of a
run; both go to and from JSON-able dicts. Aggregates (quantiles, the largest Lipschitz
estimates, contraction verdicts, curves averaged over prompts), the summary and the CSV
rows are computed here; :mod:`contllm.depth.figures` draws them and the runner writes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contllm.errors import ExperimentError
from contllm.experiments.records import Record, Records
from contllm.rundir.files import as_array, jsonable


@dataclass
class PromptDepth(Record, what="depth record"):
    """Every probe on one prompt. Arrays are over layers (see each probe's function).

    profile: :func:`step_profile`; lipschitz: :func:`layer_lipschitz`; propagation: one
    :func:`propagate` record per (layer, eps); fractional: :func:`fractional_depth`;
    half: :func:`half_step_defects`. tokens: the decoded tokens (or None). token_strings:
    the read-out tokens (fractional["top_ids"]) decoded, by id (empty without a tokenizer).
    """

    id: str
    text: str | None
    token_ids: list[int]
    tokens: list[str] | None
    profile: dict[str, np.ndarray]
    lipschitz: dict[str, Any]
    propagation: list[dict[str, Any]]
    fractional: dict[str, Any]
    half: dict[str, Any]
    seconds: float = 0.0
    token_strings: dict[str, str] = field(default_factory=dict)

    def check_loaded(self) -> None:
        """Arrays where the probes hold them (the rest of a probe's dict stays as read)."""
        lip = self.lipschitz
        self.lipschitz = {
            "eps": list(lip["eps"]),
            "L": {k: as_array(v) for k, v in lip["L"].items()},
            "mu": {k: as_array(v) for k, v in lip["mu"].items()},
            **{k: as_array(lip[k]) for k in ("sigma_max", "lambda_max", "sigma_residual", "lambda_residual")},
        }
        arrays = ("gain", "spread", "relative", "growth")
        self.propagation = [{**r, **{k: as_array(r[k]) for k in arrays}} for r in self.propagation]
        self.half = {k: (as_array(v) if isinstance(v, list) else v) for k, v in self.half.items()}


QUANTILES = (5, 25, 50, 75, 95)
CSV_COLUMNS = ("prompt", "probe", "quantity", "target", "layer", "x", "value")


def _geomean(curves: Sequence[np.ndarray]) -> np.ndarray:
    stacked = np.vstack([np.asarray(c, dtype=np.float64) for c in curves])
    with np.errstate(divide="ignore"):
        return np.exp(np.mean(np.log(stacked), axis=0))


@dataclass
class DepthResult(Records[PromptDepth], record=PromptDepth, what="depth result"):
    """The depth probes of one model on a few prompts.

    experiment: "depth"; model: its name; config: the :class:`DepthConfig` as a dict;
    records: one :class:`PromptDepth` per prompt; n_layers; layers: the single-layer probe
    layers; token_strings: decoded read-out tokens by id (for legends).
    """

    n_layers: int
    layers: list[int]
    token_strings: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ aggregates
    def profile_quantiles(self) -> dict[str, np.ndarray]:
        """Quantiles (5, 25, 50, 75, 95 %) over every kept token of every prompt:
        {"ratio": [L, 5], "curvature": [L-1, 5], "cosine": [L-1, 5]}."""
        out = {}
        for key in ("ratio", "curvature", "cosine"):
            pooled = np.concatenate([np.asarray(r.profile[key]) for r in self.records], axis=1)
            out[key] = np.percentile(pooled, QUANTILES, axis=1).T
        return out

    def lipschitz_table(self) -> dict[str, np.ndarray]:
        """Per layer, the largest value over prompts: sigma_max, lambda_max [L]; and
        L_<kind>, mu_<kind> [E, L] for kind in orthogonal, along."""
        recs = [r.lipschitz for r in self.records]
        out = {k: np.max(np.vstack([r[k] for r in recs]), axis=0) for k in ("sigma_max", "lambda_max")}
        for kind in ("orthogonal", "along"):
            out[f"L_{kind}"] = np.max(np.stack([r["L"][kind] for r in recs]), axis=0)
            out[f"mu_{kind}"] = np.max(np.stack([r["mu"][kind] for r in recs]), axis=0)
        return out

    def contractive(self, verdict: str = "jacobian") -> np.ndarray:
        """Per layer, whether f_l contracts: a [L] bool array.

        verdict "jacobian": λ_max((J + J^T)/2) < 0 on every prompt, so every pair of
        nearby trajectories of dh/dt = f_l(h) approaches (the worst direction contracts).
        "sampled": the secant μ < 0 for every sampled perturbation (both kinds, every eps,
        every prompt): typical directions contract, the worst one may not.
        """
        table = self.lipschitz_table()
        if verdict == "jacobian":
            return table["lambda_max"] < 0
        if verdict == "sampled":
            return np.all(np.vstack([table["mu_orthogonal"], table["mu_along"]]) < 0, axis=0)
        raise ExperimentError(f"verdict must be 'jacobian' or 'sampled', got {verdict!r}")

    def propagation_curves(self) -> dict[tuple[int, float], dict[str, Any]]:
        """{(layer, eps): {"gain", "spread", "relative" (geometric means over prompts, from that
        layer to L), "kl_last" (mean over prompts), "earlier" (max over prompts)}}."""
        groups: dict[tuple[int, float], list[dict[str, Any]]] = {}
        for r in self.records:
            for p in r.propagation:
                groups.setdefault((int(p["layer"]), float(p["eps"])), []).append(p)
        return {
            key: {
                "gain": _geomean([p["gain"] for p in group]),
                "spread": _geomean([p["spread"] for p in group]),
                "relative": _geomean([p["relative"] for p in group]),
                "kl_last": float(np.mean([p["kl_last"] for p in group])),
                "earlier": float(np.max([p["earlier"] for p in group])),
            }
            for key, group in sorted(groups.items())
        }

    def alpha_curves(self) -> dict[str, dict[str, np.ndarray]]:
        """{target: {"kl_last", "kl_mean", "entropy"}} averaged over prompts, along config["alphas"]."""
        targets = list(self.records[0].fractional["curves"])
        return {
            t: {
                k: np.mean([as_array(r.fractional["curves"][t][k]) for r in self.records], axis=0)
                for k in ("kl_last", "kl_mean", "entropy")
            }
            for t in targets
        }

    def half_table(self) -> dict[str, np.ndarray | float]:
        """Means over prompts: defect, defect_median, kl_layer_last, kl_layer_mean [L]; kl_all_last, kl_all_mean."""
        out: dict[str, np.ndarray | float] = {}
        for key in ("defect", "defect_median", "kl_layer_last", "kl_layer_mean"):
            out[key] = np.mean([np.asarray(r.half[key], dtype=np.float64) for r in self.records], axis=0)
        for key in ("kl_all_last", "kl_all_mean"):
            out[key] = float(np.mean([r.half[key] for r in self.records]))
        return out

    def summary(self) -> dict[str, Any]:
        """Headline numbers (JSON-ready)."""
        q = self.profile_quantiles()
        lip = self.lipschitz_table()
        contractive = self.contractive()
        half = self.half_table()
        alpha = self.alpha_curves()
        alphas = np.asarray(self.config["alphas"], dtype=np.float64)
        pooled_ratio = np.concatenate([np.asarray(r.profile["ratio"]).ravel() for r in self.records])
        prop = self.propagation_curves()
        out: dict[str, Any] = {
            "model": self.model,
            "n_layers": self.n_layers,
            "prompts": [r.id for r in self.records],
            "step_ratio_median": float(np.median(pooled_ratio)),
            "step_ratio_median_by_layer_min": float(q["ratio"][:, 2].min()),
            "step_ratio_median_by_layer_max": float(q["ratio"][:, 2].max()),
            "step_ratio_largest_layer": int(q["ratio"][:, 2].argmax()),
            "curvature_median": float(np.median(q["curvature"][:, 2])),
            "cosine_median": float(np.median(q["cosine"][:, 2])),
            "contractive_layers": [int(i) for i in np.flatnonzero(contractive)],
            "contractive_fraction": float(contractive.mean()),
            "contractive_on_samples_layers": [int(i) for i in np.flatnonzero(self.contractive("sampled"))],
            "contractive_on_samples_fraction": float(self.contractive("sampled").mean()),
            "sigma_max_median": float(np.median(lip["sigma_max"])),
            "lambda_max_median": float(np.median(lip["lambda_max"])),
            "half_step_defect_median": float(np.median(half["defect"])),
            "half_step_defect_max": float(np.max(half["defect"])),
            "half_step_defect_max_layer": int(np.argmax(half["defect"])),
            "half_step_kl_all_last": float(half["kl_all_last"]),
            "half_step_kl_all_mean": float(half["kl_all_mean"]),
        }
        for a in (0.0, 0.5, 1.5, 2.0):
            hit = np.flatnonzero(np.isclose(alphas, a))
            if hit.size:
                out[f"alpha_all_{a:g}_kl_last"] = float(alpha["all"]["kl_last"][hit[0]])
        out["propagation"] = [
            {
                "layer": layer,
                "eps": eps,
                "gain_final": float(c["gain"][-1]),
                "growth_per_layer": float(np.log(c["gain"][-1]) / max(1, len(c["gain"]) - 1)),
                "kl_last": c["kl_last"],
                "earlier_max_abs": c["earlier"],
            }
            for (layer, eps), c in prop.items()
        ]
        return out

    # ------------------------------------------------------------------ tables
    def rows(self) -> Iterator[dict[str, Any]]:
        """Tidy rows (CSV_COLUMNS): prompt, probe, quantity, target (injection layer or alpha
        target), layer, x (token position, eps or alpha), value."""

        def row(
            prompt: str, probe: str, quantity: str, value: Any, target: Any = "", layer: Any = "", x: Any = ""
        ) -> dict[str, Any]:
            v = math.nan if value is None else float(value)
            return {
                "prompt": prompt,
                "probe": probe,
                "quantity": quantity,
                "target": target,
                "layer": layer,
                "x": x,
                "value": v if math.isfinite(v) else "",
            }

        for r in self.records:
            first = len(r.token_ids) - np.asarray(r.profile["ratio"]).shape[1]
            positions = range(first, len(r.token_ids))
            for key in ("ratio", "curvature", "cosine"):
                values = np.asarray(r.profile[key])
                for layer in range(values.shape[0]):
                    for k, pos in enumerate(positions):
                        yield row(r.id, "profile", key, values[layer, k], layer=layer, x=pos)
            lip = r.lipschitz
            for kind in ("orthogonal", "along"):
                for e, eps in enumerate(lip["eps"]):
                    for layer in range(self.n_layers):
                        yield row(r.id, "lipschitz", f"L_{kind}", lip["L"][kind][e][layer], layer=layer, x=eps)
                        yield row(r.id, "lipschitz", f"mu_{kind}", lip["mu"][kind][e][layer], layer=layer, x=eps)
            for key in ("sigma_max", "lambda_max"):
                for layer in range(self.n_layers):
                    yield row(r.id, "lipschitz", key, lip[key][layer], layer=layer)
            for p in r.propagation:
                for key in ("gain", "spread", "relative"):
                    for k, value in enumerate(p[key]):
                        yield row(r.id, "propagation", key, value, target=p["layer"], layer=p["layer"] + k, x=p["eps"])
                for key in ("kl_last", "kl_max", "earlier"):
                    yield row(r.id, "propagation", key, p[key], target=p["layer"], x=p["eps"])
            frac = r.fractional
            for target, curve in frac["curves"].items():
                for k, a in enumerate(frac["alphas"]):
                    for key in ("kl_last", "kl_mean", "entropy"):
                        yield row(r.id, "alpha", key, curve[key][k], target=target, x=a)
                    for j, token in enumerate(frac["top_ids"]):
                        yield row(r.id, "alpha", f"p[{token}]", curve["readout"][k][j], target=target, x=a)
            for key in ("defect", "defect_median", "kl_layer_last", "kl_layer_mean"):
                for layer, value in enumerate(r.half[key]):
                    yield row(r.id, "half_step", key, value, layer=layer)
            for key in ("kl_all_last", "kl_all_mean"):
                yield row(r.id, "half_step", key, r.half[key], target="all")

    def layer_rows(self) -> list[dict[str, Any]]:
        """One row per layer: profile quantiles, Lipschitz estimates (each eps and kind, largest over
        prompts), both contraction verdicts, half-step defect and KL (means over prompts)."""
        q = self.profile_quantiles()
        lip = self.lipschitz_table()
        sampled = self.contractive("sampled")
        half = self.half_table()
        rows = []
        for layer in range(self.n_layers):
            row: dict[str, Any] = {
                "layer": layer,
                "ratio_median": q["ratio"][layer, 2],
                "ratio_q25": q["ratio"][layer, 1],
                "ratio_q75": q["ratio"][layer, 3],
                "curvature_median": q["curvature"][layer, 2] if layer < self.n_layers - 1 else float("nan"),
                "cosine_median": q["cosine"][layer, 2] if layer < self.n_layers - 1 else float("nan"),
                "sigma_max": lip["sigma_max"][layer],
                "lambda_max": lip["lambda_max"][layer],
                "contractive": bool(lip["lambda_max"][layer] < 0),
                "contractive_on_samples": bool(sampled[layer]),
            }
            for e, eps in enumerate(self.config["eps"]):
                for kind in ("orthogonal", "along"):
                    row[f"L_{kind}@{eps:g}"] = lip[f"L_{kind}"][e, layer]
                    row[f"mu_{kind}@{eps:g}"] = lip[f"mu_{kind}"][e, layer]
            row["half_defect"] = np.asarray(half["defect"])[layer]
            row["half_kl_last"] = np.asarray(half["kl_layer_last"])[layer]
            rows.append({k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in row.items()})
        return rows

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = jsonable(super().to_dict())  # non-finite numbers as null
        return data

    def tables(self) -> dict[str, tuple[Sequence[str], list[dict[str, Any]]]]:
        """The CSV tables: "results" (:meth:`rows`) and "layers" (:meth:`layer_rows`), non-finite cells empty."""

        def blank(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows
            ]

        layer_rows = self.layer_rows()
        return {"results": (CSV_COLUMNS, blank(list(self.rows()))), "layers": (tuple(layer_rows[0]), blank(layer_rows))}
