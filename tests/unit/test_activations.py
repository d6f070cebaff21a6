"""Named activations (contllm.internals.activations): reads equal the stock model's, patches are exact and scoped."""

from __future__ import annotations

import copy

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.families import attention_modules, decoder_layers, final_norm, mlp_modules
from contllm.errors import SignalError
from contllm.internals.activations import (
    Patch,
    activation_names,
    align_positions,
    patch,
    run_with_cache,
)
from contllm.internals.hookpoints import point
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

CASES = [(f, b) for f in FAMILY_NAMES for b in backends(f)]
N = 10  # longer than the tiny window (4), so sliding layers really slide


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    # Hidden keys hold the dtype's minimum (float64's is -inf in a float32 cache): compare them as equal.
    return float((a.float().clamp_min(-1e30) - b.float().clamp_min(-1e30)).abs().max())


def hooks(model: torch.nn.Module) -> set[tuple[str, int]]:
    """Every forward hook and pre-hook on ``model``, by module name and handle id.

    Compared before and after rather than asserted empty: transformers' own
    ``output_hidden_states`` leaves output-capturing hooks on a model it has served.
    """
    return {
        (name, key)
        for name, module in model.named_modules()
        for key in [*module._forward_hooks, *(-1 - k for k in module._forward_pre_hooks)]
    }


def residual_names(layers: int) -> list[str]:
    return [f"blocks.{i}.hook_resid_{p}" for i in range(layers) for p in ("pre", "post")] + ["ln_final.hook_out"]


@pytest.mark.parametrize("family,impl", CASES)
def test_unit_durations_equal_stock_hidden_states_and_attentions(family: str, impl: str) -> None:
    lm = ContinuousLM(tiny_model(family, impl))
    layers = len(decoder_layers(lm))
    ids = prompt(N, 1)
    with torch.no_grad():
        # On copies: transformers leaves its output recorders on a model it served this way, and the
        # tiny models are shared with every other test module (test_depth asserts hook-free stacks).
        stock = copy.deepcopy(lm.model)(ids[None], output_hidden_states=True)
        eager = copy.deepcopy(tiny_model(family, "eager"))(ids[None], output_attentions=True)
    before = hooks(lm.model)
    # Residual points run the model's own backend; patterns run eager whatever it was loaded with.
    cache = lm.run_with_cache(Signal.from_ids(ids), names=residual_names(layers))
    hidden = stock.hidden_states  # embeddings, the output of each layer but the last, the final norm's output
    assert len(hidden) == layers + 1
    for i in range(layers):
        assert max_diff(cache[f"blocks.{i}.hook_resid_pre"][0], hidden[i][0]) <= 1e-5
    for i in range(layers - 1):
        assert max_diff(cache[f"blocks.{i}.hook_resid_post"][0], hidden[i + 1][0]) <= 1e-5
    assert max_diff(cache["ln_final.hook_out"][0], hidden[layers][0]) <= 1e-5
    assert max_diff(cache.logits[0], stock.logits[0]) <= 1e-5
    patterns = run_with_cache(lm, Signal.from_ids(ids), names=[f"blocks.{i}.attn.hook_pattern" for i in range(layers)])
    for i in range(layers):
        got = patterns[f"blocks.{i}.attn.hook_pattern"][0]
        assert got.shape == eager.attentions[i][0].shape
        assert max_diff(got, eager.attentions[i][0]) <= 1e-5
    assert torch.equal(cache.times[0], torch.arange(N, dtype=torch.float64))
    # The model is as it was: no hook left, its own attention back.
    assert lm.model.config._attn_implementation == impl
    assert hooks(lm.model) == before


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_attention_and_mlp_outputs_are_the_family_table_modules(family: str) -> None:
    lm = ContinuousLM(tiny_model(family, "eager"))
    ids = prompt(N, 2)
    seen: dict[str, torch.Tensor] = {}
    # What each sub-block adds to the residual stream: after Gemma 2 and 3's output norms.
    table, layer = lm.family, decoder_layers(lm)[1]
    attn = getattr(layer, table.attention_out_norm) if table.attention_out_norm else attention_modules(lm)[1]
    mlp = getattr(layer, table.mlp_out_norm) if table.mlp_out_norm else mlp_modules(lm)[1]
    handles = [
        attn.register_forward_hook(lambda m, a, o: seen.__setitem__("attn", o[0] if isinstance(o, tuple) else o)),
        mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", o)),
        final_norm(lm).register_forward_hook(lambda m, a, o: seen.__setitem__("norm", o)),
    ]
    try:
        with torch.no_grad():
            lm.model(ids[None])
    finally:
        for h in handles:
            h.remove()
    cache = run_with_cache(lm, Signal.from_ids(ids), names=["blocks.1.hook_attn_out", "blocks.1.hook_mlp_out"])
    assert max_diff(cache["blocks.1.hook_attn_out"][0], seen["attn"][0]) <= 1e-5
    assert max_diff(cache["blocks.1.hook_mlp_out"][0], seen["mlp"][0]) <= 1e-5
    assert cache.names == ["blocks.1.hook_attn_out", "blocks.1.hook_mlp_out"]  # only what was asked


