"""One chaos run, start to end: start the systems, warm Titan up, then on one timeline the load,
the faults and the sampling together; stop everything however it ends; judge the assertions.

The timeline's 0 is the start of the measured load; every time in the report counts from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

from titan.chaos.checks import Verdict, all_passed
from titan.chaos.faults import FaultTimeline, Occurrence, plan_actions
from titan.chaos.load_driver import LoadDriver, shares
from titan.chaos.records import OPEN, Observations, TitanSample
from titan.chaos.sampling import Sampler
from titan.chaos.scenario import Scenario
from titan.chaos.systems import ChaosSystems
from titan.chaos.verdicts import judge_all

PROGRESS_EVERY_S = 0.25
FINAL_STATS_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RunProgress:
    """What a progress display shows while the timeline runs."""

    elapsed_s: float
    duration_s: float
    num_requests: int
    num_failed: int
    active_faults: tuple[str, ...]
    open_breakers: tuple[str, ...]


class ProgressSink(Protocol):
    def phase(self, text: str) -> None: ...

    def event(self, text: str) -> None: ...

    def update(self, progress: RunProgress) -> None: ...


class SilentProgress:
    def phase(self, text: str) -> None:
        pass

    def event(self, text: str) -> None:
        pass

    def update(self, progress: RunProgress) -> None:
        pass


@dataclass
class ChaosResult:
    scenario: Scenario  # as run (scaled)
    source: str
    time_scale: float
    started_at: str
    wall_s: float
    observations: Observations
    occurrences: list[Occurrence]
    verdicts: list[Verdict]
    commands: dict[str, str]
    titan_configs: dict[str, Any]
    final_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all_passed(self.verdicts)


async def run_scenario(
    scenario: Scenario,
    *,
    source: str,
    time_scale: float,
    workspace: Path,
    progress: ProgressSink | None = None,
) -> ChaosResult:
    """``scenario`` is run as given (already scaled by ``time_scale``, which is only reported).
    Raises ``processes.ServiceError`` when a system would not start."""
    progress = progress or SilentProgress()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    wall_start = time.perf_counter()
    systems = ChaosSystems(scenario, workspace)
    try:
        progress.phase("starting the backends and Titan")
        await asyncio.to_thread(systems.start_all, progress.event)
        replicas = scenario.replica_names()
        if scenario.load.warmup_s > 0:
            progress.phase(f"warming up ({scenario.load.warmup_s:.1f} s)")
            warm_start = time.perf_counter()
            warmup = LoadDriver(
                scenario.load, systems.replica_urls, lambda: time.perf_counter() - warm_start
            )
            await warmup.run(
                shares(scenario.load, replicas, scenario.load.warmup_s, warmup=True), keep=False
            )
        progress.phase("running")
        seen, occurrences = await _timeline(scenario, systems, progress)
        final_stats = await _final_stats(systems)
    finally:
        progress.phase("stopping")
        await asyncio.to_thread(systems.stop_all)
    return ChaosResult(
        scenario=scenario,
        source=source,
        time_scale=time_scale,
        started_at=started_at,
        wall_s=time.perf_counter() - wall_start,
        observations=seen,
        occurrences=occurrences,
        verdicts=judge_all(scenario, seen, occurrences),
        commands=systems.commands(),
        titan_configs=systems.titan_configs,
        final_stats=final_stats,
    )


async def _timeline(
    scenario: Scenario, systems: ChaosSystems, progress: ProgressSink
) -> tuple[Observations, list[Occurrence]]:
    origin = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - origin

    actions, occurrences = plan_actions(scenario)
    faults = FaultTimeline(actions, systems, clock, on_event=progress.event)
    latest: dict[str, TitanSample] = {}

    def remember(samples: list[TitanSample]) -> None:
        latest.update({sample.replica: sample for sample in samples})

    sampler = Sampler(
        systems.replica_urls,
        systems.backend_urls,
        clock,
        scenario.report.sample_every_s,
        on_sample=remember,
    )
    driver = LoadDriver(scenario.load, systems.replica_urls, clock)
    stop = asyncio.Event()
    sampling = asyncio.ensure_future(sampler.run(stop))
    reporting = asyncio.ensure_future(
        _report_progress(progress, scenario, clock, driver, occurrences, latest)
    )
    faulting = asyncio.ensure_future(faults.run())
    try:
        await driver.run(shares(scenario.load, scenario.replica_names(), scenario.duration_s))
        await faulting  # a restart planned near the end may still be under way
    finally:
        faulting.cancel()
        reporting.cancel()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(sampling, reporting, faulting)
    records = sorted(driver.records, key=lambda record: record.sent_s)
    seen = Observations(scenario.duration_s, records, sampler.titan, sampler.backends)
    return seen, occurrences


async def _report_progress(
    progress: ProgressSink,
    scenario: Scenario,
    clock: Callable[[], float],
    driver: LoadDriver,
    occurrences: list[Occurrence],
    latest: dict[str, TitanSample],
) -> None:
    while True:
        now = clock()
        progress.update(
            RunProgress(
                elapsed_s=min(now, scenario.duration_s),
                duration_s=scenario.duration_s,
                num_requests=len(driver.records),
                num_failed=sum(not record.is_ok for record in driver.records),
                active_faults=tuple(sorted({o.fault_id for o in occurrences if _in_force(o, now)})),
                open_breakers=tuple(
                    sorted(
                        {
                            key
                            for sample in latest.values()
                            for key, state in sample.breaker_states.items()
                            if state == OPEN
                        }
                    )
                ),
            )
        )
        await asyncio.sleep(PROGRESS_EVERY_S)


def _in_force(occurrence: Occurrence, now: float) -> bool:
    if occurrence.started_s is None or occurrence.started_s > now:
        return False
    return occurrence.ended_s is None or now < occurrence.ended_s


async def _final_stats(systems: ChaosSystems) -> dict[str, Any]:
    """Every process's /stats at the end, for the report (what Titan and the backends counted)."""
    urls = {**systems.replica_urls, **systems.backend_urls}
    result: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=FINAL_STATS_TIMEOUT_S) as client:
        for name, url in urls.items():
            try:
                response = await client.get(f"{url}/stats")
                result[name] = orjson.loads(response.content)
            except (httpx.HTTPError, orjson.JSONDecodeError):
                result[name] = None
    return result
