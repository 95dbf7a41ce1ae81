from collections.abc import Iterator

import openai
import pytest
import redis

from tests.integration.harness import running_titan
from tests.redis_server import redis_prefix, redis_server, redis_url

__all__ = ["redis_prefix", "redis_server", "redis_url", "shared_redis"]


@pytest.fixture
def shared_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test Redis database for Titan replicas to share, emptied of Titan's keys before and
    after (Titan's keys are not prefixed per test)."""
    monkeypatch.delenv("TITAN_STORAGE")  # the test-wide memory:// would override the config
    client = redis.Redis.from_url(redis_url)

    def forget() -> None:
        for key in client.scan_iter(match="titan:*"):
            client.delete(key)

    forget()
    yield redis_url
    forget()
    client.close()


# A module's Titan on its own ``CONFIG`` (tests/integration/test_n_and_beam.py, test_tool_calls.py),
# an SDK client on it and the model it serves; a module may define its own instead.
@pytest.fixture(scope="module")
def titan(request: pytest.FixtureRequest) -> Iterator[str]:
    with running_titan(request.module.CONFIG) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(titan: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{titan}/v1", api_key="none", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id
