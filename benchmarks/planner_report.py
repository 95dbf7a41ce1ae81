"""The planner benchmark's report: targets (predicted vs measured TTFT at the held-back rates),
its section of bench/RESULTS.md and the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import planner_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.results_file import markdown_table, quick_note, record_lines, targets_table

NAME = "planner"
SECTION_START, SECTION_END = results_file.markers(NAME)
TOLERANCE = 0.25  # |predicted − measured| / measured, p50 and p99 TTFT


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for row in results["validation"]:
        for q in ("p50", "p99"):
            error = row["ttft_relative_error"][q]
            checks.append(
                {
                    "name": f"TTFT {q} at {row['rate']:g} req/s: |predicted − measured| / measured",
                    "value": 100 * abs(error),
                    "target": f"≤ {100 * TOLERANCE:g}%",
                    "passed": abs(error) <= TOLERANCE,
                    "unit": "%",
                    "digits": 1,
                }
            )
    return checks


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:,.0f}"


def _signed(error: float) -> str:
    return f"{100 * error:+.1f}%"


_COMPARISON_HEADER = [
    "rate (req/s)",
    "requests",
    "TTFT p50 predicted (ms)",
    "measured",
    "error",
    "TTFT p99 predicted (ms)",
    "measured",
    "error",
    "TPOT p50 predicted (ms)",
    "measured",
]


def _comparison_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    table = []
    for row in rows:
        predicted, measured = row["predicted"], row["measured"]
        errors = row["ttft_relative_error"]
        table.append(
            [
                f"{row['rate']:g}",
                str(row["num_requests"]),
                _ms(predicted["ttft"]["p50_s"]),
                _ms(measured["ttft"]["p50_s"]),
                _signed(errors["p50"]),
                _ms(predicted["ttft"]["p99_s"]),
                _ms(measured["ttft"]["p99_s"]),
                _signed(errors["p99"]),
                _ms(predicted["tpot"]["p50_s"]),
                _ms(measured["tpot"]["p50_s"]),
            ]
        )
    return table


def _steady_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            f"{row['rate']:g}",
            _ms(row["steady_state"]["ttft"]["p50_s"]),
            _ms(row["steady_state"]["ttft"]["p99_s"]),
            f"{row['steady_state']['mean_seqs_per_step']:.1f}",
            "yes" if row["steady_state"]["is_saturated"] else "no",
        ]
        for row in rows
    ]


def _machine_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    runs = [("calibration", r) for r in results["calibration"]["runs"]]
    runs += [("held back", r) for r in results["validation"]]
    for kind, row in runs:
        measured = row["measured"]
        others = measured.get("other_cpu_cores")
        chunk = row["median_chunk_while_decoding"]
        rows.append(
            [
                f"{row['rate']:g} ({kind})",
                f"{chunk['predicted']:.0f} / {chunk['measured']:.0f}",
                f"{measured['step_time_vs_model']:.2f}×",
                f"{measured['slow_step_share']:.1%}",
                "–" if others is None else f"{others:.2f}",
            ]
        )
    return rows


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    return {
        "Targets": targets_table(results["targets"], _num),
        "Held-back rates: the simulator's prediction for each run's trace vs the engine": (
            _COMPARISON_HEADER,
            _comparison_rows(results["validation"]),
        ),
        "Calibration rates (their steps are in the fit)": (
            _COMPARISON_HEADER,
            _comparison_rows(results["calibration"]["runs"]),
        ),
        "The simulator's long-run prediction at the held-back rates (2,000 requests)": (
            ["rate (req/s)", "TTFT p50 (ms)", "TTFT p99 (ms)", "sequences per step", "saturated"],
            _steady_rows(results["validation"]),
        ),
        "Each run after the fact (not used by the prediction)": (
            [
                "rate (req/s)",
                "prefill chunk beside decodes, median: simulated / engine",
                "step time / fitted model (median)",
                "steps > 1.5× model",
                "other processes' busy cores",
            ],
            _machine_rows(results),
        ),
    }


def _cost_text(calibration: dict[str, Any]) -> str:
    cost, engine = calibration["cost"], calibration.get("engine_model")
    text = (
        f"Fitted step cost: {cost['fixed_s'] * 1e3:.2f} ms + {cost['per_token_s'] * 1e3:.3f} ms "
        f"per token + {cost['per_pair_s'] * 1e9:.0f} ns per attention pair + "
        f"{cost['per_seq_s'] * 1e3:.3f} ms per sequence, from {calibration['num_samples']} steps "
        f"({calibration['num_grid_samples']} from the grid); median |error| "
        f"{calibration['median_relative_error']:.1%}, p90 {calibration['p90_relative_error']:.1%}."
    )
    if engine:
        text += (
            f" For the record, the engine's own step model after calibration: "
            f"{engine['fixed_s'] * 1e3:.2f} ms + {engine['per_token_s'] * 1e3:.3f} ms per token "
            f"+ {engine['per_pair_s'] * 1e9:.0f} ns per pair, mixed-step bias "
            f"{engine['mixed_step_bias']:.2f} (a value of the moment)."
        )
    return text


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta = results["meta"]
    settings, engine = meta["settings"], meta["engine"]
    rates = ", ".join(f"{r:g}" for r in settings["validation_rates"])
    calibration_rates = ", ".join(f"{r:g}" for r in settings["calibration_rates"])
    lines = [SECTION_START, "## Planner benchmark (`python -m benchmarks planner`)", ""]
    lines += quick_note(meta)
    lines += [
        *record_lines(
            meta,
            f"Engine: {engine['model']}, {engine['dtype']}, "
            f"{engine['num_threads']} torch threads, max_num_seqs {engine['max_num_seqs']}, "
            f"max_num_batched_tokens {engine['max_num_batched_tokens']}, max_decode_slowdown "
            f"{engine['max_decode_slowdown']}, {engine['num_kv_blocks']} KV blocks of "
            f"{engine['block_size']}.",
        ),
        "",
        "### Method",
        "",
        f"Traffic: Poisson arrivals, prompts `{settings['prompt_tokens']}` tokens (chat "
        f"prompts sharing the template's header), outputs `{settings['output_tokens']}` tokens "
        "(greedy, ignore_eos). **Calibration**: a grid of controlled steps (prompts of "
        f"{', '.join(map(str, settings['grid_prefill_lengths']))} tokens alone; batches of "
        f"{', '.join(map(str, settings['grid_decode_batches']))} decodes) and open-loop runs at "
        f"{calibration_rates} requests/s ({settings['calibration_duration_s']:g} s each); every "
        "step's shape (tokens, sequences, attention pairs) and duration go into a non-negative "
        "least-squares fit of the step cost, weighted for relative error. **Prediction**, "
        f"before any held-back run: at {rates} requests/s (rates the calibration did not use, "
        f"{settings['validation_num_requests']} requests each), the simulator replays the "
        "seeded trace the engine will get (same arrivals and lengths) with the fitted cost and "
        "the engine's scheduler rules: token budget, sequence cap, prefix-cache hits on the "
        "shared header, preemption, and chunked prefill limited while decodes run to "
        f"{engine['max_decode_slowdown']:g}× the decodes' step (the engine's rule at its "
        "equilibrium: its self-corrected step model "
        "tracks the real step times, which the fitted cost is). **Measurement**: the engine "
        "(in-process, driven as AsyncEngine drives it: arrivals are added between steps) "
        "replays the trace in real time; TTFT runs from a request's scheduled arrival to the "
        "end of the step that produced its first token.",
        "",
        "### Targets",
        "",
    ]
    for title, (header, rows) in report_tables(results).items():
        if title != "Targets":
            lines += [f"### {title}", ""]
        lines += [*markdown_table(header, rows), ""]
    lines += [
        "The after-the-fact table checks the mechanism and the machine: the median prefill "
        "chunk beside decodes, simulated and real (the chunk rule); each run's steps against "
        "the fitted model (a median above 1× means the machine ran slower than during "
        "calibration; steps over 1.5× are stretches where other work on this shared 2-core "
        "machine, the last column, slowed the engine, and requests caught in them take longer "
        "than predicted).",
        "",
        _cost_text(results["calibration"]),
        "",
    ]
    lines += [
        "The long-run prediction is what `titan plan` reports for a rate; a held-back run of "
        "this length is one sample of it, which is why the comparison replays each run's own "
        "trace.",
        "",
    ]
    if json_name:
        lines += [f"Raw numbers: `{json_name}`.", ""]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


BENCHMARK = Benchmark(
    NAME,
    planner_bench.run,
    render_markdown,
    report_tables,
    targets,
    packages=("torch", "transformers", "titan"),
)
