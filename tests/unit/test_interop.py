"""forward_kwargs (contllm.internals.interop): the stock forward with its keyword arguments gives contllm's logits."""

from __future__ import annotations

from collections.abc import Callable

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


def nan_in_place() -> Signal:
    s = Signal.from_ids(prompt(6, 1), random_durations(6, 1))
    s.durations[1] = float("nan")
    return s


def negative_in_place() -> Signal:
    s = Signal.from_ids(prompt(6, 1), random_durations(6, 1))
    s.durations[2] = -5.0
    return s


#: (id, a signal the other entry points refuse, a regex of their message): the same rule for forward_kwargs and trace.
UNDEFINED = [
    (
        "all-zero",
        lambda: Signal.from_ids(prompt(6, 1), [0.0] * 6),
        r"^signal: every token has duration 0: nothing to attend to",
    ),
    (
        "nan-in-place",
        nan_in_place,
        r"^signal: durations must be finite; non-finite values at token indices \[1\]",
    ),
    (
        "negative-in-place",
        negative_in_place,
        r"^signal: durations must be >= 0; negative values at token indices \[2\]",
    ),
]


def log_p(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1)[:, 3]


@pytest.mark.parametrize("make,match", [u[1:] for u in UNDEFINED], ids=[u[0] for u in UNDEFINED])
def test_forward_kwargs_refuses_what_every_entry_point_refuses(make: Callable[[], Signal], match: str) -> None:
    lm = ContinuousLM(tiny_model("llama"))
    for call in (
        lm.forward_kwargs,
        lm.logits,
        lm.run_with_hooks,
        lambda s: lm.run_with_cache(s, names="blocks.0.hook_resid_post"),
        lambda s: lm.gradients(s, log_p),
    ):
        with pytest.raises(SignalError, match=match):
            call(make())
    with pytest.raises(SignalError, match=match.replace("^signal", r"^signals\[1\]")):
        lm.forward_kwargs([Signal.from_ids(prompt(4, 2)), make()])


nnsight = pytest.importorskip("nnsight", reason="pip install 'contllm[nnsight]'")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_lm_trace_is_nnsights_tracer_over_the_continuous_input(family: str) -> None:
    import copy

    # nnsight wraps every module's forward for good: trace a copy, as the docs advise for a shared model.
    lm = ContinuousLM(copy.deepcopy(tiny_model(family)))
    items = signals()
    before = lm.logits(items)
    table = lm.family
    with lm.trace(items) as tr:
        layers = tr.model.get(table.layers)
        resid = layers[1].output.save()
        logits = tr.model.output.logits.save()
    last = tr.columns(-1)  # the batch's layout, also after the block
    cache = lm.run_with_cache(items, names="blocks.1.hook_resid_post")
    for b, s in enumerate(items):
        columns = tr.columns(0)[b] + torch.arange(len(s))
        assert float((resid[b, columns] - cache.rows("blocks.1.hook_resid_post")[b]).abs().max()) <= 1e-5
        assert float((logits[b, columns] - cache.logits[b]).abs().max()) <= 1e-5
    assert torch.equal(last, tr.batch.pad_left + tr.batch.lengths - 1)
    assert not logits.requires_grad
    # An edit inside the trace: zero layer 1's output, as a hook function would.
    with lm.trace(items) as tr:
        tr.model.get(table.layers)[1].output[:] = 0
        edited = tr.model.output.logits.save()
    hooked = lm.run_with_hooks(items, fwd_hooks=[("blocks.1.hook_resid_post", lambda h, hook: torch.zeros_like(h))])
    assert float((edited[:, -1] - hooked).abs().max()) <= 1e-5
    # nnsight's controllers stay on the model, inert: contllm's own evaluation is unchanged.
    assert torch.equal(lm.logits(items), before)


@pytest.mark.parametrize("make,match", [u[1:] for u in UNDEFINED], ids=[u[0] for u in UNDEFINED])
def test_lm_trace_refuses_what_every_entry_point_refuses(make: Callable[[], Signal], match: str) -> None:
    import copy

    lm = ContinuousLM(copy.deepcopy(tiny_model("llama")))
    with pytest.raises(SignalError, match=match):
        with lm.trace(make()) as tr:
            tr.model.output.logits.save()
    with pytest.raises(SignalError, match=match.replace("^signal", r"^signals\[1\]")):
        with lm.trace([Signal.from_ids(prompt(4, 2)), make()]) as tr:
            tr.model.output.logits.save()
