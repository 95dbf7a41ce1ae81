"""The response cache: exact hits by fingerprint, semantic hits by meaning within a scope.

Entries live in a ``CacheStore`` (memory, SQLite or Redis: shared by replicas). The semantic
index is per replica: rebuilt from the store at start, then following entries other replicas add
(``added_since`` every ``SYNC_INTERVAL_S``); an entry evicted or expired elsewhere is dropped from
the index the first time a lookup finds it gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from titan.cache import pair_verifier
from titan.cache.answer_check import answers_agree
from titan.cache.embedder import Embedder
from titan.cache.error_budget import ErrorBudget
from titan.cache.guards import Analysis, analyze, refusal
from titan.cache.index import ScopedIndex
from titan.cache.keys import RequestKeys
from titan.config.cache import CacheConfig
from titan.storage.base import CacheEntry, CacheStore

logger = logging.getLogger("titan.cache")

EXACT, SEMANTIC = "exact", "semantic"
# How often the semantic index picks up entries other replicas stored: their answers become
# semantic hits here at most this late, plus one sync's round trip (exact hits are shared at
# once). That bound holds while the replicas' clocks agree within CLOCK_SKEW_S (entries carry
# their writer's wall clock) and fewer than SYNC_PAGE entries are stored in any CLOCK_SKEW_S.
SYNC_INTERVAL_S = 2.0
SYNC_PAGE = 10_000
# How far the index's int8 similarities may be from the exact ones (MiniLM's embeddings of the
# labeled pairs' 3,506 questions, each one's 5 nearest: mean 0.0027, 99th percentile 0.010, most
# 0.016), so that a candidate at the floor is never cut for the index's rounding.
INDEX_PRECISION = 0.025
CLOCK_SKEW_S = 5.0
# Semantic candidates checked per lookup: the nearest may fail a guard while the next passes.
NUM_CANDIDATES = 4
# Of those, at most this many go to the pair verifier (both orders of a pair served: ~3.4 ms
# on two cores of a Xeon, ~6.2 on its AVX2 kernels, ~9 on a Zen 2, whose integer multiplies
# share one port; half for a refusal): the lookup's time
# stays bounded however many neighbours pass the floor and the guards. One since the verifier
# reads both orders: two candidates would double a lookup's worst case past 15 ms there, for
# the ~1.5% of lookups that had a second candidate to verify (bench/RESULTS.md).
MAX_VERIFIED = 1
EMBEDDING_DIM = 384  # all-MiniLM-L6-v2


@dataclass(frozen=True)
class CacheHit:
    kind: Literal["exact", "semantic"]
    value: bytes
    similarity: float | None = None


@dataclass(frozen=True)
class Verification:
    """A would-be semantic hit that runs the model instead: its answer, once there, is compared
    with the cached one, and the outcome teaches the error budget."""

    key: str
    similarity: float
    cached_value: bytes
    model: str
    is_eligible: bool  # the entry could have been served: the outcome measures the policy


@dataclass
class Lookup:
    """What a lookup learned, for storing the answer afterwards without embedding twice."""

    keys: RequestKeys
    embedding: np.ndarray | None = None
    hit: CacheHit | None = None
    verification: Verification | None = None


@dataclass
class CacheCounters:
    hits: Counter[str] = field(default_factory=Counter)  # by kind
    misses: int = 0
    stores: int = 0
    guard_refusals: Counter[str] = field(default_factory=Counter)  # by reason
    verified: Counter[str] = field(default_factory=Counter)  # "agreed", "disagreed"


class ResponseCache:
    def __init__(
        self,
        store: CacheStore,
        *,
        embedder: Embedder | None = None,
        now: Callable[[], float] = time.time,
    ):
        self.store = store
        self.embedder = embedder  # None: no semantic caching
        self._now = now
        self.index = ScopedIndex(EMBEDDING_DIM)
        self._indexed: dict[str, tuple[str, float]] = {}  # key -> (scope, expires_at)
        self._cursor = 0.0  # created_at of the newest entry indexed
        self._sync_task: asyncio.Task[None] | None = None
        self.counters = CacheCounters()
        self.budget = ErrorBudget()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild the semantic index from the store, then follow it."""
        if self.embedder is None:
            return
        await self.sync()
        self._sync_task = asyncio.create_task(self._follow())

    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)

    async def _follow(self) -> None:
        is_failing = False
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            try:
                await self.sync()
            except Exception:  # the store is unreachable: lookups go on with what is indexed
                if not is_failing:  # one line per outage
                    logger.exception("following the semantic cache entries failed; retrying")
                is_failing = True
                continue
            if is_failing:
                logger.info("following the semantic cache entries works again")
                is_failing = False

    async def sync(self) -> None:
        """Index the semantic entries stored since the last sync; forget expired ones."""
        now = self._now()
        while True:
            # Replicas' clocks differ a little: look back a margin; known entries are skipped.
            since = max(0.0, self._cursor - CLOCK_SKEW_S)
            entries = await self.store.added_since(SEMANTIC, since, limit=SYNC_PAGE)
            for entry in entries:
                if entry.key not in self._indexed:
                    self._index(entry)
            # Past every entry read, this replica's own included (indexed when stored): else each
            # sync re-reads them all, and a page full of them hides what others added after.
            previous = self._cursor
            self._cursor = max([previous, *(entry.created_at for entry in entries)])
            # A full page that moved the cursor has more after it; one that did not lies inside
            # the look-back window and would be read again.
            if len(entries) < SYNC_PAGE or self._cursor <= previous:
                break
        for key, (scope, expires_at) in list(self._indexed.items()):
            if expires_at <= now:
                self._forget(key, scope)

    def _index(self, entry: CacheEntry) -> None:
        scope = entry.tags.get("scope")
        if entry.embedding is None or scope is None or entry.expires_at <= self._now():
            return
        self.index.add(scope, entry.key, np.frombuffer(entry.embedding, dtype=np.float32))
        self._indexed[entry.key] = (scope, entry.expires_at)

    def _forget(self, key: str, scope: str) -> None:
        self.index.remove(scope, key)
        self._indexed.pop(key, None)
        self.budget.forget(key)

    # ---- lookups -------------------------------------------------------------------------

    async def lookup(self, keys: RequestKeys, config: CacheConfig, model: str = "") -> Lookup:
        lookup = Lookup(keys)
        if config.exact:
            entry = await self.store.get(EXACT, keys.exact)
            if entry is not None:
                lookup.hit = CacheHit("exact", entry.value)
                self.counters.hits["exact"] += 1
                return lookup
        if self._can_be_semantic(keys, config):
            lookup.embedding = await self.embedder.embed(keys.question)  # type: ignore[union-attr, arg-type]
            found = await self._nearest(keys, lookup.embedding, config, model)
            if isinstance(found, Verification):
                lookup.verification = found
            else:
                lookup.hit = found
            if lookup.hit is not None:
                self.counters.hits["semantic"] += 1
                return lookup
        self.counters.misses += 1
        return lookup

    def _can_be_semantic(self, keys: RequestKeys, config: CacheConfig) -> bool:
        return (
            config.semantic.enabled
            and self.embedder is not None
            and keys.scope is not None
            and keys.question is not None
            and len(keys.question.split()) >= config.min_query_words
        )

    async def _nearest(
        self, keys: RequestKeys, embedding: np.ndarray, config: CacheConfig, model: str
    ) -> CacheHit | Verification | None:
        scope = keys.scope
        query = np.asarray(embedding, dtype=np.float32)
        semantic = config.semantic
        floor = config.threshold if semantic.max_error_rate is None else semantic.min_similarity
        asked: Analysis | None = None
        # With the verifier on, the guards it judges better are its own (pair_verifier.py).
        skip = pair_verifier.JUDGED_BY_VERIFIER if semantic.pair_verifier else frozenset()
        verified = 0
        for key, approximate in self.index.search(scope, query, NUM_CANDIDATES):  # type: ignore[arg-type]
            if approximate < floor - INDEX_PRECISION:
                break  # best first: the rest are further
            entry = await self.store.get(SEMANTIC, key)
            if entry is None or entry.embedding is None:  # expired or evicted (perhaps elsewhere)
                self._forget(key, scope)  # type: ignore[arg-type]
                continue
            # The index holds int8; the threshold is judged on the stored f32 vector.
            similarity = float(np.dot(query, np.frombuffer(entry.embedding, dtype=np.float32)))
            if similarity < floor:
                continue
            asked = asked or analyze(keys.question)  # type: ignore[arg-type]
            cached_question = entry.tags.get("question", "")
            stored = analyze(cached_question)
            reason = refusal(asked, stored, min_words=config.min_query_words, skip=skip)
            if reason is None and semantic.pair_verifier:
                if verified == MAX_VERIFIED:
                    break
                verified += 1
                reason = await self._pair_verdict(cached_question, keys.question)  # type: ignore[arg-type]
            if reason is not None:
                self.counters.guard_refusals[reason] += 1
                continue
            if semantic.max_error_rate is not None:
                budget = self.budget.model(
                    model, floor=floor, max_error_rate=semantic.max_error_rate
                )
                decision = self.budget.decide(
                    budget, key, similarity,
                    verify_fraction=semantic.verify_fraction,
                    min_verifications=semantic.min_verifications,
                )  # fmt: skip
                if decision.action != "serve":
                    return Verification(key, similarity, entry.value, model, decision.is_eligible)
            return CacheHit("semantic", entry.value, round(float(similarity), 4))
        return None

    async def _pair_verdict(self, cached: str, question: str) -> str | None:
        """The pair verifier's: None, or why it refuses: "verifier" (the two questions do not
        ask the same), "verifier_not_ready" (its weights are still being prepared: no semantic
        hit until they are)."""
        probability = await self.embedder.pair_probability(cached, question)  # type: ignore[union-attr]
        if probability is None:
            return "verifier_not_ready"
        return None if probability >= pair_verifier.THRESHOLD else "verifier"

    # ---- storing -------------------------------------------------------------------------

    async def store_answer(
        self,
        lookup: Lookup,
        config: CacheConfig,
        *,
        tenant: str | None,
        model: str,
        value: bytes,
        is_deterministic: bool = True,
        is_storable: bool = True,
    ) -> None:
        """Stores the answer (when storable) and, when the lookup asked for a verification,
        compares it with the cached one first."""
        if lookup.verification is not None:
            await self._verify(lookup.verification, config, value, is_deterministic)
        if not is_storable or len(value) > config.max_answer_bytes:
            return
        now = self._now()
        tags = {"tenant": tenant or "", "model": model}
        expires_at = now + config.ttl_s
        if config.exact:
            entry = CacheEntry(lookup.keys.exact, value, now, expires_at, tags)
            await self.store.put(EXACT, entry, max_entries=config.max_entries)
        if lookup.embedding is not None and lookup.keys.scope is not None:
            semantic_tags = {
                **tags,
                "scope": lookup.keys.scope,
                "question": lookup.keys.question or "",
            }
            entry = CacheEntry(
                lookup.keys.exact,
                value,
                now,
                expires_at,
                semantic_tags,
                np.asarray(lookup.embedding, dtype=np.float32).tobytes(),
            )
            evicted = await self.store.put(SEMANTIC, entry, max_entries=config.max_entries)
            self._index(entry)
            for key in evicted:
                scope_and_expiry = self._indexed.get(key)
                if scope_and_expiry is not None:
                    self._forget(key, scope_and_expiry[0])
        self.counters.stores += 1

    async def _verify(
        self, verification: Verification, config: CacheConfig, value: bytes, is_deterministic: bool
    ) -> None:
        semantic = config.semantic
        if semantic.max_error_rate is None or self.embedder is None:
            return
        agrees = await answers_agree(
            verification.cached_value, value,
            is_deterministic=is_deterministic, embedder=self.embedder,
            answer_similarity=semantic.answer_similarity,
        )  # fmt: skip
        budget = self.budget.model(
            verification.model, floor=semantic.min_similarity,
            max_error_rate=semantic.max_error_rate,
        )  # fmt: skip
        self.budget.record(
            budget, verification.key, verification.similarity, agrees,
            verification.is_eligible,
        )  # fmt: skip
        self.counters.verified["agreed" if agrees else "disagreed"] += 1

    # ---- admin ---------------------------------------------------------------------------

    async def stats(self) -> dict[str, object]:
        return {
            "exact": await self.store.stats(EXACT),
            "semantic": {**await self.store.stats(SEMANTIC), "indexed": len(self.index)},
            "hits": dict(self.counters.hits),
            "misses": self.counters.misses,
            "stores": self.counters.stores,
            "guard_refusals": dict(self.counters.guard_refusals),
            "verified": dict(self.counters.verified),
            "error_budget": self.budget.report(),
            # off | preparing | ready | unavailable (the pair verifier's weights)
            "pair_verifier": getattr(self.embedder, "verifier_state", "off"),
        }

    async def flush(self, *, tenant: str | None = None, model: str | None = None) -> int:
        removed = await self.store.flush(EXACT, tenant=tenant, model=model)
        removed += await self.store.flush(SEMANTIC, tenant=tenant, model=model)
        # The index forgets what is gone: rebuilt from what remains.
        self.index.clear()
        self._indexed.clear()
        self._cursor = 0.0
        if self.embedder is not None:
            await self.sync()
        return removed
