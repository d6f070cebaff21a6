"""Figures of the attention-dynamics probe: each reads a :class:`~contllm.pde.result.PDEResult` and returns a figure.

Nothing here saves a file (the runner does, from :func:`figures`); matplotlib is imported
on the first figure, through :mod:`contllm.plotting`, which picks a headless backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from contllm.errors import ExperimentError
from contllm.pde.probes import Fit
from contllm.pde.result import PDEResult
from contllm.rundir.files import as_array

#: The figures of a run, in the order they are drawn (figures/<name>.png and .pdf); "summary"
#: is :func:`outputs_figure`, the headline (what ``contllm.experiments.figure`` shows).
FIGURES = ("summary", "profiles", "fits", "attention")

STYLES = {
    "attention": {"color": "C0", "marker": "o"},
    "matched": {"color": "C3", "marker": "s"},
    "hidden": {"color": "C2", "marker": "^"},
}


def _pyplot() -> Any:
    from contllm.plotting import plt  # selects a headless backend when there is no display

    return plt


def _name(result: PDEResult, variant: str) -> str:
    dynamics = result.config.get("dynamics", "diffusion")
    return {
        "attention": f"{dynamics} of attention rows",
        "matched": "control: temperature matched on row entropy",
        "hidden": "causal smoothing of hidden states",
    }.get(variant, variant)


def _title(result: PDEResult, what: str) -> str:
    scope = []
    if result.config.get("layer") is not None:
        scope.append(f"layer {result.config['layer']}")
    if result.config.get("head") is not None:
        scope.append(f"head {result.config['head']}")
    where = ", ".join(scope) or "all layers and heads"
    return f"{result.model} · pde · {what}\n{result.text_tokens}-token text, {len(result.prompts)} prompts, {where}"


def _time_axis(ax: Any, times: list[float]) -> None:
    positive = [t for t in times if t > 0]
    ax.set_xscale("symlog", linthresh=min(positive) if positive else 1.0)
    ax.set_xlabel("pseudo-time T")
    ax.grid(alpha=0.3)


def pde_finding(result: PDEResult) -> tuple[str, str]:
    """The sentence a pde summary opens with: at the largest T of the main variant, how much of the text's next tokens
    stay the stock model's top-1 (0.9 or more: "stays close", under 0.5: "drifts away", between: "moves away")."""
    variants = result.variants()
    if not variants:
        return "The outputs against pseudo-time", "no sweep of T in this run"
    variant = "attention" if "attention" in variants else variants[0]
    rows = result.table(variant)
    last = rows[-1]
    top1, kl = last["top1_text"], last["kl_text"]
    dynamics = result.config.get("dynamics", "diffusion") if variant == "attention" else _name(result, variant)
    detail = f"at T = {last['T']:g}: KL to the stock model {kl:.3g} nats, top-1 agreement {top1:.0%} on the text"
    if top1 is None or not np.isfinite(top1):
        return f"The outputs as {dynamics} runs on the attention rows", detail
    if top1 >= 0.9:
        return f"Under {dynamics} of the attention rows the outputs stay close to the stock model's", detail
    if top1 < 0.5:
        return f"Under {dynamics} of the attention rows the outputs drift away from the stock model's", detail
    return f"Under {dynamics} of the attention rows the outputs move away gradually from the stock model's", detail


