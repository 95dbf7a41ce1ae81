"""``python -m benchmarks observability``: what per-request metrics, request logs and tracing cost
Titan's throughput.

One simulated upstream (``titan simulate``, the gateway benchmark's steady profile: 20 ms to the
answer) and ``titan serve`` in front of it, in two configurations started in turn on the same
port: *off* (``observability``: request metrics, request logs and tracing off; log level
warning) and *on* (all three on: request metrics, one JSON line per request at log level info
into a log file, every request traced, the spans exported over OTLP/HTTP to a local sink, see
otlp_sink; ``/metrics`` scraped once per second, as Prometheus would). Rounds alternate off, on,
off, on; in each, closed-loop load (wrk where it is installed, else the gateway benchmark's
Python client) posts a non-streaming, then a streaming chat body, a warm-up first. Per cell, the
median requests/s of each configuration's rounds; the cost is 1 − on ÷ off.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import gateway_load as load
from benchmarks import gateway_systems as systems
from titan.chaos import processes
from titan.chaos.processes import Service, Services, free_port, get_json, peak_rss_mib
from titan.loadgen.wire import Endpoint

MODES = ("non-streaming", "streaming")
CONFIGS = ("off", "on")
SINK_START_TIMEOUT_S = 30.0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ObservabilitySettings:
    duration_s: float = 10.0  # each measured cell
    warmup_s: float = 1.0  # before each measured cell, same load, discarded
    rounds: int = 2  # of each configuration, alternated: off, on, off, on
    concurrency: int = 32  # closed-loop connections
    timeout_s: float = 30.0  # per request, client side
    scrape_interval_s: float = 1.0  # GET /metrics while "on" runs
    # Share of requests traced in "on": a production setting (every request traced costs
    # ~0.15 ms of CPU each, see docs/ARCHITECTURE.md); 1.0 measures that worst case.
    sample_ratio: float = 0.1
    wrk: str | None = None  # the wrk binary; None: the pure-Python client
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> ObservabilitySettings:
        """One round of each, short cells, fewer connections: a smoke run (the test's)."""
        settings = cls(duration_s=1.0, warmup_s=0.3, rounds=1, concurrency=8, timeout_s=10.0,
                       is_quick=True)  # fmt: skip
        return replace(settings, **overrides)


# ---- configs --------------------------------------------------------------------------------


def observability_section(
    config: str, otlp_endpoint: str, sample_ratio: float = 1.0
) -> dict[str, Any]:
    if config == "off":
        return {"request_metrics": False, "log_requests": False, "tracing": {"enabled": False}}
    tracing = {"enabled": True, "otlp_endpoint": otlp_endpoint, "sample_ratio": sample_ratio}
    return {"request_metrics": True, "log_requests": True, "tracing": tracing}


def titan_config(
    config: str, port: int, upstream_url: str, otlp_endpoint: str, sample_ratio: float = 1.0
) -> dict[str, Any]:
    """The gateway benchmark's overhead config (one deployment; probes and hedging off), state
    in memory, and the observability of ``config`` ("off" or "on")."""
    mapping = systems.titan_overhead_config(port, upstream_url)
    # Info: the request lines are written (uvicorn's access lines are off when they are).
    mapping["server"]["log_level"] = "info" if config == "on" else "warning"
    mapping["storage"] = "memory://"
    mapping["observability"] = observability_section(config, otlp_endpoint, sample_ratio)
    return mapping


# ---- what the "on" runs produce -------------------------------------------------------------


class Scraper:
    """GET ``url`` every ``interval_s`` from a thread (one keep-alive connection), as Prometheus
    scrapes /metrics."""

    def __init__(self, url: str, interval_s: float):
        self.url, self.interval_s = url, interval_s
        self.scrapes = self.failures = self.bytes = 0
        self.max_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=5.0) as client:
            while not self._stop.wait(self.interval_s):
                started = time.perf_counter()
                try:
                    response = client.get(self.url)
                    response.raise_for_status()
                except httpx.HTTPError:
                    self.failures += 1
                    continue
                self.scrapes += 1
                self.bytes += len(response.content)
                self.max_ms = max(self.max_ms, 1e3 * (time.perf_counter() - started))

    def as_dict(self) -> dict[str, Any]:
        return {"scrapes": self.scrapes, "failures": self.failures, "bytes": self.bytes,
                "max_ms": self.max_ms}  # fmt: skip


