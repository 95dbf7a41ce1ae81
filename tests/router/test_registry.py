"""Tiered routing, canary splits and fallback chains."""

from __future__ import annotations

import random
from collections import Counter

from titan.config import BreakerConfig, RoutingConfig, SplitConfig, TierRule, Timeouts
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry, RequestTraits, RoutedModel


def model(name: str, **kwargs) -> RoutedModel:
    state = DeploymentState.create(
        f"{name}-0",
        None,
        weight=1.0,
        max_concurrency=None,
        timeouts=Timeouts(),
        breaker=BreakerConfig(),
        now=lambda: 0.0,
    )
    return RoutedModel(name, [state], RoutingConfig(), **kwargs)


def test_tier_rules_send_small_or_matching_requests_to_another_model():
    large = model(
        "large",
        tiers=[
            TierRule(model="small", max_prompt_tokens=10),
            TierRule(model="coder", pattern=r"\b(python|rust)\b"),
        ],
    )
    registry = Registry([large, model("small"), model("coder")])
    short = RequestTraits(prompt_chars=40, last_user_text="hi there")  # ~10 tokens
    assert registry.resolve("large", short).name == "small"
    code = RequestTraits(prompt_chars=400, last_user_text="write python to sort a list")
    assert registry.resolve("large", code).name == "coder"
    long = RequestTraits(prompt_chars=400, last_user_text="tell me about the sea")
    assert registry.resolve("large", long).name == "large"
    assert registry.resolve("missing", long) is None


def test_canary_split_by_weight():
    stable = model("chat", splits=[SplitConfig(model="chat-v2", weight=0.1)])
    registry = Registry([stable, model("chat-v2")], random.Random(0))
    counts = Counter(registry.resolve("chat", RequestTraits()).name for _ in range(5000))
    assert 400 < counts["chat-v2"] < 600 and counts["chat"] + counts["chat-v2"] == 5000


def test_fallback_chain_is_depth_first_and_each_model_once():
    registry = Registry(
        [
            model("a", fallbacks=["b", "c"]),
            model("b", fallbacks=["d", "a"]),
            model("c", fallbacks=["d"]),
            model("d"),
        ]
    )
    assert [m.name for m in registry.chain(registry.models["a"])] == ["a", "b", "d", "c"]


def test_pick_skips_tried_ejected_and_full_deployments():
    m = model("m")
    registry = Registry([m])
    only = m.deployments[0]
    assert registry.pick(m, RequestTraits(), set()) is only
    assert registry.pick(m, RequestTraits(), {only.name}) is None
    only.max_concurrency, only.outstanding = 1, 1
    assert registry.pick(m, RequestTraits(), set()) is None


def test_similarity_tier_routes_requests_close_to_its_examples():
    rule = TierRule(model="small", similar_to=("hello", "thanks"), min_similarity=0.8)
    large = model("large", tiers=[rule])
    large.tier_examples = [[(1.0, 0.0), (0.0, 1.0)]]  # unit vectors standing for the examples
    registry = Registry([large, model("small")])
    close = RequestTraits(embedding=(0.95, 0.3122))  # cos 0.95 with "hello"
    far = RequestTraits(embedding=(0.7071, -0.7071))  # cos 0.71 at best
    assert registry.resolve("large", close).name == "small"
    assert registry.resolve("large", far).name == "large"
    assert registry.resolve("large", RequestTraits()).name == "large"  # no embedding: no match


def test_a_tier_rule_has_exactly_one_condition():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exactly one of"):
        TierRule(model="x", max_prompt_tokens=5, similar_to=("hi",))
    with pytest.raises(ValidationError, match="exactly one of"):
        TierRule(model="x")
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        TierRule(model="x", pattern="([")


def test_batch_requests_go_to_the_batch_pool_and_interactive_ones_stay_out_of_it():
    def state(name: str, pool: str) -> DeploymentState:
        return DeploymentState.create(name, None, weight=1.0, max_concurrency=None,
                                      timeouts=Timeouts(), breaker=BreakerConfig(),
                                      now=lambda: 0.0, pool=pool)  # fmt: skip

    live, shared, batch = (
        state("live", "interactive"),
        state("shared", "shared"),
        state("b", "batch"),
    )
    m = RoutedModel("m", [live, shared, batch], RoutingConfig(policy="round_robin"))
    registry = Registry([m], random.Random(0))
    batch_traits, interactive = RequestTraits(is_batch=True), RequestTraits()
    assert {registry.pick(m, batch_traits, set()).name for _ in range(10)} == {"b"}
    assert {registry.pick(m, interactive, set()).name for _ in range(10)} == {"live", "shared"}
    # Batch pool down: batch requests fall back to shared deployments, never interactive ones.
    assert registry.pick(m, batch_traits, {"b"}).name == "shared"
    assert registry.pick(m, batch_traits, {"b", "shared"}) is None
    # Everything else down: interactive requests may use the batch pool.
    assert registry.pick(m, interactive, {"live", "shared"}).name == "b"
