"""The engine benchmark's report: its section of bench/RESULTS.md and the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import engine_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.results_file import markdown_table, quick_note, record_lines

NAME = "engine"
SECTION_START, SECTION_END = results_file.markers(NAME)

SYSTEM_LABELS = {
    "titan": "Titan engine (continuous batching)",
    "hf_sequential": "HF generate, one request at a time",
    "hf_static_batch": "HF generate, static padded batches",
}


def _ratio(value: float) -> str:
    return f"{value:.2f}×"


def _verdict(target: dict[str, Any]) -> str:
    return "PASS" if target["passed"] else "MISS"


def _target_text(target: dict[str, Any]) -> str:
    sign = "≥" if target["comparison"] == ">=" else "≤"
    return f"{sign} {target['target']:g}{target['unit']}"


def _measured_text(target: dict[str, Any]) -> str:
    return f"{target['value']:.2f}{target['unit']}"


def _system_label(name: str, batch_size: int) -> str:
    label = SYSTEM_LABELS.get(name, name)
    return f"{label} of {batch_size}" if name == "hf_static_batch" else label


def _system_rows(results: dict[str, Any]) -> list[list[str]]:
    batch_size = results["meta"]["settings"]["batch_size"]
    return [
        [
            _system_label(name, batch_size),
            f"{run['num_generated_tokens']}",
            f"{run['wall_s']:.2f}",
            f"{run['tokens_per_s']:.1f}",
            f"{run['ttft_p50_s']:.2f}",
            f"{run['ttft_p99_s']:.2f}",
        ]
        for name, run in results["systems"].items()
    ]


def _stream_rows(results: dict[str, Any]) -> list[list[str]]:
    labels = {"titan": "Titan engine", "hf": "HF generate"}
    return [
        [
            labels[name],
            f"{run['num_prompt_tokens']}",
            f"{run['num_generated_tokens']}",
            f"{run['first_token_s']:.3f}",
            f"{run['decode_tokens_per_s']:.1f}",
        ]
        for name, run in results["single_stream"].items()
    ]


def _target_rows(results: dict[str, Any]) -> list[list[str]]:
    return [
        [t["name"], _measured_text(t), _target_text(t), _verdict(t)] for t in results["targets"]
    ]


_SYSTEM_HEADER = ["system", "generated tokens", "wall (s)", "tokens/s", "TTFT p50 (s)", "p99 (s)"]
_STREAM_HEADER = ["system", "prompt tokens", "new tokens", "TTFT (s)", "decode tokens/s"]
_TARGET_HEADER = ["check", "measured", "target", "result"]


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta, workload, hol = results["meta"], results["workload"], results["head_of_line"]
    settings = meta["settings"]
    stats = results["titan_engine_stats"]
    lines = [
        SECTION_START,
        "## Engine benchmark (`python -m benchmarks engine`)",
        "",
    ]
    lines += quick_note(meta)
    lines += [
        *record_lines(
            meta,
            f"dtype **{meta['dtype']}** and **{meta['num_threads']}** torch threads for every "
            "system.",
        ),
        "",
        "### Method",
        "",
        f"The same {workload['num_requests']} chat requests for every system, built from seed "
        f"{settings['seed']}: prompts of {settings['prompt_tokens'][0]}–"
        f"{settings['prompt_tokens'][1]} tokens and max_tokens {settings['max_tokens'][0]}–"
        f"{settings['max_tokens'][1]}, spread across those ranges "
        f"({workload['num_prompt_tokens']} prompt tokens, "
        f"{workload['num_generated_tokens']} tokens to generate in all), all arriving at t=0. "
        "Greedy decoding with `ignore_eos` (HF: `min_new_tokens = max_new_tokens`), so every "
        "system generates exactly max_tokens tokens per request. Same weights (the HF directory "
        "Titan loads), same dtype, same torch thread count; each system is warmed up first. "
        "Titan runs with its server defaults, prefix caching included: the requests share only "
        "the chat template's header and instruction. "
        "Titan: all requests added to the engine at once, `step()` until done. HF one at a time: "
        "`generate` per request in arrival order, so a request's time to first token (TTFT) "
        "includes its wait for the requests before it. HF static batches: left-padded batches "
        f"of {settings['batch_size']} in arrival order, each running to its longest max_tokens "
        "(tokens past a request's own max_tokens are not counted). TTFT is measured from t=0 to "
        "the moment the first token exists (Titan: the step that produced it returns; HF: a "
        "streamer notes it); tokens/s = generated tokens / wall time.",
        "",
        "### Targets",
        "",
        *markdown_table(_TARGET_HEADER, _target_rows(results)),
        "",
        f"### {workload['num_requests']} requests arriving at once",
        "",
        *markdown_table(_SYSTEM_HEADER, _system_rows(results)),
        "",
        f"Titan engine during the workload: {stats['num_steps']} steps, "
        f"{stats['num_preemptions']} preemptions, {stats['num_cached_prompt_tokens']} prompt "
        "tokens served from the prefix cache.",
        "",
        "### Single stream",
        "",
        "One request alone; decode tokens/s counts from its first token to its last (prefill "
        "excluded).",
        "",
        *markdown_table(_STREAM_HEADER, _stream_rows(results)),
        "",
        "### Head-of-line",
        "",
        f"{hol['num_streams']} running decodes (prompts of {hol['stream_prompt_tokens']} "
        f"tokens, greedy, ignore_eos); once each has {hol['tokens_before_arrival']} tokens, a "
        f"{hol['long_prompt_tokens']}-token prompt arrives. The streams' median inter-token gap "
        f"while they decode alone: {hol['median_gap_s'] * 1000:.1f} ms. From the arrival to the "
        f"long prompt's first token (computed in chunks between their decodes): median "
        f"{hol['median_gap_during_s'] * 1000:.1f} ms, worst {hol['worst_gap_s'] * 1000:.1f} ms; "
        f"worst / median **{_ratio(hol['worst_over_median'])}**. The long prompt's TTFT: "
        f"{hol['long_prompt_ttft_s']:.2f} s ({hol['num_steps_to_first_token']} engine steps).",
        "",
        *_dtype_lines(results),
        "### HTTP responsiveness under full load",
        "",
        _server_load_text(results["server_load"]),
        "",
    ]
    if json_name:
        lines += [f"Raw numbers: `{json_name}`.", ""]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def _dtype_lines(results: dict[str, Any]) -> list[str]:
    other = results.get("titan_other_dtype")
    if not other:
        return []
    chosen = results["systems"]["titan"]
    return [
        "### dtype",
        "",
        f"`--dtype auto` chose {results['meta']['dtype']}: {chosen['tokens_per_s']:.1f} tokens/s "
        f"on the workload above, against {other['tokens_per_s']:.1f} in {other['dtype']} "
        f"({chosen['tokens_per_s'] / other['tokens_per_s']:.2f}×; TTFT p50 "
        f"{chosen['ttft_p50_s']:.2f} s against {other['ttft_p50_s']:.2f} s).",
        "",
    ]


def _server_load_text(load: dict[str, Any]) -> str:
    idle, busy = load["idle"], load["under_load"]
    return (
        f"`titan serve` in a subprocess; {load['num_streams']} streaming chat requests "
        f"(max_tokens {load['max_tokens']}, ignore_eos) keep every engine slot busy for "
        f"{load['load_s']:.1f} s while `GET /health` is probed every 20 ms from another thread. "
        f"Idle server (baseline): p50 {idle['p50_ms']:.1f} ms, p99 {idle['p99_ms']:.1f} ms over "
        f"{idle['num_probes']} probes. Under load: p50 {busy['p50_ms']:.1f} ms, p99 "
        f"**{busy['p99_ms']:.1f} ms**, max {busy['max_ms']:.1f} ms over {busy['num_probes']} "
        "probes."
    )


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The console's tables: the Markdown's, and the head-of-line test in numbers."""
    hol, meta = results["head_of_line"], results["meta"]
    num_requests = results["workload"]["num_requests"]
    return {
        f"{num_requests} requests at once (dtype {meta['dtype']}, {meta['num_threads']} torch "
        "threads)": (_SYSTEM_HEADER, _system_rows(results)),
        "Single stream (decode excludes prefill)": (_STREAM_HEADER, _stream_rows(results)),
        f"Head-of-line: {hol['num_streams']} decodes, a {hol['long_prompt_tokens']}-token "
        "prompt arrives": (
            ["median gap alone (ms)", "worst gap during its prefill (ms)", "its TTFT (s)"],
            [[f"{hol['median_gap_s'] * 1000:.1f}", f"{hol['worst_gap_s'] * 1000:.1f}",
              f"{hol['long_prompt_ttft_s']:.2f}"]],
        ),
        "Targets": (_TARGET_HEADER, _target_rows(results)),
    }  # fmt: skip


BENCHMARK = Benchmark(
    NAME,
    engine_bench.run,
    render_markdown,
    report_tables,
    packages=("torch", "transformers", "titan"),
)
