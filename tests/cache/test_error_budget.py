"""The semantic cache's error budget: nothing served until verifications bound the error rate,
the threshold learned from them, per-entry failures, the cost counted; and the response cache
asking for verifications and learning from the answers."""

from __future__ import annotations

import random

import orjson
import pytest

from tests.cache.test_response_cache import PARIS, PARIS_AGAIN, FakeEmbedder, keys
from tests.clock import ManualClock
from titan.cache.answer_check import answer_text, answers_agree
from titan.cache.error_budget import ErrorBudget, upper_bound
from titan.cache.response_cache import ResponseCache
from titan.config.cache import CacheConfig
from titan.storage.memory_cache import MemoryCache

SERVE_ALL = {"verify_fraction": 0.0, "min_verifications": 0}


def test_the_bound_shrinks_with_evidence_and_grows_with_errors():
    assert upper_bound(0, 0) == 1.0
    assert upper_bound(0, 100) > upper_bound(0, 300) > 0.0
    assert upper_bound(0, 300) < 0.01 < upper_bound(1, 300)
    assert upper_bound(5, 100) > 0.05


def test_nothing_is_served_until_the_records_bound_the_error():
    budget = ErrorBudget(random.Random(0))
    model = budget.model("m", floor=0.8, max_error_rate=0.05)
    assert budget.decide(model, "a", 0.95, **SERVE_ALL).action == "verify"
    assert budget.decide(model, "a", 0.7, **SERVE_ALL).action == "miss"  # below the floor
    for _ in range(40):
        budget.record(model, "a", 0.95, is_right=True, is_eligible=True)
    assert model.threshold is None  # 40 right answers do not yet prove 5%
    for _ in range(30):
        budget.record(model, "a", 0.95, is_right=True, is_eligible=True)
    assert model.threshold is not None and model.threshold <= 0.95
    assert budget.decide(model, "a", 0.96, **SERVE_ALL).action == "serve"


def test_the_threshold_rises_above_where_answers_were_wrong():
    budget = ErrorBudget(random.Random(0))
    model = budget.model("m", floor=0.8, max_error_rate=0.05)
    rng = random.Random(1)
    for index in range(2000):
        similarity = rng.uniform(0.8, 1.0)
        is_right = similarity >= 0.9 or rng.random() < 0.5  # wrong half the time below 0.9
        budget.record(model, f"e{index % 100}", similarity, is_right, is_eligible=True)
    assert model.threshold is not None and 0.88 <= model.threshold <= 0.93
    estimate = model.estimate()
    assert estimate.upper_bound <= 0.05 and estimate.verified > 500


def test_an_entry_is_verified_first_and_not_served_where_it_failed():
    budget = ErrorBudget(random.Random(0))
    model = budget.model("m", floor=0.8, max_error_rate=0.05)
    for _ in range(100):
        budget.record(model, "known", 0.9, is_right=True, is_eligible=True)
    options = {"verify_fraction": 0.0, "min_verifications": 1}
    assert budget.decide(model, "new", 0.95, **options).action == "verify"  # never verified
    assert budget.decide(model, "known", 0.95, **options).action == "serve"
    budget.record(model, "known", 0.96, is_right=False, is_eligible=True)
    assert budget.decide(model, "known", 0.95, **options).action == "verify"
    assert budget.decide(model, "known", 0.97, **options).action == "serve"


def test_sampled_verifications_of_servable_hits_are_the_extra_calls():
    budget = ErrorBudget(random.Random(0))
    model = budget.model("m", floor=0.8, max_error_rate=0.05)
    for _ in range(100):
        budget.record(model, "e", 0.9, is_right=True, is_eligible=True)
    decisions = [
        budget.decide(model, "e", 0.95, verify_fraction=0.1, min_verifications=1).action
        for _ in range(1000)
    ]
    assert 50 < decisions.count("verify") < 150
    report = budget.report()["m"]
    assert report["extra_model_calls"] == decisions.count("verify")
    assert report["served"] == decisions.count("serve")
    assert report["extra_calls_per_1000"] == pytest.approx(decisions.count("verify"), abs=1)


def chat(text: str) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "message": {"content": text}}]})


async def test_answers_agree_exactly_when_deterministic_else_by_meaning():
    embedder = FakeEmbedder(("Paris is the capital.", "The capital is Paris."))
    same = await answers_agree(
        chat("Paris  is the capital."), chat("Paris is the capital."),
        is_deterministic=True, embedder=embedder, answer_similarity=0.9,
    )  # fmt: skip
    assert same
    for deterministic, expected in ((True, False), (False, True)):
        agree = await answers_agree(
            chat("Paris is the capital."), chat("The capital is Paris."),
            is_deterministic=deterministic, embedder=embedder, answer_similarity=0.9,
        )  # fmt: skip
        assert agree is expected
    call = {"function": {"name": "f", "arguments": "{}"}, "id": "call_1"}
    tool = orjson.dumps({"choices": [{"message": {"content": None, "tool_calls": [call]}}]})
    assert answer_text(tool) == "f({})"
    assert answer_text(b"not json") == "not json"


async def test_the_cache_verifies_near_hits_and_serves_once_they_agree():
    semantic = {"enabled": True, "max_error_rate": 0.05, "verify_fraction": 0.0}
    config = CacheConfig(semantic=semantic, exact=False)
    clock = ManualClock(1_000_000.0)
    cache = ResponseCache(
        MemoryCache(clock), embedder=FakeEmbedder((PARIS, PARIS_AGAIN)), now=clock
    )  # type: ignore[arg-type]
    first = await cache.lookup(keys(PARIS), config, "m")
    await cache.store_answer(first, config, tenant="acme", model="m", value=chat("Paris."))
    near = await cache.lookup(keys(PARIS_AGAIN), config, "m")
    assert near.hit is None and near.verification is not None  # cold: verified, not served
    await cache.store_answer(
        near, config, tenant="acme", model="m", value=chat("Paris."), is_storable=False
    )
    assert cache.counters.verified["agreed"] == 1
    model = cache.budget.model("m", floor=config.semantic.min_similarity, max_error_rate=0.05)
    for _ in range(100):  # as if many near questions had been verified
        cache.budget.record(
            model, "other", near.verification.similarity, is_right=True, is_eligible=True
        )
    served = await cache.lookup(keys(PARIS_AGAIN), config, "m")
    assert served.hit is not None and served.hit.kind == "semantic"
    stats = await cache.stats()
    assert stats["error_budget"]["m"]["threshold"] is not None  # type: ignore[index]
