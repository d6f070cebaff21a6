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

from __future__ import annotations

from contllm.exports import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "contllm.depth.experiment": (
            "DEFAULT_ALPHAS",
            "PROMPTS",
            "DepthConfig",
            "DepthPrompt",
            "probe_prompt",
            "probe_prompts",
            "run_depth",
            "seed_index",
        ),
        "contllm.depth.figures": (
            "FIGURES",
            "depth_figure",
            "depth_figures",
        ),
        "contllm.depth.measures": (
            "JacobianBounds",
            "finite_difference",
            "fractional_depth",
            "half_step_defects",
            "jacobian_bounds",
            "jvp",
            "kl_divergence",
            "layer_lipschitz",
            "propagate",
            "propagate_sizes",
            "sampled_lipschitz",
            "step_profile",
        ),
        "contllm.depth.patches": (
            "ALPHA_RANGE",
            "check_alpha",
            "half_step",
            "half_steps",
            "injected",
            "recording",
            "replayed",
            "scaled_updates",
        ),
        "contllm.depth.result": (
            "CSV_COLUMNS",
            "QUANTILES",
            "DepthResult",
            "PromptDepth",
        ),
        "contllm.depth.stack": (
            "LayerCall",
            "LayerStack",
            "Trace",
            "layer_index",
        ),
    },
)
