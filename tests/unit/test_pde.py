"""Attention dynamics over pseudo-time: the row schemes, and the scoped patch on tiny random models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from contllm import ContinuousLM, ContllmError, Signal
from contllm.internals.hooks import cache_keyword
from contllm.pde import (
    AttentionRecorder,
    Dynamics,
    DynamicsError,
    causal_smoothing,
    compare_fits,
    fit_exponential,
    fit_power_law,
    pde_attention,
    perplexity,
)
from contllm.pde.dynamics import chain_operator
from contllm.pde.hidden import smoothing_matrix
from tests.unit.tiny import FAMILY_NAMES, prompt, tiny_model

pytestmark = pytest.mark.unit

F64 = torch.float64


# ---------------------------------------------------------------------------- rows


def random_rows(seed: int = 0, keys: int = 24, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax rows [rows, keys] with supports of each kind: causal prefix, window, padding on the left, a gap."""
    g = torch.Generator().manual_seed(seed)
    support = torch.zeros(rows, keys, dtype=torch.bool)
    support[0, :keys] = True
    support[1, :9] = True  # causal prefix
    support[2, 5:17] = True  # a sliding window
    support[3, 4:] = True  # left padding
    support[4, ::3] = True  # zero-duration keys between visible ones
    support[5, 7:9] = True  # two keys
    logits = 3 * torch.randn(rows, keys, generator=g, dtype=F64)
    weights = torch.softmax(torch.where(support, logits, -torch.inf), dim=-1)
    return weights, support


def entropy(a: torch.Tensor) -> torch.Tensor:
    return -torch.where(a > 0, a * torch.log(a.clamp_min(1e-300)), 0.0).sum(-1)


@pytest.mark.parametrize("method", ["steps", "spectral"])
def test_diffusion_keeps_rows_valid_and_flattens_them_monotonically(method: str) -> None:
    weights, support = random_rows()
    previous = weights
    for T in (0.1, 0.4, 1.0, 2.0, 4.0, 16.0, 64.0):
        out = Dynamics("diffusion", T, method=method).apply(weights, support)
        assert torch.all((out.sum(-1) - 1).abs() <= 1e-6)
        assert torch.all(out >= 0)
        assert torch.all(out[~support] == 0)
        assert torch.all(out.max(-1).values <= previous.max(-1).values + 1e-12)
        assert torch.all(entropy(out) >= entropy(previous) - 1e-12)
        previous = out
    uniform = support / support.sum(-1, keepdim=True)
    far = Dynamics("diffusion", 1000.0, method=method).apply(weights, support)
    assert torch.allclose(far, uniform.to(F64), atol=1e-6, rtol=0)


def test_one_hot_interior_row_keeps_its_mean_and_spreads_with_variance_2k_tau() -> None:
    keys = 64
    a = torch.zeros(1, keys, dtype=F64)
    a[0, 30] = 1.0
    support = torch.ones(1, keys, dtype=torch.bool)
    j = torch.arange(keys, dtype=F64)
    for T in (0.1, 0.25, 0.6, 1.0, 3.3, 7.0):
        k = math.ceil(T / 0.25)
        # The explicit steps are exact to round-off; the spectral evaluation of the same steps
        # carries the cosine basis' round-off (1e-14 per entry), weighted by (j - 30)^2 <= 1000.
        for method, tolerance in (("steps", 1e-12), ("spectral", 1e-10)):
            out = Dynamics("diffusion", T, method=method).apply(a, support)[0]
            mean = float((out * j).sum())
            variance = float((out * (j - mean) ** 2).sum())
            assert mean == pytest.approx(30.0, abs=tolerance)
            assert variance == pytest.approx(2 * k * (T / k), abs=tolerance)


def test_k_steps_then_k_prime_steps_equal_k_plus_k_prime_steps() -> None:
    weights, support = random_rows(seed=1)
    for k, k2 in ((1, 1), (2, 5), (3, 40)):
        T, T2 = 0.25 * k, 0.25 * k2  # both take steps of tau = 0.25
        for method in ("steps", "spectral"):
            once = Dynamics("diffusion", T + T2, method=method).apply(weights, support)
            first = Dynamics("diffusion", T, method=method).apply(weights, support)
            twice = Dynamics("diffusion", T2, method=method).apply(first, support)
            assert torch.allclose(once, twice, atol=1e-13, rtol=0)


