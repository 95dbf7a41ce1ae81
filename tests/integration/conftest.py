from collections.abc import Iterator

import pytest
import redis

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
