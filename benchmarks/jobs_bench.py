"""``python -m benchmarks jobs``: what the durable job queue runs per second, and what a big batch
costs the interactive traffic beside it.

(1) Throughput, in-process, per storage (SQLite, Redis): a fresh pipeline, a zero-latency
simulated model, in-process workers, the cache off; N jobs submitted through
``JobsService.submit``, timed from the first submit until ``queue.counts()`` shows all final.
Baseline: the same requests through ``JobsService.execute`` (a job attempt's ClientRequest, then
``pipeline.complete``), as many at once as there are workers, no queue. (2) Interactive latency:
``titan serve`` under a closed-loop interactive load, alone (A), then while a batch runs (B).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from titan.loadgen.metrics import percentile
from titan.storage.base import FINAL_JOB_STATES, Job

MODEL = "sim"
TENANT = ""  # the tenant of every caller while auth is off
CHAT_PATH = "/v1/chat/completions"
COUNTS_POLL_S = 0.02  # how often the throughput phase reads queue.counts()
Progress = Callable[[str], None]


@dataclass(frozen=True)
class JobsBenchSettings:
    # (1) throughput
    jobs: int = 5_000  # per storage mode
    workers: int = 32  # jobs.workers; also the direct baseline's concurrency
    poll_s: float = 0.05  # jobs.poll_s
    submitters: int = 4  # concurrent tasks calling JobsService.submit
    warmup: int = 20  # untimed requests (direct) or jobs (queue) on each fresh pipeline first
    timeout_s: float = 300.0  # a queue run that has not finished by then is reported as such
    redis_url: str | None = "redis://127.0.0.1:6379"  # None: no Redis mode
    # (2) interactive latency
    clients: int = 4  # closed-loop interactive clients
    duration_s: float = 15.0  # per phase: a 10,000-job batch (~500/s here) outlasts it
    batch_jobs: int = 10_000
    serve_workers: int = 16  # jobs.workers of titan serve
    ttft_s: float = 0.02  # the simulated model of titan serve
    output_tokens: int = 8
    interactive_warmup: int = 20  # untimed interactive requests before phase A
    batch_poll_s: float = 0.5  # how often phase B reads the batch's request_counts
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> JobsBenchSettings:
        """A smoke run of every phase (the test's)."""
        settings = cls(jobs=300, duration_s=5.0, batch_jobs=500, timeout_s=60.0, is_quick=True)
        return replace(settings, **overrides)

    @property
    def modes(self) -> tuple[str, ...]:
        return ("sqlite", "redis") if self.redis_url else ("sqlite",)


def chat_body(text: str, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens}  # fmt: skip


def latency_stats(seconds: Sequence[float]) -> dict[str, float | None]:
    ms = [1e3 * s for s in seconds]
    if not ms:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms)}  # fmt: skip


# ---- (1) throughput ------------------------------------------------------------------------