@pytest.mark.parametrize("kind", ["diffusion", "wave"])
def test_spectral_evaluation_equals_the_explicit_steps(kind: str) -> None:
    weights, support = random_rows(seed=2)
    for T in (0.3, 2.0, 9.0, 50.0):
        steps = Dynamics(kind, T, method="steps").apply(weights, support)
        spectral = Dynamics(kind, T, method="spectral").apply(weights, support)
        assert torch.allclose(steps, spectral, atol=1e-11, rtol=0)


def test_chain_operator_is_doubly_stochastic_and_symmetric() -> None:
    m = chain_operator("diffusion", 17, 12, 0.25)
    assert torch.all(m >= 0)
    assert torch.allclose(m.sum(0), torch.ones(17, dtype=F64), atol=1e-14)
    assert torch.allclose(m.sum(1), torch.ones(17, dtype=F64), atol=1e-12)
    assert torch.allclose(m, m.T, atol=1e-14)


def test_wave_keeps_mass_and_goes_negative() -> None:
    weights, support = random_rows(seed=3)
    out = Dynamics("wave", 6.0).apply(weights, support)
    assert torch.all((out.sum(-1) - 1).abs() <= 1e-12)
    assert torch.all(out[~support] == 0)
    assert float(out.min()) < -1e-3  # leapfrog does not keep the sign; the recorder reports it
    recorder = AttentionRecorder(1)
    recorder.add(0, out[None, None], support[None, None])
    assert recorder.layer_means()["negative_mass"][0] < 0


def test_reaction_diffusion_keeps_rows_on_the_simplex_and_sharpens_with_positive_rho() -> None:
    weights, support = random_rows(seed=4)
    plain = Dynamics("diffusion", 2.0).apply(weights, support)
    for rho in (-3.0, 1.0, 6.0):
        out = Dynamics("reaction", 2.0, rho=rho).apply(weights, support)
        assert torch.all((out.sum(-1) - 1).abs() <= 1e-12)
        assert torch.all(out >= 0)
        assert torch.all(out[~support] == 0)
    sharp = Dynamics("reaction", 2.0, rho=6.0).apply(weights, support)
    assert torch.all(entropy(sharp)[:5] < entropy(plain)[:5])
    assert torch.equal(Dynamics("reaction", 2.0, rho=0.0).apply(weights, support), Dynamics("diffusion", 2.0, method="steps").apply(weights, support))


def test_matched_temperature_gives_each_row_the_entropy_of_diffusion_without_reordering_it() -> None:
    weights, support = random_rows(seed=5)
    for T in (0.1, 1.0, 16.0, 256.0):
        matched = Dynamics("matched", T).apply(weights, support)
        diffused = Dynamics("diffusion", T).apply(weights, support)
        assert torch.allclose(entropy(matched), entropy(diffused), atol=1e-9, rtol=0)
        assert torch.all((matched.sum(-1) - 1).abs() <= 1e-12)
        assert torch.all(matched[~support] == 0)
        for r in range(weights.shape[0]):  # tempering keeps the order of the weights
            s = support[r]
            assert torch.equal(torch.argsort(weights[r, s], stable=True), torch.argsort(matched[r, s], stable=True))


def test_temperature_is_the_softmax_at_that_temperature() -> None:
    logits = torch.randn(3, 10, dtype=F64)
    support = torch.ones(3, 10, dtype=torch.bool)
    out = Dynamics("temperature", temperature=2.5).apply(torch.softmax(logits, -1), support)
    assert torch.allclose(out, torch.softmax(logits / 2.5, -1), atol=1e-14)


