"""Generation in continuous time on SmolLM2: the stock model's tokens at unit durations, another text at half."""

from __future__ import annotations

import torch

from contllm import ContinuousLM

PROMPTS = ["The capital of France is", "Once upon a time, there was a"]


def test_a_greedy_batch_equals_the_stock_generate_and_half_durations_change_it(smollm: ContinuousLM) -> None:
    signals = [smollm.signal(p) for p in PROMPTS]
    got = smollm.generate(signals, 6)
    for signal, generation in zip(signals, got):
        with torch.no_grad():
            stock = smollm.model.generate(
                signal.token_ids[None],
                attention_mask=torch.ones(1, len(signal), dtype=torch.long),
                max_new_tokens=6,
                do_sample=False,
            )[0, len(signal) :]
        assert generation.token_ids == stock.tolist()
    half = smollm.generate(signals[1], 6, duration=0.5)
    assert half.token_ids[:2] == got[1].token_ids[:2] and half.token_ids != got[1].token_ids
    assert half.signal.times[-1].item() == signals[1].end + 3.0
