"""Bad input from the Python API: the toolkit's own error, naming the argument, never a deep torch error or NaN."""

from __future__ import annotations

import importlib.util
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import transformers as tf

import contllm
from contllm import ContinuousLM, ModelLoadError, Signal, SignalError, UnsupportedModelError
from contllm.core.engine import ContextLengthWarning
from contllm.core.signal import MAX_TIME
from tests.unit.tiny import VOCAB, prompt, random_durations, tiny_llama, tiny_lm, tiny_model, word_level_tokenizer

pytestmark = pytest.mark.unit

WORDS = ["<unk>", "how", "many", "apple", "are", "there", "?", "answer", ":"]
TEXT = "how many apple apple are there ? answer :"
APPLE = (9, 14)  # the first "apple"


@pytest.fixture(scope="module")
def lm() -> ContinuousLM:
    return tiny_lm("llama", word_level_tokenizer(WORDS), "eager")


@pytest.fixture(scope="module")
def s(lm: ContinuousLM) -> Signal:
    return lm.signal(TEXT)


Case = Callable[[ContinuousLM, Signal], Any]

#: (id, call, error type, a regex the message must match: it names the argument)
SIGNAL_CASES: list[tuple[str, Case, type[Exception], str]] = [
    # token ids outside the vocabulary, checked where the model is known
    ("id-huge", lambda lm, s: lm.probs(Signal.from_ids([10**9])), SignalError, r"token id 1000000000 .*vocabulary of 97"),
    ("id-negative", lambda lm, s: lm.probs(Signal.from_ids([-1, 3])), SignalError, r"token id -1 .*token_ids must lie in \[0, 97\)"),
    ("id-vocab", lambda lm, s: lm.logits(Signal.from_ids([5, VOCAB]), positions="all"), SignalError, r"token id 97 \(token 1\)"),
    ("id-in-batch", lambda lm, s: lm.probs([s, Signal.from_ids([5, 500])]), SignalError, r"signals\[1\]: token id 500"),
    ("id-embed", lambda lm, s: lm.embed(Signal.from_ids([500])), SignalError, r"token id 500"),
    ("id-generate", lambda lm, s: lm.generate(Signal.from_ids([3, 10**6]), 2), SignalError, r"token id 1000000"),
    ("ids-text", lambda lm, s: Signal.from_ids(["a", "b"]), SignalError, r"token_ids must be"),
    ("ids-string", lambda lm, s: Signal.from_ids("abc"), SignalError, r"token_ids must be"),
    ("ids-float", lambda lm, s: Signal.from_ids([1.5, 2.0]), SignalError, r"token_ids must be"),
    # embeddings
    ("embeds-width", lambda lm, s: lm.probs(Signal.from_embeds(torch.randn(3, 10))), SignalError, r"embeds are 10 wide.*hidden size is 64"),
    ("embeds-list", lambda lm, s: Signal.from_embeds([[0.0] * 64]), SignalError, r"embeds must be a torch.Tensor"),
    ("embeds-int", lambda lm, s: Signal.from_embeds(torch.ones(3, 64, dtype=torch.long)), SignalError, r"embeds must be a floating-point"),
    # positions
    ("positions-first", lambda lm, s: lm.probs(s, positions="first"), SignalError, r"positions must be .*'first'"),
    ("positions-float", lambda lm, s: lm.probs(s, positions=2.5), SignalError, r"positions must be .*2\.5"),
    ("positions-mixed", lambda lm, s: lm.probs(s, positions=[0, "x"]), SignalError, r"positions must be .*'x'"),
    ("positions-float-in-list", lambda lm, s: lm.logits(s, positions=[0, 1.5]), SignalError, r"positions must be .*1\.5"),
    ("positions-bool", lambda lm, s: lm.logits(s, positions=True), SignalError, r"positions must be"),
    ("positions-none", lambda lm, s: lm.logits(s, positions=None), SignalError, r"positions must be"),
    ("positions-range", lambda lm, s: lm.logits(s, positions=[0, 99]), SignalError, r"position 99 is outside a signal of 9"),
    ("positions-empty", lambda lm, s: lm.logits(s, positions=[]), SignalError, r"positions is an empty list"),
    # spans
    ("span-floats", lambda lm, s: s.scale((0.5, 3.2), 0.5), SignalError, r"character span is a pair of integer offsets .*0\.5, 3\.2"),
    ("span-float-in-list", lambda lm, s: s.scale([(0, 3), (4.0, 8)], 0.5), SignalError, r"character span is a pair of integer"),
    ("span-string", lambda lm, s: s.scale("apple", 0.5), SignalError, r"spans must be .*'apple'.*Signal.find"),
    ("span-int", lambda lm, s: s.scale(5, 0.5), SignalError, r"spans must be a \(start, end\) pair"),
    ("span-triple", lambda lm, s: s.delete([(0, 3, 5)]), SignalError, r"character span is a pair"),
    ("repeat-span-floats", lambda lm, s: s.repeat((9.0, 14.0), 2), SignalError, r"character span is a pair"),
    # duration factors, durations, times, start
    ("factor-string", lambda lm, s: s.scale(APPLE, "big"), SignalError, r"factor must be a number.*'big'"),
    ("factor-none", lambda lm, s: s.scale(APPLE, None), SignalError, r"factor must be a number"),
    ("factor-bool", lambda lm, s: s.scale_tokens([1], True), SignalError, r"factor must be a number"),
    ("factor-huge", lambda lm, s: s.scale(s.find("apple"), 1e300), SignalError, r"factor 1e\+300.*within \+-1e\+07"),
    ("durations-string", lambda lm, s: s.with_durations("abc"), SignalError, r"durations must be a 1-D sequence of numbers.*'abc'"),
    ("durations-mixed", lambda lm, s: s.with_durations([1.0, "x"] * 4 + [1.0]), SignalError, r"durations must be a 1-D sequence"),
    ("durations-huge", lambda lm, s: s.with_durations([1e300] * len(s)), SignalError, r"time 1e\+300.*within \+-1e\+07.*durations"),
    ("durations-overflow", lambda lm, s: s.with_durations([1e308] * len(s)), SignalError, r"within \+-1e\+07.*durations"),
    ("from-ids-durations", lambda lm, s: Signal.from_ids([1, 2], "ab"), SignalError, r"durations must be"),
    ("times-huge", lambda lm, s: s.with_times([1e300] * len(s)), SignalError, r"time 1e\+300.*times"),
    ("times-beyond", lambda lm, s: Signal.from_ids([1, 2, 3], times=[0.0, 1.0, 2e7]), SignalError, r"token 2 would sit at time 2e\+07.*times"),
    ("times-negative", lambda lm, s: Signal.from_ids([1, 2], times=[-1e9, 0.0]), SignalError, r"token 0 .*times must lie within"),
    ("times-string", lambda lm, s: s.with_times("abc"), SignalError, r"times must be a 1-D sequence"),
    ("start-string", lambda lm, s: Signal.from_ids([1, 2], start="x"), SignalError, r"start must be a number"),
    ("start-far", lambda lm, s: Signal.from_ids([1, 2], start=-5e7), SignalError, r"times must lie within.*start"),
    ("token-index-string", lambda lm, s: s.scale_tokens(["a"], 0.5), SignalError, r"token index must be an integer"),
    ("token-indices-int", lambda lm, s: s.scale_tokens(3, 0.5), SignalError, r"token indices must be a sequence"),
    ("needle", lambda lm, s: s.find(3), SignalError, r"needle must be a string"),
    # what is evaluated
    ("probs-text", lambda lm, s: lm.probs("text"), SignalError, r"signals must be a Signal or a list of them.*lm.signal"),
    ("logits-int", lambda lm, s: lm.logits(123), SignalError, r"signals must be a Signal or a list of them, got int"),
    ("probs-mixed", lambda lm, s: lm.probs([s, "x"]), SignalError, r"signals: item 1 is a str"),
    ("embed-text", lambda lm, s: lm.embed("text"), SignalError, r"signals must be a Signal"),
    ("batch-size", lambda lm, s: lm.logits(s, batch_size="2"), SignalError, r"batch_size"),
    ("generate-text", lambda lm, s: lm.generate("text"), SignalError, r"signal must be a Signal.*lm.signal"),
    ("generate-count", lambda lm, s: lm.generate(s, "5"), SignalError, r"max_new_tokens must be an integer"),
]