def test_cell_widths_set_the_spacing_and_unit_widths_are_the_token_scheme() -> None:
    weights, support = random_rows(seed=6)
    ones = torch.ones_like(weights)
    for T in (0.7, 12.0):
        assert torch.equal(Dynamics("diffusion", T).apply(weights, support, ones), Dynamics("diffusion", T).apply(weights, support))
    g = torch.Generator().manual_seed(0)
    widths = 0.5 + torch.rand(weights.shape, generator=g, dtype=F64)
    out = Dynamics("diffusion", 3.0).apply(weights, support, widths)
    assert torch.all((out.sum(-1) - 1).abs() <= 1e-12) and torch.all(out >= 0) and torch.all(out[~support] == 0)
    # The end state is a uniform density in time: each key's mass is proportional to its width.
    far = Dynamics("diffusion", 1000.0).apply(weights, support, widths)
    expected = torch.where(support, widths, 0.0) / torch.where(support, widths, 0.0).sum(-1, keepdim=True)
    assert torch.allclose(far, expected, atol=1e-6, rtol=0)
    # Spacing "index" ignores the widths.
    index = Dynamics("diffusion", 3.0, spacing="index").apply(weights, support, widths)
    assert torch.equal(index, Dynamics("diffusion", 3.0, spacing="index").apply(weights, support))


def test_rows_without_support_are_left_alone_and_identity_restricts_to_the_support() -> None:
    weights = torch.full((2, 5), 0.2, dtype=F64)
    support = torch.tensor([[False] * 5, [True, True, False, False, False]])
    out = Dynamics("diffusion", 1.0).apply(weights, support)
    assert torch.equal(out[0], weights[0])
    assert out[1, 2:].eq(0).all() and out[1, :2].sum() == pytest.approx(0.4)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"kind": "heat"}, "unknown dynamics 'heat'"),
        ({"T": -1.0}, "T must be >= 0"),
        ({"T": float("nan")}, "T must be a finite number"),
        ({"c": 0.0}, "wave speed c must be > 0"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"spacing": "log"}, "spacing must be one of time, index"),
        ({"method": "implicit"}, "method must be one of auto, steps, spectral"),
        ({"kind": "reaction", "method": "spectral"}, "linear dynamics only"),
    ],
)
def test_bad_dynamics_raise_the_toolkits_error(kwargs: dict, needle: str) -> None:
    with pytest.raises(DynamicsError, match=needle) as info:
        Dynamics(**kwargs)
    assert isinstance(info.value, ContllmError) and isinstance(info.value, ValueError)


# ---------------------------------------------------------------------------- inside a model

DYNAMICS = [
    Dynamics("diffusion", 1.0),
    Dynamics("diffusion", 16.0),
    Dynamics("wave", 3.0),
    Dynamics("reaction", 2.0, rho=2.0),
    Dynamics("matched", 4.0),
]


def logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None] if ids.ndim == 1 else ids, use_cache=False, **kwargs).logits[0]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_t0_is_bitwise_the_stock_eager_model(family: str) -> None:
    model = tiny_model(family, "eager")
    ids = prompt(10)
    stock = logits(model, ids)
    with pde_attention(model, Dynamics("diffusion", 0.0)):
        assert torch.equal(logits(model, ids), stock)
    with pde_attention(model, Dynamics("diffusion", 0.0), recorder=AttentionRecorder(3)):
        assert torch.equal(logits(model, ids), stock)
    with pde_attention(model, Dynamics("diffusion", 5.0), layer=1):  # layers out of scope are stock too
        changed = logits(model, ids)
    assert not torch.equal(changed, stock)
    assert torch.equal(logits(model, ids), stock)
    if family != "gemma2":  # sdpa weights run through the eager function under the patch
        sdpa = tiny_model(family, "sdpa")
        with pde_attention(sdpa, Dynamics("diffusion", 0.0)):
            assert torch.equal(logits(sdpa, ids), stock)
        assert sdpa.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_recomputed_values_product_matches_eager(family: str) -> None:
    """A temperature a hair from 1 goes through the new-weights path; it must reproduce eager."""
    model = tiny_model(family, "eager")
    ids = prompt(9, seed=1)
    with pde_attention(model, Dynamics("temperature", temperature=1.0 + 1e-15)):
        out = logits(model, ids)
    assert torch.allclose(out, logits(model, ids), atol=1e-5, rtol=0)


