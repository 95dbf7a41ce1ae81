"""What a simulated backend does with each request, decided up front as a plan (pure data).

The decisions depend only on the profile, the seed, the order of the requests and the clock: the
same profile and the same arrival times give the same plans, so tests run them without sleeping.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from titan.config.simulation import Outage, SimulationProfile

# Words of the simulated completions: one word is one output token.
WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
    "silver", "clocks", "tick", "softly", "in", "an", "empty", "hall", "and", "rain",
    "falls", "on", "green", "hills", "beyond", "old", "stone", "bridges", "near", "river",
    "light",
)  # fmt: skip

# Statuses that ask the client to come back later: they carry Retry-After.
RETRY_AFTER_STATUSES = frozenset({429, 503})


class Stopwatch:
    """Monotonic seconds since it was (re)started: the default clock of a simulation."""

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def restart(self) -> None:
        self._origin = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self._origin


class FailureKind(StrEnum):
    RESET = "reset"  # the connection drops before any byte of the answer
    ERROR = "error"  # an HTTP error status with an OpenAI error body


class FailureCause(StrEnum):
    OUTAGE = "outage"
    ERROR_BURST = "error_burst"
    RANDOM_RESET = "random_reset"


@dataclass(frozen=True, slots=True)
class Failure:
    """A request refused before its first byte."""

    kind: FailureKind
    cause: FailureCause
    status: int | None = None  # ERROR only
    retry_after_s: float | None = None  # for 429 and 503

    @property
    def message(self) -> str:
        if self.kind is FailureKind.RESET:
            return f"simulated connection reset ({self.cause})"
        return f"simulated upstream error {self.status} ({self.cause})"


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One request's fate. Times are seconds after the request arrived.

    Token ``i`` is emitted at ``ttft_s + i * inter_token_s``, plus ``stall_s`` for every token
    after the first; the answer ends (finish reason, usage, [DONE]) at ``finish_s``, so that a
    stall shows even with a single token. A non-streaming answer is sent whole at ``finish_s``.
    """

    index: int  # the request's position in the order of arrival, from 0
    failure: Failure | None
    num_output_tokens: int
    finish_reason: str  # "length" when max_tokens cut the answer, else "stop"
    ttft_s: float
    inter_token_s: float
    stall_s: float  # 0: no stall
    is_spike: bool
    # A connection-resetting outage begins before the answer ends: the connection drops then.
    cut_s: float | None
    first_word: int  # where the completion text starts in WORDS

    def token_s(self, token_index: int) -> float:
        stall = self.stall_s if token_index > 0 else 0.0
        return self.ttft_s + token_index * self.inter_token_s + stall

    @property
    def finish_s(self) -> float:
        return self.ttft_s + (self.num_output_tokens - 1) * self.inter_token_s + self.stall_s

    @property
    def is_stall(self) -> bool:
        return self.stall_s > 0

    def token_text(self, token_index: int) -> str:
        word = WORDS[(self.first_word + token_index) % len(WORDS)]
        return word if token_index == 0 else " " + word

    @property
    def text(self) -> str:
        return "".join(self.token_text(i) for i in range(self.num_output_tokens))


def num_output_tokens(profile: SimulationProfile, max_tokens: int | None) -> int:
    """The profile's answer length, unless the request asks for fewer tokens."""
    return min(max_tokens or profile.output_tokens, profile.output_tokens)


def retry_after_header(seconds: float) -> str:
    """HTTP's Retry-After takes whole seconds: rounded up, so that a client never comes early."""
    return str(math.ceil(seconds))


class Simulation:
    """Plans the requests of one simulated backend, in their order of arrival.

    Every plan draws the same number of random values whatever happens to it, so request k's
    draws depend only on the seed and k, not on which earlier requests failed.
    """

    def __init__(self, profile: SimulationProfile, now: Callable[[], float] | None = None):
        self.profile = profile
        # Seconds since the backend started: outage windows are relative to it.
        self.now: Callable[[], float] = now if now is not None else Stopwatch()
        self._random = random.Random(profile.seed)
        self._num_planned = 0
        self._burst_ends_s = -math.inf

    def outage_at(self, at_s: float) -> Outage | None:
        for outage in self.profile.outages:
            if outage.start_s <= at_s < outage.start_s + outage.duration_s:
                return outage
        return None

    def unavailability(self) -> Failure | None:
        """The outage failure that a health check sees now (health checks draw nothing)."""
        outage = self.outage_at(self.now())
        return self._outage_failure(outage) if outage is not None else None

    def plan(self, max_tokens: int | None = None) -> RequestPlan:
        profile = self.profile
        arrival_s = self.now()
        index = self._num_planned
        self._num_planned += 1
        draw = self._random.random
        reset_draw, error_draw, spike_draw, stall_draw = draw(), draw(), draw(), draw()
        first_word = self._random.randrange(len(WORDS))

        failure = self._failure(arrival_s, reset_draw, error_draw)
        is_spike = spike_draw < profile.spike_probability
        multiplier = profile.spike_multiplier if is_spike else 1.0
        num_tokens = num_output_tokens(profile, max_tokens)
        is_cut_short = max_tokens is not None and max_tokens < profile.output_tokens
        plan = RequestPlan(
            index=index,
            failure=failure,
            num_output_tokens=num_tokens,
            finish_reason="length" if is_cut_short else "stop",
            ttft_s=profile.ttft_s * multiplier,
            inter_token_s=profile.inter_token_s * multiplier,
            stall_s=profile.stall_s if stall_draw < profile.stall_probability else 0.0,
            is_spike=is_spike,
            cut_s=None,
            first_word=first_word,
        )
        if failure is not None:
            return plan
        cut_s = self._cut_s(arrival_s, plan.finish_s)
        return plan if cut_s is None else replace(plan, cut_s=cut_s)

    def _failure(self, arrival_s: float, reset_draw: float, error_draw: float) -> Failure | None:
        profile = self.profile
        outage = self.outage_at(arrival_s)
        if outage is not None:
            return self._outage_failure(outage)
        if arrival_s < self._burst_ends_s:
            return self._burst_failure()
        if error_draw < profile.error_probability:
            self._burst_ends_s = arrival_s + profile.error_burst_s
            return self._burst_failure()
        if reset_draw < profile.reset_probability:
            return Failure(FailureKind.RESET, FailureCause.RANDOM_RESET)
        return None

    def _burst_failure(self) -> Failure:
        status = self.profile.error_status
        return Failure(
            FailureKind.ERROR, FailureCause.ERROR_BURST, status, self._retry_after_s(status)
        )

    def _outage_failure(self, outage: Outage) -> Failure:
        if outage.status is None:
            return Failure(FailureKind.RESET, FailureCause.OUTAGE)
        status = outage.status
        return Failure(FailureKind.ERROR, FailureCause.OUTAGE, status, self._retry_after_s(status))

    def _retry_after_s(self, status: int) -> float | None:
        return self.profile.retry_after_s if status in RETRY_AFTER_STATUSES else None

    def _cut_s(self, arrival_s: float, finish_s: float) -> float | None:
        """When a connection-resetting outage starts while the answer is still under way.

        An outage with a status only refuses new requests; one without drops live connections
        too, as a crashed server would.
        """
        starts = [
            outage.start_s - arrival_s
            for outage in self.profile.outages
            if outage.status is None and arrival_s < outage.start_s < arrival_s + finish_s
        ]
        return min(starts) if starts else None
