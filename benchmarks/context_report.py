"""The context benchmark's report: per-run summaries, targets, its section of
bench/RESULTS.md and the console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import context_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.context_bench import MODES, TOPICS
from benchmarks.results_file import check, markdown_table, quick_note, record_lines, targets_table

NAME = "context"
SECTION_START, SECTION_END = results_file.markers(NAME)


# ---- summaries and targets -----------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    conv = results["conversation"]
    window, summary = conv["window"], conv["summary"]
    checks = []
    for mode in ("trimmed", "headroom"):
        served, biggest = summary[mode]["served"], summary[mode]["max_prompt_tokens"]
        checks += [
            check(f"{mode}: turns served", 100 * served, "= 100%", served == 1.0, "%"),
            check(f"{mode}: max prompt tokens", biggest, f"≤ {window}",
                   biggest is not None and biggest <= window),
        ]  # fmt: skip
    trimmed_ms = summary["trimmed"]["second_half_wall_ms_p50"]
    headroom_ms = summary["headroom"]["second_half_wall_ms_p50"]
    speedup = trimmed_ms / headroom_ms if trimmed_ms and headroom_ms else None
    return [
        *checks,
        check("naive: turns served (reported)", 100 * summary["naive"]["served"], "–", None, "%"),
        check("time per turn p50, 2nd half: trimmed ÷ headroom (reported)", speedup, "–", None,
               "×", digits=2),
    ]  # fmt: skip


# ---- the report ----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _decile_cells(row: dict[str, Any]) -> list[str]:
    return [f"{100 * row['served']:.0f}%", _num(row["prompt_tokens_p50"]),
            _num(row["wall_ms_p50"])]  # fmt: skip


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    tables = {"Targets": targets_table(results["targets"], _num)}
    summary = results["conversation"]["summary"]
    header, rows, overall = ["turns"], [], ["max / all"]
    for mode in MODES:
        header += [f"{mode} served", f"{mode} prompt tokens p50", f"{mode} time p50 (ms)"]
        overall += [f"{100 * summary[mode]['served']:.0f}%",
                    _num(summary[mode]["max_prompt_tokens"]), ""]  # fmt: skip
    for same_turns in zip(*(summary[mode]["deciles"] for mode in MODES), strict=True):
        rows.append([same_turns[0]["turns"],
                     *(cell for row in same_turns for cell in _decile_cells(row))])  # fmt: skip
    tables["Conversation, per decile of turns"] = (header, [*rows, overall])
    r = results["retrieval"]
    chunks = f"{r['chunks']} ({r['real_chunks']} + {r['filler_chunks']})"
    tables["Retrieval"] = (
        ["ranker", "chunks (real + filler)", "index", "queries", "search p50 (ms)",
         "search p99 (ms)", "mean (ms)", "top hit from the right file"],
        [[ranker, chunks, r["index"], str(p["queries"]), _num(p["p50_ms"], 2),
          _num(p["p99_ms"], 2), _num(p["mean_ms"], 2), f"{100 * p['top_hit_right_file']:.0f}%"]
         for ranker, p in r["rankers"].items()],
    )  # fmt: skip
    return tables


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    import yaml

    meta, conv, r = results["meta"], results["conversation"], results["retrieval"]
    s = meta["settings"]
    tables = report_tables(results)
    summary = conv["summary"]
    naive = summary["naive"]
    lines = [SECTION_START, "## Context benchmark (`python -m benchmarks context`)", ""]
    lines += quick_note(meta)
    lines += [
        *record_lines(meta), "",
        "### Targets", "", *markdown_table(*tables["Targets"]), "",
        "### Conversation", "",
        f"`titan serve` with the embedded model `{conv['model']}`, window {conv['window']} "
        f"tokens (`engine.max_model_len`), the exact cache off. One seeded conversation of "
        f"{s['turns']} user turns (2–3 sentences and a question each, about 30–60 tokens), "
        f"`instructions` set, `max_output_tokens: {s['max_output_tokens']}`, `temperature: 0`, "
        "sent three times through the openai SDK, one request at a time: *trimmed*: "
        "`responses.create` chained by `previous_response_id` (Titan keeps the history and "
        "drops the oldest whole turns to fit the window, keeping the most that fits); "
        "*headroom*: the same requests to a second `titan serve` (started after the first one "
        f"stopped) with the same config plus `context.trim_headroom: {s['trim_headroom']:g}`: "
        "when the history no longer fits, Titan drops old turns until the prompt fits "
        f"{100 * (1 - s['trim_headroom']):.0f}% of the budget, then keeps that drop point on "
        "the following turns while they fit, so consecutive prompts share their prefix and "
        "the engine's prefix cache serves it (fewer old turns in the prompt, less to "
        "compute); *naive*: `chat.completions.create` with the whole history sent by the "
        "client each turn (no trimming there: past the window Titan answers 400 "
        "`context_length_exceeded`; a failed turn keeps the trimmed run's answer in the "
        "history so that both runs hold the same conversation). Prompt tokens from `usage`; "
        "time: the client's wall time per request. Medians are over the turns served. "
        "Median time per turn over the second half of the turns (in the full run, long past "
        f"the window): trimmed {_num(summary['trimmed']['second_half_wall_ms_p50'])} ms, "
        f"headroom {_num(summary['headroom']['second_half_wall_ms_p50'])} ms. Naive: last "
        f"turn served {naive['last_served_turn']}, failures {naive['failures'] or 'none'}.", "",
        *markdown_table(*tables["Conversation, per decile of turns"]), "",
        "### Retrieval", "",
        f"A `VectorStores` on memory documents with the real embedder (all-MiniLM-L6-v2, CPU). "
        f"{len(TOPICS)} real text files (one per topic) embedded through `add_file` (static "
        f"chunks of 60 tokens, {r['real_chunks']} chunks, {r['real_embed_s']:.1f} s); then "
        f"{r['filler_chunks']} random unit vectors stored as the chunks of one more completed "
        "file of the store (chunk documents, its link, the store's revision bumped). A new "
        "`VectorStores` on the same documents then starts with an empty index, as after a "
        "restart: its first `search` loads every completed file's chunks from storage. Index "
        f"load (first search after a restart): {r['load_s']:.2f} s, that search included. "
        f"{s['queries']} timed `search(..., max_num_results=10)` calls after "
        f"{s['warmup_queries']} untimed ones, each query a topic sentence with a question, "
        "once per ranker: `auto` (the default: the index's top 4× candidates reranked by "
        "cosine blended with BM25 over their words) and `none` (plain vector order). Time "
        "includes the query's embedding, the index search and reading the chunks; top hit "
        "from the right file: the first result comes from the query's topic file.", "",
        *markdown_table(*tables["Retrieval"]), "",
        "### Command and config", "", f"- titan: `{conv['command']}`",
        f"- titan (headroom): `{conv['headroom_command']}`, the same config (another port) "
        f"plus `context: {{trim_headroom: {s['trim_headroom']:g}}}`", "",
        "```yaml", yaml.safe_dump(conv["config"], sort_keys=False).rstrip("\n"), "```", "",
    ]  # fmt: skip
    if json_name:
        lines += [f"Raw numbers (every turn): `{json_name}`.", ""]
    return "\n".join([*lines, SECTION_END]) + "\n"


BENCHMARK = Benchmark(
    NAME,
    context_bench.run,
    render_markdown,
    report_tables,
    targets,
    packages=("torch", "transformers", "titan"),
)
