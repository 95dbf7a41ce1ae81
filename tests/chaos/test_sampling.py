"""Sampling Titan's /metrics and /stats and the backends' /stats (fake HTTP), and how the load is
split over replicas, models and stages."""

from __future__ import annotations

import httpx
import orjson

from tests.chaos.factories import scenario_data
from titan.chaos.load_driver import shares
from titan.chaos.sampling import Sampler, breaker_openings, parse_metrics
from titan.chaos.scenario_files import scenario_from_mapping
from titan.loadgen import ClosedLoop, OpenLoop

METRICS = """\
# HELP titan_circuit_state A deployment's circuit breaker: 0 closed, 1 half-open, 2 open.
# TYPE titan_circuit_state gauge
titan_circuit_state{deployment="a",model="chat"} 0.0
titan_circuit_state{deployment="b",model="chat"} 2.0
# TYPE titan_retries_total counter
titan_retries_total{model="chat"} 3.0
titan_retries_total{model="other"} 1.0
# TYPE titan_hedges_total counter
titan_hedges_total{model="chat"} 2.0
# TYPE titan_fallbacks_total counter
titan_fallbacks_total{model="chat"} 0.0
"""
STATS = {"models": {"chat": {"deployments": {"a": {"breaker_openings": 0},
                                             "b": {"breaker_openings": 4}}}}}  # fmt: skip


def test_parse_metrics_and_stats():
    states, counters = parse_metrics(METRICS)
    assert states == {"chat/a": 0, "chat/b": 2}
    assert counters == {"retries": 4.0, "hedges": 2.0, "fallbacks": 0.0}
    assert breaker_openings(STATS) == {"chat/a": 0, "chat/b": 4}
    assert breaker_openings(None) == {}


async def test_a_sample_of_each_process_down_ones_included():
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dead":
            raise httpx.ConnectError("refused")
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if request.url.host == "titan":
            return httpx.Response(200, content=orjson.dumps(STATS))
        return httpx.Response(200, json={"requests": 9, "active": 5, "queued": 2})

    replicas = {"titan-1": "http://titan", "titan-2": "http://dead"}
    sampler = Sampler(replicas, {"b": "http://sim", "c": "http://dead"}, lambda: 1.5, 0.5)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        await sampler.sample_once(client)
    up, down = sampler.titan
    assert (up.at_s, up.is_up, up.breaker_states["chat/b"], up.breaker_openings["chat/b"]) == (
        1.5, True, 2, 4)  # fmt: skip
    assert up.counters["retries"] == 4 and down.is_up is False
    b, c = sampler.backends
    assert (b.num_requests, b.num_busy, b.num_queued) == (9, 3, 2) and c.is_up is False


def test_the_load_is_split_over_replicas_models_and_stages():
    data = scenario_data(
        titan={"replicas": 2, "config": scenario_data()["titan"]["config"]},
        load={"model": ["chat", "chat"], "rate": 8,
              "stages": [{"duration_s": 4}, {"duration_s": 6, "concurrency": 6}]},
    )  # fmt: skip
    scenario = scenario_from_mapping(data, "s.yaml")
    planned = shares(scenario.load, scenario.replica_names(), scenario.duration_s)
    first = [s for s in planned if s.start_s == 0]
    second = [s for s in planned if s.start_s == 4]
    assert len(first) == 4 and all(s.arrivals.rate == 2 and s.duration_s == 4 for s in first)
    assert all(isinstance(s.arrivals, OpenLoop) for s in first)
    assert len({s.arrivals.seed for s in first}) == 4  # each stream its own arrivals
    assert [s.arrivals for s in second] == [ClosedLoop(2), ClosedLoop(2), ClosedLoop(1),
                                            ClosedLoop(1)]  # fmt: skip
    assert {s.replica for s in second} == {"titan-1", "titan-2"}
    warmup = shares(scenario.load, scenario.replica_names(), 2.0, warmup=True)
    assert len(warmup) == 4 and all(s.duration_s == 2 and s.arrivals.rate == 2 for s in warmup)
