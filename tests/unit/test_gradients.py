"""Gradients (contllm.internals.gradients, lm.gradients): durations, embeddings and activations against central finite differences.

The models run in float64 and the finite differences read float64 logits from the stock
forward (lm.forward_kwargs, with lm.hooks for activations). Some steps of the stock
modules stay in float32 (position ids, rotary tables, RMS norms, the eager softmax), which
puts a floor of about 1e-7 under every difference; so the steps are not small (h = 1e-2
for durations, 4e-2 for unit directions of embeddings and activations) and the truncation
error is taken out by Richardson extrapolation of two central differences,
(4 D(h/2) - D(h)) / 3. Duration steps move later times: the signals keep every pair of
times away from the tiny models' window (4) and, for learned positions, every time away
from an integer, where the model is not differentiable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.errors import SignalError
from tests.unit.tiny import WINDOW, prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 8
H = 1e-2  # duration steps
H_STATE = 4e-2  # embedding and activation steps (along unit directions)
TARGET = 7


def log_p(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.double(), dim=-1)[..., TARGET]


def stock_values(lm: ContinuousLM, items: list[Signal], readout: Callable[[torch.Tensor], torch.Tensor], fwd_hooks=()) -> torch.Tensor:
    """readout of the last position's float64 logits from the stock forward of ``items`` (with hook functions)."""
    inputs = lm.forward_kwargs(items)
    with lm.hooks(items, fwd_hooks), inputs.context(), torch.no_grad():
        return readout(lm.model(**inputs).logits[:, -1])


def extrapolated(difference: Callable[[float], torch.Tensor], h: float) -> torch.Tensor:
    """Richardson extrapolation of central differences D(h) = (f(x + h) - f(x - h)) / 2h: (4 D(h/2) - D(h)) / 3."""
    return (4 * difference(h / 2) - difference(h)) / 3


def clear_of_kinks(durations: torch.Tensor, learned: bool) -> bool:
    """Whether no duration step of the tests crosses a window edge (or an integer time, for learned positions)."""
    t = torch.cumsum(durations, 0) - 1
    later = t[:, None] - t[None, :]
    if float((later - WINDOW).abs().min()) <= 5 * H:
        return False
    return not learned or float((t - t.round()).abs().min()) > 5 * H


def smooth_durations(n: int, learned: bool) -> torch.Tensor:
    """Random durations (seeded) whose times keep clear of the kinks: the first seed from 5 on that does."""
    seed = 5
    while not clear_of_kinks(random_durations(n, seed), learned):
        seed += 1
    return random_durations(n, seed)


def duration_steps(signal: Signal, h: float) -> list[Signal]:
    out = []
    for i in range(len(signal)):
        for sign in (1.0, -1.0):
            d = signal.durations.clone()
            d[i] += sign * h
            out.append(signal.with_durations(d))
    return out


def relative(fd: torch.Tensor, ad: torch.Tensor) -> float:
    return float((fd.double() - ad.double()).abs().max() / ad.double().abs().max())


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3", "phi", "phi3", "qwen2", "gpt_neox", "gpt2"])
def test_duration_and_embedding_gradients_equal_central_differences(family: str) -> None:
    lm = ContinuousLM(tiny_model64(family))
    # Windows (in time) and GPT-2's interpolated table (at integer times) are not differentiable everywhere.
    learned = lm.family.positions == "learned"
    signal = Signal.from_ids(prompt(N, 5), smooth_durations(N, learned))
    grads = lm.gradients(signal, log_p)
    assert grads.durations[0].dtype == torch.float64 and grads.durations[0].shape == (N,)
    assert grads.embeds[0].shape == (N, 64)
    def by_durations(h: float) -> torch.Tensor:
        values = stock_values(lm, duration_steps(signal, h), log_p)
        return (values[0::2] - values[1::2]) / (2 * h)

    assert relative(extrapolated(by_durations, H), grads.durations[0]) <= 1e-3
    assert float(grads.durations[0].abs().min()) > 0  # every token's duration matters
    embeds = lm.embed(signal)[0].double()
    for seed in range(3):
        u = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        u /= u.norm()

        def along(h: float, u: torch.Tensor = u) -> torch.Tensor:
            values = stock_values(lm, [dataclasses.replace(signal, embeds=embeds + k * h * u) for k in (1.0, -1.0)], log_p)
            return (values[0] - values[1]) / (2 * h)

        fd_u = extrapolated(along, H_STATE)
        ad_u = (grads.embeds[0].double() * u).sum()
        # Relative to the gradient's norm (the largest derivative along any unit direction), not to this
        # direction's own derivative: a random direction nearly orthogonal to the gradient has a derivative
        # near 0, where the float32 floor of the differences (module docstring) is all a quotient would read
        # (Gemma 3, seed 2: 0.0163 against a norm of 1.84; 2.3e-5 apart under AVX2 kernels, 1.4e-3 of 0.0163).
        assert abs(float(fd_u - ad_u)) <= 1e-3 * float(grads.embeds[0].double().norm())


