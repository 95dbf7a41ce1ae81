"""``python -m benchmarks loadgen``: what the load generator behind ``titan bench URL`` costs, so
that its numbers measure the server and not the client.

One simulated upstream (``titan simulate``: 1 ms to the first token, 16 tokens, no gaps) in a
subprocess. Per mode (whole answers, then streams): (1) the load generator in this process,
open loop at ``rate`` requests/s (Poisson) for ``duration_s``, its CPU (user + system time of
this process over the run, so every thread of it) ÷ wall time = the cores it used, against the
target of at most one core; (2) the load generator as fast as it goes (closed loop, ``concurrency``
clients) and (3) wrk, the C baseline, with the same connections and the same body, both measured
for requests/s and CPU per request (wrk's CPU: RUSAGE_CHILDREN around its run). The simulator's
CPU is measured too (/proc), to show which side was the bottleneck.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import gateway_load as wrk_load
from benchmarks import gateway_systems as systems
from titan.chaos.processes import Service, Services, free_port
from titan.loadgen import ClosedLoop, LoadTarget, OpenLoop, Workload, summarize
from titan.loadgen.runner import LoadRun, run_load_sync
from titan.loadgen.wire import Endpoint

MODES = ("non-streaming", "streaming")
MAX_CORES = 1.0  # the target: the generator's own cores at the offered rate
MIN_DELIVERED = 0.99  # answered ÷ scheduled at the offered rate
PROMPT = "Say something short."
Progress = Callable[[str], None]


@dataclass(frozen=True)
class LoadgenSettings:
    rate: float = 1000.0  # requests/s offered by the open loop
    duration_s: float = 10.0  # each measured run
    warmup_s: float = 1.0  # before each mode, open loop at the rate, discarded
    concurrency: int = 32  # closed loop, the generator's and wrk's full-speed runs
    output_tokens: int = 16
    ttft_s: float = 0.001  # the simulator's latency: tiny, so that the client's cost shows
    timeout_s: float = 10.0
    seed: int = 0
    wrk: str | None = None  # the wrk binary; None: no baseline run
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> LoadgenSettings:
        return replace(cls(duration_s=3.0, warmup_s=0.5, is_quick=True), **overrides)


def simulator_profile(settings: LoadgenSettings) -> dict[str, Any]:
    return {
        "seed": settings.seed,
        "ttft_s": settings.ttft_s,
        "inter_token_s": 0.0,
        "output_tokens": settings.output_tokens,
    }


def request_body(settings: LoadgenSettings, is_stream: bool) -> dict[str, Any]:
    """The one body every run sends (without the model), a stream asking for its usage."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": settings.output_tokens,
    }
    if is_stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process (/proc); None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _cell(
    summary: dict[str, Any], wall_s: float, client_cpu_s: float | None, server_cpu_s: float | None
) -> dict[str, Any]:
    ok = summary["num_ok"]
    return {
        **summary,
        "client_cores": None if client_cpu_s is None else client_cpu_s / wall_s,
        "client_cpu_us_per_request": None
        if client_cpu_s is None or not ok
        else 1e6 * client_cpu_s / ok,
        "server_cores": None if server_cpu_s is None else server_cpu_s / wall_s,
    }


