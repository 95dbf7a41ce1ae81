"""Routing policies over a fleet of model servers (issue 24).

Four ``titan simulate`` processes in model-server mode (a KV cache with prefix caching,
continuous batching on a step-cost model, vLLM's metrics; docs/simulator.md), one of them at half
the capacity, or (``--servers titan``) two real ``titan serve`` replicas running the embedded
model with small KV caches, behind one ``titan serve`` whose only setting that changes is
``routing.policy``. For every policy and workload the fleet starts afresh (empty caches), then an
open-loop rate sweep runs the workload through Titan: time to first token at each rate, the knee
(the highest rate whose TTFT SLO attainment is at least 90%), and each replica's prefix-cache hit
rate and share of the requests, read from its own /metrics afterwards.
"""

from __future__ import annotations

import tempfile
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.base import Progress, Results
from benchmarks.routing_workloads import WORKLOADS, WorkloadShape, build
from titan.chaos.processes import Services, free_port, titan_argv
from titan.loadgen.client import LoadTarget
from titan.loadgen.metrics import Slo, summarize
from titan.loadgen.runner import run_load_sync
from titan.loadgen.sweep import SweepPoint, find_knee, rate_points
from titan.loadgen.workloads import Workload

MODEL = "sim"
POLICIES = ("round_robin", "p2c_ewma", "prefix_affinity", "scored")
# vLLM-like replicas: three full ones and one with half the KV cache and every step twice as long.
# A prefill of 5,000 tokens/s: slow enough that the fleet saturates at rates a 2-core machine's
# gateway and client offer with room to spare (a full replica prefills ~2.5 uncached
# 2,000-token prompts a second); at 10,000 the client and gateway, not the fleet, set the knee.
FULL = {"kv_cache_tokens": 65_536, "step_cost": {"fixed_s": 0.005, "per_token_s": 0.0002}}
HALF = {"kv_cache_tokens": 32_768, "step_cost": {"fixed_s": 0.01, "per_token_s": 0.0004}}
# Real replicas: the embedded SmolLM2 on one core each (slow: at 1 request/s a ~190-token
# tenants prompt took 0.75 s to its first token, so the workloads are small), a KV cache of this
# many 16-token blocks (1,024 tokens: not all twelve tenants' ~130-token system prompts fit
# beside the running requests), their own exact caches off.
TITAN_KV_BLOCKS = 64
TITAN_BLOCK_TOKENS = 16
KV_TOKENS = {"full": FULL["kv_cache_tokens"], "half": HALF["kv_cache_tokens"],
             "titan": TITAN_KV_BLOCKS * TITAN_BLOCK_TOKENS}  # fmt: skip
# Characters per token of the workloads' text: the simulator counts 4; SmolLM2's tokenizer
# splits the workloads' numbered words finer (2.0, measured over 200 prompts of each workload).
CHARS_PER_TOKEN = {"full": 4, "half": 4, "titan": 2}
UPSTREAM_MODEL = "simulated"


@dataclass(frozen=True)
class RoutingSettings:
    policies: tuple[str, ...] = POLICIES
    workloads: tuple[str, ...] = WORKLOADS
    rates: tuple[float, ...] = (5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0)  # req/s
    duration_s: float = 10.0  # per rate
    slo_ttft_s: float = 1.0
    replicas: tuple[str, ...] = ("full", "full", "full", "half")  # full, half or titan
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    seed: int = 0
    timeout_s: float = 60.0
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> RoutingSettings:
        shape = WorkloadShape(num_tenants=5, system_tokens=500, num_conversations=10, turns=3,
                              unique_tokens=100)  # fmt: skip
        quick = cls(rates=(5.0, 10.0), duration_s=2.0, shape=shape, is_quick=True)
        return replace(quick, **overrides)

    @classmethod
    def titan_fleet(cls, **overrides: Any) -> RoutingSettings:
        """Two embedded ``titan serve`` replicas: what two CPU cores serve, scaled down."""
        shape = WorkloadShape(num_tenants=12, system_tokens=60, num_conversations=16, turns=4,
                              turn_tokens=15, answer_tokens=10,
                              unique_tokens=60, max_tokens=8)  # fmt: skip
        # Up to 10 requests/s: on an AVX-512 Xeon every policy still met the SLO at 5 (on an
        # AVX2 EPYC the knees were 1-1.5).
        fleet = cls(replicas=("titan", "titan"), rates=(0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0),
                    duration_s=12.0, slo_ttft_s=1.5, shape=shape)  # fmt: skip
        return replace(fleet, **overrides)


def _profile(kind: str, seed: int) -> dict[str, Any]:
    return {"seed": seed, "output_tokens": 16, "server": FULL if kind == "full" else HALF}


def _replica_config() -> dict[str, Any]:
    """A real replica: the embedded model on one engine thread, a small KV cache, no exact
    cache (a repeated request must reach the engine and its prefix cache)."""
    engine = {"num_threads": 1, "num_kv_blocks": TITAN_KV_BLOCKS, "block_size": TITAN_BLOCK_TOKENS}
    return {
        "models": [{"name": UPSTREAM_MODEL, "deployments": [{"backend": "embedded",
                                                            "engine": engine}]}],
        "cache": {"exact": False},
    }  # fmt: skip


def _server(kind: str) -> str:
    return "titan" if kind == "titan" else "vllm"


