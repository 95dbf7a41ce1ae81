"""``python -m benchmarks context``: what context management buys in a long conversation, and what
retrieval costs per query.

Phases: (1) conversation: ``titan serve`` with the embedded SmolLM2 and a small window
(``engine.max_model_len``), a seeded N-turn conversation through the openai SDK three times:
*trimmed*, ``responses.create`` chained by ``previous_response_id`` (Titan keeps the history and
trims it to the window); *naive*, ``chat.completions.create`` with the whole history sent by the
client (no trimming on that endpoint: past the window, 400 ``context_length_exceeded``); and
*headroom*, the trimmed run against a second server with ``context.trim_headroom`` set (trimming
frees part of the budget, so the next turns keep the same prompt prefix). Per turn: the HTTP
status, the prompt tokens (usage) and the wall time. (2) retrieval: a ``VectorStores`` on memory
documents with the real embedder; a few real files embedded through ``add_file``, the rest of the
chunks random unit vectors written as one more completed file of the store; a fresh
``VectorStores`` on the same documents (a restart) loads its index on the first ``search``
(timed apart), then ``search`` is timed, the query's embedding included, with the default
reranker and with ``ranker: "none"``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from titan.loadgen.metrics import percentile

INSTRUCTIONS = "You are a friendly assistant. Answer in one short sentence."
TENANT = "bench-tenant"
MODES = ("trimmed", "headroom", "naive")  # the conversation's three runs
RANKERS = ("auto", "none")  # the default reranking, and plain vector order
FILLER_FILE = "file-filler"
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
    trim_headroom: float = 0.5  # context.trim_headroom of the headroom run
    chunks: int = 10_000  # in the vector store, real and filler
    queries: int = 200
    warmup_queries: int = 10
    seed: int = 0
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> ContextBenchSettings:
        """A smoke run of every phase (the test's)."""
        settings = cls(turns=20, chunks=1_000, queries=20, warmup_queries=2, is_quick=True)
        return replace(settings, **overrides)


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
        "context": {"trim_headroom": 0.0},  # the most that fits; headroom_config sets its own
    }


def headroom_config(port: int, window: int, headroom: float) -> dict[str, Any]:
    return {**titan_config(port, window), "context": {"trim_headroom": headroom}}


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


@contextmanager
def _served(root: Path, name: str, config: dict[str, Any]) -> Iterator[tuple[Any, Any, dict]]:
    """(service, openai client, its model as /v1/models lists it) of a ``titan serve`` with
    ``config``, stopped when the block ends."""
    import httpx
    import openai

    from benchmarks.admission_load import start_titan
    from benchmarks.gateway_systems import Workspace
    from titan.chaos.processes import Services

    with Services() as services:
        titan = start_titan(services, Workspace(root), name, config,
                            {"TITAN_STORAGE": "memory://"})  # fmt: skip
        listed = httpx.get(f"{titan.base_url}/v1/models", timeout=30).json()["data"][0]
        with openai.OpenAI(base_url=f"{titan.base_url}/v1", api_key="none", max_retries=0,
                           timeout=300) as client:  # fmt: skip
            yield titan, client, listed


def run_conversation(settings: ContextBenchSettings, root: Path, progress: Progress):
    from titan.chaos.processes import free_port

    turns = user_turns(settings.turns, settings.seed)
    config = titan_config(free_port(), settings.window)
    progress("conversation: starting titan serve (embedded SmolLM2)")
    with _served(root, "titan", config) as (titan, client, listed):
        model, window = listed["id"], listed.get("max_model_len") or settings.window
        progress(f"conversation: {settings.turns} turns, trimmed (previous_response_id)")
        trimmed = run_trimmed(client, model, turns, settings)
        progress(f"conversation: {settings.turns} turns, naive (the full history)")
        naive = run_naive(client, model, turns, settings, trimmed)
    # Started once the first is gone: two servers would share the machine's few cores.
    second = headroom_config(free_port(), settings.window, settings.trim_headroom)
    progress(f"conversation: starting titan serve with trim_headroom {settings.trim_headroom}")
    with _served(root, "titan-headroom", second) as (headroom_titan, client, _):
        progress(f"conversation: {settings.turns} turns, headroom (previous_response_id)")
        headroom = run_trimmed(client, model, turns, settings)
    for records in (trimmed, naive, headroom):
        for record in records:
            record.pop("answer", None)
    return {"model": model, "window": window, "command": titan.command, "config": config,
            "headroom_command": headroom_titan.command, "headroom_config": second,
            "user_turns": turns, "trimmed": trimmed, "naive": naive,
            "headroom": headroom}  # fmt: skip


# ---- (2) retrieval -------------------------------------------------------------------------


def search_queries(settings: ContextBenchSettings) -> list[tuple[str, str]]:
    """(topic, query) pairs, warmup first: a topic sentence with a question."""
    rng = random.Random(settings.seed + 1)
    pool = [(t, s) for t, sentences in TOPICS.items() for s in sentences]
    picks = [rng.choice(pool) for _ in range(settings.warmup_queries + settings.queries)]
    return [(topic, f"{rng.choice(ASKS)} {sentence.lower()}") for topic, sentence in picks]