def outputs_figure(result: PDEResult) -> Any:
    """KL to the stock model, top-1 agreement, perplexity and next-token entropy against T."""
    from contllm.plotting import finding, heading, legend_outside

    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5), constrained_layout=True)
    panels = [
        (axes[0, 0], ("kl_text", "kl_prompts"), "KL(p_T || p_0) (nats)"),
        (axes[0, 1], ("top1_text", "top1_prompts"), "top-1 agreement with T = 0"),
        (axes[1, 0], ("perplexity",), "perplexity of the text"),
        (axes[1, 1], ("entropy_prompts",), "next-token entropy at the prompts' ends (nats)"),
    ]
    for variant in result.variants():
        rows = result.table(variant)
        T = [r["T"] for r in rows]
        for ax, keys, _ in panels:
            for key, style in zip(keys, ("-", "--")):
                label = f"{_name(result, variant)}" + (
                    "" if len(keys) == 1 else (", text" if key.endswith("text") else ", prompts")
                )
                ax.plot(T, as_array([r[key] for r in rows]), style, **STYLES.get(variant, {}), ms=4, label=label)
    times = [r["T"] for r in result.records]
    for ax, _, ylabel in panels:
        _time_axis(ax, times)
        ax.set_ylabel(ylabel)
    axes[0, 0].set_yscale("symlog", linthresh=1e-3)
    axes[1, 0].set_yscale("log")
    axes[0, 1].set_ylim(-0.02, 1.02)
    finding(axes[0, 0], *pde_finding(result))
    axes[0, 1].set_title("How often the most probable next token stays the stock model's", loc="left", fontsize=9)
    axes[1, 0].set_title("How well the model still predicts the text", loc="left", fontsize=9)
    axes[1, 1].set_title("How sure the model is at the prompts' ends", loc="left", fontsize=9)
    legend_outside(axes[0, 1])
    heading(fig, result.model, "pde", len(result.prompts), "prompts")
    return fig


def _profile_panel(ax: Any, record: dict[str, Any], color: str, label: str, fits: bool) -> None:
    m = as_array(record["attention"]["profile"])
    d = np.arange(len(m))
    keep = (d >= 1) & np.isfinite(m) & (m > 0)
    ax.plot(d[keep], m[keep], ".", ms=3, color=color, label=label)
    if not fits:
        return
    low, high = record["attention"]["fit_range"]
    x = np.arange(max(1, low), high + 1, dtype=np.float64)
    for model, style in (("exponential", "--"), ("power", ":")):
        fit = record["attention"]["fits"][model]
        if fit is None:
            continue
        value = Fit(**fit)
        what = f"ℓ = {value.scale:.3g}" if model == "exponential" else f"α = {value.scale:.3g}"
        ax.plot(
            x,
            value.predict(x),
            style,
            color="k" if model == "exponential" else "C1",
            lw=1.2,
            label=f"{model}: {what}, R² {value.r2:.3f}, AIC {value.aic:.0f}",
        )