def test_a_batch_gives_each_signal_its_own_gradients_and_activations_take_them_too() -> None:
    lm = ContinuousLM(tiny_model64("qwen2"))
    items = [Signal.from_ids(prompt(N, 7), random_durations(N, 7)), Signal.from_ids(prompt(5, 8), random_durations(5, 8))]
    name = "blocks.1.hook_resid_post"
    both = lm.gradients(items, log_p, wrt=["durations", "embeds", name, ("pattern", 2)])
    assert both.values.shape == (2,)
    for b, s in enumerate(items):
        alone = lm.gradients(s, log_p, wrt=["durations", "embeds", name])
        assert relative(both.durations[b], alone.durations[0]) <= 1e-6
        # The embeddings' gradient comes back in the model's float64 (float32 for any other model). A padded
        # row still differs from the signal alone by the stock modules' float32 steps (module docstring):
        # 8e-7 on this CPU (1.2e-6 was measured under AVX2 kernels when it came back in float32); a batch that
        # mixed its rows would be off by the gradient's own size.
        assert both.embeds[b].dtype == torch.float64
        assert relative(both.embeds[b], alone.embeds[0]) <= 1e-5
        assert both.activations[name][b].shape == (len(s), 64)
        assert relative(both.activations[name][b], alone.activations[name][0]) <= 1e-6
        assert both.activations["blocks.2.attn.hook_pattern"][b].shape == (4, len(s), len(s))
    # A token after the read position takes no gradient. One of duration 0 at fixed times takes the right-sided
    # derivative of its weight d exp(s) alone (tests/unit/test_right_sided.py): the gradient just above 0.
    s = items[0]
    fixed = Signal.from_ids(s.token_ids, torch.where(torch.arange(N) == 2, 0.0, s.durations), times=s.times)
    early = lm.gradients(fixed, log_p, positions=4)
    above = lm.gradients(fixed.with_durations(torch.where(torch.arange(N) == 2, 1e-9, fixed.durations)), log_p, positions=4)
    assert float(early.durations[0][5:].abs().max()) == 0.0
    assert float(early.durations[0][2]) != 0.0 and torch.allclose(early.durations[0], above.durations[0], rtol=1e-4)
    assert float(early.durations[0][:2].abs().min()) > 0


NAMES = [
    "blocks.1.hook_resid_post",
    "blocks.0.attn.hook_z",
    "blocks.1.attn.hook_q",
    "blocks.1.attn.hook_rot_k",
    "blocks.2.attn.hook_pattern",
    "blocks.0.attn.hook_result",
    "blocks.1.ln2.hook_scale",
    "blocks.2.mlp.hook_pre_linear",
    "hook_embed",
]


