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


class Ewma:
    """Exponentially weighted moving average; None until the first sample."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self.value: float | None = None

    def update(self, sample: float) -> None:
        self.value = (
            sample if self.value is None else self.value + self.alpha * (sample - self.value)
        )


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
    """Outcomes of the last ``window_s`` seconds: error rate and time-to-first-byte percentiles."""

    def __init__(self, window_s: float, now: Clock, max_samples: int = 4096):
        self.window_s = window_s
        self._now = now
        self._outcomes: deque[Outcome] = deque(maxlen=max_samples)

    def record(self, is_success: bool, ttfb_s: float | None = None) -> None:
        self._outcomes.append(Outcome(self._now(), is_success, ttfb_s))

    def clear(self) -> None:
        self._outcomes.clear()

    def _recent(self) -> deque[Outcome]:
        horizon = self._now() - self.window_s
        while self._outcomes and self._outcomes[0].at < horizon:
            self._outcomes.popleft()
        return self._outcomes

    @property
    def num_outcomes(self) -> int:
        return len(self._recent())

    @property
    def error_rate(self) -> float:
        recent = self._recent()
        if not recent:
            return 0.0
        return sum(not o.is_success for o in recent) / len(recent)

    def ttfb_percentile(self, q: float, min_samples: int = 1) -> float | None:
        values = sorted(o.ttfb_s for o in self._recent() if o.ttfb_s is not None)
        if len(values) < min_samples:
            return None
        return percentile(values, q)


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
