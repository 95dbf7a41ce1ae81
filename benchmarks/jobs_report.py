"""The jobs benchmark's report: targets, its section of bench/RESULTS.md and the
console tables."""

from __future__ import annotations

from typing import Any

from benchmarks import jobs_bench, results_file
from benchmarks.base import Benchmark
from benchmarks.jobs_bench import MODEL
from benchmarks.results_file import check, markdown_table, quick_note, record_lines, targets_table

NAME = "jobs"
SECTION_START, SECTION_END = results_file.markers(NAME)
MIN_SQLITE_JOBS_PER_S = 500.0
MAX_P99_RATIO = 1.20
_MODE_NAMES = {"sqlite": "SQLite", "redis": "Redis"}


# ---- targets ------------------------------------------------------------------------------


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def latency_ratios(interactive: dict[str, Any]) -> dict[str, float | None]:
    alone, loaded = interactive["alone"], interactive["with_batch"]
    return {"p50": _ratio(loaded["p50_ms"], alone["p50_ms"]),
            "p99": _ratio(loaded["p99_ms"], alone["p99_ms"])}  # fmt: skip


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for row in results["throughput"]["modes"]:
        rate, name = row["queue"]["jobs_per_s"], _MODE_NAMES[row["mode"]]
        if row["mode"] == "sqlite":
            checks.append(
                check(
                    "SQLite: jobs/s, submit to result",
                    rate,
                    f"≥ {MIN_SQLITE_JOBS_PER_S:g}",
                    rate >= MIN_SQLITE_JOBS_PER_S,
                )
            )
        else:
            checks.append(check(f"{name}: jobs/s, submit to result (reported)", rate, "–", None))
    unfinished = sum(row["queue"]["jobs"] + row["queue"]["warmup_jobs"]
                     - row["queue"]["counts"].get("succeeded", 0)
                     for row in results["throughput"]["modes"])  # fmt: skip
    retried = sum(row["queue"]["retried_jobs"] for row in results["throughput"]["modes"])
    checks.append(check("jobs not succeeded, or retried (every mode)", unfinished + retried,
                         "= 0", unfinished + retried == 0))  # fmt: skip
    ratios = latency_ratios(results["interactive"])
    p99 = ratios["p99"]
    checks += [
        check("interactive p99 with the batch running ÷ without", p99, f"≤ {MAX_P99_RATIO:.2f}",
               p99 is not None and p99 <= MAX_P99_RATIO, "×", 2),
        check("interactive p50 with the batch running ÷ without (reported)", ratios["p50"], "–",
               None, "×", 2),
    ]  # fmt: skip
    return checks


# ---- the report ----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _statuses(statuses: dict[Any, int]) -> str:
    failed = {str(k): n for k, n in statuses.items() if str(k) != "200"}
    return ", ".join(f"{k or 'transport'}: {n}" for k, n in sorted(failed.items())) or "none"


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    tables = {"Targets": targets_table(results["targets"], _num)}
    rows = []
    for row in results["throughput"]["modes"]:
        q, d = row["queue"], row["direct"]
        rows.append([
            _MODE_NAMES[row["mode"]], f"{q['succeeded']:,} / {q['jobs']:,}", _num(q["seconds"], 2),
            f"**{_num(q['jobs_per_s'])}**", _num(q["submit_s"], 2), _num(d["requests_per_s"]),
            _num(row["ratio"], 2) + ("×" if row["ratio"] is not None else ""),
            str(q["retried_jobs"]),
        ])  # fmt: skip
    tables["Throughput (in-process, zero-latency model)"] = (
        ["storage", "jobs succeeded", "seconds", "jobs/s", "all submitted after (s)",
         "direct requests/s", "queue ÷ direct", "retried jobs"], rows)  # fmt: skip
    inter = results["interactive"]
    batch = inter["batch"]
    rows = []
    in_window = f"{batch['done_in_window']:,} ({_num(batch['jobs_per_s'])}/s)"
    for phase, key, done in (("A: interactive alone", "alone", "–"),
                             ("B: with the batch running", "with_batch", in_window)):  # fmt: skip
        p = inter[key]
        rows.append([phase, f"{p['requests']:,}", _num(p["requests_per_s"], 1),
                     _num(p["p50_ms"], 1), f"**{_num(p['p99_ms'], 1)}**", _num(p["mean_ms"], 1),
                     _statuses(p["statuses"]), done])  # fmt: skip
    tables["Interactive latency (titan serve)"] = (
        ["phase", "requests", "req/s", "p50 ms", "p99 ms", "mean ms", "failed",
         "batch jobs done in the window"], rows)  # fmt: skip
    return tables


