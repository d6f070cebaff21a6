"""The attention-dynamics probe as an experiment: a sweep of pseudo-time T on one model.

For each T of the sweep and each variant

* ``attention``: the chosen dynamics (diffusion by default) on every attention row in scope;
* ``matched``: the control, each row tempered to the entropy diffusion over T gives it;
* ``hidden``: causal smoothing of the hidden states after each layer in scope;

one forward over the shipped text (perplexity, per-position KL and top-1 against the
stock model, and every layer's attention rows: distance profile, long-range mass,
entropy) and one batch of short prompts (KL, top-1 and entropy at the last position).
T = 0 is the stock model, shared by the variants. :func:`run_pde` returns a
:class:`~contllm.pde.result.PDEResult`; :func:`run_pde_command` is ``contllm run pde``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from contllm.errors import ExperimentError
from contllm.experiments.base import parse_floats
from contllm.pde.attention import attention_modules, pde_attention
from contllm.pde.dynamics import SPACINGS, Dynamics
from contllm.pde.hidden import causal_smoothing
from contllm.pde.measure import AttentionRecorder, compare_fits, output_measures, perplexity
from contllm.pde.result import PDEResult, jsonable

DEFAULT_TIMES: tuple[float, ...] = (0.0, 0.1, 0.4, 1.0, 4.0, 16.0, 64.0, 256.0)
VARIANTS = ("attention", "matched", "hidden")
SWEPT_KINDS = ("diffusion", "wave", "reaction")


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


def select_prompts(items: str | None, prompts: Sequence[Prompt]) -> list[Prompt]:
    """All prompts (None), the first N ("3"), or those named ("capital,code")."""
    if items is None:
        return list(prompts)
    text = items.strip()
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= len(prompts):
            raise ExperimentError(f"--items must be between 1 and {len(prompts)}, got {n}")
        return list(prompts)[:n]
    by_id = {p.id: p for p in prompts}
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [w for w in wanted if w not in by_id]
    if unknown or not wanted:
        raise ExperimentError(f"unknown pde prompt(s) {', '.join(unknown) or repr(items)}; the prompts are {', '.join(by_id)}")
    return [by_id[w] for w in wanted]


@dataclass
class PDEConfig:
    """Options of the probe.

    times: the pseudo-times T (>= 0; 0 is always added). dynamics: "diffusion", "wave"
    or "reaction" for the ``attention`` variant. rho, c: reaction strength and wave speed.
    spacing: "time" or "index" (see :class:`~contllm.pde.dynamics.Dynamics`).
    variants: which of :data:`VARIANTS` to run. layer, head: the scope (None: all).
    long_range: D of the long-range mass. fit_min, fit_max: distances of the profile fits
    (fit_max None: half the text's tokens).
    """

    times: tuple[float, ...] = DEFAULT_TIMES
    dynamics: str = "diffusion"
    rho: float = 1.0
    c: float = 1.0
    spacing: str = "time"
    variants: tuple[str, ...] = VARIANTS
    layer: int | None = None
    head: int | None = None
    long_range: int = 32
    fit_min: int = 1
    fit_max: int | None = None

    def __post_init__(self) -> None:
        times = parse_floats(self.times, "times")
        for t in times:
            if not (math.isfinite(t) and t >= 0):
                raise ExperimentError(f"pseudo-times must be finite and >= 0, got {t:g}")
        self.times = tuple(sorted(set(times) | {0.0}))
        if self.dynamics not in SWEPT_KINDS:
            raise ExperimentError(f"dynamics must be one of {', '.join(SWEPT_KINDS)}, got {self.dynamics!r}")
        if self.spacing not in SPACINGS:
            raise ExperimentError(f"spacing must be one of {', '.join(SPACINGS)}, got {self.spacing!r}")
        variants = self.variants.split(",") if isinstance(self.variants, str) else list(self.variants)
        variants = [v.strip() for v in variants if v.strip()]
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            raise ExperimentError(f"unknown variant(s) {', '.join(unknown) or '(none given)'}; the variants are {', '.join(VARIANTS)}")
        self.variants = tuple(v for v in VARIANTS if v in variants)
        if self.long_range < 1:
            raise ExperimentError(f"long_range must be >= 1, got {self.long_range}")
        if self.fit_min < 1 or (self.fit_max is not None and self.fit_max < self.fit_min + 2):
            raise ExperimentError(f"the fit range needs 1 <= fit_min and fit_max >= fit_min + 2, got {self.fit_min}, {self.fit_max}")
        Dynamics(self.dynamics, rho=self.rho, c=self.c, spacing=self.spacing)  # checks rho and c

    def dynamics_at(self, variant: str, T: float) -> Dynamics:
        kind = self.dynamics if variant == "attention" else "matched"
        return Dynamics(kind, T, rho=self.rho, c=self.c, spacing=self.spacing)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["times"], data["variants"] = list(self.times), list(self.variants)
        return data


# ---------------------------------------------------------------------------- one step of the sweep


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
    config: PDEConfig, variant: str, T: float, recorder: AttentionRecorder, inputs: Inputs,
    text_logits: torch.Tensor, prompt_logits: torch.Tensor,
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
        layer_fits.append({
            "decay_length": (fits["exponential"] or {}).get("scale"),
            "exponent": (fits["power"] or {}).get("scale"),
            "delta_aic": fits["delta_aic"],
        })
    return {
        "variant": variant,
        "T": float(T),
        "dynamics": config.dynamics_at(variant, T).to_dict() if variant != "hidden" else {"kind": "hidden", "T": float(T)},
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


def prepare_inputs(lm: Any, prompts: Sequence[Prompt], text: str | None = None) -> Inputs:
    """Signals of the text and the prompts, and the stock model's logits on them."""
    if getattr(lm, "tokenizer", None) is None:
        raise ExperimentError("the pde probe needs a ContinuousLM with a tokenizer (contllm.load(...))")
    text_signal = lm.signal(shipped_text() if text is None else text)
    if len(text_signal) < 8:
        raise ExperimentError(f"the text has {len(text_signal)} tokens; the distance profile needs at least 8")
    prompt_signals = [lm.signal(p.text) for p in prompts]
    # The reference is the eager model (what the patch runs at T = 0), whatever the model was loaded with.
    with pde_attention(lm, Dynamics("diffusion", 0.0)):
        text_logits = lm.logits(text_signal, positions="all")
        prompt_logits = lm.logits(prompt_signals, positions="last")
    return Inputs(text_signal, text_signal.token_ids.clone(), prompt_signals, text_logits, prompt_logits)


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
    """The whole sweep on a :class:`~contllm.lm.ContinuousLM`; returns a :class:`PDEResult`.

    prompts: None for the shipped prompts; text: None for the shipped text. skip: records
    already done, by :func:`step_id` (reused). on_step: called with (step id, record) for
    each new record (to save it).
    """
    config = config or PDEConfig()
    prompts = list(shipped_prompts() if prompts is None else prompts)
    if not prompts:
        raise ExperimentError("no prompts given")
    n_layers = len(attention_modules(lm))
    if config.layer is not None and not -n_layers <= config.layer < n_layers:
        raise ExperimentError(f"layer {config.layer} is outside the model; it has {n_layers} layers")
    heads = int(lm.model.config.num_attention_heads)
    if config.head is not None and not -heads <= config.head < heads:
        raise ExperimentError(f"head {config.head} is outside the model; it has {heads} heads per layer")
    skip = skip or {}
    inputs = prepare_inputs(lm, prompts, text)
    plan = [("stock", 0.0)] + [(v, T) for v in config.variants for T in config.times if T > 0]
    records: list[dict[str, Any]] = []
    for k, (variant, T) in enumerate(plan):
        if progress is not None:
            progress(k, len(plan))
        key = step_id(variant, T)
        record = skip.get(key)
        if record is None:
            record, _, _ = measure_step(lm, config, inputs, "attention" if variant == "stock" else variant, T, n_layers)
            record["variant"] = variant
            record = jsonable(record)
            if on_step is not None:
                on_step(key, record)
        records.append(record)
    if progress is not None:
        progress(len(plan), len(plan))
    name = model_name or getattr(getattr(lm, "info", None), "name", None) or "model"
    return PDEResult(
        model=str(name),
        config=config.to_dict(),
        n_layers=n_layers,
        text_tokens=len(inputs.text_signal),
        prompts=[p.id for p in prompts],
        records=records,
    )


def step_id(variant: str, T: float) -> str:
    """The name of one (variant, T) record ("attention-T4", "stock-T0")."""
    return f"{variant}-T{T:g}"


# ---------------------------------------------------------------------------- the command


def config_from_options(
    *, times: str | None = None, dynamics: str | None = None, variants: str | None = None,
    layer: int | str | None = None, head: int | str | None = None, spacing: str | None = None,
    rho: float | None = None, c: float | None = None, long_range: int | None = None,
) -> PDEConfig:
    """A :class:`PDEConfig` from command-line values (None: the default)."""
    kwargs: dict[str, Any] = {}
    if times is not None:
        kwargs["times"] = parse_floats(times, "--times")
    for name, value in (("dynamics", dynamics), ("variants", variants), ("spacing", spacing)):
        if value is not None:
            kwargs[name] = value
    for name, value in (("layer", layer), ("head", head), ("long_range", long_range)):
        if value is not None:
            try:
                kwargs[name] = int(value)
            except (TypeError, ValueError):
                raise ExperimentError(f"--{name.replace('_', '-')} must be an integer, got {value!r}") from None
    for name, value in (("rho", rho), ("c", c)):
        if value is not None:
            kwargs[name] = float(value)
    return PDEConfig(**kwargs)


def run_pde_command(
    *,
    model: str = "smollm2-135m",
    device: str = "auto",
    dtype: str | None = None,
    items: str | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    config: PDEConfig | None = None,
    unused: Mapping[str, Any] | None = None,
    echo: Callable[[str], None] | None = None,
    lm: Any = None,
) -> Path:
    """``contllm run pde``: the sweep on the shipped text and prompts, into a run directory.

    Writes config.json, manifest.json, items/<variant>-T<T>.json (one record per finished
    point, what --resume skips), results.json, results.csv, profiles.csv, summary.json
    and figures/ (PNG and PDF). items: the first N prompts or their ids. unused: other
    ``run`` options, which must all be None. lm: an already loaded model (then ``model``
    only names it). Bad options raise ExperimentError before anything is written.
    """
    from contllm.runs import RunDir, atomic_write_json, base_manifest, default_out, load_for_run, now, refuse_unused

    say = echo or (lambda message: None)
    refuse_unused(unused, "pde")
    config = config or PDEConfig()
    prompts = select_prompts(items, shipped_prompts())
    resolved = {"experiment": "pde", "model": model, "dtype": dtype, "items": items, "seed": seed, "options": config.to_dict()}
    if out is None:
        out = default_out("pde", model)
    run = RunDir(out, resolved, resume=resume, force=force)
    torch.manual_seed(seed)
    if lm is None:
        lm = load_for_run(model, device=device, dtype=dtype, say=say)
    n_layers = len(attention_modules(lm))
    heads = int(lm.model.config.num_attention_heads)
    if config.layer is not None and not -n_layers <= config.layer < n_layers:
        raise ExperimentError(f"--layer {config.layer} is outside the model; it has {n_layers} layers")
    if config.head is not None and not -heads <= config.head < heads:
        raise ExperimentError(f"--head {config.head} is outside the model; it has {heads} heads per layer")
    run.open()
    say(f"{'resuming' if run.resumed else 'writing'} pde on {model} -> {run.path}")
    run.write_manifest({**base_manifest(lm, model), "status": "running"})
    done: dict[str, dict[str, Any]] = {}
    if run.resumed:
        for path in sorted((run.path / "items").glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                done[step_id(str(record["variant"]), float(record["T"]))] = record
            except (OSError, ValueError, KeyError, TypeError):  # an unreadable record is recomputed
                continue
        if done:
            say(f"{len(done)} points already finished; skipping them")
    started = time.perf_counter()

    def save(key: str, record: dict[str, Any]) -> None:
        atomic_write_json(run.item_path(key), record)
        fits = record["attention"]["fits"]
        say(
            f"  {key}: ppl {record['text']['perplexity']:.2f}, KL {record['text']['kl']:.3g}, "
            f"prefers {fits['preferred']} (ΔAIC {fits['delta_aic'] if fits['delta_aic'] is None else round(fits['delta_aic'], 1)}), "
            f"{record['seconds']:.1f} s"
        )

    result = run_pde(lm, config, prompts=prompts, skip=done, on_step=save, model_name=model)
    result.save(run.path)
    summary = result.summary()
    atomic_write_json(run.path / "summary.json", jsonable(summary))
    result.save_figures(run.path / "figures")
    run.write_manifest({"status": "finished", "finished": now(), "items": len(result.records),
                        "seconds": round(time.perf_counter() - started, 2)})
    say(f"  {summary['verdict']}")
    return run.path


__all__ = [
    "DEFAULT_TIMES",

    "VARIANTS",
    "PDEConfig",
    "Prompt",
    "config_from_options",
    "measure_step",
    "run_pde",
    "run_pde_command",
    "select_prompts",
    "shipped_prompts",
    "shipped_text",
    "step_id",
]
