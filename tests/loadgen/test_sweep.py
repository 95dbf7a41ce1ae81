"""Sweeps and their knee: the knee function on made-up points, then a sweep against a backend
of known capacity finds the known knee."""

from __future__ import annotations

import pytest

from tests.loadgen.servers import CapacityBackend, serving
from titan.loadgen import (
    ClosedLoop,
    LoadTarget,
    OpenLoop,
    Slo,
    SweepPoint,
    find_knee,
    run_sweep,
    workload_by_name,
)
from titan.loadgen.sweep import concurrency_points, parse_loads, rate_points


def point(load: float, attainment: float | None) -> SweepPoint:
    return SweepPoint(OpenLoop(load), {"slo_attainment": attainment, "goodput": 0.0})


def test_the_knee_is_the_highest_load_at_or_above_90_percent():
    points = [point(1, 1.0), point(2, 0.97), point(4, 0.9), point(8, 0.89), point(16, 0.2)]
    assert find_knee(points).load == 4  # 0.9 itself counts
    assert find_knee(list(reversed(points))).load == 4  # order does not matter
    assert find_knee(points, min_attainment=0.95).load == 2


def test_no_knee_when_no_load_attains_the_slo():
    assert find_knee([point(1, 0.5), point(2, None)]) is None
    assert find_knee([]) is None


def test_the_highest_passing_load_wins_even_after_a_dip():
    # The definition: the highest load with ≥ 90%, not the last before the first miss.
    assert find_knee([point(1, 1.0), point(2, 0.8), point(4, 0.95)]).load == 4


def test_sweep_lists():
    assert parse_loads("8, 1,2,2") == [1.0, 2.0, 8.0]
    for bad, message in (("1,x", "'x' is not a number"), ("0,1", "'0' is not above 0")):
        with pytest.raises(ValueError, match=message):
            parse_loads(bad)
    assert rate_points([1, 2], 0.5, 3) == [OpenLoop(1, 0.5, 3), OpenLoop(2, 0.5, 3)]
    assert concurrency_points([1.0, 4.0]) == [ClosedLoop(1), ClosedLoop(4)]
    with pytest.raises(ValueError, match="whole numbers"):
        concurrency_points([1.5])


# 4 requests at a time, 50 ms each: up to 4 clients a request takes 50 ms; 8 clients wait a
# whole service time more (100 ms), past an end-to-end SLO of 75 ms.
CAPACITY, SERVICE_S, SLO = 4, 0.05, Slo(e2e_s=0.075)


@pytest.mark.slow
def test_a_concurrency_sweep_finds_the_backends_capacity():
    started, done = [], []
    with serving(CapacityBackend(CAPACITY, SERVICE_S), lifespan="off") as url:
        points = run_sweep(
            LoadTarget(url, "capped"),
            concurrency_points([1, 2, 4, 8, 16]),
            workload_by_name("chat", stream=False),
            slo=SLO,
            duration_s=0.6,
            on_point_start=lambda index, arrivals: started.append(arrivals.load),
            on_point_done=done.append,
        )
    assert started == [1, 2, 4, 8, 16] and done == points
    attainments = [p.attainment for p in points]
    assert min(attainments[:3]) >= 0.95 and max(attainments[3:]) < 0.2, attainments
    assert find_knee(points).load == CAPACITY
    # Throughput saturates at capacity / service time = 80 requests/s.
    assert points[-1].summary["request_throughput"] == pytest.approx(80, rel=0.15)


@pytest.mark.slow
def test_a_rate_sweep_finds_the_knee_below_capacity():
    with serving(CapacityBackend(CAPACITY, SERVICE_S), lifespan="off") as url:
        points = run_sweep(
            LoadTarget(url, "capped"),
            rate_points([10, 20, 200], seed=4),
            workload_by_name("chat", stream=False),
            slo=SLO,
            duration_s=0.6,
        )
    # 200/s is 2.5× what the backend serves: its queue grows for the whole run.
    assert [p.attainment >= 0.9 for p in points] == [True, True, False]
    assert find_knee(points).load == 20
