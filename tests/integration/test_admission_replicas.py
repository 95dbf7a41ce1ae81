"""Two Titan replicas sharing one Redis enforce one limit, not one each, and share their keys."""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, admission_config, chat, create_key, sim_model

pytestmark = pytest.mark.redis

RPM = 20


def test_two_replicas_admit_the_configured_limit_once(shared_redis: str):
    # A fresh model name: its limit buckets in Redis are new whatever earlier runs left.
    model = f"sim-{uuid.uuid4().hex[:8]}"
    config = admission_config(
        sim_model(model, limits={"rpm": RPM}), storage=shared_redis, auth={"master_key": MASTER}
    )
    with running_titan(config) as first, running_titan(config) as second:
        key = create_key(first, models=[model])  # made on one replica, used on both

        def send(index: int) -> int:
            return chat((first, second)[index % 2], key, model=model).status_code

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(send, range(3 * RPM)))
        elapsed = time.monotonic() - started

        admitted = statuses.count(200)
        # The bucket starts full (RPM) and refills RPM/60 a second while the burst lasts.
        assert RPM <= admitted <= RPM + int(elapsed * RPM / 60) + 1, (admitted, elapsed)
        assert statuses.count(429) == len(statuses) - admitted
        stats = [httpx.get(f"{url}/metrics").text for url in (first, second)]
        assert all(f'model="{model}"' in text for text in stats)  # both replicas served some
