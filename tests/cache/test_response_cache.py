"""The response cache over a memory store with a fake embedder whose vectors the test chooses:
exact and semantic hits, the threshold, guards, TTL, eviction, and a second replica's index
following the shared store."""

from __future__ import annotations

import numpy as np
import pytest

from tests.clock import ManualClock
from titan.cache.keys import request_keys
from titan.cache.response_cache import MAX_VERIFIED, ResponseCache
from titan.config.cache import CacheConfig
from titan.storage.memory_cache import MemoryCache

# A fixed threshold, no error budget: a near question is served at once.
FIXED = {"enabled": True, "max_error_rate": None}
SEMANTIC = CacheConfig(semantic=FIXED, threshold=0.9, ttl_s=60, max_entries=3)


class FakeEmbedder:
    """Vectors by hand: texts listed together in ``near`` get vectors with cosine ~0.95."""

    def __init__(self, *near_groups: tuple[str, ...]):
        self.vectors: dict[str, np.ndarray] = {}
        rng = np.random.default_rng(0)
        for group in near_groups:
            base = rng.standard_normal(384)
            for text in group:
                vector = base + 0.2 * rng.standard_normal(384)
                self.vectors[text] = vector / np.linalg.norm(vector)
        self.num_calls = 0
        # The pair verifier's probability for every pair (None: not ready yet).
        self.verdict: float | None = 1.0
        self.verifier_state = "ready"

    async def pair_probability(self, cached: str, asked: str) -> float | None:
        return self.verdict

    async def embed(self, text: str) -> tuple[float, ...]:
        self.num_calls += 1
        if text not in self.vectors:
            vector = np.random.default_rng(abs(hash(text)) % 2**32).standard_normal(384)
            self.vectors[text] = vector / np.linalg.norm(vector)
        return tuple(self.vectors[text])


def keys(question: str, tenant: str = "acme", system: str = "Be brief."):
    body = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
    }
    return request_keys(tenant, "m", "chat", body)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


def cache_with(embedder: FakeEmbedder, clock: ManualClock, store: MemoryCache | None = None):
    return ResponseCache(store or MemoryCache(clock), embedder=embedder, now=clock)  # type: ignore[arg-type]


async def remember(cache: ResponseCache, question: str, answer: bytes, **key_args) -> None:
    lookup = await cache.lookup(keys(question, **key_args), SEMANTIC)
    assert lookup.hit is None
    await cache.store_answer(lookup, SEMANTIC, tenant="acme", model="m", value=answer)


PARIS = "What is the capital city of France?"
PARIS_AGAIN = "Which city is the capital of France?"
PARIS_1800 = "What was the capital city of France in 1800?"


async def test_exact_then_semantic_hits_and_guarded_near_misses(clock: ManualClock):
    embedder = FakeEmbedder((PARIS, PARIS_AGAIN, PARIS_1800))
    cache = cache_with(embedder, clock)
    await remember(cache, PARIS, b'{"answer": "Paris"}')

    exact = await cache.lookup(keys(PARIS), SEMANTIC)
    assert exact.hit is not None and exact.hit.kind == "exact"
    calls = embedder.num_calls
    semantic = await cache.lookup(keys(PARIS_AGAIN), SEMANTIC)
    assert semantic.hit is not None and semantic.hit.kind == "semantic"
    assert semantic.hit.value == b'{"answer": "Paris"}'
    assert 0.9 <= semantic.hit.similarity <= 1.0  # type: ignore[operator]
    assert embedder.num_calls == calls + 1

    # Without the pair verifier the guards judge numbers (with it, the verifier: below).
    guards_alone = SEMANTIC.model_copy(
        update={"semantic": SEMANTIC.semantic.model_copy(update={"pair_verifier": False})}
    )
    dated = await cache.lookup(keys(PARIS_1800), guards_alone)
    assert dated.hit is None
    assert cache.counters.guard_refusals == {"numbers": 1}

    unrelated = await cache.lookup(keys("How do volcanoes form under the sea?"), SEMANTIC)
    assert unrelated.hit is None
    strict = SEMANTIC.model_copy(update={"threshold": 0.999})
    assert (await cache.lookup(keys(PARIS_AGAIN), strict)).hit is None


async def test_scopes_keep_tenants_and_conversations_apart(clock: ManualClock):
    cache = cache_with(FakeEmbedder((PARIS, PARIS_AGAIN)), clock)
    await remember(cache, PARIS, b"{}")
    assert (await cache.lookup(keys(PARIS_AGAIN, tenant="globex"), SEMANTIC)).hit is None
    assert (await cache.lookup(keys(PARIS, tenant="globex"), SEMANTIC)).hit is None
    assert (await cache.lookup(keys(PARIS_AGAIN, system="Be long."), SEMANTIC)).hit is None


async def test_short_questions_are_not_matched_by_meaning(clock: ManualClock):
    embedder = FakeEmbedder(("Paris?", "France capital?"))
    cache = cache_with(embedder, clock)
    lookup = await cache.lookup(keys("Paris?"), SEMANTIC)
    assert embedder.num_calls == 0  # not even embedded
    await cache.store_answer(lookup, SEMANTIC, tenant="acme", model="m", value=b"{}")
    assert (await cache.lookup(keys("France capital?"), SEMANTIC)).hit is None


