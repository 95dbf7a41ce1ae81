"""Retry and hedge decisions: pure functions of the error, the attempt count and the clock."""

from __future__ import annotations

import random

from titan.config import HedgeConfig, RetryConfig
from titan.errors import (
    TitanError,
    UpstreamConnectionError,
    UpstreamError,
    UpstreamTimeoutError,
)
from titan.router.windows import LatencyWindow


def is_retryable(error: BaseException, config: RetryConfig) -> bool:
    """Connection errors, timeouts, and the configured upstream statuses (429, 5xx). A client's
    own mistake (400, 404, 422) would fail the same way anywhere: never retried."""
    if isinstance(error, UpstreamConnectionError | UpstreamTimeoutError):
        return True
    if isinstance(error, UpstreamError):
        return error.is_retryable and error.status_code in config.retry_on_status
    return False


def retry_after(error: BaseException) -> float | None:
    return getattr(error, "retry_after", None) if isinstance(error, TitanError) else None


def backoff_s(num_failed: int, config: RetryConfig, rng: random.Random) -> float:
    """Exponential backoff with full jitter (AWS's rule): uniform in [0, min(max, base * 2^n)),
    so that clients retrying together spread out instead of arriving together again."""
    ceiling = min(config.backoff_max_s, config.backoff_base_s * 2 ** (num_failed - 1))
    return rng.uniform(0.0, ceiling)


def retry_delay_s(
    error: BaseException, num_failed: int, config: RetryConfig, rng: random.Random
) -> float:
    """The pause before another attempt on a deployment that already failed (a retry on a fresh
    deployment does not wait). The upstream's Retry-After stretches it, capped by backoff_max."""
    delay = backoff_s(num_failed, config, rng)
    hint = retry_after(error)
    if hint is not None:
        delay = max(delay, min(hint, config.backoff_max_s))
    return delay


class HedgeBudget:
    """Hedges may be at most ``max_fraction`` of attempts: each attempt earns that fraction of a
    token, a hedge spends a whole one, so a slow backend cannot double the traffic it gets."""

    def __init__(self, config: HedgeConfig, burst: float = 5.0):
        self.config = config
        self._tokens = 0.0
        self._burst = burst
        self.num_hedges = 0

    def on_attempt(self) -> None:
        self._tokens = min(self._burst, self._tokens + self.config.max_fraction)

    def try_spend(self) -> bool:
        if not self.config.enabled or self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self.num_hedges += 1
        return True


def hedge_delay_s(ttfb: LatencyWindow, config: HedgeConfig, min_samples: int = 20) -> float | None:
    """When a second attempt starts: the live ``percentile`` of time to first byte; None while
    there are too few samples to know what "slow" means."""
    if not config.enabled or len(ttfb) < min_samples:
        return None
    value = ttfb.percentile(config.percentile)
    return None if value is None else max(config.min_delay_s, value)
