"""Attention dynamics over a pseudo-time T inside a pretrained model, as a probe.

* :mod:`~contllm.pde.dynamics`: diffusion, wave, reaction-diffusion and temperature on
  one attention row (:class:`Dynamics`);
* :mod:`~contllm.pde.attention`: :func:`pde_attention`, which applies them inside a
  model through transformers' AttentionInterface, scoped to a context;
* :mod:`~contllm.pde.hidden`: :func:`causal_smoothing`, the hidden-state variant;
* :mod:`~contllm.pde.measure`: output measures, perplexity, the attention distance
  profile and its fits;
* :mod:`~contllm.pde.experiment`: :func:`run_pde` (a sweep of T) and ``EXPERIMENT``,
  what ``contllm run pde`` runs;
* :mod:`~contllm.pde.result`: :class:`PDEResult`, the records as data, and
  :mod:`~contllm.pde.figures`: the figures drawn from it.
"""

from __future__ import annotations

from contllm.pde.attention import IMPLEMENTATION, pde_attention
from contllm.pde.dynamics import KINDS, Dynamics, DynamicsError, apply_dynamics
from contllm.pde.experiment import (
    DEFAULT_TIMES,
    EXPERIMENT,
    VARIANTS,
    PDEConfig,
    PDEExperiment,
    Prompt,
    run_pde,
    shipped_prompts,
    shipped_text,
)
from contllm.pde.hidden import causal_smoothing
from contllm.pde.measure import AttentionRecorder, Fit, compare_fits, fit_exponential, fit_power_law, output_measures, perplexity
from contllm.pde.result import PDEResult

__all__ = [
    "DEFAULT_TIMES",
    "EXPERIMENT",
    "IMPLEMENTATION",
    "KINDS",
    "VARIANTS",
    "AttentionRecorder",
    "Dynamics",
    "DynamicsError",
    "Fit",
    "PDEConfig",
    "PDEExperiment",
    "PDEResult",
    "Prompt",
    "apply_dynamics",
    "causal_smoothing",
    "compare_fits",
    "fit_exponential",
    "fit_power_law",
    "output_measures",
    "pde_attention",
    "perplexity",
    "run_pde",
    "shipped_prompts",
    "shipped_text",
]
