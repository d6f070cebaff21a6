"""The circuit experiment (contllm.experiments.circuit) on tiny random models: its shares hold what they claim."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from contllm import ContinuousLM, Signal
from contllm.core.families import decoder_layers, head_counts
from contllm.core.readout import TokenSets
from contllm.errors import ExperimentError
from contllm.experiments.circuit import (
    EXPERIMENT,
    CircuitConfig,
    CircuitRecord,
    CircuitResult,
    expected_count,
    find_circuit,
    parse_head,
)
from contllm.internals.activations import Patch, patch, run_with_cache
from tests.unit.tiny import prompt, tiny_model, tiny_model64

pytestmark = pytest.mark.unit

N_TOKENS = 9
SPAN = [3, 5]
DIGIT_IDS = TokenSets(tuple(str(k) for k in range(10)), tuple((10 + k,) for k in range(10)))


def tiny_signal() -> Signal:
    return Signal(
        durations=torch.ones(N_TOKENS, dtype=torch.float64),
        token_ids=prompt(N_TOKENS, 29),
        text="abcdefghi",
        offsets=tuple((i, i + 1) for i in range(N_TOKENS)),
    )


def circuit(lm: ContinuousLM, factor: float, top: int) -> CircuitRecord:
    config = CircuitConfig(factor=factor, top=top)
    return find_circuit(lm, "item", tiny_signal(), SPAN, 2, {}, config, DIGIT_IDS)


def bias_restored(lm: ContinuousLM, signal: Signal, factor: float) -> float:
    """E[k] of the short run with every head's duration bias at the span put back to log 1, by a hook function."""
    lift = -math.log(factor)

    def restore(bias: torch.Tensor, hook) -> torch.Tensor:
        bias = bias.clone()
        part = bias[..., SPAN]
        bias[..., SPAN] = torch.where(part > -1e30, part + lift, part)
        return bias

    short = signal.scale_tokens(SPAN, factor)
    logits = lm.run_with_hooks(short, fwd_hooks=[(lambda n: n.endswith("attn.hook_duration_bias"), restore)])
    return float(expected_count(logits, DIGIT_IDS))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_the_shares_are_what_they_say(family: str) -> None:
    lm = ContinuousLM(tiny_model(family))
    record = circuit(lm, 0.3, 4)
    signal = tiny_signal()
    short = signal.scale_tokens(SPAN, 0.3)
    change = record.plain - record.short
    # Every head's bias back to log 1 at the span is the plain durations at the short run's times.
    assert record.every_bias == pytest.approx((bias_restored(lm, signal, 0.3) - record.short) / change, abs=1e-4)
    assert record.shares[0] == pytest.approx(0.0, abs=1e-4)  # nothing patched: the short run
    assert record.patched[0] == pytest.approx(record.shares[1], abs=1e-6)  # the first head alone, twice
    # The first head patched through the toolkit's Patch (another path to the same edit) gives the same count.
    layer, head = parse_head(record.top[0])
    name = f"blocks.{layer}.attn.hook_z"
    cache = run_with_cache(lm, [signal, short], names=name, positions="all")
    mixed = cache.rows(name)[1].clone()
    mixed[:, head] = cache.rows(name)[0][:, head]
    with patch(lm, short, [Patch(name, [list(range(N_TOKENS))], [mixed])]):
        logits = run_with_cache(lm, short, names=name, positions="last").logits[0]
    assert (float(expected_count(logits, DIGIT_IDS)) - record.short) / change == pytest.approx(
        record.patched[0], abs=1e-4
    )
    assert record.x == [0.0, 1.0, 2.0, 3.0, 4.0] and np.allclose(np.sum(record.probs, axis=1), 1.0)
    assert record.half is None or record.shares[record.half] >= 0.5 > max(record.shares[: record.half], default=0)


def test_the_estimates_are_the_exact_shares_to_first_order() -> None:
    lm = ContinuousLM(tiny_model64("llama", "sdpa"))
    heads = len(decoder_layers(lm)) * head_counts(lm)[0]
    # At c = 0.99 the patched outputs and the restored biases move by about 1%: second-order terms are ~1% of the first.
    record = circuit(lm, 0.99, heads)
    exact = np.array(record.patched)
    estimated = np.array([record.estimate[parse_head(t)] for t in record.top])
    assert np.abs(estimated - exact).max() <= 0.03 * np.abs(exact).max()
    assert list(estimated) == sorted(estimated, reverse=True)  # the top heads come in the order of their estimates
    # Restoring every head's bias at once is, to first order, the sum of restoring each alone.
    assert record.bias_estimate.sum() == pytest.approx(record.every_bias, rel=0.03)


