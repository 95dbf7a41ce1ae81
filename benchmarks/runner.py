"""Running one benchmark from ``python -m benchmarks NAME``: a live status line while it runs,
its tables on the console, then where it wrote its section of bench/RESULTS.md and its JSON."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_OUTPUT = Path("bench/RESULTS.md")

OutputOption = Annotated[
    Path, typer.Option(help="Markdown file; this benchmark's section is replaced, others kept.")
]


def fail(name: str, message: str) -> typer.Exit:
    typer.echo(f"python -m benchmarks {name}: {message}", err=True)
    return typer.Exit(2)


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

    from benchmarks.report import display_path
    from titan.errors import TitanError

    console = console or Console(log_path=False)
    try:
        with console.status("benchmarking") as status:

            def progress(message: str) -> None:
                console.log(message)
                status.update(message)

            outcome = run(progress)
    except errors as exc:
        raise fail(name, exc.message if isinstance(exc, TitanError) else str(exc)) from None
    print_console(outcome.results, console)
    written = [outcome.markdown_path, getattr(outcome, "png_path", None), outcome.json_path]
    paths = [display_path(path) for path in written if path is not None]
    console.print(f"Wrote {', '.join(paths[:-1])} and {paths[-1]}")
