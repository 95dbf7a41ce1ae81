"""The attempt runner: retries, hedges, fallbacks, timeouts, breakers and release of
deployments, with scripted backends on a real event loop (delays of milliseconds)."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.service.scripted import ScriptedBackend, fail, hang, ok
from titan.config import BreakerConfig, HedgeConfig, RetryConfig, RoutingConfig, Timeouts
from titan.config.gateway import EmbeddedTimeouts
from titan.errors import (
    DeadlineExceededError,
    NoHealthyDeploymentError,
    UpstreamError,
    UpstreamTimeoutError,
)
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry, RequestTraits, RoutedModel
from titan.router.retry import HedgeBudget
from titan.service.attempts import AttemptRunner

FAST = Timeouts(first_byte_s=0.5, stall_s=0.2, total_s=5.0)


def request(stream: bool = False) -> ClientRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return ClientRequest("chat", ChatCompletionRequest.model_validate(body), body, "req-1")


def routed(
    name: str,
    backends: list[ScriptedBackend],
    *,
    fallbacks: tuple[str, ...] = (),
    hedge: HedgeConfig | None = None,
    breaker: BreakerConfig | None = None,
    timeouts: Timeouts = FAST,
) -> RoutedModel:
    states = [
        DeploymentState.create(
            b.name,
            b,
            weight=1.0,
            max_concurrency=None,
            timeouts=timeouts,
            breaker=breaker or BreakerConfig(),
            now=asyncio.get_running_loop().time,
        )
        for b in backends
    ]
    return RoutedModel(
        name,
        states,
        RoutingConfig(policy="round_robin"),
        fallbacks=list(fallbacks),
        hedge_budget=HedgeBudget(hedge or HedgeConfig(enabled=False)),
    )


class Pauses(list):
    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def runner(models: list[RoutedModel], retry: RetryConfig | None = None, **kwargs):
    hedge = kwargs.pop("hedge", HedgeConfig(enabled=False))
    registry = Registry(models, random.Random(0))
    pauses = Pauses()
    attempt_runner = AttemptRunner(
        registry, retry or RetryConfig(), hedge, rng=random.Random(0), sleep=pauses, **kwargs
    )
    return attempt_runner, registry, pauses


TRAITS = RequestTraits()


async def test_a_503_is_retried_on_the_other_deployment():
    a, b = ScriptedBackend("a", [fail(503)]), ScriptedBackend("b")
    model = routed("m", [a, b])
    attempt_runner, _, pauses = runner([model])
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    assert result.value.parsed() == {"from": "b"}
    assert (result.deployment, result.num_attempts, result.model) == ("b", 2, "m")
    assert pauses == []  # a fresh deployment is tried at once: no backoff, no Retry-After
    assert all(d.outstanding == 0 for d in model.deployments)


async def test_retry_after_and_backoff_apply_once_every_deployment_was_tried():
    a = ScriptedBackend("a", [fail(503, retry_after=0.5)])
    b = ScriptedBackend("b", [fail(503, retry_after=0.7)])
    model = routed("m", [a, b])
    attempt_runner, _, pauses = runner([model], RetryConfig(max_attempts=4, backoff_base_s=0.01))
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    # a (503) → b at once (503) → both tried: wait the last Retry-After → either one (ok).
    assert result.num_attempts == 3 and pauses == [0.7]
    assert all(d.outstanding == 0 for d in model.deployments)


async def test_a_client_error_is_not_retried():
    a, b = ScriptedBackend("a", [fail(400)]), ScriptedBackend("b")
    model = routed("m", [a, b])
    attempt_runner, _, pauses = runner([model])
    with pytest.raises(UpstreamError) as caught:
        await attempt_runner.complete(request(), model, TRAITS, None)
    assert caught.value.status_code == 400
    assert (a.calls, b.calls, pauses) == (1, 0, [])


async def test_retries_stop_at_max_attempts_and_raise_the_last_error():
    a = ScriptedBackend("a", default=fail(503, retry_after=0.5))
    model = routed("m", [a])
    attempt_runner, _, pauses = runner(
        [model], RetryConfig(max_attempts=3, backoff_base_s=0.01, backoff_max_s=2.0)
    )
    with pytest.raises(UpstreamError) as caught:
        await attempt_runner.complete(request(), model, TRAITS, None)
    assert caught.value.status_code == 503 and a.calls == 3
    assert pauses == [0.5, 0.5]  # Retry-After honoured (longer than the jittered backoff)


async def test_fallback_model_serves_when_every_deployment_fails():
    primary = routed("big", [ScriptedBackend("big-0", default=fail(500))], fallbacks=("small",))
    small = routed("small", [ScriptedBackend("small-0")])
    attempt_runner, _, _ = runner([primary, small], RetryConfig(max_attempts=2))
    result = await attempt_runner.complete(request(), primary, TRAITS, None)
    assert (result.model, result.deployment, result.num_attempts) == ("small", "small-0", 3)
    assert small.num_fallbacks == 1


async def test_first_byte_timeout_is_retried_elsewhere():
    slow, fast = ScriptedBackend("slow", [hang()]), ScriptedBackend("fast")
    model = routed("m", [slow, fast], timeouts=Timeouts(first_byte_s=0.05, total_s=0.05))
    attempt_runner, _, _ = runner([model])
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    assert result.deployment == "fast"
    assert slow.cancelled == 1  # the timed-out attempt was cancelled, not left running


async def test_without_a_first_byte_limit_a_slow_first_byte_is_waited_for_up_to_total_s():
    """An embedded engine's default: a request it is still prefilling is never cut early."""
    prefilling = ScriptedBackend("embedded-0", [ok(delay_s=0.2)])
    model = routed("m", [prefilling], timeouts=EmbeddedTimeouts(total_s=5.0))
    assert model.deployments[0].timeouts.first_byte_s is None
    attempt_runner, _, _ = runner([model])
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    assert result.deployment == "embedded-0" and prefilling.cancelled == 0
    stuck = ScriptedBackend("embedded-1", [hang()])  # then answers, when retried
    bounded = routed("m", [stuck], timeouts=EmbeddedTimeouts(total_s=0.05))
    result = await runner([bounded])[0].complete(request(), bounded, TRAITS, None)
    assert stuck.cancelled == 1 and result.num_attempts == 2  # total_s still cut the hang


