"""Is the HTTP side responsive while the engine is saturated? ``titan serve`` in a subprocess,
streaming chat requests keep every engine slot busy, and /health is probed meanwhile; the same
probes against the idle server are the baseline."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from titan.loadgen.metrics import percentile

STARTUP_TIMEOUT_S = 300
PROBE_INTERVAL_S = 0.02


@dataclass(frozen=True)
class ServerLoadSettings:
    num_streams: int = 32  # = the engine's default max_num_seqs: every slot busy
    prompt_words: int = 200
    max_tokens: int = 48
    num_idle_probes: int = 100


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(port: int, dtype: str, num_threads: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "titan",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    command += ["--dtype", dtype, "--num-threads", str(num_threads)]
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ)
    )


def _wait_ready(base_url: str, process: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"titan serve exited with {process.returncode} during start-up")
        try:
            if httpx.get(f"{base_url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"titan serve was not ready after {STARTUP_TIMEOUT_S} s")


def _probe(base_url: str, stop: threading.Event, latencies: list[float], limit: int) -> None:
    """GET /health every PROBE_INTERVAL_S until ``stop`` (or ``limit`` probes)."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=10) as client:
        while not stop.is_set() and len(latencies) < limit:
            started = time.perf_counter()
            client.get("/health").raise_for_status()
            latencies.append(time.perf_counter() - started)
            time.sleep(PROBE_INTERVAL_S)


async def _stream(client: Any, model: str, index: int, settings: ServerLoadSettings) -> int:
    words = " ".join(f"word{(index * 7 + i) % 997}" for i in range(settings.prompt_words))
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Summarise: {words}"}],
        "max_tokens": settings.max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    num_events = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            num_events += line.startswith("data:")
    return num_events


async def _saturate(base_url: str, model: str, settings: ServerLoadSettings) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        started = time.perf_counter()
        streams = [_stream(client, model, i, settings) for i in range(settings.num_streams)]
        await asyncio.gather(*streams)
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
    import httpx

    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    process = _start_server(port, dtype, num_threads)
    try:
        _wait_ready(base_url, process)
        model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        idle: list[float] = []
        _probe(base_url, threading.Event(), idle, settings.num_idle_probes)

        loaded: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(base_url, stop, loaded, 10**6))
        prober.start()
        try:
            load_s = asyncio.run(_saturate(base_url, model, settings))
        finally:
            stop.set()
            prober.join()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    return {
        "num_streams": settings.num_streams,
        "max_tokens": settings.max_tokens,
        "load_s": load_s,
        "idle": _summary(idle),
        "under_load": _summary(loaded),
    }
