"""TransformerLens habits (docs/from-transformerlens.md): padded caches and their TL methods, names_filter,
persistent hooks (add_hook / reset_hooks), run_with_hooks' return_type, to_tokens, hook.layer(), float64 caches.

Values are checked against plain torch hooks and forwards of the stock model at unit durations."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from contllm import ContinuousLM, Signal
from contllm.core.families import decoder_layers, head_counts, parallel_blocks
from contllm.errors import SignalError
from contllm.internals.hooked_attention import _SITES as SITES
from contllm.internals.intervention import LayerIndex
from tests.unit.test_intervention import hooks_on, max_diff
from tests.unit.tiny import prompt, random_durations, tiny_model, tiny_model64

pytestmark = [pytest.mark.unit, pytest.mark.numerics]

LONG, SHORT = 8, 5


def ragged(seed: int = 0) -> list[Signal]:
    """Two signals of unit durations and different token counts (the stock model reads them as they are)."""
    return [Signal.from_ids(prompt(LONG, 30 + seed)), Signal.from_ids(prompt(SHORT, 31 + seed))]


def stock_hidden(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The stock forward's hidden states of one prompt (on a copy: transformers leaves recorders on a model it served)."""
    with torch.no_grad():
        return copy.deepcopy(model)(ids[None], output_hidden_states=True).hidden_states


# ---------------------------------------------------------------------- the cache


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi", "gpt2"])
def test_a_ragged_cache_is_left_padded_with_zeros_and_its_rows_are_the_stock_ones(family: str) -> None:
    lm = ContinuousLM(tiny_model(family))
    items = ragged()
    layers = len(decoder_layers(lm))
    cache = lm.run_with_cache(items)
    assert cache.real.tolist() == [[True] * LONG, [False] * (LONG - SHORT) + [True] * SHORT]
    for i in range(layers - 1):
        value = cache["resid_post", i]
        assert value.shape == (2, LONG, 64) and value.dtype == torch.float32
        assert torch.equal(value[1, : LONG - SHORT], torch.zeros(LONG - SHORT, 64))
        for b, s in enumerate(items):
            assert s.token_ids is not None
            want = stock_hidden(lm.model, s.token_ids)[i + 1][0]
            assert max_diff(value[b, LONG - len(s) :], want) <= 1e-5
            assert torch.equal(value[b, LONG - len(s) :], cache.rows(("resid_post", i))[b])
    # Patterns: queries and keys padded on the left, so that key j of signal b sits at column LONG - len(b) + j.
    pattern = cache["pattern", 0]
    heads = head_counts(lm)[0]
    assert pattern.shape == (2, heads, LONG, LONG)
    assert torch.equal(pattern[1, :, LONG - SHORT :, LONG - SHORT :], cache.rows(("pattern", 0))[1])
    assert float(pattern[1, :, : LONG - SHORT].abs().sum() + pattern[1, :, :, : LONG - SHORT].abs().sum()) == 0.0
    # The hook function sees the same layout: the left-padded batch, with padding keys at probability 0.
    seen: dict[str, torch.Tensor] = {}
    lm.run_with_hooks(items, fwd_hooks=[(("pattern", 0), lambda x, hook: seen.__setitem__("p", x.detach().clone()))])
    real = cache.real[1]
    assert max_diff(seen["p"][1][:, real], pattern[1][:, real]) <= 1e-6
    # The helpers work on the padded values and keep padding at 0 (a padded scale would divide by 0).
    parts = cache.decompose_resid()
    assert max_diff(parts.sum(0), cache["resid_post", layers - 1]) <= 1e-5
    normed = cache.apply_ln_to_stack(parts)
    assert not bool(normed.isnan().any()) and float(normed[:, 1, : LONG - SHORT].abs().sum()) == 0.0
    heads_stack = cache.stack_head_results(-1, incl_remainder=True)
    assert max_diff(heads_stack.sum(0), cache["resid_post", layers - 1]) <= 1e-5
    lens = cache.logit_lens()
    assert max_diff(lens[-1][cache.real], torch.cat(cache.logits)) <= 1e-4
    assert float(lens[:, 1, : LONG - SHORT].abs().sum()) == 0.0