async def test_hedge_after_the_live_p95_wins_and_the_loser_is_cancelled():
    slow, fast = ScriptedBackend("slow", [hang()]), ScriptedBackend("fast", [ok(0.01)])
    hedge = HedgeConfig(max_fraction=1.0, min_delay_s=0.0)
    model = routed("m", [slow, fast], hedge=hedge)
    for _ in range(50):
        model.ttfb.record(0.02)  # the model usually answers within 20 ms
    for _ in range(5):
        model.hedge_budget.on_attempt()
    attempt_runner, _, pauses = runner([model], hedge=hedge)
    started = asyncio.get_running_loop().time()
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    elapsed = asyncio.get_running_loop().time() - started
    assert result.deployment == "fast" and result.num_attempts == 2
    assert elapsed < 0.3  # not the slow one's timeout
    assert slow.cancelled == 1 and pauses == []
    assert model.hedge_budget.num_hedges == 1
    assert all(d.outstanding == 0 for d in model.deployments)


async def test_no_hedge_without_budget():
    slow, fast = ScriptedBackend("slow", [ok(0.1)]), ScriptedBackend("fast")
    hedge = HedgeConfig(max_fraction=0.0, min_delay_s=0.0)
    model = routed("m", [slow, fast], hedge=hedge)
    for _ in range(50):
        model.ttfb.record(0.01)
    attempt_runner, _, _ = runner([model], hedge=hedge)
    result = await attempt_runner.complete(request(), model, TRAITS, None)
    assert result.deployment == "slow" and fast.calls == 0


async def test_failing_deployment_is_ejected_by_its_breaker():
    broken, healthy = ScriptedBackend("broken", default=fail(503)), ScriptedBackend("healthy")
    model = routed("m", [broken, healthy], breaker=BreakerConfig(consecutive_errors=2))
    attempt_runner, _, _ = runner([model])
    for _ in range(10):
        result = await attempt_runner.complete(request(), model, TRAITS, None)
        assert result.deployment == "healthy"
    assert broken.calls == 2  # ejected after two errors, then never tried again
    assert model.deployments[0].is_ejected


async def test_nothing_available_is_a_503_with_retry_after():
    model = routed("m", [ScriptedBackend("a")])
    model.deployments[0].max_concurrency = 1
    model.deployments[0].outstanding = 1
    attempt_runner, _, _ = runner([model])
    with pytest.raises(NoHealthyDeploymentError) as caught:
        await attempt_runner.complete(request(), model, TRAITS, None)
    assert caught.value.status_code == 503 and caught.value.retry_after == 1.0


async def test_the_deadline_bounds_retries():
    model = routed("m", [ScriptedBackend("a", default=fail(503))])
    attempt_runner, _, _ = runner([model], RetryConfig(backoff_base_s=10, backoff_max_s=10))
    deadline = asyncio.get_running_loop().time() + 0.5
    with pytest.raises(DeadlineExceededError):
        await attempt_runner.complete(request(), model, TRAITS, deadline)


async def test_stream_is_retried_before_its_first_chunk_and_released_after():
    a = ScriptedBackend("a", [fail(503)])
    b = ScriptedBackend("b", [ok(num_chunks=3)])
    model = routed("m", [a, b])
    attempt_runner, _, _ = runner([model])
    result = await attempt_runner.stream(request(stream=True), model, TRAITS, None)
    assert result.deployment == "b"
    assert model.deployments[1].outstanding == 1  # held while the stream runs
    chunks = [chunk.parsed()["chunk"] async for chunk in result.value]
    assert chunks == [0, 1, 2]
    assert model.deployments[1].outstanding == 0 and b.closed_streams == 1


async def test_a_stalled_stream_is_cut_by_the_watchdog():
    b = ScriptedBackend("b", [ok(num_chunks=5, stall_after=2)])
    model = routed("m", [b])
    attempt_runner, _, _ = runner([model])
    result = await attempt_runner.stream(request(stream=True), model, TRAITS, None)
    received = []
    with pytest.raises(UpstreamTimeoutError, match="stalled"):
        async for chunk in result.value:
            received.append(chunk.parsed()["chunk"])
    assert received == [0, 1]
    assert model.deployments[0].outstanding == 0 and b.closed_streams == 1


async def test_a_stream_closed_unread_releases_its_deployment_and_upstream():
    b = ScriptedBackend("b", [ok(num_chunks=5, gap_s=0.01)])
    model = routed("m", [b])
    attempt_runner, _, _ = runner([model])
    result = await attempt_runner.stream(request(stream=True), model, TRAITS, None)
    await result.value.aclose()  # e.g. the client left before the first chunk was sent
    assert model.deployments[0].outstanding == 0 and b.closed_streams == 1


async def test_cancelling_the_request_cancels_the_attempt():
    slow = ScriptedBackend("slow", [hang()])
    model = routed("m", [slow], timeouts=Timeouts(first_byte_s=30, total_s=30))
    attempt_runner, _, _ = runner([model])
    task = asyncio.ensure_future(attempt_runner.complete(request(), model, TRAITS, None))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.cancelled == 1 and model.deployments[0].outstanding == 0
