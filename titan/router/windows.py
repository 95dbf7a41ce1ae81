"""Live statistics the router decides with: an EWMA, and a time window of outcomes.

Pure Python with an injected clock (``now`` returns monotonic seconds), so every decision built on
them is testable without sleeping.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]


class PeakEwma:
    """A latency estimate that jumps up to a slow sample at once and decays over time (Finagle's
    peak EWMA): one spike makes a replica look slow right away, so load balancing steers around
    a replica with latency spikes instead of averaging them away. It decays on read too, toward
    zero while no sample comes: a replica avoided after a spike looks cheap again within a few
    ``decay_s`` and gets a request that measures it, instead of being starved for good. None
    until the first sample."""

    def __init__(self, now: Clock, decay_s: float = 2.0):
        self._now = now
        self.decay_s = decay_s
        self._value: float | None = None
        self._at = 0.0

    @property
    def value(self) -> float | None:
        if self._value is None:
            return None
        return self._value * math.exp(-(self._now() - self._at) / self.decay_s)

    def update(self, sample: float) -> None:
        now = self._now()
        if self._value is None:
            self._value = sample
        else:
            keep = math.exp(-(now - self._at) / self.decay_s)
            is_peak = sample >= self._value * keep
            self._value = sample if is_peak else self._value * keep + sample * (1.0 - keep)
        self._at = now


class Ewma:
    """A plain exponentially weighted mean per sample: each sample moves it ``alpha`` of the way.
    Unlike ``PeakEwma`` one slow sample barely moves it, so it tells a replica that is slow from
    one that served a slow request. None until the first sample."""

    def __init__(self, alpha: float = 0.05):
        self.alpha = alpha
        self.value: float | None = None

    def update(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)


@dataclass(frozen=True)
class Outcome:
    at: float
    is_success: bool
    ttfb_s: float | None  # time to first byte of a success


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class OutcomeWindow:
    """Outcomes of the last ``window_s`` seconds, with running counts so that every question is
    O(1) per request: the error rate, and the share of successes slower than ``slow_s`` (the p95
    of time to first byte exceeds ``slow_s`` exactly when more than 5% of them are slower)."""

    def __init__(self, window_s: float, now: Clock, slow_s: float | None = None):
        self.window_s = window_s
        self._now = now
        self._slow_s = slow_s
        self._outcomes: deque[Outcome] = deque()
        self._num_failures = 0
        self._num_timed = 0
        self._num_slow = 0

    def _is_slow(self, outcome: Outcome) -> bool:
        return (
            self._slow_s is not None
            and outcome.ttfb_s is not None
            and outcome.ttfb_s > self._slow_s
        )

    def _count(self, outcome: Outcome, sign: int) -> None:
        self._num_failures += sign * (not outcome.is_success)
        self._num_timed += sign * (outcome.ttfb_s is not None)
        self._num_slow += sign * self._is_slow(outcome)

    def record(self, is_success: bool, ttfb_s: float | None = None) -> None:
        outcome = Outcome(self._now(), is_success, ttfb_s)
        self._outcomes.append(outcome)
        self._count(outcome, +1)
        self._prune()

    def clear(self) -> None:
        self._outcomes.clear()
        self._num_failures = self._num_timed = self._num_slow = 0

    def _prune(self) -> None:
        horizon = self._now() - self.window_s
        while self._outcomes and self._outcomes[0].at < horizon:
            self._count(self._outcomes.popleft(), -1)

    @property
    def num_outcomes(self) -> int:
        self._prune()
        return len(self._outcomes)

    @property
    def num_timed(self) -> int:
        self._prune()
        return self._num_timed

    @property
    def error_rate(self) -> float:
        self._prune()
        return self._num_failures / len(self._outcomes) if self._outcomes else 0.0

    @property
    def slow_share(self) -> float:
        """The share of timed successes slower than ``slow_s``."""
        self._prune()
        return self._num_slow / self._num_timed if self._num_timed else 0.0


class LatencyWindow:
    """The last ``size`` latencies (no clock): the hedge delay is a live percentile of these."""

    def __init__(self, size: int = 512):
        self._values: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = None

    def record(self, seconds: float) -> None:
        self._values.append(seconds)
        self._sorted = None

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float | None:
        if not self._values:
            return None
        if self._sorted is None:  # sorted once per change, not once per request
            self._sorted = sorted(self._values)
        return percentile(self._sorted, q)
