"""Hook functions (contllm.internals.intervention, lm.run_with_hooks): edits equal their computation by hand, nothing outlives a call."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.families import attention_outputs, decoder_layers, final_norm
from contllm.errors import SignalError, UnsupportedModelError
from contllm.internals.activations import Patch, patch, run_with_cache
from contllm.internals.hooked_attention import _SITES as SITES
from contllm.internals.hooked_attention import IMPLEMENTATION
from contllm.internals.hookpoints import hook_names
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

N = 9


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def hooks_on(model: torch.nn.Module) -> set[tuple[str, int]]:
    """Every forward hook and pre-hook on ``model``, by module name and handle id."""
    return {
        (name, key)
        for name, module in model.named_modules()
        for key in [*module._forward_hooks, *(-1 - k for k in module._forward_pre_hooks)]
    }


def signals() -> list[Signal]:
    return [Signal.from_ids(prompt(N, 1), random_durations(N, 1)), Signal.from_ids(prompt(6, 2), random_durations(6, 2))]


def head_weight(lm: ContinuousLM, layer: int, head: int, head_dim: int) -> torch.Tensor:
    """The block of layer ``layer``'s output projection that head ``head`` writes through: [head_dim, hidden]."""
    projection = attention_outputs(lm)[layer]
    weight = projection.weight.detach()
    weight = weight.T if isinstance(projection, torch.nn.Linear) else weight  # [in, out]
    return weight[head * head_dim : (head + 1) * head_dim]


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi", "gpt_neox", "gpt2"])
def test_zero_ablating_one_head_equals_removing_its_write_by_hand(family: str) -> None:
    # float64: the paths below sum the same numbers in different orders (logits come back in float32).
    lm = ContinuousLM(tiny_model64(family))
    items, layer, head = signals(), 1, 2
    z_name, out_name = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.hook_attn_out"

    def zero_z(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = 0
        return z

    ablated = lm.run_with_hooks(items, fwd_hooks=[(z_name, zero_z)], positions="all")
    # The same ablation at the head's result and at its attention pattern.
    by_result = lm.run_with_hooks(items, fwd_hooks=[(("result", layer), zero_z)], positions="all")

    def zero_pattern(p: torch.Tensor, hook) -> torch.Tensor:
        p = p.clone()
        p[:, head] = 0
        return p

    by_pattern = lm.run_with_hooks(items, fwd_hooks=[(("pattern", layer), zero_pattern)], positions="all")
    # By hand: the head's write is z_h W_O[h]; subtract it from the attention output (before Gemma's post-norm).
    cache = run_with_cache(lm, items, names=[z_name])
    head_dim = cache.rows(z_name)[0].shape[-1]
    w = head_weight(lm, layer, head, head_dim).double()
    plain = lm.run_with_hooks(items, positions="all")
    for b in range(len(items)):
        assert max_diff(by_result[b], ablated[b]) <= 1e-5
        assert max_diff(by_pattern[b], ablated[b]) <= 1e-5
        assert max_diff(ablated[b], plain[b]) > 1e-3  # the head matters

    norm = lm.family.attention_out_norm
    attention = decoder_layers(lm)[layer]
    post = getattr(attention, norm) if norm else None
    pre_norm = []

    def record_pre_norm(module, args, kwargs, output):
        pre_norm.append(output[0] if isinstance(output, tuple) else output)

    module = getattr(attention, lm.family.attention)
    handle = module.register_forward_hook(record_pre_norm, with_kwargs=True)
    try:
        run_with_cache(lm, items, names=[out_name])
    finally:
        handle.remove()
    values = []
    for b, s in enumerate(items):
        pad = int(pre_norm[0].shape[1] - len(s))
        raw = pre_norm[0][b, pad:].double() - cache.rows(z_name)[b][:, head].double() @ w
        with torch.no_grad():
            values.append(post(raw.to(torch.float64)) if post is not None else raw)
    with patch(lm, items, Patch(out_name, [list(range(len(s))) for s in items], values)):
        by_hand = run_with_cache(lm, items, names=[out_name])
    for b in range(len(items)):
        assert max_diff(by_hand.logits[b], ablated[b]) <= 1e-5


def test_mean_ablation_and_a_steering_vector_change_logits_as_computed_by_hand() -> None:
    lm = ContinuousLM(tiny_model64("qwen2"))
    items, layer, head = signals(), 0, 1
    z_name = f"blocks.{layer}.attn.hook_z"
    cache = run_with_cache(lm, items, names=[z_name, f"blocks.{layer}.hook_attn_out"])

    def mean_ablate(z: torch.Tensor, hook) -> torch.Tensor:
        # The head's mean over the batch's real tokens (padding excluded), at every position.
        z = z.clone()
        real = hook.real.to(z.device)
        mean = z[:, :, head][real].mean(0)
        z[:, :, head] = mean
        return z

    ablated = lm.run_with_hooks(items, fwd_hooks=[(z_name, mean_ablate)], positions="all")
    every = torch.cat([r[:, head] for r in cache.rows(z_name)]).mean(0)
    w = head_weight(lm, layer, head, every.shape[-1]).double()
    moved = [r.double() + (every.double() - z[:, head].double()) @ w for r, z in zip(cache.rows(f"blocks.{layer}.hook_attn_out"), cache.rows(z_name))]
    with patch(lm, items, Patch(f"blocks.{layer}.hook_attn_out", [list(range(len(s))) for s in items], moved)):
        by_hand = run_with_cache(lm, items, names=z_name)
    for b in range(len(items)):
        assert max_diff(ablated[b], by_hand.logits[b]) <= 1e-5  # the cache rounds values to float32
        assert max_diff(ablated[b], cache.logits[b]) > 1e-3
    # A steering vector added to the last residual stream: logits = head(final norm(resid + v)) by hand.
    last = f"blocks.{len(decoder_layers(lm)) - 1}.hook_resid_post"
    v = torch.randn(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    steered = lm.run_with_hooks(items, fwd_hooks=[(last, lambda h, hook: h + 0.7 * v)], positions="all")
    resid = run_with_cache(lm, items, names=last)
    with torch.no_grad():
        for b in range(len(items)):
            want = lm.model.get_output_embeddings()(final_norm(lm)(resid.rows(last)[b].double() + 0.7 * v))
            assert max_diff(steered[b], want) <= 1e-5
            assert max_diff(steered[b], resid.logits[b]) > 1e-2
    # In the middle of the model the hook equals a Patch that adds the same vector.
    middle = "blocks.1.hook_resid_mid"
    hooked = lm.run_with_hooks(items, fwd_hooks=[(middle, lambda h, hook: h + v)], positions="all")
    with patch(lm, items, Patch(middle, [list(range(len(s))) for s in items], [v.expand(len(s), -1) for s in items], mode="add")):
        added = run_with_cache(lm, items, names=middle)
    for b in range(len(items)):
        assert max_diff(hooked[b], added.logits[b]) <= 1e-5


def test_removing_the_duration_bias_gives_the_unit_duration_run_at_the_same_times() -> None:
    # The bias is where durations enter besides the times: zero it where keys are visible and
    # the forward is the one of unit durations at the very same times.
    lm = ContinuousLM(tiny_model("llama"))
    durations = random_durations(N, 3)
    shrunk = Signal.from_ids(prompt(N, 3), durations)
    unit = Signal.from_ids(prompt(N, 3), torch.ones(N, dtype=torch.float64), times=shrunk.times)
    seen = []

    def unbiased(bias: torch.Tensor, hook) -> torch.Tensor:
        seen.append((hook.name, hook.layer, hook.durations.clone(), hook.times.clone()))
        return torch.where(bias > -1e30, torch.zeros_like(bias), bias)

    got = lm.run_with_hooks(shrunk, fwd_hooks=[(lambda n: n.endswith("hook_duration_bias"), unbiased)], positions="all")
    assert max_diff(got, lm.logits(unit, positions="all")) <= 1e-5
    assert max_diff(got, lm.logits(shrunk, positions="all")) > 1e-3
    assert [s[:2] for s in seen] == [(f"blocks.{i}.attn.hook_duration_bias", i) for i in range(3)]
    assert torch.equal(seen[0][2][0], durations) and torch.equal(seen[0][3][0], shrunk.times)


@pytest.mark.parametrize("family,impl", [(f, b) for f in FAMILY_NAMES for b in backends(f)])
def test_hooks_never_outlive_a_call_even_when_one_raises(family: str, impl: str) -> None:
    lm = ContinuousLM(tiny_model(family, impl))
    items = signals()
    before, base = hooks_on(lm.model), lm.logits(items)

    def boom(x: torch.Tensor, hook) -> None:
        if hook.name.endswith("hook_pattern"):
            raise RuntimeError("inside a hook")

    every = hook_names(lm)
    with pytest.raises(RuntimeError, match="inside a hook"):
        lm.run_with_hooks(items, fwd_hooks=[(every, boom)])
    assert hooks_on(lm.model) == before
    assert lm.model.config._attn_implementation == impl and not list(SITES.keys())
    # A hook returning a tensor of the wrong shape, and a body that raises inside lm.hooks.
    with pytest.raises(SignalError, match="returned"):
        lm.run_with_hooks(items, fwd_hooks=[("blocks.0.attn.hook_q", lambda x, h: x[:, :2])])
    with pytest.raises(KeyError):
        with lm.hooks(items, [(("duration_bias", 0), lambda x, h: None)]):
            assert lm.model.config._attn_implementation == IMPLEMENTATION
            raise KeyError("body")
    assert hooks_on(lm.model) == before and lm.model.config._attn_implementation == impl
    assert torch.equal(lm.logits(items), base)
    # Backward hooks are attached to the graph, not the model: after a backward nothing is left.
    grads = []
    logits = lm.run_with_hooks(items, bwd_hooks=[("blocks.1.hook_resid_pre", lambda g, h: grads.append(g))])
    assert hooks_on(lm.model) == before
    logits[:, 3].sum().backward()
    assert len(grads) == 1 and grads[0].shape == (2, N, 64)
    assert all(p.grad is None and p.requires_grad for p in lm.model.parameters())


def test_a_forward_of_other_signals_inside_the_context_is_refused() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    with pytest.raises(SignalError, match=r"made for other signals \(2 signals there, 1 here\)"):
        with lm.hooks(signals(), [("blocks.0.hook_resid_pre", lambda x, h: None)]):
            lm.run_with_cache(Signal.from_ids(prompt(5, 1)), names="blocks.0.hook_resid_post")
    # A forward that no context announces (the stock model called directly) is held to the context's shape.
    inputs = lm.forward_kwargs(Signal.from_ids(prompt(5, 1)))
    with pytest.raises(SignalError, match="hooks were made for 2 signals padded to 9 tokens"):
        with lm.hooks(signals(), [("blocks.0.hook_resid_pre", lambda x, h: None)]), inputs.context(), torch.no_grad():
            lm.model(**inputs)
    with pytest.raises(UnsupportedModelError, match="never reached blocks.0.attn.hook_q"):
        # Hooks inside the context made for other signals are not the call's: only the shape check guards them.
        with lm.hooks(signals(), [("blocks.0.attn.hook_q", lambda x, h: None)]) as state:
            state.check_reached()


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi", "gpt2"])
def test_a_duration_enters_only_through_the_bias_and_the_times(family: str) -> None:
    # The short run with the plain run's times and every head's duration bias put back to the plain
    # run's is the plain run: nothing else of the durations reaches the model.
    lm = ContinuousLM(tiny_model64(family))
    ids = prompt(N, 4)
    durations = random_durations(N, 4)
    plain = Signal.from_ids(ids, durations)
    scaled = [2, 3, 4]
    short = plain.scale_tokens(scaled, 0.5)

    def restore(bias: torch.Tensor, hook) -> torch.Tensor:
        bias = bias.clone()
        keys = bias[..., scaled]
        bias[..., scaled] = torch.where(keys > -1e30, keys + torch.log(torch.tensor(2.0, dtype=bias.dtype)), keys)
        return bias

    both = lm.run_with_hooks(short.with_times(plain.times), fwd_hooks=[(lambda n: n.endswith("hook_duration_bias"), restore)], positions="all")
    assert max_diff(both, lm.run_with_hooks(plain, positions="all")) <= 1e-5
    assert max_diff(lm.logits(short.with_times(plain.times), positions="all"), both) > 1e-3  # the bias matters
    assert max_diff(lm.run_with_hooks(short, fwd_hooks=[(lambda n: n.endswith("hook_duration_bias"), restore)], positions="all"), both) > 1e-3
