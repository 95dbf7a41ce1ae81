"""The observability benchmark's report: per-cell summaries, targets, versions, its section of
bench/RESULTS.md and the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import observability_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.observability_bench import CONFIGS, MODES
from benchmarks.results_file import check, markdown_table, quick_note, record_lines, targets_table

NAME = "observability"
SECTION_START, SECTION_END = results_file.markers(NAME)
MAX_COST = 0.05  # of the throughput: 1 − on ÷ off


# ---- targets --------------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for mode in MODES:
        cost = results["cells"][mode]["cost"]
        checks.append(check(
            f"throughput cost, {mode}: 1 − on/off", None if cost is None else 100 * cost,
            f"≤ {100 * MAX_COST:g}%", cost is not None and cost <= MAX_COST, "%", 1,
        ))  # fmt: skip
    runs = results["runs"]
    failed = sum(c["num_errors"] for run in runs for c in run["cells"].values())
    checks.append(check("failed requests (every run)", failed, "= 0", failed == 0))
    on_runs = [run for run in runs if run["config"] == "on"]
    batches = min((run["sink"]["batches"] for run in on_runs), default=0)
    checks.append(check("span batches received by the sink (each on run, fewest)", batches,
                         "> 0", batches > 0))  # fmt: skip
    lines = min((run["log"]["request_lines"] for run in on_runs), default=0)
    checks.append(check("request log lines written (each on run, fewest)", lines, "> 0",
                         lines > 0))  # fmt: skip
    return checks


# ---- the report ----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}×"


def _over(on: float | None, off: float | None) -> float | None:
    return on / off if on is not None and off else None


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    tables = {"Targets": targets_table(results["targets"], _num)}
    concurrency = results["meta"]["settings"]["concurrency"]
    for mode in MODES:
        cell = results["cells"][mode]
        rows = []
        for config in CONFIGS:
            c = cell[config]
            rounds = ", ".join(_num(r) for r in c["rps_rounds"]) or "–"
            rows.append([config, f"**{_num(c['rps'])}**", rounds, _num(c["p50_ms"], 1),
                         _num(c["p99_ms"], 1), _num(c["cpu_ms"], 3), f"{c['num_ok']:,}",
                         f"{c['num_errors']:,}"])  # fmt: skip
        off, on = cell["off"], cell["on"]
        rows.append(["on ÷ off", f"**{_ratio(cell['ratio'])}**", "–",
                     *(_ratio(_over(on[key], off[key])) for key in ("p50_ms", "p99_ms", "cpu_ms")),
                     "–", "–"])  # fmt: skip
        tables[f"{mode.capitalize()}, concurrency {concurrency}"] = (
            ["config", "requests/s (median)", "per round", "p50 ms", "p99 ms",
             "Titan CPU ms per request", "answered", "failed"], rows)  # fmt: skip
    rows = []
    for run in results["runs"]:
        if run["config"] != "on":
            continue
        sink, log, scrapes = run["sink"], run["log"], run["scrapes"] or {}
        counted = run["metrics_requests"]
        spans = sink.get("spans")
        per_request = spans / counted if spans is not None and counted else None
        rows.append([
            str(run["round"]), f"{sink['batches']:,}", _num(spans), _num(per_request, 1),
            _num(sink["bytes"] / 1024), _num(sink.get("cpu_s"), 2),
            f"{log['request_lines']:,}", _num(counted),
            f"{log['access_lines']:,}", _num(log["bytes"] / 2**20, 1),
            f"{scrapes.get('scrapes', 0)} ({scrapes.get('failures', 0)} failed)",
            _num(scrapes.get("max_ms"), 1),
        ])  # fmt: skip
    tables["What the on runs produced"] = (
        ["round", "span batches", "spans", "spans per request", "KiB sent", "sink CPU s",
         "request log lines",
         "requests in /metrics", "access log lines", "log MiB", "/metrics scrapes",
         "slowest scrape ms"], rows)  # fmt: skip
    return tables


def _yaml(data: Any) -> list[str]:
    import yaml

    return ["```yaml", yaml.safe_dump(data, sort_keys=False).rstrip("\n"), "```"]


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta = results["meta"]
    s = meta["settings"]
    tables = report_tables(results)
    lines = [SECTION_START, "## Observability benchmark (`python -m benchmarks observability`)", ""]
    lines += quick_note(meta)
    generator = (
        "wrk (one thread)" if meta["load_generator"] == "wrk"
        else "the gateway benchmark's pure-Python client (wrk was not found; it shares the "
        "cores with the servers)"
    )  # fmt: skip
    lines += [
        *record_lines(meta), "",
        "### Targets", "", *markdown_table(*tables["Targets"]), "",
        "### Setup", "",
        "One simulated upstream (`titan simulate`, 20 ms to the answer, 16 output tokens; a "
        "stream's chunks follow at once) and `titan serve` in front of it (one deployment, probes "
        "and hedging off, state in memory), started afresh for each run on the same port in one "
        "of two configurations. *off*: per-request metrics, request logs and tracing off, log "
        "level warning (nothing is written per request). *on*: per-request metrics "
        "(`request_metrics`), one JSON line per request on the `titan.requests` logger "
        "(`log_requests`, which replaces uvicorn's access line) at log level info, into a log "
        "file, "
        f"and requests traced (`sample_ratio: {s['sample_ratio']:g}`: a span per step and per "
        "upstream attempt of the sampled ones), exported in batches (OTLP/HTTP JSON, from "
        "Titan's exporter thread) to a local sink (`python -m benchmarks.otlp_sink`, a "
        "subprocess that answers 200 and counts "
        f"batches and spans); `/metrics` is scraped every {s['scrape_interval_s']:g} s "
        f"meanwhile, as Prometheus would. Runs alternate off, on ({s['rounds']} "
        f"round{'s' if s['rounds'] != 1 else ''} of each); in each run, {s['concurrency']} "
        f"closed-loop connections from {generator} post a non-streaming chat body, then a "
        f"streaming one (`max_tokens: 16`), {s['warmup_s']:g} s of warm-up then "
        f"{s['duration_s']:g} s measured per cell. Requests/s: answered requests per second of "
        "the measured window; per cell, the median of the rounds (and of their p50 and p99). "
        "Cost: 1 − on ÷ off of the medians. Titan CPU per request: the `titan serve` "
        "process's user + system time over the measured window (/proc), per answered request; "
        "where the load does not saturate Titan's core, it shows what the throughput cannot. "
        "The sink and the scraper run on the same cores as Titan (their CPU is in the *on* "
        "runs; a real collector would be elsewhere).", "",
    ]  # fmt: skip
    for mode in MODES:
        title = next(t for t in tables if t.startswith(mode.capitalize()))
        lines += [f"### {title}", "", *markdown_table(*tables[title]), ""]
    lines += [
        "### What the on runs produced", "",
        "Per *on* run: what the OTLP sink received (span batches, spans, bytes; after Titan's "
        "graceful stop, which flushes the last spans), the request lines in Titan's log next to "
        "the requests `/metrics` counted (`titan_requests_total`, read once after the load, "
        "warm-ups included), uvicorn's access lines, the log's size, and the `/metrics` scrapes.",
        "", *markdown_table(*tables["What the on runs produced"]), "",
        "### Commands and configs", "",
        "Services (WORKSPACE: the run's temporary folder):", "",
        *[f"- {name}: `{command}`" for name, command in results["service_commands"].items()], "",
        "Load, per cell (the last run's):", "",
    ]  # fmt: skip
    last = results["runs"][-1]["commands"] if results["runs"] else {}
    lines += [f"- {mode}: `{command}`" for mode, command in last.items()]
    lines += ["", "Titan, *off*:", "", *_yaml(results["configs"].get("off")), "",
              "Titan, *on*:", "", *_yaml(results["configs"].get("on")), ""]  # fmt: skip
    if results.get("wrk_scripts"):
        lines += [
            'wrk script (non-streaming; the streaming one adds `"stream": true`):',
            "",
            "```lua",
            results["wrk_scripts"]["non-streaming"].strip("\n"),
            "```",
            "",
        ]
    if json_name:
        lines += [f"Raw numbers (every run's cells, sink and log counts): `{json_name}`.", ""]
    return "\n".join([*lines, SECTION_END]) + "\n"


BENCHMARK = Benchmark(
    NAME,
    observability_bench.run,
    render_markdown,
    report_tables,
    targets,
    packages=("titan", "prometheus-client", "orjson", "uvicorn"),
)