def test_keys_items_stack_activation_and_negative_layers() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    items = ragged()
    cache = lm.run_with_cache(items, names=lambda n: n.endswith(("hook_z", "hook_scale", "hook_resid_post")))
    assert list(cache.keys()) == cache.names == list(cache)
    assert [name for name, _ in cache.items()] == cache.names
    assert all(torch.equal(value, cache[name]) for name, value in cache.items())
    z = cache.stack_activation("z")
    assert z.shape == (3, 2, LONG, 4, 16)
    assert all(torch.equal(z[i], cache["z", i]) for i in range(3))
    assert torch.equal(cache.stack_activation("z", 2), z[:2])
    scales = cache.stack_activation("scale", sublayer_type="ln2")
    assert torch.equal(scales[1], cache["blocks.1.ln2.hook_scale"])
    assert torch.equal(cache["resid_post", -1], cache["resid_post", 2])
    assert torch.equal(cache["z", -3], cache["z", 0])
    with pytest.raises(SignalError, match="layer -4 is outside the model's 3 layers"):
        cache["z", -4]
    with pytest.raises(SignalError, match="stacks no layer"):
        cache.stack_activation("z", 0)


def test_one_signal_without_its_batch_dimension() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    s = Signal.from_ids(prompt(LONG, 2), random_durations(LONG, 2))
    cache = lm.run_with_cache(s)
    assert cache["resid_post", 1].shape == (1, LONG, 64)
    same = cache.remove_batch_dim()
    assert same is cache and not cache.has_batch_dim
    assert torch.equal(cache["resid_post", 1], cache.rows(("resid_post", 1))[0])
    assert cache.real.shape == (LONG,)
    assert cache.decompose_resid().shape == (7, LONG, 64)
    assert cache.stack_head_results().shape == (12, LONG, 64)
    assert cache.accumulated_resid(apply_ln=True).shape == (4, LONG, 64)
    assert cache.logit_lens().shape == (4, LONG, 97)
    direct = lm.run_with_cache(s, names_filter=("resid_post", 1), remove_batch_dim=True)
    assert torch.equal(direct["resid_post", 1], cache["resid_post", 1])
    with pytest.raises(SignalError, match="remove_batch_dim needs a cache of one signal; this one holds 2"):
        lm.run_with_cache(ragged(), names=("resid_post", 1)).remove_batch_dim()
    with pytest.raises(SignalError, match="remove_batch_dim needs one signal; 2 were given"):
        lm.run_with_cache(ragged(), names=("resid_post", 1), remove_batch_dim=True)


def test_to_moves_the_cache_and_its_helpers_follow() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    cache = lm.run_with_cache(ragged(), names=lambda n: "resid" in n or n.endswith("hook_scale"))
    want = cache.accumulated_resid(apply_ln=True)
    moved = cache.to("meta")  # a device other than the CPU that every machine has (it holds shapes, no values)
    assert moved is cache
    assert {cache["resid_pre", 0].device.type, cache.logits[0].device.type, cache.times[1].device.type} == {"meta"}
    stack = cache.accumulated_resid(apply_ln=True)
    assert stack.device.type == "meta" and stack.shape == want.shape and stack.dtype == want.dtype


def test_names_filter_takes_what_names_takes() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    items = ragged()
    by_names = lm.run_with_cache(items, names=["blocks.1.hook_resid_post", "blocks.2.attn.hook_z"])
    for given in (["blocks.1.hook_resid_post", "blocks.2.attn.hook_z"], lambda n: n in by_names.names):
        cache = lm.run_with_cache(items, names_filter=given)
        assert cache.names == by_names.names
        assert all(torch.equal(cache[n], by_names[n]) for n in cache.names)
    assert lm.run_with_cache(items, names_filter="blocks.0.hook_resid_pre").names == ["blocks.0.hook_resid_pre"]
    with pytest.raises(SignalError, match="give names or names_filter"):
        lm.run_with_cache(items, names="blocks.0.hook_resid_pre", names_filter="blocks.0.hook_resid_pre")


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_a_float64_model_keeps_a_float64_cache(family: str) -> None:
    lm = ContinuousLM(tiny_model64(family))
    ids = prompt(LONG, 4)
    names = lambda n: n.endswith(("resid_pre", "hook_pattern"))  # noqa: E731
    cache = lm.run_with_cache(Signal.from_ids(ids), names=names)
    seen: dict[str, torch.Tensor] = {}
    lm.run_with_hooks(Signal.from_ids(ids), fwd_hooks=[(names, lambda x, h: seen.__setitem__(h.name, x.detach()))])
    hidden = stock_hidden(lm.model, ids)
    for i in range(len(decoder_layers(lm))):
        value = cache["resid_pre", i]
        # The activation itself, not a float32 rounding of it (off by about 1e-7 of these values).
        assert value.dtype == torch.float64 and torch.equal(value, seen[f"blocks.{i}.hook_resid_pre"])
        assert max_diff(value[0], hidden[i][0]) <= 1e-5  # and the stock forward's (which keeps some float32 steps)
    pattern = cache["pattern", 1]
    assert pattern.dtype == torch.float64 and torch.equal(pattern, seen["blocks.1.attn.hook_pattern"])
    other = ContinuousLM(tiny_model(family)).run_with_cache(Signal.from_ids(ids), names=("resid_pre", 0))
    assert other["resid_pre", 0].dtype == torch.float32


