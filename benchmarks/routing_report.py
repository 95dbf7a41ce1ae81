"""The routing benchmark's report: targets (issue 24), its section of bench/RESULTS.md and the
console tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import results_file, routing_bench
from benchmarks.base import Benchmark
from benchmarks.results_file import check, markdown_table, opening_lines, targets_table

NAME = "routing"
TITAN_NAME = "routing-titan"  # the same comparison over two real ``titan serve`` replicas
BASELINE, CANDIDATE = "p2c_ewma", "scored"
SHARED = ("tenants", "conversations")  # where a prefix-aware router should win


def _reference_point(case: dict[str, Any]) -> dict[str, Any]:
    """The sweep's middle rate: loaded, but below where every policy saturates."""
    points = case["points"]
    return points[(len(points) - 1) // 2]


def _p99(case: dict[str, Any]) -> float | None:
    return _reference_point(case)["ttft_s"]["p99"]


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def targets(results: dict[str, Any], *, judged: bool = True) -> list[dict[str, Any]]:
    """The issue's targets, judged on the simulated fleet; ``judged`` False: the same ratios
    shown for information (the real replicas' run, which the issue asks to report)."""
    checks = []
    for workload, cases in results["cases"].items():
        if BASELINE not in cases or CANDIDATE not in cases:
            continue
        ours, theirs = cases[CANDIDATE], cases[BASELINE]
        rate = _reference_point(theirs)["rate"]
        ttft = _ratio(_p99(ours), _p99(theirs))
        knee = _ratio(ours["knee_throughput"], theirs["knee_throughput"])
        if workload in SHARED:
            ttft_target, ttft_ok = "≤ 0.5×", ttft is not None and ttft <= 0.5
            knee_target, knee_ok = "≥ 1.5×", knee is not None and knee >= 1.5
        else:
            ttft_target, ttft_ok = "≤ 1.05×", ttft is not None and ttft <= 1.05
            knee_target, knee_ok = "≥ 0.95×", knee is not None and knee >= 0.95
        if not judged:
            ttft_target, ttft_ok = f"(simulated fleet: {ttft_target})", None
            knee_target, knee_ok = f"(simulated fleet: {knee_target})", None
        name = f"{workload}: TTFT p99 at {rate:g}/s, {CANDIDATE} ÷ {BASELINE}"
        checks.append(check(name, ttft, ttft_target, ttft_ok, "×", 2))
        name = f"{workload}: throughput at the knee, {CANDIDATE} ÷ {BASELINE}"
        checks.append(check(name, knee, knee_target, knee_ok, "×", 2))
    return checks


def reported(results: dict[str, Any]) -> list[dict[str, Any]]:
    return targets(results, judged=False)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{1e3 * value:,.0f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _imbalance(replicas: list[dict[str, Any]]) -> float | None:
    """The busiest replica's requests ÷ the mean: 1.0 is an even spread."""
    counts = [replica["requests"] for replica in replicas]
    mean = sum(counts) / len(counts) if counts else 0
    return max(counts) / mean if mean else None


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    tables = {"Targets": targets_table(results["targets"], _num)}
    for workload, cases in results["cases"].items():
        header = ["policy", "rate", "TTFT p50 ms", "TTFT p99 ms", "SLO met", "knee (req/s)",
                  "hit rate per replica", "imbalance"]  # fmt: skip
        rows = []
        for policy, case in cases.items():
            point = _reference_point(case)
            hit_rates = " / ".join(
                "–" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.0f}%"
                for r in case["replicas"]
            )
            rows.append([
                policy, f"{point['rate']:g}/s", _ms(point["ttft_s"]["p50"]),
                _ms(point["ttft_s"]["p99"]), f"{100 * point['attainment']:.0f}%",
                _num(case["knee_throughput"], 1), hit_rates, _num(_imbalance(case["replicas"]), 2),
            ])  # fmt: skip
        tables[workload] = (header, rows)
    return tables


def _simulated_fleet(s: dict[str, Any]) -> str:
    kinds = ", ".join(s["replicas"])
    return (
        f"Replicas ({kinds}): `titan simulate` in model-server mode (docs/simulator.md), a full "
        f"one with {routing_bench.FULL['kv_cache_tokens']:,} tokens of KV cache, a half one with "
        f"{routing_bench.HALF['kv_cache_tokens']:,} and every step twice as long; prefix caching "
        "on, vLLM's metrics, which Titan scrapes (`metrics: {server: vllm}`, every 0.25 s; "
        "the scored router's prefix index sized like each replica's cache)."
    )


def _titan_fleet(s: dict[str, Any]) -> str:
    return (
        f"Replicas: {len(s['replicas'])} real `titan serve` processes, each the embedded "
        "SmolLM2-135M-Instruct (its GGUF's own Q4_1 blocks) on one engine thread, a KV cache of "
        f"{routing_bench.TITAN_KV_BLOCKS} blocks of {routing_bench.TITAN_BLOCK_TOKENS} tokens "
        "with its prefix cache, its exact response cache off; Titan's own metrics, which the "
        "gateway scrapes (`metrics: {server: titan}`, every 0.25 s). Gateway, replicas and load "
        "generator share the machine's cores: the numbers compare the policies with each other, "
        "not with the simulated fleet."
    )


def _render(name: str) -> Callable[[dict[str, Any], str], str]:
    start, end = results_file.markers(name)
    command = "python -m benchmarks routing" + (" --servers titan" if name == TITAN_NAME else "")

    def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
        meta = results["meta"]
        s = meta["settings"]
        tables = report_tables(results)
        fleet = _titan_fleet(s) if name == TITAN_NAME else _simulated_fleet(s)
        title = "two real Titan replicas" if name == TITAN_NAME else "model servers"
        lines = opening_lines(start, f"Routing over {title} (`{command}`)", meta,
                              tables["Targets"])  # fmt: skip
        lines += [
            f"{fleet} One `titan serve` in front, hedging and its exact cache off, "
            "`routing.policy` the only change. For every policy and workload the fleet starts "
            "empty, then the load generator sweeps open-loop (Poisson; each rate goes on in the "
            "workload where the last one stopped) at rates "
            f"{', '.join(f'{r:g}' for r in s['rates'])} requests/s, {s['duration_s']:g} s each, "
            f"streamed, {s['shape']['max_tokens']} output tokens. TTFT is measured at the "
            f"client; the knee is the highest rate with TTFT ≤ {s['slo_ttft_s']:g} s for 90% of "
            "requests; hit rates are each replica's prefix-cache hits ÷ queries (tokens) over "
            "the whole sweep, imbalance its busiest replica's requests ÷ the mean. Workloads "
            "(benchmarks/routing_workloads.py, seeded): *tenants*: "
            f"{s['shape']['num_tenants']} tenants, each with a "
            f"~{s['shape']['system_tokens']:,}-token system prompt, short questions; "
            f"*conversations*: {s['shape']['num_conversations']} conversations live at a time, "
            f"{s['shape']['turns']} turns each, each turn the history so far (one ends, a new "
            "one takes its place; the first ones met mid-way, so every rate sees all turns "
            "alike); *unique*: prompts that share nothing, never repeated.",
            "",
        ]
        for workload in results["cases"]:
            lines += [f"### {workload}", "", *markdown_table(*tables[workload]), ""]
        if json_name:
            lines += [f"Raw numbers (every sweep point): `{json_name}`.", ""]
        return "\n".join([*lines, end]) + "\n"

    return render_markdown


BENCHMARK = Benchmark(NAME, routing_bench.run, _render(NAME), report_tables, targets)
TITAN_BENCHMARK = Benchmark(TITAN_NAME, routing_bench.run, _render(TITAN_NAME), report_tables,
                            reported)  # fmt: skip
