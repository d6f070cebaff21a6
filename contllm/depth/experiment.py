"""The depth experiment: every depth probe on a few fixed prompts, declared for the runner.

A residual block maps its input h_l to Φ_l(h_l) = h_l + f_l(h_l): one forward Euler step
of size 1 of dh/dt = f(h, t). If a pretrained model behaves like a discretised flow, its
updates are small and vary smoothly with depth, nearby trajectories contract where the
flow does, and splitting a step in two barely changes the output.
:func:`probe_prompt` runs the probes of :mod:`contllm.depth.measures` on one prompt;
:func:`run_depth` runs them on several and returns a :class:`DepthResult` (the Python
API); :data:`EXPERIMENT` is ``contllm run depth`` (:mod:`contllm.rundir.runner` owns the run).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from contllm.core.families import decoder_layers
from contllm.depth.figures import depth_figures
from contllm.depth.measures import fractional_depth, half_step_defects, layer_lipschitz, propagate_sizes, step_profile
from contllm.depth.patches import check_alpha
from contllm.depth.result import DepthResult, PromptDepth
from contllm.depth.stack import LayerStack, layer_index
from contllm.errors import ExperimentError
from contllm.experiments.base import Experiment, Metric, RunContext, option_table
from contllm.experiments.options import config_dict, parse_floats, parse_ints


@dataclass(frozen=True)
class DepthPrompt:
    """A prompt of the depth probes: text (tokenized by the model's tokenizer) or token ids."""

    id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None

    def ids(self, tokenizer: Any) -> torch.Tensor:
        """Token ids [tokens]."""
        if self.token_ids is not None:
            return torch.tensor(self.token_ids, dtype=torch.long)
        if tokenizer is None or self.text is None:
            raise ExperimentError(f"prompt {self.id!r} has no token ids and the model has no tokenizer")
        return torch.tensor(tokenizer(self.text, add_special_tokens=True)["input_ids"], dtype=torch.long)


#: The fixed prompts of ``contllm run depth``: prose, a fact whose next word is predictable,
#: and code. Each is 20-30 tokens for the embedded tokenizers.
PROMPTS: tuple[DepthPrompt, ...] = (
    DepthPrompt(
        "story",
        "Every evening the old lighthouse keeper climbed the narrow stairs, lit the great lamp, "
        "and watched the fishing boats return to the",
    ),
    DepthPrompt(
        "physics",
        "Water boils at one hundred degrees Celsius at sea level, but on a high mountain the air "
        "pressure is lower, so water boils at a",
    ),
    DepthPrompt(
        "code", "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total /"
    ),
)


DEFAULT_ALPHAS = tuple(float(a) for a in np.round(np.linspace(0.0, 2.0, 9), 6))


@dataclass
class DepthConfig:
    """Options of the depth probes.

    layer: the layers of the single-layer probes (alpha sweeps of one layer, injection
        sites of perturbations); negative from the end; None: the first, the quarter,
        the middle, three quarters and the last.
    eps: perturbation sizes relative to ||h|| (Lipschitz samples and propagation), > 0.
    alphas: update scales in [0, 2]; 1 is always added.
    samples: random perturbations per layer, eps and kind (orthogonal, along).
    iters, sigma_iters: Jacobian-vector products (and as many transposed ones) for λ_max
        and for σ_max.
    method: "lanczos" or "power" iteration for them (see :func:`jacobian_bounds`).
    position: where perturbations are injected, as a fraction of the prompt's kept
        positions (0: the second token, 1: the last).
    skip_first: leave the first position (the BOS token, or the attention sink that plays
        its part) out of every statistic and perturbation.
    top_k: tokens whose probabilities are followed along alpha.

    The seed of the random directions is not an option: it is the run's (``seed`` of
    :func:`run_depth`, the runner's ``--seed``).
    """

    layer: tuple[int, ...] | None = None
    eps: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    samples: int = 4
    iters: int = 10
    sigma_iters: int = 6
    method: str = "lanczos"
    position: float = 0.5
    skip_first: bool = True
    top_k: int = 5

    def __post_init__(self) -> None:
        if self.layer is not None:
            self.layer = parse_ints(self.layer, "layer")
        self.eps = parse_floats(self.eps, "eps")
        for e in self.eps:
            if not (math.isfinite(e) and e > 0):
                raise ExperimentError(f"eps must be positive, got {e:g}")
        alphas = sorted({check_alpha(a) for a in parse_floats(self.alphas, "alphas")} | {1.0})
        self.alphas = tuple(alphas)
        if self.samples < 1:
            raise ExperimentError(f"samples must be >= 1, got {self.samples}")
        if self.iters < 1 or self.sigma_iters < 1:
            raise ExperimentError(f"iters and sigma_iters must be >= 1, got {self.iters}, {self.sigma_iters}")
        if self.method not in ("lanczos", "power"):
            raise ExperimentError(f"method must be 'lanczos' or 'power', got {self.method!r}")
        if not 0.0 <= self.position <= 1.0:
            raise ExperimentError(f"position must be a fraction in [0, 1], got {self.position}")
        if self.top_k < 1:
            raise ExperimentError(f"top_k must be >= 1, got {self.top_k}")

    def lipschitz_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~contllm.depth.measures.layer_lipschitz` that this config sets (all but
        the seed)."""
        keys = ("eps", "samples", "iters", "sigma_iters", "method")
        return {key: getattr(self, key) for key in keys}

    def resolved_layers(self, n_layers: int) -> list[int]:
        """The single-layer probe layers as indices 0 .. n_layers - 1 (checked, in order, no repeats)."""
        if self.layer is None:
            picks = [0, n_layers // 4, n_layers // 2, (3 * n_layers) // 4, n_layers - 1]
        else:
            picks = [layer_index(layer, n_layers) for layer in self.layer]
        return list(dict.fromkeys(picks))


def seed_index(prompt: DepthPrompt, position: int) -> int:
    """What seeds a prompt's random directions: its place in :data:`PROMPTS`, else ``position`` (its place in the list run).

    A shipped prompt gets the same directions whichever prompts run with it, and whether
    a run is resumed or sharded.
    """
    for index, shipped in enumerate(PROMPTS):
        if shipped == prompt:
            return index
    return position


def probe_prompt(
    stack: LayerStack, prompt: DepthPrompt, config: DepthConfig, *, tokenizer: Any = None, index: int = 0, seed: int = 0
) -> PromptDepth:
    """Every depth probe on one prompt.

    index: the prompt's place (see :func:`seed_index`) and seed: the run's; together they
    seed its random directions.
    """
    started = time.perf_counter()
    ids = prompt.ids(tokenizer)
    if len(ids) < 3:
        raise ExperimentError(f"prompt {prompt.id!r} has {len(ids)} tokens; the depth probes need at least 3")
    layers = config.resolved_layers(stack.n_layers)
    trace = stack.trace(ids, skip_first=config.skip_first)
    first = 1 if config.skip_first else 0
    position = first + int(round(config.position * (trace.n_tokens - 1 - first)))
    propagation = []
    for layer in layers:
        generator = torch.Generator().manual_seed(seed * 7919 + index * 131 + layer)
        direction = torch.randn(trace.states.shape[-1], generator=generator, dtype=torch.float64)
        propagation += propagate_sizes(
            stack, trace, layer=layer, position=position, eps=config.eps, direction=direction
        )
    fractional = fractional_depth(stack, trace, config.alphas, layers=layers, top_k=config.top_k)
    tokens, token_strings = None, {}
    if tokenizer is not None:
        tokens = [tokenizer.decode([int(t)]) for t in ids]
        token_strings = {str(i): tokenizer.decode([i]) for i in sorted(int(i) for i in fractional["top_ids"])}
    return PromptDepth(
        id=prompt.id,
        text=prompt.text,
        token_ids=[int(t) for t in ids],
        tokens=tokens,
        profile=step_profile(trace),
        lipschitz=layer_lipschitz(stack, trace, seed=seed + 1000 * index, **config.lipschitz_options()),
        propagation=propagation,
        fractional=fractional,
        half=half_step_defects(stack, trace),
        seconds=time.perf_counter() - started,
        token_strings=token_strings,
    )


def probe_prompts(
    lm: Any, config: DepthConfig, prompts: Sequence[DepthPrompt], *, seed: int = 0, indices: Sequence[int] | None = None
) -> Iterator[PromptDepth]:
    """:func:`probe_prompt` on each prompt in turn, yielding each record as it is done.

    lm: a :class:`~contllm.lm.ContinuousLM` (or a bare causal LM, then prompts need token
    ids). indices: what seeds each prompt (None: :func:`seed_index`). The model is in
    eval mode while records are made and back in its own mode once the iteration ends.
    """
    bare = isinstance(lm, torch.nn.Module)
    model = lm if bare else lm.model
    tokenizer = None if bare else lm.tokenizer
    stack = LayerStack(model)
    indices = [seed_index(p, k) for k, p in enumerate(prompts)] if indices is None else list(indices)
    was_training = model.training
    model.eval()
    try:
        for prompt, index in zip(prompts, indices):
            yield probe_prompt(stack, prompt, config, tokenizer=tokenizer, index=index, seed=seed)
    finally:
        model.train(was_training)


def depth_result(model: str, config: DepthConfig, records: Sequence[PromptDepth]) -> DepthResult:
    """The :class:`DepthResult` of ``records`` (in prompt order) made with ``config`` on the model named ``model``."""
    if not records:
        raise ExperimentError("a depth result needs at least one prompt's record")
    n_layers = int(np.asarray(records[0].profile["ratio"]).shape[0])
    token_strings = {k: v for r in records for k, v in r.token_strings.items()}
    return DepthResult(
        experiment="depth",
        model=str(model),
        config=config_dict(config),
        n_layers=n_layers,
        layers=config.resolved_layers(n_layers),
        records=list(records),
        token_strings={k: token_strings[k] for k in sorted(token_strings, key=int)},
    )


def run_depth(
    lm: Any,
    config: DepthConfig | None = None,
    *,
    prompts: Sequence[DepthPrompt] | None = None,
    seed: int = 0,
    on_prompt: Callable[[PromptDepth], None] | None = None,
    model_name: str | None = None,
) -> DepthResult:
    """Every depth probe on each prompt of a model; returns a :class:`DepthResult` (nothing is written).

    lm: a :class:`~contllm.lm.ContinuousLM` (or a bare causal LM, then prompts need token
    ids). prompts: None for :data:`PROMPTS`. seed: the random directions' (0 is what
    ``contllm run depth`` uses by default). on_prompt: called with each record as it is done.
    """
    config = config or DepthConfig()
    prompts = list(PROMPTS if prompts is None else prompts)
    if not prompts:
        raise ExperimentError("no prompts given")
    model = lm if isinstance(lm, torch.nn.Module) else lm.model
    records = []
    for record in probe_prompts(lm, config, prompts, seed=seed):
        if on_prompt is not None:
            on_prompt(record)
        records.append(record)
    info_name = getattr(getattr(lm, "info", None), "name", None)
    name = model_name or info_name or getattr(model.config, "_name_or_path", "") or "model"
    return depth_result(name, config, records)


class DepthExperiment(Experiment[PromptDepth, DepthResult]):
    """``contllm run depth``: the depth probes of :mod:`contllm.depth` on :data:`PROMPTS`."""

    name = "depth"
    help = "The layer stack read as an ODE: step sizes, Lipschitz constants, propagation, fractional depth, half steps."
    description = (
        "Reads the residual stream h_{l+1} = h_l + f_l(h_l) of a stock model as forward Euler steps, on three "
        "fixed prompts (item ids: story, physics, code): step size and curvature per layer and token, sampled "
        "and Jacobian (Lanczos) Lipschitz and one-sided Lipschitz constants per layer, perturbations injected at "
        "a few layers and followed to the output, every (or one) update scaled by alpha in [0, 2], and each step "
        "split into two half steps. --seed sets the random directions."
    )
    Config = DepthConfig
    result_type = DepthResult
    options = option_table(
        """
        layer   ints    layers of the single-layer probes, comma-separated, negative from the end. [default: first, 1/4, 1/2, 3/4, last]
        eps     floats  perturbation sizes relative to ||h||, comma-separated, > 0. [default: 1e-3,1e-2,1e-1]
        alphas  floats  update scales alpha in [0, 2], comma-separated (1 is always added). [default: 0,0.25,...,2]
        """
    )
    engine = False
    shardable = True  # each prompt is seeded by its place in PROMPTS: any process can take it
    unit = "prompt"
    metrics = Metric.table(
        """
        half_step_defect_median  lower  ||two half steps - one full step|| / ||update||, median over layers: how well a layer splits like a flow
        half_step_kl_all_last    lower  KL(every layer split in two || stock) at the last position
        step_ratio_median        lower  ||f_l|| / ||h_l||, median over layers and tokens: how small each update is
        curvature_median         lower  ||f_(l+1) - f_l|| / ||f_l||, median over layers: how smoothly updates vary
        """
    )

    def items(self, config: DepthConfig) -> Sequence[DepthPrompt]:
        return PROMPTS

    def check(self, lm: Any, config: DepthConfig) -> None:
        """The probe layers exist in the model (ExperimentError naming the layer otherwise)."""
        self.check_config(config).resolved_layers(len(decoder_layers(lm)))

    def run(
        self, lm: Any, config: DepthConfig, items: Sequence[DepthPrompt], context: RunContext
    ) -> Iterator[tuple[str, PromptDepth]]:
        config = self.check_config(config)
        # Seeded by each prompt's place among all items, so that the numbers of a prompt do
        # not depend on which prompts are selected, already done or run by another process.
        place = {prompt.id: k for k, prompt in enumerate(self.items(config))}
        indices = [place.get(prompt.id, k) for k, prompt in enumerate(items)]
        for record in probe_prompts(lm, config, items, seed=context.seed, indices=indices):
            yield record.id, record

    def result(self, model: str, config: DepthConfig, records: Sequence[PromptDepth]) -> DepthResult:
        return depth_result(model, self.check_config(config), records)

    def tables(self, result: DepthResult) -> dict[str, Any]:
        return result.tables()

    def summary(self, result: DepthResult) -> dict[str, Any]:
        return result.summary()

    def figures(self, result: DepthResult, *, per_item: bool = True) -> Iterator[tuple[str, Any]]:
        return depth_figures(result, per_item=per_item)


EXPERIMENT = DepthExperiment()
