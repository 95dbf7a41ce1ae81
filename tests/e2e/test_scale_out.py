"""Scale-out end to end: two ``titan serve`` replicas and two ``titan worker`` processes on one
Redis, in front of two simulated backends (``titan simulate``), behind a round-robin balancer; a
load of chat requests and job submissions runs while replica A is killed with SIGKILL and
restarted.

The balancer is client-side and behaves as nginx does with a passive health check: a request
that cannot connect (nothing was sent) goes to the other replica and the one that refused is
left out until its ``/ready`` answers 200 again. What must hold:

- no job lost: every job a client submitted (retried on the other replica with its idempotency
  key when the answer was lost) ran once and succeeded, one job per idempotency key;
- limits exact across replicas: a key's requests/min bucket lives in Redis, so the requests
  admitted on both replicas together never pass the limit (plus its refill meanwhile), and every
  other attempt got a 429 — except requests that were on the killed replica, which may have
  taken a token before dying;
- client errors only for requests on replica A when it was killed (in flight, or sent to it
  before the balancer noticed it was gone) or answered "not ready" while it restarted.

See docs/scale-out.md. About 15 s on two cores (the restart takes 1.5 s of it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)
from titan.chaos.processes import Service, free_port, start, stop, titan_argv
from titan.limits.keys import KeyPolicy, KeyRing
from titan.storage import open_storage

pytestmark = [pytest.mark.slow, pytest.mark.redis]

REPO_ROOT = Path(__file__).resolve().parents[2]
RPM = 20  # the limited key's requests per minute
NUM_CLIENTS = 6
KILL_AFTER_S = 3.0
LOAD_S = 10.0
AFTER_RESTART_S = 2.0  # load kept on the restarted replica at least this long
READY_TIMEOUT_S = 40.0
REQUEST_TIMEOUT_S = 10.0
JOB_EVERY = 5  # one operation in JOB_EVERY submits a job
LIMITED_EVERY = 3  # of the chat requests, one in LIMITED_EVERY uses the limited key
UNSET = ("TITAN_STORAGE",)  # the tests' memory:// would override the shared storage


@pytest.fixture
def titan_redis(redis_url: str) -> Iterator[str]:  # noqa: F811
    """The test database, without Titan's keys before and after (replicas' keys start with
    ``titan:`` and are not prefixed per test), as tests/integration's ``shared_redis``."""
    client = redis.Redis.from_url(redis_url)

    def forget() -> None:
        for key in client.scan_iter(match="titan:*", count=1000):
            client.delete(key)

    forget()
    yield redis_url
    forget()
    client.close()


