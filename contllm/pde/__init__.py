"""Attention dynamics over a pseudo-time T inside a pretrained model, as a probe.

* :mod:`~contllm.pde.dynamics`: diffusion, wave, reaction-diffusion and temperature on
  one attention row (:class:`Dynamics`);
* :mod:`~contllm.pde.attention`: :func:`pde_attention`, which applies them inside a
  model through transformers' AttentionInterface, scoped to a context;
* :mod:`~contllm.pde.hidden`: :func:`causal_smoothing`, the hidden-state variant;
* :mod:`~contllm.pde.probes`: output measures, perplexity, the attention distance
  profile and its fits;
* :mod:`~contllm.pde.experiment`: :func:`run_pde` (a sweep of T) and ``EXPERIMENT``,
  what ``contllm run pde`` runs;
* :mod:`~contllm.pde.result`: :class:`PDEResult`, the records as data, and
  :mod:`~contllm.pde.figures`: the figures drawn from it.
"""

from __future__ import annotations

from contllm.exports import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "contllm.pde.attention": ("IMPLEMENTATION", "pde_attention"),
        "contllm.pde.dynamics": ("KINDS", "Dynamics", "DynamicsError", "apply_dynamics"),
        "contllm.pde.experiment": (
            "DEFAULT_TIMES",
            "EXPERIMENT",
            "VARIANTS",
            "PDEConfig",
            "PDEExperiment",
            "Prompt",
            "run_pde",
            "shipped_prompts",
            "shipped_text",
        ),
        "contllm.pde.hidden": ("causal_smoothing",),
        "contllm.pde.probes": (
            "AttentionRecorder",
            "Fit",
            "compare_fits",
            "fit_exponential",
            "fit_power_law",
            "output_measures",
            "perplexity",
        ),
        "contllm.pde.result": ("PDEResult",),
    },
)
