"""``python -m benchmarks NAME`` for the embedded engine and its model (alone, or served against
llama.cpp's server), each against a baseline measured in the same run."""

from __future__ import annotations

import shlex
import sys
import tempfile
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks.runner import DEFAULT_OUTPUT, OutputOption, run_bench

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
    from titan.errors import TitanError

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
    from titan.errors import TitanError

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
    from titan.errors import TitanError

    overrides: dict[str, Any] = {"seed": seed, "num_threads": num_threads}
    settings = (
        PlannerBenchSettings.quick(**overrides) if quick else PlannerBenchSettings(**overrides)
    )
    run_bench(BENCHMARK, settings, output, (RuntimeError, OSError, TitanError))


def quality(output: OutputOption = DEFAULT_OUTPUT) -> None:
    """A GGUF file's own quantized blocks against the float path on the same weights: greedy
    agreement and perplexity."""
    from benchmarks import quality

    _print_and_write(output, quality.render_markdown(quality.run_all(), _command()), quality)


def cuda(output: OutputOption = DEFAULT_OUTPUT) -> None:
    """The embedded engine on a CUDA device against the same engine on this machine's CPU."""
    from benchmarks import cuda

    _print_and_write(output, cuda.render_markdown(cuda.run(), _command()), cuda)


def constrained(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """Constrained output through `titan serve` with the openai SDK: schemas and tool calls
    that always complete."""
    from benchmarks import constrained

    settings = constrained.Settings.quick() if quick else constrained.Settings()
    results = _served(constrained.run, settings)
    _save_json(output, constrained.BENCHMARK, results)
    section = constrained.render_markdown(results, _command())
    _print_and_write(None if quick else output, section, constrained)


def llamacpp(output: OutputOption = DEFAULT_OUTPUT, quick: QuickOption = False) -> None:
    """Titan's embedded engine against llama.cpp's `llama-server`, the same GGUF file, both
    over HTTP."""
    from benchmarks import llamacpp, llamacpp_report

    settings = llamacpp.Settings.quick() if quick else llamacpp.Settings()
    results = _served(llamacpp.run, settings)
    json_path = _save_json(output, llamacpp_report.BENCHMARK, results)
    section = llamacpp_report.render_markdown(results, _command(), json_path.name)
    _print_and_write(None if quick else output, section, llamacpp_report)


def _command() -> str:
    return shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])


def _print_and_write(output: Path | None, section: str, module: Any) -> None:
    from benchmarks.results_file import write_section

    print(section)
    if output is not None:
        write_section(output, section, module.BENCHMARK)


def _served(run: Callable[..., dict], settings: object) -> dict:
    """A benchmark that starts servers, run in a work folder of its own."""
    with tempfile.TemporaryDirectory(prefix="titan-bench-") as work:
        return run(settings, Path(work), say=lambda text: print(text, flush=True))


def _save_json(output: Path, benchmark: str, results: dict) -> Path:
    import orjson

    from benchmarks.results_file import json_path_for

    out_dir = output.parent / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path_for(out_dir, benchmark)
    json_path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return json_path