def test_the_patch_is_undone_on_exit_and_on_exceptions() -> None:
    model = tiny_model("gemma3", "eager")
    ids = prompt(8)
    stock = logits(model, ids)
    with pytest.raises(RuntimeError, match="boom"):
        with pde_attention(model, Dynamics("diffusion", 4.0)):
            assert model.config._attn_implementation == "contllm_pde"
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "eager"
    assert torch.equal(logits(model, ids), stock)
    with pde_attention(model, Dynamics("diffusion", 1.0)):
        with pytest.raises(DynamicsError, match="already active"):
            with pde_attention(model, Dynamics("diffusion", 2.0)):
                pass
    assert model.config._attn_implementation == "eager"
    with pytest.raises(DynamicsError, match="layer 3 is outside the model"):
        with pde_attention(model, Dynamics("diffusion", 1.0), layer=3):
            pass
    with pytest.raises(DynamicsError, match="head 4 is outside the model"):
        with pde_attention(model, Dynamics("diffusion", 1.0), head=4):
            pass
    assert torch.equal(logits(model, ids), stock)


class Capture:
    """A recorder that keeps every layer's rows."""

    def __init__(self) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        self.support: dict[int, torch.Tensor] = {}

    def add(self, layer: int, weights: torch.Tensor, support: torch.Tensor) -> None:
        self.rows[layer], self.support[layer] = weights.clone(), support.clone()


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral", "gpt2"])
def test_rows_inside_the_model_stay_valid_within_their_support(family: str) -> None:
    model = tiny_model(family, "eager")
    stock, diffused = Capture(), Capture()
    with pde_attention(model, Dynamics("diffusion", 0.0), recorder=stock):
        logits(model, prompt(12))
    with pde_attention(model, Dynamics("diffusion", 3.0), recorder=diffused):
        logits(model, prompt(12))
    for layer, rows in diffused.rows.items():
        support = torch.broadcast_to(diffused.support[layer], rows.shape)
        assert torch.all((rows.sum(-1) - 1).abs() <= 1e-6)
        assert torch.all(rows >= 0) and torch.all(rows[~support] == 0)
        # The support is the stock one: causal, and windowed on sliding layers.
        assert torch.equal(support, torch.broadcast_to(stock.support[layer], rows.shape))
        assert torch.all(rows.triu(1) == 0)
    if family in ("gemma3", "mistral"):  # windowed layers (window 4) keep their window
        assert not bool(torch.broadcast_to(diffused.support[0], diffused.rows[0].shape)[0, 0, -1, :-4].any())


def test_one_layer_and_one_head_scopes_change_only_what_they_name() -> None:
    model = tiny_model("llama", "eager")
    ids = prompt(11)
    stock = Capture()
    with pde_attention(model, Dynamics("diffusion", 0.0), recorder=stock):
        logits(model, ids)
    head = Capture()
    with pde_attention(model, Dynamics("diffusion", 2.0), layer=2, head=1, recorder=head):
        logits(model, ids)
    for layer in (0, 1):
        assert torch.equal(head.rows[layer], stock.rows[layer])
    for h in (0, 2, 3):
        assert torch.equal(head.rows[2][:, h], stock.rows[2][:, h])
    assert not torch.equal(head.rows[2][:, 1], stock.rows[2][:, 1])
    layer = Capture()
    with pde_attention(model, Dynamics("diffusion", 2.0), layer=-2, recorder=layer):
        logits(model, ids)
    assert torch.equal(layer.rows[0], stock.rows[0])
    assert all(not torch.equal(layer.rows[1][:, h], stock.rows[1][:, h]) for h in range(4))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("dynamics", DYNAMICS, ids=lambda d: d.label())
def test_causality_changing_token_p_leaves_earlier_outputs_unchanged(family: str, dynamics: Dynamics) -> None:
    model = tiny_model(family, "eager")
    ids = prompt(14)
    p = 8
    edited = ids.clone()
    edited[p] = (ids[p] + 5) % 90 + 3
    with pde_attention(model, dynamics):
        before, after = logits(model, ids), logits(model, edited)
    assert torch.equal(before[:p], after[:p])
    assert not torch.equal(before[p:], after[p:])