@pytest.mark.parametrize("family", ["qwen2", "phi3", "gpt_neox"])
def test_activation_gradients_equal_central_differences(family: str) -> None:
    # Moving an activation along u moves the read-out by <gradient, u>: views (z, q), values computed beside
    # a module (result, scale), the attention function's own (rot_k, pattern), fused projections (phi3, gpt_neox).
    lm = ContinuousLM(tiny_model64(family))
    s = Signal.from_ids(prompt(N, 7), random_durations(N, 7))
    names = [n for n in NAMES if n in lm.run_with_cache(s, names=lambda n: True, positions="last").names]
    grads = lm.gradients(s, log_p, wrt=names)
    assert "blocks.2.mlp.hook_pre_linear" in names or family == "gpt_neox"
    for k, name in enumerate(names):
        g = grads.activations[name][0].double()
        # A direction half along the gradient, half random: the read-out moves measurably along it.
        r = torch.randn(g.shape, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
        u = g / g.norm() + r / r.norm()
        u /= u.norm()

        def along(step: float, u: torch.Tensor = u, name: str = name) -> torch.Tensor:
            values = [
                stock_values(lm, [s], log_p, [(name, lambda h, hook, k=k: h + k * step * u.to(h.dtype)[None])])
                for k in (1.0, -1.0)
            ]
            return (values[0] - values[1])[0] / (2 * step)

        fd = float(extrapolated(along, H_STATE))
        ad = float((g * u).sum())
        assert abs(fd - ad) <= 1e-3 * abs(ad), name


def test_backward_hooks_see_the_gradients_lm_gradients_reports() -> None:
    lm = ContinuousLM(tiny_model64("llama"))
    s = Signal.from_ids(prompt(N, 9), random_durations(N, 9))
    name = "blocks.0.attn.hook_z"
    seen = []
    logits = lm.run_with_hooks(s, bwd_hooks=[(name, lambda g, hook: seen.append(g))])
    log_p(logits).backward()
    want = lm.gradients(s, log_p, wrt=name).activations[name][0]
    assert seen[0].shape == (1, N, 4, 16)
    assert relative(seen[0][0], want) <= 1e-6


def test_evaluation_keeps_no_graph_and_bad_requests_are_signal_errors() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    s = Signal.from_ids(prompt(N, 1))
    assert not lm.logits(s).requires_grad and not lm.run_with_hooks(s).requires_grad
    assert lm.run_with_hooks(s, grad=True).requires_grad
    with pytest.raises(SignalError, match="one value per signal"):
        lm.gradients(s, lambda logits: logits.sum())
    with pytest.raises(SignalError, match="not \"all\""):
        lm.gradients(s, log_p, positions="all")
    with pytest.raises(SignalError, match="nothing to differentiate"):
        lm.gradients(s, log_p, wrt=[])
    assert all(p.requires_grad and p.grad is None for p in lm.model.parameters())


def test_a_bfloat16_model_takes_gradients_through_its_float32_state() -> None:
    import copy

    model = tiny_model("llama", "sdpa")
    half, full = ContinuousLM(copy.deepcopy(model).to(torch.bfloat16)), ContinuousLM(model)
    s = Signal.from_ids(prompt(N, 1), random_durations(N, 1))
    wrt = ["durations", "embeds", "blocks.1.attn.hook_pattern"]
    got, want = half.gradients(s, log_p, wrt=wrt), full.gradients(s, log_p, wrt=wrt)

    def norm_error(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    # bfloat16 matmuls: the gradients follow the float32 model's to bfloat16 rounding, not beyond it.
    assert norm_error(got.durations[0], want.durations[0]) <= 0.2
    assert norm_error(got.embeds[0], want.embeds[0]) <= 0.2
    name = "blocks.1.attn.hook_pattern"
    assert norm_error(got.activations[name][0], want.activations[name][0]) <= 0.2
    assert all(p.dtype == torch.bfloat16 and p.requires_grad and p.grad is None for p in half.model.parameters())
    assert half.model.config._attn_implementation == "sdpa"


def test_durations_reach_a_rotary_table_computed_without_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    # Some transformers releases build the rotary table under no_grad: the times' share of a duration's
    # gradient then goes through contllm's recomputation of the table (contllm.core.forward.rotary_gradients).
    import contextlib

    from contllm.core import forward as module
    from contllm.core.families import rotary_module

    lm = ContinuousLM(tiny_model64("gemma3"))  # one table per layer type
    s = Signal.from_ids(prompt(N, 3), random_durations(N, 3))
    want = lm.gradients(s, log_p).durations[0]
    rotary = type(rotary_module(lm))
    monkeypatch.setattr(rotary, "forward", torch.no_grad()(rotary.forward))
    assert relative(lm.gradients(s, log_p).durations[0], want) <= 1e-9
    monkeypatch.setattr(module, "rotary_gradients", lambda lm: contextlib.nullcontext())
    assert relative(lm.gradients(s, log_p).durations[0], want) > 1e-2  # the times matter
