"""``titan bench context``: what context management buys in a long conversation, and what
retrieval costs per query.

Phases: (1) conversation: ``titan serve`` with the embedded SmolLM2 and a small window
(``engine.max_model_len``), a seeded N-turn conversation through the openai SDK twice: *trimmed*,
``responses.create`` chained by ``previous_response_id`` (Titan keeps the history and trims it to
the window), and *naive*, ``chat.completions.create`` with the whole history sent by the client
(no trimming on that endpoint: past the window, 400 ``context_length_exceeded``). Per turn: the
HTTP status, the prompt tokens (usage) and the wall time. (2) retrieval: a ``VectorStores`` on
memory documents with the real embedder; a few real files embedded through ``add_file``, the rest
of the chunks random unit vectors written as chunk documents and indexed by ``rebuild()`` (the
restart path: one batch); ``search`` timed, the query's embedding included.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from titan.bench import results_file
from titan.bench.workload import percentile

DEFAULT_OUTPUT = Path("bench/RESULTS.md")
INSTRUCTIONS = "You are a friendly assistant. Answer in one short sentence."
TENANT = "bench-tenant"
Progress = Callable[[str], None]


def _sentences(text: str) -> list[str]:
    return text.split("|")


TOPICS: dict[str, list[str]] = {
    "gardening": _sentences(
        "My tomato plants have yellow leaves near the bottom of the stem|I water the raised "
        "beds every morning before the sun gets too strong|The compost pile smells sour and "
        "the worms seem to have left it|Slugs ate half of the lettuce seedlings during the "
        "rainy week|I want to plant garlic in autumn so that it is ready next summer|The "
        "apple tree gave very few fruits this year after a late frost"
    ),
    "cycling": _sentences(
        "My bike chain skips on the smallest cog when I climb a hill|The rear brake squeals "
        "loudly whenever the road is wet|I commute twelve kilometres each way along the river "
        "path|My tyres lose pressure within two days even without a puncture|I am planning a "
        "three day tour through the hills with luggage|The saddle gives me knee pain after "
        "about an hour of riding"
    ),
    "cooking": _sentences(
        "My bread dough does not rise much even after two hours in a warm place|The lentil "
        "soup tastes flat although I added plenty of salt|I burned the rice at the bottom of "
        "the pot again yesterday|I would like to make a curry that my children will also "
        "eat|The pancakes stick to the pan unless I use a lot of butter|I have too many "
        "courgettes from the garden and need new recipes"
    ),
    "astronomy": _sentences(
        "Last night I saw a bright dot moving steadily across the sky|My small telescope "
        "shows Jupiter but its moons look blurry|The city lights make it hard to see the "
        "Milky Way from my balcony|I want to photograph the next lunar eclipse with my "
        "phone|A friend says Venus is the brightest planet in the evening sky|I wonder why "
        "the stars seem to twinkle while the planets do not"
    ),
}
ASKS = ["What should I do?", "Any advice?", "Why does this happen?", "Is that normal?",
        "How can I fix it?", "What would you suggest first?"]  # fmt: skip


@dataclass(frozen=True)
class ContextBenchSettings:
    turns: int = 100
    window: int = 1024  # engine.max_model_len of the embedded deployment
    max_output_tokens: int = 16
    chunks: int = 10_000  # in the vector store, real and filler
    queries: int = 200
    warmup_queries: int = 10
    seed: int = 0
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> ContextBenchSettings:
        """A smoke run of both phases (the test's)."""
        settings = cls(turns=20, chunks=1_000, queries=20, warmup_queries=2, is_quick=True)
        return replace(settings, **overrides)


@dataclass(frozen=True)
class ContextOutcome:
    results: dict[str, Any]
    markdown_path: Path
    json_path: Path


def user_turns(count: int, seed: int) -> list[str]:
    """Seeded user messages of 2-4 sentences (about 30-60 tokens), topics mixed."""
    rng = random.Random(seed)
    pool = [s for sentences in TOPICS.values() for s in sentences]
    return [
        f"Turn {i + 1}. " + ". ".join(rng.sample(pool, rng.randint(2, 3))) + ". " + rng.choice(ASKS)
        for i in range(count)
    ]


# ---- (1) conversation ----------------------------------------------------------------------


def titan_config(port: int, window: int) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "models": [{"deployments": [{"backend": "embedded", "engine": {"max_model_len": window}}]}],
        "cache": {"exact": False, "semantic": False},  # every turn runs the model
        "hedge": {"enabled": False},
        "probes": {"enabled": False},
        "storage": "memory://",
    }