def test_tables_and_summary() -> None:
    estimate = np.array([[0.1, 0.6], [0.3, -0.1]])
    record = CircuitRecord(
        "count-001",
        0.5,
        [" apple"],
        3.0,
        2.0,
        0.8,
        0.2,
        estimate,
        -estimate,
        ["L0H1", "L1H0"],
        [0.55, 0.25],
        [0.0, 1.0, 2.0],
        [str(k) for k in range(10)],
        [[0.1] * 10] * 3,
        [0.0, 0.55, 0.7],
        1,
        2,
        {},
    )
    result = CircuitResult(experiment="circuit", model="tiny", config={"factor": 0.5}, records=[record])
    tables = EXPERIMENT.tables(result)
    rows = tables["results"][1]
    assert [(r["layer"], r["head"], r["estimate"], r["patched"], r["bias_estimate"]) for r in rows] == [
        (0, 0, 0.1, "", -0.1),
        (0, 1, 0.6, 0.55, -0.6),
        (1, 0, 0.3, 0.25, -0.3),
        (1, 1, -0.1, "", 0.1),
    ]
    assert [r["share"] for r in tables["patched"][1]] == [0.0, 0.55, 0.7]
    summary = EXPERIMENT.summary(result)
    assert summary["heads_for_half"] == 1 and summary["top_share"] == 0.7 and summary["mean_change"] == 1.0
    assert summary["strongest_head"] == "L0H1" and summary["strongest_bias_head"] == "L1H1"
    assert summary["estimate_correlation"] is None  # two heads: too few for a correlation
    assert CircuitRecord.from_dict(record.to_dict()).to_dict() == record.to_dict()


@pytest.mark.parametrize(
    "given, match",
    [
        ({"dataset": "boolean"}, "--dataset must be one of counting, events, sums"),
        ({"factor": 1.0}, "--factor must be a positive duration factor other than 1"),
        ({"factor": 0}, "--factor must be a positive"),
        ({"top": 0}, "--top must be an integer from 1 to 64"),
        ({"first": -1}, "--first must be an integer >= 0"),
    ],
)
def test_bad_options_are_refused(given: dict, match: str) -> None:
    with pytest.raises(ExperimentError, match=match):
        CircuitConfig(**given)


def test_the_audit_runs_circuit_over_the_whole_dataset_and_prices_it_from_small_probes() -> None:
    from contllm.audits.budget import Bounds
    from contllm.audits.studies import study

    s = study("circuit")
    assert s is EXPERIMENT.study and s.optional and not s.protocol and s.paper == ()
    # --first 0: every item of the dataset is a candidate (the default run takes 4), no --protocol.
    assert s.options("paper", 3) == {"first": "0"}
    assert len(EXPERIMENT.items(EXPERIMENT.config(s.options("contllm", 3)))) > 4
    assert s.probe_counts(Bounds(2, 16, 4, True)) == (1, 2)
    counting = study("counting")
    assert counting.options("paper", 3) == {"protocol": "paper"}
    assert counting.probe_counts(Bounds(4, 100, 10, False)) == (2, 6)
    assert counting.probe_counts(Bounds(1, 3, 3, False)) == (1, 3)


@pytest.mark.parametrize(
    ("half", "with_half", "opens", "reached"),
    [
        (2.0, 4, "A few heads carry the change in the count: 2.0 heads (mean) patched", ""),
        (5.5, 3, "Heads spread out carry the change in the count: 5.5 heads (mean) patched", " (on 3 of 4 items)"),
        (None, 0, "No few heads carry the change in the count", ""),
    ],
)
def test_the_circuit_finding_says_how_many_heads_carry_half(
    half: float | None, with_half: int, opens: str, reached: str
) -> None:
    from contllm.audits.studies import circuit_finding

    summary = {
        "heads_for_half": half,
        "items_with_half": with_half,
        "items": 4,
        "top": 8,
        "top_share": 0.9,
        "estimate_correlation": 0.75,
        "times_share": 0.6,
    }
    said = circuit_finding(summary, {})
    assert said.startswith(opens)
    assert (" (on " in said) == bool(reached) and reached in said
    assert "the 8 heads of largest estimate together bring back 90%" in said
    assert "r = 0.75" in said and "times alone bring back 60%" in said
