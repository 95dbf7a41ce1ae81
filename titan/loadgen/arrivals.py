"""When requests are sent: a closed loop (a fixed number of clients, each sending its next request
when the previous answer ends) or an open loop (requests at precomputed times, whatever the
server does)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")

    @property
    def load(self) -> float:
        """What a sweep varies: the number of clients."""
        return float(self.concurrency)

    def describe(self) -> str:
        return f"concurrency {self.concurrency}"


@dataclass(frozen=True)
class OpenLoop:
    """``rate`` requests/s on average (``math.inf``: all at once). Gaps between arrivals follow a
    gamma distribution of shape ``burstiness`` and mean 1/rate, as in vLLM's ``bench serve``:
    1.0 is a Poisson process, below 1 burstier (coefficient of variation 1/sqrt(burstiness)),
    above 1 more regular."""

    rate: float
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"the rate must be above 0, not {self.rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, not {self.burstiness}")

    @property
    def load(self) -> float:
        """What a sweep varies: the offered rate."""
        return self.rate

    def describe(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        shape = "" if self.burstiness == 1.0 else f", burstiness {self.burstiness:g}"
        return f"rate {rate}/s{shape}"

    def offsets(self) -> Iterator[float]:
        """Seconds from the start at which each request is due, increasing, endless; the same
        sequence for the same seed."""
        if math.isinf(self.rate):
            while True:
                yield 0.0
        rng = random.Random(self.seed)
        # gamma(shape k, scale θ) has mean kθ: θ = 1 / (rate · k) makes the mean gap 1/rate.
        shape, scale = self.burstiness, 1.0 / (self.rate * self.burstiness)
        due = 0.0
        while True:
            due += rng.gammavariate(shape, scale)
            yield due


Arrivals = ClosedLoop | OpenLoop
