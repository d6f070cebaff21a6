"""Interpolation between two prompts that differ in one span (DESIGN.md section 2)."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from contllm import ContinuousLM, SignalError
from contllm.core.interpolate import interpolate_spans, mix
from tests.unit.tiny import tiny_model, word_level_tokenizer

pytestmark = pytest.mark.unit

WORDS = ["<unk>", "what", "is", "1", "0", "and", "or", "not", "exclusive", "?", "answer", ":", "xor"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(WORDS)


def pair(lm: ContinuousLM, op_a: str, op_b: str):
    texts = [f"what is 1 {op} 0 ? answer :" for op in (op_a, op_b)]
    signals = [lm.signal(t).embedded(lm.model.get_input_embeddings()) for t in texts]
    spans = [(len("what is 1 "), len("what is 1 ") + len(op)) for op in (op_a, op_b)]
    return signals, spans


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("op_b", ["or", "exclusive or", "not exclusive or"])
@pytest.mark.parametrize("method", ["linear", "slerp"])
def test_endpoints_equal_the_plain_prompts(family: str, op_b: str, method: str, tokenizer) -> None:
    lm = ContinuousLM(tiny_model(family, "eager"), tokenizer)
    (a, b), (sa, sb) = pair(lm, "and", op_b)
    plain = lm.logits([a, b], positions="all")
    at0 = lm.logits(interpolate_spans(a, sa, b, sb, 0.0, method=method), positions="all")
    at1 = lm.logits(interpolate_spans(a, sa, b, sb, 1.0, method=method), positions="all")
    # The last position (the read-out) and every position outside the span agree.
    assert float((at0[-1] - plain[0][-1]).abs().max()) <= 1e-5
    assert float((at1[-1] - plain[1][-1]).abs().max()) <= 1e-5


@pytest.mark.parametrize("method", ["linear", "slerp"])
def test_interpolation_is_continuous_in_alpha(method: str, tokenizer) -> None:
    lm = ContinuousLM(tiny_model("qwen2", "eager"), tokenizer)
    (a, b), (sa, sb) = pair(lm, "and", "not exclusive or")
    alphas = torch.linspace(0, 1, 41)
    curve = lm.logits([interpolate_spans(a, sa, b, sb, float(x), method=method) for x in alphas])
    steps = (curve[1:] - curve[:-1]).abs().max(dim=-1).values
    total = float((curve[-1] - curve[0]).abs().max())
    assert total > 1e-2
    # No jumps: each step of 1/40 moves the logits by a small share of what the whole sweep does.
    assert float(steps.max()) < 0.25 * float(steps.sum())
    fine = lm.logits([interpolate_spans(a, sa, b, sb, x, method=method) for x in (0.5, 0.5 + 1e-4)])
    assert float((fine[0] - fine[1]).abs().max()) < 1e-2


def test_mix_endpoints_and_slerp_norms() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 8, generator=g), 3 * torch.randn(5, 8, generator=g)
    for method in ("linear", "slerp"):
        assert torch.allclose(mix(a, b, 0.0, method), a, atol=1e-6)
        assert torch.allclose(mix(a, b, 1.0, method), b, atol=1e-5)
    half = mix(a, b, 0.5, "slerp")
    assert torch.allclose(half.norm(dim=-1), (a.norm(dim=-1) + b.norm(dim=-1)) / 2, atol=1e-5)
    assert torch.allclose(mix(a, a, 0.3, "slerp"), a, atol=1e-5)


def test_bad_interpolations_are_named(tokenizer) -> None:
    lm = ContinuousLM(tiny_model("llama", "eager"), tokenizer)
    (a, b), (sa, sb) = pair(lm, "and", "or")
    with pytest.raises(SignalError, match="alpha must lie in"):
        interpolate_spans(a, sa, b, sb, 1.5)
    with pytest.raises(SignalError, match="'linear' or 'slerp'"):
        interpolate_spans(a, sa, b, sb, 0.5, method="cubic")  # type: ignore[arg-type]
    other = lm.signal("what is 0 or 0 ? answer :").embedded(lm.model.get_input_embeddings())
    with pytest.raises(SignalError, match="differ before the spans"):
        interpolate_spans(a, sa, other, sb, 0.5)
    with pytest.raises(SignalError, match="embedded"):
        interpolate_spans(lm.signal("what is 1 and 0 ? answer :"), sa, b, sb, 0.5)