def pipeline_config(storage: str, workers: int, poll_s: float | None = None,
                    profile: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The throughput phase's: a zero-latency model (``profile`` for titan serve's)."""
    deployment = {"backend": "simulated", "profile": profile or {"ttft_s": 0.0, "output_tokens": 4}}
    jobs = {"workers": workers} if poll_s is None else {"workers": workers, "poll_s": poll_s}
    return {
        "models": [{"name": MODEL, "deployments": [deployment]}],
        "storage": storage,
        "jobs": jobs,
        "cache": {"exact": False, "semantic": False},  # every job reaches the backend
        "probes": {"enabled": False},
        "hedge": {"enabled": False},
    }


@contextlib.contextmanager
def fresh_storage(mode: str, settings: JobsBenchSettings) -> Iterator[str]:
    """A storage URL of its own: a new SQLite file, or a claimed empty Redis database whose
    keys are deleted afterwards."""
    if mode == "sqlite":
        with tempfile.TemporaryDirectory(prefix="titan-jobs-bench-") as root:
            yield f"sqlite:///{root}/titan.db"
        return
    from benchmarks.admission_load import claim_redis_db, release_redis_db

    try:
        url = claim_redis_db(str(settings.redis_url))
    except Exception as exc:  # refused, or no empty database
        raise RuntimeError(f"Redis mode: {exc} (--skip-redis runs SQLite only)") from exc
    try:
        yield url
    finally:
        release_redis_db(url)


def redis_server_version(url: str) -> str:
    import redis

    with contextlib.closing(redis.Redis.from_url(url, socket_connect_timeout=5)) as client:
        return str(client.info("server").get("redis_version", "unknown"))


@contextlib.asynccontextmanager
async def started_pipeline(mapping: dict[str, Any]) -> AsyncIterator[Any]:
    from titan.config import config_from_mapping
    from titan.service import build_pipeline

    # environ={}: no TITAN_STORAGE (tests set memory://) overrides the storage chosen here.
    pipeline = build_pipeline(config_from_mapping(mapping, "python -m benchmarks jobs", environ={}))
    await pipeline.start()
    try:
        yield pipeline
    finally:
        await pipeline.shutdown()


def _bodies(prefix: str, count: int) -> list[dict[str, Any]]:
    return [chat_body(f"{prefix} {i}: how many per second?", 4) for i in range(count)]


def _direct_job(index: int, body: dict[str, Any]) -> Job:
    payload = {"endpoint": CHAT_PATH, "body": body, "key_id": None}
    return Job(id=f"direct-{index}", tenant=TENANT, payload=payload, attempts=1)


async def run_direct(storage: str, settings: JobsBenchSettings) -> dict:
    """N requests through ``execute`` (no queue), ``workers`` at a time."""
    mapping = pipeline_config(storage, 0, settings.poll_s)
    bodies = _bodies("Direct question", settings.warmup + settings.jobs)
    errors: Counter[str] = Counter()
    async with started_pipeline(mapping) as pipeline:
        service = pipeline.services.jobs

        async def client(pending: Iterator[int]) -> None:
            for i in pending:
                try:
                    await service.execute(_direct_job(i, bodies[i]))
                except Exception as exc:
                    errors[type(exc).__name__] += 1

        await client(iter(range(settings.warmup)))
        errors.clear()
        pending = iter(range(settings.warmup, len(bodies)))
        started = time.perf_counter()
        await asyncio.gather(*(client(pending) for _ in range(settings.workers)))
        elapsed = time.perf_counter() - started
    return {"requests": settings.jobs, "seconds": elapsed, "errors": dict(errors),
            "requests_per_s": (settings.jobs - errors.total()) / elapsed}  # fmt: skip


async def _submit_all(service: Any, bodies: Sequence[dict[str, Any]], submitters: int) -> float:
    """Submits every body from ``submitters`` tasks; the seconds it took."""
    started = time.perf_counter()

    async def submitter(first: int) -> None:
        for i in range(first, len(bodies), submitters):
            await service.submit({"body": bodies[i]}, None)

    await asyncio.gather(*(submitter(k) for k in range(submitters)))
    return time.perf_counter() - started


async def _until_finished(queue: Any, wanted: int, timeout_s: float, submitting=None) -> dict:
    """Polls ``queue.counts()`` until ``wanted`` jobs are final (or the timeout); the counts."""
    deadline = time.perf_counter() + timeout_s
    while True:
        await asyncio.sleep(COUNTS_POLL_S)
        if submitting is not None and submitting.done() and submitting.exception():
            raise submitting.exception()
        counts = await queue.counts()
        finished = sum(n for state, n in counts.items() if state in FINAL_JOB_STATES)
        if finished >= wanted or time.perf_counter() > deadline:
            return counts  # type: ignore[no-any-return]


async def run_queue(storage: str, settings: JobsBenchSettings) -> dict:
    """N jobs submitted, timed until all are final; jobs that needed more than one attempt."""
    mapping = pipeline_config(storage, settings.workers, settings.poll_s)
    bodies = _bodies("Job question", settings.warmup + settings.jobs)
    async with started_pipeline(mapping) as pipeline:
        service = pipeline.services.jobs
        queue = service.queue
        await _submit_all(service, bodies[: settings.warmup], 1)
        before = await _until_finished(queue, settings.warmup, settings.timeout_s)
        settled_before = service.worker.num_settled
        started = time.perf_counter()
        submitting = asyncio.ensure_future(
            _submit_all(service, bodies[settings.warmup :], settings.submitters)
        )
        counts = await _until_finished(queue, settings.warmup + settings.jobs,
                                       settings.timeout_s, submitting)  # fmt: skip
        elapsed = time.perf_counter() - started
        submit_s = await submitting
        settlements = service.worker.num_settled - settled_before
        jobs = await queue.list(TENANT, limit=len(bodies) + 1)
    succeeded = counts.get("succeeded", 0) - before.get("succeeded", 0)
    finished = sum(n for state, n in counts.items() if state in FINAL_JOB_STATES)
    return {
        "jobs": settings.jobs, "seconds": elapsed, "submit_s": submit_s, "succeeded": succeeded,
        "jobs_per_s": succeeded / elapsed, "counts": counts, "warmup_jobs": settings.warmup,
        "all_finished": finished >= len(bodies), "settlements": settlements,
        "retried_jobs": sum(job.attempts > 1 for job in jobs),
    }  # fmt: skip


async def _throughput(settings: JobsBenchSettings, progress: Progress):
    rows = []
    for mode in settings.modes:
        progress(f"throughput, {mode}: {settings.jobs} requests straight through the pipeline")
        with fresh_storage(mode, settings) as storage:
            direct = await run_direct(storage, settings)
        progress(f"throughput, {mode}: {settings.jobs} jobs through the queue")
        with fresh_storage(mode, settings) as storage:
            queued = await run_queue(storage, settings)
            server = redis_server_version(storage) if mode == "redis" else None
        rate = direct["requests_per_s"]
        rows.append({"mode": mode, "storage": storage if server else "sqlite:///TMP/titan.db",
                     "queue": queued, "direct": direct, "redis_server": server,
                     "ratio": queued["jobs_per_s"] / rate if rate else None})  # fmt: skip
    return rows


def run_throughput(settings: JobsBenchSettings, progress: Progress) -> dict:
    import sqlite3

    modes = asyncio.run(_throughput(settings, progress))
    config = pipeline_config("<per mode>", settings.workers, settings.poll_s)
    return {"config": config, "modes": modes, "sqlite_library": sqlite3.sqlite_version}


# ---- (2) interactive latency under a batch --------------------------------------------------


def serve_config(port: int, storage: str, settings: JobsBenchSettings) -> dict[str, Any]:
    profile = {"ttft_s": settings.ttft_s, "output_tokens": settings.output_tokens}
    server = {"host": "127.0.0.1", "port": port, "log_level": "warning"}
    return {"server": server, **pipeline_config(storage, settings.serve_workers, profile=profile)}


def batch_lines(count: int, max_tokens: int) -> bytes:
    import orjson

    return b"".join(orjson.dumps({
        "custom_id": f"request-{i}", "method": "POST", "url": CHAT_PATH,
        "body": chat_body(f"Batch request {i}: summarize this record.", max_tokens),
    }) + b"\n" for i in range(count))  # fmt: skip


async def closed_loop(client: Any, settings: JobsBenchSettings, tag: str) -> dict[str, Any]:
    """``clients`` loops, each sending its next request when the last one is answered, for
    ``duration_s``: each request's latency, the answers' statuses, requests/s."""
    import httpx

    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    started = time.perf_counter()
    deadline = started + settings.duration_s

    async def one(c: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            body = chat_body(f"{tag}: client {c}, question {n}. Any news?", settings.output_tokens)
            sent = time.perf_counter()
            try:
                status = (await client.post(CHAT_PATH, json=body)).status_code
            except httpx.HTTPError:
                status = 0
            statuses[str(status)] += 1
            if status == 200:
                latencies.append(time.perf_counter() - sent)
            n += 1

    await asyncio.gather(*(one(c) for c in range(settings.clients)))
    elapsed = time.perf_counter() - started
    return {"requests": len(latencies), "seconds": elapsed, "statuses": dict(statuses),
            "requests_per_s": len(latencies) / elapsed, **latency_stats(latencies)}  # fmt: skip


async def _batch_state(client: Any, batch_id: str, since: float) -> dict[str, Any]:
    batch = (await client.get(f"/v1/batches/{batch_id}")).json()
    return {"t_s": time.perf_counter() - since, "status": batch["status"],
            **batch["request_counts"]}  # fmt: skip


async def _start_batch(client: Any, settings: JobsBenchSettings) -> tuple[str, float]:
    """Uploads the batch's file and creates it; its id and the seconds that took."""
    started = time.perf_counter()
    data = batch_lines(settings.batch_jobs, settings.output_tokens)
    files = {"file": ("batch.jsonl", data, "application/jsonl")}
    upload = await client.post("/v1/files", data={"purpose": "batch"}, files=files)
    upload.raise_for_status()
    created = await client.post("/v1/batches", json={
        "input_file_id": upload.json()["id"], "endpoint": CHAT_PATH, "completion_window": "24h",
    })  # fmt: skip
    created.raise_for_status()
    return created.json()["id"], time.perf_counter() - started


