"""Inside the model: named hook points, the hook installer and what is built on it.

* :mod:`~contllm.internals.hookpoints`: the TransformerLens-named points of a stock
  model, kept per model;
* :mod:`~contllm.internals.intervention`: the named-hook context (``lm.hooks()``);
  :mod:`~contllm.internals.sites` its table of one installer per kind of point,
  :mod:`~contllm.internals.hookrun` what a hook function is told and what a run keeps,
  :mod:`~contllm.internals.binding` hooks bound to their signals and hooks added until reset;
* :mod:`~contllm.internals.hooks`: the raw-layer API beneath it (output, input and
  replaced-forward hooks that remove themselves);
* :mod:`~contllm.internals.hooked_attention`: attention patterns and scores as points;
* :mod:`~contllm.internals.activations`, :mod:`~contllm.internals.activation_cache`:
  ``run_with_cache`` and ``run_with_hooks`` and the cache they fill;
* :mod:`~contllm.internals.gradients`: gradients with respect to inputs, activations and
  durations;
* :mod:`~contllm.internals.interop`: the nnsight bridge.

Nothing is imported when the package is.
"""
