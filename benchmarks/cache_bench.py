"""``python -m benchmarks cache``: what the response cache gets right, and what it costs per
request.

Phases: (1) quality (``cache_quality``): Titan's semantic matching (the threshold and the
guards) against GPTCache's default (cosine >= 0.8 alone) on the training and held-out labeled
sets of tests/data, with curves as a PNG; and the error budget against fixed thresholds on
simulated traffic. (2) lookup latency: the real ``ResponseCache.lookup`` (exact probe,
embedding, index search, candidates' ``get``, guards; fixed threshold, so that hits are served)
on a ``MemoryCache`` whose one scope holds 10,000 and 100,000 semantic entries of random unit
vectors plus the labeled questions embedded for real. (3) overheads in-process: an exact hit
(keys, lookup, replay) and a miss (keys, lookup, storing the answer) beyond the embedding.
"""

from __future__ import annotations

import asyncio
import gc
import random
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks import cache_eval, cache_quality
from benchmarks.cache_eval import TimedEmbedder
from titan.cache.embedder import Embedder
from titan.cache.index import BRUTE_FORCE_LIMIT
from titan.cache.keys import request_keys
from titan.cache.response_cache import EMBEDDING_DIM, EXACT, SEMANTIC, Lookup, ResponseCache
from titan.config.cache import CacheConfig
from titan.loadgen.metrics import percentile
from titan.service.cache_replay import replay_whole
from titan.storage.base import CacheEntry
from titan.storage.memory_cache import MemoryCache

PNG_NAME = "cache-precision-recall.png"
TRAFFIC_PNG_NAME = "cache-error-budget.png"
TENANT, MODEL = "bench-tenant", "bench-model"
SYSTEM_PROMPT = "You are the support assistant of an online shop. Answer briefly and precisely."
FILL_CHUNK = 10_000  # filler entries generated, stored and indexed per batch
Progress = Callable[[str], None]
Replay = Callable[[bytes, str], Any]


@dataclass(frozen=True)
class CacheBenchSettings:
    sizes: tuple[int, ...] = (10_000, 100_000)  # random semantic entries in the scope
    lookups: int = 400  # timed latency lookups per size: the pairs' queries, shuffled, cycled
    overhead_requests: int = 400  # misses (and as many exact hits) timed per size
    pair_stride: int = 1  # every n-th labeled pair
    warmup: int = 20  # untimed lookups per size first
    seed: int = 0
    data_dir: str = str(cache_quality.TESTS_DATA)  # the held-out sets (cache_quality.HELDOUT_SETS)
    figures_dir: str = "bench"  # where the curves go: beside RESULTS.md
    traffic_requests: int = 10_000  # simulated requests per seed for the error budget
    traffic_seeds: tuple[int, ...] = (0, 1, 2)
    budgets: tuple[float, ...] = (0.01, 0.05)  # max_error_rate values simulated
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> CacheBenchSettings:
        """Seconds per phase: a smoke run of everything (the test's)."""
        settings = cls(
            sizes=(1_000, 5_000), lookups=60, overhead_requests=60, pair_stride=4, warmup=5,
            traffic_requests=1_000, traffic_seeds=(0,), is_quick=True,
        )  # fmt: skip
        return replace(settings, **overrides)


def chat_body(question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    return {"model": MODEL, "messages": messages, "temperature": 0}


def answer_value() -> bytes:
    """A stored chat completion of ordinary size (~1 KB)."""
    content = " ".join(["Open Settings, then Account, and follow the steps shown there."] * 12)
    return orjson.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1_700_000_000,
        "model": MODEL, "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 160, "total_tokens": 202},
    })  # fmt: skip


def _keys(question: str):
    return request_keys(TENANT, MODEL, "chat", chat_body(question))


def _stats(seconds: Sequence[float]) -> dict[str, float | int | None]:
    ms = [1e3 * s for s in seconds]
    if not ms:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    return {"n": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms)}  # fmt: skip


# ---- (1) evaluation ------------------------------------------------------------------------