async def _interactive(base_url: str, settings: JobsBenchSettings, progress: Progress) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=settings.clients + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        for n in range(settings.interactive_warmup):
            await client.post(CHAT_PATH, json=chat_body(f"Warmup {n}", settings.output_tokens))
        progress(f"interactive A: {settings.clients} clients for {settings.duration_s:g} s")
        alone = await closed_loop(client, settings, "alone")
        progress(f"interactive B: uploading and creating a batch of {settings.batch_jobs}")
        batch_id, create_s = await _start_batch(client, settings)
        since = time.perf_counter()
        first = await _batch_state(client, batch_id, since)
        # The window opens once the batch's first requests are done: its jobs are running.
        while first["completed"] + first["failed"] == 0 and first["t_s"] < 10:
            await asyncio.sleep(0.02)
            first = await _batch_state(client, batch_id, since)
        progress(f"interactive B: {settings.clients} clients for {settings.duration_s:g} s")
        timeline = [first]

        async def follow() -> None:
            while True:
                await asyncio.sleep(settings.batch_poll_s)
                timeline.append(await _batch_state(client, batch_id, since))

        following = asyncio.ensure_future(follow())
        try:
            loaded = await closed_loop(client, settings, "with-batch")
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        last = await _batch_state(client, batch_id, since)
    batch = summarize_batch([*timeline, last], jobs=settings.batch_jobs, create_s=create_s)
    return {"alone": alone, "with_batch": loaded, "batch": {"id": batch_id, **batch}}