def requests_counted(metrics_text: str) -> int:
    """The sum of ``titan_requests_total`` over its labels, from a /metrics page."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("titan_requests_total"):
            total += float(line.rsplit(" ", 1)[1])
    return round(total)


def log_counts(path: Path) -> dict[str, int]:
    """Lines a Titan wrote to its log: all, request lines (logger titan.requests), access lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {"lines": 0, "bytes": 0, "request_lines": 0, "access_lines": 0}
    lines = text.splitlines()
    return {"lines": len(lines), "bytes": len(text.encode()),
            "request_lines": sum("titan.requests" in line for line in lines),
            "access_lines": sum("uvicorn.access" in line for line in lines)}  # fmt: skip


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {key: None if value is None or before.get(key) is None else value - before[key]
            for key, value in after.items()}  # fmt: skip


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (its threads included); None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


# ---- the runs -------------------------------------------------------------------------------


def measure(settings: ObservabilitySettings, titan: Service, body: bytes, api_key: str,
            script: Path | None) -> tuple[dict[str, Any], str]:  # fmt: skip
    """The gateway benchmark's cell: a warm-up, then the measured load (wrk with ``script``, else
    the Python closed loop); its summary gets Titan's CPU milliseconds per answered request
    over the measured window. Returns the summary and the command that measured it."""
    target = Endpoint.of(titan.base_url)
    summary: dict[str, Any] = {}
    command, cpu_before = "", None
    for seconds, is_measured in ((settings.warmup_s, False), (settings.duration_s, True)):
        if is_measured:
            cpu_before = cpu_seconds(titan.pid)
        if settings.wrk is not None and script is not None:
            argv = load.wrk_argv(settings.wrk, script, target, settings.concurrency, seconds,
                                 settings.timeout_s)  # fmt: skip
            summary, command = load.run_wrk(argv), " ".join(argv)
        else:
            records, wall_s = load.run_closed_loop(
                [target], body, api_key=api_key, concurrency=settings.concurrency,
                duration_s=seconds, timeout_s=settings.timeout_s,
            )  # fmt: skip
            summary = load.summarize(records, wall_s)
            command = (f"python closed loop: {settings.concurrency} connections, {seconds:g} s, "
                       f"POST {target.url}")  # fmt: skip
    cpu_after = cpu_seconds(titan.pid)
    cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    summary["titan_cpu_s"] = cpu_s
    ok = summary["num_ok"]
    summary["titan_cpu_ms_per_request"] = 1e3 * cpu_s / ok if cpu_s is not None and ok else None
    return summary, command


def start_sink(services: Services, workspace: systems.Workspace, port: int) -> Service:
    argv = [sys.executable, "-m", "benchmarks.otlp_sink", "--port", str(port)]
    return services.start("otlp-sink", argv, f"http://127.0.0.1:{port}", workspace.log_dir,
                          ready_path="/health", timeout_s=SINK_START_TIMEOUT_S)  # fmt: skip


def _one_run(
    settings: ObservabilitySettings,
    services: Services,
    workspace: systems.Workspace,
    run: dict[str, Any],
    config: dict[str, Any],
    requests: dict[str, tuple[bytes, Path | None]],
    api_key: str,
    progress: Progress,
) -> Service:
    """Start Titan with ``config``, measure every mode, stop it (its last spans leave); the
    numbers go into ``run``."""
    from benchmarks.admission_load import start_titan  # every other TITAN_* variable unset

    is_on = run["config"] == "on"
    titan = start_titan(services, workspace, f"titan-{run['config']}-{run['round']}", config, {})
    scraper = Scraper(f"{titan.base_url}/metrics", settings.scrape_interval_s) if is_on else None
    try:
        with scraper or contextlib.nullcontext():
            for mode, (body, script) in requests.items():
                progress(f"round {run['round']}/{settings.rounds}: {run['config']}, {mode}")
                summary, command = measure(settings, titan, body, api_key, script)
                run["cells"][mode] = summary
                run["commands"][mode] = command
        if is_on:
            text = load_metrics(titan.base_url)
            run["metrics_requests"] = requests_counted(text)
        run["peak_rss_mib"] = peak_rss_mib(titan.pid)
    finally:
        processes.stop(titan)  # SIGINT: a graceful shutdown, the span exporter flushed
    run["scrapes"] = scraper.as_dict() if scraper else None
    run["log"] = log_counts(titan.log_path)
    return titan


