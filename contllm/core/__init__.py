"""The core: continuous signals and the one forward that feeds them to a stock model.

* :mod:`~contllm.core.signal`: :class:`~contllm.core.signal.Signal`, tokens with
  positions and durations, and its batches;
* :mod:`~contllm.core.attention`: the continuous attention mask and how it enters each
  attention implementation;
* :mod:`~contllm.core.families`: one declarative entry per model family (positions,
  embedding scale, quirks);
* :mod:`~contllm.core.forward`: the one forward (embeddings, mask, positions, the dtype
  rule) and the context of differentiable runs;
* :mod:`~contllm.core.precision`: the float32 state of a half-precision model;
* :mod:`~contllm.core.engine`, :mod:`~contllm.core.chunks`, :mod:`~contllm.core.prefix`:
  batched sweeps, their chunk plans and the shared prompt prefix;
* :mod:`~contllm.core.interpolate`, :mod:`~contllm.core.readout`,
  :mod:`~contllm.core.decoding`: embedding interpolation, token read-outs and decoding
  steps.

Nothing is imported when the package is.
"""
