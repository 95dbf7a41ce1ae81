"""The transients phase of the gateway benchmark: two upstreams of one model, one healthy and
one faulty (latency spikes, 503s, an outage that resets connections). The same closed-loop load
straight to both in turn, through Titan, through LiteLLM with its retries and cooldowns, and
through Titan with two healthy upstreams (the no-fault baseline). Each run starts its own
processes, upstreams last, so that the outage meets every run at the same point of its load."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from benchmarks import gateway_load as load
from benchmarks import gateway_systems as systems
from titan.chaos.processes import Service, Services, free_port, get_json

if TYPE_CHECKING:
    from benchmarks.gateway_bench import GatewaySettings, Progress


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
            [load.Target.of(u.base_url) for u in upstreams]
            if front is None
            else [load.Target.of(front.base_url)]
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
