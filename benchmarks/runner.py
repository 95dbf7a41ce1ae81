"""Running one benchmark from ``python -m benchmarks NAME``: a live status line while it runs,
its tables on the console, then where it wrote its section of bench/RESULTS.md and its JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks.base import Benchmark, measure
from benchmarks.results_file import display_path

DEFAULT_OUTPUT = Path("bench/RESULTS.md")

OutputOption = Annotated[
    Path, typer.Option(help="Markdown file; this benchmark's section is replaced, others kept.")
]


def fail(name: str, message: str) -> typer.Exit:
    typer.echo(f"python -m benchmarks {name}: {message}", err=True)
    return typer.Exit(2)


def run_bench(
    benchmark: Benchmark,
    settings: Any,
    output: Path,
    errors: tuple[type[BaseException], ...],
    console: Any = None,
) -> None:
    """Runs ``benchmark`` with a live status line, prints its tables and where it wrote them;
    ``errors`` (a missing model, a service that would not start) end it with exit code 2."""
    from rich.console import Console

    from titan.cli.tables import print_tables
    from titan.errors import TitanError

    console = console or Console(log_path=False)
    try:
        with console.status("benchmarking") as status:

            def progress(message: str) -> None:
                console.log(message)
                status.update(message)

            outcome = measure(benchmark, settings, output, progress)
    except errors as exc:
        message = exc.message if isinstance(exc, TitanError) else str(exc)
        raise fail(benchmark.name, message) from None
    if benchmark.tables is None:
        section = benchmark.markdown(outcome.results, display_path(outcome.json_path))
        console.print(section, markup=False, highlight=False)
    else:
        print_tables(benchmark.tables(outcome.results), console)
    console.print(
        f"Wrote {display_path(outcome.markdown_path)} and {display_path(outcome.json_path)}"
    )
