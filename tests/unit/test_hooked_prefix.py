"""Hooked runs on a shared prefix (contllm.internals.prefixed): the prefix runs once, the hooks see every position,
and the answers are those of the full forward and of the stock model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.families import attention_outputs
from contllm.internals import activations
from tests.unit.test_intervention import max_diff
from tests.unit.tiny import prompt, random_durations, tiny_model64

pytestmark = pytest.mark.unit

FAMILIES = ["llama", "qwen2", "gemma3"]
#: Tokens of the shared prefix, and of each signal's own rest.
P = 20
RESTS = (3, 6, 4)
LAYER, HEAD = 1, 2
#: float64 models, as the engine's prefix tests: the rows after a shared prefix sum in another order than the full
#: forward, and the stock modules' float32 steps stay (see tiny_model64); a wrong layout moves values by far more.
TOLERANCE = 1e-5


def shared(unit: bool = False) -> list[Signal]:
    """Three signals that share their first P tokens (unit durations with ``unit``), each with its own rest."""
    head = prompt(P, 3)
    head_d = torch.ones(P, dtype=torch.float64) if unit else random_durations(P, 3)
    out = []
    for k, n in enumerate(RESTS):
        durations = torch.ones(n, dtype=torch.float64) if unit else random_durations(n, 10 + k)
        out.append(Signal.from_ids(torch.cat([head, prompt(n, 10 + k)]), torch.cat([head_d, durations])))
    return out


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The prefix lengths a hooked call ran once (a spy on SharedPrefix.compute)."""
    calls: list[int] = []
    real = activations.SharedPrefix.compute

    def spy(lm: ContinuousLM, source: Signal, length: int, origin: float = 0.0) -> activations.SharedPrefix:
        calls.append(length)
        return real(lm, source, length, origin)

    monkeypatch.setattr(activations.SharedPrefix, "compute", spy)
    return calls


Full = Callable[[], AbstractContextManager[None]]


@pytest.fixture
def full(monkeypatch: pytest.MonkeyPatch) -> Full:
    """A context in which every hooked run is one full forward (no prefix is long enough)."""

    @contextmanager
    def run() -> Iterator[None]:
        with monkeypatch.context() as m:
            m.setattr(activations, "MIN_SHARED_PREFIX", 10**9)
            yield

    return run


def head_at_last(z: torch.Tensor, hook: object) -> torch.Tensor:
    z = z.clone()
    z[torch.arange(len(z)), hook.columns(-1), HEAD] = 0  # type: ignore[attr-defined]
    return z


def head_everywhere(z: torch.Tensor, hook: object) -> torch.Tensor:
    z = z.clone()
    z[:, :, HEAD] = 0
    return z


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hooked_run_on_a_shared_prefix_gives_the_full_forwards_answer(
    family: str, computed: list[int], full: Full
) -> None:
    lm = ContinuousLM(tiny_model64(family))
    items = shared()
    z = f"blocks.{LAYER}.attn.hook_z"
    names = [f"blocks.{i}.hook_resid_post" for i in range(3)] + [z, "blocks.0.mlp.hook_post", "hook_embed"]
    plain = lm.run_with_hooks(items, fwd_hooks=[(z, lambda x, hook: None)])
    ablated = lm.run_with_hooks(items, fwd_hooks=[(z, head_at_last)], positions=[-1, -2])
    cache = lm.run_with_cache(items, names=names, positions="last")
    assert computed == [P, P, P]
    with full():
        plain_full = lm.run_with_hooks(items, fwd_hooks=[(z, lambda x, hook: None)])
        ablated_full = lm.run_with_hooks(items, fwd_hooks=[(z, head_at_last)], positions=[-1, -2])
        cache_full = lm.run_with_cache(items, names=names, positions="last")
    assert computed == [P, P, P]  # the full forwards ran no prefix
    assert max_diff(plain, plain_full) <= TOLERANCE
    assert max_diff(ablated, ablated_full) <= TOLERANCE
    assert max_diff(ablated[:, 0], plain) > 1e-3  # the head matters at the last position
    assert max_diff(ablated[:, 1], lm.logits(items, positions=-2)) <= TOLERANCE  # and only there
    for name in names:
        assert max_diff(cache[name], cache_full[name]) <= TOLERANCE, name
    assert max_diff(cache.logits[0], cache_full.logits[0]) <= TOLERANCE