def run_interactive(settings: JobsBenchSettings, root: Path, progress: Progress) -> dict:
    from benchmarks.admission_load import start_titan
    from benchmarks.gateway_systems import Workspace
    from titan.chaos.processes import Services, free_port

    storage = f"sqlite:///{root / 'titan.db'}"
    config = serve_config(free_port(), storage, settings)
    progress("interactive: starting titan serve (simulated model, SQLite storage)")
    with Services() as services:
        titan = start_titan(services, Workspace(root), "titan", config, {"TITAN_STORAGE": storage})
        measured = asyncio.run(_interactive(titan.base_url, settings, progress))
    shown = {**config, "storage": "sqlite:///WORKSPACE/titan.db"}
    command = titan.command.replace(str(root), "WORKSPACE")
    return {**measured, "config": shown, "command": command}


# ---- the batch and the run --------------------------------------------------------------------


def summarize_batch(timeline: list[dict[str, Any]], *, jobs: int, create_s: float) -> dict:
    """The batch over phase B's window: ``timeline``'s states (``t_s``, status, request counts),
    the first at the window's start, the last at its end."""
    first, last = timeline[0], timeline[-1]
    done = last["completed"] + last["failed"] - first["completed"] - first["failed"]
    window_s = last["t_s"] - first["t_s"]
    finished_at = next((s["t_s"] for s in timeline if s["status"] != "in_progress"), None)
    finished_after_s = None if finished_at is None else finished_at - first["t_s"]
    ran_s = window_s if finished_after_s is None else finished_after_s  # in the window
    return {
        "jobs": jobs, "create_s": create_s, "start": first, "end": last, "window_s": window_s,
        "done_in_window": done, "jobs_per_s": done / ran_s if ran_s > 0 else None,
        "still_running_at_end": last["status"] == "in_progress",
        "finished_after_s": finished_after_s, "timeline": timeline,
    }  # fmt: skip


def run(settings: JobsBenchSettings, progress: Progress) -> dict[str, Any]:
    """Both phases; SQLite's library and Redis's server versions join the record."""
    throughput = run_throughput(settings, progress)
    with tempfile.TemporaryDirectory(prefix="titan-jobs-bench-") as root:
        interactive = run_interactive(settings, Path(root), progress)
    redis_server = next((m["redis_server"] for m in throughput["modes"] if m["redis_server"]), None)
    versions = {"sqlite": throughput["sqlite_library"], "redis_server": redis_server or "not used"}
    return {"meta": {"versions": versions}, "throughput": throughput, "interactive": interactive}