def load_metrics(base_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        return response.read().decode()


def run_rounds(settings: ObservabilitySettings, workspace: systems.Workspace, api_key: str,
               progress: Progress) -> dict[str, Any]:  # fmt: skip
    runs: list[dict[str, Any]] = []
    configs: dict[str, dict[str, Any]] = {}
    titan_commands: dict[str, str] = {}
    scripts: dict[str, str] = {}
    with Services() as services:
        upstream_port, titan_port, sink_port = free_port(), free_port(), free_port()
        progress("starting the simulated upstream and the OTLP sink")
        upstream = systems.start_simulator(
            services, workspace, "upstream", systems.steady_profile(), upstream_port
        )
        sink = start_sink(services, workspace, sink_port)
        otlp_endpoint = f"{sink.base_url}/v1/traces"
        requests: dict[str, tuple[bytes, Path | None]] = {}
        for mode in MODES:
            body = load.chat_body(systems.MODEL, is_stream=mode == "streaming")
            script = None
            if settings.wrk is not None:
                scripts[mode] = load.wrk_script(body, api_key)
                script = workspace.write_text(f"{mode}.lua", scripts[mode])
            requests[mode] = (body, script)
        for round_number in range(1, settings.rounds + 1):
            for name in CONFIGS:
                progress(f"round {round_number}/{settings.rounds}: starting Titan ({name})")
                configs[name] = titan_config(name, titan_port, upstream.base_url, otlp_endpoint,
                                             settings.sample_ratio)  # fmt: skip
                run: dict[str, Any] = {"round": round_number, "config": name, "cells": {},
                                       "commands": {}, "metrics_requests": None}  # fmt: skip
                before = get_json(f"{sink.base_url}/stats")
                titan = _one_run(settings, services, workspace, run, configs[name], requests,
                                 api_key, progress)  # fmt: skip
                after = get_json(f"{sink.base_url}/stats")
                run["sink"] = _delta(after, before)  # type: ignore[arg-type]
                titan_commands[name] = titan.command.replace(str(workspace.root), "WORKSPACE")
                runs.append(run)
        upstream_stats = get_json(f"{upstream.base_url}/stats")
        service_commands = {
            "upstream": upstream.command, "otlp_sink": sink.command,
            **{f"titan ({name})": command for name, command in titan_commands.items()},
        }  # fmt: skip
    root = str(workspace.root)
    return {
        "runs": runs,
        "configs": configs,
        "service_commands": {k: v.replace(root, "WORKSPACE") for k, v in service_commands.items()},
        "profile": systems.steady_profile(),
        "wrk_scripts": {mode: text.replace(api_key, "$KEY") for mode, text in scripts.items()},
        "upstream_stats": upstream_stats,
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and configuration: requests/s per round and their median, the medians of the
    rounds' p50 and p99; the ratio on ÷ off and the cost 1 − ratio."""
    cells: dict[str, Any] = {}
    for mode in MODES:
        cell: dict[str, Any] = {}
        for config in CONFIGS:
            measured = [run["cells"][mode] for run in runs
                        if run["config"] == config and mode in run["cells"]]  # fmt: skip
            cell[config] = {
                "rps_rounds": [m["rps"] for m in measured],
                "rps": _median([m["rps"] for m in measured]),
                "p50_ms": _median([m["p50_ms"] for m in measured]),
                "p99_ms": _median([m["p99_ms"] for m in measured]),
                "cpu_ms": _median([m.get("titan_cpu_ms_per_request") for m in measured]),
                "num_ok": sum(m["num_ok"] for m in measured),
                "num_errors": sum(m["num_errors"] for m in measured),
            }
        off, on = cell["off"]["rps"], cell["on"]["rps"]
        cell["ratio"] = on / off if on is not None and off else None
        cell["cost"] = None if cell["ratio"] is None else 1 - cell["ratio"]
        cells[mode] = cell
    return cells


def run(settings: ObservabilitySettings, progress: Progress) -> dict[str, Any]:
    """The rounds, summarized per mode and configuration; wrk's version joins the record."""
    api_key = systems.new_api_key()  # Titan runs without auth; wrk sends one all the same
    with tempfile.TemporaryDirectory(prefix="titan-observability-bench-") as root:
        measured = run_rounds(settings, systems.Workspace(Path(root)), api_key, progress)
    wrk = load.wrk_version(settings.wrk) if settings.wrk else None
    meta = {"versions": {"wrk": wrk}, "load_generator": "wrk" if settings.wrk else "python"}
    return {"meta": meta, **measured, "cells": summarize(measured["runs"])}