async def test_entries_expire_and_the_least_recently_used_are_evicted(clock: ManualClock):
    exact_only = CacheConfig(ttl_s=60, max_entries=3)
    cache = cache_with(FakeEmbedder(), clock)
    questions = [f"Tell me about the history of city number {i}" for i in range(4)]

    async def hit(question: str) -> bool:
        return (await cache.lookup(keys(question), exact_only)).hit is not None

    for question in questions:
        lookup = await cache.lookup(keys(question), exact_only)
        await cache.store_answer(lookup, exact_only, tenant="acme", model="m", value=b"{}")
        if question == questions[2]:
            clock.now += 1
            assert await hit(questions[0])  # now the most recently used
    assert not await hit(questions[1])  # the least recently used went for questions[3]
    assert await hit(questions[0]) and await hit(questions[3])
    clock.now += exact_only.ttl_s + 1
    assert not await hit(questions[0])


async def test_another_replica_rebuilds_and_follows_the_shared_store(clock: ManualClock):
    embedder = FakeEmbedder((PARIS, PARIS_AGAIN))
    store = MemoryCache(clock)
    first = cache_with(embedder, clock, store)
    await first.start()
    await remember(first, PARIS, b'{"answer": "Paris"}')
    second = cache_with(embedder, clock, store)
    await second.start()  # rebuilt from the store
    assert (await second.lookup(keys(PARIS_AGAIN), SEMANTIC)).hit is not None

    berlin, berlin_again = (
        "What is the capital city of Germany?",
        "Which city is Germany's capital?",
    )
    apart = FakeEmbedder((PARIS,), (berlin, berlin_again)).vectors  # another base than Paris's
    embedder.vectors.update({berlin: apart[berlin], berlin_again: apart[berlin_again]})
    clock.now += 1
    await remember(first, berlin, b'{"answer": "Berlin"}')
    assert (await second.lookup(keys(berlin_again), SEMANTIC)).hit is None  # not followed yet
    await second.sync()
    assert (await second.lookup(keys(berlin_again), SEMANTIC)).hit is not None
    assert await second.flush(tenant="acme") == 4  # exact and semantic entries of both
    assert (await first.lookup(keys(PARIS), SEMANTIC)).hit is None
    await first.close()
    await second.close()


@pytest.mark.parametrize(
    ("verdict", "outcome", "refusal"),
    [(None, None, "verifier_not_ready"), (0.5, None, "verifier"), (0.99999, "semantic", None)],
)
async def test_the_pair_verifier_decides_a_candidate_the_guards_let_through(
    clock, verdict, outcome, refusal
):
    cached, asked = "How do I learn the guitar as an adult?", "How can an adult learn the guitar?"
    embedder = FakeEmbedder((cached, asked))
    cache = cache_with(embedder, clock)
    lookup = await cache.lookup(keys(cached), SEMANTIC)
    await cache.store_answer(lookup, SEMANTIC, tenant="acme", model="m", value=b"answer")
    embedder.verdict = verdict
    found = await cache.lookup(keys(asked), SEMANTIC)
    assert (found.hit.kind if found.hit else None) == outcome
    stats = await cache.stats()
    assert stats["guard_refusals"] == ({refusal: 1} if refusal else {})
    assert stats["pair_verifier"] == "ready"


@pytest.mark.parametrize("verifier", [True, False])
async def test_negations_entities_numbers_and_scope_are_the_verifiers_to_judge(clock, verifier):
    """The guards refuse them outright only without the verifier: with it, a brand for the
    generic name, "keep quiet" for "stop barking", "World War I" for "the First World War" or
    "the files" for "all files" is a paraphrase the rules turn away."""
    pairs = [
        ("How do I stop my dog from barking at night?", "How do I keep my dog quiet at night?"),
        ("How much acetaminophen can I take in a day?", "How much Tylenol can I take in a day?"),
        ("What started World War I?", "What started the First World War?"),
        ("How do I list all files in a folder on Linux?", "linux command to list files in a dir"),
    ]
    embedder = FakeEmbedder(*pairs)
    config = SEMANTIC.model_copy(
        update={
            "semantic": SEMANTIC.semantic.model_copy(update={"pair_verifier": verifier}),
            "max_entries": len(pairs),
        }
    )
    cache = cache_with(embedder, clock)
    for cached, _ in pairs:
        lookup = await cache.lookup(keys(cached), config)
        await cache.store_answer(lookup, config, tenant="acme", model="m", value=b"answer")
    embedder.verdict = 0.99999
    found = [await cache.lookup(keys(asked), config) for _, asked in pairs]
    kinds = [lookup.hit.kind if lookup.hit else None for lookup in found]
    assert kinds == (["semantic"] * 4 if verifier else [None] * 4)
    expected = {} if verifier else {"negation": 1, "entities": 1, "numbers": 1, "scope": 1}
    assert cache.counters.guard_refusals == expected


async def test_at_most_max_verified_candidates_go_to_the_verifier_per_lookup(clock):
    near = tuple(f"How should a beginner learn to play the {thing}?" for thing in
                 ("guitar well", "guitar fast", "guitar alone", "guitar"))  # fmt: skip
    embedder = FakeEmbedder(near)
    cache = cache_with(embedder, clock)
    config = SEMANTIC.model_copy(update={"max_entries": 10})
    for question in near[:3]:
        lookup = await cache.lookup(keys(question), config)
        await cache.store_answer(lookup, config, tenant="acme", model="m", value=b"answer")
    embedder.verdict = 0.5  # each candidate refused
    assert (await cache.lookup(keys(near[3]), config)).hit is None
    assert cache.counters.guard_refusals == {"verifier": MAX_VERIFIED}
