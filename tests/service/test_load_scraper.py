"""The scrape loop: jittered waits, failures counted and logged once, never the end of it."""

from __future__ import annotations

import asyncio
import logging
import random
import socket

import pytest

from tests.clock import ManualClock
from titan.config import DeploymentMetrics, LoadScrapeConfig, OpenAIDeployment
from titan.service.load_scraper import LoadScrapers, scrape_target


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_dead_server_is_counted_logged_once_and_scraped_again(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
):
    deployment = OpenAIDeployment(
        backend="openai", base_url=f"http://127.0.0.1:{closed_port()}/v1",
        metrics=DeploymentMetrics(),
    )  # fmt: skip
    config = LoadScrapeConfig(interval_s=0.5, jitter=0.2)
    target = scrape_target(deployment, "vllm-a", config, now=clock)
    assert target is not None
    waits: list[float] = []
    done = asyncio.Event()

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 4:
            done.set()
        await asyncio.sleep(0)

    scrapers = LoadScrapers([target], rng=random.Random(7), sleep=sleep)
    with caplog.at_level(logging.INFO, logger="titan.service.load_scraper"):
        scrapers.start()
        try:
            await asyncio.wait_for(done.wait(), timeout=10)
        finally:
            await scrapers.stop()
    assert target.tracker.num_failures >= 4 and target.tracker.current() is None
    assert "ClientConnectorError" in (target.tracker.last_error or "")
    assert len([r for r in caplog.records if "scrape failed" in r.message]) == 1
    assert all(0.4 <= wait <= 0.6 for wait in waits) and len(set(waits)) > 1
