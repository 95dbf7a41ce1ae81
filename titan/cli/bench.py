"""``titan bench``: benchmarks whose results go to bench/RESULTS.md (see titan/bench)."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from titan.cli.bench_url import BenchGroup, loadgen, register
from titan.cli.plan import planner

bench_app = typer.Typer(
    cls=BenchGroup,
    help="Benchmarks, each against a baseline measured in the same run.",
    no_args_is_help=True,
    add_completion=False,
)


def run_bench(
    name: str,
    run: Callable[[Callable[[str], None]], Any],
    print_console: Callable[[dict[str, Any], Any], None],
    errors: tuple[type[BaseException], ...],
    console: Any = None,
) -> None:
    """Runs a benchmark with a live status line, prints its tables and where it wrote them;
    ``errors`` (a missing model, a service that would not start) end it with exit code 2."""
    from rich.console import Console

    from titan.bench.report import display_path
    from titan.errors import TitanError

    console = console or Console(log_path=False)
    try:
        with console.status("benchmarking") as status:

            def progress(message: str) -> None:
                console.log(message)
                status.update(message)

            outcome = run(progress)
    except errors as exc:
        message = exc.message if isinstance(exc, TitanError) else str(exc)
        typer.echo(f"titan bench {name}: {message}", err=True)
        raise typer.Exit(2) from None
    print_console(outcome.results, console)
    written = [outcome.markdown_path, getattr(outcome, "png_path", None), outcome.json_path]
    paths = [display_path(path) for path in written if path is not None]
    console.print(f"Wrote {', '.join(paths[:-1])} and {paths[-1]}")


class BenchDtype(StrEnum):
    AUTO = "auto"  # what Titan picks on this machine (bfloat16 where the CPU has it)
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


@bench_app.command("engine")
def engine(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the engine section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
    dtype: Annotated[
        BenchDtype, typer.Option(help="The same for every system; auto: Titan's choice.")
    ] = BenchDtype.AUTO,
    num_requests: Annotated[
        int | None,
        typer.Option(min=1, help="Requests in the workload (default: 32, or 4 with --quick)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload's prompts and lengths.")] = 0,
    num_threads: Annotated[
        int | None,
        typer.Option(min=1, help="Torch threads for every system (default: cores - 1)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="A tiny smoke run of every phase (seconds).")
    ] = False,
) -> None:
    """Titan's engine vs HF transformers generate: throughput, TTFT, decode speed, head-of-line."""
    # Imported here so that `titan --help` stays quick.

    from titan.bench import report
    from titan.bench.engine_bench import BenchSettings, bench_engine
    from titan.errors import TitanError

    overrides = {"seed": seed, "dtype": dtype.value, "num_threads": num_threads}
    if num_requests is not None:
        overrides["num_requests"] = num_requests
    settings = BenchSettings.quick(**overrides) if quick else BenchSettings(**overrides)

    run_bench(
        "engine",
        lambda progress: bench_engine(settings, output=output, progress=progress),
        report.print_console,
        (TitanError,),
    )


