"""``titan bench``: benchmarks whose results go to bench/RESULTS.md (see titan/bench)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

bench_app = typer.Typer(
    help="Benchmarks, each against a baseline measured in the same run.",
    no_args_is_help=True,
    add_completion=False,
)


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
    from rich.console import Console

    from titan.bench import report
    from titan.bench.engine_bench import BenchSettings, bench_engine
    from titan.errors import TitanError

    overrides = {"seed": seed, "dtype": dtype.value, "num_threads": num_threads}
    if num_requests is not None:
        overrides["num_requests"] = num_requests
    settings = BenchSettings.quick(**overrides) if quick else BenchSettings(**overrides)

    console = Console(log_path=False)
    try:
        with console.status("benchmarking") as status:

            def progress(message: str) -> None:
                console.log(message)
                status.update(message)

            outcome = bench_engine(settings, output=output, progress=progress)
    except TitanError as exc:  # e.g. the default model is not installed
        typer.echo(f"titan bench engine: {exc.message}", err=True)
        raise typer.Exit(2) from None
    report.print_console(outcome.results, console)
    console.print(
        f"Wrote {report.display_path(outcome.markdown_path)} and "
        f"{report.display_path(outcome.json_path)}"
    )
