"""The Python API's own errors: hook pairs, hook returns, wrt, read-outs and signals edited in place.

Each wrong argument raises SignalError naming it (never a raw TypeError, RuntimeError or
NotImplementedError from deep inside torch), and every entry point that runs signals
re-checks their values, so an in-place edit cannot slip a NaN or negative duration past
the checks a signal got when it was made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from contllm import ContinuousLM, Signal, SignalError
from contllm.attribution import Readout
from contllm.attribution import attribute as attribute_tokens
from contllm.core.engine import Engine
from contllm.core.signal import MAX_TIME
from tests.unit.tiny import prompt, random_durations, tiny_model

pytestmark = pytest.mark.unit

N = 6
RESID = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return ContinuousLM(tiny_model("llama"))


def fresh() -> Signal:
    """A new signal each time: the in-place edits below never touch another test's signal."""
    return Signal.from_ids(prompt(N, 1), random_durations(N, 1))


def keep(h: torch.Tensor, hook: Any) -> None:
    return None


def log_p(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1)[:, 3]


def entered(context: Any) -> None:
    with context:
        pass


def backward(lm: ContinuousLM, fn: Callable[[torch.Tensor, Any], Any]) -> None:
    lm.run_with_hooks(fresh(), bwd_hooks=[("blocks.1.hook_resid_pre", fn)]).sum().backward()


Case = Callable[[ContinuousLM], Any]


def returning(fn: Callable[[torch.Tensor, Any], Any]) -> Case:
    return lambda lm: lm.run_with_hooks(fresh(), fwd_hooks=[(RESID, fn)])


def by_wrt(wrt: Any) -> Case:
    return lambda lm: lm.gradients(fresh(), log_p, wrt=wrt)


def by_readout(readout: Any) -> Case:
    return lambda lm: lm.gradients(fresh(), readout)