def measure_loadgen(
    settings: LoadgenSettings,
    upstream: Service,
    workload: Workload,
    arrivals: ClosedLoop | OpenLoop,
    duration_s: float,
) -> dict[str, Any]:
    """One run of the load generator in this process, with its CPU and the simulator's."""
    target = LoadTarget(upstream.base_url, systems.MODEL)
    server_before, cpu_before, started = pid_cpu_s(upstream.pid), process_cpu_s(), time.monotonic()
    run: LoadRun = run_load_sync(
        target, arrivals, workload, duration_s=duration_s, timeout_s=settings.timeout_s
    )
    wall_s = time.monotonic() - started
    cpu_s, server_s = process_cpu_s() - cpu_before, _delta(pid_cpu_s(upstream.pid), server_before)
    cell = _cell(summarize(run), wall_s, cpu_s, server_s)
    scheduled = len(run.samples)  # every arrival due in the window, sent or not
    num_sent = scheduled - cell["num_not_sent"]
    e2e = cell["e2e_s"]
    cell |= {
        "num_scheduled": scheduled,
        "scheduled_rate": scheduled / duration_s,
        "sent_rate": num_sent / duration_s,
        "rps": cell["request_throughput"],
        "num_errors": cell["num_failed"],
        "p50_ms": _ms(e2e["p50"]),
        "p99_ms": _ms(e2e["p99"]),
    }
    return cell


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def measure_wrk(
    settings: LoadgenSettings, wrk: str, upstream: Service, script: Path, duration_s: float
) -> tuple[dict[str, Any], str]:
    """wrk (one thread) closed loop with the generator's connections; its CPU and the
    simulator's. Its summary has gateway_load's keys (rps, p50_ms, p99_ms, num_errors)."""
    target = Endpoint.of(upstream.base_url)
    argv = wrk_load.wrk_argv(
        wrk, script, target, settings.concurrency, duration_s, settings.timeout_s
    )
    server_before, cpu_before, started = pid_cpu_s(upstream.pid), children_cpu_s(), time.monotonic()
    summary = wrk_load.run_wrk(argv)
    wall_s = time.monotonic() - started
    server_s = _delta(pid_cpu_s(upstream.pid), server_before)
    cell = _cell(summary, wall_s, children_cpu_s() - cpu_before, server_s)
    return cell, " ".join(argv)


def run_mode(
    settings: LoadgenSettings,
    upstream: Service,
    workspace: systems.Workspace,
    mode: str,
    progress: Progress,
) -> dict[str, Any]:
    import orjson

    is_stream = mode == "streaming"
    body = request_body(settings, is_stream)
    workload = Workload(mode, (body,))
    open_loop = OpenLoop(settings.rate, seed=settings.seed)
    progress(f"{mode}: warm-up")
    measure_loadgen(settings, upstream, workload, open_loop, settings.warmup_s)
    progress(f"{mode}: load generator, open loop at {settings.rate:g}/s")
    cells = {"open": measure_loadgen(settings, upstream, workload, open_loop, settings.duration_s)}
    progress(f"{mode}: load generator, closed loop, {settings.concurrency} clients")
    cells["closed"] = measure_loadgen(
        settings, upstream, workload, ClosedLoop(settings.concurrency), settings.duration_s
    )
    command = None
    if settings.wrk is not None:
        progress(f"{mode}: wrk, {settings.concurrency} connections")
        wire_body = orjson.dumps({"model": systems.MODEL, **body})
        script = workspace.write_text(f"{mode}.lua", wrk_load.wrk_script(wire_body, "unused"))
        cells["wrk"], command = measure_wrk(
            settings, settings.wrk, upstream, script, settings.duration_s
        )
        command = command.replace(str(workspace.root), "WORKSPACE")
    return {"cells": cells, "body": body, "wrk_command": command}


def run(settings: LoadgenSettings, progress: Progress) -> dict[str, Any]:
    """Both modes against one simulator; wrk's version joins the record."""
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="titan-loadgen-bench-") as root:
        workspace = systems.Workspace(Path(root))
        with Services() as services:
            progress("starting the simulated upstream")
            upstream = systems.start_simulator(
                services, workspace, "upstream", simulator_profile(settings), free_port()
            )
            for mode in MODES:
                modes[mode] = run_mode(settings, upstream, workspace, mode, progress)
            simulator_command = upstream.command.replace(root, "WORKSPACE")
    wrk = wrk_load.wrk_version(settings.wrk) if settings.wrk else None
    return {
        "meta": {"versions": {"wrk": wrk}},
        "profile": simulator_profile(settings),
        "simulator_command": simulator_command,
        "modes": modes,
    }