@pytest.mark.parametrize("call,error,match", [c[1:] for c in SIGNAL_CASES], ids=[c[0] for c in SIGNAL_CASES])
def test_bad_signal_input_is_named(lm: ContinuousLM, s: Signal, call: Case, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(lm, s)


#: (id, arguments of contllm.load, error type, regex). None of these reads a file: options are checked first.
MISSING = "/nonexistent/contllm-test-model"
LOAD_CASES: list[tuple[str, tuple, dict, type[Exception], str]] = [
    ("name-int", (123,), {}, ModelLoadError, r"name must be .*got int 123"),
    ("name-none", (None,), {}, ModelLoadError, r"name must be .*NoneType"),
    ("name-list", (["smollm2-135m"],), {}, ModelLoadError, r"name must be"),
    ("unknown-option", (MISSING,), {"precision": "bf16"}, ModelLoadError, r"unknown option\(s\) precision; options: device, dtype"),
    ("attn-flash", (MISSING,), {"attn_implementation": "flash_attention_2"}, UnsupportedModelError, r"attn_implementation='flash_attention_2'.*'eager', 'sdpa'"),
    ("attn-unknown", (MISSING,), {"attn_implementation": "fast"}, UnsupportedModelError, r"attn_implementation='fast'"),
    ("attn-int", (MISSING,), {"attn_implementation": 2}, ModelLoadError, r"attn_implementation must be a string"),
    ("dtype", (MISSING,), {"dtype": "int8"}, ModelLoadError, r"unsupported dtype 'int8'"),
    ("device", (MISSING,), {"device": "gpu-zero"}, ModelLoadError, r"unknown device 'gpu-zero'"),
    ("device-map", (MISSING,), {"device_map": "everywhere"}, ModelLoadError, r"unknown device_map 'everywhere'"),
    ("cache-dir", (MISSING,), {"cache_dir": 5}, ModelLoadError, r"cache_dir must be a directory path"),
    ("trust-remote-code", (MISSING,), {"trust_remote_code": "yes"}, ModelLoadError, r"trust_remote_code must be True or False"),
]


@pytest.mark.parametrize("args,options,error,match", [c[1:] for c in LOAD_CASES], ids=[c[0] for c in LOAD_CASES])
def test_bad_load_arguments_are_named_before_anything_is_read(args: tuple, options: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        contllm.load(*args, **options)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed here")
def test_flash_attention_without_the_package_says_so() -> None:
    with pytest.raises(UnsupportedModelError, match="needs the flash_attn package, which is not installed"):
        contllm.load("smollm2-135m", attn_implementation="flash_attention_2")


def test_wrong_type_for_every_argument_counts() -> None:
    assert len(SIGNAL_CASES) + len(LOAD_CASES) >= 25


# ---------------------------------------------------------------------- no silent NaN
@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s.scale(s.find("apple"), 1e300), id="scale-1e300"),
        pytest.param(lambda s: s.with_durations([1e300] * len(s)), id="durations-1e300"),
        pytest.param(lambda s: s.with_times([1e300] * len(s)), id="times-1e300"),
        pytest.param(lambda s: s.with_times(s.times + 1e20), id="times-1e20"),
        pytest.param(lambda s: s.scale(s.find("apple"), 1e6), id="scale-1e6"),
        pytest.param(lambda s: s.with_times(s.times).with_durations([1e300] * len(s)), id="explicit-times-1e300"),
        pytest.param(lambda s: s.with_times(s.times).with_durations([1e300, 1e-300] * 4 + [1.0]), id="mixed-extremes"),
        pytest.param(lambda s: s.with_times(s.times + (MAX_TIME - 10)), id="at-max-time"),
    ],
)
def test_extreme_durations_and_times_give_a_finite_result_or_a_signal_error(lm: ContinuousLM, s: Signal, edit: Callable) -> None:
    try:
        signal = edit(s)
    except SignalError as err:
        assert "1e+07" in str(err)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextLengthWarning)
        for positions in ("last", "all"):
            out = lm.probs(signal, positions=positions)
            assert torch.isfinite(out).all(), f"NaN or inf from {positions}"


