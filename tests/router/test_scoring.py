"""The scoring router: each score, the filters, ties, and the explanation it keeps."""

from __future__ import annotations

import random

import pytest

from titan.config import BreakerConfig, RoutingConfig, Timeouts
from titan.router.deployment import DeploymentState
from titan.router.load_state import ReplicaLoadTracker
from titan.router.registry import Registry, RequestTraits, RoutedModel
from titan.router.replica_load import Exposition
from titan.router.scoring import ROUTE_HEADER, RouteDecision

SYSTEM = "system: You are a careful assistant. " * 40  # 5 full blocks of 256 chars


def deployment(name: str, clock, **kwargs) -> DeploymentState:
    tracker = ReplicaLoadTracker(f"http://{name}/metrics", stale_after_s=3.0, now=clock)
    return DeploymentState.create(
        name, None, weight=kwargs.pop("weight", 1.0), timeouts=Timeouts(),
        max_concurrency=kwargs.pop("max_concurrency", None),
        breaker=BreakerConfig(consecutive_errors=1), now=clock, load=tracker, **kwargs,
    )  # fmt: skip


def scored_model(clock, names=("a", "b", "c"), **scored) -> RoutedModel:
    scored = {"tie_break": "first", **scored}
    routing = RoutingConfig.model_validate({"policy": "scored", "scored": scored})
    return RoutedModel("m", [deployment(n, clock) for n in names], routing)


def pick(registry: Registry, model: RoutedModel, text: str) -> tuple[str, RouteDecision]:
    decisions: list[RouteDecision] = []
    traits = RequestTraits(prompt_chars=len(text), prompt_text=text)
    chosen = registry.pick(model, traits, set(), decisions)
    assert chosen is not None and decisions[-1].chosen == chosen.name
    return chosen.name, decisions[-1]


def scores(decision: RouteDecision) -> dict[str, dict]:
    return {c.deployment: c.snapshot() for c in decision.candidates}


def report(model: RoutedModel, name: str, **load) -> None:
    state = next(d for d in model.deployments if d.name == name)
    state.load.record(Exposition(**load))


def test_a_prefix_sticks_to_the_deployment_that_served_it(clock):
    model = scored_model(clock)
    registry = Registry([model], random.Random(0))
    first, decision = pick(registry, model, SYSTEM + "user: first question\n")
    assert first == "a" and decision.prompt_blocks == 5  # nothing known: the first, by tie_break
    for question in ("second", "third", "fourth"):
        chosen, decision = pick(registry, model, SYSTEM + f"user: {question} question\n")
        assert chosen == "a"
        assert scores(decision)["a"]["prefix"] == 1.0 and scores(decision)["b"]["prefix"] == 0.0
    # Titan's own in-flight count is the queue while no server reading is fresh.
    model.deployments[0].outstanding = 4
    chosen, decision = pick(registry, model, SYSTEM + "user: fifth\n")
    assert chosen == "a"  # 3 + 4 x (1 - 4/16) + 1 + 1 = 8 beats 0 + 4 + 1 + 1
    assert scores(decision)["a"]["queue"] == 0.75
    assert scores(decision)["a"]["queue_source"] == "titan"


def test_load_spreads_once_a_queue_outweighs_the_prefix(clock):
    model = scored_model(clock)
    registry = Registry([model], random.Random(0))
    pick(registry, model, SYSTEM)
    report(model, "a", waiting=14.0, running=2.0, kv_usage=0.5)  # 16 held: queue score 0
    report(model, "b", waiting=0.0, running=1.0, kv_usage=0.5)
    chosen, decision = pick(registry, model, SYSTEM + "user: again\n")
    assert chosen != "a"
    a = scores(decision)["a"]
    assert (a["queue_length"], a["queue_source"], a["queue"], a["prefix"]) == (16.0, "server", 0, 1)
    # The reading goes stale: Titan's own count (nothing in flight) is believed again.
    clock.advance(5)
    chosen, decision = pick(registry, model, SYSTEM + "user: later\n")
    assert chosen == "a" and scores(decision)["a"]["queue_source"] == "titan"


