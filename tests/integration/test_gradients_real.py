"""Gradients on SmolLM2 against central finite differences: the duration of each occurrence of a counted word, and
the input embeddings, for the probability of the count.

The gradient is taken on the float32 model as it is loaded; the finite differences run a
float64 copy of it (the stock forward, lm.forward_kwargs), whose float32 steps (positions,
rotary tables, RMS norms) leave a floor of about 1e-7: so the steps are 1e-2 and 4e-2 and
the truncation error is taken out by Richardson extrapolation, (4 D(h/2) - D(h)) / 3.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest
import torch

from contllm import ContinuousLM, Signal, wrap
from contllm.core.readout import digits

pytestmark = pytest.mark.integration

TEXT = '"cat cat" contains 2 words.\n"dog dog dog" contains 3 words.\n"apple apple apple apple" contains '


@pytest.fixture(scope="module")
def smollm64(smollm: ContinuousLM) -> ContinuousLM:
    return wrap(copy.deepcopy(smollm.model).double(), smollm.tokenizer)


def apples(lm: ContinuousLM) -> tuple[Signal, list[int], list[tuple[int, int]]]:
    base = lm.signal(TEXT)
    last = TEXT.rindex('"apple')
    spans = [s for s in base.find("apple") if s[0] >= last]
    return base, base.token_indices(spans), spans


def extrapolated(difference: Callable[[float], torch.Tensor], h: float) -> torch.Tensor:
    return (4 * difference(h / 2) - difference(h)) / 3


def test_count_gradients_by_durations_and_embeddings_equal_finite_differences(
    smollm: ContinuousLM, smollm64: ContinuousLM
) -> None:
    base, occurrences, spans = apples(smollm)
    half = base.scale(spans, 0.5)
    four = list(digits(smollm.tokenizer).token_ids[4])

    def p_four(logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.double(), dim=-1)[..., four].sum(-1)

    grads = smollm.gradients(half, p_four)
    assert grads.durations[0].shape == (len(half),) and grads.embeds[0].shape == (len(half), 576)

    def values(items: list[Signal]) -> torch.Tensor:
        inputs = smollm64.forward_kwargs(items)
        with inputs.context(), torch.no_grad():
            return p_four(smollm64.model(**inputs).logits[:, -1])

    assert abs(float(values([half])[0]) - float(grads.values[0])) <= 1e-4

    def by_durations(h: float) -> torch.Tensor:
        steps = []
        for i in occurrences:
            for k in (1.0, -1.0):
                d = half.durations.clone()
                d[i] += k * h
                steps.append(half.with_durations(d))
        v = values(steps)
        return (v[0::2] - v[1::2]) / (2 * h)

    want = extrapolated(by_durations, 1e-2)
    got = grads.durations[0][occurrences]
    assert float((want - got).abs().max()) <= 1e-3 * float(got.abs().max())
    assert bool((got > 0).all())  # a longer apple makes "4" more likely, each of the four
    embeds = smollm.embed(half)[0].double()
    g = grads.embeds[0].double()
    for seed in range(3):
        r = torch.randn(g.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        u = g / g.norm() + r / r.norm()
        u /= u.norm()

        def along(h: float, u: torch.Tensor = u) -> torch.Tensor:
            v = values([dataclasses.replace(half, embeds=embeds + k * h * u) for k in (1.0, -1.0)])
            return (v[0] - v[1]) / (2 * h)

        fd, ad = float(extrapolated(along, 4e-2)), float((g * u).sum())
        assert abs(fd - ad) <= 1e-3 * abs(ad)
