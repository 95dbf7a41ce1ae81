"""Scrapes the model servers' Prometheus endpoints on a short jittered interval and keeps each
deployment's latest load (router/load_state.py) for routing and /stats.

One loop per URL: the deployments of a wildcard upstream (``*``) share their server's endpoint,
fetched once per round and read per model. Failures are counted and logged once per outage; they
never reach a request (routing just stops seeing fresh readings).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from titan.config import Deployment, LoadScrapeConfig, MetricNames, OpenAIDeployment
from titan.router.load_state import ReplicaLoadTracker
from titan.router.replica_load import metric_names, parse_exposition
from titan.router.windows import Clock

logger = logging.getLogger(__name__)

# A server's exposition past this is not read (vLLM's is ~100 KB with every histogram).
MAX_METRICS_BYTES = 8 * 1024**2


@dataclass(frozen=True)
class ScrapeTarget:
    deployment: str
    url: str
    names: MetricNames
    model_name: str | None  # only series with this model label (None: every series)
    headers: dict[str, str]
    config: LoadScrapeConfig
    tracker: ReplicaLoadTracker


def scrape_target(
    deployment: Deployment,
    name: str,
    config: LoadScrapeConfig,
    *,
    now: Clock,
    discovered_model: str | None = None,
) -> ScrapeTarget | None:
    """The target for an ``openai`` deployment with an enabled ``metrics`` block, else None.
    ``discovered_model``: the model a wildcard upstream listed, whose series are the ones read."""
    if not isinstance(deployment, OpenAIDeployment):
        return None
    metrics = deployment.metrics
    if metrics is None or not metrics.enabled:
        return None
    url = metrics.resolved_url(deployment.base_url)
    return ScrapeTarget(
        deployment=name,
        url=url,
        names=metric_names(metrics),
        model_name=metrics.model_name or discovered_model,
        headers=_credentials(deployment, url),
        config=config,
        tracker=ReplicaLoadTracker(url, stale_after_s=config.stale_after_s, now=now),
    )


def _credentials(deployment: OpenAIDeployment, url: str) -> dict[str, str]:
    """The deployment's headers and key, sent only to its own origin (a metrics URL elsewhere
    never sees them)."""
    if urlsplit(url)[:2] != urlsplit(deployment.base_url)[:2]:
        return {}
    headers = dict(deployment.headers)
    if deployment.api_key is not None:
        headers["Authorization"] = f"Bearer {deployment.api_key.get_secret_value()}"
    return headers


class LoadScrapers:
    """Every target's loop on one small connection pool, apart from the backends' pools (a
    saturated deployment's pool must not delay the reading that says it is saturated)."""

    def __init__(
        self,
        targets: list[ScrapeTarget],
        *,
        rng: random.Random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self._groups: dict[str, list[ScrapeTarget]] = {}
        for target in targets:
            self._groups.setdefault(target.url, []).append(target)
        self._rng = rng
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if not self._groups or self._tasks:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=len(self._groups) * 2)
        )
        self._tasks = [
            asyncio.create_task(self._run(url, group), name=f"scrape {url}")
            for url, group in self._groups.items()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _run(self, url: str, group: list[ScrapeTarget]) -> None:
        config = group[0].config
        while True:
            await self.scrape_once(url, group)
            factor = self._rng.uniform(1 - config.jitter, 1 + config.jitter)
            await self._sleep(config.interval_s * factor)

    async def scrape_once(self, url: str, group: list[ScrapeTarget]) -> None:
        """Fetch ``url`` once and record what each target reads there (or the failure)."""
        assert self._session is not None, "start() first"
        first = group[0]
        timeout = aiohttp.ClientTimeout(total=first.config.timeout_s)
        try:
            async with self._session.get(url, headers=first.headers, timeout=timeout) as reply:
                if reply.status != 200:
                    raise ValueError(f"HTTP {reply.status}")
                if (reply.content_length or 0) > MAX_METRICS_BYTES:
                    raise ValueError(f"{reply.content_length} bytes of metrics")
                body = await reply.read()
            text = body.decode("utf-8")
        except Exception as exc:  # connection, timeout, status, decoding: the loop goes on
            self._failed(group, exc)
            return
        for target in group:
            try:
                exposition = parse_exposition(text, target.names, target.model_name)
            except Exception as exc:  # not Prometheus text (ValueError, or worse)
                self._failed([target], exc)
                continue
            if target.tracker.last_error is not None:
                logger.info("metrics scrape works again",
                            extra={"deployment": target.deployment, "url": url})  # fmt: skip
            target.tracker.record(exposition)

    def _failed(self, group: list[ScrapeTarget], exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        for target in group:
            if target.tracker.record_failure(error):
                logger.warning(
                    "metrics scrape failed; quiet until it works again",
                    extra={"deployment": target.deployment, "url": target.url, "error": error},
                )