def test_huge_durations_at_explicit_times_are_computed(lm: ContinuousLM, s: Signal) -> None:
    """Only log(d) reaches the model: scaling every duration by 1e300 changes nothing but rounding.

    The bias log(1e300) = 690.8 is added to the scores in float32 (spacing 6e-5 there),
    so the logits agree to that rounding, not to 1e-5.
    """
    at = s.with_times(s.times)
    base = lm.logits(at, positions="all")
    huge = lm.logits(at.with_durations(at.durations * 1e300), positions="all")
    tiny = lm.logits(at.with_durations(at.durations * 1e-300), positions="all")
    assert float((base - huge).abs().max()) <= 1e-3
    assert float((base - tiny).abs().max()) <= 1e-3


def test_a_huge_factor_inside_the_limit_is_finite_and_moves_the_output(lm: ContinuousLM, s: Signal) -> None:
    out = lm.probs([s, s.scale(s.find("apple"), 1e6)])
    assert torch.isfinite(out).all()
    assert float((out[0] - out[1]).abs().max()) > 1e-4


# ---------------------------------------------------------------------- nothing to attend to
def test_every_token_deleted_or_zero_raises(lm: ContinuousLM, s: Signal) -> None:
    every = s.delete([(0, len(TEXT))])
    assert float(every.durations.sum()) == 0.0
    for signal in (every, s.with_durations([0.0] * len(s))):
        with pytest.raises(SignalError, match="every token has duration 0: nothing to attend to"):
            lm.probs(signal)
        with pytest.raises(SignalError, match="every token has duration 0"):
            lm.generate(signal, 1)
    with pytest.raises(SignalError, match=r"signals\[1\]: every token has duration 0"):
        lm.probs([s, every])


