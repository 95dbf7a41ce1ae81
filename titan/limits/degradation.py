"""Graceful degradation of one model under sustained overload, undone with hysteresis.

The controller watches two signals over a sliding window: how long requests queued, and their time
to first token. While either p95 stays over its SLO for ``sustain_s``, one more step of the ladder
applies (a smaller model, a max_tokens cap, cache-only answers); while both stay under
``recover_ratio`` × their SLO for ``sustain_s``, the newest step is undone. Between the two
thresholds nothing changes, so the level does not flap around one value.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from titan.config.admission import DegradationConfig, DegradationStep, Priority

# Samples kept per signal: the window is also bounded in time; this bounds memory under load.
MAX_SAMPLES = 4096


class _Window:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def add(self, at: float, value: float) -> None:
        self.samples.append((at, value))

    def p95(self, now: float) -> float | None:
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        if not self.samples:
            return None
        values = sorted(value for _, value in self.samples)
        return values[max(1, math.ceil(0.95 * len(values))) - 1]  # nearest rank


@dataclass(frozen=True)
class Degradation:
    """What applies to one request: the steps (in ladder order) whose classes include it."""

    steps: tuple[DegradationStep, ...] = ()

    @property
    def actions(self) -> list[str]:
        return [step.action for step in self.steps]

    def step(self, action: str) -> DegradationStep | None:
        return next((s for s in self.steps if s.action == action), None)


class DegradationController:
    def __init__(self, config: DegradationConfig, *, now: Callable[[], float] = time.monotonic):
        self.config = config
        self._now = now
        self._queue_wait = _Window(config.window_s)
        self._ttft = _Window(config.window_s)
        self.level = 0  # how many steps of the ladder apply
        self._over_since: float | None = None
        self._under_since: float | None = None
        self.num_changes = 0

    def observe_queue_wait(self, seconds: float) -> None:
        self._queue_wait.add(self._now(), seconds)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.add(self._now(), seconds)

    def _state(self, now: float) -> str:
        """ "over" an SLO, "under" both recovery thresholds, or "between"."""
        config = self.config
        signals = [
            (self._queue_wait.p95(now), config.queue_wait_p95_s),
            (self._ttft.p95(now), config.ttft_p95_s),
        ]
        watched = [(p95, slo) for p95, slo in signals if slo is not None]
        if any(p95 is not None and p95 > slo for p95, slo in watched):
            return "over"
        if all(p95 is None or p95 < slo * config.recover_ratio for p95, slo in watched):
            return "under"
        return "between"

    def update(self) -> int:
        """Move along the ladder as the signals say; returns the level now."""
        now = self._now()
        state = self._state(now)
        sustain = self.config.sustain_s
        if state == "over":
            self._under_since = None
            if self._over_since is None:
                self._over_since = now
            elif now - self._over_since >= sustain and self.level < len(self.config.steps):
                self.level += 1
                self.num_changes += 1
                self._over_since = now  # the next step needs another sustain_s of overload
        elif state == "under":
            self._over_since = None
            if self._under_since is None:
                self._under_since = now
            elif now - self._under_since >= sustain and self.level > 0:
                self.level -= 1
                self.num_changes += 1
                self._under_since = now
        else:
            self._over_since = self._under_since = None
        return self.level

    def for_request(self, priority: Priority) -> Degradation:
        self.update()
        active = self.config.steps[: self.level]
        return Degradation(tuple(step for step in active if priority in step.priorities))

    def snapshot(self) -> dict[str, object]:
        now = self._now()
        return {
            "level": self.level,
            "actions": [step.action for step in self.config.steps[: self.level]],
            "queue_wait_p95_s": self._queue_wait.p95(now),
            "ttft_p95_s": self._ttft.p95(now),
        }
