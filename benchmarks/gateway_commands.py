"""``python -m benchmarks NAME`` for Titan's gateway over HTTP (and the load generator behind
``titan bench URL``), each against a baseline measured in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks.runner import DEFAULT_OUTPUT, OutputOption, fail, run_bench


def gateway(
    output: OutputOption = DEFAULT_OUTPUT,
    duration: Annotated[
        float | None,
        typer.Option(min=1, help="Seconds per overhead cell and system (default: 10, 2 quick)."),
    ] = None,
    litellm: Annotated[
        Path | None,
        typer.Option(
            help="The LiteLLM proxy's `litellm` script, in its own venv (default: "
            "/work/litellm-venv/bin/litellm, else `litellm` on PATH; none: LiteLLM skipped)."
        ),
    ] = None,
    wrk: Annotated[str, typer.Option(help="The wrk load generator (overhead phase).")] = "wrk",
    python_load: Annotated[
        bool,
        typer.Option(
            "--python-load",
            help="Measure the overhead with the pure-Python client instead of wrk "
            "(more client CPU on the cores the systems share).",
        ),
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="A smoke run of every phase (seconds each).")
    ] = False,
) -> None:
    """Titan vs direct vs the LiteLLM proxy: per-request overhead and hiding upstream transients."""
    import shutil

    from rich.console import Console

    from benchmarks.gateway_bench import GatewaySettings
    from benchmarks.gateway_report import BENCHMARK
    from benchmarks.gateway_systems import default_litellm
    from titan.chaos.processes import ServiceError

    wrk_path = None if python_load else shutil.which(wrk)
    if not python_load and wrk_path is None:
        raise fail(
            "gateway",
            f"{wrk!r} not found. The overhead phase uses the wrk load generator: install it "
            "(Debian/Ubuntu: `sudo apt-get install wrk`), or pass --python-load to use the "
            "slower pure-Python client.",
        )
    litellm_path = str(litellm) if litellm is not None else default_litellm()
    if litellm is not None and not litellm.exists():
        raise fail("gateway", f"--litellm {litellm} does not exist")
    overrides: dict = {"wrk": wrk_path, "litellm": litellm_path}
    if duration is not None:
        overrides["duration_s"] = duration
    settings = GatewaySettings.quick(**overrides) if quick else GatewaySettings(**overrides)

    console = Console(log_path=False)
    if litellm_path is None:
        console.print("LiteLLM not found: its runs are skipped (--litellm PATH to add them).")
    run_bench(BENCHMARK, settings, output, (ServiceError,), console)


def admission(
    output: OutputOption = DEFAULT_OUTPUT,
    duration: Annotated[
        float | None,
        typer.Option(min=0.5, help="Seconds of arrivals per goodput point (default: 15)."),
    ] = None,
    max_queue: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="admission.max_queue with admission on (default: half the deadline's worth "
            "of waiting, 40).",
        ),
    ] = None,
    redis_url: Annotated[
        str,
        typer.Option(
            help="Redis for the replicas phase: redis://HOST:PORT (an empty database of 15..1 "
            "is claimed and cleaned afterwards) or redis://HOST:PORT/N (N must be empty)."
        ),
    ] = "redis://127.0.0.1:6379",
    skip_replicas: Annotated[
        bool, typer.Option("--skip-replicas", help="No replicas phase (no Redis needed).")
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="A smoke run of every phase (seconds each).")
    ] = False,
) -> None:
    """Admission control: goodput under overload (on vs off), and a limit shared by 2 replicas."""

    from benchmarks.admission import BENCHMARK, AdmissionSettings
    from titan.chaos.processes import ServiceError

    overrides: dict = {"redis_url": None if skip_replicas else redis_url}
    if duration is not None:
        overrides["duration_s"] = duration
    if max_queue is not None:
        overrides["max_queue"] = max_queue
    settings = AdmissionSettings.quick(**overrides) if quick else AdmissionSettings(**overrides)
    run_bench(BENCHMARK, settings, output, (ServiceError, RuntimeError, OSError))


def cache(
    output: OutputOption = DEFAULT_OUTPUT,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the held-out labeled sets, semantic_cache_heldout*.jsonl (default: "
            "tests/data); the training sets are titan/cache/training's."
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="1k/5k entries and a quarter of the pairs (a smoke run)."),
    ] = False,
) -> None:
    """Response cache: semantic hits vs false hits on training and held-out labeled sets (Titan,
    its guards and pair verifier, vs GPTCache's default), the error budget against fixed
    thresholds on simulated traffic, lookup latency at 10k/100k entries, exact-hit and miss
    overheads."""

    from benchmarks.cache_bench import CacheBenchSettings
    from benchmarks.cache_report import BENCHMARK
    from titan.errors import TitanError

    overrides: dict = {"figures_dir": str(output.parent)}  # the curves beside the results
    if data is not None:
        overrides["data_dir"] = str(data)
    settings = CacheBenchSettings.quick(**overrides) if quick else CacheBenchSettings(**overrides)
    run_bench(BENCHMARK, settings, output, (TitanError, OSError))


def context(
    output: OutputOption = DEFAULT_OUTPUT,
    quick: Annotated[
        bool, typer.Option("--quick", help="20 turns, 1k chunks, 20 queries (a smoke run).")
    ] = False,
) -> None:
    """Context: a 100-turn conversation trimmed by Titan (most that fits, and with
    trim_headroom 0.5) vs the naive full history (prompt tokens, time, turns served), and
    vector store search latency at 10k chunks, with and without reranking."""

    from benchmarks.context_bench import ContextBenchSettings
    from benchmarks.context_report import BENCHMARK
    from titan.chaos.processes import ServiceError
    from titan.errors import TitanError

    settings = ContextBenchSettings.quick() if quick else ContextBenchSettings()
    run_bench(BENCHMARK, settings, output, (TitanError, ServiceError, OSError))


def jobs(
    output: OutputOption = DEFAULT_OUTPUT,
    num_jobs: Annotated[
        int | None,
        typer.Option(min=1, help="Jobs per storage mode (default: 5,000, 300 with --quick)."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(min=1, help="Seconds per interactive phase (default: 30, 5 with --quick)."),
    ] = None,
    redis_url: Annotated[
        str,
        typer.Option(
            help="Redis for the Redis mode: redis://HOST:PORT (an empty database of 15..1 is "
            "claimed per run and cleaned afterwards) or redis://HOST:PORT/N (N must be empty)."
        ),
    ] = "redis://127.0.0.1:6379",
    skip_redis: Annotated[
        bool, typer.Option("--skip-redis", help="SQLite mode only (no Redis needed).")
    ] = False,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="300 jobs, a batch of 500, 5 s phases (a smoke run)."),
    ] = False,
) -> None:
    """Async jobs: jobs/s from submit to result (SQLite, Redis) against a zero-latency model vs
    the direct pipeline, and interactive latency while a 10,000-request batch runs vs without."""

    from benchmarks.jobs_bench import JobsBenchSettings
    from benchmarks.jobs_report import BENCHMARK
    from titan.chaos.processes import ServiceError
    from titan.errors import TitanError

    overrides: dict = {"redis_url": None if skip_redis else redis_url}
    if num_jobs is not None:
        overrides["jobs"] = num_jobs
    if duration is not None:
        overrides["duration_s"] = duration
    settings = JobsBenchSettings.quick(**overrides) if quick else JobsBenchSettings(**overrides)
    run_bench(BENCHMARK, settings, output, (TitanError, ServiceError, RuntimeError, OSError))


def observability(
    output: OutputOption = DEFAULT_OUTPUT,
    duration: Annotated[
        float | None,
        typer.Option(min=1, help="Seconds per measured cell (default: 10, 2 with --quick)."),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(min=1, help="Runs of each configuration, alternated (default: 2, 1 quick)."),
    ] = None,
    wrk: Annotated[
        str, typer.Option(help="The wrk load generator; where it is missing, the Python client.")
    ] = "wrk",
    python_load: Annotated[
        bool,
        typer.Option("--python-load", help="The pure-Python client even where wrk is installed."),
    ] = False,
    sample_ratio: Annotated[
        float,
        typer.Option(min=0, max=1, help="Share of requests traced when on (1: every one)."),
    ] = 0.1,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="One 2 s round of each, 8 connections (a smoke run)."),
    ] = False,
) -> None:
    """Metrics, request logs and tracing on vs off: what they cost Titan's throughput
    (non-streaming and streaming, in front of a 20 ms simulated upstream)."""
    import shutil

    from rich.console import Console

    from benchmarks.observability_bench import ObservabilitySettings
    from benchmarks.observability_report import BENCHMARK
    from titan.chaos.processes import ServiceError

    wrk_path = None if python_load else shutil.which(wrk)
    overrides: dict = {"wrk": wrk_path, "sample_ratio": sample_ratio}
    if duration is not None:
        overrides["duration_s"] = duration
    if rounds is not None:
        overrides["rounds"] = rounds
    settings = (
        ObservabilitySettings.quick(**overrides) if quick else ObservabilitySettings(**overrides)
    )
    console = Console(log_path=False)
    if wrk_path is None and not python_load:
        console.print(f"{wrk!r} not found: the pure-Python client makes the load.")
    run_bench(BENCHMARK, settings, output, (ServiceError, RuntimeError, OSError), console)


def loadgen(
    output: OutputOption = DEFAULT_OUTPUT,
    duration: Annotated[
        float | None,
        typer.Option(min=1, help="Seconds per measured run (default: 10, 3 with --quick)."),
    ] = None,
    rate: Annotated[float, typer.Option(min=1, help="The offered open-loop rate.")] = 1000.0,
    wrk: Annotated[str, typer.Option(help="wrk, the baseline (skipped where missing).")] = "wrk",
    quick: Annotated[bool, typer.Option("--quick", help="3 s runs (a smoke run).")] = False,
) -> None:
    """The load generator itself: the cores it uses at 1,000 requests/s (open loop, whole
    answers and streams) against a near-zero-latency simulator, and its CPU per request next to
    wrk's at full speed."""
    import shutil

    from benchmarks.loadgen_bench import LoadgenSettings
    from benchmarks.loadgen_report import BENCHMARK
    from titan.chaos.processes import ServiceError

    overrides: dict[str, Any] = {"wrk": shutil.which(wrk), "rate": rate}
    if duration is not None:
        overrides["duration_s"] = duration
    settings = LoadgenSettings.quick(**overrides) if quick else LoadgenSettings(**overrides)
    run_bench(BENCHMARK, settings, output, (ServiceError, RuntimeError, OSError))


def routing(
    output: OutputOption = DEFAULT_OUTPUT,
    policies: Annotated[
        str, typer.Option(help="Comma-separated routing policies to compare.")
    ] = "round_robin,p2c_ewma,prefix_affinity,scored",
    workloads: Annotated[
        str, typer.Option(help="Comma-separated workloads: tenants, conversations, unique.")
    ] = "tenants,conversations,unique",
    servers: Annotated[
        str, typer.Option(help="simulated (four titan simulate) or titan (two real replicas).")
    ] = "simulated",
    duration: Annotated[
        float | None, typer.Option(min=1, help="Seconds per sweep rate (default: 10, 2 quick).")
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Small workloads, two rates (a smoke run).")
    ] = False,
) -> None:
    """Routing policies over four simulated model servers (one at half capacity), or two real
    Titan replicas: TTFT, the knee, prefix-cache hit rate per replica and imbalance, on
    shared-prefix and unique traffic."""
    from dataclasses import replace

    from benchmarks.routing_bench import POLICIES, RoutingSettings
    from benchmarks.routing_report import BENCHMARK, TITAN_BENCHMARK
    from benchmarks.routing_workloads import WORKLOADS
    from titan.chaos.processes import ServiceError

    overrides: dict[str, Any] = {
        "policies": tuple(p.strip() for p in policies.split(",")),
        "workloads": tuple(w.strip() for w in workloads.split(",")),
    }
    if duration is not None:
        overrides["duration_s"] = duration
    for option, given, known in (("--policies", overrides["policies"], POLICIES),
                                 ("--workloads", overrides["workloads"], WORKLOADS)):  # fmt: skip
        if unknown := [name for name in given if name not in known]:
            raise typer.BadParameter(f"{option}: unknown {unknown}; one of {', '.join(known)}")
    if servers not in ("simulated", "titan"):
        raise typer.BadParameter(f"--servers must be simulated or titan, got {servers!r}")
    if servers == "titan":
        settings = RoutingSettings.titan_fleet(**overrides)
        if quick:
            settings = replace(settings, rates=(0.5, 1.0), duration_s=duration or 5.0,
                               is_quick=True)  # fmt: skip
        benchmark = TITAN_BENCHMARK
    else:
        settings = RoutingSettings.quick(**overrides) if quick else RoutingSettings(**overrides)
        benchmark = BENCHMARK
    run_bench(benchmark, settings, output, (ServiceError, RuntimeError, OSError))