@pytest.mark.parametrize("family,impl", [("llama", "sdpa"), ("gemma2", "eager"), ("qwen2", "eager"), ("gpt2", "sdpa")])
def test_padded_batch_with_durations_equals_single_runs(family: str, impl: str) -> None:
    # float64: a batch and its rows sum in different orders, which float32 residuals (norms
    # near 20 on these models) show at 1e-5; see tiny_model64. The cache is float32 either way.
    lm = ContinuousLM(tiny_model64(family, impl))
    signals = [Signal.from_ids(prompt(n, 20 + n), random_durations(n, 20 + n)) for n in (5, N, 7)]
    names = ["hook_embed", "blocks.0.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.2.hook_attn_out",
             "blocks.2.hook_mlp_out", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_duration_bias",
             "blocks.0.attn.hook_q", "blocks.0.attn.hook_z", "blocks.2.attn.hook_result", "blocks.1.mlp.hook_post",
             "blocks.1.ln1.hook_scale", "ln_final.hook_normalized", "ln_final.hook_out"]
    batched = run_with_cache(lm, signals, names=names)
    for b, s in enumerate(signals):
        alone = run_with_cache(lm, s, names=names)
        for name in names:
            assert batched.rows(name)[b].shape == alone.rows(name)[0].shape
            assert max_diff(batched.rows(name)[b], alone.rows(name)[0]) <= 1e-5, name
        assert torch.equal(batched.times[b], s.times)
        # A padded key gets no probability: each query's row over the signal's own keys sums to 1.
        pattern = batched.rows("blocks.1.attn.hook_pattern")[b]
        assert pattern.shape == (4, len(s), len(s))
        assert max_diff(pattern.sum(-1), torch.ones(4, len(s))) <= 1e-5
    # Selected positions are the same rows of the full read, with their times.
    picked = run_with_cache(lm, signals, names=["blocks.1.hook_resid_post"], positions=[0, -1])
    assert picked["blocks.1.hook_resid_post"].shape == (3, 2, 64)
    for b, s in enumerate(signals):
        full = batched.rows("blocks.1.hook_resid_post")[b]
        assert max_diff(picked.rows("blocks.1.hook_resid_post")[b], full[[0, len(s) - 1]]) <= 1e-5
        assert picked.positions[b] == [0, len(s) - 1]
        assert torch.equal(picked.times[b], s.times[[0, len(s) - 1]])


def test_pattern_follows_the_log_duration_bias() -> None:
    # Doubling one key's duration doubles its unnormalised weight for every later query.
    lm = ContinuousLM(tiny_model("llama", "eager"))
    ids = prompt(6, 3)
    ones = torch.ones(6, dtype=torch.float64)
    doubled = ones.clone()
    doubled[2] = 2.0
    name = "blocks.0.attn.hook_pattern"
    # Times kept at 0..5 so that the rotary positions (and the scores) do not move.
    times = torch.arange(6, dtype=torch.float64)
    base = run_with_cache(lm, Signal.from_ids(ids, ones, times=times), names=name, positions="last")[name][0, :, 0]
    two = run_with_cache(lm, Signal.from_ids(ids, doubled, times=times), names=name, positions="last")[name][0, :, 0]
    ratio = (two / two[:, [0]]) / (base / base[:, [0]])
    assert max_diff(ratio[:, 2], torch.full((4,), 2.0)) <= 1e-4
    assert max_diff(ratio[:, [0, 1, 3, 4, 5]], torch.ones(4, 5)) <= 1e-4


SCALED = ("llama", "gemma3", "gpt2")


@pytest.mark.parametrize("family", SCALED)
def test_patching_a_run_with_its_own_activations_changes_nothing(family: str) -> None:
    # Exact: the values written are the very values the forward computes there (same batch,
    # same kernels, float32 model and float32 cache), so every later operation sees the same bits.
    lm = ContinuousLM(tiny_model(family, "eager"))
    signals = [Signal.from_ids(prompt(n, 30 + n), random_durations(n, 30 + n)) for n in (6, N)]
    names = [n for n in activation_names(lm) if point(lm, n).axis == "pos"]
    base = run_with_cache(lm, signals, names=names)
    every = [list(range(len(s))) for s in signals]
    patches = [Patch(name, every, base.rows(name)) for name in names]
    with patch(lm, signals, patches):
        again = run_with_cache(lm, signals, names=names)
    for b in range(len(signals)):
        assert torch.equal(torch.softmax(again.logits[b], -1), torch.softmax(base.logits[b], -1))
        for name in names:
            assert torch.equal(again.rows(name)[b], base.rows(name)[b]), name