async def _add_filler(stores: Any, store_id: str, like_file_id: str, count: int, seed: int):
    """``count`` random unit vectors stored the way ingestion stores a file: chunks in the
    file's namespace, a completed link, the store's revision bumped (its index follows that)."""
    import numpy as np

    from titan.cache.response_cache import EMBEDDING_DIM
    from titan.context.rag.store_index import chunk_namespace, pack
    from titan.context.rag.vector_stores import LINKS

    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, EMBEDDING_DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    namespace = chunk_namespace(store_id, FILLER_FILE)
    for i, vector in enumerate(vectors):
        await stores.documents.put(namespace, f"{i:06d}", {
            "filename": "filler.txt", "text": f"filler chunk {i}", "start": 0, "end": 0,
            "vector": pack(vector.tolist()),
        })  # fmt: skip
    links = f"{LINKS}:{store_id}"
    like = await stores.documents.get(links, like_file_id)  # the stored link: internal fields too
    usage = count * 4 * EMBEDDING_DIM
    await stores.documents.put(links, FILLER_FILE, {**like, "id": FILLER_FILE, "chunk_count": count,
                                                    "usage_bytes": usage,
                                                    "_version": uuid.uuid4().hex})  # fmt: skip
    await stores._update(TENANT, store_id, usage, completed=1)


async def _timed_searches(stores: Any, store_id: str, queries: Sequence[tuple[str, str]],
                          ranker: str, warmup: int) -> dict[str, Any]:  # fmt: skip
    seconds, right_file = [], 0
    for n, (topic, query) in enumerate(queries):
        started = time.perf_counter()
        page = await stores.search(TENANT, store_id, query, max_num_results=10,
                                   ranking={"ranker": ranker})  # fmt: skip
        elapsed = time.perf_counter() - started
        if n >= warmup:
            seconds.append(elapsed)
            right_file += bool(page["data"]) and page["data"][0]["filename"] == f"{topic}.txt"
    ms = sorted(1e3 * s for s in seconds)
    return {"queries": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms), "top_hit_right_file": right_file / len(ms)}  # fmt: skip


async def _retrieval(settings: ContextBenchSettings, embedder: Any, progress: Progress):
    from titan.cache.index import BRUTE_FORCE_LIMIT
    from titan.context.rag.store_index import chunk_namespace
    from titan.context.rag.vector_stores import VectorStores
    from titan.storage.memory import MemoryDocuments

    async def load_embedder() -> Any:
        return embedder

    documents = MemoryDocuments()
    stores = VectorStores(documents, load_embedder, time.time)
    store_id = (await stores.create(TENANT, name="bench"))["id"]
    strategy = {"type": "static",
                "static": {"max_chunk_size_tokens": 60, "chunk_overlap_tokens": 10}}  # fmt: skip
    started, file_ids = time.perf_counter(), []
    for topic, sentences in TOPICS.items():
        text = "\n\n".join(f"{s}. {a}" for s in sentences for a in ASKS[:2])
        file = await stores.files.create(TENANT, f"{topic}.txt", "assistants", text.encode(),
                                         "text/plain")  # fmt: skip
        link = await stores.add_file(TENANT, store_id, file["id"], chunking_strategy=strategy)
        if link["status"] != "completed":
            raise RuntimeError(f"embedding {topic}.txt failed: {link['last_error']}")
        file_ids.append(file["id"])
    real_s = time.perf_counter() - started
    real = sum([len(await documents.list(chunk_namespace(store_id, f))) for f in file_ids])
    filler = max(0, settings.chunks - real)
    progress(f"retrieval: {real} real chunks embedded, {filler} filler chunks")
    await _add_filler(stores, store_id, file_ids[0], filler, settings.seed)
    # A new instance on the same documents starts with an empty index, as after a restart.
    stores = VectorStores(documents, load_embedder, time.time)
    queries = search_queries(settings)
    started = time.perf_counter()
    await stores.search(TENANT, store_id, queries[0][1], max_num_results=10)
    load_s = time.perf_counter() - started
    indexed = len(stores.index)
    rankers = {}
    for ranker in RANKERS:
        progress(f"retrieval: {len(queries)} searches, ranker {ranker}")
        rankers[ranker] = await _timed_searches(stores, store_id, queries, ranker,
                                                settings.warmup_queries)  # fmt: skip
    return {
        "chunks": indexed, "real_chunks": real, "filler_chunks": filler,
        "index": "exact (numpy)" if indexed < BRUTE_FORCE_LIMIT else "HNSW (usearch)",
        "real_embed_s": real_s, "load_s": load_s, "rankers": rankers,
    }  # fmt: skip


def run_retrieval(settings: ContextBenchSettings, progress: Progress) -> dict[str, Any]:
    from titan.cache.embedder import Embedder

    progress("retrieval: loading the embedder")
    return asyncio.run(_retrieval(settings, Embedder.load(), progress))


# ---- the run -------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _served_ms_p50(records: Sequence[dict[str, Any]]) -> float | None:
    return _median([1e3 * r["wall_s"] for r in records if r["status"] == 200])


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
            "wall_ms_p50": _served_ms_p50(group),
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
        # Once the history overflows the window: where trimming policies differ.
        "second_half_wall_ms_p50": _served_ms_p50(records[len(records) // 2 :]),
        "deciles": deciles(records),
    }  # fmt: skip


def run(settings: ContextBenchSettings, progress: Progress) -> dict[str, Any]:
    """The conversation (summarized per mode), then retrieval."""
    with tempfile.TemporaryDirectory(prefix="titan-context-bench-") as root:
        conversation = run_conversation(settings, Path(root), progress)
    conversation["summary"] = {mode: summarize(conversation[mode]) for mode in MODES}
    return {"conversation": conversation, "retrieval": run_retrieval(settings, progress)}