@bench_app.command("gateway")
def gateway(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the gateway section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
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

    from titan.bench import gateway_report
    from titan.bench.gateway_bench import GatewaySettings, bench_gateway
    from titan.bench.gateway_systems import default_litellm
    from titan.bench.processes import ServiceError

    wrk_path = None if python_load else shutil.which(wrk)
    if not python_load and wrk_path is None:
        typer.echo(
            f"titan bench gateway: {wrk!r} not found. The overhead phase uses the wrk load "
            "generator: install it (Debian/Ubuntu: `sudo apt-get install wrk`), or pass "
            "--python-load to use the slower pure-Python client.",
            err=True,
        )
        raise typer.Exit(2)
    litellm_path = str(litellm) if litellm is not None else default_litellm()
    if litellm is not None and not litellm.exists():
        typer.echo(f"titan bench gateway: --litellm {litellm} does not exist", err=True)
        raise typer.Exit(2)
    overrides: dict = {"wrk": wrk_path, "litellm": litellm_path}
    if duration is not None:
        overrides["duration_s"] = duration
    settings = GatewaySettings.quick(**overrides) if quick else GatewaySettings(**overrides)

    console = Console(log_path=False)
    if litellm_path is None:
        console.print("LiteLLM not found: its runs are skipped (--litellm PATH to add them).")
    run_bench(
        "gateway",
        lambda progress: bench_gateway(settings, output=output, progress=progress),
        gateway_report.print_console,
        (ServiceError,),
        console,
    )


@bench_app.command("admission")
def admission(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the admission section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
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

    from titan.bench.admission import AdmissionSettings, bench_admission, print_console
    from titan.bench.processes import ServiceError

    overrides: dict = {"redis_url": None if skip_replicas else redis_url}
    if duration is not None:
        overrides["duration_s"] = duration
    if max_queue is not None:
        overrides["max_queue"] = max_queue
    settings = AdmissionSettings.quick(**overrides) if quick else AdmissionSettings(**overrides)
    run_bench(
        "admission",
        lambda progress: bench_admission(settings, output=output, progress=progress),
        print_console,
        (ServiceError, RuntimeError, OSError),
    )


@bench_app.command("cache")
def cache(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the cache section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
    data: Annotated[
        Path | None,
        typer.Option(
            help="Folder of the labeled sets: semantic_cache_pairs, _calibration and _heldout "
            ".jsonl (default: tests/data)."
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="1k/5k entries and a quarter of the pairs (a smoke run)."),
    ] = False,
) -> None:
    """Response cache: semantic hits vs false hits on training and held-out labeled sets (Titan
    vs GPTCache's default), the error budget against fixed thresholds on simulated traffic,
    lookup latency at 10k/100k entries, exact-hit and miss overheads."""

    from titan.bench.cache_bench import CacheBenchSettings, bench_cache
    from titan.bench.cache_report import print_console
    from titan.errors import TitanError
    from titan.service.cache_replay import replay_whole

    overrides: dict = {} if data is None else {"data_dir": str(data)}
    settings = CacheBenchSettings.quick(**overrides) if quick else CacheBenchSettings(**overrides)
    run_bench(
        "cache",
        lambda progress: bench_cache(settings, replay_whole, output=output, progress=progress),
        print_console,
        (TitanError, OSError),
    )


@bench_app.command("context")
def context(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the context section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
    quick: Annotated[
        bool, typer.Option("--quick", help="20 turns, 1k chunks, 20 queries (a smoke run).")
    ] = False,
) -> None:
    """Context: a 100-turn conversation trimmed by Titan (most that fits, and with
    trim_headroom 0.5) vs the naive full history (prompt tokens, time, turns served), and
    vector store search latency at 10k chunks, with and without reranking."""

    from titan.bench.context_bench import ContextBenchSettings, bench_context
    from titan.bench.context_report import print_console
    from titan.bench.processes import ServiceError
    from titan.errors import TitanError

    settings = ContextBenchSettings.quick() if quick else ContextBenchSettings()
    run_bench(
        "context",
        lambda progress: bench_context(settings, output=output, progress=progress),
        print_console,
        (TitanError, ServiceError, OSError),
    )


@bench_app.command("jobs")
def jobs(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the jobs section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
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

    from titan.bench.jobs_bench import InProcess, JobsBenchSettings, bench_jobs
    from titan.bench.jobs_report import print_console
    from titan.bench.processes import ServiceError
    from titan.errors import TitanError
    from titan.service import build_pipeline

    overrides: dict = {"redis_url": None if skip_redis else redis_url}
    if num_jobs is not None:
        overrides["jobs"] = num_jobs
    if duration is not None:
        overrides["duration_s"] = duration
    settings = JobsBenchSettings.quick(**overrides) if quick else JobsBenchSettings(**overrides)
    hooks = InProcess(
        build_pipeline=build_pipeline, jobs_of=lambda pipeline: pipeline.services.jobs
    )
    run_bench(
        "jobs",
        lambda progress: bench_jobs(settings, hooks, output=output, progress=progress),
        print_console,
        (TitanError, ServiceError, RuntimeError, OSError),
    )


@bench_app.command("observability")
def observability(
    output: Annotated[
        Path,
        typer.Option(help="Markdown file; the observability section is replaced, others kept."),
    ] = Path("bench/RESULTS.md"),
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

    from titan.bench.observability_bench import ObservabilitySettings, bench_observability
    from titan.bench.observability_report import print_console
    from titan.bench.processes import ServiceError

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
    run_bench(
        "observability",
        lambda progress: bench_observability(settings, output=output, progress=progress),
        print_console,
        (ServiceError, RuntimeError, OSError),
        console,
    )


register(bench_app)  # titan bench http://… [options]: any OpenAI-compatible endpoint


@bench_app.command("structured")
def structured(
    output: Annotated[
        Path, typer.Option(help="Markdown file; the structured section is replaced, others kept.")
    ] = Path("bench/RESULTS.md"),
    quick: Annotated[bool, typer.Option("--quick", help="4 requests, 8 tokens, 1 round.")] = False,
) -> None:
    """Constrained decoding: tokens/s with half of a 32-request batch JSON-schema constrained vs
    none, and schema compile time (first vs cached)."""
    from titan.bench.structured_bench import StructuredBenchSettings, bench_structured
    from titan.bench.structured_report import print_console
    from titan.errors import TitanError

    settings = StructuredBenchSettings.quick() if quick else StructuredBenchSettings()
    run_bench(
        "structured",
        lambda progress: bench_structured(settings, output=output, progress=progress),
        print_console,
        (TitanError, OSError),
    )


bench_app.command("loadgen")(loadgen)
bench_app.command("planner")(planner)