def test_a_read_position_that_sees_only_zero_durations_raises(lm: ContinuousLM, s: Signal) -> None:
    first_deleted = s.delete((0, 3))  # "how": token 0, nothing before it
    with pytest.raises(SignalError, match=r"position 0 \(time -1\) sees no token of positive duration"):
        lm.logits(first_deleted, positions="all")
    # Every other position sees a token of positive duration and is read as usual, equal to
    # the signal without the deleted token (absence).
    kept = lm.logits(first_deleted, positions=list(range(1, len(s))))
    dropped = Signal.from_ids(s.token_ids[1:], times=s.times[1:])
    assert float((kept - lm.logits(dropped, positions="all")).abs().max()) <= 1e-5


# ---------------------------------------------------------------------- context length
def short_context_lm(limit: int = 16) -> ContinuousLM:
    return ContinuousLM(tiny_llama(max_position_embeddings=limit, attn_implementation="eager"))


def recorded(call: Callable[[], Any]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, ContextLengthWarning)]


def test_a_prompt_beyond_max_position_embeddings_warns_once_per_model() -> None:
    lm = short_context_lm(16)
    assert recorded(lambda: lm.logits(Signal.from_ids(prompt(16)))) == []  # times 0..15 fit
    first = recorded(lambda: lm.logits(Signal.from_ids(prompt(20))))
    assert len(first) == 1
    assert "20 tokens" in str(first[0].message) and "max_position_embeddings of 16" in str(first[0].message)
    assert recorded(lambda: lm.probs([Signal.from_ids(prompt(30))] * 2)) == []  # once per model, not per call
    assert recorded(lambda: lm.generate(Signal.from_ids(prompt(25)), 1)) == []
    # Another ContinuousLM on the same model does not warn again; another model does.
    assert recorded(lambda: ContinuousLM(lm.model).logits(Signal.from_ids(prompt(20)))) == []
    assert len(recorded(lambda: short_context_lm(16).generate(Signal.from_ids(prompt(20)), 1))) == 1


