"""Sweeps: the same workload at several rates (or concurrencies), one run after the other, and
the knee: the highest load whose SLO attainment is still at least 90%."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from titan.loadgen.arrivals import Arrivals, ClosedLoop, OpenLoop
from titan.loadgen.client import LoadTarget
from titan.loadgen.metrics import Slo, summarize
from titan.loadgen.runner import OnSample, new_event_loop, run_load
from titan.loadgen.workloads import Workload

MIN_ATTAINMENT = 0.9


@dataclass(frozen=True)
class SweepPoint:
    arrivals: ClosedLoop | OpenLoop
    summary: dict[str, Any]  # metrics.summarize's

    @property
    def load(self) -> float:
        """The rate or the concurrency."""
        return self.arrivals.load

    @property
    def attainment(self) -> float:
        return self.summary["slo_attainment"] or 0.0


def find_knee(
    points: Sequence[SweepPoint], min_attainment: float = MIN_ATTAINMENT
) -> SweepPoint | None:
    """The point of highest load whose SLO attainment is at least ``min_attainment``; None
    when none is."""
    passing = [point for point in points if point.attainment >= min_attainment]
    return max(passing, key=lambda point: point.load, default=None)


def parse_loads(text: str) -> list[float]:
    """``"1,2,4.5"`` -> [1.0, 2.0, 4.5], sorted; raises ValueError naming the bad item."""
    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number") from None
        if not value > 0:
            raise ValueError(f"{item!r} is not above 0")
        values.append(value)
    if not values:
        raise ValueError("the list is empty")
    return sorted(set(values))


def rate_points(rates: Sequence[float], burstiness: float = 1.0, seed: int = 0) -> list[OpenLoop]:
    return [OpenLoop(rate, burstiness, seed) for rate in rates]


def concurrency_points(concurrencies: Sequence[float]) -> list[ClosedLoop]:
    if any(value != int(value) for value in concurrencies):
        raise ValueError("concurrencies are whole numbers")
    return [ClosedLoop(int(value)) for value in concurrencies]


def run_sweep(
    target: LoadTarget,
    points: Sequence[Arrivals],
    workload: Workload,
    *,
    slo: Slo | None = None,
    on_point_start: Callable[[int, Arrivals], None] | None = None,
    on_point_done: Callable[[SweepPoint], None] | None = None,
    on_sample: OnSample | None = None,
    **options: Any,
) -> list[SweepPoint]:
    """One run per point, in order, on one event loop (uvloop where installed); ``options`` go
    to ``run_load`` (duration_s, num_requests, timeout_s, max_in_flight)."""
    done: list[SweepPoint] = []
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        for index, arrivals in enumerate(points):
            if on_point_start is not None:
                on_point_start(index, arrivals)
            run = runner.run(run_load(target, arrivals, workload, on_sample=on_sample, **options))
            point = SweepPoint(arrivals, summarize(run, slo))
            done.append(point)
            if on_point_done is not None:
                on_point_done(point)
    return done
