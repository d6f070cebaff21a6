"""Figures of a depth result: the step profile, Lipschitz constants, propagation, fractional depth,
half steps, and the read-out along alpha of each prompt.

Each function takes a :class:`~contllm.depth.result.DepthResult` and returns a matplotlib
figure; nothing is saved here (the runner saves what :func:`depth_figures` yields).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from contllm.depth.result import DepthResult
from contllm.errors import ExperimentError
from contllm.rundir.files import data_name

#: The figures of a run, in order ("summary" first: what ``contllm.experiments.figure`` shows); "readout" (one per
#: prompt) comes after them.
FIGURES = ("summary", "profile", "lipschitz", "propagation", "alpha", "half_steps")


def _pyplot() -> Any:
    from contllm.plotting import plt  # selects a headless backend when there is no display

    return plt


def _title(result: DepthResult, what: str) -> str:
    prompts = ", ".join(r.id for r in result.records)
    return f"{result.model} · depth · {what}\n{result.n_layers} layers, prompts: {prompts}"


def _band(ax: Any, x: np.ndarray, q: np.ndarray, color: str, label: str) -> None:
    ax.fill_between(x, q[:, 0], q[:, 4], color=color, alpha=0.12, lw=0)
    ax.fill_between(x, q[:, 1], q[:, 3], color=color, alpha=0.3, lw=0)
    ax.plot(x, q[:, 2], "-o", ms=3, color=color, label=label)


def _finished(fig: Any, axes: Any, result: DepthResult, xlabel: str, what: str) -> Any:
    """A row of panels sharing an x label and a grid, the first with a legend, under a title."""
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(_title(result, what), fontsize=11)
    return fig


def depth_finding(result: DepthResult) -> tuple[str, str]:
    """The sentence a depth summary opens with: the median step ||f_l|| / ||h_l|| over layers and tokens, and the
    median defect of two half steps against one full step; a step under 0.3 reads as small, and a defect under 0.3 of
    the update as a step that splits like a flow's."""
    summary = result.summary()
    step, defect = summary["step_ratio_median"], summary["half_step_defect_median"]
    detail = (
        f"median step: {step:.2f} of the state's size; two half steps differ from one full step by {defect:.2f} "
        f"of the update (medians over layers, {len(result.records)} prompts)"
    )
    if step < 0.3 and defect < 0.3:
        return (
            "Each layer nudges the state by a small step that splits like a flow's: the stack reads as an ODE",
            detail,
        )
    if step < 0.3:
        return "Each layer nudges the state by a small step, but half steps do not add up to a full one", detail
    return "Layers change the state by large steps: the stack is far from a smooth flow", detail


def _summary_figure(result: DepthResult) -> Any:
    from contllm.plotting import finding, heading, legend_outside, plt

    q = result.profile_quantiles()
    half = result.half_table()
    fig, axes = plt.subplots(1, 3, figsize=(18, 5), constrained_layout=True, gridspec_kw={"width_ratios": [1.4, 1, 1]})
    layers = np.arange(result.n_layers)
    _band(axes[0], layers, q["ratio"], "C0", "median over tokens\n(bands: 25-75 %, 5-95 %)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("step size ||f_l(h_l)|| / ||h_l||")
    finding(axes[0], *depth_finding(result))
    _band(axes[1], layers[:-1], q["curvature"], "C1", "median over tokens")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("||f_{l+1} - f_l|| / ||f_l||")
    axes[1].set_title("How much the update changes from one layer to the next", loc="left", fontsize=9)
    axes[2].plot(layers, half["defect"], "k-o", ms=3, lw=2, label="mean over prompts")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("||two half steps - one step|| / ||f_l(h)||")
    axes[2].set_title(
        "Each layer split into two half steps,\nagainst the layer's one full step", loc="left", fontsize=9
    )
    for ax in axes:
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
        legend_outside(ax)
    heading(fig, result.model, "depth", len(result.records), "prompts")
    return fig


def _profile_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    q = result.profile_quantiles()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), constrained_layout=True)
    layers = np.arange(result.n_layers)
    _band(axes[0], layers, q["ratio"], "C0", "median (bands: 25-75 %, 5-95 %)")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("||f_l(h_l)|| / ||h_l||")
    axes[0].set_title("step size relative to the state", fontsize=10)
    _band(axes[1], layers[:-1], q["curvature"], "C1", "median")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("||f_{l+1} - f_l|| / ||f_l||")
    axes[1].set_title("change of the update between layers", fontsize=10)
    _band(axes[2], layers[:-1], q["cosine"], "C2", "median")
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set_ylim(-1.02, 1.02)
    axes[2].set_ylabel("cos(f_l, f_{l+1})")
    axes[2].set_title("direction of consecutive updates", fontsize=10)
    return _finished(fig, axes, result, "layer l", "step profile over tokens (first position excluded)")