def _titan_config(replicas: list[str], kinds: tuple[str, ...], policy: str) -> dict[str, Any]:
    deployments = [
        {
            "backend": "openai",
            "base_url": f"{url}/v1",
            "api_key": "none",
            "upstream_model": UPSTREAM_MODEL,
            "metrics": {"server": _server(kind)},
            # The scored router's prefix index, sized like the replica's KV cache (the index's
            # blocks are 256 characters).
            "prefix_cache_blocks": KV_TOKENS[kind] * CHARS_PER_TOKEN[kind] // 256,
        }
        for url, kind in zip(replicas, kinds, strict=True)
    ]
    return {
        "models": [{"name": MODEL, "deployments": deployments}],
        "routing": {"policy": policy, "load": {"interval_s": 0.25}},
        "hedge": {"enabled": False},  # a hedge is a second prefill: the same for every policy
        # Titan's own cache would answer a repeated body in a millisecond: routing is measured.
        "cache": {"exact": False},
    }


# Each server's counters (the family names, without _total) of prefix-cache hits and queries
# (tokens) and of requests finished.
COUNTERS = {
    "vllm": {"vllm:prefix_cache_hits": "hits", "vllm:prefix_cache_queries": "queries",
             "vllm:request_success": "requests"},
    "titan": {"titan_prefix_cache_hits": "hits", "titan_prefix_cache_queries": "queries",
              "titan_request_success": "requests"},
}  # fmt: skip


def replica_counters(base_url: str, server: str = "vllm") -> dict[str, float]:
    """Prefix-cache hits and queries (tokens) and finished requests, from a replica's /metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    wanted = COUNTERS[server]
    found = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        key = wanted.get(family.name)
        if key is not None:
            found[key] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return found


def _start_fleet(services: Services, settings: RoutingSettings, work: Path) -> list[str]:
    urls = []
    for index, kind in enumerate(settings.replicas):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if kind == "titan":
            config = work / f"replica-{index}.yaml"
            config.write_text(yaml.safe_dump(_replica_config()))
            argv = titan_argv("serve", "--config", str(config), "--port", str(port))
            services.start(f"replica-{index}", argv, url, work, ready_path="/ready",
                           timeout_s=180, env={"TITAN_STORAGE": "memory://"})  # fmt: skip
        else:
            profile = work / f"replica-{index}.yaml"
            profile.write_text(yaml.safe_dump(_profile(kind, settings.seed + index)))
            argv = titan_argv("simulate", "--port", str(port), "--profile", str(profile))
            services.start(f"replica-{index}", argv, url, work, ready_path="/health", timeout_s=30)
        urls.append(url)
    return urls


def run_case(settings: RoutingSettings, policy: str, workload: str, work: Path) -> Results:
    """One policy on one workload, on a fresh fleet."""
    with Services() as services:
        replicas = _start_fleet(services, settings, work)
        config = work / f"titan-{policy}-{workload}.yaml"
        config.write_text(yaml.safe_dump(_titan_config(replicas, settings.replicas, policy)))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = titan_argv("serve", "--config", str(config), "--port", str(port))
        services.start(f"titan-{policy}-{workload}", argv, url, work, ready_path="/ready",
                       timeout_s=60, env={"TITAN_STORAGE": "memory://"})  # fmt: skip
        # Enough bodies for the whole sweep (Poisson arrivals: with a margin).
        num_requests = int(1.2 * sum(settings.rates) * settings.duration_s) + 100
        bodies = build(workload, settings.shape, settings.seed, num_requests).bodies
        points, sent = [], 0
        for arrivals in rate_points(settings.rates, seed=settings.seed):
            # Each rate goes on where the last one stopped: restarting the workload would
            # repeat prompts the replicas have just cached.
            rest = Workload(workload, bodies[sent % len(bodies) :] + bodies[: sent % len(bodies)])
            run = run_load_sync(
                LoadTarget(f"{url}/v1", MODEL),
                arrivals,
                rest,
                duration_s=settings.duration_s,
                timeout_s=settings.timeout_s,
            )
            sent += len(run.samples)
            points.append(SweepPoint(arrivals, summarize(run, Slo(ttft_s=settings.slo_ttft_s))))
        counters = [
            replica_counters(replica, _server(kind))
            for replica, kind in zip(replicas, settings.replicas, strict=True)
        ]
    knee = find_knee(points)
    return {
        "points": [
            {
                "rate": p.load,
                "ttft_s": p.summary["ttft_s"],
                "attainment": p.attainment,
                "throughput": p.summary["request_throughput"],
                "failed": p.summary["num_failed"],
            }
            for p in points
        ],
        "knee_rate": None if knee is None else knee.load,
        "knee_throughput": None if knee is None else knee.summary["request_throughput"],
        "replicas": [
            {"kind": kind, **c, "hit_rate": c["hits"] / c["queries"] if c["queries"] else None}
            for kind, c in zip(settings.replicas, counters, strict=True)
        ],
    }


def run(settings: RoutingSettings, progress: Progress) -> Results:
    with tempfile.TemporaryDirectory(prefix="titan-routing-") as work:
        return run_in(settings, progress, Path(work))


def run_in(settings: RoutingSettings, progress: Progress, work: Path) -> Results:
    cases: dict[str, dict[str, Results]] = {}
    for workload in settings.workloads:
        for policy in settings.policies:
            progress(f"{workload}: {policy}")
            case_dir = work / f"{workload}-{policy}"
            case_dir.mkdir(parents=True, exist_ok=True)
            cases.setdefault(workload, {})[policy] = run_case(settings, policy, workload, case_dir)
    return {"cases": cases}
