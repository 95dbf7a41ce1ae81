"""``titan chaos SCENARIO``: run a chaos scenario (backends, Titan, a load, a timeline of faults)
and judge its assertions. Exit 0: every assertion passed; 1: one failed; 2: a bad scenario or
usage, or a system that would not start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from titan.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from titan.chaos.runner import ChaosResult, RunProgress
    from titan.chaos.scenario import Scenario

EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_OUTPUT = Path("chaos-results")


def chaos(
    scenario: Annotated[
        str | None,
        typer.Argument(help="A scenario YAML file, or the name of a shipped one (see --list)."),
    ] = None,
    list_scenarios: Annotated[
        bool, typer.Option("--list", help="List the shipped scenarios and exit.")
    ] = False,
    time_scale: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="Multiply every time on the scenario's timeline (0.2: five times shorter).",
        ),
    ] = 1.0,
    output: Annotated[
        Path | None,
        typer.Option(
            help="Where report.json, report.html, configs and logs go "
            "[default: chaos-results/NAME]."
        ),
    ] = None,
) -> None:
    """Run a chaos scenario against Titan and check its SLO assertions."""
    from rich.console import Console

    console = Console(log_path=False, highlight=False)
    if list_scenarios:
        _list(console)
        return
    if scenario is None:
        _usage("give a SCENARIO: a YAML file or a shipped scenario's name (--list shows them)")
    from titan.chaos.scenario_files import load_scenario

    try:
        loaded = load_scenario(scenario)
        scaled = loaded.scenario.scaled(time_scale)
    except ConfigError as exc:
        _usage(exc.message)
    folder = output if output is not None else DEFAULT_OUTPUT / scaled.name
    result = _run(console, scaled, loaded.source, time_scale, folder)

    from titan.chaos.report import write_report

    json_path, html_path = write_report(result, folder)
    _print_verdicts(console, result)
    console.print(f"Wrote {html_path} and {json_path}")
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)


def _usage(message: str) -> NoReturn:
    typer.echo(f"titan chaos: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


def _list(console: Console) -> None:
    from rich.table import Table

    from titan.chaos.scenario_files import load_scenario, shipped_scenarios

    table = Table("scenario", "duration", "what it shows", box=None)
    for name, path in shipped_scenarios().items():
        try:
            scenario = load_scenario(str(path)).scenario
        except ConfigError as exc:
            table.add_row(name, "", f"[red]invalid: {exc.message}[/red]")
            continue
        summary = scenario.description.strip().split("\n")[0]
        table.add_row(name, f"{scenario.duration_s:g} s", summary)
    console.print(table)


def _run(
    console: Console, scenario: Scenario, source: str, time_scale: float, folder: Path
) -> ChaosResult:
    from titan.chaos.processes import ServiceError
    from titan.chaos.runner import run_scenario
    from titan.loadgen.runner import new_event_loop

    workspace = folder / "run"
    workspace.mkdir(parents=True, exist_ok=True)
    with _RichProgress(console, scenario.name) as progress:
        try:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:  # uvloop: a cheaper load
                return runner.run(
                    run_scenario(
                        scenario,
                        source=source,
                        time_scale=time_scale,
                        workspace=workspace,
                        progress=progress,
                    )
                )
        except ServiceError as exc:
            first_line = str(exc).splitlines()[0]
            _usage(f"{first_line} (logs: {workspace / 'logs'})")
        except ConfigError as exc:
            _usage(exc.message)


class _RichProgress:
    """The run's progress on the terminal: a bar over the timeline, live counts, events."""

    def __init__(self, console: Console, name: str):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self._console = console
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task(f"{name}: starting", total=None, status="")
        self._name = name

    def __enter__(self) -> _RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def phase(self, text: str) -> None:
        self._progress.update(self._task, description=f"{self._name}: {text}")
        self._console.log(text)

    def event(self, text: str) -> None:
        self._console.log(text)

    def update(self, progress: RunProgress) -> None:
        faults = ", ".join(progress.active_faults) or "none"
        breakers = ", ".join(progress.open_breakers) or "none"
        status = (
            f"{progress.elapsed_s:5.1f}/{progress.duration_s:g} s · {progress.num_requests} req · "
            f"{progress.num_failed} failed · faults: {faults} · open breakers: {breakers}"
        )
        self._progress.update(
            self._task, total=progress.duration_s, completed=progress.elapsed_s, status=status
        )


def _print_verdicts(console: Console, result: ChaosResult) -> None:
    from rich.table import Table

    table = Table("", "check", "scope", "measured", title=f"{result.scenario.name}")
    for verdict in result.verdicts:
        mark = "[green]pass[/green]" if verdict.passed else "[red]FAIL[/red]"
        measured = "—" if verdict.measured is None else f"{verdict.measured:.4g}"
        table.add_row(mark, verdict.check, verdict.scope, measured)
    console.print(table)
    outcome = "[green]passed[/green]" if result.passed else "[red]failed[/red]"
    console.print(f"{result.scenario.name}: {outcome} in {result.wall_s:.1f} s")
