"""forward_kwargs (contllm.interop): the stock forward with its keyword arguments gives contllm's logits."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.errors import SignalError
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, random_durations, tiny_model

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

CASES = [(f, b) for f in FAMILY_NAMES for b in backends(f)]


def signals() -> list[Signal]:
    """Two signals of different lengths and durations (the shorter one is padded on the left)."""
    return [
        Signal.from_ids(prompt(9, 1), random_durations(9, 1)),
        Signal.from_ids(prompt(6, 2), random_durations(6, 2, low=0.0, high=2.5)),
    ]


@pytest.mark.parametrize("family,impl", CASES)
def test_stock_forward_with_forward_kwargs_gives_contllm_logits(family: str, impl: str) -> None:
    lm = ContinuousLM(tiny_model(family, impl))
    items = signals()
    inputs = lm.forward_kwargs(items)
    assert set(inputs) == {"inputs_embeds", "attention_mask", "position_ids"}
    with inputs.context(), torch.no_grad():
        out = lm.model(**inputs).logits
    # The same padded forward contllm runs for run_with_cache (GPT-2's eager differs in the last bits).
    cache = lm.run_with_cache(items, names="ln_final.hook_normalized")
    for b, s in enumerate(items):
        columns = inputs.columns(0)[b] + torch.arange(len(s))
        assert float((out[b, columns] - cache.logits[b]).abs().max()) <= 1e-5
        assert int(inputs.columns(-1)[b]) == int(columns[-1])
    # The engine (chunks, shared prefix, last-position head) agrees to the batching tolerance.
    last = lm.logits(items)
    assert float((out[:, -1] - last).abs().max()) <= 1e-5
    # Without the mask the forward is another model: the arguments matter.
    plain = {k: v for k, v in inputs.items() if k != "attention_mask"}
    with inputs.context(), torch.no_grad():
        unmasked = lm.model(**plain).logits
    assert float((unmasked[:, -1] - last).abs().max()) > 1e-3


def test_learned_positions_need_the_context() -> None:
    lm = ContinuousLM(tiny_model("gpt2"))
    item = Signal.from_ids(prompt(8, 3), random_durations(8, 3))
    inputs = lm.forward_kwargs(item)
    table = lm.model.transformer.wpe
    with inputs.context():
        assert lm.model.transformer.wpe is not table
        with torch.no_grad():
            inside = lm.model(**inputs).logits[0, -1]
    assert lm.model.transformer.wpe is table
    assert float((inside - lm.logits(item)).abs().max()) <= 1e-5


def test_forward_kwargs_refuses_what_is_not_a_signal() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    with pytest.raises(SignalError):
        lm.forward_kwargs("some text")
    with pytest.raises(SignalError, match="vocabulary"):
        lm.forward_kwargs(Signal.from_ids(torch.tensor([1, 500])))