def decode_step_by_step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    cache = DynamicCache()  # no config: sliding layers keep every key (the windows come from the mask)
    out = []
    with torch.no_grad():
        for i in range(len(ids)):
            step = model(ids[None, i : i + 1], **{cache_keyword(model): cache}, use_cache=True,
                         position_ids=torch.tensor([[i]]), attention_mask=torch.ones(1, i + 1, dtype=torch.long))
            out.append(step.logits[0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("dynamics", DYNAMICS, ids=lambda d: d.label())
def test_prefill_equals_kv_cached_decoding_step_by_step(family: str, dynamics: Dynamics) -> None:
    model = tiny_model(family, "eager")
    ids = prompt(10, seed=3)
    with pde_attention(model, dynamics):
        full = logits(model, ids)
        stepped = decode_step_by_step(model, ids)
    assert torch.allclose(full, stepped, atol=1e-5, rtol=0)
    assert not torch.allclose(full, logits(model, ids), atol=1e-3)


def test_continuous_time_masks_give_support_and_spacing() -> None:
    model = tiny_model("llama", "eager")
    lm = ContinuousLM(model)
    ids = prompt(12, seed=4)
    dynamics = Dynamics("diffusion", 2.0)
    with pde_attention(model, dynamics):
        token_path = logits(model, ids)
        unit = lm.logits(Signal.from_ids(ids), positions="all")
        # A zero-duration token is outside every row's support: no other output moves.
        durations = torch.ones(12, dtype=F64)
        durations[5] = 0.0
        absent = lm.logits(Signal.from_ids(ids, durations), positions="all")
        dropped = lm.logits(Signal.from_ids(torch.cat([ids[:5], ids[6:]]), times=[*range(5), *range(5, 11)]), positions="all")
        # A batch of different signals equals each alone (left padding is outside the support).
        short = Signal.from_ids(ids[:7], 0.5 + torch.rand(7, dtype=F64, generator=torch.Generator().manual_seed(0)))
        batch = lm.logits([Signal.from_ids(ids), short], positions="last")
        alone = lm.logits(short, positions="last")
    assert torch.allclose(unit, token_path, atol=1e-5, rtol=0)
    keep = [i for i in range(12) if i != 5]
    assert torch.allclose(absent[keep], dropped, atol=1e-5, rtol=0)
    assert torch.allclose(batch[1], alone, atol=1e-5, rtol=0)
    # Stretched durations widen the cells: the rows change, and stay valid.
    stretched = Capture()
    with pde_attention(model, dynamics, recorder=stretched):
        lm.logits(Signal.from_ids(ids, torch.linspace(0.3, 2.0, 12, dtype=F64)), positions="all")
    rows = stretched.rows[1]
    assert torch.all((rows.sum(-1) - 1).abs() <= 1e-6) and torch.all(rows >= 0)


# ---------------------------------------------------------------------------- hidden-state smoothing


def test_smoothing_matrix_is_k_one_sided_steps() -> None:
    n = 9
    for T in (0.1, 0.5, 1.3, 6.0):
        k = math.ceil(T / 0.25)
        tau = T / k
        step = torch.eye(n, dtype=F64) * (1 - tau) + torch.diag(torch.full((n - 1,), tau, dtype=F64), -1)
        step[0, 0] = 1.0  # nothing flows into the first token
        expected = torch.linalg.matrix_power(step, k)
        m = smoothing_matrix(n, T)
        assert torch.allclose(m, expected, atol=1e-14)
        assert torch.all(m.triu(1) == 0) and torch.allclose(m.sum(1), torch.ones(n, dtype=F64), atol=1e-14)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_hidden_smoothing_is_causal_scoped_and_matches_cached_decoding(family: str) -> None:
    model = tiny_model(family, "eager")
    ids = prompt(10, seed=5)
    stock = logits(model, ids)
    with causal_smoothing(model, 0.0):
        assert torch.equal(logits(model, ids), stock)
    edited = ids.clone()
    edited[6] = (ids[6] + 7) % 90 + 3
    with causal_smoothing(model, 2.0):
        smooth, smooth_edited = logits(model, ids), logits(model, edited)
        if family != "gpt2":  # GPT-2 takes integer positions only through contllm's patch
            stepped = decode_step_by_step(model, ids)
            assert torch.allclose(smooth, stepped, atol=1e-5, rtol=0)
    assert torch.equal(smooth[:6], smooth_edited[:6])
    assert not torch.allclose(smooth, stock, atol=1e-3)
    assert torch.equal(logits(model, ids), stock)  # hooks removed
    with pytest.raises(DynamicsError, match="pseudo-time T must be"):
        with causal_smoothing(model, -1.0):
            pass


# ---------------------------------------------------------------------------- measures


def test_fits_recover_exponential_and_power_law_decay() -> None:
    d = np.arange(200, dtype=np.float64)
    exponential = 0.3 * np.exp(-d / 7.0)
    power = 0.5 * np.maximum(d, 1) ** -1.3
    e = fit_exponential(exponential, 1, 60)
    p = fit_power_law(power, 1, 150)
    assert e is not None and p is not None
    assert e.scale == pytest.approx(7.0, rel=1e-9) and e.amplitude == pytest.approx(0.3, rel=1e-9) and e.r2 == pytest.approx(1.0)
    assert p.scale == pytest.approx(1.3, rel=1e-9) and p.amplitude == pytest.approx(0.5, rel=1e-9)
    assert compare_fits(exponential, 1, 60)["preferred"] == "exponential"
    assert compare_fits(power, 1, 150)["preferred"] == "power"
    assert fit_exponential(exponential, 1, 2) is None


def test_recorder_profile_leaves_out_the_sink_and_counts_queries() -> None:
    keys = 6
    support = torch.tril(torch.ones(keys, keys, dtype=torch.bool))[None, None]
    weights = torch.where(support, 1.0, 0.0).to(F64)
    weights = weights / weights.sum(-1, keepdim=True)
    recorder = AttentionRecorder(1, long_range=2)
    recorder.add(0, weights.expand(1, 2, keys, keys), support)
    m, counts = recorder.profile()
    # Query i spreads 1/(i+1) over keys 0..i; key 0 (the sink) is left out.
    for d in range(keys - 1):
        queries = [i for i in range(keys) if i - d >= 1]
        assert m[d] == pytest.approx(np.mean([1 / (i + 1) for i in queries]))
        assert counts[d] == 2 * len(queries)
    means = recorder.layer_means()
    assert means["sink_mass"][0] == pytest.approx(np.mean([1 / (i + 1) for i in range(keys)]))
    far = [sum(1 / (i + 1) for j in range(1, i + 1) if i - j > 2) for i in range(keys)]
    assert means["long_range_mass"][0] == pytest.approx(np.mean(far))


def test_perplexity_of_a_perfect_and_a_uniform_model() -> None:
    ids = torch.tensor([3, 1, 4, 1, 5])
    sure = torch.full((5, 7), -1e4)
    sure[torch.arange(4), ids[1:]] = 0.0
    assert perplexity(sure, ids) == pytest.approx(1.0)
    assert perplexity(torch.zeros(5, 7), ids) == pytest.approx(7.0)
    with pytest.raises(DynamicsError):
        perplexity(torch.zeros(1, 7), ids[:1])


def test_the_cache_goes_by_the_name_the_installed_transformers_takes() -> None:
    import inspect

    from transformers.modeling_outputs import CausalLMOutputWithPast

    from contllm.internals.hooks import CACHE_KEYWORDS, cache_of

    model = tiny_model("llama")
    name = cache_keyword(model)
    assert name in CACHE_KEYWORDS and name in inspect.signature(model.forward).parameters
    cache = DynamicCache()
    out = model(torch.tensor([[1, 2, 3]]), use_cache=True, **{name: cache})
    assert cache_of(out) is cache  # the output carries the cache it was given, filled
    assert cache_of({"past_key_values": cache}) is cache and cache_of({"cache": cache}) is cache
    assert cache_of({"hidden_states": None}) is None
    assert cache_of(CausalLMOutputWithPast(logits=out.logits)) is None