def test_a_reading_counts_titan_s_own_requests_as_they_are_now(clock):
    """The server's reading beyond Titan's own in flight at that moment came from elsewhere;
    Titan's own count is taken as it is now (the reading is up to interval_s old)."""
    model = scored_model(clock, names=("a", "b"),
                         weights={"prefix": 0, "queue": 1, "kv": 0, "latency": 0})  # fmt: skip
    a, b = model.deployments
    registry = Registry([model], random.Random(0))
    a.outstanding = 5
    report(model, "a", waiting=1.0, running=5.0)  # 5 of Titan's + 1 from another client
    report(model, "b", waiting=0.0, running=3.0)  # 3 from elsewhere
    assert a.load.current().own_in_flight == 5
    a.outstanding = 1  # four of Titan's finished since the reading
    chosen, decision = pick(registry, model, "hello")
    assert chosen == "a"  # 1 + 1 against 0 + 3 (taken whole, the reading said 6 against 3)
    assert (scores(decision)["a"]["queue_length"], scores(decision)["b"]["queue_length"]) == (2, 3)
    a.outstanding, b.outstanding = 2, 4  # Titan's own since: never fewer than those
    assert scores(pick(registry, model, "hello")[1])["b"]["queue_length"] == 7


def test_kv_score_and_the_long_prompt_filter(clock):
    model = scored_model(clock, weights={"prefix": 0, "queue": 0, "kv": 1, "latency": 0},
                         kv_full=0.9, long_prompt_tokens=100)  # fmt: skip
    registry = Registry([model], random.Random(0))
    report(model, "a", kv_usage=0.95)
    report(model, "b", kv_usage=0.2)
    chosen, decision = pick(registry, model, "short prompt")  # no filter: the freer cache wins
    assert chosen == "b"
    assert scores(decision)["b"]["kv"] == 0.8
    assert scores(decision)["c"]["kv"] is None  # unknown: counted as the known ones' mean
    long_prompt = "x" * 1000  # 250 tokens
    model_weights = {"prefix": 0, "queue": 0, "kv": 0, "latency": 1}
    model = scored_model(clock, weights=model_weights, kv_full=0.9, long_prompt_tokens=100)
    registry = Registry([model], random.Random(0))
    report(model, "a", kv_usage=0.95)
    chosen, decision = pick(registry, model, long_prompt)
    assert chosen == "b" and scores(decision)["a"] == {"deployment": "a", "filtered": "kv_full"}
    for name in ("b", "c"):
        report(model, name, kv_usage=0.99)
    chosen, decision = pick(registry, model, long_prompt)  # all full: none is filtered
    assert chosen == "a" and all("filtered" not in s for s in scores(decision).values())


def test_unavailable_deployments_are_filtered_with_their_reason(clock):
    model = scored_model(clock)
    a, b, _ = model.deployments
    a.breaker.record_failure()  # consecutive_errors 1: open
    b.max_concurrency, b.outstanding = 1, 1
    registry = Registry([model], random.Random(0))
    chosen, decision = pick(registry, model, SYSTEM)
    assert chosen == "c"
    assert scores(decision)["a"]["filtered"] == "breaker_open"
    assert scores(decision)["b"]["filtered"] == "max_concurrency"


def test_latency_score_and_weights(clock):
    model = scored_model(clock, weights={"prefix": 0, "queue": 0, "kv": 0, "latency": 1})
    a, b, c = model.deployments
    a.latency.update(0.4)
    b.latency.update(0.1)
    c.latency.update(0.2)
    registry = Registry([model], random.Random(0))
    chosen, decision = pick(registry, model, "hello")
    assert chosen == "b"
    assert scores(decision)["a"]["latency"] == pytest.approx(0.25)
    assert scores(decision)["c"]["latency"] == pytest.approx(0.5)


def test_queue_is_per_unit_of_weight(clock):
    model = scored_model(clock, names=("big", "small"),
                         weights={"prefix": 0, "queue": 1, "kv": 0, "latency": 0})  # fmt: skip
    big, small = model.deployments
    big.weight = 2.0
    big.outstanding, small.outstanding = 3, 2  # 1.5 and 2 per unit of weight
    chosen, _ = pick(Registry([model], random.Random(0)), model, "hello")
    assert chosen == "big"