def run_quality(
    settings: CacheBenchSettings, encoder: Any, png: Path, traffic_png: Path, progress: Progress
) -> tuple[dict[str, Any], list[cache_eval.Pair]]:
    """The labeled sets and the simulated traffic (``cache_quality``); the pairs whose
    questions the latency phase uses (the project's and the held-out ones)."""
    from titan.cache.error_budget import ErrorBudget
    from titan.cache.guards import refusal

    sets = cache_quality.load_sets(Path(settings.data_dir), settings.pair_stride)
    progress("evaluating " + ", ".join(f"{len(p)} {name}" for name, p in sets.items()) + " pairs")
    config = CacheConfig()
    # The defaults: the guards, then the pair verifier, from the floor the error budget starts
    # at (a fake embedder in the tests has no verifier: the guards alone, at the threshold).
    verifier = _ready_verifier(encoder, progress) if isinstance(encoder, Embedder) else None
    verdict = refusal if verifier is None else cache_quality.ServedVerdict(verifier)
    threshold = config.threshold if verifier is None else config.semantic.min_similarity
    quality = cache_quality.evaluate_sets(sets, encoder, verdict, threshold, png)
    progress(f"simulating {settings.traffic_requests:,} requests x {len(settings.traffic_seeds)}")
    quality["traffic"] = cache_quality.run_traffic(
        sets, encoder, verdict, ErrorBudget, config.semantic,
        num_requests=settings.traffic_requests, seeds=settings.traffic_seeds,
        budgets=settings.budgets, png=traffic_png,
    )  # fmt: skip
    quality["pair_verifier"] = verifier is not None
    return quality, sets["project"] + sets["heldout"]


def _ready_verifier(embedder: Embedder, progress: Progress) -> Any:
    """The server's pair verifier: its weights from the cache folder, trained there first when
    missing (minutes, once per machine), as ``titan serve`` does at its first start."""
    progress("pair verifier: loading (training it first if this machine has not)")
    thread = embedder.start_verifier()
    if thread is not None:
        thread.join()
    if embedder.verifier_state != "ready":
        raise RuntimeError(f"the pair verifier is {embedder.verifier_state}")
    return embedder.verifier


# ---- (2) latency and (3) overheads ----------------------------------------------------------


