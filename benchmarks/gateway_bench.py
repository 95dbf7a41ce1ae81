"""``python -m benchmarks gateway``: what Titan costs per request and how well it hides upstream
transients, against a direct connection and the LiteLLM proxy, measured in one run.

Phases: (1) overhead: one simulated upstream with a fixed 20 ms latency; closed-loop clients at
each concurrency, streaming and not, straight to it, through Titan and through LiteLLM,
interleaved per cell; (2) transients: two upstreams of one model, one healthy and one faulty
(spikes, 503s, an outage); the same load straight to both in turn, through Titan, through
LiteLLM with its retries and cooldowns, and through Titan with two healthy upstreams (the
no-fault baseline). Every system runs as a subprocess; see gateway_systems.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import gateway_load as load
from benchmarks import gateway_systems as systems
from titan.chaos.processes import Service, Services, free_port, get_json, peak_rss_mib
from titan.loadgen.wire import Endpoint

MODES = ("non-streaming", "streaming")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class GatewaySettings:
    duration_s: float = 10.0  # each overhead cell, per system
    warmup_s: float = 1.0  # before each measured cell, same load, discarded
    concurrencies: tuple[int, ...] = (1, 16, 64)
    transients_duration_s: float = 30.0
    transients_concurrency: int = 16
    transients_warmup_s: float = 0.5  # at concurrency 2, before the load
    outage_start_s: float = 5.0  # after the faulty upstream starts
    outage_duration_s: float = 10.0
    timeout_s: float = 30.0  # per request, client side
    wrk: str | None = None  # the wrk binary; None: the pure-Python client
    litellm: str | None = None  # the litellm proxy script; None: LiteLLM is not measured
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> GatewaySettings:
        """Seconds per phase: a smoke run of everything (the test's)."""
        settings = cls(
            duration_s=1.0,
            warmup_s=0.3,
            concurrencies=(1, 4),
            transients_duration_s=3.0,
            transients_concurrency=4,
            transients_warmup_s=0.3,
            outage_start_s=1.0,
            outage_duration_s=0.8,
            timeout_s=10.0,
            is_quick=True,
        )
        return replace(settings, **overrides)


def run(settings: GatewaySettings, progress: Progress) -> dict[str, Any]:
    """Both phases; wrk's and LiteLLM's versions join the record."""
    api_key = systems.new_api_key()
    with tempfile.TemporaryDirectory(prefix="titan-gateway-bench-") as root:
        workspace = systems.Workspace(Path(root))
        overhead = run_overhead(settings, workspace, api_key, progress)
        transients = run_transients(settings, workspace, api_key, progress)
    versions = {
        "litellm": systems.litellm_version(settings.litellm) if settings.litellm else None,
        "wrk": load.wrk_version(settings.wrk) if settings.wrk else None,
    }
    meta = {"versions": versions, "load_generator": "wrk" if settings.wrk else "python"}
    return {"meta": meta, "overhead": overhead, "transients": transients}


# ---- overhead ----------------------------------------------------------------------------


def _measure(
    settings: GatewaySettings,
    service: Service,
    body: bytes,
    api_key: str,
    concurrency: int,
    script: Path | None,
) -> tuple[dict[str, Any], str]:
    """Warm up, then one measured cell: the summary and the command that measured it."""
    target = Endpoint.of(service.base_url)
    if settings.wrk is not None and script is not None:
        for seconds, is_measured in ((settings.warmup_s, False), (settings.duration_s, True)):
            argv = load.wrk_argv(
                settings.wrk, script, target, concurrency, seconds, settings.timeout_s
            )
            summary = load.run_wrk(argv)
            if is_measured:
                return summary, " ".join(argv)
    for seconds in (settings.warmup_s, settings.duration_s):
        records, wall_s = load.run_closed_loop(
            [target],
            body,
            api_key=api_key,
            concurrency=concurrency,
            duration_s=seconds,
            timeout_s=settings.timeout_s,
        )
    command = (
        f"python closed loop: {concurrency} connections, {settings.duration_s:g} s, "
        f"POST {target.url}"
    )
    return load.summarize(records, wall_s), command


def run_overhead(
    settings: GatewaySettings, workspace: systems.Workspace, api_key: str, progress: Progress
) -> dict[str, Any]:
    cells: list[dict[str, Any]] = []
    commands: dict[str, str] = {}
    with Services() as services:
        upstream_port, titan_port = free_port(), free_port()
        upstream = systems.start_simulator(
            services, workspace, "overhead-upstream", systems.steady_profile(), upstream_port
        )
        titan_config = systems.titan_overhead_config(titan_port, upstream.base_url)
        measured = {
            "direct": upstream,
            "titan": systems.start_titan(services, workspace, "overhead-titan", titan_config),
        }
        litellm_config = None
        if settings.litellm is not None:
            progress("starting LiteLLM")
            litellm_config = systems.litellm_config([upstream.base_url], with_retries=False)
            measured["litellm"] = systems.start_litellm(
                services, workspace, "overhead-litellm", settings.litellm, litellm_config,
                free_port(), api_key,
            )  # fmt: skip
        scripts: dict[str, str] = {}
        for mode in MODES:
            body = load.chat_body(systems.MODEL, is_stream=mode == "streaming")
            script = None
            if settings.wrk is not None:
                scripts[mode] = load.wrk_script(body, api_key)
                script = workspace.write_text(f"{mode}.lua", scripts[mode])
            for concurrency in settings.concurrencies:
                for name, service in measured.items():
                    progress(f"overhead: {mode}, concurrency {concurrency}, {name}")
                    summary, command = _measure(
                        settings, service, body, api_key, concurrency, script
                    )
                    rss = None if name == "direct" else peak_rss_mib(service.pid)
                    cells.append(
                        {"mode": mode, "concurrency": concurrency, "system": name, **summary,
                         "peak_rss_mib": rss}
                    )  # fmt: skip
                    commands[f"{mode} c={concurrency} {name}"] = command
        upstream_stats = get_json(f"{upstream.base_url}/stats")
        service_commands = {name: service.command for name, service in measured.items()}
    _add_overheads(cells)
    return {
        "cells": cells,
        "commands": commands,
        "service_commands": service_commands,
        "titan_config": titan_config,
        "litellm_config": litellm_config,
        "litellm_env": systems.LITELLM_ENV,
        "profile": systems.steady_profile(),
        "wrk_scripts": {mode: text.replace(api_key, "$KEY") for mode, text in scripts.items()},
        "upstream_stats": upstream_stats,
    }


def _add_overheads(cells: list[dict[str, Any]]) -> None:
    """Each proxy's latency minus the direct latency of the same cell."""
    direct = {(c["mode"], c["concurrency"]): c for c in cells if c["system"] == "direct"}
    for cell in cells:
        base = direct.get((cell["mode"], cell["concurrency"]))
        for name in ("p50", "p99"):
            value, reference = cell[f"{name}_ms"], base and base[f"{name}_ms"]
            is_known = value is not None and reference is not None and cell["system"] != "direct"
            cell[f"added_{name}_ms"] = value - reference if is_known else None


# ---- targets -----------------------------------------------------------------------------


def _target(name: str, value: float | None, comparison: str, target: float, unit: str = "×"):
    passed = value is not None and (value >= target if comparison == ">=" else value <= target)
    return {
        "name": name,
        "value": value,
        "comparison": comparison,
        "target": target,
        "unit": unit,
        "passed": passed,
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    cells = results["overhead"]["cells"]
    top = max(c["concurrency"] for c in cells)
    by_key = {(c["mode"], c["concurrency"], c["system"]): c for c in cells}
    for mode in MODES:
        titan, litellm = by_key.get((mode, top, "titan")), by_key.get((mode, top, "litellm"))
        if titan is None or litellm is None:
            continue  # LiteLLM not measured: no ratio to report
        checks.append(
            _target(
                f"{mode} c={top}: RPS, Titan / LiteLLM",
                _ratio(titan["rps"], litellm["rps"]),
                ">=",
                3.0,
            )
        )
        added = _ratio(titan["added_p99_ms"], litellm["added_p99_ms"])
        checks.append(_target(f"{mode} c={top}: added p99, Titan / LiteLLM", added, "<=", 1 / 3))
    runs = results["transients"]["runs"]
    titan, baseline = runs.get("titan"), runs.get("titan_no_fault")
    if titan is not None and baseline is not None:
        p99_ratio = _ratio(titan["p99_ms"], baseline["p99_ms"])
        checks.append(_target("transients: Titan p99 / no-fault p99", p99_ratio, "<=", 1.5))
        checks.append(
            _target("transients: client errors through Titan", titan["num_errors"], "<=", 0, "")
        )
    return checks


# ---- transients: two upstreams of one model, one healthy and one faulty (latency spikes, 503s,
# an outage that resets connections). Each run starts its own processes, upstreams last, so that
# the outage meets every run at the same point of its load.

# name -> (proxy in front: None, "titan" or "litellm"; is the second upstream faulty?)
TRANSIENT_RUNS = {
    "direct": (None, True),
    "titan_no_fault": ("titan", False),
    "titan": ("titan", True),
    "litellm": ("litellm", True),
}


def run_transients(
    settings: GatewaySettings, workspace: systems.Workspace, api_key: str, progress: Progress
) -> dict[str, Any]:
    runs = {}
    for name, (proxy, is_faulty) in TRANSIENT_RUNS.items():
        if proxy == "litellm" and settings.litellm is None:
            continue
        progress(f"transients: {name}")
        runs[name] = _transient_run(settings, workspace, api_key, name, proxy, is_faulty)
    return {
        "runs": runs,
        "healthy_profile": systems.steady_profile(),
        "faulty_profile": systems.faulty_profile(
            settings.outage_start_s, settings.outage_duration_s
        ),
        "titan_defaults": systems.titan_defaults(),
    }


def _transient_run(
    settings: GatewaySettings,
    workspace: systems.Workspace,
    api_key: str,
    name: str,
    proxy: str | None,
    is_faulty: bool,
) -> dict[str, Any]:
    first_port, second_port, proxy_port = free_port(), free_port(), free_port()
    urls = [f"http://127.0.0.1:{port}" for port in (first_port, second_port)]
    config: dict[str, Any] | None = None
    with Services() as services:
        # The proxy first: the faulty upstream's outage counts from its own start, which must
        # come just before the load, not a proxy's start-up earlier.
        front: Service | None = None
        if proxy == "titan":
            config = systems.titan_transients_config(proxy_port, *urls)
            front = systems.start_titan(services, workspace, f"{name}-titan", config)
        elif proxy == "litellm":
            if settings.litellm is None:
                raise ValueError("a LiteLLM run needs settings.litellm")
            config = systems.litellm_config(urls, with_retries=True)
            front = systems.start_litellm(
                services, workspace, f"{name}-litellm", settings.litellm, config, proxy_port,
                api_key,
            )  # fmt: skip
        second_profile = (
            systems.faulty_profile(settings.outage_start_s, settings.outage_duration_s)
            if is_faulty
            else systems.steady_profile()
        )
        upstreams = [
            systems.start_simulator(
                services, workspace, f"{name}-first", systems.steady_profile(), first_port
            ),
            systems.start_simulator(
                services, workspace, f"{name}-second", second_profile, second_port
            ),
        ]
        second_started = time.perf_counter()
        targets = (
            [Endpoint.of(u.base_url) for u in upstreams]
            if front is None
            else [Endpoint.of(front.base_url)]
        )
        body = load.chat_body(systems.MODEL, is_stream=False)
        common = {"api_key": api_key, "timeout_s": settings.timeout_s}
        load.run_closed_loop(
            targets, body, concurrency=2, duration_s=settings.transients_warmup_s, **common
        )
        load_started = time.perf_counter()
        records, wall_s = load.run_closed_loop(
            targets,
            body,
            concurrency=settings.transients_concurrency,
            duration_s=settings.transients_duration_s,
            **common,
        )
        upstream_stats = [get_json(f"{u.base_url}/stats") for u in upstreams]
        proxy_stats = get_json(f"{front.base_url}/stats") if proxy == "titan" and front else None
        service_commands = [s.command for s in (front, *upstreams) if s is not None]
    outage_begins_s = settings.outage_start_s - (load_started - second_started)
    result: dict[str, Any] = {
        "proxy": proxy,
        "is_faulty": is_faulty,
        **load.summarize(records, wall_s),
        "config": config,
        "commands": service_commands,
        "upstream_stats": {"first": upstream_stats[0], "second": upstream_stats[1]},
        "proxy_stats": proxy_stats,
        "records": [list(record) for record in records],
    }
    if is_faulty:
        outage_ends_s = outage_begins_s + settings.outage_duration_s
        during = [r for r in records if outage_begins_s <= r[0] < outage_ends_s]
        result["outage_window_s"] = [outage_begins_s, outage_ends_s]
        result["during_outage"] = load.summarize(during, settings.outage_duration_s)
    return result
