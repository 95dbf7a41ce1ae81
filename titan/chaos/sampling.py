"""Titan's and the backends' state over the run, sampled every ``sample_every_s``: each
replica's ``/metrics`` (breaker states, retries, hedges, fallbacks: what Prometheus would
scrape) and ``/stats`` (breaker openings, which a scrape can miss when a breaker opens and
closes between two), and each simulated backend's ``/stats`` (requests, answers in service and
waiting). A process that does not answer is sampled as down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from titan.chaos.records import BackendSample, TitanSample

# titan_* counter families (without _total) -> the TitanSample counter they feed.
COUNTER_FAMILIES = {
    "titan_retries": "retries",
    "titan_hedges": "hedges",
    "titan_fallbacks": "fallbacks",
}
BREAKER_FAMILY = "titan_circuit_state"


def parse_metrics(text: str) -> tuple[dict[str, int], dict[str, float]]:
    """Breaker states by "model/deployment", and the counters summed over models."""
    states: dict[str, int] = {}
    counters = dict.fromkeys(COUNTER_FAMILIES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        if family.name == BREAKER_FAMILY:
            for sample in family.samples:
                key = f"{sample.labels.get('model', '')}/{sample.labels.get('deployment', '')}"
                states[key] = int(sample.value)
        elif family.name in COUNTER_FAMILIES:
            name = COUNTER_FAMILIES[family.name]
            counters[name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return states, counters


def breaker_openings(stats: Any) -> dict[str, int]:
    """From Titan's /stats: breaker openings by "model/deployment" since the replica started."""
    openings: dict[str, int] = {}
    if not isinstance(stats, dict):
        return openings
    for model, model_stats in (stats.get("models") or {}).items():
        for name, deployment in (model_stats.get("deployments") or {}).items():
            openings[f"{model}/{name}"] = int(deployment.get("breaker_openings", 0))
    return openings


class Sampler:
    """Samples until stopped; ``clock``: seconds on the timeline."""

    def __init__(
        self,
        replica_urls: Mapping[str, str],
        backend_urls: Mapping[str, str],
        clock: Callable[[], float],
        every_s: float,
        on_sample: Callable[[list[TitanSample]], None] = lambda samples: None,
    ):
        self.replica_urls = dict(replica_urls)
        self.backend_urls = dict(backend_urls)
        self.clock = clock
        self.every_s = every_s
        self.on_sample = on_sample
        self.titan: list[TitanSample] = []
        self.backends: list[BackendSample] = []
        self._timeout_s = max(0.2, min(1.0, every_s * 2))

    async def run(self, stop: asyncio.Event) -> None:
        """Samples at once, then every ``every_s``, and once more when ``stop`` is set."""
        limits = httpx.Limits(max_connections=4 * (len(self.replica_urls) + len(self.backend_urls)))
        async with httpx.AsyncClient(timeout=self._timeout_s, limits=limits) as client:
            while True:
                await self.sample_once(client)
                if stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every_s)

    async def sample_once(self, client: httpx.AsyncClient) -> None:
        at_s = self.clock()
        replicas = [
            self._replica(client, name, url, at_s) for name, url in self.replica_urls.items()
        ]
        backends = [
            self._backend(client, name, url, at_s) for name, url in self.backend_urls.items()
        ]
        titan = await asyncio.gather(*replicas)
        self.backends += await asyncio.gather(*backends)
        self.titan += titan
        self.on_sample(list(titan))

    async def _replica(
        self, client: httpx.AsyncClient, name: str, url: str, at_s: float
    ) -> TitanSample:
        try:
            metrics, stats = await asyncio.gather(
                client.get(f"{url}/metrics"), client.get(f"{url}/stats")
            )
        except httpx.HTTPError:
            return TitanSample(at_s, name, is_up=False)
        if metrics.status_code != 200 or stats.status_code != 200:
            return TitanSample(at_s, name, is_up=False)
        states, counters = parse_metrics(metrics.text)
        openings = breaker_openings(orjson.loads(stats.content))
        return TitanSample(at_s, name, True, states, openings, counters)

    async def _backend(
        self, client: httpx.AsyncClient, name: str, url: str, at_s: float
    ) -> BackendSample:
        try:
            response = await client.get(f"{url}/stats")
        except httpx.HTTPError:
            return BackendSample(at_s, name, is_up=False)
        if response.status_code != 200:
            return BackendSample(at_s, name, is_up=False)
        stats = orjson.loads(response.content)
        queued = int(stats.get("queued", 0))
        return BackendSample(
            at_s,
            name,
            True,
            int(stats.get("requests", 0)),
            num_busy=int(stats.get("active", 0)) - queued,
            num_queued=queued,
        )