async def _fill(cache: ResponseCache, scope: str, size: int, config: CacheConfig, seed: int):
    """`size` semantic entries of random unit vectors, in the store and (in batches) the index."""
    rng = np.random.default_rng(seed)
    value, now = answer_value(), time.time()
    tags = {"tenant": TENANT, "model": MODEL, "scope": scope, "question": "filler question"}
    for start in range(0, size, FILL_CHUNK):
        count = min(FILL_CHUNK, size - start)
        vectors = rng.standard_normal((count, EMBEDDING_DIM), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        keys = [f"filler-{start + i:07d}" for i in range(count)]  # ascending: stored in order
        for key, vector in zip(keys, vectors, strict=True):
            entry = CacheEntry(key, value, now, now + config.ttl_s, tags, vector.tobytes())
            await cache.store.put(SEMANTIC, entry, max_entries=config.max_entries)
        cache.index.add_many(scope, keys, vectors)


async def build_cache(
    embedder: TimedEmbedder, pairs: Sequence[cache_eval.Pair], size: int, seed: int
) -> tuple[ResponseCache, CacheConfig, float]:
    """A cache holding `size` filler entries and every pair's cached question (stored the way
    the pipeline stores an answer); returns it, its config and the seconds the build took."""
    started = time.perf_counter()
    cached = sorted({str(pair["cached"]) for pair in pairs})
    # A fixed threshold, so that hits are served; the pair verifier where the embedder has it.
    verifies = getattr(embedder.inner, "verifier_state", "off") == "ready"
    semantic = {"enabled": True, "max_error_rate": None, "pair_verifier": verifies}
    config = CacheConfig(semantic=semantic, max_entries=size + len(cached) + 100_000)
    cache = ResponseCache(MemoryCache(), embedder=embedder)  # type: ignore[arg-type]
    scope = _keys("what is this about").scope
    await _fill(cache, scope, size, config, seed)  # type: ignore[arg-type]
    vectors = np.asarray(embedder.encode(cached), dtype=np.float32)
    value = answer_value()
    for question, vector in zip(cached, vectors, strict=True):
        lookup = Lookup(_keys(question), embedding=vector)
        await cache.store_answer(lookup, config, tenant=TENANT, model=MODEL, value=value)
    return cache, config, time.perf_counter() - started


async def time_lookups(
    cache: ResponseCache,
    config: CacheConfig,
    embedder: TimedEmbedder,
    queries: Sequence[str],
    settings: CacheBenchSettings,
) -> dict[str, Any]:
    """Latency of whole lookups (keys computed beforehand), and of their embedding alone."""
    order = list(queries)
    random.Random(settings.seed).shuffle(order)
    sequence = [order[i % len(order)] for i in range(settings.warmup + settings.lookups)]
    keys = [_keys(question) for question in sequence]
    refusals_before = Counter(cache.counters.guard_refusals)
    total_s: list[float] = []
    embed_s: list[float] = []
    outcomes: Counter[str] = Counter()
    verified: Counter[int] = Counter()  # lookups by the number of pairs verified in them
    gc.collect()
    for i, key in enumerate(keys):
        embedder.take()
        embedder.take_pairs()
        started = time.perf_counter()
        lookup = await cache.lookup(key, config)
        elapsed = time.perf_counter() - started
        spent = embedder.take()
        pairs = embedder.take_pairs()
        if i < settings.warmup:
            refusals_before = Counter(cache.counters.guard_refusals)
            continue
        total_s.append(elapsed)
        embed_s.append(spent)
        outcomes["miss" if lookup.hit is None else f"hit-{lookup.hit.kind}"] += 1
        verified[pairs] += 1
    refusals = Counter(cache.counters.guard_refusals) - refusals_before
    return {
        "lookup": _stats(total_s),
        "embed": _stats(embed_s),
        "beyond_embed": _stats([t - e for t, e in zip(total_s, embed_s, strict=True)]),
        "outcomes": dict(outcomes),
        "pairs_verified": {str(n): verified[n] for n in sorted(verified)},
        "guard_refusals": dict(refusals),
    }


async def time_overheads(
    cache: ResponseCache,
    config: CacheConfig,
    embedder: TimedEmbedder,
    queries: Sequence[str],
    replay: Replay,
    wanted: int,
) -> dict[str, Any]:
    """Rounds over `queries`: each a miss (keys and lookup, minus the embedding: what the request
    waits for; `store_answer`, which the pipeline runs after the answer, timed apart) and
    then, stored now, an exact hit (keys, lookup, replay); the round's entries are deleted after
    it, so the next round misses again."""
    value = answer_value()
    miss_s: list[float] = []
    miss_embed_s: list[float] = []
    store_s: list[float] = []  # store_answer alone: in the background, not part of miss_s
    hit_s: list[float] = []
    skipped = 0
    gc.collect()
    for _ in range(wanted // max(1, len(queries)) + 1):
        stored = []
        for question in queries:
            if len(miss_s) >= wanted:
                break
            embedder.take()
            started = time.perf_counter()
            keys = _keys(question)
            lookup = await cache.lookup(keys, config)
            looked_up = time.perf_counter()
            if lookup.hit is None:
                await cache.store_answer(lookup, config, tenant=TENANT, model=MODEL, value=value)
            elapsed = looked_up - started
            stored_s = time.perf_counter() - looked_up
            spent = embedder.take()
            if lookup.hit is not None:  # a near miss served (a false hit): not a miss
                skipped += 1
                continue
            miss_s.append(elapsed - spent)
            miss_embed_s.append(spent)
            store_s.append(stored_s)
            stored.append(question)
        for question in stored:
            started = time.perf_counter()
            lookup = await cache.lookup(_keys(question), config)
            if lookup.hit is None or lookup.hit.kind != "exact":
                raise RuntimeError(f"expected an exact hit for {question!r}")
            replay(lookup.hit.value, "chat")
            hit_s.append(time.perf_counter() - started)
        for question in stored:
            keys = _keys(question)
            await cache.store.delete(EXACT, keys.exact)
            await cache.store.delete(SEMANTIC, keys.exact)
            cache.index.remove(keys.scope, keys.exact)  # type: ignore[arg-type]
        if not stored:
            break
    return {
        "exact_hit": _stats(hit_s),
        "miss_beyond_embed": _stats(miss_s),
        "miss_embed": _stats(miss_embed_s),
        "miss_store": _stats(store_s),
        "hits_skipped": skipped,
    }


async def run_sizes(
    settings: CacheBenchSettings,
    embedder: TimedEmbedder,
    pairs: Sequence[cache_eval.Pair],
    replay: Replay,
    progress: Progress,
) -> list[dict[str, Any]]:
    queries = [str(pair["query"]) for pair in pairs]
    near_misses = sorted({str(p["query"]) for p in pairs if not p["should_hit"]})
    random.Random(settings.seed).shuffle(near_misses)
    rows = []
    for size in settings.sizes:
        progress(f"cache of {size:,} entries: building (not timed)")
        cache, config, build_s = await build_cache(embedder, pairs, size, settings.seed)
        # As the server does after its start: what exists now is never collected, so the
        # collector's full passes do not walk 100,000 entries in the middle of a lookup.
        gc.collect()
        gc.freeze()
        progress(f"cache of {size:,} entries: {settings.lookups} lookups")
        latency = await time_lookups(cache, config, embedder, queries, settings)
        progress(f"cache of {size:,} entries: overheads")
        overheads = await time_overheads(
            cache, config, embedder, near_misses, replay, settings.overhead_requests
        )
        entries = len(cache.index)
        rows.append({
            "filler_entries": size, "indexed_entries": entries,
            "index": "exact (numpy)" if entries < BRUTE_FORCE_LIMIT else "HNSW (usearch)",
            "max_entries": config.max_entries, "threshold": config.threshold,
            "build_s": build_s, "latency": latency, "overheads": overheads,
        })  # fmt: skip
        del cache
        gc.unfreeze()
        gc.collect()
    return rows


async def compare_embedders(
    embedder: Embedder, queries: Sequence[str], settings: CacheBenchSettings
) -> dict[str, Any]:
    """``embed`` (its thread hop included) of the latency phase's questions, by Titan's embedder
    and then by sentence-transformers' float32 model, the baseline, loaded here: same run, same
    questions, one lookup at a time."""
    baseline = Embedder.float32()
    sequence = [queries[i % len(queries)] for i in range(settings.warmup + settings.lookups)]
    rows = {}
    for name, model in (("titan", embedder), ("float32", baseline)):
        seconds = []
        for question in sequence:
            started = time.perf_counter()
            await model.embed(question)
            seconds.append(time.perf_counter() - started)
        rows[name] = {"kind": model.kind, **_stats(seconds[settings.warmup :])}
    return rows


# ---- the run -------------------------------------------------------------------------------


def run(
    settings: CacheBenchSettings,
    progress: Progress,
    *,
    embedder: Any = None,
    replay: Replay = replay_whole,
) -> dict[str, Any]:
    """Every phase, the curves into ``settings.figures_dir``. ``embedder``: all-MiniLM-L6-v2
    (loaded here) unless given (tests pass a fake); ``replay``: how a hit is answered."""
    if embedder is None:
        progress("loading all-MiniLM-L6-v2")
        embedder = Embedder.load()
    png = Path(settings.figures_dir) / PNG_NAME
    quality, pairs = run_quality(settings, embedder, png, png.parent / TRAFFIC_PNG_NAME, progress)
    timed = TimedEmbedder(embedder)
    sizes = asyncio.run(run_sizes(settings, timed, pairs, replay, progress))
    embedders = None
    if isinstance(embedder, Embedder):  # tests pass a fake: no baseline to load then
        progress("embedding alone: Titan's embedder, then the float32 model")
        questions = sorted({str(pair["query"]) for pair in pairs})
        random.Random(settings.seed).shuffle(questions)
        embedders = asyncio.run(compare_embedders(embedder, questions, settings))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    torch = sys.modules.get("torch")  # loaded with the real model only
    machine = {"peak_rss_mib": peak_rss, "torch_threads": torch and torch.get_num_threads()}
    is_real = isinstance(embedder, Embedder)
    embedding = f"all-MiniLM-L6-v2 on CPU ({embedder.kind})" if is_real else type(embedder).__name__
    meta = {"machine": machine, "embedder": embedding, "png": str(png)}
    return {"meta": meta, **quality, "sizes": sizes, "embedders": embedders}
