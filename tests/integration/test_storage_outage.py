"""Redis stopped under a running Titan and started again: no 500s, limits and the response cache
fail open, unknown keys fail closed (503 storage_unavailable), /ready says so, and everything
works again once Redis is back, without a restart."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, admission_config, create_key, sim_model
from tests.redis_server import HOST, START_TIMEOUT_S, answers_ping, free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class RedisProcess:
    """A private redis-server that can be stopped and started again on the same port, keeping its
    data in an append-only file (so the keys made before the outage exist after it)."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed")
        self.port = free_port()
        self.command = [
            binary, "--port", str(self.port), "--bind", HOST, "--dir", str(directory),
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers_ping(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server on {self.port} did not start ({self.process.poll()})")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisProcess]:
    monkeypatch.delenv("TITAN_STORAGE")  # the test-wide memory:// would override the config
    server = RedisProcess(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def ask(base_url: str, key: str, content: str = "Say hi.") -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/chat/completions",
        json={
            "model": "sim",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def wait_for(condition, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_redis_outage_fails_limits_and_cache_open_and_unknown_keys_closed(
    private_redis: RedisProcess,
):
    config = admission_config(
        sim_model(limits={"rpm": 1000, "max_concurrency": 8}),
        storage=private_redis.url,
        auth={"master_key": MASTER, "key_cache_s": 1},
        tenants={"acme": {"rpm": 1000, "budget": {"usd": 100}}},
        cache={"exact": True},
        admission={"ready_requires_storage": True},
    )
    with running_titan(config) as titan:
        known = create_key(titan, rpm=1000, max_concurrency=4)
        unknown = create_key(titan)  # never used here: not in this replica's key cache
        first = ask(titan, known)
        assert first.status_code == 200, first.text
        assert first.headers["x-titan-cache"] == "miss"
        assert ask(titan, known).headers["x-titan-cache"] == "hit-exact"

        private_redis.stop()
        time.sleep(1.1)  # past key_cache_s: the known key's lookup must go to the store

        served = [ask(titan, known, f"Question {i} during the outage.") for i in range(3)]
        assert [r.status_code for r in served] == [200] * 3, served[0].text
        assert served[0].headers["x-titan-cache"] == "miss"  # lookups skipped, never an error
        assert ask(titan, known).headers["x-titan-cache"] == "miss"  # its hit is unreachable too

        refused = ask(titan, unknown)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_unavailable"
        assert refused.headers["Retry-After"] == "1"

        ready = httpx.get(f"{titan}/ready")
        assert ready.status_code == 503
        assert ready.json()["status"] == "storage_unavailable"
        assert httpx.get(f"{titan}/health").status_code == 200
        metrics = httpx.get(f"{titan}/metrics").text
        for component in ("limits", "auth", "cache", "budget", "ready"):
            assert f'titan_storage_errors_total{{component="{component}"}}' in metrics, component

        private_redis.start()  # the same port and data
        wait_for(lambda: httpx.get(f"{titan}/ready").status_code == 200)
        back = ask(titan, unknown)
        assert back.status_code == 200, back.text
        assert ask(titan, known).headers["x-titan-cache"] == "hit-exact"
        after = ask(titan, known, "A new question after the outage.")
        assert after.status_code == 200
        assert "x-ratelimit-remaining-requests" in after.headers  # limits apply again


def test_fail_closed_limits_refuse_while_redis_is_down(private_redis: RedisProcess):
    config = admission_config(
        sim_model(limits={"rpm": 1000}),
        storage=private_redis.url,
        auth={"master_key": MASTER, "key_cache_s": 1},
        admission={"on_storage_error": "fail_closed"},
    )
    with running_titan(config) as titan:
        key = create_key(titan)
        assert ask(titan, key).status_code == 200
        private_redis.stop()
        refused = ask(titan, key)  # the key is still cached; its limits cannot be checked
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_unavailable"
        private_redis.start()
        wait_for(lambda: ask(titan, key).status_code == 200)