@pytest.mark.parametrize("family", SCALED)
def test_patching_the_last_residual_with_the_unit_run_gives_its_output(family: str) -> None:
    lm = ContinuousLM(tiny_model(family, "eager"))
    ids = prompt(N, 4)
    scaled = torch.ones(N, dtype=torch.float64)
    scaled[3:6] = 0.4  # three tokens shrunk to c = 0.4
    unit, shrunk = Signal.from_ids(ids), Signal.from_ids(ids, scaled)
    name = f"blocks.{len(decoder_layers(lm)) - 1}.hook_resid_post"
    reference = run_with_cache(lm, unit, names=name)
    before = run_with_cache(lm, shrunk, names=name)
    assert max_diff(before.logits[0], reference.logits[0]) > 1e-2  # the edit matters
    with patch(lm, shrunk, Patch(name, range(N), reference[name][0])):
        after = run_with_cache(lm, shrunk, names=name)
    assert max_diff(after.logits[0], reference.logits[0]) <= 1e-6
    # Adding the difference instead of replacing lands on the same output.
    with patch(lm, shrunk, Patch(name, range(N), reference[name][0] - before[name][0], mode="add")):
        added = run_with_cache(lm, shrunk, names=name)
    assert max_diff(added.logits[0], reference.logits[0]) <= 1e-5


def test_patch_at_one_position_moves_only_later_times() -> None:
    lm = ContinuousLM(tiny_model("llama", "eager"))
    signal = Signal.from_ids(prompt(N, 5), random_durations(N, 5))
    name = "blocks.0.hook_mlp_out"
    base = run_with_cache(lm, signal, names=name)
    with patch(lm, signal, Patch(name, [4], torch.zeros(1, 64))):
        after = run_with_cache(lm, signal, names=name)
    assert torch.equal(after.logits[0][:4], base.logits[0][:4])
    assert max_diff(after.logits[0][4:], base.logits[0][4:]) > 1e-3


def test_hooks_are_removed_after_an_exception_inside_the_patch() -> None:
    lm = ContinuousLM(tiny_model("qwen2", "eager"))
    signal = Signal.from_ids(prompt(N, 6))
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_attn_out", "blocks.2.hook_resid_post",
             "ln_final.hook_out"]
    base = run_with_cache(lm, signal, names=names)
    before = hooks(lm.model)
    patches = [Patch(name, range(N), torch.zeros(N, 64)) for name in names]
    with pytest.raises(RuntimeError, match="inside"):
        with patch(lm, signal, patches):
            assert len(hooks(lm.model) - before) == len(names)
            raise RuntimeError("inside")
    assert hooks(lm.model) == before
    assert torch.equal(run_with_cache(lm, signal, names=names).logits[0], base.logits[0])
    # A forward of another batch inside the patch is refused, and the hooks still go.
    with pytest.raises(SignalError, match=r"made for other signals \(signal 0 has 10 tokens there, 12 here\)"):
        with patch(lm, signal, patches[:1]):
            run_with_cache(lm, Signal.from_ids(prompt(N + 2, 7)), names=names[:1])
    assert hooks(lm.model) == before


def test_patch_registers_nothing_before_it_is_entered() -> None:
    lm = ContinuousLM(tiny_model("llama", "eager"))
    signal = Signal.from_ids(prompt(N, 8))
    before = hooks(lm.model)
    scope = patch(lm, signal, Patch("blocks.0.hook_resid_post", [0], torch.zeros(1, 64)))
    assert hooks(lm.model) == before
    with scope:
        assert len(hooks(lm.model) - before) == 1
    assert hooks(lm.model) == before