def _lipschitz_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    lip = result.lipschitz_table()
    eps = result.config["eps"]
    layers = np.arange(result.n_layers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.4), constrained_layout=True)
    shades = np.linspace(0.35, 0.95, len(eps))
    method = {"lanczos": "Lanczos", "power": "power iteration"}.get(str(result.config.get("method")), "JVPs")
    left.plot(layers, lip["sigma_max"], "k-o", ms=4, lw=2, label=f"σ_max(J), JVPs ({method})")
    right.plot(layers, lip["lambda_max"], "k-o", ms=4, lw=2, label=f"λ_max((J+Jᵀ)/2), JVPs ({method})")
    for e, value in enumerate(eps):
        blue, red = plt.get_cmap("Blues")(shades[e]), plt.get_cmap("Oranges")(shades[e])
        left.plot(layers, lip["L_orthogonal"][e], "-", color=blue, label=f"L, δ ⊥ h, ε = {value:g}")
        left.plot(layers, lip["L_along"][e], "--", color=red, label=f"L, δ ∥ h, ε = {value:g}")
        right.plot(layers, lip["mu_orthogonal"][e], "-", color=blue, label=f"μ, δ ⊥ h, ε = {value:g}")
        right.plot(layers, lip["mu_along"][e], "--", color=red, label=f"μ, δ ∥ h, ε = {value:g}")
    for layer in np.flatnonzero(result.contractive("sampled")):
        right.axvspan(layer - 0.5, layer + 0.5, color="C2", alpha=0.12, lw=0)
    for layer in np.flatnonzero(result.contractive()):
        right.axvspan(layer - 0.5, layer + 0.5, color="C2", alpha=0.35, lw=0)
    right.axhline(0, color="k", lw=0.8)
    left.set_yscale("log")
    right.set_yscale("symlog", linthresh=1e-2)
    left.set_ylabel("Lipschitz estimate of f_l")
    right.set_ylabel("one-sided Lipschitz estimate of f_l")
    left.set_title("L = max ||Δf|| / ||δ||  (max over prompts)\n", fontsize=9)
    n, n_sampled = int(result.contractive().sum()), int(result.contractive("sampled").sum())
    right.set_title(
        f"μ = max <Δf, δ> / ||δ||²  (max over prompts)\ncontractive, shaded: λ_max < 0 (dark) {n}, "
        f"sampled μ < 0 (light) {n_sampled} of {result.n_layers} layers",
        fontsize=9,
    )
    for ax in (left, right):
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.suptitle(_title(result, "Lipschitz and one-sided Lipschitz constants per layer"), fontsize=11)
    return fig


def _propagation_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    curves = result.propagation_curves()
    sites = sorted({layer for layer, _ in curves})
    eps = sorted({e for _, e in curves})
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    colors = plt.get_cmap("viridis")
    for i, site in enumerate(sites):
        color = colors(i / max(1, len(sites) - 1))
        for j, e in enumerate(eps):
            c = curves.get((site, e))
            if c is None:
                continue
            depth = site + np.arange(len(c["gain"]))
            label = f"l0 = {site}, ε = {e:g}"
            axes[0].plot(depth, c["gain"], styles[j % 4], color=color, marker="o", ms=2, label=label)
            axes[1].plot(depth, c["relative"], styles[j % 4], color=color, marker="o", ms=2, label=label)
        axes[2].plot(eps, [curves[(site, e)]["kl_last"] for e in eps], "-o", color=color, label=f"l0 = {site}")
    axes[0].set_ylabel("e_l = ||h'_l - h_l|| / ||δ||  (at the position)")
    axes[0].set_title("absolute: growth or decay of a perturbation", fontsize=10)
    axes[1].set_ylabel("(||Δh_l|| / ||h_l||) / ε")
    axes[1].set_title("relative to the state's norm", fontsize=10)
    for ax in axes[:2]:
        ax.set_yscale("log")
        ax.set_xlabel("layer l (perturbation enters layer l0)")
        ax.axhline(1, color="k", lw=0.8)
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("ε = ||δ|| / ||h_{l0}||")
    axes[2].set_ylabel("KL(p' || p), last position")
    axes[2].set_title("effect on the output distribution", fontsize=10)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(_title(result, "perturbation propagation (geometric mean over prompts)"), fontsize=11)
    return fig


