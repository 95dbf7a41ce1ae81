"""The load generator benchmark's report: targets, its section of bench/RESULTS.md and
the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import loadgen_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.loadgen_bench import MAX_CORES, MIN_DELIVERED, MODES
from benchmarks.results_file import check, markdown_table, opening_lines, targets_table

NAME = "loadgen"
SECTION_START, SECTION_END = results_file.markers(NAME)
RUN_LABELS = {
    "open": "load generator, open loop",
    "closed": "load generator, closed loop",
    "wrk": "wrk (baseline), closed loop",
}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rate = results["meta"]["settings"]["rate"]
    checks = []
    for mode in MODES:
        cells = results["modes"][mode]["cells"]
        cores = cells["open"]["client_cores"]
        checks.append(
            check(
                f"load generator cores at {rate:g} requests/s, {mode}",
                cores,
                f"≤ {MAX_CORES:g}",
                cores is not None and cores <= MAX_CORES,
                digits=2,
            )
        )
        open_cell = cells["open"]
        scheduled = open_cell["num_scheduled"]
        delivered = open_cell["num_ok"] / scheduled if scheduled else None
        checks.append(
            check(
                f"answered ÷ scheduled at {rate:g}/s, {mode}",
                None if delivered is None else 100 * delivered,
                f"≥ {100 * MIN_DELIVERED:g}%",
                delivered is not None and delivered >= MIN_DELIVERED,
                "%",
                1,
            )
        )
        ours, wrk = cells["closed"]["client_cpu_us_per_request"], cells.get("wrk", {})
        theirs = wrk.get("client_cpu_us_per_request")
        ratio = ours / theirs if ours is not None and theirs else None
        checks.append(
            check(f"CPU per request, load generator ÷ wrk, {mode}", ratio, "info", None, "×", 2)
        )
    return checks


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    settings = results["meta"]["settings"]
    tables = {"Targets": targets_table(results["targets"], _num)}
    header = [
        "run",
        "offered",
        "answered/s",
        "failed",
        "client cores",
        "client CPU µs/request",
        "simulator cores",
        "p50 ms",
        "p99 ms",
    ]
    for mode in MODES:
        rows = []
        for run, cell in results["modes"][mode]["cells"].items():
            offered = (
                f"{settings['rate']:g}/s (Poisson)"
                if run == "open"
                else f"{settings['concurrency']} connections"
            )
            rows.append(
                [
                    RUN_LABELS[run],
                    offered,
                    f"**{_num(cell['rps'])}**",
                    f"{cell['num_errors']:,}",
                    f"**{_num(cell['client_cores'], 2)}**",
                    _num(cell["client_cpu_us_per_request"], 1),
                    _num(cell["server_cores"], 2),
                    _num(cell["p50_ms"], 2),
                    _num(cell["p99_ms"], 2),
                ]
            )
        tables[mode.capitalize()] = (header, rows)
    return tables


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta = results["meta"]
    s, v = meta["settings"], meta["versions"]
    tables = report_tables(results)
    title = "Load generator benchmark (`python -m benchmarks loadgen`)"
    note = "" if v.get("wrk") else "wrk not found: no baseline."
    lines = opening_lines(SECTION_START, title, meta, tables["Targets"], note)
    profile = results["profile"]
    lines += [
        f"One simulated upstream (`titan simulate`: {1e3 * profile['ttft_s']:g} ms to the first "
        f"token, {profile['output_tokens']} tokens, no gaps) in its own process. For whole "
        "answers, then for streams (with `stream_options.include_usage`), after a "
        f"{s['warmup_s']:g} s warm-up: the load generator behind `titan bench URL`, in the "
        f"benchmark's process on uvloop, sends one chat body open-loop at {s['rate']:g} "
        f"requests/s (Poisson arrivals) for {s['duration_s']:g} s; its cores = the process's "
        "user + system CPU time over the run ÷ the run's wall time (every thread of the "
        "process, the benchmark's status line included). Then, to compare its cost per request "
        f"with a C client's, it runs closed-loop with {s['concurrency']} clients for "
        f"{s['duration_s']:g} s, and so does wrk (one thread, {s['concurrency']} connections, "
        "the same body; its CPU from RUSAGE_CHILDREN around its run). The simulator's cores "
        "(/proc) show which side was busy: at full speed the two processes share the machine's "
        "cores, so closed-loop requests/s are the pair's, not the client's alone. Latencies "
        "are end to end (the generator's E2E, wrk's latency).",
        "",
    ]
    for mode in MODES:
        lines += [f"### {mode.capitalize()}", "", *markdown_table(*tables[mode.capitalize()]), ""]
    lines += ["Simulator: `" + results["simulator_command"] + "`", ""]
    for mode in MODES:
        command = results["modes"][mode].get("wrk_command")
        if command:
            lines += [f"wrk, {mode}: `{command}`", ""]
    if json_name:
        lines += [f"Raw numbers (every run's full summary): `{json_name}`.", ""]
    return "\n".join([*lines, SECTION_END]) + "\n"


BENCHMARK = Benchmark(
    NAME,
    loadgen_bench.run,
    render_markdown,
    report_tables,
    targets,
    packages=("titan", "uvloop", "uvicorn"),
)
