"""The attention-dynamics probe as an experiment: a sweep of pseudo-time T on one model.

For each T of the sweep and each variant

* ``attention``: the chosen dynamics (diffusion by default) on every attention row in scope;
* ``matched``: the control, each row tempered to the entropy diffusion over T gives it;
* ``hidden``: causal smoothing of the hidden states after each layer in scope;

one forward over the shipped text (perplexity, per-position KL and top-1 against the
stock model, and every layer's attention rows: distance profile, long-range mass,
entropy) and one batch of short prompts (KL, top-1 and entropy at the last position).

The work units (items) are the (variant, T) points, named by :func:`step_id`
("stock-T0", "attention-T4"); T = 0 is the stock model, one point shared by the
variants. The stock model's logits that every point is measured against are computed
afresh by each :meth:`PDEExperiment.run` (one eager forward of the text and the prompts),
so a resumed run, or one that selects points without "stock-T0", measures exactly what a
whole run would. :data:`EXPERIMENT` is what ``contllm run pde`` runs through
:mod:`contllm.rundir.runner`; :func:`run_pde` is the same sweep in Python, returning a
:class:`~contllm.pde.result.PDEResult`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import torch

from contllm.core.families import attention_modules, head_counts
from contllm.data import select_items
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, Table, option_table
from contllm.experiments.options import config_dict, parse_floats
from contllm.numerals import as_integer
from contllm.pde.attention import pde_attention
from contllm.pde.dynamics import SPACINGS, Dynamics
from contllm.pde.figures import comparison_figure
from contllm.pde.figures import figures as draw_figures
from contllm.pde.hidden import causal_smoothing
from contllm.pde.probes import AttentionRecorder, compare_fits, output_measures, perplexity
from contllm.pde.result import CSV_COLUMNS, PROFILE_COLUMNS, PDEResult, check_record
from contllm.rundir.files import jsonable

DEFAULT_TIMES: tuple[float, ...] = (0.0, 0.1, 0.4, 1.0, 4.0, 16.0, 64.0, 256.0)
VARIANTS = ("attention", "matched", "hidden")
#: Largest T of the reaction dynamics: 10,000 explicit steps per row at unit spacing.
MAX_REACTION_T = 2500.0
SWEPT_KINDS = ("diffusion", "wave", "reaction")
#: The text's fewest tokens for a distance profile worth fitting.
MIN_TEXT_TOKENS = 8


# ---------------------------------------------------------------------------- the shipped data


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    try:
        data = json.loads(resources.files("contllm.data").joinpath("pde.json").read_text(encoding="utf-8"))
        text, prompts = data["text"], data["prompts"]
        if not isinstance(text, str) or not text.strip() or not isinstance(prompts, list) or not prompts:
            raise ValueError("it needs a non-empty 'text' and a non-empty list 'prompts'")
        return {"text": text, "prompts": tuple(Prompt(str(p["id"]), str(p["text"])) for p in prompts)}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExperimentError(f"cannot read dataset pde.json: {exc}") from None


def shipped_text() -> str:
    """The passage (about 350 tokens) whose perplexity and attention profile the probe measures."""
    return _data()["text"]


def shipped_prompts() -> tuple[Prompt, ...]:
    """Short prompts with a predictable next token (KL, top-1 and entropy at their last position)."""
    return _data()["prompts"]


def select_prompts(spec: str | int | None, prompts: Sequence[Prompt] | None = None) -> list[Prompt]:
    """All prompts (None), the first N ("3"), or those named ("capital,code"), by :func:`contllm.data.select_items`.

    prompts: None for the shipped ones. ExperimentError naming the prompts otherwise.
    """
    prompts = shipped_prompts() if prompts is None else prompts
    try:
        return select_items(prompts, spec)
    except ExperimentError as exc:
        if isinstance(spec, str) and as_integer(spec) is None:
            known = {p.id for p in prompts}
            unknown = [w.strip() for w in spec.split(",") if w.strip() and w.strip() not in known]
            raise ExperimentError(
                f"unknown pde prompt(s) {', '.join(unknown) or repr(spec)}; the prompts are {', '.join(p.id for p in prompts)}"
            ) from None
        raise ExperimentError(f"--prompts: {exc}") from None


# ---------------------------------------------------------------------------- options and items


def step_id(variant: str, T: float) -> str:
    """The name of one (variant, T) point ("attention-T4", "stock-T0")."""
    return f"{variant}-T{T:g}"


@dataclass
class PDEConfig:
    """Options of the probe.

    times: the pseudo-times T (>= 0; 0 is always added). dynamics: "diffusion", "wave"
    or "reaction" for the ``attention`` variant. rho, wave_speed: reaction strength and
    wave speed c. spacing: "time" or "index" (see :class:`~contllm.pde.dynamics.Dynamics`).
    variants: which of :data:`VARIANTS` to run. layer, head: the scope (None: all).
    long_range: D of the long-range mass. prompts: which shipped prompts (None: all, "N":
    the first N, "id1,id2": those). fit_min, fit_max: distances of the profile fits
    (fit_max None: half the text's tokens).
    """

    times: tuple[float, ...] = DEFAULT_TIMES
    dynamics: str = "diffusion"
    rho: float = 1.0
    wave_speed: float = 1.0
    spacing: str = "time"
    variants: tuple[str, ...] = VARIANTS
    layer: int | None = None
    head: int | None = None
    long_range: int = 32
    prompts: str | None = None
    fit_min: int = 1
    fit_max: int | None = None

    def __post_init__(self) -> None:
        times = parse_floats(self.times, "times")
        for t in times:
            if not (math.isfinite(t) and t >= 0):
                raise ExperimentError(f"pseudo-times must be finite and >= 0, got {t:g}")
        self.times = tuple(sorted(set(times) | {0.0}))
        named: dict[str, float] = {}
        for t in self.times:
            other = named.setdefault(step_id("", t), t)
            if other != t:
                raise ExperimentError(
                    f"pseudo-times {other!r} and {t!r} are too close to tell apart in point ids (T{t:g})"
                )
        if self.dynamics not in SWEPT_KINDS:
            raise ExperimentError(f"dynamics must be one of {', '.join(SWEPT_KINDS)}, got {self.dynamics!r}")
        if self.dynamics == "reaction" and self.times[-1] > MAX_REACTION_T:
            raise ExperimentError(
                f"reaction steps every row explicitly (T / 0.25 steps or more), so T must be at most "
                f"{MAX_REACTION_T:g}; got {self.times[-1]:g}"
            )
        if self.spacing not in SPACINGS:
            raise ExperimentError(f"spacing must be one of {', '.join(SPACINGS)}, got {self.spacing!r}")
        variants = self.variants.split(",") if isinstance(self.variants, str) else list(self.variants)
        variants = [v.strip() for v in variants if v.strip()]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            raise ExperimentError(
                f"unknown variant(s) {', '.join(unknown) or '(none given)'}; the variants are {', '.join(VARIANTS)}"
            )
        self.variants = tuple(v for v in VARIANTS if v in variants)
        if self.long_range < 1:
            raise ExperimentError(f"long_range must be >= 1, got {self.long_range}")
        if self.fit_min < 1 or (self.fit_max is not None and self.fit_max < self.fit_min + 2):
            raise ExperimentError(
                f"the fit range needs 1 <= fit_min and fit_max >= fit_min + 2, got {self.fit_min}, {self.fit_max}"
            )
        Dynamics(self.dynamics, rho=self.rho, c=self.wave_speed, spacing=self.spacing)  # checks rho and c
        select_prompts(self.prompts)

    def dynamics_at(self, variant: str, T: float) -> Dynamics:
        kind = self.dynamics if variant == "attention" else "matched"
        return Dynamics(kind, T, rho=self.rho, c=self.wave_speed, spacing=self.spacing)

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


OPTIONS = option_table(
    """
    times       floats  Pseudo-times T >= 0, comma-separated (0 is always added). [default: 0,0.1,0.4,1,4,16,64,256]
    dynamics    str     diffusion, wave or reaction. [default: diffusion]
    variants    words   attention, matched (temperature control), hidden (state smoothing), comma-separated. [default: all]
    layer       int     Only this layer (negative from the end). [default: all layers]
    head        int     Only this head of each layer in scope (--layer: one layer). [default: all heads]
    spacing     str     time (cells as wide as durations) or index. [default: time]
    rho         float   Reaction strength of --dynamics reaction. [default: 1]
    wave_speed  float   Wave speed c of --dynamics wave. [default: 1]
    long_range  int     D of the long-range mass (keys more than D back). [default: 32]
    prompts     str     The first N shipped prompts, or a comma-separated list of their ids. [default: all 8]
    """
)


@dataclass(frozen=True)
class Point:
    """One work unit: a variant ("stock", "attention", "matched", "hidden") at one pseudo-time T."""

    id: str
    variant: str
    T: float


def points(config: PDEConfig) -> list[Point]:
    """The stock model first, then each variant's positive T in order."""
    plan = [("stock", 0.0)] + [(v, T) for v in config.variants for T in config.times if T > 0]
    return [Point(step_id(v, T), v, T) for v, T in plan]


# ---------------------------------------------------------------------------- one point


@dataclass
class Inputs:
    """The text and prompts as signals, and the stock model's logits on them."""

    text_signal: Any
    text_ids: torch.Tensor
    prompt_signals: list[Any]
    text_logits: torch.Tensor
    prompt_logits: torch.Tensor


def measure_step(
    lm: Any, config: PDEConfig, inputs: Inputs, variant: str, T: float, n_layers: int
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """One (variant, T) point: returns its record and the text and prompt logits.

    variant: "attention", "matched" or "hidden" (the head of the scope applies to the first two).
    """
    started = time.perf_counter()
    recorder = AttentionRecorder(n_layers, config.long_range)
    scope = {"layer": config.layer}
    if variant == "hidden":
        with causal_smoothing(lm, T, **scope), pde_attention(lm, Dynamics("diffusion", 0.0), recorder=recorder):
            text_logits = lm.logits(inputs.text_signal, positions="all")
        with causal_smoothing(lm, T, **scope):
            prompt_logits = lm.logits(inputs.prompt_signals, positions="last")
    else:
        dynamics = config.dynamics_at(variant, T)
        with pde_attention(lm, dynamics, head=config.head, recorder=recorder, **scope):
            text_logits = lm.logits(inputs.text_signal, positions="all")
        with pde_attention(lm, dynamics, head=config.head, **scope):
            prompt_logits = lm.logits(inputs.prompt_signals, positions="last")
    record = _record(config, variant, T, recorder, inputs, text_logits, prompt_logits)
    record["seconds"] = time.perf_counter() - started
    return record, text_logits, prompt_logits


def _record(
    config: PDEConfig,
    variant: str,
    T: float,
    recorder: AttentionRecorder,
    inputs: Inputs,
    text_logits: torch.Tensor,
    prompt_logits: torch.Tensor,
) -> dict[str, Any]:
    text = output_measures(text_logits, inputs.text_logits)
    prompts = output_measures(prompt_logits, inputs.prompt_logits)
    n = text_logits.shape[0]
    fit_max = config.fit_max if config.fit_max is not None else n // 2
    scope = None if config.layer is None else [config.layer % recorder.n_layers]
    profile, counts = recorder.profile(scope)
    layer_fits = []
    for layer in range(recorder.n_layers):
        m, _ = recorder.profile([layer])
        fits = compare_fits(m, config.fit_min, fit_max)
        layer_fits.append(
            {
                "decay_length": (fits["exponential"] or {}).get("scale"),
                "exponent": (fits["power"] or {}).get("scale"),
                "delta_aic": fits["delta_aic"],
            }
        )
    return {
        "variant": variant,
        "T": float(T),
        "dynamics": config.dynamics_at(variant, T).to_dict()
        if variant != "hidden"
        else {"kind": "hidden", "T": float(T)},
        "text": {
            "tokens": int(n),
            "perplexity": perplexity(text_logits, inputs.text_ids),
            "kl": float(text["kl"].mean()),
            "top1": float(text["top1"].mean()),
            "entropy": float(text["entropy"].mean()),
        },
        "prompts": {k: [float(x) for x in v] for k, v in prompts.items()},
        "attention": {
            "profile": profile,
            "counts": counts,
            "fit_range": [config.fit_min, fit_max],
            "fits": compare_fits(profile, config.fit_min, fit_max),
            "layers": recorder.layer_means(),
            "layer_fits": layer_fits,
        },
    }


# ---------------------------------------------------------------------------- the sweep


def check_model(lm: Any, config: PDEConfig, text: str | None = None) -> None:
    """ExperimentError unless ``lm`` can run ``config``: a tokenizer, the scope inside the model, a long enough text.

    text: None for the shipped text.
    """
    if getattr(lm, "tokenizer", None) is None:
        raise ExperimentError("the pde probe needs a ContinuousLM with a tokenizer (contllm.load(...))")
    n_layers = len(attention_modules(lm))
    heads, _ = head_counts(lm)
    if config.layer is not None and not -n_layers <= config.layer < n_layers:
        raise ExperimentError(
            f"layer {config.layer} is outside the model; it has {n_layers} layers (0 to {n_layers - 1}, or negative from the end)"
        )
    if config.head is not None and not -heads <= config.head < heads:
        raise ExperimentError(
            f"head {config.head} is outside the model; it has {heads} heads per layer (0 to {heads - 1}, or negative from the end)"
        )
    tokens = len(lm.signal(shipped_text() if text is None else text))
    if tokens < MIN_TEXT_TOKENS:
        raise ExperimentError(f"the text has {tokens} tokens; the distance profile needs at least {MIN_TEXT_TOKENS}")


def prepare_inputs(lm: Any, prompts: Sequence[Prompt], text: str | None = None) -> Inputs:
    """Signals of the text and the prompts, and the stock model's logits on them."""
    if getattr(lm, "tokenizer", None) is None:
        raise ExperimentError("the pde probe needs a ContinuousLM with a tokenizer (contllm.load(...))")
    text_signal = lm.signal(shipped_text() if text is None else text)
    if len(text_signal) < MIN_TEXT_TOKENS:
        raise ExperimentError(
            f"the text has {len(text_signal)} tokens; the distance profile needs at least {MIN_TEXT_TOKENS}"
        )
    prompt_signals = [lm.signal(p.text) for p in prompts]
    # The reference is the eager model (what the patch runs at T = 0), whatever the model was loaded with.
    with pde_attention(lm, Dynamics("diffusion", 0.0)):
        text_logits = lm.logits(text_signal, positions="all")
        prompt_logits = lm.logits(prompt_signals, positions="last")
    return Inputs(text_signal, text_signal.token_ids.clone(), prompt_signals, text_logits, prompt_logits)


def measure_points(
    lm: Any, config: PDEConfig, todo: Sequence[Point], prompts: Sequence[Prompt], text: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(point id, JSON-able record) for each point of ``todo``, in order.

    The stock model's logits on the text and prompts, the reference of every point, are
    computed first (nothing is computed when ``todo`` is empty).
    """
    if not todo:
        return
    if not prompts:
        raise ExperimentError("no prompts given")
    n_layers = len(attention_modules(lm))
    inputs = prepare_inputs(lm, prompts, text)
    for point in todo:
        record, _, _ = measure_step(
            lm, config, inputs, "attention" if point.variant == "stock" else point.variant, point.T, n_layers
        )
        record["variant"] = point.variant
        yield point.id, jsonable(record)


def build_result(
    model: str, config: PDEConfig, records: Sequence[dict[str, Any]], prompt_ids: Sequence[str]
) -> PDEResult:
    """A :class:`PDEResult` from records in point order (layers and text tokens read from them)."""
    first = records[0] if records else None
    return PDEResult(
        experiment="pde",
        model=str(model),
        config=config.to_dict(),
        n_layers=len(first["attention"]["layers"]["entropy"]) if first else 0,
        text_tokens=int(first["text"]["tokens"]) if first else 0,
        prompts=list(prompt_ids),
        records=list(records),
    )


def run_pde(
    lm: Any,
    config: PDEConfig | None = None,
    *,
    prompts: Sequence[Prompt] | None = None,
    text: str | None = None,
    skip: Mapping[str, dict[str, Any]] | None = None,
    on_step: Callable[[str, dict[str, Any]], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    model_name: str | None = None,
) -> PDEResult:
    """The whole sweep on a :class:`~contllm.lm.ContinuousLM`; returns a :class:`PDEResult`. Writes nothing.

    prompts: None for the config's selection of the shipped prompts; text: None for the
    shipped text. skip: records already done, by :func:`step_id` (reused). on_step: called
    with (step id, record) for each new record. progress: called with (done, total) points.
    """
    config = config or PDEConfig()
    prompts = list(select_prompts(config.prompts) if prompts is None else prompts)
    if not prompts:
        raise ExperimentError("no prompts given")
    check_model(lm, config, text)
    skip = skip or {}
    plan = points(config)
    new = measure_points(lm, config, [p for p in plan if p.id not in skip], prompts, text)
    records: list[dict[str, Any]] = []
    for k, point in enumerate(plan):
        if progress is not None:
            progress(k, len(plan))
        record = skip.get(point.id)
        if record is None:
            _, record = next(new)
            if on_step is not None:
                on_step(point.id, record)
        records.append(record)
    if progress is not None:
        progress(len(plan), len(plan))
    name = model_name or getattr(getattr(lm, "info", None), "name", None) or "model"
    return build_result(name, config, records, [p.id for p in prompts])


def describe(point_id: str, record: dict[str, Any]) -> str:
    """One line of news about a finished point: perplexity, KL, the preferred fit, seconds."""

    def number(value: float | None, spec: str) -> str:  # null is how a non-finite number is stored
        return "nan" if value is None else format(value, spec)

    fits = record["attention"]["fits"]
    return (
        f"  {point_id}: ppl {number(record['text']['perplexity'], '.2f')}, KL {number(record['text']['kl'], '.3g')}, "
        f"prefers {fits['preferred']} (ΔAIC {number(fits['delta_aic'], '.1f')}), {number(record.get('seconds'), '.1f')} s"
    )


# ---------------------------------------------------------------------------- the declaration


class PDEExperiment(Experiment[dict[str, Any], PDEResult]):
    """``contllm run pde``: the sweep of pseudo-time T, one item per (variant, T) point."""

    name = "pde"
    help = "Attention rows (or hidden states) evolved over a pseudo-time T: outputs and the attention distance profile."
    description = (
        "Each attention row of the unmodified model evolves over a pseudo-time T (diffusion, wave or "
        "reaction along the keys it may see), beside a temperature control matched on row entropy and a "
        "causal smoothing of the hidden states. Per point: perplexity, KL and top-1 against the stock "
        "model on a shipped passage and prompts, and the attention distance profile m(d) with exponential "
        "and power-law fits. Items are the points, 'stock-T0' then '<variant>-T<T>' (e.g. 'attention-T4'); "
        "--prompts selects the prompts."
    )
    Config = PDEConfig
    result_type = PDEResult
    options = OPTIONS
    engine = False
    unit = "point"
    x_label = "pseudo-time T"
    metrics = Metric.table(
        """
        delta_aic_shift      lower  ΔAIC (power-law minus exponential fit of the attention distance profile), last T minus first: negative moves toward power-law decay
        kl_prompts_at_max_T  lower  KL(p_T || p_0) at the prompts' last position at the largest T, mean over prompts
        """
    )

    def items(self, config: PDEConfig) -> list[Point]:
        return points(self.check_config(config))

    def check(self, lm: Any, config: PDEConfig) -> None:
        check_model(lm, self.check_config(config))

    def run(
        self, lm: Any, config: PDEConfig, items: Sequence[Point], context: RunContext
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        config = self.check_config(config)
        for point_id, record in measure_points(lm, config, items, select_prompts(config.prompts)):
            context.say(describe(point_id, record))
            yield point_id, record

    def encode(self, record: dict[str, Any]) -> dict[str, Any]:
        return jsonable(record)

    def decode(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_record(data)
        except ValueError as exc:
            raise ExperimentError(f"malformed pde record: {exc}") from None

    def result(self, model: str, config: PDEConfig, records: Sequence[dict[str, Any]]) -> PDEResult:
        config = self.check_config(config)
        return build_result(model, config, records, [p.id for p in select_prompts(config.prompts)])

    def tables(self, result: PDEResult) -> dict[str, Table]:
        return {"results": (CSV_COLUMNS, result.rows()), "profiles": (PROFILE_COLUMNS, result.profile_rows())}

    def summary(self, result: PDEResult) -> dict[str, Any]:
        return result.summary()

    def figures(self, result: PDEResult, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        return draw_figures(result)

    def comparison(self, results: Sequence[tuple[str, PDEResult]]) -> Any:
        return comparison_figure(results) if results else None


EXPERIMENT = PDEExperiment()


__all__ = [
    "DEFAULT_TIMES",
    "EXPERIMENT",
    "OPTIONS",
    "VARIANTS",
    "PDEConfig",
    "PDEExperiment",
    "Point",
    "Prompt",
    "build_result",
    "check_model",
    "measure_points",
    "measure_step",
    "points",
    "run_pde",
    "select_prompts",
    "shipped_prompts",
    "shipped_text",
    "step_id",
]
