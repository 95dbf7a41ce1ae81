"""Arrival schedules: a closed loop's clients, an open loop's gamma-distributed gaps."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from titan.loadgen import ClosedLoop, OpenLoop

NUM_GAPS = 20_000


def gaps(arrivals: OpenLoop, count: int = NUM_GAPS) -> list[float]:
    offsets = [0.0, *itertools.islice(arrivals.offsets(), count)]
    return [later - earlier for earlier, later in itertools.pairwise(offsets)]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gaps_follow_the_gamma_distribution(burstiness: float):
    rate = 50.0
    sample = gaps(OpenLoop(rate, burstiness, seed=7))
    mean = statistics.fmean(sample)
    cv = statistics.stdev(sample) / mean
    # gamma(shape k, mean 1/rate): coefficient of variation 1/sqrt(k).
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert all(gap >= 0 for gap in sample)


def test_poisson_counts_per_second():
    rate = 200.0
    offsets = list(itertools.takewhile(lambda t: t < 50, OpenLoop(rate, seed=1).offsets()))
    assert len(offsets) / 50 == pytest.approx(rate, rel=0.03)
    assert offsets == sorted(offsets)


def test_same_seed_same_schedule_other_seed_another():
    first = list(itertools.islice(OpenLoop(10, 0.5, seed=3).offsets(), 100))
    assert first == list(itertools.islice(OpenLoop(10, 0.5, seed=3).offsets(), 100))
    assert first != list(itertools.islice(OpenLoop(10, 0.5, seed=4).offsets(), 100))


def test_infinite_rate_sends_everything_at_once():
    assert list(itertools.islice(OpenLoop(math.inf).offsets(), 5)) == [0.0] * 5
    assert OpenLoop(math.inf).describe() == "rate inf/s"


def test_descriptions_and_loads():
    assert OpenLoop(8, 0.5).describe() == "rate 8/s, burstiness 0.5"
    assert ClosedLoop(16).describe() == "concurrency 16"
    assert (OpenLoop(2.5).load, ClosedLoop(4).load) == (2.5, 4.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OpenLoop(0),
        lambda: OpenLoop(-1),
        lambda: OpenLoop(1, burstiness=0),
        lambda: OpenLoop(1, burstiness=math.inf),
        lambda: ClosedLoop(0),
    ],
)
def test_bad_arrivals_are_refused(make):
    with pytest.raises(ValueError):
        make()