def test_align_positions_takes_the_nearest_earlier_time() -> None:
    # source: 4 tokens at times 0, 1, 2, 3; target: a token split in two halves and one at 2.5.
    source = Signal.from_ids(torch.tensor([5, 6, 7, 8]))
    target = Signal.from_ids(torch.tensor([5, 6, 6, 9, 8]), times=torch.tensor([0.0, 0.5, 1.0, 2.5, 3.0]))
    assert align_positions(source, target) == [0, 0, 1, 2, 3]
    assert align_positions(source, target, positions=[-1, 3]) == [3, 2]
    # Shared times: the last source token at that time; before every source time: token 0.
    shared = Signal.from_ids(torch.tensor([5, 6, 7]), times=torch.tensor([1.0, 1.0, 2.0]))
    assert align_positions(shared, Signal.from_ids(torch.tensor([1, 2]), times=torch.tensor([0.5, 1.0]))) == [0, 1]
    # Patching a shorter signal from a longer one through the alignment reproduces the row it copies.
    lm = ContinuousLM(tiny_model("llama", "eager"))
    name = "blocks.2.hook_resid_post"
    long_run = run_with_cache(lm, source, names=name)
    picked = long_run[name][0][align_positions(source, target)]
    with patch(lm, target, Patch(name, range(len(target)), picked)):
        patched = run_with_cache(lm, target, names=name)
    assert max_diff(patched[name][0], picked) == 0.0
    assert max_diff(patched.logits[0][-1], long_run.logits[0][-1]) <= 1e-6


def test_bad_names_positions_and_values_are_signal_errors() -> None:
    lm = ContinuousLM(tiny_model("llama", "eager"))
    signal = Signal.from_ids(prompt(N, 9))
    before = hooks(lm.model)
    with pytest.raises(SignalError, match=r"no activation named 'blocks.7.hook_resid_post'.*0\.\.2.*ln_final"):
        run_with_cache(lm, signal, names="blocks.7.hook_resid_post")
    with pytest.raises(SignalError, match="unknown short activation name 'resid'"):
        run_with_cache(lm, signal, names=["resid"])
    with pytest.raises(SignalError, match="position 10 is outside a signal of 10 tokens"):
        run_with_cache(lm, signal, names="blocks.0.hook_resid_pre", positions=[10])
    cache = run_with_cache(lm, signal, names="blocks.0.hook_resid_pre", positions="last")
    with pytest.raises(SignalError, match="was not cached; this cache holds blocks.0.hook_resid_pre"):
        cache["blocks.1.hook_resid_pre"]
    with pytest.raises(SignalError, match="edit patterns, scores and duration biases with a hook function"):
        with patch(lm, signal, Patch("blocks.0.attn.hook_pattern", [0], torch.zeros(1, 64))):
            pass
    with pytest.raises(SignalError, match=r"values must be \[2, 64\]"):
        with patch(lm, signal, Patch("blocks.0.hook_mlp_out", [0, 1], torch.zeros(3, 64))):
            pass
    assert hooks(lm.model) == before
    assert len(activation_names(lm)) == 1 + 3 * 22 + 3  # embeddings, 22 points per layer, the final norm


def test_patterns_of_a_bfloat16_sdpa_model_run_eager_inside_its_float32_state() -> None:
    # The half-precision state wraps the eager function here, so the patterns exist and
    # the fully masked padding rows stay finite.
    model = tiny_model("llama", "sdpa")
    half = ContinuousLM(copy.deepcopy(model).to(torch.bfloat16))
    signals = [Signal.from_ids(prompt(n, 40 + n), random_durations(n, 40 + n)) for n in (5, 9)]
    name = "blocks.1.attn.hook_pattern"
    got = run_with_cache(half, signals, names=name)
    want = run_with_cache(ContinuousLM(model), signals, names=name)
    for b in range(len(signals)):
        assert torch.isfinite(got.rows(name)[b]).all()
        assert max_diff(got.rows(name)[b], want.rows(name)[b]) <= 0.05  # bfloat16 matmuls
    assert half.model.config._attn_implementation == "sdpa" and half.attn_implementation == "sdpa"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_head_outputs_through_the_output_projection_give_the_attention_output(family: str) -> None:
    from contllm.core.families import attention_outputs

    lm = ContinuousLM(tiny_model(family, "eager"))
    signal = Signal.from_ids(prompt(N, 6), random_durations(N, 6))
    layers = len(decoder_layers(lm))
    names = [f"blocks.{i}.{p}" for i in range(layers) for p in ("attn.hook_z", "hook_attn_out")]
    cache = run_with_cache(lm, signal, names=names)
    for i, projection in enumerate(attention_outputs(lm)):
        z = cache[f"blocks.{i}.attn.hook_z"][0]
        assert z.shape[0] == N
        layer = decoder_layers(lm)[i]
        post = getattr(layer, lm.family.attention_out_norm) if lm.family.attention_out_norm else torch.nn.Identity()
        with torch.no_grad():
            assert max_diff(post(projection(z.flatten(1))), cache[f"blocks.{i}.hook_attn_out"][0]) <= 1e-5
