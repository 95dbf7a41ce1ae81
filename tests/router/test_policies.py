"""Load-balancing policies and the retry/hedge arithmetic, all with seeded randomness."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from titan.config import BreakerConfig, HedgeConfig, RetryConfig, RoutingConfig, Timeouts
from titan.errors import (
    InvalidRequestError,
    UpstreamConnectionError,
    UpstreamError,
    UpstreamTimeoutError,
)
from titan.router.deployment import DeploymentState
from titan.router.policies import choose, rendezvous, smooth_weighted_round_robin
from titan.router.retry import HedgeBudget, backoff_s, hedge_delay_s, is_retryable, retry_delay_s
from titan.router.windows import LatencyWindow, PeakEwma


def deployment(
    name: str, *, weight: float = 1.0, outstanding: int = 0, latency: float | None = None
):
    state = DeploymentState.create(
        name,
        None,
        weight=weight,
        max_concurrency=None,
        timeouts=Timeouts(),
        breaker=BreakerConfig(),
        now=lambda: 0.0,
    )
    state.outstanding = outstanding
    if latency is not None:
        state.latency.update(latency)
    return state


def test_p2c_prefers_the_lower_expected_wait():
    fast = deployment("fast", latency=0.01)
    slow = deployment("slow", latency=0.5)
    rng = random.Random(0)
    picks = Counter(choose([fast, slow], RoutingConfig(), rng).name for _ in range(200))
    assert picks == {"fast": 200}  # with two candidates both are always drawn
    busy_fast = deployment("fast", latency=0.01, outstanding=100)
    picks = Counter(choose([busy_fast, slow], RoutingConfig(), rng).name for _ in range(50))
    assert picks == {"slow": 50}  # 101 * 0.01 > 1 * 0.5


def test_p2c_spreads_load_among_equals():
    rng = random.Random(1)
    candidates = [deployment(f"d{i}", latency=0.1) for i in range(4)]
    picks = Counter(choose(candidates, RoutingConfig(), rng).name for _ in range(4000))
    assert all(800 < n < 1200 for n in picks.values()), picks


def test_smooth_weighted_round_robin_interleaves_by_weight():
    a, b, c = deployment("a", weight=5), deployment("b"), deployment("c")
    order = "".join(smooth_weighted_round_robin([a, b, c]).name for _ in range(7))
    assert order == "aabacaa"


def test_least_outstanding_per_weight():
    light = deployment("light", outstanding=3, weight=4)
    heavy = deployment("heavy", outstanding=1)
    config = RoutingConfig(policy="least_outstanding")
    assert choose([light, heavy], config, random.Random(0)).name == "light"  # 0.75 < 1


def test_session_affinity_is_sticky_and_moves_only_a_lost_deployments_keys():
    config = RoutingConfig(policy="session_affinity")
    candidates = [deployment(f"d{i}") for i in range(4)]
    rng = random.Random(0)
    homes = {
        f"user-{k}": choose(candidates, config, rng, affinity_key=f"user-{k}").name
        for k in range(200)
    }
    again = {k: choose(candidates, config, rng, affinity_key=k).name for k in homes}
    assert homes == again
    survivors = [d for d in candidates if d.name != "d0"]
    moved = {k for k in homes if choose(survivors, config, rng, affinity_key=k).name != homes[k]}
    assert moved == {k for k, home in homes.items() if home == "d0"}
    assert 25 < len(moved) < 75  # about a quarter of the keys lived on d0


def test_prefix_affinity_yields_to_load_imbalance():
    config = RoutingConfig(policy="prefix_affinity", imbalance_factor=2.0)
    a, b = deployment("a"), deployment("b")
    key = "You are a helpful assistant. Summarize:"
    home = rendezvous([a, b], key)
    other = b if home is a else a
    assert choose([a, b], config, random.Random(0), affinity_key=key) is home
    home.outstanding, other.outstanding = 9, 0
    assert choose([a, b], config, random.Random(0), affinity_key=key) is other


def test_only_transient_errors_are_retried():
    config = RetryConfig()
    assert is_retryable(UpstreamConnectionError("refused"), config)
    assert is_retryable(UpstreamTimeoutError("slow"), config)
    assert is_retryable(UpstreamError("busy", status_code=503), config)
    assert is_retryable(UpstreamError("slow down", status_code=429), config)
    assert not is_retryable(UpstreamError("bad", status_code=400, is_retryable=False), config)
    assert not is_retryable(InvalidRequestError("bad parameter"), config)
    assert not is_retryable(
        UpstreamError("busy", status_code=503), RetryConfig(retry_on_status=(429,))
    )


def test_full_jitter_backoff_grows_and_caps():
    config = RetryConfig(backoff_base_s=0.1, backoff_max_s=1.0)
    rng = random.Random(0)
    for num_failed, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (8, 1.0)):
        samples = [backoff_s(num_failed, config, rng) for _ in range(500)]
        assert min(samples) >= 0 and max(samples) < ceiling
        assert max(samples) > 0.8 * ceiling  # full jitter: the whole range is used


def test_retry_after_stretches_the_pause_up_to_the_cap():
    config = RetryConfig(backoff_base_s=0.01, backoff_max_s=2.0)
    hinted = UpstreamError("slow down", status_code=429, retry_after=1.5)
    assert retry_delay_s(hinted, 1, config, random.Random(0)) == pytest.approx(1.5)
    too_long = UpstreamError("slow down", status_code=429, retry_after=60)
    assert retry_delay_s(too_long, 1, config, random.Random(0)) == 2.0


def test_hedges_stay_within_their_share_of_attempts():
    budget = HedgeBudget(HedgeConfig(max_fraction=0.1))
    hedges = 0
    for _ in range(1000):
        budget.on_attempt()
        hedges += budget.try_spend()
    assert 95 <= hedges <= 100
    assert not HedgeBudget(HedgeConfig(enabled=False)).try_spend()


def test_hedge_delay_is_the_live_percentile():
    window = LatencyWindow()
    config = HedgeConfig(percentile=95, min_delay_s=0.01)
    assert hedge_delay_s(window, config) is None  # nothing measured yet
    for i in range(100):
        window.record(0.001 * (i + 1))
    assert hedge_delay_s(window, config) == pytest.approx(0.095)
    assert hedge_delay_s(window, HedgeConfig(enabled=False)) is None


def test_peak_ewma_jumps_to_a_spike_and_decays_back():
    clock = [0.0]
    latency = PeakEwma(lambda: clock[0], decay_s=1.0)
    latency.update(0.02)
    latency.update(0.40)  # a spike: believed at once
    assert latency.value == 0.40
    clock[0] = 0.5  # soon after, a normal sample pulls it part of the way back
    latency.update(0.02)
    assert 0.02 < latency.value < 0.40
    clock[0] = 5.5  # long after, with no sample: it has decayed, and the replica is tried again
    assert latency.value < 0.002
    latency.update(0.02)
    assert latency.value == 0.02


def test_p2c_tries_a_replica_again_once_its_spike_has_decayed():
    clock = [0.0]
    spiky, steady = deployment("spiky"), deployment("steady")
    for state in (spiky, steady):
        state.latency = PeakEwma(lambda: clock[0], decay_s=1.0)
    spiky.latency.update(0.4)
    clock[0] = 4.0  # no request went to the spiky one since; the steady one kept answering
    steady.latency.update(0.02)
    assert choose([spiky, steady], RoutingConfig(), random.Random(0)) is spiky


def test_p2c_steers_around_a_replica_right_after_a_spike():
    clock = [0.0]
    spiky, steady = deployment("spiky"), deployment("steady")
    for state in (spiky, steady):
        state.latency = PeakEwma(lambda: clock[0], decay_s=1.0)
        state.latency.update(0.02)
    spiky.latency.update(0.4)
    steady.outstanding = 10  # even a busy steady replica wins over a fresh spike
    assert choose([spiky, steady], RoutingConfig(), random.Random(0)) is steady
