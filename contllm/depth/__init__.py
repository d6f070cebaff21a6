"""Depth continuity: the layer stack of a stock model read as a discretised ODE.

A residual block maps its input h_l to Φ_l(h_l) = h_l + f_l(h_l): one forward Euler step
of size 1 of dh/dt = f(h, t). The probes measure, at inference on an unmodified model,
whether the stack behaves like a discretised flow. One module per concern:

* :mod:`~contllm.depth.stack`: :class:`LayerStack` and :class:`Trace`, h_0 .. h_L of a
  forward and each layer as a function of h;
* :mod:`~contllm.depth.patches`: scoped changes (scaled updates, half steps, injected
  perturbations, recording, replay), each a context manager that restores the model;
* :mod:`~contllm.depth.measures`: step profile, Lipschitz constants, propagation,
  fractional depth, half-step defects;
* :mod:`~contllm.depth.result`: :class:`PromptDepth` and :class:`DepthResult` (data);
* :mod:`~contllm.depth.figures`: the figures of a result;
* :mod:`~contllm.depth.experiment`: the prompts, :class:`DepthConfig`, :func:`run_depth`
  and ``contllm run depth`` (:data:`~contllm.depth.experiment.EXPERIMENT`).
"""

from contllm.depth.experiment import (
    DEFAULT_ALPHAS,
    PROMPTS,
    DepthConfig,
    DepthPrompt,
    probe_prompt,
    probe_prompts,
    run_depth,
    seed_index,
)
from contllm.depth.figures import FIGURES, depth_figure, depth_figures
from contllm.depth.measures import (
    JacobianBounds,
    finite_difference,
    fractional_depth,
    half_step_defects,
    jacobian_bounds,
    jvp,
    kl_divergence,
    layer_lipschitz,
    propagate,
    propagate_sizes,
    sampled_lipschitz,
    step_profile,
)
from contllm.depth.patches import (
    ALPHA_RANGE,
    check_alpha,
    half_step,
    half_steps,
    injected,
    recording,
    replayed,
    scaled_updates,
)
from contllm.depth.result import CSV_COLUMNS, QUANTILES, DepthResult, PromptDepth
from contllm.depth.stack import LayerCall, LayerStack, Trace, layer_index

__all__ = [
    "ALPHA_RANGE",
    "CSV_COLUMNS",
    "DEFAULT_ALPHAS",
    "FIGURES",
    "PROMPTS",
    "QUANTILES",
    "DepthConfig",
    "DepthPrompt",
    "DepthResult",
    "JacobianBounds",
    "LayerCall",
    "LayerStack",
    "PromptDepth",
    "Trace",
    "check_alpha",
    "depth_figure",
    "depth_figures",
    "finite_difference",
    "fractional_depth",
    "half_step",
    "half_step_defects",
    "half_steps",
    "injected",
    "jacobian_bounds",
    "jvp",
    "kl_divergence",
    "layer_index",
    "layer_lipschitz",
    "probe_prompt",
    "probe_prompts",
    "propagate",
    "propagate_sizes",
    "recording",
    "replayed",
    "run_depth",
    "sampled_lipschitz",
    "scaled_updates",
    "seed_index",
    "step_profile",
]