# ---------------------------------------------------------------------- hooks


def zero_head(head: int):
    def fn(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = 0
        return z

    return fn


def stock_ablated_logits(lm: ContinuousLM, ids: torch.Tensor, layer: int, head: int) -> torch.Tensor:
    """Logits [tokens, vocab] of the stock model (a copy) with head ``head`` of layer ``layer`` zeroed by a plain torch hook."""
    stock = copy.deepcopy(lm.model)
    attn = stock.model.layers[layer].self_attn
    d = attn.head_dim

    def zero(module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x, *args[1:])

    attn.o_proj.register_forward_pre_hook(zero)
    with torch.no_grad():
        return stock(ids[None]).logits[0]


def test_added_hooks_apply_to_every_hooked_forward_until_reset_and_leave_nothing_on_the_model() -> None:
    model = tiny_model("llama")
    lm = ContinuousLM(model)
    before = hooks_on(model)
    ids = prompt(LONG, 7)
    s = Signal.from_ids(ids)
    plain = lm.logits(s)
    want = stock_ablated_logits(lm, ids, 1, 2)
    calls: list[str] = []

    def counted(z: torch.Tensor, hook) -> torch.Tensor:
        calls.append(hook.name)
        return zero_head(2)(z, hook)

    lm.add_hook(("z", 1), counted)
    assert hooks_on(model) == before and not list(SITES.keys())  # nothing registered until a forward runs
    got = lm.logits(s)
    assert max_diff(got, want[-1]) <= 1e-5 and max_diff(got, plain) > 1e-3
    assert max_diff(lm.run_with_hooks(s, positions="all"), want) <= 1e-5
    cache = lm.run_with_cache(s, names=("z", 1))
    assert float(cache["z", 1][0, :, 2].abs().max()) == 0.0  # the cache holds the values after the hook
    assert hooks_on(model) == before  # nothing between calls
    # Applied once per forward, also inside a context (the outermost context of this lm applies them).
    calls.clear()
    with lm.hooks(s, [("blocks.0.hook_resid_pre", lambda x, h: None)]):
        lm.run_with_cache(s, names=("resid_post", 2))
    assert calls == ["blocks.1.attn.hook_z"]
    # Another ContinuousLM of the same model has none of them.
    assert torch.equal(ContinuousLM(model).logits(s), plain)
    # A hook that raises leaves nothing behind either.
    lm.add_hook(("pattern", 0), lambda x, hook: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        lm.logits(s)
    assert hooks_on(model) == before and not list(SITES.keys())
    lm.reset_hooks()
    assert torch.equal(lm.logits(s), plain)  # the engine again, bit for bit
    assert hooks_on(model) == before and model.config._attn_implementation == "eager" and not list(SITES.keys())
    calls.clear()
    lm.run_with_hooks(s)
    assert calls == []


def test_an_added_backward_hook_fires_where_the_graph_is_kept() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    s = Signal.from_ids(prompt(LONG, 8))
    grads: list[torch.Tensor] = []
    lm.add_hook(("resid_post", 1), lambda g, hook: grads.append(g), dir="bwd")
    try:
        lm.run_with_cache(s, names=("resid_post", 1))  # inference mode: no graph, nothing to fire
        lm.logits(s)
        assert grads == []
        logits = lm.run_with_hooks(s)  # keeps the graph while a backward hook is added
        assert isinstance(logits, torch.Tensor) and logits.requires_grad
        logits[3].backward()
        assert len(grads) == 1 and grads[0].shape == (1, LONG, 64)
    finally:
        lm.reset_hooks()


def test_add_hook_refuses_what_it_cannot_run() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    with pytest.raises(SignalError, match="dir must be 'fwd' or 'bwd', got 'forward'"):
        lm.add_hook(("z", 1), zero_head(0), dir="forward")  # type: ignore[arg-type]
    with pytest.raises(SignalError, match="the hook must be a function"):
        lm.add_hook(("z", 1), 3)  # type: ignore[arg-type]
    with pytest.raises(SignalError, match="no activation named 'blocks.7.attn.hook_z'"):
        lm.add_hook(("z", 7), zero_head(0))
    lm.add_hook(("z", 1), zero_head(0))
    with pytest.raises(SignalError, match="generate runs no named hooks"):
        lm.generate(Signal.from_ids(prompt(4, 1)), 2)
    lm.reset_hooks()
    assert lm.generate(Signal.from_ids(prompt(4, 1)), 2).token_ids is not None  # type: ignore[union-attr]


IN_PLACE = [
    "hook_embed",
    "blocks.1.hook_resid_pre",
    "blocks.1.ln1.hook_scale",
    "blocks.1.ln1.hook_normalized",
    "blocks.0.attn.hook_q",
    "blocks.1.attn.hook_pattern",
    "blocks.1.attn.hook_z",
    "blocks.1.attn.hook_result",
    "blocks.1.hook_attn_out",
    "blocks.1.mlp.hook_post",
    "blocks.1.hook_resid_post",
    "ln_final.hook_scale",
    "ln_final.hook_normalized",
]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_hook_may_edit_the_activation_in_place_as_transformer_lens_hooks_do(family: str) -> None:
    # TransformerLens's habit: edit the tensor in place and return None (or it). Every point takes the
    # edit as it takes the same values returned, the norms' scale and normalized and the heads' results too.
    lm = ContinuousLM(tiny_model(family))
    items = ragged(5)
    plain = lm.logits(items)

    def in_place(x: torch.Tensor, hook) -> None:
        x.mul_(0.5)

    def returned(x: torch.Tensor, hook) -> torch.Tensor:
        return x * 0.5

    for name in IN_PLACE:
        edited = lm.run_with_hooks(items, fwd_hooks=[(name, in_place)])
        assert torch.equal(edited, lm.run_with_hooks(items, fwd_hooks=[(name, returned)])), name
        assert max_diff(edited, plain) > 1e-4, name
        # ... and so does a hook that edits in place and returns the tensor it was given.
        assert torch.equal(edited, lm.run_with_hooks(items, fwd_hooks=[(name, lambda x, h: x.mul_(0.5))])), name


def test_hook_layer_is_an_int_and_a_call() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    seen: list[tuple[str, object]] = []

    def record(x: torch.Tensor, hook) -> None:
        seen.append((hook.name, hook.layer))

    lm.run_with_hooks(Signal.from_ids(prompt(4, 1)), fwd_hooks=[(("z", 1), record), ("hook_embed", record)])
    (name, layer), (embed, none) = sorted(seen, key=lambda x: x[0] == "hook_embed")
    assert isinstance(layer, LayerIndex) and layer == 1 and layer() == 1 and type(layer()) is int
    assert [0, 1, 2][layer] == 1 and repr(layer) == "1"
    assert (embed, none) == ("hook_embed", None)


# ---------------------------------------------------------------------- return_type, tokens


def test_the_loss_is_the_stock_mean_next_token_cross_entropy_over_real_positions() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    items = ragged(3)
    terms, count = 0.0, 0
    for s in items:
        assert s.token_ids is not None
        with torch.no_grad():
            logits = copy.deepcopy(lm.model)(s.token_ids[None]).logits[0]
        terms += float(torch.nn.functional.cross_entropy(logits[:-1].double(), s.token_ids[1:], reduction="sum"))
        count += len(s) - 1
    loss = lm.run_with_hooks(items, return_type="loss")
    assert isinstance(loss, torch.Tensor) and loss.shape == () and not loss.requires_grad
    assert abs(float(loss) - terms / count) <= 1e-5
    # With a hook: the stock model with the same head zeroed by a plain torch hook.
    s = items[0]
    assert s.token_ids is not None
    ablated = stock_ablated_logits(lm, s.token_ids, 1, 2)
    want = torch.nn.functional.cross_entropy(ablated[:-1].double(), s.token_ids[1:])
    got = lm.run_with_hooks(s, fwd_hooks=[(("z", 1), zero_head(2))], return_type="loss")
    assert isinstance(got, torch.Tensor) and abs(float(got) - float(want)) <= 1e-5
    # A loss that keeps the graph fires backward hooks.
    grads: list[torch.Tensor] = []
    kept = lm.run_with_hooks(s, bwd_hooks=[(("resid_pre", 1), lambda g, h: grads.append(g))], return_type="loss")
    assert isinstance(kept, torch.Tensor)
    kept.backward()
    assert len(grads) == 1 and float(grads[0].abs().sum()) > 0


def test_return_type_none_runs_the_hooks_and_returns_nothing() -> None:
    lm = ContinuousLM(tiny_model("llama"))
    seen: list[str] = []
    out = lm.run_with_hooks(ragged(), fwd_hooks=[(("resid_post", 0), lambda x, h: seen.append(h.name))], return_type=None)
    assert out is None and seen == ["blocks.0.hook_resid_post"]


@pytest.mark.parametrize(
    "call,why",
    [
        (lambda lm: lm.run_with_hooks(ragged(), return_type="probs"), "return_type must be 'logits', 'loss' or None"),
        (lambda lm: lm.run_with_hooks(ragged(), return_type="loss", positions="last"), "leave positions out"),
        (
            lambda lm: lm.run_with_hooks(Signal.from_embeds(torch.randn(3, 64)), return_type="loss"),
            "signal 0 is given only as embeddings",
        ),
        (lambda lm: lm.run_with_hooks(Signal.from_ids([5]), return_type="loss"), "at least two tokens"),
    ],
)
def test_return_type_refusals(call, why: str) -> None:
    with pytest.raises(SignalError, match=why):
        call(ContinuousLM(tiny_model("llama")))


def word_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer over ten words that puts a BOS ``<s>`` (id 1) before every text."""
    words = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "a", "mat", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_to_tokens_and_to_str_tokens() -> None:
    lm = ContinuousLM(tiny_model("llama"), word_tokenizer())
    tokens = lm.to_tokens("the cat sat")
    assert tokens.dtype == torch.long and tokens.tolist() == [[1, 3, 4, 5]]
    assert lm.to_tokens("the cat sat", add_special_tokens=False).tolist() == [[3, 4, 5]]
    assert lm.to_tokens(["the cat", "a dog"]).tolist() == [[1, 3, 4], [1, 7, 9]]
    assert torch.equal(Signal.from_ids(tokens[0]).token_ids, lm.signal("the cat sat").token_ids)  # type: ignore[arg-type]
    assert lm.to_str_tokens("the cat sat") == ["<s>", "the", "cat", "sat"]
    assert lm.to_str_tokens(lm.signal("a dog")) == ["<s>", "a", "dog"]
    with pytest.raises(SignalError, match=r"the texts tokenize to different lengths \(3, 4\)"):
        lm.to_tokens(["the cat", "the cat sat"])
    with pytest.raises(SignalError, match="to_tokens takes a text or a list of texts, got int"):
        lm.to_tokens(5)  # type: ignore[arg-type]
    with pytest.raises(SignalError, match="this model has no tokenizer"):
        ContinuousLM(tiny_model("llama")).to_tokens("the cat")


def test_parallel_families_are_not_asked_for_a_middle_residual() -> None:
    # stack_activation of a point a family does not have names it (phi runs attention and MLP in parallel).
    lm = ContinuousLM(tiny_model("phi"))
    assert parallel_blocks(lm)
    cache = lm.run_with_cache(ragged())
    with pytest.raises(SignalError, match="'blocks.0.hook_resid_mid' was not cached"):
        cache.stack_activation("resid_mid")
