"""``titan bench URL``: load-test any OpenAI-compatible endpoint (see docs/load-testing.md).

Titan's own benchmarks against baselines live in the repository's ``benchmarks/`` (not installed).
"""

from __future__ import annotations

import os
import shlex
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from titan.cli.options import ApiKeyOption, ConfigOption, client_settings

DEFAULT_CONCURRENCY = 16
DEFAULT_DURATION_S = 30.0
BURST_WORKLOAD_BURSTINESS = 0.25  # gamma shape: gaps with a coefficient of variation of 2
MODELS_TIMEOUT_S = 10.0


class EndpointKind(StrEnum):
    CHAT = "chat"  # /v1/chat/completions
    COMPLETIONS = "completions"  # /v1/completions


def _fail(message: str) -> typer.Exit:
    typer.echo(f"titan bench: {message}", err=True)
    return typer.Exit(2)


def _arrival_points(
    concurrency: int | None,
    rate: float | None,
    burstiness: float | None,
    sweep_rate: str | None,
    sweep_concurrency: str | None,
    workload: str,
    seed: int,
) -> list[Any]:
    """The runs' arrivals from the flags; raises ValueError with a message for the user."""
    from titan.loadgen import ClosedLoop, OpenLoop
    from titan.loadgen.sweep import concurrency_points, parse_loads, rate_points

    given = [
        name
        for name, value in (
            ("--concurrency", concurrency),
            ("--rate", rate),
            ("--sweep-rate", sweep_rate),
            ("--sweep-concurrency", sweep_concurrency),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} exclude each other: choose one")
    is_open = rate is not None or sweep_rate is not None
    if burstiness is not None and not is_open:
        raise ValueError(
            "--burstiness shapes open-loop arrivals: use it with --rate or --sweep-rate"
        )
    if workload == "burst" and not is_open:
        raise ValueError("the burst workload sends in bursts: it needs --rate or --sweep-rate")
    if burstiness is None:
        burstiness = BURST_WORKLOAD_BURSTINESS if workload == "burst" else 1.0
    if burstiness <= 0:
        raise ValueError("--burstiness must be above 0")
    if sweep_rate is not None:
        return rate_points(parse_loads(sweep_rate), burstiness, seed)
    if sweep_concurrency is not None:
        return concurrency_points(parse_loads(sweep_concurrency))
    if rate is not None:
        if not rate > 0:
            raise ValueError("--rate must be above 0")
        return [OpenLoop(rate, burstiness, seed)]
    return [ClosedLoop(concurrency or DEFAULT_CONCURRENCY)]


def discover_model(base_url: str, api_key: str | None) -> str:
    """The first model GET /v1/models lists. Raises TitanError with a one-line reason."""
    import urllib.error
    import urllib.request

    import orjson

    from titan.errors import ConfigError, UpstreamConnectionError
    from titan.loadgen.wire import Endpoint

    url = Endpoint.of(base_url).url("/models")
    request = urllib.request.Request(url, headers={"User-Agent": "titan-bench"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=MODELS_TIMEOUT_S) as response:
            listing = orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = f"GET {url} answered {exc.code} {exc.reason}; pass --model (and --api-key)"
        raise UpstreamConnectionError(message) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UpstreamConnectionError(f"cannot reach {url}: {reason}") from None
    except orjson.JSONDecodeError:
        raise ConfigError(f"GET {url} did not answer JSON; pass --model") from None
    models = listing.get("data") if isinstance(listing, dict) else None
    if not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise ConfigError(f"GET {url} lists no model; pass --model")
    return str(models[0]["id"])


def check_reachable(base_url: str) -> None:
    """A TCP connection to the endpoint opens; raises UpstreamConnectionError otherwise."""
    import socket

    from titan.errors import UpstreamConnectionError
    from titan.loadgen.wire import Endpoint

    endpoint = Endpoint.of(base_url)
    try:
        socket.create_connection((endpoint.host, endpoint.port), timeout=MODELS_TIMEOUT_S).close()
    except OSError as exc:
        raise UpstreamConnectionError(f"cannot reach {endpoint.authority}: {exc}") from None


def report_meta(
    url: str, model: str, api_key: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    """How the load test ran, for its report (never the API key, even from the command line)."""
    import platform
    from datetime import UTC, datetime
    from importlib import metadata

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    machine = {"platform": platform.platform(), "num_cores": os.cpu_count()}
    versions = {"python": platform.python_version(), "titan": metadata.version("titan")}
    arguments = sys.argv[1:] if not api_key else [a.replace(api_key, "***") for a in sys.argv[1:]]
    command = shlex.join([Path(sys.argv[0]).name, *arguments])
    return {
        "url": url,
        "model": model,
        "started_at": started_at,
        "command": command,
        **options,
        "machine": machine,
        "versions": versions,
    }


def bench_url(
    url: Annotated[
        str,
        typer.Argument(
            metavar="URL", help="The endpoint, e.g. http://HOST:PORT/v1 (/v1 added if missing)."
        ),
    ],
    model: Annotated[
        str | None, typer.Option(help="The model to ask for (default: the first of /v1/models).")
    ] = None,
    api_key: ApiKeyOption = None,
    config_file: ConfigOption = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help=f"Closed loop: N clients (default: {DEFAULT_CONCURRENCY})."),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Open loop: requests/s on average (inf: all at once).")
    ] = None,
    burstiness: Annotated[
        float | None,
        typer.Option(
            help="Open loop: gamma shape of the gaps; 1 Poisson, < 1 burstier "
            f"(default: 1, {BURST_WORKLOAD_BURSTINESS} for the burst workload)."
        ),
    ] = None,
    sweep_rate: Annotated[
        str | None, typer.Option(help="Open-loop runs at each rate, e.g. 1,2,4,8.")
    ] = None,
    sweep_concurrency: Annotated[
        str | None, typer.Option(help="Closed-loop runs at each concurrency, e.g. 1,4,16.")
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            help=f"Seconds of sending per run (default: "
            f"{DEFAULT_DURATION_S:g} unless --num-requests).",
        ),
    ] = None,
    num_requests: Annotated[
        int | None, typer.Option(min=1, help="Requests per run (with --duration: whichever first).")
    ] = None,
    workload: Annotated[
        str, typer.Option(help="chat, long, shared-prefix, burst, or jsonl:PATH.")
    ] = "chat",
    max_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="Every request's max_tokens (default: the workload's)."),
    ] = None,
    no_stream: Annotated[
        bool, typer.Option("--no-stream", help="Whole answers (TTFT = E2E, no TPOT or ITL).")
    ] = False,
    endpoint: Annotated[
        EndpointKind, typer.Option(help="chat: /v1/chat/completions; completions: /v1/completions.")
    ] = EndpointKind.CHAT,
    slo_ttft_ms: Annotated[float | None, typer.Option(min=0, help="SLO on TTFT (ms).")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(min=0, help="SLO on TPOT (ms).")] = None,
    slo_e2e_ms: Annotated[float | None, typer.Option(min=0, help="SLO on E2E (ms).")] = None,
    output: Annotated[
        Path | None, typer.Option(help="Folder for report.json and report.html.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the arrivals.")] = 0,
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds per request.")] = 60.0,
) -> None:
    """Load-test an OpenAI-compatible endpoint: throughput, goodput, TTFT, TPOT, ITL, E2E.

    titan bench http://127.0.0.1:8000/v1 --sweep-rate 1,2,4,8 --slo-ttft-ms 500 --output out/
    """
    from rich.console import Console

    from titan.errors import TitanError
    from titan.loadgen import LoadTarget, Slo, find_knee, run_sweep, workload_by_name
    from titan.loadgen.console import LiveProgress, print_point, print_sweep
    from titan.loadgen.report import build_report, write_report
    from titan.loadgen.wire import Endpoint

    try:
        points = _arrival_points(
            concurrency, rate, burstiness, sweep_rate, sweep_concurrency, workload, seed
        )
        if rate is not None and rate == float("inf") and num_requests is None:
            raise ValueError("--rate inf sends everything at once: it needs --num-requests")
        Endpoint.of(url)
        load = workload_by_name(workload, seed=seed, max_tokens=max_tokens, stream=not no_stream)
        if endpoint is EndpointKind.COMPLETIONS:
            load = load.as_completions()
        key = client_settings(config_file, None, api_key).config.client.bearer()
        if model is None:
            model = discover_model(url, key)
        else:
            check_reachable(url)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    except TitanError as exc:
        raise _fail(exc.message) from None

    if duration is None and num_requests is None:
        duration = DEFAULT_DURATION_S
    objectives_ms = (slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)
    slo = Slo(*(None if value is None else value / 1000 for value in objectives_ms))
    console = Console(log_path=False)
    console.print(
        f"titan bench {url}: model {model}, workload {workload}"
        f"{', whole answers' if no_stream else ', streams'}, {len(points)} run"
        f"{'s' if len(points) > 1 else ''}"
    )
    progress = LiveProgress(console, duration, num_requests)
    try:
        with progress:
            done = run_sweep(
                LoadTarget(url, model, key),
                points,
                load,
                slo=slo,
                on_point_start=progress.start_point,
                on_sample=progress.on_sample,
                on_point_done=lambda point: print_point(progress.progress.console, point),
                duration_s=duration,
                num_requests=num_requests,
                timeout_s=timeout,
            )
    except KeyboardInterrupt:
        typer.echo("titan bench: interrupted", err=True)
        raise typer.Exit(130) from None
    knee = find_knee(done)
    if len(done) > 1:
        print_sweep(console, done, knee)
    if output is not None:
        options = {
            "workload": workload,
            "stream": not no_stream,
            "endpoint": endpoint.value,
            "duration_s": duration,
            "num_requests": num_requests,
            "timeout_s": timeout,
            "seed": seed,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
        }
        report = build_report(done, knee, report_meta(url, model, key, options))
        try:
            json_path, html_path = write_report(output, report)
        except OSError as exc:
            raise _fail(f"cannot write the report to {output}: {exc}") from None
        console.print(f"Wrote {json_path} and {html_path}")
