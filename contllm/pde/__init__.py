"""Attention dynamics over a pseudo-time T inside a pretrained model, as a probe.

* :mod:`~contllm.pde.dynamics`: diffusion, wave, reaction-diffusion and temperature on
  one attention row (:class:`Dynamics`);
* :mod:`~contllm.pde.attention`: :func:`pde_attention`, which applies them inside a
  model through transformers' AttentionInterface, scoped to a context;
* :mod:`~contllm.pde.hidden`: :func:`causal_smoothing`, the hidden-state variant;
* :mod:`~contllm.pde.measure`: output measures, perplexity, the attention distance
  profile and its fits;
* :mod:`~contllm.pde.experiment`: :func:`run_pde` (a sweep of T) and ``contllm run pde``;
  :mod:`~contllm.pde.result` and :mod:`~contllm.pde.figures`: saving and plotting.
"""

from __future__ import annotations

from contllm.pde.attention import IMPLEMENTATION, attention_modules, pde_attention
from contllm.pde.dynamics import KINDS, Dynamics, DynamicsError, apply_dynamics
from contllm.pde.experiment import (
    DEFAULT_TIMES,
    VARIANTS,
    PDEConfig,
    Prompt,
    config_from_options,
    run_pde,
    run_pde_command,
    shipped_prompts,
    shipped_text,
)
from contllm.pde.hidden import causal_smoothing
from contllm.pde.measure import AttentionRecorder, Fit, compare_fits, fit_exponential, fit_power_law, output_measures, perplexity
from contllm.pde.result import PDEResult

__all__ = [
    "DEFAULT_TIMES",
    "IMPLEMENTATION",
    "KINDS",
    "VARIANTS",
    "AttentionRecorder",
    "Dynamics",
    "DynamicsError",
    "Fit",
    "PDEConfig",
    "PDEResult",
    "Prompt",
    "apply_dynamics",
    "attention_modules",
    "causal_smoothing",
    "compare_fits",
    "config_from_options",
    "fit_exponential",
    "fit_power_law",
    "output_measures",
    "pde_attention",
    "perplexity",
    "run_pde",
    "run_pde_command",
    "shipped_prompts",
    "shipped_text",
]
