"""A deployment's latest reported load: staleness, and the prefix hit rate from counter deltas."""

from __future__ import annotations

import pytest

from tests.clock import ManualClock
from titan.router.load_state import ReplicaLoadTracker
from titan.router.replica_load import Exposition


def tracker(clock: ManualClock) -> ReplicaLoadTracker:
    return ReplicaLoadTracker("http://vllm:8000/metrics", stale_after_s=2.0, now=clock)


def counters(hits: float, queries: float) -> Exposition:
    return Exposition(waiting=1, running=2, prefix_hits=hits, prefix_queries=queries)


def test_a_reading_ages_out(clock: ManualClock):
    state = tracker(clock)
    assert state.current() is None  # never read
    state.record(Exposition(waiting=3, running=5, kv_usage=0.5))
    load = state.current()
    assert load is not None
    assert (load.waiting, load.running, load.kv_usage, load.scraped_at) == (3, 5, 0.5, clock.now)
    clock.advance(2.0)
    assert state.current() is load  # exactly stale_after_s old: still believed
    clock.advance(0.001)
    assert state.current() is None
    snapshot = state.snapshot()
    assert snapshot["current"] is None and snapshot["age_s"] == pytest.approx(2.001)
    state.record(Exposition(waiting=0))
    assert state.current() is not None  # a fresh scrape brings it back


def test_failures_are_counted_and_the_first_of_an_outage_is_reported(clock: ManualClock):
    state = tracker(clock)
    assert state.record_failure("ClientConnectorError") is True
    assert state.record_failure("ClientConnectorError") is False
    state.record(Exposition())
    assert state.record_failure("TimeoutError") is True  # a new outage
    snapshot = state.snapshot()
    assert (snapshot["scrapes"], snapshot["failures"]) == (1, 3)
    assert snapshot["last_error"] == "TimeoutError"


def test_prefix_hit_rate_from_counter_deltas(clock: ManualClock):
    state = tracker(clock)
    # First scrape: the server's lifetime so far.
    assert state.record(counters(250, 1000)).prefix_hit_rate == 0.25
    # Since then: 900 of 1000 new prompt tokens hit.
    assert state.record(counters(1150, 2000)).prefix_hit_rate == 0.9
    # No prompt since: the last rate stands.
    assert state.record(counters(1150, 2000)).prefix_hit_rate == 0.9
    # The server restarted (counters reset): its new lifetime.
    assert state.record(counters(10, 100)).prefix_hit_rate == 0.1
    # No queries at all yet.
    assert tracker(clock).record(counters(0, 0)).prefix_hit_rate is None


def test_a_hit_rate_gauge_is_used_without_counters_and_ratios_stay_in_range(clock: ManualClock):
    state = tracker(clock)
    load = state.record(Exposition(prefix_hit_rate=0.6, kv_usage=1.02))
    assert (load.prefix_hit_rate, load.kv_usage) == (0.6, 1.0)
    assert state.record(Exposition()).prefix_hit_rate is None  # not reported: unknown