def test_the_hooks_see_the_whole_padded_batch_as_a_full_forward_gives_it(computed: list[int], full: Full) -> None:
    lm = ContinuousLM(tiny_model64("llama"))
    items = shared()
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {"prefix": [], "full": []}

    def keep(into: str) -> object:
        def fn(x: torch.Tensor, hook: object) -> None:
            seen[into].append((x.clone(), hook.real))  # type: ignore[attr-defined]

        return fn

    targets = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.2.hook_resid_post"]
    lm.run_with_hooks(items, fwd_hooks=[(t, keep("prefix")) for t in targets])
    with full():
        lm.run_with_hooks(items, fwd_hooks=[(t, keep("full")) for t in targets])
    assert computed == [P]
    assert len(seen["prefix"]) == len(seen["full"]) == len(targets)  # each hook called once
    for (a, real), (b, real_full) in zip(seen["prefix"], seen["full"]):
        assert a.shape == b.shape and a.shape[:2] == (len(items), P + max(RESTS))
        assert torch.equal(real, real_full)
        assert max_diff(a[real], b[real]) <= TOLERANCE  # every real position; padding holds no defined value


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hook_that_edits_the_prefix_runs_the_full_forward(family: str, computed: list[int], full: Full) -> None:
    lm = ContinuousLM(tiny_model64(family))
    items = shared()
    z = f"blocks.{LAYER}.attn.hook_z"
    ablated = lm.run_with_hooks(items, fwd_hooks=[(z, head_everywhere)], positions="last")
    assert computed == [P]  # tried, then given up for the full forward
    with full():
        ablated_full = lm.run_with_hooks(items, fwd_hooks=[(z, head_everywhere)], positions="last")
    assert torch.equal(ablated, ablated_full)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("everywhere", [False, True], ids=["rest", "prefix"])
def test_both_paths_give_the_stock_models_answer(family: str, everywhere: bool, computed: list[int]) -> None:
    """Unit durations: the stock model on each prompt alone, with a torch pre-hook zeroing the head's slice of the
    output projection's input (at the last position, or everywhere)."""
    lm = ContinuousLM(tiny_model64(family))
    items = shared(unit=True)
    hook = head_everywhere if everywhere else head_at_last
    ours = lm.run_with_hooks(items, fwd_hooks=[(f"blocks.{LAYER}.attn.hook_z", hook)], positions="last")
    assert computed == [P]
    projection = attention_outputs(lm)[LAYER]
    config = lm.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cut = slice(HEAD * head_dim, (HEAD + 1) * head_dim)

    def zero(module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        if everywhere:
            x[..., cut] = 0
        else:
            x[:, -1, cut] = 0
        return (x, *args[1:])

    handle = projection.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            stock = torch.stack([lm.model(s.token_ids[None]).logits[0, -1] for s in items])
    finally:
        handle.remove()
    assert max_diff(ours, stock) <= TOLERANCE


def test_what_never_takes_the_shared_prefix(computed: list[int]) -> None:
    lm = ContinuousLM(tiny_model64("llama"))
    items = shared()
    # Backward hooks and gradients, every position read, a short prefix.
    lm.run_with_hooks(items, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)], grad=True)
    lm.run_with_cache(items, names=["blocks.0.hook_resid_post"])  # positions "all" reads inside the prefix
    short = [Signal.from_ids(s.token_ids[P - 10 :], s.durations[P - 10 :]) for s in items]
    lm.run_with_hooks(short, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)])
    lm.run_with_hooks(items[:1], fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)])
    # A torch hook of the user's on the model would see the rows after the prefix alone.
    handle = lm.model.model.layers[0].register_forward_hook(lambda module, args, output: None)
    try:
        lm.run_with_hooks(items, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)])
    finally:
        handle.remove()
    assert computed == []
    lm.run_with_hooks(items, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: None)])
    assert computed == [P]


ATTENTION = ("rot_q", "rot_k", "duration_bias", "attn_scores", "pattern")


def attention_names(layer: int) -> list[str]:
    return [f"blocks.{layer}.attn.hook_{part}" for part in ATTENTION]


@pytest.mark.parametrize("family", FAMILIES)
def test_points_inside_attention_on_a_shared_prefix_give_the_full_forwards_values(
    family: str, computed: list[int], full: Full
) -> None:
    """Every hook point of the model cached at two read positions: the prefix ran once, and every value (patterns,
    scores, duration biases, rotated queries and keys included) is the full forward's."""
    lm = ContinuousLM(tiny_model64(family))
    items = shared()
    cache = lm.run_with_cache(items, positions=[-1, -3])
    assert computed == [P]
    with full():
        cache_full = lm.run_with_cache(items, positions=[-1, -3])
    assert computed == [P]
    assert sorted(cache.keys()) == sorted(cache_full.keys())
    inside = [name for name in cache.keys() if any(name.endswith(f"hook_{part}") for part in ATTENTION)]
    assert len(inside) == len(ATTENTION) * lm.model.config.num_hidden_layers
    for name in cache.keys():
        for ours, theirs in zip(cache.rows(name), cache_full.rows(name)):
            assert ours.shape == theirs.shape, name
            assert max_diff(ours, theirs) <= TOLERANCE, name
    assert max_diff(cache.logits[0], cache_full.logits[0]) <= TOLERANCE


