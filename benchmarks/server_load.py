"""Is the HTTP side responsive while the engine is saturated? ``titan serve`` in a subprocess,
streaming chat requests (the load generator's client) keep every engine slot busy, and /health is
probed meanwhile; the same probes against the idle server are the baseline."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan.chaos.processes import Services, free_port, get_json, titan_argv
from titan.loadgen.client import ConnectionPool
from titan.loadgen.metrics import percentile
from titan.loadgen.wire import Endpoint, prepare

STARTUP_TIMEOUT_S = 300
PROBE_INTERVAL_S = 0.02


@dataclass(frozen=True)
class ServerLoadSettings:
    num_streams: int = 32  # = the engine's default max_num_seqs: every slot busy
    prompt_words: int = 200
    max_tokens: int = 48
    num_idle_probes: int = 100


def _probe(base_url: str, stop: threading.Event, latencies: list[float], limit: int) -> None:
    """GET /health every PROBE_INTERVAL_S until ``stop`` (or ``limit`` probes)."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=10) as client:
        while not stop.is_set() and len(latencies) < limit:
            started = time.perf_counter()
            client.get("/health").raise_for_status()
            latencies.append(time.perf_counter() - started)
            time.sleep(PROBE_INTERVAL_S)


def _stream_body(index: int, settings: ServerLoadSettings) -> dict[str, Any]:
    words = " ".join(f"word{(index * 7 + i) % 997}" for i in range(settings.prompt_words))
    return {
        "messages": [{"role": "user", "content": f"Summarise: {words}"}],
        "max_tokens": settings.max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def _saturate(base_url: str, model: str, settings: ServerLoadSettings) -> float:
    """Every stream at once, through the load generator's client; raises on a failed one."""
    endpoint = Endpoint.of(base_url)
    pool = ConnectionPool(endpoint)
    requests = [prepare(endpoint, _stream_body(i, settings), model, None)
                for i in range(settings.num_streams)]  # fmt: skip
    started = time.perf_counter()
    try:
        answers = await asyncio.gather(*(pool.fetch(r.data, r.is_stream) for r in requests))
    finally:
        pool.close()
    failed = [a for a in answers if a.status != 200 or a.error is not None]
    if failed:
        raise RuntimeError(f"a saturating stream failed: {failed[0].status} {failed[0].error}")
    return time.perf_counter() - started


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "num_probes": len(ordered),
        "p50_ms": percentile(ordered, 50) * 1000,
        "p99_ms": percentile(ordered, 99) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def run_server_load(dtype: str, num_threads: int, settings: ServerLoadSettings) -> dict[str, Any]:
    port = free_port()
    argv = titan_argv("serve", "--port", str(port), "--log-level", "warning", "--dtype", dtype,
                      "--num-threads", str(num_threads))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="titan-server-load-") as logs, Services() as services:
        titan = services.start("titan", argv, f"http://127.0.0.1:{port}", Path(logs),
                               ready_path="/ready", timeout_s=STARTUP_TIMEOUT_S)  # fmt: skip
        listing: Any = get_json(f"{titan.base_url}/v1/models", timeout_s=10)
        model = listing["data"][0]["id"]
        idle: list[float] = []
        _probe(titan.base_url, threading.Event(), idle, settings.num_idle_probes)

        loaded: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(titan.base_url, stop, loaded, 10**6))
        prober.start()
        try:
            load_s = asyncio.run(_saturate(titan.base_url, model, settings))
        finally:
            stop.set()
            prober.join()
    return {
        "num_streams": settings.num_streams,
        "max_tokens": settings.max_tokens,
        "load_s": load_s,
        "idle": _summary(idle),
        "under_load": _summary(loaded),
    }
