"""A real Titan (uvicorn, simulated backend, auth on with a real key) for schemathesis, once per
module and storage: in-process memory, a SQLite file (the embedded default), and a real Redis
(its own database, emptied of Titan's keys before and after, so other tests' data is never
touched)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import redis
import schemathesis

from tests.integration.harness import running_titan
from tests.redis_server import redis_server
from titan.api.openapi import build_openapi_document
from titan.api.routes import all_routes

__all__ = ["redis_server"]

MASTER = "fuzz-master-key"
# The bounded run of `make test`: a few examples per operation, the same ones every run.
DEFAULT_EXAMPLES = 5
EXAMPLES_ENV = "TITAN_FUZZ_EXAMPLES"  # `make fuzz` raises it
SEED = 20261130
# Titan's Redis keys are not prefixed per test: the fuzzer gets a database of its own.
FUZZ_REDIS_DB = 12


def fuzz_config(storage: str) -> dict:
    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.0, "output_tokens": 3}}
    return {
        "models": [{"name": "sim", "deployments": [simulated]}],
        "probes": {"enabled": False},
        "storage": storage,
        "auth": {"master_key": MASTER, "key_cache_s": 0},
    }


def num_examples() -> int:
    raw = os.environ.get(EXAMPLES_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_EXAMPLES


def schemathesis_config(max_examples: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "suppress-health-check": ["all"],
            "generation": {
                "mode": "all",  # valid data, and data the schema says is invalid
                "max-examples": max_examples,
                "deterministic": True,
                "database": "none",  # no .hypothesis folder, nothing replayed across runs
            },
            "request-timeout": 30,
        }
    )


def titan_schema() -> schemathesis.BaseSchema:
    """Titan's OpenAPI document as schemathesis reads it (the base URL is given per call)."""
    document = build_openapi_document(all_routes())
    return schemathesis.openapi.from_dict(document, config=schemathesis_config(num_examples()))


def _forget_titan_keys(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match="titan:*", count=1000):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture(scope="module", params=["memory", "sqlite", "redis"])
def storage_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
        return
    if request.param == "sqlite":
        folder = request.getfixturevalue("tmp_path_factory").mktemp("fuzz-sqlite")
        yield f"sqlite:///{folder / 'titan.db'}"
        return
    url = f"{request.getfixturevalue('redis_server')}/{FUZZ_REDIS_DB}"
    _forget_titan_keys(url)
    yield url
    _forget_titan_keys(url)


@pytest.fixture(scope="module")
def titan(storage_url: str) -> Iterator[tuple[str, str]]:
    """(base URL, a tenant's API key) of a ready Titan with auth on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TITAN_STORAGE")  # the test-wide memory:// would override the config
        with running_titan(fuzz_config(storage_url)) as base_url:
            created = httpx.post(
                f"{base_url}/admin/keys",
                json={"tenant": "fuzz"},
                headers={"Authorization": f"Bearer {MASTER}"},
            )
            assert created.status_code == 201, created.text
            yield base_url, created.json()["key"]