def profiles_figure(result: PDEResult) -> Any:
    """m(d) on log-log axes, one panel per T, with both fits of the main variant."""
    plt = _pyplot()
    main = result.variants()[0] if result.variants() else "stock"
    sweep = result.sweep(main) if main != "stock" else result.records[:1]
    if not sweep:
        raise ExperimentError("a pde result without records has no distance profile to draw")
    cols = min(4, len(sweep))
    rows = int(np.ceil(len(sweep) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False, constrained_layout=True)
    control = {r["T"]: r for r in result.records if r["variant"] == "matched"}
    for ax, record in zip(axes.flat, sweep):
        _profile_panel(
            ax,
            record,
            STYLES.get(main, {}).get("color", "C0"),
            _name(result, main) if record["T"] > 0 else "stock",
            True,
        )
        if record["T"] in control and main != "matched":
            _profile_panel(ax, control[record["T"]], STYLES["matched"]["color"], "temperature control", False)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"T = {record['T']:g}: prefers {record['attention']['fits']['preferred']}", fontsize=9)
        ax.set_xlabel("distance d (tokens)")
        ax.set_ylabel("m(d)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(sweep) :]:
        ax.axis("off")
    fig.suptitle(
        _title(result, "attention distance profile m(d) (sink key excluded) with exponential and power-law fits"),
        fontsize=11,
    )
    return fig


def fits_figure(result: PDEResult) -> Any:
    """Decay length, exponent, R² of both fits and ΔAIC = AIC_power - AIC_exp against T."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.4), constrained_layout=True)
    for variant in result.variants():
        rows = result.table(variant)
        T = [r["T"] for r in rows]
        style = {**STYLES.get(variant, {}), "ms": 4}
        axes[0].plot(T, as_array([r["decay_length"] for r in rows]), "-", **style, label=_name(result, variant))
        axes[1].plot(T, as_array([r["exponent"] for r in rows]), "-", **style)
        axes[2].plot(T, as_array([r["r2_exponential"] for r in rows]), "--", **style, label=f"{variant}: exponential")
        axes[2].plot(T, as_array([r["r2_power"] for r in rows]), ":", **style, label=f"{variant}: power")
        axes[3].plot(T, as_array([r["delta_aic"] for r in rows]), "-", **style)
    axes[0].set_ylabel("decay length ℓ (tokens), m ≈ A exp(-d/ℓ)")
    axes[1].set_ylabel("exponent α, m ≈ B d^-α")
    axes[2].set_ylabel("R² of log m")
    axes[3].set_ylabel("AIC_power - AIC_exp (< 0: power law preferred)")
    axes[3].axhline(0, color="k", lw=0.8)
    times = [r["T"] for r in result.records]
    for ax in axes:
        _time_axis(ax, times)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=6)
    fig.suptitle(_title(result, "fits of the distance profile against pseudo-time"), fontsize=11)
    return fig


def attention_figure(result: PDEResult) -> Any:
    """Row entropy, long-range mass, sink mass and negative mass (means over layers) against T."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.4), constrained_layout=True)
    keys = ("attention_entropy", "long_range_mass", "sink_mass", "negative_mass")
    labels = (
        "mean row entropy (nats)",
        f"long-range mass (d > {result.config.get('long_range')}, sink excluded)",
        "mass on the sink key",
        "negative mass per row",
    )
    for variant in result.variants():
        rows = result.table(variant)
        T = [r["T"] for r in rows]
        for ax, key in zip(axes, keys):
            ax.plot(
                T, as_array([r[key] for r in rows]), "-", **STYLES.get(variant, {}), ms=4, label=_name(result, variant)
            )
    times = [r["T"] for r in result.records]
    for ax, label in zip(axes, labels):
        _time_axis(ax, times)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(_title(result, "attention rows against pseudo-time (means over rows and layers)"), fontsize=11)
    return fig


def figure(result: PDEResult, name: str = "summary") -> Any:
    """One figure of :data:`FIGURES` ("summary": the outputs against T, "profiles", "fits" or "attention")."""
    draw = {"summary": outputs_figure, "profiles": profiles_figure, "fits": fits_figure, "attention": attention_figure}
    if name not in draw:
        raise ExperimentError(f"unknown pde figure {name!r}; the figures are {', '.join(FIGURES)}")
    return draw[name](result)


def figures(result: PDEResult) -> Iterator[tuple[str, Any]]:
    """(name, figure) for each of :data:`FIGURES` (none for a result without records)."""
    if not result.records:
        return
    for name in FIGURES:
        yield name, figure(result, name)


def comparison_figure(results: Sequence[tuple[str, PDEResult]]) -> Any:
    """Labelled results side by side: KL to the stock model, perplexity, attention entropy and ΔAIC against T.

    Each result contributes its attention sweep (or its first variant's).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.4), constrained_layout=True)
    panels = (
        ("kl_text", "KL(p_T || p_0) on the text (nats)"),
        ("perplexity", "perplexity of the text"),
        ("attention_entropy", "mean row entropy (nats)"),
        ("delta_aic", "AIC_power - AIC_exp (< 0: power law preferred)"),
    )
    times: list[float] = []
    for k, (label, result) in enumerate(results):
        variants = result.variants()
        if not variants:
            continue
        variant = "attention" if "attention" in variants else variants[0]
        rows = result.table(variant)
        T = [r["T"] for r in rows]
        times += T
        for ax, (key, _) in zip(axes, panels):
            ax.plot(T, as_array([r[key] for r in rows]), "-o", color=f"C{k % 10}", ms=3, label=f"{label} ({variant})")
    for ax, (_, ylabel) in zip(axes, panels):
        _time_axis(ax, times)
        ax.set_ylabel(ylabel)
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[1].set_yscale("log")
    axes[3].axhline(0, color="k", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle("pde · runs compared against pseudo-time", fontsize=11)
    return fig
