"""The gateway benchmark's report: its section of bench/RESULTS.md and the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import gateway_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.results_file import markdown_table, quick_note, record_lines

NAME = "gateway"
SECTION_START, SECTION_END = results_file.markers(NAME)
SYSTEM_LABELS = {"direct": "direct", "titan": "Titan", "litellm": "LiteLLM"}
TRANSIENT_LABELS = {
    "direct": "direct, round robin",
    "titan_no_fault": "Titan, no faults (baseline)",
    "titan": "Titan",
    "litellm": "LiteLLM",
}


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _errors(summary: dict[str, Any]) -> str:
    if not summary["num_errors"]:
        return "0"
    kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(summary["errors"].items()))
    return f"{summary['num_errors']} ({kinds})"


_OVERHEAD_HEADER = [
    "mode", "c", "system", "RPS", "p50 (ms)", "p99 (ms)", "added p50", "added p99",
    "peak RSS (MiB)", "errors",
]  # fmt: skip
_TRANSIENT_HEADER = [
    "run", "requests", "RPS", "p50 (ms)", "p99 (ms)", "p99.9 (ms)", "max (ms)", "client errors",
    "retried or hedged",
]  # fmt: skip
_TARGET_HEADER = ["check", "measured", "target", "result"]


def _overhead_rows(results: dict[str, Any]) -> list[list[str]]:
    return [
        [
            cell["mode"],
            str(cell["concurrency"]),
            SYSTEM_LABELS[cell["system"]],
            f"{cell['rps']:.0f}",
            _ms(cell["p50_ms"]),
            _ms(cell["p99_ms"]),
            _ms(cell["added_p50_ms"], signed=True),
            _ms(cell["added_p99_ms"], signed=True),
            _mib(cell["peak_rss_mib"]),
            _errors(cell),
        ]
        for cell in results["overhead"]["cells"]
    ]


def _transient_rows(results: dict[str, Any]) -> list[list[str]]:
    return [
        [
            TRANSIENT_LABELS[name],
            str(run["num_requests"]),
            f"{run['rps']:.0f}",
            _ms(run["p50_ms"]),
            _ms(run["p99_ms"]),
            _ms(run["p999_ms"]),
            _ms(run["max_ms"]),
            _errors(run),
            str(run["num_retried"]) if run["proxy"] == "titan" else "–",
        ]
        for name, run in results["transients"]["runs"].items()
    ]


def _target_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for t in results["targets"]:
        sign = "≥" if t["comparison"] == ">=" else "≤"
        if t["value"] is None:
            measured = "–"
        else:
            measured = f"{t['value']:.2f}{t['unit']}" if t["unit"] else f"{t['value']:g}"
        target = f"{sign} {t['target']:.2f}{t['unit']}" if t["unit"] else f"{sign} {t['target']:g}"
        rows.append([t["name"], measured, target, "PASS" if t["passed"] else "MISS"])
    return rows


def _yaml(data: Any) -> list[str]:
    import yaml

    return ["```yaml", yaml.safe_dump(data, sort_keys=False).rstrip("\n"), "```"]


def _header_lines(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    machine, v = meta["machine"], meta["versions"]
    litellm = f"LiteLLM proxy {v['litellm']}" if v["litellm"] else "LiteLLM **not installed**"
    generator = (
        f"load generator wrk ({v['wrk']}, one thread)"
        if meta["load_generator"] == "wrk"
        else "load generator: the pure-Python closed-loop client (wrk was not used: its numbers "
        "include more client CPU than wrk's would)"
    )
    lines = [SECTION_START, "## Gateway benchmark (`python -m benchmarks gateway`)", ""]
    lines += quick_note(meta)
    if not v["litellm"]:
        lines += [
            "> LiteLLM was not found (`--litellm PATH`): its columns and the targets that "
            "compare against it are skipped.",
            "",
        ]
    lines += [
        *record_lines(meta, f"{litellm}; {generator}."),
        "",
        f"Everything shares these {machine['num_cores']} cores: the load generator, the proxy "
        "under test and the simulated upstreams (each a single-process Python server). Absolute "
        "RPS is therefore bounded by CPU, not by the 20 ms latency (64 connections could do "
        "3200 RPS): at high concurrency a proxy's own CPU cost per request decides its RPS and "
        "its queueing delay. The direct runs have one process fewer competing, so overheads "
        "include that contention, as they would on a busy host. Compare within a row group, "
        "not across machines.",
        "",
    ]
    return lines


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    settings = results["meta"]["settings"]
    concurrencies = ", ".join(str(c) for c in settings["concurrencies"])
    lines = _header_lines(results)
    lines += ["### Targets", "", *markdown_table(_TARGET_HEADER, _target_rows(results)), ""]
    lines += [
        "### Overhead",
        "",
        "One simulated upstream (`titan simulate`) answering in a fixed 20 ms (16 tokens; a "
        "stream's 16 chunks follow the first at once). Closed-loop clients at concurrency "
        f"{concurrencies}, each for {settings['duration_s']:g} s after a "
        f"{settings['warmup_s']:g} s warm-up at the same concurrency, post a small chat body; "
        'streaming bodies add `"stream": true` and a request\'s latency is its whole stream. '
        "Per cell the systems run one after the other: direct, Titan, LiteLLM. Added latency "
        "is the system's percentile minus the direct one of the same cell. Peak RSS is VmHWM "
        "of the proxy (and its children) after the cell: the peak so far in the run. Titan runs "
        "with probes and hedging off (nothing but the proxying is measured); LiteLLM with one "
        "worker.",
        "",
        *markdown_table(_OVERHEAD_HEADER, _overhead_rows(results)),
        "",
    ]
    lines += _transients_lines(results)
    lines += _commands_and_configs(results)
    if json_name:
        lines += [f"Raw numbers (every transients request included): `{json_name}`.", ""]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def _commands_and_configs(results: dict[str, Any]) -> list[str]:
    overhead, transients = results["overhead"], results["transients"]
    lines = ["### Commands and configs", "", "Overhead:", ""]
    lines += [f"- `{command}`" for command in overhead["service_commands"].values()]
    example = next(reversed(overhead["commands"].values()), "")
    lines += [
        f"- load, e.g.: `{example}`",
        "",
        "Transients (fresh processes and ports per run):",
        "",
    ]
    for name, run in transients["runs"].items():
        lines += [f"- {TRANSIENT_LABELS[name]}: " + "; ".join(f"`{c}`" for c in run["commands"])]
    lines += ["", "<details><summary>Profiles, configs and scripts</summary>", ""]
    lines += ["Upstream profile (overhead; the healthy upstream of the transients):", ""]
    lines += [*_yaml(overhead["profile"]), "", "Faulty upstream profile (transients):", ""]
    lines += [*_yaml(transients["faulty_profile"]), "", "Titan, overhead:", ""]
    lines += [*_yaml(overhead["titan_config"]), ""]
    titan_run = transients["runs"].get("titan")
    if titan_run is not None:
        lines += ["Titan, transients (ports vary per run):", "", *_yaml(titan_run["config"]), ""]
        defaults = transients["titan_defaults"]
        lines += ["Its defaults in effect (nothing tuned):", "", *_yaml(defaults), ""]
    if overhead["litellm_config"] is not None:
        lines += ["LiteLLM, overhead:", "", *_yaml(overhead["litellm_config"]), ""]
        litellm_run = transients["runs"].get("litellm")
        if litellm_run is not None:
            lines += ["LiteLLM, transients:", "", *_yaml(litellm_run["config"]), ""]
        lines += ["LiteLLM's environment (and `LITELLM_MASTER_KEY`, random per run):", ""]
        lines += [*_yaml(overhead["litellm_env"]), ""]
    for mode, script in overhead["wrk_scripts"].items():
        lines += [f"wrk script, {mode}:", "", "```lua", script.rstrip("\n"), "```", ""]
    return [*lines, "</details>", ""]


def _transients_lines(results: dict[str, Any]) -> list[str]:
    settings, transients = results["meta"]["settings"], results["transients"]
    runs = transients["runs"]
    faulty = transients["faulty_profile"]
    lines = [
        "### Transients",
        "",
        "Two simulated upstreams of one model: one healthy (as above), one faulty: "
        f"{faulty['spike_probability']:.0%} latency spikes ×{faulty['spike_multiplier']:g}, "
        f"{faulty['error_probability']:.0%} 503s (each request on its own, Retry-After 1 s) and "
        f"a {settings['outage_duration_s']:g} s outage that resets every connection. "
        f"The same closed-loop load for each run: {settings['transients_concurrency']} "
        f"connections, {settings['transients_duration_s']:g} s, non-streaming, from one "
        "asyncio client (raw HTTP/1.1 keep-alive connections), after a short warm-up. Direct: "
        "the client alternates the two upstreams request by request and sees every fault. "
        "Each run starts its upstreams fresh, after the proxy is up, so every run meets the "
        "same outage at about the same time. Titan runs with every default (below); LiteLLM "
        "with its router's retries and cooldowns (`num_retries: 2, allowed_fails: 3, "
        "cooldown_time: 10`). Client errors: a status other than 2xx, or a transport error "
        "(reset, refused, timeout). Retried or hedged: answers for which Titan made more than "
        "one attempt (`x-titan-attempts`). Latency percentiles are over successful requests.",
        "",
        *markdown_table(_TRANSIENT_HEADER, _transient_rows(results)),
        "",
    ]
    for name, run in runs.items():
        if not run["is_faulty"]:
            continue
        begins, ends = run["outage_window_s"]
        during, stats = run["during_outage"], run["upstream_stats"]["second"]
        served = (
            f"faulty upstream: {stats['requests']} requests, 503s {stats['errors'].get('503', 0)}, "
            f"resets {stats['resets']}, spikes {stats['spikes']}"
        )
        extra = ""
        if run["proxy_stats"]:
            model = run["proxy_stats"]["models"].get("sim", {})
            openings = sum(d["breaker_openings"] for d in model.get("deployments", {}).values())
            extra = f"; Titan: {model.get('hedges', 0)} hedges, {openings} breaker openings"
        lines.append(
            f"- {TRANSIENT_LABELS[name]}: outage from {begins:.1f} s to {ends:.1f} s into the "
            f"load; requests sent during it: {during['num_requests']}, p99 "
            f"{_ms(during['p99_ms'])} ms, errors {_errors(during)}. {served}{extra}."
        )
    return [*lines, ""]


_CONSOLE_HEADERS = {
    "Overhead (ms; mode json: whole answers, sse: streams)": [
        "mode", "c", "system", "RPS", "p50", "p99", "+p50", "+p99", "RSS MiB", "errors",
    ],
    "Transients (ms)": [
        "run", "requests", "RPS", "p50", "p99", "p99.9", "max", "errors", "retried",
    ],
    "Targets": _TARGET_HEADER,
}  # fmt: skip
_CONSOLE_MODES = {"non-streaming": "json", "streaming": "sse"}


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The Markdown's tables with headers short enough for a terminal."""
    overhead = [[_CONSOLE_MODES[row[0]], *row[1:]] for row in _overhead_rows(results)]
    all_rows = (overhead, _transient_rows(results), _target_rows(results))
    return {
        title: (header, rows)
        for (title, header), rows in zip(_CONSOLE_HEADERS.items(), all_rows, strict=True)
    }


BENCHMARK = Benchmark(
    NAME,
    gateway_bench.run,
    render_markdown,
    report_tables,
    gateway_bench.targets,
    packages=("titan", "aiohttp", "uvicorn"),
)
