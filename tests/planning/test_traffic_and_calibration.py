"""Length distributions, arrivals and traces; the step cost fit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from titan.planning.calibration import StepSample, fit_step_cost
from titan.planning.step_cost import LinearStepCost
from titan.planning.traffic import Arrivals, LengthDistribution, Traffic


@pytest.mark.parametrize(
    ("text", "kind", "mean"),
    [
        ("512", "fixed", 512),
        ("fixed:64", "fixed", 64),
        ("uniform:100,1000", "uniform", 550),
        ("normal:512,128", "normal", 512),
        ("lognormal:512,0.5", "lognormal", 512 * np.exp(0.125)),
        ("exponential:256", "exponential", 256),
    ],
)
def test_length_distributions(text: str, kind: str, mean: float):
    dist = LengthDistribution.parse(text)
    assert dist.kind == kind and dist.mean == pytest.approx(mean)
    assert LengthDistribution.parse(str(dist)) == dist
    values = dist.sample(np.random.default_rng(0), 20_000)
    assert values.min() >= 1 and values.dtype == np.int64
    assert values.mean() == pytest.approx(mean, rel=0.03)
    capped = dist.with_maximum(300).sample(np.random.default_rng(0), 1000)
    assert capped.max() <= 300


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("uniform:5", "takes 2 numbers"),
        ("lognormal:abc,1", "numbers expected"),
        ("zipf:1.2", "unknown distribution"),
        ("0", "must be >= 1"),
        ("uniform:10,5", "LOW <= HIGH"),
    ],
)
def test_bad_length_distributions(text: str, message: str):
    with pytest.raises(ValueError, match=message):
        LengthDistribution.parse(text)


def test_arrivals():
    rng = np.random.default_rng(1)
    poisson = np.diff(Arrivals(4.0).times(rng, 40_000))
    assert poisson.mean() == pytest.approx(0.25, rel=0.02)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.03)
    bursty = np.diff(Arrivals(4.0, cv=3.0).times(rng, 40_000))
    assert bursty.mean() == pytest.approx(0.25, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(3.0, rel=0.1)
    assert np.allclose(np.diff(Arrivals(2.0, cv=0).times(rng, 10)), 0.5)
    with pytest.raises(ValueError, match="rate must be > 0"):
        Arrivals(0.0)


def test_traces_are_reproducible_and_keep_the_shared_prefix():
    traffic = Traffic(
        Arrivals(2.0),
        LengthDistribution.parse("uniform:1,100"),
        LengthDistribution.parse("16"),
        shared_prefix_tokens=40,
    )
    first, again = traffic.trace(200, seed=5), traffic.trace(200, seed=5)
    assert first == again and first != traffic.trace(200, seed=6)
    assert min(r.num_prompt_tokens for r in first) == 41
    assert all(a.arrival_s < b.arrival_s for a, b in itertools.pairwise(first))


def test_fit_recovers_the_step_cost():
    truth = LinearStepCost(0.045, 0.0012, 9e-7, 0.0003)
    rng = np.random.default_rng(2)
    samples = []
    for _ in range(200):
        tokens, seqs = int(rng.integers(1, 512)), int(rng.integers(1, 32))
        pairs = int(rng.integers(tokens, 200_000))
        seconds = truth.seconds(tokens, seqs, pairs, pairs) * (1 + rng.normal(0, 0.002))
        samples.append(StepSample(tokens, seqs, pairs, pairs, seconds))
    fitted = fit_step_cost(samples)
    for name in ("fixed_s", "per_token_s", "per_pair_s", "per_seq_s"):
        assert getattr(fitted.cost, name) == pytest.approx(getattr(truth, name), rel=0.05)
    assert fitted.median_relative_error < 0.005 and fitted.num_samples == 200


def test_fit_keeps_coefficients_non_negative():
    # Time falls with the sequence count: the fit drops that term rather than go negative.
    samples = [
        StepSample(t, s, 0, 0, 0.01 + 0.001 * t - 0.0001 * s) for t in range(1, 40) for s in (1, 2)
    ]
    cost = fit_step_cost(samples).cost
    assert min(cost.fixed_s, cost.per_token_s, cost.per_pair_s, cost.per_seq_s) >= 0
    assert cost.per_seq_s == 0
    with pytest.raises(ValueError, match="at least 4"):
        fit_step_cost(samples[:2])


def test_cost_model_round_trip_and_validation():
    cost = LinearStepCost(0.04, 0.001, 1e-6, 2e-4, 1.1)
    assert LinearStepCost.from_dict(cost.to_dict()) == cost
    with pytest.raises(ValueError, match="unknown cost model keys"):
        LinearStepCost.from_dict({**cost.to_dict(), "extra": 1})
    with pytest.raises(ValueError, match=">= 0"):
        LinearStepCost.from_dict({"fixed_s": -1, "per_token_s": 0})
    with pytest.raises(ValueError, match="invalid cost model"):
        LinearStepCost.from_dict({"fixed_s": "soon", "per_token_s": 0})
