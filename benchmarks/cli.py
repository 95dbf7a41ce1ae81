"""``python -m benchmarks NAME [--quick] [--output bench/RESULTS.md] [options]``: one benchmark,
its section of bench/RESULTS.md replaced and its raw numbers under bench/out/."""

from __future__ import annotations

import typer

from benchmarks import engine_commands, gateway_commands

ENGINE = ("engine", "structured", "planner", "quality", "cuda", "constrained", "llamacpp")
GATEWAY = (
    "gateway", "admission", "cache", "context", "jobs", "observability", "loadgen", "routing",
)  # fmt: skip


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="python -m benchmarks",
        help="Titan's benchmarks, each against a baseline measured in the same run.",
        no_args_is_help=True,
        add_completion=False,
    )
    for module, names in ((engine_commands, ENGINE), (gateway_commands, GATEWAY)):
        for name in names:
            app.command(name)(getattr(module, name))
    return app
