"""The scenario's load through ``titan.loadgen``: split evenly over the Titan replicas
(clients spread over replicas, as behind a round-robin balancer with no health checks: a dead
replica's share fails) and over the load's models, one stage after another, each request
recorded on the timeline as it finishes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from titan.chaos.records import RequestRecord, record_of
from titan.chaos.scenario import LoadSpec
from titan.loadgen import ClosedLoop, LoadTarget, OpenLoop, Sample, run_load, workload_by_name


@dataclass(frozen=True)
class Share:
    """One stream of the load: a replica, a model, its arrivals, from ``start_s`` on."""

    replica: str
    model: str
    arrivals: ClosedLoop | OpenLoop
    start_s: float
    duration_s: float


def stages(load: LoadSpec, duration_s: float) -> list[tuple[float | None, int | None, float]]:
    """(rate, concurrency, duration) of each stage; a stage inherits the load's arrivals."""
    if not load.stages:
        return [(load.rate, load.concurrency, duration_s)]
    result = []
    for stage in load.stages:
        if stage.rate is None and stage.concurrency is None:
            result.append((load.rate, load.concurrency, stage.duration_s))
        else:
            result.append((stage.rate, stage.concurrency, stage.duration_s))
    return result


def shares(load: LoadSpec, replicas: list[str], duration_s: float, *, warmup: bool = False):
    """The stages, each split evenly over (replica, model) pairs. A closed loop's clients are
    dealt out one by one (a pair may get none: fewer clients than pairs). ``warmup``: the
    first stage's arrivals for ``duration_s``."""
    planned = stages(load, duration_s)
    if warmup:
        planned = [(planned[0][0], planned[0][1], duration_s)]
    pairs = list(itertools.product(replicas, load.models))
    result: list[Share] = []
    start_s = 0.0
    for stage_index, (rate, concurrency, stage_s) in enumerate(planned):
        for index, (replica, model) in enumerate(pairs):
            arrivals: ClosedLoop | OpenLoop | None = None
            if rate is not None:
                seed = load.seed + 1000 * stage_index + index + (500 if warmup else 0)
                arrivals = OpenLoop(rate / len(pairs), load.burstiness, seed)
            elif concurrency is not None:
                clients = concurrency // len(pairs) + (index < concurrency % len(pairs))
                arrivals = ClosedLoop(clients) if clients else None
            if arrivals is not None:
                result.append(Share(replica, model, arrivals, start_s, stage_s))
        start_s += stage_s
    return result


class LoadDriver:
    """Runs shares against the replicas; ``records`` fills up as requests finish."""

    def __init__(self, load: LoadSpec, replica_urls: Mapping[str, str], clock: Callable[[], float]):
        self.load = load
        self.replica_urls = dict(replica_urls)
        self.clock = clock
        self.records: list[RequestRecord] = []

    async def run(self, planned: list[Share], *, keep: bool = True) -> None:
        """Every share at its start (on ``clock``); ``keep``: record its requests (not for a
        warm-up)."""
        await asyncio.gather(*(self._run_share(share, keep) for share in planned))

    async def _run_share(self, share: Share, keep: bool) -> None:
        delay = share.start_s - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)
        load = self.load
        target = LoadTarget(f"{self.replica_urls[share.replica]}/v1", share.model, load.api_key)
        workload = workload_by_name(
            load.workload, seed=load.seed, max_tokens=load.max_tokens, stream=load.stream
        )
        # Where the load generator's clock starts on the timeline (its sent_s count from it).
        offset_s = self.clock()

        def on_sample(sample: Sample) -> None:
            if keep:
                self.records.append(record_of(sample, offset_s, share.model, share.replica))

        await run_load(
            target,
            share.arrivals,
            workload,
            duration_s=share.duration_s,
            timeout_s=load.timeout_s,
            on_sample=on_sample,
        )
