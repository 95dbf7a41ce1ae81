"""/v1/agents/{agent_id}/state over real HTTP (uvicorn): status codes, ETag / If-Match, tenant
isolation by API key, and 50 concurrent If-Match PATCHes (retrying on 412) losing no update."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.integration import harness

pytestmark = pytest.mark.slow

CONFIG = {
    "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
    "probes": {"enabled": False},
}
MASTER_KEY = "test-master-key"


@pytest.fixture
def titan_url() -> Iterator[str]:
    with harness.running_titan(CONFIG) as url:
        yield url


@pytest.fixture
def titan_with_auth() -> Iterator[str]:
    with harness.running_titan({**CONFIG, "auth": {"master_key": MASTER_KEY}}) as url:
        yield url


def test_lifecycle_and_status_codes(titan_url: str):
    with httpx.Client(base_url=titan_url) as client:
        url = "/v1/agents/bot-1/state"
        assert client.get(url).status_code == 404
        created = client.put(url, json={"plan": ["a"], "step": 1})
        assert created.status_code == 201 and created.json() == {"plan": ["a"], "step": 1}
        etag = created.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"')
        got = client.get(url)
        assert got.status_code == 200 and got.headers["etag"] == etag
        patched = client.patch(url, json={"step": None, "done": True}, headers={"If-Match": etag})
        assert patched.status_code == 200 and patched.json() == {"plan": ["a"], "done": True}
        stale = client.put(url, json={}, headers={"If-Match": etag})
        assert stale.status_code == 412
        assert patched.headers["etag"] in stale.json()["error"]["message"]
        assert client.put(url, json={"x": 1}, headers={"If-Match": "*"}).status_code == 200
        assert client.put(url, content=b"[1]").status_code == 400
        assert client.patch(url, content=b"not json").status_code == 400
        assert client.put(url, json={}, params={"ttl_s": "soon"}).status_code == 400
        assert client.put("/v1/agents/bad%20id/state", json={}).status_code == 400
        too_big = client.put(url, json={"blob": "x" * 300_000})
        assert too_big.status_code == 413
        assert client.delete(url).status_code == 204
        assert client.delete(url).status_code == 404
        assert client.get(url).status_code == 404


def test_50_concurrent_if_match_patches_lose_no_update(titan_url: str):
    url = "/v1/agents/shared/state"

    async def patch_until_it_lands(client: httpx.AsyncClient, i: int) -> int:
        num_conflicts = 0
        while True:
            etag = (await client.get(url)).headers["etag"]
            answer = await client.patch(
                url, json={"seen": {f"w{i}": i}, f"field{i}": [i]}, headers={"If-Match": etag}
            )
            if answer.status_code == 200:
                return num_conflicts
            assert answer.status_code == 412, answer.text
            num_conflicts += 1

    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=titan_url, timeout=60) as client:
            assert (await client.put(url, json={"seen": {}})).status_code == 201
            return await asyncio.gather(*(patch_until_it_lands(client, i) for i in range(50)))

    conflicts = asyncio.run(run())
    state = httpx.get(f"{titan_url}{url}").json()
    assert state["seen"] == {f"w{i}": i for i in range(50)}
    assert all(state[f"field{i}"] == [i] for i in range(50))
    assert sum(conflicts) > 0  # they really raced


def test_tenants_are_isolated_by_api_key(titan_with_auth: str):
    with httpx.Client(base_url=titan_with_auth) as client:
        admin = {"Authorization": f"Bearer {MASTER_KEY}"}
        keys = {}
        for tenant in ("alpha", "beta"):
            made = client.post("/admin/keys", json={"tenant": tenant}, headers=admin)
            assert made.status_code == 201, made.text
            keys[tenant] = {"Authorization": f"Bearer {made.json()['key']}"}
        url = "/v1/agents/planner/state"
        assert client.get(url).status_code == 401  # auth is on: no key, no state
        assert client.put(url, json={"owner": "alpha"}, headers=keys["alpha"]).status_code == 201
        assert client.get(url, headers=keys["beta"]).status_code == 404
        assert client.delete(url, headers=keys["beta"]).status_code == 404
        assert client.patch(url, json={"x": 1}, headers=keys["beta"]).status_code == 201
        assert client.get(url, headers=keys["alpha"]).json() == {"owner": "alpha"}
        assert client.get(url, headers=keys["beta"]).json() == {"x": 1}
        bad = {"Authorization": "Bearer sk-nope"}
        assert client.get(url, headers=bad).status_code == 401
