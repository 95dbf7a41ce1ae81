"""Traffic: arrivals (Poisson, or gamma for burstier), prompt and output length distributions,
the SLOs; and the seeded request trace the simulator (and the planner's benchmark) replays."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LENGTH_KINDS = ("fixed", "uniform", "normal", "lognormal", "exponential")


@dataclass(frozen=True)
class LengthDistribution:
    """Token counts, at least 1 and at most ``maximum``. ``a``, ``b`` by kind: fixed N;
    uniform LOW,HIGH (inclusive); normal MEAN,STD; lognormal MEDIAN,SIGMA (of the log);
    exponential MEAN."""

    kind: str
    a: float
    b: float = 0.0
    maximum: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(
                f"unknown distribution {self.kind!r}: one of {', '.join(LENGTH_KINDS)}"
            )
        if self.a < 1 or (self.kind == "uniform" and self.b < self.a):
            raise ValueError(f"{self}: lengths must be >= 1 (and uniform needs LOW <= HIGH)")
        if self.kind in ("normal", "lognormal") and self.b < 0:
            raise ValueError(f"{self}: the spread must be >= 0")

    @classmethod
    def parse(cls, text: str) -> LengthDistribution:
        """``512``, ``fixed:512``, ``uniform:100,1000``, ``normal:512,128``,
        ``lognormal:512,0.5`` or ``exponential:256``. Raises ValueError."""
        kind, _, values = text.strip().partition(":")
        if not values:
            kind, values = "fixed", kind
        try:
            numbers = [float(value) for value in values.split(",")]
        except ValueError:
            raise ValueError(f"bad length distribution {text!r}: numbers expected") from None
        expected = 2 if kind in ("uniform", "normal", "lognormal") else 1
        if len(numbers) != expected:
            raise ValueError(f"bad length distribution {text!r}: {kind} takes {expected} numbers")
        return cls(kind, *numbers)

    def __str__(self) -> str:
        if self.kind in ("fixed", "exponential"):
            return f"{self.kind}:{self.a:g}"
        return f"{self.kind}:{self.a:g},{self.b:g}"

    def with_maximum(self, maximum: int) -> LengthDistribution:
        return LengthDistribution(self.kind, self.a, self.b, maximum)

    @property
    def mean(self) -> float:
        """The mean before rounding and clipping."""
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            return self.a * math.exp(self.b**2 / 2)
        return self.a

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(count, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), size=count, endpoint=True)
        elif self.kind == "normal":
            values = rng.normal(self.a, self.b, size=count)
        elif self.kind == "lognormal":
            values = rng.lognormal(math.log(self.a), self.b, size=count)
        else:
            values = rng.exponential(self.a, size=count)
        high = self.maximum if self.maximum is not None else np.iinfo(np.int64).max
        return np.clip(np.rint(values), 1, high).astype(np.int64)


@dataclass(frozen=True)
class Arrivals:
    """``rate`` requests/s; inter-arrival gaps exponential (Poisson, cv 1), gamma with the given
    coefficient of variation (cv > 1: bursts), or evenly spaced (cv 0)."""

    rate: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"the request rate must be > 0, got {self.rate}")
        if self.cv < 0:
            raise ValueError(f"the arrivals' cv must be >= 0, got {self.cv}")

    def times(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Arrival times in seconds, the first gap included (the trace does not start busy)."""
        if self.cv == 0:
            gaps = np.full(count, 1.0 / self.rate)
        elif self.cv == 1:
            gaps = rng.exponential(1.0 / self.rate, size=count)
        else:
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, 1.0 / (shape * self.rate), size=count)
        return np.cumsum(gaps)


@dataclass(frozen=True)
class Slo:
    """Percentile targets: time to first token and time per output token, in milliseconds."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 99.0


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass(frozen=True)
class Traffic:
    arrivals: Arrivals
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    # Leading prompt tokens every request shares (a system prompt): served from the prefix cache
    # in whole blocks once the first request has computed them.
    shared_prefix_tokens: int = 0

    def at_rate(self, rate: float) -> Traffic:
        return Traffic(
            Arrivals(rate, self.arrivals.cv),
            self.prompt_tokens,
            self.output_tokens,
            self.shared_prefix_tokens,
        )

    def trace(self, num_requests: int, seed: int) -> list[TraceRequest]:
        """Request k's arrival and lengths depend only on the seed and k's rank among the draws:
        arrivals first, then prompts, then outputs, each a block of ``num_requests`` draws."""
        rng = np.random.default_rng(seed)
        times = self.arrivals.times(rng, num_requests)
        prompts = self.prompt_tokens.sample(rng, num_requests)
        outputs = self.output_tokens.sample(rng, num_requests)
        if self.shared_prefix_tokens:  # the shared prefix is part of every prompt
            prompts = np.maximum(prompts, self.shared_prefix_tokens + 1)
        return [
            TraceRequest(float(t), int(p), int(o))
            for t, p, o in zip(times, prompts, outputs, strict=True)
        ]