def test_a_stretched_prompt_beyond_max_position_embeddings_warns() -> None:
    lm = short_context_lm(16)
    stretched = Signal.from_ids(prompt(8), random_durations(8, 1, low=3.0, high=4.0))
    assert len(stretched) < 16 and stretched.end > 15
    caught = recorded(lambda: lm.logits(stretched))
    assert len(caught) == 1
    assert f"reaching time {stretched.end:g}" in str(caught[0].message)
    assert "16" in str(caught[0].message)


# ---------------------------------------------------------------------- what still works
def test_integer_like_arguments_of_other_types_are_taken(lm: ContinuousLM, s: Signal) -> None:
    base = lm.logits(s, positions=[0, 3])
    assert torch.equal(lm.logits(s, positions=np.array([0, 3])), base)
    assert torch.equal(lm.logits(s, positions=torch.tensor([0, 3])), base)
    assert torch.allclose(lm.logits(s, positions=np.int64(3)), base[1], atol=1e-6)
    a = s.scale([9, 14], np.float64(0.5))
    b = s.scale((np.int64(9), 14), torch.tensor(0.5))
    c = s.scale([(9, 14)], 0.5)
    assert torch.equal(a.durations, b.durations) and torch.equal(a.durations, c.durations)
    assert a.durations.tolist() == [1, 1, 0.5, 1, 1, 1, 1, 1, 1]


# ---------------------------------------------------------------------------- what ContinuousLM and load take


@pytest.mark.parametrize("model,match", [
    ("smollm2-135m", r"takes a loaded model, got the name 'smollm2-135m'; load one with contllm.load"),
    (None, "takes a transformers causal LM .* got NoneType"),
    (torch.nn.Linear(2, 2), "takes a transformers causal LM .* got Linear"),
])
def test_continuous_lm_names_what_it_takes(model: Any, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        ContinuousLM(model)


def test_a_model_on_the_meta_device_is_refused_when_wrapped() -> None:
    config = tiny_model("llama").config  # outside: tiny_model caches the model its first call builds
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(config)
    with pytest.raises(UnsupportedModelError, match="weights are on the meta device"):
        ContinuousLM(model)


@pytest.mark.parametrize("device", ["xla", "meta", "hpu"])
def test_a_device_that_cannot_hold_a_model_is_refused_before_anything_is_read(device: str) -> None:
    with pytest.raises(ModelLoadError, match=f"device '{device}' cannot hold a model"):
        contllm.load("/nonexistent/model", device=device)


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}", b"\xff" * 64])
def test_a_model_directory_with_bad_safetensors_is_a_load_error(tmp_path: Any, content: bytes) -> None:
    import json

    model = tiny_model("llama")
    model.config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(content)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ModelLoadError, match="not valid safetensors"):
        contllm.load(str(tmp_path), device="cpu")


@pytest.mark.parametrize("path", [123, None, b"runs/x", "", "  ", ["runs/x"], 1.5])
def test_load_run_of_something_that_is_no_path_is_the_toolkits_error(path: Any) -> None:
    from contllm.errors import RunDirectoryError
    from contllm.rundir.report import draw_figures, write_report

    with pytest.raises(RunDirectoryError, match="must be a path"):
        contllm.load_run(path)
    with pytest.raises(RunDirectoryError, match="must be a path"):
        draw_figures(path)
    with pytest.raises(RunDirectoryError, match="must be a path|must be a list of paths"):
        write_report([path], "report-never-written")
    assert not __import__("pathlib").Path("report-never-written").exists()


def test_generate_refuses_a_seed_or_a_time_past_what_it_can_hold(lm: ContinuousLM, s: Signal) -> None:
    with pytest.raises(SignalError, match="seed must be an integer from 0 to"):
        lm.generate(s, 2, sample=True, seed=2**64)
    with pytest.raises(SignalError, match=re.escape(f"past {MAX_TIME:g}")):
        lm.generate(s, 12, duration=1e6)
    late = s.with_times(s.times + (MAX_TIME - 5 - float(s.times[-1])))
    with pytest.raises(SignalError, match=re.escape(f"past {MAX_TIME:g}")):
        lm.generate(late, 3, duration=2.0)  # the prompt's end counts too
    assert len(lm.generate(s, 2, duration=1e6).token_ids) == 2