def _batch_note(results: dict[str, Any]) -> str:
    batch, s = results["interactive"]["batch"], results["meta"]["settings"]
    end = batch["end"]
    note = (
        f"The batch ({batch['jobs']:,} requests; upload and create took "
        f"{batch['create_s']:.2f} s) had {batch['start']['completed']:,} requests done when "
        f"the window opened and {end['completed']:,} completed, {end['failed']:,} failed at "
        f"its end ({batch['window_s']:.1f} s later; status `{end['status']}`)."
    )
    if batch["still_running_at_end"]:
        return note + " It was still running when the window closed: phase B ran beside it " \
            "from start to end."  # fmt: skip
    after = batch["finished_after_s"]
    when = f"after {after:.1f} s" if after is not None else "before the window closed"
    return (
        note + f" **It finished {when} of the {s['duration_s']:g} s window**: the "
        "comparison covers the batch only for that part of phase B; the rest ran without it."
    )


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    import yaml

    meta, thr, inter = results["meta"], results["throughput"], results["interactive"]
    s = meta["settings"]
    tables = report_tables(results)
    lines = [SECTION_START, "## Jobs benchmark (`python -m benchmarks jobs`)", ""]
    lines += quick_note(meta)
    redis_modes = [row for row in thr["modes"] if row["mode"] == "redis"]
    lines += [
        *record_lines(meta), "",
        "### Targets", "", *markdown_table(*tables["Targets"]), "",
        "### Throughput: submit to result", "",
        f"In one process, per storage: a fresh pipeline (`build_pipeline`) whose model `{MODEL}` "
        "is the simulated backend with zero latency (`ttft_s: 0`, 4 output tokens), "
        f"`jobs.workers: {s['workers']}` in-process workers polling every {s['poll_s']:g} s, the "
        "exact cache off (every job reaches the backend), probes and hedging off. "
        f"{s['jobs']:,} chat requests, each with its own message, submitted through "
        f"`JobsService.submit` by {s['submitters']} concurrent tasks; timed from the first "
        "submit until `queue.counts()` (read every 20 ms) shows them all final; jobs/s = jobs "
        "succeeded ÷ that time. *Direct*: the same requests on another fresh pipeline and "
        "storage, no workers, through `JobsService.execute` — the `ClientRequest` a job's "
        f"attempt builds (batch priority class), `pipeline.complete`, the answer parsed — "
        f"{s['workers']} at a time, no queue. Each run first sends {s['warmup']} untimed "
        "requests (or jobs) on its pipeline. SQLite: a new file per run; Redis: an empty "
        "database claimed per run (`" + (redis_modes[0]["storage"] if redis_modes else "–")
        + "` last), its keys deleted after. Retried jobs: jobs with more than one attempt.", "",
        *markdown_table(*tables["Throughput (in-process, zero-latency model)"]), "",
        "### Interactive latency while a batch runs", "",
        f"`titan serve` (a subprocess) with the simulated model `{MODEL}` (`ttft_s: "
        f"{s['ttft_s']:g}`, {s['output_tokens']} output tokens), SQLite storage, "
        f"`jobs.workers: {s['serve_workers']}` in-process, the cache off. Interactive load: "
        f"{s['clients']} closed-loop clients (httpx, async), each sending its next chat "
        f"completion (its own prompt, `max_tokens: {s['output_tokens']}`) when the last is "
        f"answered, for {s['duration_s']:g} s, after {s['interactive_warmup']} untimed "
        "requests. *A*: that load alone. *B*: right after A, a JSONL file of "
        f"{s['batch_jobs']:,} chat requests uploaded (`POST /v1/files`, purpose `batch`) and a "
        "batch created (`POST /v1/batches`); as soon as its first requests are done (the "
        "workers are on it) the same load runs again. Latency: the client's time "
        "per answered request; jobs done in the window: the batch's `request_counts` "
        "(completed + failed) at the window's end minus its start, per second of the window "
        f"while the batch ran (its status read every {s['batch_poll_s']:g} s).", "",
        *markdown_table(*tables["Interactive latency (titan serve)"]), "",
        _batch_note(results), "",
        "### Commands and config", "",
        f"Interactive phase: `{inter['command']}` with this config:", "",
        "```yaml", yaml.safe_dump(inter["config"], sort_keys=False).rstrip("\n"), "```", "",
        "Throughput phase: each pipeline's config (`config_from_mapping`, environment variables "
        "ignored), the storage per mode, `jobs.workers: 0` for direct:", "",
        "```yaml", yaml.safe_dump(thr["config"], sort_keys=False).rstrip("\n"), "```", "",
    ]  # fmt: skip
    if json_name:
        lines += [f"Raw numbers (the batch's progress each {s['batch_poll_s']:g} s included): "
                  f"`{json_name}`.", ""]  # fmt: skip
    return "\n".join([*lines, SECTION_END]) + "\n"


BENCHMARK = Benchmark(
    NAME,
    jobs_bench.run,
    render_markdown,
    report_tables,
    targets,
    packages=("titan", "redis", "httpx", "uvicorn"),
)