def test_a_slower_replica_s_queue_counts_for_more(clock):
    """Queued requests are counted in the fastest replica's: one twice as slow (by its typical
    time to first byte) holding 3 counts as (3 + 1) x 2 - 1 = 7; past 4x slower no more."""
    model = scored_model(clock, names=("fast", "slow"),
                         weights={"prefix": 0, "queue": 1, "kv": 0, "latency": 0})  # fmt: skip
    fast, slow = model.deployments
    fast.on_success(0.1)
    slow.on_success(0.2)
    fast.outstanding, slow.outstanding = 5, 3
    registry = Registry([model], random.Random(0))
    chosen, decision = pick(registry, model, "hello")
    assert chosen == "fast"  # 5 against 7, though it holds more requests
    assert scores(decision)["slow"]["queue"] == pytest.approx(1 - 2 / 16)
    assert (scores(decision)["fast"]["slowdown"], scores(decision)["slow"]["slowdown"]) == (1, 2)
    assert "slowdown:2" in decision.header()
    fast.outstanding = 8  # 8 against 7: now the slow one
    assert pick(registry, model, "hello")[0] == "slow"
    # One slow answer (an uncached prefill, say) jumps the peak EWMA, barely the typical time.
    fast.on_success(0.6)
    assert fast.latency.value == pytest.approx(0.6)
    assert fast.typical_ttfb.value == pytest.approx(0.125)
    assert pick(registry, model, "hello")[0] == "slow"  # 8 against (3 + 1) x 1.6 - 1 = 5.4
    for _ in range(100):  # a replica measured very slow: counted as 4x, not 50x
        slow.on_success(10.0)
    fast.outstanding, slow.outstanding = 20, 3
    chosen, decision = pick(registry, model, "hello")
    assert chosen == "slow"  # (3 + 1) x 4 - 1 = 15 against 20
    assert scores(decision)["fast"]["queue"] == pytest.approx(1 - 5 / 16)
    assert scores(decision)["slow"]["slowdown"] == 4


def test_ties_first_or_drawn_by_the_injected_rng(clock):
    model = scored_model(clock, weights={"prefix": 0, "queue": 0, "kv": 0, "latency": 1})
    registry = Registry([model], random.Random(0))
    assert {pick(registry, model, f"p{i}")[0] for i in range(20)} == {"a"}
    drawn = scored_model(clock, tie_break="random",
                         weights={"prefix": 0, "queue": 0, "kv": 0, "latency": 1})  # fmt: skip
    again = scored_model(clock, tie_break="random",
                         weights={"prefix": 0, "queue": 0, "kv": 0, "latency": 1})  # fmt: skip
    draws = [pick(Registry([m], random.Random(7)), m, "p")[0] for m in (drawn, again)]
    assert draws[0] == draws[1]  # the same seed, the same draw
    registry = Registry([drawn], random.Random(1))
    assert {pick(registry, drawn, f"p{i}")[0] for i in range(30)} == {"a", "b", "c"}


def test_decisions_are_kept_for_stats_and_explained_in_a_header(clock):
    model = scored_model(clock, names=("a", "b c"), explain_last=2, debug_header=True)
    registry = Registry([model], random.Random(0))
    decisions: list[RouteDecision] = []
    for i in range(3):
        registry.pick(model, RequestTraits(prompt_text=SYSTEM + str(i)), set(), decisions)
    snapshot = model.scoring.snapshot()
    assert len(snapshot["recent"]) == 2  # the last explain_last
    assert snapshot["prefix_index_blocks"] == {"a": 5, "b c": 0}
    assert snapshot["recent"][-1]["candidates"][0]["prefix"] == 1.0
    header = model.route_headers("a", decisions)[ROUTE_HEADER]
    assert header.startswith("chosen=a; a=total:")
    assert "; b%20c=total:" in header and "queue_length:0(titan)" in header
    header.encode("ascii")
    assert model.route_headers("b c", decisions) == {}  # never chosen: nothing to explain
    quiet = scored_model(clock)
    assert quiet.route_headers("a", decisions) == {}  # debug_header off


def test_capacity_per_deployment_and_other_policies_untouched(clock):
    states = [deployment("a", clock, prefix_cache_blocks=3), deployment("b", clock)]
    routing = RoutingConfig.model_validate(
        {"policy": "scored", "scored": {"prefix": {"capacity_blocks": 50}}}
    )
    model = RoutedModel("m", states, routing)
    assert model.scoring.index.capacities == {"a": 3, "b": 50}
    plain = RoutedModel("p", [deployment("a", clock)], RoutingConfig())
    assert plain.scoring is None