#: (id, call, a regex the SignalError's message must match: it names the argument or the hook point)
CASES: list[tuple[str, Case, str]] = [
    # hooks must be a list of (target, fn) pairs
    *[
        (
            f"{where}-bare-function",
            call,
            rf"{arg} must be a list of \(name or predicate, fn\) pairs with fn\(activation, hook\), got function keep",
        )
        for where, arg, call in [
            ("fwd-hooks", "fwd_hooks", lambda lm: lm.run_with_hooks(fresh(), fwd_hooks=keep)),
            ("bwd-hooks", "bwd_hooks", lambda lm: lm.run_with_hooks(fresh(), bwd_hooks=keep)),
            ("lm-hooks", "fwd_hooks", lambda lm: entered(lm.hooks(fresh(), keep))),
            ("lm-hooks-bwd", "bwd_hooks", lambda lm: entered(lm.hooks(fresh(), bwd_hooks=keep))),
        ]
    ],
    ("fwd-hooks-int", lambda lm: lm.run_with_hooks(fresh(), fwd_hooks=5), r"fwd_hooks must be a list of .*got int 5"),
    # a target that is no name, short form or predicate
    (
        "target-int",
        lambda lm: lm.run_with_hooks(fresh(), fwd_hooks=[(5, keep)]),
        r"the target of fwd_hooks\[0\] must be an activation name, a short form .*got int 5",
    ),
    (
        "target-none",
        lambda lm: lm.run_with_hooks(fresh(), fwd_hooks=[(RESID, keep), (None, keep)]),
        r"the target of fwd_hooks\[1\] must be an activation name.*got NoneType None",
    ),
    (
        "target-int-in-list",
        lambda lm: entered(lm.hooks(fresh(), [([RESID, 5], keep)])),
        r"the target of fwd_hooks\[0\] must be an activation name.*got int 5",
    ),
    (
        "bwd-target-float",
        lambda lm: lm.run_with_hooks(fresh(), bwd_hooks=[(1.5, keep)]),
        r"the target of bwd_hooks\[0\] must be an activation name.*got float 1.5",
    ),
    ("names-int", lambda lm: lm.run_with_cache(fresh(), names=5), r"names must be an activation name.*got int 5"),
    # what a hook function returns
    *[
        (f"returns-{what}", returning(fn), match)
        for what, fn, match in [
            (
                "meta",
                lambda h, hook: torch.empty_like(h, device="meta"),
                rf"{RESID}: a hook function returned a tensor on the meta device, which holds no values",
            ),
            (
                "long",
                lambda h, hook: h.long(),
                rf"{RESID}: a hook function returned a torch.int64 tensor; return floating-point values",
            ),
            (
                "bool",
                lambda h, hook: h > 0,
                rf"{RESID}: a hook function returned a torch.bool tensor; return floating-point values",
            ),
            (
                "complex",
                lambda h, hook: h.to(torch.complex64),
                rf"{RESID}: a hook function returned a torch.complex64 tensor",
            ),
        ]
    ],
    (
        "pattern-returns-meta",
        lambda lm: lm.run_with_hooks(
            fresh(), fwd_hooks=[("blocks.1.attn.hook_pattern", lambda h, hook: h.to("meta"))], positions="all"
        ),
        r"blocks.1.attn.hook_pattern: a hook function returned a tensor on the meta device",
    ),
    (
        "backward-returns-shape",
        lambda lm: backward(lm, lambda g, hook: g[:, :2]),
        r"blocks.1.hook_resid_pre: a backward hook function returned \(1, 2, 64\); return a tensor of the activation's shape \(1, 6, 64\)",
    ),
    (
        "backward-returns-long",
        lambda lm: backward(lm, lambda g, hook: g.long()),
        r"blocks.1.hook_resid_pre: a backward hook function returned a torch.int64 tensor",
    ),
    (
        "backward-returns-meta",
        lambda lm: backward(lm, lambda g, hook: g.to("meta")),
        r"blocks.1.hook_resid_pre: a backward hook function returned a tensor on the meta device",
    ),
    # wrt
    *[
        (f"wrt-{name}", by_wrt(w), match)
        for name, w, match in [
            ("int", 123, r"wrt must be 'durations', 'embeds', an activation name .*got int 123"),
            ("none", None, r"wrt must be 'durations', 'embeds', an activation name .*got NoneType None"),
            ("float", 1.5, r"wrt must be 'durations', 'embeds'.*got float 1.5"),
            ("int-in-list", ["durations", 7], r"wrt must be an activation name.*got int 7"),
        ]
    ],
    # the read-out
    *[
        (f"readout-{name}", by_readout(r), match)
        for name, r, match in [
            ("detached", lambda logits: log_p(logits).detach(), r"readout returned values without a gradient"),
            ("constant", lambda logits: torch.zeros(len(logits)), r"readout returned values without a gradient"),
            ("integer", lambda logits: logits.argmax(-1), r"readout returned a torch.int64 tensor"),
            ("boolean", lambda logits: logits[:, 0] > 0, r"readout returned a torch.bool tensor"),
            (
                "float",
                lambda logits: 0.5,
                r"readout must return one value per signal, a tensor of shape \(1,\); got float",
            ),
            ("list", lambda logits: [0.5], r"readout must return one value per signal.*got list"),
            ("not-callable", 5, r"readout must be a function of the logits .*got int 5"),
            ("none", None, r"readout must be a function of the logits .*got NoneType None"),
            ("string", "log_p", r"readout must be a function of the logits .*got str 'log_p'"),
        ]
    ],
]


def attribute(readout: Any) -> Case:
    from contllm.attribution import attribute

    return lambda lm: attribute(lm, fresh(), readout)


CASES += [
    (
        "attribute-readout-function",
        attribute(log_p),
        r"readout must be a contllm.attribution.Readout .*got function log_p",
    ),
    ("attribute-readout-none", attribute(None), r"readout must be a contllm.attribution.Readout .*got NoneType None"),
]


