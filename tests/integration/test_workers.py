"""``titan worker`` processes on a shared queue (SQLite file, and Redis: Streams consumer groups):
a worker killed with SIGKILL mid-job loses nothing — another worker takes the job when its
lease runs out, completes it, and its result is stored once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.harness import running_titan

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "A slow one"}], "max_tokens": 4}


def config(storage: str, workers: int) -> dict:
    return {
        "models": [{"name": "sim", "deployments": [
            {"backend": "simulated", "profile": {"ttft_s": 2.0, "output_tokens": 4}}]}],
        "probes": {"enabled": False},
        "storage": storage,
        "jobs": {"workers": workers, "lease_s": 1.5, "poll_s": 0.05},
    }  # fmt: skip


def start_worker(config_path: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TITAN_STORAGE"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "titan", "worker", "--config", str(config_path)],
            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def storage(request, tmp_path, monkeypatch) -> str:
    if request.param == "redis":
        return request.getfixturevalue("shared_redis")  # (it clears TITAN_STORAGE too)
    monkeypatch.delenv("TITAN_STORAGE", raising=False)
    return f"sqlite:///{tmp_path / 'titan.db'}"


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_nothing(storage: str, tmp_path: Path):
    config_path = tmp_path / "titan.yaml"
    config_path.write_text(yaml.safe_dump(config(storage, workers=2)))
    log = tmp_path / "workers.log"
    workers = [start_worker(config_path, log) for _ in range(2)]
    try:
        with (
            running_titan(config(storage, workers=0)) as titan,
            httpx.Client(base_url=titan) as client,
        ):
            ids = [client.post("/v1/jobs", json={"body": CHAT}).json()["id"] for _ in range(3)]
            deadline = time.monotonic() + 60
            running = []
            while not running and time.monotonic() < deadline:
                jobs = [client.get(f"/v1/jobs/{i}").json() for i in ids]
                running = [j for j in jobs if j["status"] == "running"]
                time.sleep(0.05)
            assert running, log.read_text()
            victim = running[0]
            pid = int(victim["worker"].split("-")[-2])  # host-pid-nonce
            assert pid in {w.pid for w in workers}
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                jobs = [client.get(f"/v1/jobs/{i}").json() for i in ids]
                if all(j["status"] == "succeeded" for j in jobs):
                    break
                time.sleep(0.1)
            assert all(j["status"] == "succeeded" for j in jobs), (jobs, log.read_text())
            taken_over = next(j for j in jobs if j["id"] == victim["id"])
            assert taken_over["attempts"] == 2  # the killed attempt, then the one that finished
            assert taken_over["result"]["choices"][0]["message"]["content"]
    finally:
        for process in workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in workers:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
