"""Generation in continuous time (contllm.generation) on the tiny random models of every family."""

from __future__ import annotations

import pytest
import torch

from contllm import ContinuousLM, Signal, SignalError
from tests.unit.tiny import FAMILY_NAMES, backends, prompt, tiny_model, tiny_tokenizer, word_llama

pytestmark = pytest.mark.unit


def lm_for(family: str, impl: str = "eager") -> ContinuousLM:
    return ContinuousLM(tiny_model(family, impl))


def stock_greedy(lm: ContinuousLM, ids: torch.Tensor, steps: int) -> list[int]:
    with torch.no_grad():
        out = lm.model.generate(
            ids[None],
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def full_forward_greedy(lm: ContinuousLM, signal: Signal, steps: int, duration: float) -> list[int]:
    """Greedy decoding without a cache: every step evaluates the whole signal, new tokens at ``duration``."""
    ids, durations, times = signal.token_ids.tolist(), signal.durations.tolist(), signal.times.tolist()
    out: list[int] = []
    for _ in range(steps):
        token = int(lm.logits(Signal.from_ids(ids, durations, times=times)).argmax())
        out.append(token)
        ids, durations, times = ids + [token], durations + [duration], times + [times[-1] + duration]
    return out


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_greedy_batch_equals_the_stock_generate_of_each_prompt(family: str) -> None:
    lm = lm_for(family, backends(family)[-1])
    prompts = [prompt(9, 9), prompt(5, 4)]
    got = lm.generate([Signal.from_ids(p) for p in prompts], 8)
    for ids, generation in zip(prompts, got):
        assert generation.token_ids == stock_greedy(lm, ids, 8)  # the stock loop also ends at EOS (id 2)
        ended = "eos" if generation.token_ids[-1] == 2 else "length"
        assert generation.stopped == ended and len(generation.steps) == len(generation.token_ids)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
@pytest.mark.parametrize("duration", [1.0, 0.5, 1.7])
def test_the_cache_path_equals_full_forwards_at_any_duration(family: str, duration: float) -> None:
    lm = lm_for(family)
    signal = Signal.from_ids(prompt(7, 3), torch.tensor([1.0, 0.5, 2.0, 1.0, 0.3, 1.0, 1.0]))
    got = lm.generate(signal, 6, duration=duration, stop_at_eos=False)
    assert got.token_ids == full_forward_greedy(lm, signal, 6, duration)
    assert got.signal.durations[-6:].tolist() == [duration] * 6
    assert got.signal.times[-6:].tolist() == pytest.approx([signal.end + duration * k for k in range(1, 7)])


def test_half_duration_changes_the_continuation() -> None:
    lm = lm_for("llama")
    signal = Signal.from_ids(prompt(9, 9))
    unit, half = lm.generate(signal, 12, stop_at_eos=False), lm.generate(signal, 12, duration=0.5, stop_at_eos=False)
    assert unit.token_ids != half.token_ids
    assert [s.time for s in half.steps] == [signal.end + 0.5 * k for k in range(1, 13)]


def test_durations_as_a_list_and_as_functions() -> None:
    lm = lm_for("qwen2")
    signal = Signal.from_ids(prompt(6, 2))
    listed = [0.5, 1.0, 1.5, 2.0, 0.25]
    by_list = lm.generate(signal, 5, duration=listed, stop_at_eos=False)
    by_step = lm.generate(signal, 5, duration=lambda k: listed[k], stop_at_eos=False)
    assert by_list.token_ids == by_step.token_ids
    assert by_list.signal.durations[-5:].tolist() == listed
    by_token = lm.generate(signal, 5, duration=lambda k, ids: 2.0 if ids[-1] % 2 else 0.5, stop_at_eos=False)
    assert [s.duration for s in by_token.steps] == [2.0 if t % 2 else 0.5 for t in by_token.token_ids]


def test_seeded_sampling_is_reproducible_and_rows_draw_from_seed_plus_row() -> None:
    lm = lm_for("llama")
    a, b = Signal.from_ids(prompt(9, 9)), Signal.from_ids(prompt(6, 1))
    options = {"sample": True, "temperature": 1.3, "top_k": 40, "top_p": 0.95, "stop_at_eos": False}
    first = lm.generate(a, 16, seed=7, **options).token_ids
    assert lm.generate(a, 16, seed=7, **options).token_ids == first
    assert lm.generate(a, 16, seed=8, **options).token_ids != first
    batch = lm.generate([a, b], 16, seed=7, **options)
    assert batch[0].token_ids == first
    assert batch[1].token_ids == lm.generate(b, 16, seed=8, **options).token_ids
    assert first != lm.generate(a, 16, stop_at_eos=False).token_ids  # sampling at 1.3 leaves the argmax path


def test_sampling_with_one_candidate_is_greedy() -> None:
    lm = lm_for("mistral")
    signal = Signal.from_ids(prompt(8, 5))
    greedy = lm.generate(signal, 10, stop_at_eos=False).token_ids
    assert lm.generate(signal, 10, sample=True, top_k=1, seed=0, stop_at_eos=False).token_ids == greedy
    assert lm.generate(signal, 10, sample=True, top_p=1e-6, seed=0, stop_at_eos=False).token_ids == greedy


def test_step_distributions_are_the_models_next_token_distributions() -> None:
    lm = lm_for("phi3")
    signal = Signal.from_ids(prompt(6, 8))
    got = lm.generate(signal, 4, duration=0.7, probs="full", stop_at_eos=False)
    top = lm.generate(signal, 4, duration=0.7, probs=5, stop_at_eos=False)
    for k, (step, short) in enumerate(zip(got.steps, top.steps)):
        prefix = Signal.from_ids(
            got.signal.token_ids[: len(signal) + k],
            got.signal.durations[: len(signal) + k],
            times=got.signal.times[: len(signal) + k],
        )
        expected = lm.probs(prefix)
        assert float((step.distribution - expected).abs().max()) <= 1e-5
        assert step.probability == pytest.approx(float(expected[step.token_id]), abs=1e-6)
        assert [i for i, _ in short.top] == torch.topk(expected, 5).indices.tolist()
        assert short.top[0][0] == step.token_id  # greedy picks the most likely token


def test_activations_are_read_where_each_step_was_predicted() -> None:
    lm = lm_for("llama")
    signal = Signal.from_ids(prompt(6, 8))
    name = "blocks.1.hook_resid_post"
    got = lm.generate(signal, 3, activations=name, stop_at_eos=False)
    assert got.activations is not None and got.activations.positions == [[5, 6, 7]]
    first = lm.run_with_cache(signal, names=name, positions="last")
    assert torch.allclose(got.activations.rows(name)[0][0], first.rows(name)[0][0], atol=1e-5)


def test_a_prompt_of_embeddings_continues_like_its_tokens() -> None:
    lm = lm_for("gemma")
    signal = Signal.from_ids(prompt(7, 6))
    embedded = Signal.from_embeds(lm.embed(signal)[0])
    by_ids, by_embeds = lm.generate(signal, 5, stop_at_eos=False), lm.generate(embedded, 5, stop_at_eos=False)
    assert by_ids.token_ids == by_embeds.token_ids
    assert by_embeds.signal.embeds is not None and len(by_embeds.signal) == 12


def test_eos_and_stop_strings_end_a_row_and_stay_in_it() -> None:
    lm = ContinuousLM(word_llama(3), tiny_tokenizer())
    signal = lm.signal("the cat sat on a mat")
    free = lm.generate(signal, 12, stop_at_eos=False)
    words = free.text.split()
    target = words[3]
    stopped = lm.generate(signal, 12, stop=target, stop_at_eos=False)
    assert stopped.stopped == "stop" and stopped.text.split() == words[: words.index(target) + 1]
    lm.model.generation_config.eos_token_id = free.token_ids[2]
    try:
        ended = lm.generate(signal, 12)
    finally:
        lm.model.generation_config.eos_token_id = 2
    cut = free.token_ids.index(free.token_ids[2]) + 1
    assert ended.stopped == "eos" and ended.token_ids == free.token_ids[:cut]
    assert free.signal.text == "the cat sat on a mat" + free.text
    assert free.signal.find(words[0], whole_word=False)  # the continued signal's text addresses new tokens


@pytest.mark.parametrize(
    "options,match",
    [
        ({"max_new_tokens": 10**9}, r"max_new_tokens is 1000000000, more than .*MAX_NEW_TOKENS = 4096"),
        ({"max_new_tokens": -1}, r"max_new_tokens must be an integer >= 0"),
        ({"stop_at_eos": "no"}, r"stop_at_eos must be True or False, got 'no'"),
        ({"duration": -0.5}, r"duration must be finite and >= 0"),
        ({"duration": [1.0, 2.0]}, r"duration lists 2 values for max_new_tokens = 3"),
        ({"duration": lambda a, b, c: 1.0}, r"takes \(step\) or \(step, token_ids\)"),
        ({"duration": lambda k: -1.0}, r"the duration of step 0 must be finite and >= 0"),
        ({"duration": "fast"}, r"duration must be a number"),
        ({"temperature": 0.7}, r"temperature applies only when sampling; pass sample=True"),
        ({"sample": True, "temperature": 0.0}, r"temperature must be finite and > 0"),
        ({"sample": True, "top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
        ({"sample": True, "top_k": 0}, r"top_k must be an integer >= 1"),
        ({"sample": "yes"}, r"sample must be True or False"),
        ({"probs": "some"}, r"probs must be None, 'full' or a number"),
        ({"stop": "x"}, r"stop strings need a tokenizer"),
        ({"activations": "blocks.9.hook_resid_post"}, r"activations must be activation names"),
        ({"temprature": 2.0}, r"unknown option\(s\) temprature; options: duration, sample, temperature"),
    ],
)
def test_bad_arguments_raise_before_the_model_runs(options: dict, match: str) -> None:
    lm = lm_for("llama")
    steps = options.pop("max_new_tokens", 3)
    with pytest.raises(SignalError, match=match):
        lm.generate(Signal.from_ids(prompt(5)), steps, **options)


def test_zero_new_tokens_return_the_prompt() -> None:
    lm = lm_for("llama")
    signal = Signal.from_ids(prompt(5))
    got = lm.generate(signal, 0)
    assert got.token_ids == [] and got.stopped == "none" and got.signal is signal
