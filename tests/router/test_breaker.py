"""The circuit breaker with an injected clock."""

from __future__ import annotations

from tests.clock import ManualClock
from titan.config import BreakerConfig
from titan.router.breaker import BreakerState, CircuitBreaker


def make(**overrides) -> tuple[CircuitBreaker, ManualClock]:
    clock = ManualClock(0.0)
    config = BreakerConfig(**{"consecutive_errors": 3, "open_s": 10.0, **overrides})
    return CircuitBreaker(config, clock), clock


def test_opens_after_consecutive_errors_and_half_opens_after_the_open_period():
    breaker, clock = make()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == BreakerState.CLOSED and breaker.allows()
    breaker.record_failure()
    assert breaker.state == BreakerState.OPEN and not breaker.allows()
    assert "3 consecutive errors" in breaker.last_reason
    clock.now = 9.9
    assert not breaker.allows()
    clock.now = 10.0
    assert breaker.state == BreakerState.HALF_OPEN and breaker.allows()


def test_a_success_resets_the_consecutive_count():
    breaker, _ = make()
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success(0.1)
    assert breaker.state == BreakerState.CLOSED


def test_half_open_admits_a_limited_number_of_trials():
    breaker, clock = make(half_open_requests=2)
    for _ in range(3):
        breaker.record_failure()
    clock.now = 10.0
    assert breaker.allows()
    breaker.on_start()
    assert breaker.allows()
    breaker.on_start()
    assert not breaker.allows()  # two trials in flight, no third


def test_half_open_success_closes_and_failure_reopens():
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 10.0
    breaker.on_start()
    breaker.record_success(0.05)
    assert breaker.state == BreakerState.CLOSED
    for _ in range(3):
        breaker.record_failure()
    clock.now = 20.0
    breaker.on_start()
    breaker.record_failure()
    assert breaker.state == BreakerState.OPEN
    clock.now = 29.0
    assert not breaker.allows()  # a fresh open period started at t=20
    clock.now = 30.0
    assert breaker.allows()


def test_error_rate_over_the_window_trips_it():
    breaker, clock = make(consecutive_errors=100, error_rate=0.5, min_requests=10, window_s=5)
    for i in range(10):
        clock.now = i * 0.1
        if i % 2:
            breaker.record_failure()
        else:
            breaker.record_success(0.1)
    assert breaker.state == BreakerState.OPEN
    assert "error rate" in breaker.last_reason


def test_old_outcomes_leave_the_window():
    breaker, clock = make(consecutive_errors=100, error_rate=0.5, min_requests=4, window_s=5)
    for _ in range(3):
        breaker.record_failure()
        breaker.record_success(0.1)
    clock.now = 100.0  # the failures are long gone
    breaker.record_success(0.1)
    breaker.record_failure()
    assert breaker.state == BreakerState.CLOSED


def test_slow_time_to_first_byte_trips_it():
    breaker, _ = make(ttfb_p95_s=0.5, min_requests=10)
    for _ in range(9):
        breaker.record_success(2.0)
    assert breaker.state == BreakerState.CLOSED  # too few samples to judge
    breaker.record_success(2.0)
    assert breaker.state == BreakerState.OPEN
    assert "p95 time to first byte" in breaker.last_reason


def test_probes_feed_it():
    breaker, clock = make()
    for _ in range(3):
        breaker.record_probe(is_healthy=False)
    assert breaker.state == BreakerState.OPEN
    breaker.record_probe(is_healthy=True)
    assert breaker.state == BreakerState.OPEN  # still within its open period
    clock.now = 10.0
    breaker.record_probe(is_healthy=True)
    assert breaker.state == BreakerState.CLOSED


def test_late_failures_while_open_neither_extend_it_nor_count_as_openings():
    breaker, clock = make()
    for _ in range(3):
        breaker.record_failure()
    clock.now = 5.0
    for _ in range(5):  # requests sent before it opened, failing now
        breaker.record_failure()
    assert breaker.num_openings == 1
    clock.now = 10.0  # the open period still ends 10 s after it opened
    assert breaker.state == BreakerState.HALF_OPEN
