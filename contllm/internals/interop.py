"""Continuous inputs for other tools: the keyword arguments of a stock Hugging Face forward.

:func:`forward_kwargs` turns signals into what ``model(**inputs)`` takes: input
embeddings, the continuous-time attention mask (the log-duration bias and the causal
mask by time, per layer type where the family has windows) and float position ids. Any
code that calls the stock forward (nnsight, TransformerLens's bridge, baukit, a plain
``model(...)`` with hooks of one's own) then runs the continuous input::

    inputs = lm.forward_kwargs([signal])
    with inputs.context():           # learned position tables read at float times
        out = lm.model(**inputs)     # out.logits[:, -1] equals lm.logits(signal)

Caveats, each one a reason a result can differ from ``lm.logits``:

- Pass all three arguments. Without the mask a forward has no log-duration bias, and with
  ``attention_mask=None`` transformers treats non-unit position steps as packed sequences.
- Tools that tokenize or pad themselves must be bypassed: nnsight's ``LanguageModel``
  pads string and id inputs and builds its own 2D mask; give it these keyword arguments
  (no positional input), or wrap the model with the generic ``nnsight.NNsight``.
- The batch is left-padded with zero-duration tokens; read row b's token j at column
  ``inputs.columns(j)[b]`` (``inputs.batch.pad_left``), never at j itself.
- The model must use the attention implementation ``lm`` was made for (eager or sdpa);
  a half-precision model runs in its own dtype here, not in the float32 state contllm's
  engine keeps between its matmuls, so its logits differ by half-precision rounding. The
  inputs are built by :func:`contllm.core.forward.model_inputs`, under the dtype rule written in
  :mod:`contllm.core.forward` (embeddings and, under sdpa, the mask in the model's dtype).
- Families with learned positions (GPT-2) need :meth:`ForwardInputs.context` around the
  forward; rotary families need nothing, and the context does nothing for them.

:func:`trace` does all of this for nnsight: ``with lm.trace(signals) as tr:`` is nnsight's
own tracer (``.save()``, edits, ``.output``) over the continuous input, with the model as
``tr.model`` and each token's padded column as ``tr.columns(j)``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from contllm.core.attention import continuous_positions
from contllm.core.engine import check_signals
from contllm.core.forward import input_embeds, model_inputs, stock_forward
from contllm.core.signal import Signal, SignalBatch, pad_signals
from contllm.errors import UnsupportedModelError

__all__ = ["ForwardInputs", "forward_kwargs", "trace"]


class ForwardInputs(Mapping[str, Any]):
    """The keyword arguments of a stock forward for a batch of signals: a mapping, so ``model(**inputs)`` works.

    Keys: ``inputs_embeds`` [batch, width, hidden] in the model's dtype on its device;
    ``attention_mask``, a 4D float mask [batch, 1, width, width] (or a dict of them by
    layer type for families whose layers slide); ``position_ids``, float32 [batch, width],
    the times. ``batch`` is the left-padded :class:`~contllm.core.signal.SignalBatch` behind them.
    """

    def __init__(self, kwargs: dict[str, Any], batch: SignalBatch, lm: Any) -> None:
        self._kwargs = kwargs
        self.batch = batch
        self._lm = lm

    def __getitem__(self, key: str) -> Any:
        return self._kwargs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kwargs)

    def __len__(self) -> int:
        return len(self._kwargs)

    def context(self) -> AbstractContextManager[None]:
        """The context the forward must run in: float positions for a learned position table; restored on exit."""
        return continuous_positions(self._lm.model, self._lm.family)

    def columns(self, index: int) -> torch.Tensor:
        """The padded column of token ``index`` (negative: from each signal's end) in every row: long [batch]."""
        lengths = self.batch.lengths.to(torch.long)
        pad = self.batch.pad_left.to(torch.long)
        return pad + (index if index >= 0 else lengths + index)


def forward_kwargs(lm: Any, signals: Signal | Sequence[Signal]) -> ForwardInputs:
    """The keyword arguments that run ``signals`` through ``lm.model``'s own forward (see the module docstring).

    lm: a ContinuousLM; signals: one Signal or a list (padded on the left with
    zero-duration tokens). Raises SignalError for anything but signals, token ids outside
    the vocabulary or embeddings of the wrong width, and by the rule of every other entry
    point (:func:`contllm.core.engine.check_signals`) for a signal whose every token has
    duration 0 (its output is undefined) or whose tensors were edited in place to values a
    signal cannot hold (NaN or negative durations, times beyond +-MAX_TIME).
    """
    items = check_signals(signals, single_ok=True)
    batch = pad_signals(items)
    with torch.no_grad():
        embeds = input_embeds(lm, batch)
    kwargs = model_inputs(lm, embeds, batch.times, batch.times, batch.durations)
    return ForwardInputs(kwargs, batch, lm)


#: nnsight's envoy of each model traced so far (nnsight wraps a module's forward once, for good).
_ENVOYS: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()
_TRACERS: dict[str, type] = {}


def _tracer_class() -> type:
    """nnsight's tracer with the continuous input's batch at hand (built on first use: nnsight is optional)."""
    if "signals" not in _TRACERS:
        from nnsight.intervention.tracer import InterleavingTracer

        class SignalTracer(InterleavingTracer):  # type: ignore[misc]
            """nnsight's tracer over continuous inputs: ``model`` (nnsight's envoy of the model), ``inputs``
            (the :class:`ForwardInputs`), ``batch`` (the padded batch) and :meth:`columns`."""

            inputs: ForwardInputs

            @property
            def model(self) -> Any:
                return self.envoy

            @property
            def batch(self) -> SignalBatch:
                return self.inputs.batch

            def columns(self, index: int) -> torch.Tensor:
                """The padded column of token ``index`` (negative: from each signal's end) in every row: long [batch]."""
                return self.inputs.columns(index)

        _TRACERS["signals"] = SignalTracer
    return _TRACERS["signals"]


def trace(lm: Any, signals: Signal | Sequence[Signal], *, grad: bool = False, **options: Any) -> Any:
    """nnsight's tracer over ``signals`` on ``lm.model``: use it as ``with trace(lm, signals) as tr:``.

    Inside the block, ``tr.model`` is nnsight's envoy of the model: read, save and edit any
    module's ``.input`` and ``.output`` as nnsight allows; ``tr.model.output.logits`` are the
    logits of the left-padded batch, row b's token j at column ``tr.columns(j)[b]``. The
    forward gets :func:`forward_kwargs` inside :meth:`ForwardInputs.context` (the caveats
    above hold), under ``torch.no_grad()`` unless ``grad`` (for nnsight's backward and
    ``.grad``); options go to nnsight's ``trace``.

    nnsight wraps the forward of every module of the model it traces, for good (inert
    outside a trace; contllm's own evaluation is unchanged by it): trace a copy of a model
    others use. UnsupportedModelError when nnsight is not installed; SignalError for the
    signals :func:`forward_kwargs` refuses.
    """
    try:
        import nnsight
    except ImportError as err:
        raise UnsupportedModelError("lm.trace needs nnsight: pip install 'contllm[nnsight]'") from err
    inputs = forward_kwargs(lm, signals)
    model = lm.model
    if model not in _ENVOYS:
        _ENVOYS[model] = nnsight.NNsight(model)

    def run(**kwargs: Any) -> Any:
        with torch.no_grad() if not grad else contextlib.nullcontext():
            return stock_forward(lm, **kwargs)  # float positions for the call, as inputs.context() gives them

    tracer = _ENVOYS[model].trace(fn=run, tracer_cls=_tracer_class(), **dict(inputs), **options)
    tracer.inputs = inputs
    return tracer