@pytest.mark.parametrize("call,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_argument_is_a_signal_error_naming_it(lm: ContinuousLM, call: Case, match: str) -> None:
    with pytest.raises(SignalError, match=match):
        call(lm)


def test_a_hook_returning_another_float_dtype_is_converted_to_the_values_dtype(lm: ContinuousLM) -> None:
    s = fresh()
    doubled = lm.run_with_hooks(s, fwd_hooks=[(RESID, lambda h, hook: h.double())])
    assert torch.equal(doubled, lm.run_with_hooks(s))

    def gradient_below(fn: Callable[[torch.Tensor, Any], Any]) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        hooks = [("blocks.1.hook_resid_pre", fn), ("blocks.0.hook_resid_pre", lambda g, hook: seen.append(g))]
        lm.run_with_hooks(s, bwd_hooks=hooks).sum().backward()
        return seen[0]

    below = gradient_below(lambda g, hook: g.double())
    assert below.dtype == torch.float32
    assert torch.equal(below, gradient_below(keep))


# ---------------------------------------------------------------------- signals edited in place

#: (id, in-place edit of a fresh signal, a regex of the SignalError every entry point raises)
EDITS: list[tuple[str, Callable[[Signal], Any], str]] = [
    ("duration-nan", lambda s: s.durations.__setitem__(1, float("nan")), r"durations must be finite; .*indices \[1\]"),
    ("duration-inf", lambda s: s.durations.__setitem__(2, float("inf")), r"durations must be finite; .*indices \[2\]"),
    ("duration-negative", lambda s: s.durations.__setitem__(1, -5.0), r"durations must be >= 0; .*indices \[1\]"),
    ("durations-all-negative", lambda s: s.durations.fill_(-5.0), r"durations must be >= 0"),
    ("durations-all-zero", lambda s: s.durations.zero_(), r"every token has duration 0: nothing to attend to"),
    ("duration-far", lambda s: s.durations.__setitem__(0, 2 * MAX_TIME), r"token 0 would sit at time 2e\+07"),
]

#: (id, a call of one entry point on a list of signals)
ENTRY_POINTS: list[tuple[str, Callable[[ContinuousLM, list[Signal]], Any]]] = [
    ("logits", lambda lm, items: lm.logits(items)),
    ("probs-all", lambda lm, items: lm.probs(items, positions="all")),
    ("engine", lambda lm, items: Engine(lm).logits(items)),
    ("planned-cost", lambda lm, items: Engine(lm).planned_cost(items)),
    ("run-with-cache", lambda lm, items: lm.run_with_cache(items, names=RESID)),
    ("run-with-hooks", lambda lm, items: lm.run_with_hooks(items, fwd_hooks=[(RESID, keep)])),
    ("run-with-hooks-grad", lambda lm, items: lm.run_with_hooks(items, grad=True)),
    ("hooks", lambda lm, items: entered(lm.hooks(items, [(RESID, keep)]))),
    ("gradients", lambda lm, items: lm.gradients(items, log_p)),
    ("forward-kwargs", lambda lm, items: lm.forward_kwargs(items)),
    ("generate", lambda lm, items: lm.generate(items, 2)),
]


@pytest.mark.parametrize("edit,match", [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
@pytest.mark.parametrize("call", [c[1] for c in ENTRY_POINTS], ids=[c[0] for c in ENTRY_POINTS])
def test_a_signal_edited_in_place_is_checked_again_by_every_entry_point(
    lm: ContinuousLM, call: Callable, edit: Callable[[Signal], Any], match: str
) -> None:
    plain, edited = fresh(), fresh()
    edit(edited)
    with pytest.raises(SignalError, match=rf"signals\[1\]: {match}"):
        call(lm, [plain, edited])


@pytest.mark.parametrize(
    "call",
    [
        lambda lm, s: lm.logits(s),
        lambda lm, s: lm.run_with_hooks(s),
        lambda lm, s: lm.generate(s, 1),
        lambda lm, s: lm.forward_kwargs(s),
        lambda lm, s: attribute_tokens(lm, s, Readout.tokens([1]), steps=2),
    ],
    ids=["logits", "run-with-hooks", "generate", "forward-kwargs", "attribute"],
)
def test_a_single_signal_edited_in_place_is_named_signal(lm: ContinuousLM, call: Callable) -> None:
    s = fresh()
    s.durations[1] = float("nan")
    with pytest.raises(
        SignalError, match=r"^signal: durations must be finite; non-finite values at token indices \[1\]$"
    ):
        call(lm, s)


def test_explicit_times_and_embeds_edited_in_place_are_checked_again(lm: ContinuousLM) -> None:
    at = fresh().with_times(torch.arange(N, dtype=torch.float64))
    assert at.explicit_times is not None
    at.explicit_times[2] = float("nan")
    with pytest.raises(SignalError, match=r"signal: times must be finite"):
        lm.logits(at)
    far = fresh().with_times(torch.arange(N, dtype=torch.float64))
    assert far.explicit_times is not None
    far.explicit_times[-1] = -1e30
    with pytest.raises(SignalError, match=r"signal: token 5 would sit at time -1e\+30"):
        lm.run_with_hooks(far)
    (embedded,) = lm.embed(fresh())
    given = Signal.from_embeds(embedded)
    assert given.embeds is not None
    given.embeds[0, 0] = float("inf")
    with pytest.raises(SignalError, match=r"signal: embeds contain NaN or infinite values"):
        lm.gradients(given, log_p)


def test_embedding_takes_a_signal_of_zero_durations_but_evaluating_it_does_not(lm: ContinuousLM) -> None:
    s = fresh()
    s.durations.zero_()
    (embeds,) = lm.embed(s)
    assert embeds.shape == (N, 64)
    with pytest.raises(SignalError, match="every token has duration 0"):
        lm.logits(s)


def test_evaluation_after_a_refused_edit_is_unchanged(lm: ContinuousLM) -> None:
    # The checks change nothing for a valid signal: the same numbers as before any edit.
    s = fresh()
    base = lm.logits(s)
    s.durations[1] = float("nan")
    with pytest.raises(SignalError):
        lm.logits(s)
    s.durations[1] = random_durations(N, 1)[1]
    assert torch.equal(lm.logits(s), base)


# ---------------------------------------------------------------------- copies share no tensor

#: (id, a signal -> a modified copy of it)
COPIES: list[tuple[str, Callable[[Signal], Signal]]] = [
    ("with-durations", lambda s: s.with_durations(s.durations * 2)),
    ("with-durations-same", lambda s: s.with_durations(s.durations)),
    ("with-times", lambda s: s.with_times(s.times + 1)),
    ("with-times-none", lambda s: s.with_times(None)),
    ("scale-tokens", lambda s: s.scale_tokens([1], 0.5)),
    ("split-token", lambda s: s.split_token(2, 2)),
    ("replace", lambda s: __import__("dataclasses").replace(s, start=-3.0)),
    (
        "from-ids",
        lambda s: Signal.from_ids(
            prompt(len(s)) if s.token_ids is None else s.token_ids, s.durations, times=s.explicit_times
        ),
    ),
    (
        "from-embeds",
        lambda s: Signal.from_embeds(torch.zeros(len(s), 64) if s.embeds is None else s.embeds, s.durations),
    ),
]


def editable(s: Signal) -> dict[str, torch.Tensor]:
    return {
        k: getattr(s, k) for k in ("durations", "token_ids", "embeds", "explicit_times") if getattr(s, k) is not None
    }


@pytest.mark.parametrize("kind", ["ids", "embeds", "explicit-times"])
@pytest.mark.parametrize("copy", [c[1] for c in COPIES], ids=[c[0] for c in COPIES])
def test_editing_a_copy_in_place_leaves_the_original_unchanged(
    lm: ContinuousLM, copy: Callable[[Signal], Signal], kind: str
) -> None:
    original = fresh()
    if kind == "embeds":
        original = Signal.from_embeds(lm.embed(original)[0], original.durations)
    elif kind == "explicit-times":
        original = original.with_times(original.times)
    before = {k: v.clone() for k, v in editable(original).items()}
    made = copy(original)
    for tensor in editable(made).values():
        if tensor.is_floating_point():
            tensor.add_(1.0)
        else:
            tensor.fill_(7)
    for name, tensor in editable(original).items():
        assert torch.equal(tensor, before[name]), f"editing the copy's {name} changed the original's"


def test_a_signal_keeps_its_own_copy_of_the_tensors_it_was_made_from() -> None:
    ids, durations, times = prompt(N, 1), random_durations(N, 1), torch.arange(N, dtype=torch.float64)
    s = Signal.from_ids(ids, durations, times=times)
    kept = (ids.clone(), durations.clone(), times.clone())
    ids.fill_(0)
    durations.fill_(float("nan"))
    times.fill_(float("nan"))
    assert s.token_ids is not None and s.explicit_times is not None
    assert torch.equal(s.token_ids, kept[0]) and torch.equal(s.durations, kept[1])
    assert torch.equal(s.explicit_times, kept[2])
