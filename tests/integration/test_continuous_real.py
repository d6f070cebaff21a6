"""The continuous attention on the embedded pretrained models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contllm import ContinuousLM
from contllm.core.engine import time_origin

pytestmark = [pytest.mark.integration, pytest.mark.numerics]

PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
    "and watched the ships pass safely through the narrow channel below. One night the"
)


def test_unit_durations_equal_the_stock_forward(real_lm: ContinuousLM) -> None:
    signal = real_lm.signal(PROMPT)
    assert len(signal) >= 30
    ids = signal.token_ids[None]
    with torch.no_grad():
        stock = real_lm.model(ids, logits_to_keep=0).logits[0].float()
    ours = real_lm.logits(signal, positions="all")
    assert float((ours - stock).abs().max()) <= 1e-4


def test_top5_next_tokens_equal_the_stock_model(real_lm: ContinuousLM) -> None:
    signal = real_lm.signal(PROMPT)
    with torch.no_grad():
        stock = real_lm.model(signal.token_ids[None]).logits[0, -1]
    ours = real_lm.logits(signal)
    assert torch.topk(ours, 5).indices.tolist() == torch.topk(stock, 5).indices.tolist()


def test_duration_sweep_gives_finite_distributions(real_lm: ContinuousLM) -> None:
    signal = real_lm.signal(PROMPT)
    spans = signal.find("lamp") + signal.find("ships")
    sweep = [signal.scale(spans, float(c)) for c in np.linspace(0.0, 2.0, 9)]
    probs = real_lm.probs(sweep)
    assert torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(-1), torch.ones(len(sweep)), atol=1e-4)
    # The edit reaches the output, and the zero-duration end differs from the plain prompt.
    assert float((probs[0] - probs[4]).abs().max()) > 1e-4


def test_gemma3_long_prompt_beyond_the_window_equals_stock(gemma: ContinuousLM) -> None:
    """Gemma 3's local layers slide over 512 tokens: our windows in time must reproduce them."""
    text = " ".join(f"Box {i} is {['red', 'green', 'blue'][i % 3]}." for i in range(120))
    signal = gemma.signal(text)
    assert len(signal) > 600
    n = len(signal)
    # The engine reads these positions with the time origin moved next to them (exact on a
    # relative model; contllm.core.engine.time_origin): the stock model gets the same position
    # ids, so both round the rotary angles alike (at positions 0..n-1 the stock logits
    # themselves move by ~2e-4 from rounding angles near 600 in float32). The sliding
    # window the stock model applies comes from its own cache positions, not from these.
    origin = time_origin([signal], [[n - 4, n - 3, n - 2, n - 1]])
    assert gemma.relative_positions and origin > 512
    positions = torch.arange(n)[None] - int(origin)
    with torch.no_grad():
        stock = gemma.model(signal.token_ids[None], position_ids=positions, logits_to_keep=4).logits[0].float()
    ours = gemma.logits(signal, positions=[-4, -3, -2, -1])
    assert float((ours - stock).abs().max()) <= 1e-4


def test_generation_from_a_half_length_token(smollm: ContinuousLM) -> None:
    signal = smollm.signal("The capital of France is")
    plain = smollm.generate(signal, max_new_tokens=6)
    with torch.no_grad():
        stock = smollm.model.generate(
            signal.token_ids[None], attention_mask=torch.ones(1, len(signal), dtype=torch.long),
            max_new_tokens=6, do_sample=False,
        )[0, len(signal):]
    assert plain.token_ids == stock.tolist()[: len(plain.token_ids)]
    halved = smollm.generate(signal.scale(signal.find("France"), 0.5), max_new_tokens=6)
    assert len(halved.token_ids) >= 1 and isinstance(halved.text, str)