def _call(fn: Callable[[], Any]) -> dict[str, Any]:
    import openai

    started = time.perf_counter()
    try:
        raw = fn()
        status, body, code = raw.http_response.status_code, raw.http_response.json(), None
    except openai.APIStatusError as exc:
        status, body, code = exc.status_code, None, exc.code
    except openai.APIConnectionError:
        status, body, code = None, None, "connection_error"
    return {"status": status, "body": body, "code": code, "wall_s": time.perf_counter() - started}


def run_trimmed(client: Any, model: str, turns: Sequence[str], s: ContextBenchSettings):
    records, previous = [], None
    for text in turns:
        out = _call(lambda t=text, p=previous: client.responses.with_raw_response.create(
            model=model, input=t, instructions=INSTRUCTIONS, temperature=0,
            max_output_tokens=s.max_output_tokens, previous_response_id=p,
        ))  # fmt: skip
        body = out.pop("body")
        if body is not None:
            previous = body["id"]
            context = body.get("context") or {}
            text_out = "".join(c.get("text", "") for item in body.get("output", [])
                               for c in item.get("content", []) or [])  # fmt: skip
            out.update(prompt_tokens=body["usage"]["input_tokens"], answer=text_out,
                       dropped_turns=context.get("dropped_turns"))  # fmt: skip
        records.append(out)
    return records


def run_naive(client: Any, model: str, turns: Sequence[str], s: ContextBenchSettings, fallback):
    """The client keeps the whole history; a turn that fails keeps the trimmed run's answer so
    that both runs hold the same conversation."""
    records = []
    messages: list[dict[str, str]] = [{"role": "system", "content": INSTRUCTIONS}]
    for text, other in zip(turns, fallback, strict=True):
        messages.append({"role": "user", "content": text})
        out = _call(lambda: client.chat.completions.with_raw_response.create(
            model=model, messages=messages, temperature=0, max_tokens=s.max_output_tokens,
        ))  # fmt: skip
        body = out.pop("body")
        answer = other.get("answer", "")
        if body is not None:
            answer = body["choices"][0]["message"]["content"] or ""
            out["prompt_tokens"] = body["usage"]["prompt_tokens"]
        messages.append({"role": "assistant", "content": answer})
        records.append(out)
    return records


