"""Scored routing through the whole gateway (in process, simulated deployments): requests that
share a prefix stick to the deployment that served it, and load spreads once that deployment's
model server reports a long queue (its tracker fed directly, as the scraper would)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from titan.api import create_app
from titan.config import config_from_mapping
from titan.router.load_state import ReplicaLoadTracker
from titan.router.replica_load import Exposition

FAST = {"backend": "simulated", "profile": {"ttft_s": 0.001}}
TENANTS = {t: f"You are the assistant of tenant {t}. " + "Policy text. " * 160 for t in "ABC"}


def config() -> dict:
    deployments = [{**FAST, "name": name} for name in ("d0", "d1", "d2")]
    scored = {"debug_header": True, "tie_break": "first", "explain_last": 5}
    return {
        "models": [{"name": "m", "deployments": deployments}],
        "routing": {"policy": "scored", "scored": scored},
        "hedge": {"enabled": False},
        "probes": {"enabled": False},
        "storage": "memory://",
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app, started, and a client of it."""
    app = create_app(config_from_mapping(config(), "test"))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://titan.test") as client,
    ):
        await app.state.titan.start_task
        yield app, client


async def ask(client: httpx.AsyncClient, tenant: str, question: str) -> httpx.Response:
    messages = [
        {"role": "system", "content": TENANTS[tenant]},
        {"role": "user", "content": question},
    ]
    body = {"model": "m", "messages": messages, "max_tokens": 4}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


async def test_shared_prefixes_stick_and_load_spreads(served, clock):
    app, client = served
    homes: dict[str, Counter] = {t: Counter() for t in TENANTS}
    for i in range(6):
        for tenant in TENANTS:
            response = await ask(client, tenant, f"question {i}?")
            homes[tenant][response.headers["x-titan-deployment"]] += 1
    # Each tenant's prefix stays where its first request went.
    assert all(len(counts) == 1 for counts in homes.values()), homes
    home_a = next(iter(homes["A"]))
    response = await ask(client, "A", "one more?")
    route = response.headers["x-titan-route"]
    assert route.startswith(f"chosen={home_a}; ")
    assert f"{home_a}=total:" in route and "prefix:1," in route

    # A's deployment's server now reports a long queue: A's requests (and the others') leave it.
    pipeline = app.state.titan.pipeline
    deployment = next(d for d in pipeline._registry.models["m"].deployments if d.name == home_a)
    deployment.load = ReplicaLoadTracker("http://test/metrics", stale_after_s=3.0, now=clock)
    deployment.load.record(Exposition(waiting=40.0, running=8.0, kv_usage=0.9))
    moved = [(await ask(client, "A", f"busy {i}?")).headers["x-titan-deployment"] for i in range(4)]
    assert home_a not in moved and len(set(moved)) == 1  # and A's prefix sticks to its new home
    others = [(await ask(client, t, "busy?")).headers["x-titan-deployment"] for t in "BC"]
    assert home_a not in others
    response = await ask(client, "A", "still busy?")
    assert f"{home_a}=total:" in response.headers["x-titan-route"]
    assert "queue_length:48(server)" in response.headers["x-titan-route"]

    # The queue drains: both hold A's prefix now, either may serve it (latency decides).
    deployment.load.record(Exposition(waiting=0.0, running=0.0, kv_usage=0.1))
    response = await ask(client, "A", "quiet again?")
    assert response.headers["x-titan-deployment"] in (home_a, moved[0])
    route = response.headers["x-titan-route"]
    assert f"{home_a}=total:" in route and "queue_length:0(server)" in route

    stats = (await client.get("/stats")).json()["models"]["m"]["routing"]
    assert len(stats["recent"]) == 5  # explain_last
    last = stats["recent"][-1]
    assert last["chosen"] == response.headers["x-titan-deployment"]
    assert last["prompt_blocks"] >= 8
    candidates = {c["deployment"]: c for c in last["candidates"]}
    assert candidates[home_a]["queue_source"] == "server" and candidates[home_a]["kv"] == 0.9
    assert candidates[home_a]["prefix"] == candidates[moved[0]]["prefix"] == 1.0
    assert set(candidates) == {"d0", "d1", "d2"}
    assert all(count > 0 for count in stats["prefix_index_blocks"].values())


async def test_a_stream_carries_the_route_header_too(served):
    _, client = served
    body = {"model": "m", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": TENANTS["A"]}]}  # fmt: skip
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-titan-route"].startswith("chosen=d0; d0=total:")
        await response.aread()