def write_config(path: Path, storage: str, backend_urls: list[str]) -> Path:
    config = {
        "models": [{"name": "sim", "deployments": [
            {"backend": "openai", "base_url": f"{url}/v1"} for url in backend_urls]}],
        "storage": storage,
        "probes": {"enabled": False},
        "cache": {"exact": False},  # every request is a model call and costs its limit
        # Replicas run no jobs: the two `titan worker` processes do.
        "jobs": {"workers": 0, "poll_s": 0.05, "lease_s": 5},
        "observability": {"log_requests": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


async def create_keys(storage: str) -> tuple[str, str]:
    """(a key limited to RPM requests a minute, an unlimited one), made in the shared storage
    before any replica starts, as `titan keys create --storage` does."""
    opened = await open_storage(storage)
    try:
        ring = KeyRing(opened.documents)
        limited, _ = await ring.create("limited", policy=KeyPolicy(rpm=RPM))
        free, _ = await ring.create("free")
        return limited, free
    finally:
        await opened.close()


def start_worker(name: str, config: Path, log_dir: Path) -> Service:
    """``titan worker`` has no HTTP port to wait on: started here, stopped by ``stop``."""
    argv = titan_argv("worker", "--config", str(config), "--concurrency", "8")
    service = Service(name, argv, "", log_dir / f"{name}.log")
    environ = {k: v for k, v in os.environ.items() if k not in UNSET}
    with service.log_path.open("wb") as log:
        service.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environ,
            cwd=REPO_ROOT, start_new_session=True,
        )  # fmt: skip
    return service


# ---- the balancer -----------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # "limited", "free" (chat requests) or "job"
    target: int  # the replica that answered, or failed (after a failover: the second one)
    started: float  # monotonic seconds, of the attempt on ``target``
    ended: float
    status: int | None = None  # None: a transport error
    error: str | None = None
    body: dict | None = None
    failed_over: bool = False


class Balancer:
    """Round robin over the replicas that are up. A connect error (nothing was sent) marks the
    replica down and sends the request to the next one; a down replica comes back when its
    ``/ready`` answers 200 (checked every 0.1 s). Other transport errors reach the client, as
    nginx answers 502 for a request whose upstream died mid-way."""

    def __init__(self, base_urls: list[str]):
        self.base_urls = base_urls
        self._turn = itertools.count()
        self._down: set[int] = set()
        self._lock = threading.Lock()
        # One connection per request: a pooled connection to the killed process would fail a
        # request sent after its restart.
        self._client = httpx.Client(
            timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._stopping = threading.Event()
        self._checker = threading.Thread(target=self._check_down, daemon=True)
        self._checker.start()

    def close(self) -> None:
        self._stopping.set()
        self._checker.join(timeout=5)
        self._client.close()

    def _pick(self) -> int:
        with self._lock:
            up = [i for i in range(len(self.base_urls)) if i not in self._down]
            turn = next(self._turn)
            return up[turn % len(up)] if up else turn % len(self.base_urls)

    def _check_down(self) -> None:
        while not self._stopping.wait(0.1):
            for index in list(self._down):
                try:
                    ready = self._client.get(f"{self.base_urls[index]}/ready", timeout=0.5)
                except httpx.TransportError:
                    continue
                if ready.status_code == 200:
                    with self._lock:
                        self._down.discard(index)

    def post(self, kind: str, path: str, key: str, body: dict) -> Outcome:
        target, failed_over = self._pick(), False
        headers = {"Authorization": f"Bearer {key}"}
        for _ in range(len(self.base_urls)):
            started = time.monotonic()
            try:
                answer = self._client.post(self.base_urls[target] + path, json=body,
                                           headers=headers)  # fmt: skip
            except httpx.ConnectError:
                with self._lock:
                    self._down.add(target)
                target, failed_over = (target + 1) % len(self.base_urls), True
                continue
            except httpx.TransportError as exc:
                error = f"{type(exc).__name__}: {exc}"
                return Outcome(kind, target, started, time.monotonic(), error=error,
                               failed_over=failed_over)  # fmt: skip
            try:
                answered = answer.json()
            except ValueError:
                answered = {"text": answer.text[:200]}
            return Outcome(kind, target, started, time.monotonic(), answer.status_code,
                           body=answered, failed_over=failed_over)  # fmt: skip
        return Outcome(kind, target, started, time.monotonic(), error="no replica accepted",
                       failed_over=failed_over)  # fmt: skip


# ---- the load ---------------------------------------------------------------------------------


@dataclass
class Load:
    balancer: Balancer
    limited_key: str
    free_key: str
    outcomes: list[Outcome]
    job_ids: dict[str, list[str]]  # idempotency key -> the job id of each answered submission
    stop: threading.Event

    def run_client(self, client: int) -> None:
        for step in itertools.count():
            if self.stop.is_set():
                return
            operation = step * NUM_CLIENTS + client
            if operation % JOB_EVERY == 0:
                self.submit_job(f"job-{client}-{step}")
            else:
                self.chat(operation)
            time.sleep(0.02)

    def chat(self, operation: int) -> None:
        kind = "limited" if operation % LIMITED_EVERY == 0 else "free"
        body = {"model": "sim", "max_tokens": 4,
                "messages": [{"role": "user", "content": f"request {operation}"}]}  # fmt: skip
        key = self.limited_key if kind == "limited" else self.free_key
        self.outcomes.append(self.balancer.post(kind, "/v1/chat/completions", key, body))

    def submit_job(self, idempotency_key: str) -> None:
        """Submitted until some replica answers: a lost answer is retried with the same
        idempotency key, which returns the job if the first submission was stored."""
        submission = {"idempotency_key": idempotency_key, "body": {
            "model": "sim", "max_tokens": 4,
            "messages": [{"role": "user", "content": f"job {idempotency_key}"}]}}  # fmt: skip
        answered = self.job_ids.setdefault(idempotency_key, [])
        for _ in range(5):
            outcome = self.balancer.post("job", "/v1/jobs", self.free_key, submission)
            self.outcomes.append(outcome)
            if outcome.status in (200, 202):
                answered.append(outcome.body["id"])  # type: ignore[index]
                return
            time.sleep(0.1)


# ---- the test ---------------------------------------------------------------------------------


def test_a_replica_killed_mid_load_loses_no_job_and_keeps_limits_exact(
    titan_redis: str, tmp_path: Path
):
    limited_key, free_key = asyncio.run(create_keys(titan_redis))
    backends = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    replicas = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    config = write_config(tmp_path / "titan.yaml", titan_redis, backends)
    services: list[Service] = []
    lock = threading.Lock()

    def launch(name: str, argv: list[str], base_url: str) -> Service:
        service = start(name, argv, base_url, tmp_path, ready_path=ready_path(name),
                        timeout_s=READY_TIMEOUT_S, unset_env=UNSET, cwd=REPO_ROOT)  # fmt: skip
        with lock:
            services.append(service)
        return service

    def ready_path(name: str) -> str:
        return "/health" if name.startswith("backend") else "/ready"

    def serve(index: int, name: str) -> Service:
        port = replicas[index].rsplit(":", 1)[1]
        return launch(name, titan_argv("serve", "--config", str(config), "--port", port),
                      replicas[index])  # fmt: skip

    try:
        with ThreadPoolExecutor(4) as pool:  # the six processes start together
            started = [
                pool.submit(launch, f"backend-{i}", titan_argv(
                    "simulate", "--port", url.rsplit(":", 1)[1], "--model", "sim"), url)
                for i, url in enumerate(backends)
            ] + [pool.submit(serve, i, f"replica-{'ab'[i]}") for i in range(2)]  # fmt: skip
            for index in range(2):
                worker = start_worker(f"worker-{index}", config, tmp_path)
                with lock:
                    services.append(worker)
            replica_a = started[2].result()
            for future in started:
                future.result()

        balancer = Balancer(replicas)
        load = Load(balancer, limited_key, free_key, [], {}, threading.Event())
        timeline: dict[str, float] = {}
        load_started = time.monotonic()
        with ThreadPoolExecutor(NUM_CLIENTS) as clients:
            running = [clients.submit(load.run_client, i) for i in range(NUM_CLIENTS)]
            try:
                time.sleep(KILL_AFTER_S)
                timeline["kill"] = time.monotonic()
                os.killpg(replica_a.pid, signal.SIGKILL)
                replica_a.process.wait()  # type: ignore[union-attr]
                timeline["restart"] = time.monotonic()
                serve(0, "replica-a-restarted")
                timeline["ready"] = time.monotonic()
                time.sleep(max(AFTER_RESTART_S, load_started + LOAD_S - time.monotonic()))
            finally:  # the clients stop however the kill and restart went
                load.stop.set()
            for client in running:
                client.result()
        balancer.close()

        check_jobs(replicas[1], free_key, load.job_ids)
        check_limit(load.outcomes)
        check_failures(load.outcomes, timeline)
        print(summary(load.outcomes, timeline, load_started))
    finally:
        with ThreadPoolExecutor(len(services) or 1) as pool:
            list(pool.map(stop, services))  # every process, even when the test failed
        for service in services:
            print(f"--- {service.name}: {service.log_tail()[-600:]}")


def check_jobs(base_url: str, key: str, job_ids: dict[str, list[str]]) -> None:
    """One job per idempotency key, each run once, all succeeded."""
    for idempotency_key, ids in job_ids.items():
        assert ids and len(set(ids)) == 1, (idempotency_key, ids)  # replays: the same job
    wanted = {ids[0] for ids in job_ids.values()}
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + 30
    while True:
        listed = httpx.get(f"{base_url}/v1/jobs", params={"limit": 1000}, headers=headers)
        jobs = listed.json()["data"]
        if all(job["status"] == "succeeded" for job in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not listed.json()["has_more"]
    assert {job["id"] for job in jobs} == wanted  # no job lost, none made twice
    unfinished = [job for job in jobs if job["status"] != "succeeded"]
    assert not unfinished, unfinished[:3]
    assert all(job["attempts"] == 1 for job in jobs)  # no worker died: each ran once
    assert all(job["result"]["choices"][0]["message"]["content"] for job in jobs)


def check_limit(outcomes: list[Outcome]) -> None:
    limited = [o for o in outcomes if o.kind == "limited"]
    admitted = sum(o.status == 200 for o in limited)
    refused = sum(o.status == 429 for o in limited)
    lost = sum(o.status is None for o in limited)  # on the killed replica: may have taken a token
    assert admitted + refused + lost == len(limited), [o.status for o in limited]
    # The bucket starts full (RPM) and refills RPM/60 a second while the load lasts.
    span = max(o.ended for o in limited) - min(o.started for o in limited)
    capacity = RPM + int(span * RPM / 60) + 1
    assert len(limited) > 2 * capacity  # the limit really bit
    assert RPM - lost <= admitted <= capacity, (admitted, lost, capacity)
    assert len(limited) - capacity - lost <= refused <= len(limited) - RPM


def check_failures(outcomes: list[Outcome], timeline: dict[str, float]) -> None:
    """Every answer is a success (or the limited key's 429); the rest were requests on replica
    A between its kill and its return."""
    for outcome in outcomes:
        expected = {"limited": {200, 429}, "free": {200}, "job": {200, 202}}[outcome.kind]
        if outcome.status in expected:
            continue
        on_a_while_gone = (
            outcome.target == 0
            and outcome.ended >= timeline["kill"]
            and outcome.started <= timeline["ready"]
        )
        # Not answered at all (killed in flight, or reset before the balancer saw it gone), or
        # 503 while the restarted process loaded (it listens before it is ready).
        assert on_a_while_gone and outcome.status in (None, 503), outcome


def summary(outcomes: list[Outcome], timeline: dict[str, float], load_started: float) -> str:
    at = {name: round(t - load_started, 2) for name, t in timeline.items()}
    counts: dict[str, int] = {}
    for o in outcomes:
        label = f"{o.kind}:{o.status or 'error'}:{'ab'[o.target]}{'*' if o.failed_over else ''}"
        counts[label] = counts.get(label, 0) + 1
    return f"timeline {at}; outcomes (kind:status:replica, * failed over) {sorted(counts.items())}"