def test_hooks_inside_attention_see_the_whole_padded_batch_as_a_full_forward_gives_it(
    computed: list[int], full: Full
) -> None:
    """The values a hook function gets inside attention, [batch, heads, query, key] over every column of the padded
    batch: the prefix's queries included, hidden keys at the values a full forward has (0 in a pattern, the mask's
    minimum in scores and biases)."""
    lm = ContinuousLM(tiny_model64("llama"))
    items = shared()
    seen: dict[str, list[torch.Tensor]] = {"prefix": [], "full": []}

    def keep(into: str) -> object:
        def fn(x: torch.Tensor, hook: object) -> None:
            seen[into].append(x.clone())

        return fn

    names = attention_names(LAYER)
    lm.run_with_hooks(items, fwd_hooks=[(n, keep("prefix")) for n in names])
    with full():
        lm.run_with_hooks(items, fwd_hooks=[(n, keep("full")) for n in names])
    assert computed == [P]
    width = P + max(RESTS)
    real = torch.arange(width)[None, :] >= torch.tensor([max(RESTS) - n for n in RESTS])[:, None]
    for name, a, b in zip(names, seen["prefix"], seen["full"]):
        assert a.shape == b.shape, name
        if name.endswith(("rot_q", "rot_k")):
            assert max_diff(a[real], b[real]) <= TOLERANCE, name
            continue
        assert a.shape[::2] == (len(items), width) and a.shape[3] == width
        rows = real[:, None, :, None] & torch.ones_like(a, dtype=torch.bool)  # every key of a real query
        assert max_diff(a[rows], b[rows]) <= TOLERANCE, name
        if name.endswith("pattern"):
            assert torch.equal(a[rows] == 0, b[rows] == 0), name  # hidden keys exactly 0 in both
        else:
            hidden = torch.finfo(a.dtype).min if a.dtype == torch.float64 else torch.finfo(torch.float32).min
            assert torch.equal(a[rows] <= hidden / 2, b[rows] <= hidden / 2), name


def scale_last_scores(x: torch.Tensor, hook: object) -> torch.Tensor:
    """Head HEAD's scores at each signal's last query halved (the prefix's part left as it is)."""
    x = x.clone()
    x[torch.arange(len(x)), HEAD, hook.columns(-1)] *= 0.5  # type: ignore[attr-defined]
    return x


def flatten_pattern(x: torch.Tensor, hook: object) -> torch.Tensor:
    """Head HEAD's pattern made uniform over the real keys of every query, the prefix's included."""
    x = x.clone()
    seen = (x[:, HEAD] > 0).to(x.dtype)
    x[:, HEAD] = seen / seen.sum(-1, keepdim=True).clamp_min(1)
    return x


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("edit", [scale_last_scores, flatten_pattern], ids=["rest", "prefix"])
def test_an_edit_inside_attention_gives_the_full_forwards_answer(
    family: str, edit: Callable[[torch.Tensor, object], torch.Tensor], computed: list[int], full: Full
) -> None:
    """An edit of the rows after the prefix keeps the prefix shared; one that reaches the prefix's queries sends the
    call to the full forward. Both give the full forward's answer, and the edit moves it."""
    lm = ContinuousLM(tiny_model64(family))
    items = shared()
    name = f"blocks.{LAYER}.attn.hook_{'attn_scores' if edit is scale_last_scores else 'pattern'}"
    calls: list[int] = []

    def counted(x: torch.Tensor, hook: object) -> torch.Tensor:
        calls.append(1)
        return edit(x, hook)

    ours = lm.run_with_hooks(items, fwd_hooks=[(name, counted)], positions="last")
    assert computed == [P]
    # Called once where the prefix stayed shared, twice where the call went on as the full forward.
    assert len(calls) == (1 if edit is scale_last_scores else 2)
    with full():
        theirs = lm.run_with_hooks(items, fwd_hooks=[(name, edit)], positions="last")
    assert max_diff(ours, theirs) <= TOLERANCE
    assert max_diff(ours, lm.logits(items)) > 1e-3
