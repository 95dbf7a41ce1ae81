"""What the router knows about one deployment: load, latency, health."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from titan.config import BreakerConfig, Timeouts
from titan.router.breaker import BreakerState, CircuitBreaker
from titan.router.load_state import ReplicaLoadTracker
from titan.router.windows import Clock, Ewma, PeakEwma


@dataclass
class DeploymentState:
    name: str
    backend: Any  # the Backend serving it (opaque here: the router never calls it)
    weight: float
    max_concurrency: int | None
    timeouts: Timeouts
    breaker: CircuitBreaker
    latency: PeakEwma  # time to first byte, seconds
    # Time to first byte averaged over ~20 answers: how fast the replica is, not its last spike.
    typical_ttfb: Ewma = field(default_factory=Ewma)
    outstanding: int = 0
    pool: str = "shared"  # which traffic it takes (config: deployments[].pool)
    # Smooth weighted round robin's running weight.
    round_robin_weight: float = 0.0
    num_attempts: int = 0
    num_successes: int = 0
    num_failures: int = 0
    # What the model server reports about its own load (openai deployments with a metrics
    # block; the pipeline's scraper feeds it).
    load: ReplicaLoadTracker | None = None
    # The scoring router's prefix index holds this many of its blocks (None: the model's default).
    prefix_cache_blocks: int | None = None

    @classmethod
    def create(
        cls,
        name: str,
        backend: Any,
        *,
        weight: float,
        max_concurrency: int | None,
        timeouts: Timeouts,
        breaker: BreakerConfig,
        now: Clock,
        pool: str = "shared",
        load: ReplicaLoadTracker | None = None,
        prefix_cache_blocks: int | None = None,
    ) -> DeploymentState:
        return cls(
            name,
            backend,
            weight,
            max_concurrency,
            timeouts,
            CircuitBreaker(breaker, now),
            latency=PeakEwma(now),
            pool=pool,
            load=load,
            prefix_cache_blocks=prefix_cache_blocks,
        )

    def __post_init__(self) -> None:
        if self.load is not None:
            self.load.own_in_flight = lambda: self.outstanding

    @property
    def is_available(self) -> bool:
        """Healthy enough (breaker) and below its concurrency cap."""
        if self.max_concurrency is not None and self.outstanding >= self.max_concurrency:
            return False
        return self.breaker.allows()

    def on_start(self) -> None:
        self.outstanding += 1
        self.num_attempts += 1
        self.breaker.on_start()

    def on_success(self, ttfb_s: float) -> None:
        """The attempt produced its first byte (or its whole answer) after ``ttfb_s``."""
        self.num_successes += 1
        self.latency.update(ttfb_s)
        self.typical_ttfb.update(ttfb_s)
        self.breaker.record_success(ttfb_s)

    def on_failure(self) -> None:
        self.num_failures += 1
        self.breaker.record_failure()

    def on_end(self) -> None:
        """The attempt let go of the deployment (answer sent, stream closed, error, cancelled)."""
        self.outstanding -= 1

    def snapshot(self) -> dict[str, Any]:
        breaker = self.breaker
        return {
            "deployment": self.name,
            "state": breaker.state.value,
            "last_breaker_reason": breaker.last_reason,
            "breaker_openings": breaker.num_openings,
            "outstanding": self.outstanding,
            "ewma_ttfb_s": self.latency.value,
            "attempts": self.num_attempts,
            "successes": self.num_successes,
            "failures": self.num_failures,
            "weight": self.weight,
            "load": None if self.load is None else self.load.snapshot(),
        }

    @property
    def is_ejected(self) -> bool:
        return self.breaker.state == BreakerState.OPEN
