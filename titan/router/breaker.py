"""A circuit breaker per deployment: closed → open → half-open → closed.

It opens on consecutive errors, on the error rate over a window, and on latency (the window's p95
time to first byte over a threshold): a replica that answers slowly is as bad as one that fails.
While open, no traffic; after ``open_s`` a few trial requests (half-open) decide: a success closes
it, a failure opens it again. Active probes feed it like requests do.
"""

from __future__ import annotations

import enum

from titan.config import BreakerConfig
from titan.router.windows import Clock, OutcomeWindow


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, now: Clock):
        self.config = config
        self._now = now
        self.window = OutcomeWindow(config.window_s, now, slow_s=config.ttfb_p95_s)
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._consecutive_errors = 0
        self._trials_in_flight = 0
        self.num_openings = 0
        self.last_reason: str | None = None

    @property
    def state(self) -> BreakerState:
        if self._state == BreakerState.OPEN and self._now() >= self._opened_at + self.config.open_s:
            self._state = BreakerState.HALF_OPEN
            self._trials_in_flight = 0
        return self._state

    def allows(self) -> bool:
        """Whether a new request may go to this deployment now."""
        state = self.state
        if state == BreakerState.CLOSED:
            return True
        if state == BreakerState.HALF_OPEN:
            return self._trials_in_flight < self.config.half_open_requests
        return False

    def on_start(self) -> None:
        if self.state == BreakerState.HALF_OPEN:
            self._trials_in_flight += 1

    def record_success(self, ttfb_s: float | None = None) -> None:
        self._consecutive_errors = 0
        if self.state == BreakerState.HALF_OPEN:
            self._close()
            return
        self.window.record(True, ttfb_s)
        threshold = self.config.ttfb_p95_s
        if (
            threshold is not None
            and self.window.num_timed >= self.config.min_requests
            and self.window.slow_share > 0.05  # more than 5% slower: the p95 is above it
        ):
            self._open(
                f"p95 time to first byte over {threshold}s "
                f"({self.window.slow_share:.0%} of first bytes slower)"
            )

    def record_failure(self) -> None:
        state = self.state
        if state == BreakerState.OPEN:
            # Requests sent before it opened, failing late: already acted on. Re-opening would
            # stretch the open period and count one outage as several openings.
            return
        self._consecutive_errors += 1
        if state == BreakerState.HALF_OPEN:
            self._open("a half-open trial failed")
            return
        self.window.record(False)
        if self._consecutive_errors >= self.config.consecutive_errors:
            self._open(f"{self._consecutive_errors} consecutive errors")
        elif (
            self.window.num_outcomes >= self.config.min_requests
            and self.window.error_rate >= self.config.error_rate
        ):
            self._open(f"error rate {self.window.error_rate:.0%} over {self.config.window_s}s")

    def record_probe(self, is_healthy: bool) -> None:
        """An active probe: a failure counts as an error; a success closes a breaker whose open
        period is over (the deployment is back, no need to risk a client request on it)."""
        if not is_healthy:
            self.record_failure()
        elif self.state == BreakerState.HALF_OPEN:
            self._close()

    def _open(self, reason: str) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._now()
        self._trials_in_flight = 0
        self.num_openings += 1
        self.last_reason = reason
        self.window.clear()

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._consecutive_errors = 0
        self._trials_in_flight = 0
        self.window.clear()
