"""One storage setting for every command, as a user gives it: ``TITAN_STORAGE`` exported, no
flag. ``titan keys create`` must write where ``titan serve`` reads, so that the key it prints is
the one the servers enforce: on SQLite (one server) and on Redis (two replicas, one limit).

Real processes: ``titan serve`` replicas and ``titan keys create``, each started as a user
would, with nothing but the environment to say where the storage is.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)
from titan.chaos.processes import Services, free_port, titan_argv

pytestmark = pytest.mark.slow

RPM = 60
READY_TIMEOUT_S = 60.0
MESSAGES = [{"role": "user", "content": "hello"}]


def write_config(path: Path) -> Path:
    """A simulated model and nothing about storage: that comes from TITAN_STORAGE only."""
    config = {
        "models": [{"name": "sim", "deployments": [
            {"backend": "simulated", "profile": {"ttft_s": 0.001}}]}],
        "probes": {"enabled": False},
        "cache": {"exact": False},  # every request costs its limit
        "auth": {"key_cache_s": 0.5},
        "observability": {"log_requests": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def services() -> Iterator[Services]:
    group = Services()
    yield group
    group.stop_all()


def serve(services: Services, config: Path, storage: str, log_dir: Path) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = titan_argv("serve", "--config", str(config), "--port", str(port))
    services.start(
        f"titan-{port}", argv, url, log_dir, ready_path="/ready", timeout_s=READY_TIMEOUT_S,
        env={"TITAN_STORAGE": storage},
    )  # fmt: skip
    return url


def create_key(storage: str, home: Path) -> dict[str, str]:
    environ = {**os.environ, "TITAN_STORAGE": storage, "HOME": str(home)}
    argv = titan_argv("keys", "create", "--tenant", "acme", "--rpm", str(RPM), "--json")
    done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "(environment variable TITAN_STORAGE)" in done.stderr  # which store, and why
    return json.loads(done.stdout)


def chat(base_url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "sim", "messages": MESSAGES, "max_tokens": 4}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    return answer.status_code


def burst(urls: list[str], key: str, count: int) -> tuple[list[int], float]:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: chat(urls[i % len(urls)], key), range(count)))
    return statuses, time.monotonic() - started


def assert_one_limit(urls: list[str], key: str) -> None:
    """RPM at once, then one a second: across every replica together."""
    statuses, elapsed = burst(urls, key, RPM + 20)
    admitted = statuses.count(200)
    refill = int(elapsed * RPM / 60) + 1
    assert RPM <= admitted <= RPM + refill, (admitted, elapsed)
    assert statuses.count(429) == len(statuses) - admitted
    time.sleep(2.2)  # two tokens come back, not more
    statuses, _ = burst(urls, key, 5)
    assert 2 <= statuses.count(200) <= 3, statuses


def test_a_key_made_with_titan_storage_set_is_enforced_by_the_server_on_sqlite(
    tmp_path: Path, services: Services
):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    config = write_config(tmp_path / "titan.yaml")
    server = serve(services, config, storage, tmp_path)
    assert chat(server, None) == 200  # no key anywhere yet: auth is off

    # Another HOME: the key must not land in a default file that only looks right.
    created = create_key(storage, tmp_path / "elsewhere")
    assert created["store"] == storage
    assert not (tmp_path / "elsewhere" / ".local").exists()
    time.sleep(0.6)  # auth.key_cache_s: the server notices that keys exist
    body = {"model": "sim", "messages": MESSAGES}
    refused = httpx.post(f"{server}/v1/chat/completions", json=body)
    assert refused.status_code == 401
    message = refused.json()["error"]["message"]
    assert f"1 API key active in {storage}" in message and created["key_id"] not in message
    assert_one_limit([server], created["key"])


@pytest.mark.redis
def test_a_key_made_with_titan_storage_set_is_one_limit_across_two_replicas_on_redis(
    tmp_path: Path,
    services: Services,
    redis_url: str,  # noqa: F811
):
    client = redis.Redis.from_url(redis_url)
    for stale in client.scan_iter(match="titan:*"):  # replicas' keys are not prefixed per test
        client.delete(stale)
    config = write_config(tmp_path / "titan.yaml")
    replicas = [serve(services, config, redis_url, tmp_path) for _ in range(2)]
    created = create_key(redis_url, tmp_path)
    assert created["store"] == redis_url
    time.sleep(0.6)
    assert [chat(url, None) for url in replicas] == [401, 401]
    try:
        assert_one_limit(replicas, created["key"])
    finally:
        for stale in client.scan_iter(match="titan:*"):
            client.delete(stale)
        client.close()


def test_the_default_storage_of_keys_and_serve_is_the_same_file(tmp_path: Path):
    """Neither TITAN_STORAGE nor a flag: both commands resolve the same default path."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TITAN_")}
    environ["HOME"] = str(tmp_path)
    argv = titan_argv("keys", "create", "--tenant", "acme", "--json")
    done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = f"sqlite:///{tmp_path}/.local/share/titan/titan.db"
    assert json.loads(done.stdout)["store"] == expected and "(default)" in done.stderr
    check = subprocess.run(
        [sys.executable, "-m", "titan", "config", "check"],
        env=environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert f"storage: {expected}" in check.stdout
