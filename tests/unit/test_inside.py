"""The experiments inside the model (patching, lens, attention-mass): configs, records and the slope, without a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contllm import ExperimentError, registry
from contllm.experiments.attention_mass import EXPERIMENT as MASS
from contllm.experiments.attention_mass import MassRecord, log_odds_slopes
from contllm.experiments.inside import SweepInsideConfig, implied_counts
from contllm.experiments.lens import EXPERIMENT as LENS
from contllm.experiments.lens import LensRecord
from contllm.experiments.patching import EXPERIMENT as PATCHING
from contllm.experiments.patching import PatchingConfig, PatchRecord
from contllm.readout import TokenSets

pytestmark = pytest.mark.unit


def test_registered_under_their_names() -> None:
    for name, experiment in (("patching", PATCHING), ("lens", LENS), ("attention-mass", MASS)):
        assert registry.get(name) is experiment and experiment.engine and experiment.metrics


@pytest.mark.parametrize("given,match", [
    ({"factor": "1"}, "other than 1"),
    ({"factor": "-0.5"}, "positive"),
    ({"first": "-1"}, "--first"),
    ({"template": "no field here"}, "words"),
])
def test_patching_refuses_bad_options(given: dict[str, str], match: str) -> None:
    with pytest.raises(ExperimentError, match=match):
        PATCHING.config(given)


@pytest.mark.parametrize("given,match", [({"range": "0,1"}, "positive"), ({"range": "1,0.5"}, "larger"),
                                         ({"samples": "0"}, "samples")])
def test_sweeps_refuse_bad_options(given: dict[str, str], match: str) -> None:
    for experiment in (LENS, MASS):
        with pytest.raises(ExperimentError, match=match):
            experiment.config(given)


def test_defaults_are_small_and_include_factor_one() -> None:
    config = LENS.config({})
    assert isinstance(config, SweepInsideConfig) and config.first == 2
    assert np.isclose(config.factors(), 1.0).any() and len(config.factors()) == 7
    assert len(PATCHING.items(PATCHING.config({}))) == 2
    assert PATCHING.config({"heads": False}).heads is False


def test_a_head_that_only_takes_the_bias_has_slope_one_and_a_fixed_one_zero() -> None:
    factors = np.array([0.1, 0.3, 1.0, 2.0])
    odds = 0.2 / 0.8
    follows = factors * odds / (1 + factors * odds)
    mass = np.stack([follows, np.full(4, 0.2), factors**2 * odds / (1 + factors**2 * odds)], axis=-1)
    assert np.allclose(log_odds_slopes(factors, mass), [1.0, 0.0, 2.0])


def test_implied_count_is_the_expectation_over_the_digits() -> None:
    sets = TokenSets(tuple(str(k) for k in range(10)), tuple((k,) for k in range(10)))
    logits = torch.full((2, 12), -1e9)
    logits[0, 3] = 0.0
    logits[1, 2] = logits[1, 4] = 0.0
    logits[1, 11] = 0.0  # a non-digit token: renormalised away
    counts, probs = implied_counts(logits, sets)
    assert np.allclose(counts, [3.0, 3.0]) and probs.shape == (2, 10)


def test_records_round_trip() -> None:
    patched = PatchRecord("count-001", 0.5, [5, 6], ["a", " b"], 3.0, 2.0, [0.1] * 10, [0.1] * 10,
                          np.array([[0.0, 0.5]]), np.array([[0.25]]), 0.0, 0.0, 2, {"word": "a"})
    assert PatchRecord.from_dict(patched.to_dict()).to_dict() == patched.to_dict()
    lens = LensRecord("count-001", np.array([0.5, 1.0]), np.ones((3, 2)), np.ones((3, 2), dtype=int), 1e-7, 2)
    assert LensRecord.from_dict(lens.to_dict()).to_dict() == lens.to_dict()
    mass = MassRecord("count-001", np.array([0.5, 1.0]), np.ones((2, 3, 4)) / 4, np.ones((3, 4)), [4, 5], 2)
    assert MassRecord.from_dict(mass.to_dict()).to_dict() == mass.to_dict()
    with pytest.raises(ExperimentError, match="malformed"):
        PatchRecord.from_dict({"item_id": "x"})
    assert isinstance(PATCHING.config({"factor": "0.25"}), PatchingConfig)
