"""Cache helpers (contllm.internals.activation_cache): the residual stream taken apart adds back up, on every family."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.families import attention_outputs, decoder_layers, final_norm, parallel_blocks
from contllm.errors import SignalError
from tests.unit.tiny import FAMILY_NAMES, prompt, random_durations, tiny_model

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 7


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def signals() -> list[Signal]:
    return [Signal.from_ids(prompt(N, 11), random_durations(N, 11)), Signal.from_ids(prompt(N, 12), random_durations(N, 12))]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_residual_stream_taken_apart_adds_back_up(family: str) -> None:
    lm = ContinuousLM(tiny_model(family))
    cache = lm.run_with_cache(signals(), positions=[2, -1])
    layers = len(decoder_layers(lm))
    final = cache[("resid_post", layers - 1)]
    assert torch.equal(cache["resid_post", layers - 1], cache[f"blocks.{layers - 1}.hook_resid_post"])
    assert ("pattern", 0) in cache and ("resid_post", 9) not in cache
    # Embeddings plus every attention and MLP output is the residual stream (Gemma's post-norms included).
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and labels[-1] == f"{layers - 1}_mlp_out"
    assert ("pos_embed" in labels) == (lm.family.positions == "learned")
    assert parts.shape == (len(labels), 2, 2, 64)
    assert max_diff(parts.sum(0), final) <= 1e-5
    # Entering layer 1, and the MLP input of layer 1 (sequential families).
    assert max_diff(cache.decompose_resid(1).sum(0), cache["resid_pre", 1]) <= 1e-5
    if not parallel_blocks(lm):
        assert max_diff(cache.decompose_resid(1, mlp_input=True).sum(0), cache["resid_mid", 1]) <= 1e-5
    else:
        with pytest.raises(SignalError, match="sequential"):
            cache.decompose_resid(1, mlp_input=True)
    stack, labels = cache.accumulated_resid(return_labels=True, incl_mid=not parallel_blocks(lm))
    assert labels[0] == "0_pre" and labels[-1] == "final_post"
    assert max_diff(stack[-1], final) <= 0 and max_diff(stack[0], cache["resid_pre", 0]) <= 0
    # Every head's result: per layer they add up to the output projection's output (less its bias).
    heads, labels = cache.stack_head_results(return_labels=True, incl_remainder=True)
    assert labels[:2] == ["L0H0", "L0H1"] and labels[-1] == "remainder"
    assert max_diff(heads.sum(0), final) <= 1e-5
    # Through the final norm, linearly: the parts plus the norm's bias are its output.
    normed = cache.apply_ln_to_stack(parts)
    bias = getattr(final_norm(lm), "bias", None)
    total = normed.sum(0) + (0 if bias is None else bias.detach())
    assert max_diff(total, cache["ln_final.hook_out"]) <= 1e-4
    with torch.no_grad():
        ln1 = cache.apply_ln_to_stack(cache.decompose_resid(1), layer=1).sum(0)
        norm1 = getattr(decoder_layers(lm)[1], lm.family.ln1)
        bias1 = getattr(norm1, "bias", None)
        assert max_diff(ln1 + (0 if bias1 is None else bias1), norm1(cache["resid_pre", 1])) <= 1e-4
    # The logit lens: its last row is the model's output.
    lens, labels = cache.logit_lens(return_labels=True)
    assert lens.shape[:3] == (layers + 1, 2, 2) and labels[-1] == "final_post"
    assert max_diff(lens[-1], torch.stack(cache.logits)) <= 1e-4


def test_head_results_are_the_output_projection_split_by_head() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    cache = lm.run_with_cache(signals(), names=lambda n: n.startswith("blocks.1.attn."))
    projection = attention_outputs(lm)[1]
    with torch.no_grad():
        want = projection(cache["blocks.1.attn.hook_z"].flatten(-2))
    assert max_diff(cache["result", 1].sum(-2), want) <= 1e-5
    with pytest.raises(SignalError, match="was not cached"):
        cache.stack_head_results()
    assert repr(cache).startswith("ActivationCache(2 signals,")
