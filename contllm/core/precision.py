"""Half-precision matmuls around a float32 state: how the engine runs a bfloat16 model.

A bfloat16 model run as stock rounds everything to 8 significant bits: the residual
stream after every addition, the normalised activations, the rotary embedding, the
attention mask (the log-duration bias included) and the attention itself. On
SmolLM2-135M that moves next-token probabilities by up to 2.4e-2 from float32. The
matmuls are where bfloat16 saves time, and rounding only them - their inputs, weights
and outputs - costs about 1e-2 (measured in benchmarks/README.md).

:func:`float32_state` keeps the rest in float32 while the context lasts:

- the input embeddings and the attention masks are built in float32 (through
  :attr:`ContinuousLM.state_dtype <contllm.lm.ContinuousLM.state_dtype>`);
- the query and key projections of every layer (the family table's
  ``float32_projections``; the fused query/key/value projection where the family has
  one) run in float32, on float32 copies of their weights and bias and on uncast
  inputs: a query or key rounded to bfloat16 moves every attention logit it enters, and
  the softmax exponentiates that (on SmolLM2-135M, a 200-signal counting subset: 0.26x
  the distance of the model wholly in bfloat16 with them, 0.40x without; docs/speed.md). The copies cost memory
  (a float32 copy of those weights, made on entry) and, where bfloat16 matmuls are faster
  than float32 ones, their share of the matmul time; ``float32_projections=False`` (or
  :data:`FLOAT32_PROJECTIONS` = False) leaves every matmul in half precision;
- every other matmul module (``nn.Linear``, transformers' ``Conv1D``) casts its input to
  its weight's dtype (a forward pre-hook; one cast serves every module that reads the same
  tensor) and returns its output in that dtype, which type promotion lifts back to
  float32 where it meets the residual stream or the rotary embedding;
- every other floating parameter (normalisation weights and biases) is swapped for a
  float32 copy;
- the attention runs the model's own implementation (eager or sdpa) on float32 queries,
  keys and values, through an attention function registered with transformers'
  ``AttentionInterface`` under :data:`IMPLEMENTATION` (grouped-query sdpa reads each key
  head once instead of a float32 copy per query head).

Nothing is copied from transformers; on exit (also on an exception) the hooks are
removed, the original parameter objects are put back and the attention implementation
is the one the model had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, cast

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import Conv1D

from contllm.core.attention import attention_modules, stock_eager, switched_attention
from contllm.core.families import family_of
from contllm.errors import UnsupportedModelError
from contllm.internals.hooks import input_hook, replaced_module, replaced_parameter

#: The name under which the float32 attention is registered with transformers.
IMPLEMENTATION = "contllm_float32"

#: Modules whose weight enters a matmul: they keep their dtype and get inputs cast to it.
MATMUL_MODULES: tuple[type[nn.Module], ...] = (nn.Linear, Conv1D)

#: Whether :func:`float32_state` keeps the family's query and key projections in float32
#: when it is not told (the engine's setting; False: every matmul in half precision).
FLOAT32_PROJECTIONS = True

#: Largest float32 block of the vocabulary projection cast at once by :func:`float32_readout`.
_HEAD_BLOCK_BYTES = 64 << 20

#: The implementation each config had before :func:`float32_state`, by id(config).
_ORIGINAL: dict[int, str] = {}


def is_half(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is a 16-bit float (bfloat16 or float16)."""
    return dtype in (torch.bfloat16, torch.float16)


def output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the outputs (logits, probabilities, gradients) contllm returns for a model of ``dtype``.

    float64 for a float64 model, so that finite differences through its outputs are as
    exact as the model; float32 for every other (a half-precision model's logits come
    from :func:`float32_readout`).
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


class _InputCast:
    """Forward pre-hook: cast a matmul module's input to its weight's dtype.

    The norm output that feeds the query, key and value projections is cast once: the
    last cast is kept and reused while the same tensor object comes back for the same
    dtype (no supported family modifies a matmul's input in place between two matmuls;
    inference tensors keep no version counter to check it).
    """

    def __init__(self) -> None:
        self._source: torch.Tensor | None = None
        self._cast: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        x = args[0]
        dtype = cast(torch.Tensor, module.weight).dtype
        if not x.is_floating_point() or x.dtype == dtype:
            return None
        converted = self._cast
        if not (x is self._source and converted is not None and converted.dtype == dtype):
            converted = x.to(dtype)
            self._source, self._cast = x, converted
        return (converted, *args[1:]), kwargs

    def clear(self) -> None:
        self._source = self._cast = None


def _original_attention(module: nn.Module) -> Callable[..., Any]:
    name = _ORIGINAL.get(id(getattr(module, "config", None)))
    if name is None:
        raise UnsupportedModelError(f"{type(module).__name__} is not inside a float32_state() context")
    if name == "eager":
        return stock_eager(module)
    return ALL_ATTENTION_FUNCTIONS.get_interface(name, stock_eager(module))


def float32_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """The registered attention function: the model's own implementation on float32 inputs.

    For an sdpa model with grouped queries and a float mask (always the case here) it
    calls ``scaled_dot_product_attention`` with ``enable_gqa``, which reads each key and
    value head once instead of a float32 copy repeated for every query head; the result
    is the same.
    """
    query, key, value = query.float(), key.float(), value.float()
    if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    if _plain_sdpa(module, query, key, attention_mask, kwargs):
        output = nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling"), enable_gqa=True
        )
        return output.transpose(1, 2).contiguous(), None
    return _original_attention(module)(module, query, key, value, attention_mask, **kwargs)


