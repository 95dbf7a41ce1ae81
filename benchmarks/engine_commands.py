"""``python -m benchmarks NAME`` for the embedded engine and its model (alone, or served against
llama.cpp's server), each against a baseline measured in the same run."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from benchmarks.runner import DEFAULT_OUTPUT, OutputOption, run_bench
from titan.chaos.processes import ServiceError
from titan.errors import TitanError

QuickOption = Annotated[bool, typer.Option("--quick", help="A small, fast smoke run.")]


class BenchDtype(StrEnum):
    AUTO = "auto"  # what Titan picks on this machine (bfloat16 where the CPU has it)
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


def engine(
    output: OutputOption = DEFAULT_OUTPUT,
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
    from benchmarks.engine_report import BENCHMARK
    from benchmarks.workload import BenchSettings

    overrides: dict[str, Any] = {"seed": seed, "dtype": dtype.value, "num_threads": num_threads}
    if num_requests is not None:
        overrides["num_requests"] = num_requests
    settings = BenchSettings.quick(**overrides) if quick else BenchSettings(**overrides)
    run_bench(BENCHMARK, settings, output, (TitanError,))


def structured(
    output: OutputOption = DEFAULT_OUTPUT,
    quick: Annotated[bool, typer.Option("--quick", help="4 requests, 8 tokens, 1 round.")] = False,
) -> None:
    """Constrained decoding: tokens/s with half of a 32-request batch JSON-schema constrained vs
    none, and schema compile time (first vs cached)."""
    from benchmarks.structured_bench import StructuredBenchSettings
    from benchmarks.structured_report import BENCHMARK

    settings = StructuredBenchSettings.quick() if quick else StructuredBenchSettings()
    run_bench(BENCHMARK, settings, output, (TitanError, OSError))


def planner(
    output: OutputOption = DEFAULT_OUTPUT,
    seed: Annotated[int, typer.Option(help="Seed of the traces and prompts.")] = 0,
    num_threads: Annotated[
        int | None, typer.Option(min=1, help="Torch threads (default: cores − 1).")
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Every phase on a tiny scale (about a minute): a smoke run."),
    ] = False,
) -> None:
    """The planner's simulator against the embedded engine: calibrate, then predict p50/p99
    TTFT at three held-back rates and measure them."""
    from benchmarks.planner_bench import PlannerBenchSettings
    from benchmarks.planner_report import BENCHMARK

    overrides: dict[str, Any] = {"seed": seed, "num_threads": num_threads}
    settings = (
        PlannerBenchSettings.quick(**overrides) if quick else PlannerBenchSettings(**overrides)
    )
    run_bench(BENCHMARK, settings, output, (RuntimeError, OSError, TitanError))


def quality(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """A GGUF file's own quantized blocks against the float path on the same weights: greedy
    agreement and perplexity."""
    from benchmarks import quality

    settings = quality.Settings.quick() if quick else quality.Settings()
    run_bench(quality.BENCHMARK, settings, output, (TitanError, OSError))


def cuda(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """The embedded engine on a CUDA device against the same engine on this machine's CPU."""
    from benchmarks import cuda

    settings = cuda.Settings.quick() if quick else cuda.Settings()
    run_bench(cuda.BENCHMARK, settings, output, (TitanError, OSError))


def constrained(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """Constrained output through `titan serve` with the openai SDK: schemas and tool calls
    that always complete."""
    from benchmarks import constrained

    settings = constrained.Settings.quick() if quick else constrained.Settings()
    run_bench(constrained.BENCHMARK, settings, output, (ServiceError, OSError))


def llamacpp(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """Titan's embedded engine against llama.cpp's `llama-server`, the same GGUF file, both
    over HTTP."""
    from benchmarks import llamacpp
    from benchmarks.llamacpp_report import BENCHMARK

    settings = llamacpp.Settings.quick() if quick else llamacpp.Settings()
    run_bench(BENCHMARK, settings, output, (ServiceError, OSError))