def _positive(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return np.where(values > 0, values, np.nan)


def _alpha_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    curves = result.alpha_curves()
    alphas = np.asarray(result.config["alphas"], dtype=np.float64)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    colors = plt.get_cmap("viridis")
    singles = [t for t in curves if t != "all"]
    for target, curve in curves.items():
        if target == "all":
            style: dict[str, Any] = {"color": "k", "lw": 2.4, "label": "all layers"}
        else:
            color = colors(singles.index(target) / max(1, len(singles) - 1))
            style = {"color": color, "lw": 1.4, "label": f"layer {target} only"}
        axes[0].plot(alphas, _positive(curve["kl_last"]), "-o", ms=3, **style)
        axes[1].plot(alphas, _positive(curve["kl_mean"]), "-o", ms=3, **style)
        axes[2].plot(alphas, curve["entropy"], "-o", ms=3, **style)
    for ax, what in zip(axes[:2], ("last position", "mean over positions")):
        ax.set_yscale("log")
        ax.set_ylabel(f"KL(p_α || p_1), {what}")
    axes[2].set_ylabel("entropy of p_α at the last position (nats)")
    for ax in axes:
        ax.axvline(1, color="k", lw=0.8, ls=":")
    return _finished(
        fig,
        axes,
        result,
        "α  (h_{l+1} = h_l + α f_l(h_l))",
        "fractional depth (mean over prompts; α = 1 is the stock model)",
    )


def _half_figure(result: DepthResult) -> Any:
    plt = _pyplot()
    half = result.half_table()
    layers = np.arange(result.n_layers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4), constrained_layout=True)
    for r in result.records:
        left.plot(layers, r.half["defect"], ".", alpha=0.5, label=f"{r.id}")
    left.plot(layers, half["defect"], "k-o", ms=3, lw=2, label="mean over prompts")
    left.plot(layers, half["defect_median"], "k--", lw=1, label="median over tokens (mean over prompts)")
    left.set_yscale("log")
    left.set_ylabel("||h'' - Φ_l(h)|| / ||f_l(h)||")
    left.set_title("local defect of two half steps against one step", fontsize=10)
    right.bar(layers, _positive(np.asarray(half["kl_layer_last"])), color="C0", alpha=0.7, label="layer l split alone")
    right.axhline(
        float(half["kl_all_last"]), color="k", lw=2, label=f"every layer split: {float(half['kl_all_last']):.3g}"
    )
    right.set_yscale("log")
    right.set_ylabel("KL(p_half || p), last position (mean over prompts)")
    right.set_title("effect on the output distribution", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("layer l")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, "half-step refinement"), fontsize=11)
    return fig


def _readout_figure(result: DepthResult, prompt: str) -> Any:
    plt = _pyplot()
    record = next((r for r in result.records if r.id == prompt), None)
    if record is None:
        known = ", ".join(r.id for r in result.records)
        raise ExperimentError(f"no prompt {prompt!r} in this result; its prompts are {known}")
    frac = record.fractional
    alphas = np.asarray(frac["alphas"], dtype=np.float64)
    targets = list(frac["curves"])
    cols = min(3, len(targets))
    rows = int(np.ceil(len(targets) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False, constrained_layout=True)
    names = [result.token_strings.get(str(t), str(t)) for t in frac["top_ids"]]
    for ax, target in zip(axes.flat, targets):
        readout = np.asarray(frac["curves"][target]["readout"], dtype=np.float64)
        for j, name in enumerate(names):
            ax.plot(alphas, readout[:, j], "-o", ms=2.5, color=f"C{j}", label=repr(name))
        ax.plot(alphas, 1 - readout.sum(axis=1), "k:", lw=1, label="all other tokens")
        ax.axvline(1, color="k", lw=0.8, ls=":")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("all layers" if target == "all" else f"layer {target} only", fontsize=9)
        ax.set_xlabel("α")
        ax.set_ylabel("probability at the last position")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, title="stock top tokens", title_fontsize=7)
    for ax in list(axes.flat)[len(targets) :]:
        ax.axis("off")
    text = (record.text or "").replace("\n", "⏎")
    fig.suptitle(f"{result.model} · depth · read-out along α · {record.id}\n…{text[-70:]!s}", fontsize=10)
    return fig


_FIGURES: dict[str, Callable[[DepthResult], Any]] = {
    "summary": _summary_figure,
    "profile": _profile_figure,
    "lipschitz": _lipschitz_figure,
    "propagation": _propagation_figure,
    "alpha": _alpha_figure,
    "half_steps": _half_figure,
}


def depth_figure(result: DepthResult, name: str = "summary", prompt: str | None = None) -> Any:
    """One figure: "summary", "profile", "lipschitz", "propagation", "alpha", "half_steps", or
    "readout" (the read-out distribution along alpha of one prompt; prompt: its id, None: the first)."""
    if name == "readout":
        return _readout_figure(result, prompt or result.records[0].id)
    if name not in _FIGURES:
        raise ExperimentError(f"unknown depth figure {name!r}; the figures are {', '.join(FIGURES)}, readout")
    return _FIGURES[name](result)


def depth_figures(result: DepthResult, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
    """(name, figure) for every figure of :data:`FIGURES`, then ("items/<prompt id>", its read-out) per prompt."""
    for name in FIGURES:
        yield name, depth_figure(result, name)
    if per_item:
        for record in result.records:
            yield f"items/{data_name(record.id)}", depth_figure(result, "readout", prompt=record.id)