def _plain_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, mask: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the model's own sdpa would compute a plain masked attention with repeated key heads."""
    return (
        _ORIGINAL.get(id(getattr(module, "config", None))) == "sdpa"
        and isinstance(mask, torch.Tensor)
        and mask.is_floating_point()
        and query.shape[1] != key.shape[1]
        and query.shape[1] % key.shape[1] == 0
        and not kwargs.get("dropout")
        and all(kwargs.get(name) is None for name in ("softcap", "s_aux", "position_bias", "head_mask"))
    )


AttentionInterface.register(IMPLEMENTATION, float32_attention_forward)
# Masks for this implementation are built like eager ones (additive, in float32).
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _float32_parameters(module: nn.Module, stack: ExitStack) -> None:
    """Swap the module's own floating half-precision parameters for float32 copies until ``stack`` closes."""
    for name, param in list(module._parameters.items()):
        if param is None or not is_half(param.dtype):
            continue
        stack.enter_context(replaced_parameter(module, name, nn.Parameter(param.detach().float(), requires_grad=False)))


def projection_modules(model: Any) -> list[nn.Module]:
    """The query and key projections of every layer (the family's ``float32_projections``), in layer order.

    A fused query/key/value projection is one module per layer. UnsupportedModelError
    when a layer's attention module lacks one or it is not a matmul module.
    """
    family = family_of(model)
    found = []
    for index, attention in enumerate(attention_modules(model)):
        for name in family.float32_projections:
            module = getattr(attention, name, None)
            if not isinstance(module, MATMUL_MODULES):
                raise UnsupportedModelError(
                    f"{family.name}: the attention module of layer {index} ({type(attention).__name__}) has no "
                    f"matmul module {name!r} (the family's float32_projections); its submodules are "
                    f"{', '.join(n for n, _ in attention.named_children())}"
                )
            found.append(module)
    return found


@contextmanager
def float32_state(lm: Any, *, float32_projections: bool | None = None) -> Iterator[None]:
    """Run a half-precision ``lm`` (a ContinuousLM) with half-precision matmuls and everything else in float32.

    float32_projections: also run the query and key projections (:func:`projection_modules`)
        in float32, on float32 copies of their weights; None reads
        :data:`FLOAT32_PROJECTIONS`. False leaves every matmul in half precision.

    A float32 model is left as it is. Nesting on the same model is a no-op.
    """
    model = lm.model
    active = lm.state_dtype != lm.dtype or getattr(model.config, "_attn_implementation", None) == IMPLEMENTATION
    if not is_half(lm.dtype) or active:
        yield
        return
    modules = attention_modules(model)
    keep = FLOAT32_PROJECTIONS if float32_projections is None else float32_projections
    in_float32 = {id(m) for m in projection_modules(model)} if keep else set()
    cast = _InputCast()
    with ExitStack() as stack:
        for module in model.modules():
            if id(module) in in_float32:
                _float32_parameters(module, stack)
            elif isinstance(module, MATMUL_MODULES):
                stack.enter_context(input_hook(module, cast))
            elif not isinstance(module, nn.Embedding):
                _float32_parameters(module, stack)
        stack.callback(cast.clear)
        saved = stack.enter_context(switched_attention(model, modules, IMPLEMENTATION))
        _ORIGINAL.update(saved)
        stack.callback(lambda: [_ORIGINAL.pop(key, None) for key in saved])
        stack.enter_context(lm._state_as(torch.float32))
        yield


class _Float32Head(nn.Module):
    """A vocabulary projection computed in float32 from a half-precision hidden state.

    The weight is cast block by block (at most :data:`_HEAD_BLOCK_BYTES` in float32 at
    a time), so no float32 copy of a large vocabulary is ever held.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        vocab, width = weight.shape
        block = max(1, _HEAD_BLOCK_BYTES // (4 * width))
        # One contiguous 2-D matrix of rows: a strided 3-D slice (the last column of a
        # batch) would make the product broadcast the weight over the batch.
        h = hidden.reshape(-1, width).float().contiguous()
        out = torch.empty(h.shape[0], vocab, dtype=torch.float32, device=h.device)
        if out.numel() > 0:
            for lo in range(0, vocab, block):
                hi = min(lo + block, vocab)
                b = None if bias is None else bias[lo:hi].float()
                out[:, lo:hi] = nn.functional.linear(h, weight[lo:hi].float(), b)
        return out.view(*hidden.shape[:-1], vocab)


@contextmanager
def float32_readout(model: nn.Module) -> Iterator[None]:
    """Project the read positions onto the vocabulary in float32 while the context lasts.

    In bfloat16 a logit near 20 is rounded to a multiple of 0.125, which moves a
    probability of 0.4 by up to 0.03; the hidden state holds more than that. Only the
    read positions are projected, so the float32 head costs little more than one cast
    of its weight per forward. Only a half-precision head (bfloat16, float16) is
    replaced: a float32 or float64 model, or a head that is not a plain Linear, is left
    as it is (a float64 head projects in float64).
    """
    head = cast(Any, model).get_output_embeddings()  # a transformers model's method, not nn.Module's
    if not isinstance(head, nn.Linear) or not is_half(head.weight.dtype):
        yield
        return
    parent_name, _, attr = next(name for name, m in model.named_modules() if m is head).rpartition(".")
    parent = model.get_submodule(parent_name)
    with replaced_module(parent, attr, _Float32Head(head)):
        yield