def run_conversation(settings: ContextBenchSettings, root: Path, progress: Progress):
    import httpx
    import openai

    from titan.bench.admission_load import start_titan
    from titan.bench.gateway_systems import Workspace
    from titan.bench.processes import Services, free_port

    turns = user_turns(settings.turns, settings.seed)
    config = titan_config(free_port(), settings.window)
    with Services() as services:
        progress("conversation: starting titan serve (embedded SmolLM2)")
        titan = start_titan(services, Workspace(root), "titan", config,
                            {"TITAN_STORAGE": "memory://"})  # fmt: skip
        listed = httpx.get(f"{titan.base_url}/v1/models", timeout=30).json()["data"][0]
        model, window = listed["id"], listed.get("max_model_len") or settings.window
        with openai.OpenAI(base_url=f"{titan.base_url}/v1", api_key="none", max_retries=0,
                           timeout=300) as client:  # fmt: skip
            progress(f"conversation: {settings.turns} turns, trimmed (previous_response_id)")
            trimmed = run_trimmed(client, model, turns, settings)
            progress(f"conversation: {settings.turns} turns, naive (the full history)")
            naive = run_naive(client, model, turns, settings, trimmed)
    for records in (trimmed, naive):
        for record in records:
            record.pop("answer", None)
    return {"model": model, "window": window, "command": titan.command, "config": config,
            "user_turns": turns, "trimmed": trimmed, "naive": naive}  # fmt: skip


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def deciles(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ten groups of consecutive turns: served share, medians of the served turns."""
    size = max(1, -(-len(records) // 10))
    rows = []
    for start in range(0, len(records), size):
        group = records[start : start + size]
        served = [r for r in group if r["status"] == 200]
        rows.append({
            "turns": f"{start + 1}–{start + len(group)}",
            "served": len(served) / len(group),
            "prompt_tokens_p50": _median([r["prompt_tokens"] for r in served]),
            "wall_ms_p50": _median([1e3 * r["wall_s"] for r in served]),
        })  # fmt: skip
    return rows


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    served = [r for r in records if r["status"] == 200]
    codes: dict[str, int] = {}
    for r in records:
        if r["status"] != 200:
            codes[str(r["code"] or r["status"])] = codes.get(str(r["code"] or r["status"]), 0) + 1
    return {
        "served": len(served) / len(records) if records else 0.0,
        "max_prompt_tokens": max((r["prompt_tokens"] for r in served), default=None),
        "last_served_turn": max((i + 1 for i, r in enumerate(records) if r["status"] == 200),
                                default=None),
        "failures": codes,
        "deciles": deciles(records),
    }  # fmt: skip


# ---- (2) retrieval -------------------------------------------------------------------------


async def _retrieval(settings: ContextBenchSettings, embedder: Any, progress: Progress):
    import numpy as np

    from titan.cache.index import BRUTE_FORCE_LIMIT
    from titan.cache.response_cache import EMBEDDING_DIM
    from titan.context.rag.vector_stores import CHUNKS, VectorStores, pack
    from titan.storage.memory import MemoryDocuments

    stores = VectorStores(MemoryDocuments(), embedder, time.time)
    store = await stores.create(TENANT, name="bench")
    strategy = {"type": "static",
                "static": {"max_chunk_size_tokens": 60, "chunk_overlap_tokens": 10}}  # fmt: skip
    started = time.perf_counter()
    for topic, sentences in TOPICS.items():
        text = "\n\n".join(f"{s}. {a}" for s in sentences for a in ASKS[:2])
        file = await stores.files.create(TENANT, f"{topic}.txt", "assistants", text.encode(),
                                         "text/plain")  # fmt: skip
        link = await stores.add_file(TENANT, store["id"], file["id"], chunking_strategy=strategy)
        if link["status"] != "completed":
            raise RuntimeError(f"embedding {topic}.txt failed: {link['last_error']}")
    real_s = time.perf_counter() - started
    real = len(await stores.documents.list(CHUNKS))
    filler = max(0, settings.chunks - real)
    progress(f"retrieval: {real} real chunks embedded, {filler} filler chunks")
    rng = np.random.default_rng(settings.seed)
    vectors = rng.standard_normal((filler, EMBEDDING_DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for i, vector in enumerate(vectors):
        await stores.documents.put(CHUNKS, f"{store['id']}/filler/{i:06d}", {
            "vector_store_id": store["id"], "file_id": "file-filler", "filename": "filler.txt",
            "text": f"filler chunk {i}", "start": 0, "end": 0, "vector": pack(vector.tolist()),
        })  # fmt: skip
    started = time.perf_counter()
    indexed = await stores.rebuild()
    rebuild_s = time.perf_counter() - started
    qrng = random.Random(settings.seed + 1)
    pool = [(t, s) for t, sentences in TOPICS.items() for s in sentences]
    picks = [qrng.choice(pool) for _ in range(settings.warmup_queries + settings.queries)]
    seconds, on_topic = [], 0
    for n, (topic, sentence) in enumerate(picks):
        query = f"{qrng.choice(ASKS)} {sentence.lower()}"
        started = time.perf_counter()
        page = await stores.search(TENANT, store["id"], query, max_num_results=10)
        elapsed = time.perf_counter() - started
        if n >= settings.warmup_queries:
            seconds.append(elapsed)
            on_topic += bool(page["data"]) and page["data"][0]["filename"] == f"{topic}.txt"
    ms = sorted(1e3 * s for s in seconds)
    return {
        "chunks": indexed, "real_chunks": real, "filler_chunks": filler,
        "index": "exact (numpy)" if indexed < BRUTE_FORCE_LIMIT else "HNSW (usearch)",
        "real_embed_s": real_s, "rebuild_s": rebuild_s, "queries": len(ms),
        "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "mean_ms": sum(ms) / len(ms),
        "top_hit_right_file": on_topic / len(ms),
    }  # fmt: skip


def run_retrieval(settings: ContextBenchSettings, progress: Progress) -> dict[str, Any]:
    from titan.cache.embedder import Embedder

    progress("retrieval: loading the embedder")
    return asyncio.run(_retrieval(settings, Embedder.load(), progress))


# ---- the run -------------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    conv, window = results["conversation"], results["conversation"]["window"]
    trimmed, naive = conv["summary"]["trimmed"], conv["summary"]["naive"]
    biggest = trimmed["max_prompt_tokens"]
    return [
        {"name": "trimmed: turns served", "value": 100 * trimmed["served"], "target": "= 100%",
         "passed": trimmed["served"] == 1.0, "unit": "%"},
        {"name": "trimmed: max prompt tokens", "value": biggest, "target": f"≤ {window}",
         "passed": biggest is not None and biggest <= window, "unit": ""},
        {"name": "naive: turns served (reported)", "value": 100 * naive["served"],
         "target": "–", "passed": None, "unit": "%"},
    ]  # fmt: skip


def run_context_bench(settings: ContextBenchSettings, command: str | None = None,
                      progress: Progress = lambda m: None) -> dict[str, Any]:  # fmt: skip
    from titan.bench.report import default_command, machine_info, versions

    load_before = os.getloadavg()[0]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="titan-context-bench-") as root:
        conversation = run_conversation(settings, Path(root), progress)
    conversation["summary"] = {mode: summarize(conversation[mode]) for mode in ("trimmed", "naive")}
    retrieval = run_retrieval(settings, progress)
    results = {
        "meta": {"started_at": started_at, "command": command or default_command(),
                 "settings": asdict(settings), "machine": machine_info(load_before),
                 "versions": versions()},
        "conversation": conversation, "retrieval": retrieval,
    }  # fmt: skip
    results["targets"] = targets(results)
    return results


def bench_context(settings: ContextBenchSettings, output: Path = DEFAULT_OUTPUT,
                  command: str | None = None, progress: Progress = lambda m: None):  # fmt: skip
    from titan.bench.report import display_path, write_json

    results = run_context_bench(settings, command=command, progress=progress)
    json_path = write_json(results_file.json_path_for(output.parent / "out", "context"), results)
    markdown = render_markdown(results, json_name=display_path(json_path))
    return ContextOutcome(results, results_file.write_section(output, markdown, "context"),
                          json_path)  # fmt: skip


# ---- the report ----------------------------------------------------------------------------


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def report_tables(results: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Title → (header, rows): the same tables on the console and in the Markdown."""
    verdict = {True: "PASS", False: "FAIL", None: "info"}
    tables = {"Targets": (["check", "measured", "target", "result"], [
        [t["name"], _num(t["value"]) + t["unit"], t["target"], verdict[t["passed"]]]
        for t in results["targets"]
    ])}  # fmt: skip
    summary = results["conversation"]["summary"]
    rows = [
        [a["turns"], f"{100 * a['served']:.0f}%", _num(a["prompt_tokens_p50"]),
         _num(a["wall_ms_p50"]), f"{100 * b['served']:.0f}%", _num(b["prompt_tokens_p50"]),
         _num(b["wall_ms_p50"])]
        for a, b in zip(summary["trimmed"]["deciles"], summary["naive"]["deciles"], strict=True)
    ]  # fmt: skip
    rows.append(["max / all", f"{100 * summary['trimmed']['served']:.0f}%",
                 _num(summary["trimmed"]["max_prompt_tokens"]), "",
                 f"{100 * summary['naive']['served']:.0f}%",
                 _num(summary["naive"]["max_prompt_tokens"]), ""])  # fmt: skip
    tables["Conversation, per decile of turns"] = ([
        "turns", "trimmed served", "trimmed prompt tokens p50", "trimmed time p50 (ms)",
        "naive served", "naive prompt tokens p50", "naive time p50 (ms)",
    ], rows)  # fmt: skip
    r = results["retrieval"]
    tables["Retrieval"] = (
        ["chunks (real + filler)", "index", "queries", "search p50 (ms)", "search p99 (ms)",
         "mean (ms)", "top hit from the right file"],
        [[f"{r['chunks']} ({r['real_chunks']} + {r['filler_chunks']})", r["index"],
          str(r["queries"]), _num(r["p50_ms"], 2), _num(r["p99_ms"], 2), _num(r["mean_ms"], 2),
          f"{100 * r['top_hit_right_file']:.0f}%"]],
    )  # fmt: skip
    return tables


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    import yaml

    meta, conv, r = results["meta"], results["conversation"], results["retrieval"]
    s, m, v = meta["settings"], meta["machine"], meta["versions"]
    tables = report_tables(results)
    start, end = results_file.markers("context")
    naive = conv["summary"]["naive"]
    lines = [start, "## Context benchmark (`titan bench context`)", ""]
    if s["is_quick"]:
        lines += ["> **Quick variant** (`--quick`): a smoke run of both phases. Its numbers say "
                  "nothing about the targets.", ""]  # fmt: skip
    lines += [
        f"Measured {meta['started_at']} with `{meta['command']}`.",
        f"Machine: {m['cpu_model']}, {m['num_cores']} cores, {m['platform']} (1-minute load "
        f"average {m['load_average_before']:.2f} before, {m['load_average_after']:.2f} after). "
        f"Python {v['python']}, titan {v['titan']}, torch {v['torch']}, transformers "
        f"{v['transformers']}.", "",
        "### Targets", "", *_table(*tables["Targets"]), "",
        "### Conversation", "",
        f"`titan serve` with the embedded model `{conv['model']}`, window {conv['window']} "
        f"tokens (`engine.max_model_len`), the exact cache off. One seeded conversation of "
        f"{s['turns']} user turns (2–3 sentences and a question each, about 30–60 tokens), "
        f"`instructions` set, `max_output_tokens: {s['max_output_tokens']}`, `temperature: 0`, "
        "sent twice through the openai SDK, one request at a time: *trimmed*: "
        "`responses.create` chained by `previous_response_id` (Titan keeps the history and "
        "drops the oldest whole turns to fit the window); *naive*: `chat.completions.create` "
        "with the whole history sent by the client each turn (no trimming there: past the "
        "window Titan answers 400 `context_length_exceeded`; a failed turn keeps the trimmed "
        "run's answer in the history so that both runs hold the same conversation). Prompt "
        "tokens from `usage`; time: the client's wall time per request. Medians are over the "
        f"turns served. Naive: last turn served {naive['last_served_turn']}, failures "
        f"{naive['failures'] or 'none'}.", "",
        *_table(*tables["Conversation, per decile of turns"]), "",
        "### Retrieval", "",
        f"A `VectorStores` on memory documents with the real embedder (all-MiniLM-L6-v2, CPU). "
        f"{len(TOPICS)} real text files (one per topic) embedded through `add_file` (static "
        f"chunks of 60 tokens, {r['real_chunks']} chunks, {r['real_embed_s']:.1f} s); then "
        f"{r['filler_chunks']} random unit vectors written as chunk documents, and the whole "
        f"store indexed by `rebuild()` (the restart path, one batch: {r['rebuild_s']:.1f} s). "
        f"{r['queries']} timed `search(..., max_num_results=10)` calls after "
        f"{s['warmup_queries']} untimed ones, each query a topic sentence with a question: "
        "time includes the query's embedding, the index search and reading the 10 chunks.", "",
        *_table(*tables["Retrieval"]), "",
        "### Command and config", "", f"- titan: `{conv['command']}`", "",
        "```yaml", yaml.safe_dump(conv["config"], sort_keys=False).rstrip("\n"), "```", "",
    ]  # fmt: skip
    if json_name:
        lines += [f"Raw numbers (every turn): `{json_name}`.", ""]
    return "\n".join([*lines, end]) + "\n"


def print_console(results: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    for title, (header, rows) in report_tables(results).items():
        table = Table(title=title)
        for column in header:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        console.print(table)
