"""Running a request against deployments: retries, hedges, fallbacks, deadlines, watchdogs.

Nothing reaches the client until an attempt produced its first byte (a whole answer, or a
stream's first chunk), so until then every failure can still be retried elsewhere: connection
errors, timeouts, 429s and 5xx. A hedge starts a second attempt on another deployment when the
first is slower than the model's live p95 time to first byte; the first to answer wins and the
other is cancelled (closing its upstream request). Once every deployment of a model failed, its
fallback models are tried in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from titan.config import HedgeConfig, RetryConfig
from titan.errors import (
    DeadlineExceededError,
    NoHealthyDeploymentError,
    TitanError,
    UpstreamError,
    UpstreamTimeoutError,
)
from titan.observability.spans import SpanKind
from titan.observability.tracing import Tracer
from titan.protocol import Answer, ClientRequest
from titan.router.deployment import DeploymentState
from titan.router.registry import Registry, RequestTraits, RoutedModel
from titan.router.retry import hedge_delay_s, is_retryable, retry_delay_s
from titan.router.scoring import RouteDecision
from titan.service.streaming import close_stream

T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(frozen=True)
class Routed(Generic[T]):
    """An answer (or a started stream) and where it came from."""

    value: T
    model: str
    deployment: str
    num_attempts: int
    # Admission's headers for the client: x-ratelimit-*, x-titan-degraded.
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Attempts:
    """Bookkeeping for one client request across all its attempts."""

    deadline: float | None
    count: int = 0
    decisions: list[RouteDecision] = field(default_factory=list)  # scored routing's, per pick


AttemptFn = Callable[[DeploymentState], Awaitable[T]]
Release = Callable[[T], Awaitable[None]]


class AttemptRunner:
    def __init__(
        self,
        registry: Registry,
        retry: RetryConfig,
        hedge: HedgeConfig,
        *,
        now: Clock = time.monotonic,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tracer: Tracer | None = None,
    ):
        self.tracer = tracer or Tracer()
        self.registry = registry
        self.retry = retry
        self.hedge = hedge
        self._now = now
        self._rng = rng or random.Random()
        self._sleep = sleep

    async def complete(
        self,
        request: ClientRequest,
        model: RoutedModel,
        traits: RequestTraits,
        deadline: float | None,
    ) -> Routed[Answer]:
        async def attempt(deployment: DeploymentState) -> Answer:
            return await deployment.backend.complete(self._propagated(request))

        return await self._run(model, traits, _Attempts(deadline), attempt, release=None)

    async def stream(
        self,
        request: ClientRequest,
        model: RoutedModel,
        traits: RequestTraits,
        deadline: float | None,
    ) -> Routed[AsyncIterator[Answer]]:
        """A stream whose first chunk exists: every refusal was raised (or retried) before."""

        async def attempt(deployment: DeploymentState) -> tuple[Answer, AsyncIterator[Answer]]:
            chunks = deployment.backend.stream(self._propagated(request))
            try:
                first = await anext(chunks)
            except StopAsyncIteration:
                raise UpstreamError(
                    f"{deployment.name} ended the stream before its first chunk", status_code=502
                ) from None
            except BaseException:
                await close_stream(chunks)
                raise
            return first, chunks

        async def release(value: tuple[Answer, AsyncIterator[Answer]]) -> None:
            await close_stream(value[1])

        routed = await self._run(model, traits, _Attempts(deadline), attempt, release=release)
        first, chunks = routed.value
        deployment = self._deployment(routed)
        guarded = self._watched(first, chunks, deployment, deadline)
        return dataclasses.replace(routed, value=guarded)

    def _propagated(self, request: ClientRequest) -> ClientRequest:
        """The request with this attempt's span as its ``traceparent`` (when traced), so that an
        upstream that traces too (vLLM's --otlp-traces-endpoint) joins the request's trace."""
        span = self.tracer.current_span()
        if span is None:
            return request
        headers = {**request.headers, "traceparent": span.traceparent()}
        return dataclasses.replace(request, headers=headers)

    def _deployment(self, routed: Routed[object]) -> DeploymentState:
        model = self.registry.models[routed.model]
        return next(d for d in model.deployments if d.name == routed.deployment)

    # ---- the retry / fallback loop ------------------------------------------------------

    async def _run(
        self,
        model: RoutedModel,
        traits: RequestTraits,
        attempts: _Attempts,
        attempt: AttemptFn[T],
        *,
        release: Release[T] | None,
    ) -> Routed[T]:
        """``release`` frees what a successful attempt holds (a started stream) when it loses a
        hedge race; None for whole answers. A stream is the only thing that keeps its
        deployment after its first byte."""
        last_error: BaseException | None = None
        for current in self.registry.chain(model):
            if current is not model:
                current.num_fallbacks += 1
            tried: set[str] = set()
            num_failed = 0
            while num_failed < self.retry.max_attempts:
                deployment = self.registry.pick(
                    current, traits, tried, attempts.decisions
                ) or self.registry.pick(current, traits, set(), attempts.decisions)
                if deployment is None:
                    break  # every deployment ejected or at capacity: fall back
                tried.add(deployment.name)
                try:
                    value, winner = await self._hedged(
                        current, deployment, traits, tried, attempts, attempt, release
                    )
                    headers = current.route_headers(winner.name, attempts.decisions)
                    return Routed(value, current.name, winner.name, attempts.count, headers)
                except TitanError as error:
                    if not is_retryable(error, self.retry):
                        raise
                    last_error = error
                    num_failed += 1
                # Another deployment is a fresh start: go at once. Only a retry on one that
                # already failed waits (backoff, and that upstream's Retry-After).
                is_last = num_failed >= self.retry.max_attempts
                if not is_last and not self.registry.has_untried(current, tried):
                    await self._pause(last_error, num_failed, attempts)
        if last_error is not None:
            raise last_error
        raise NoHealthyDeploymentError(
            f"No deployment of '{model.name}' (or its fallbacks) can take requests right now.",
            retry_after=1.0,
        )

    async def _pause(self, error: BaseException, num_failed: int, attempts: _Attempts) -> None:
        delay = retry_delay_s(error, num_failed, self.retry, self._rng)
        if attempts.deadline is not None and self._now() + delay >= attempts.deadline:
            raise DeadlineExceededError(
                "The request's deadline passed while retrying; the last error was: "
                f"{getattr(error, 'message', error)}"
            )
        await self._sleep(delay)

    # ---- one attempt, maybe hedged ------------------------------------------------------

    async def _hedged(
        self,
        model: RoutedModel,
        deployment: DeploymentState,
        traits: RequestTraits,
        tried: set[str],
        attempts: _Attempts,
        attempt: AttemptFn[T],
        release: Release[T] | None,
    ) -> tuple[T, DeploymentState]:
        is_stream = release is not None
        model.hedge_budget.on_attempt()
        primary = asyncio.ensure_future(
            self._attempt(model, deployment, attempts, attempt, is_stream)
        )
        tasks = {primary: deployment}
        try:
            delay = hedge_delay_s(model.ttfb, self.hedge)
            if delay is not None:
                await asyncio.wait({primary}, timeout=delay)
                second = None
                if not primary.done():
                    second = self.registry.pick(model, traits, tried, attempts.decisions)
                if second is not None and model.hedge_budget.try_spend():
                    tried.add(second.name)
                    hedge = self._attempt(model, second, attempts, attempt, is_stream)
                    tasks[asyncio.ensure_future(hedge)] = second
            return await self._first_success(tasks)
        finally:
            await self._cancel_losers(tasks, release)

    async def _first_success(
        self, tasks: dict[asyncio.Future[T], DeploymentState]
    ) -> tuple[T, DeploymentState]:
        pending = set(tasks)
        first_error: BaseException | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None:
                    winner = tasks.pop(task)  # popped: _cancel_losers leaves it alone
                    return task.result(), winner
                first_error = first_error or task.exception()
        assert first_error is not None
        raise first_error

    async def _cancel_losers(
        self, tasks: dict[asyncio.Future[T], DeploymentState], release: Release[T] | None
    ) -> None:
        for task in tasks:
            task.cancel()
        for task, deployment in tasks.items():
            try:
                value = await task
            except BaseException:  # cancelled, or failed: nothing is held
                continue
            # It succeeded at the same moment as the winner: let go of what it holds.
            if release is not None:
                await release(value)
                deployment.on_end()

    async def _attempt(
        self,
        model: RoutedModel,
        deployment: DeploymentState,
        attempts: _Attempts,
        attempt: AttemptFn[T],
        is_stream: bool,
    ) -> T:
        attempts.count += 1
        deployment.on_start()
        started = self._now()
        timeouts = deployment.timeouts
        # A whole answer is a non-streaming request's first byte: the same limit applies.
        limit = min(timeouts.first_byte_s or timeouts.total_s, timeouts.total_s)
        if attempts.deadline is not None:
            limit = min(limit, max(0.0, attempts.deadline - started))
        try:
            with self.tracer.span("titan.attempt", kind=SpanKind.CLIENT, model=model.name,
                                  deployment=deployment.name, attempt=attempts.count):  # fmt: skip
                async with asyncio.timeout(limit):
                    value = await attempt(deployment)
        except TimeoutError:
            deployment.on_failure()
            deployment.on_end()
            raise UpstreamTimeoutError(
                f"{deployment.name} sent no first byte within {limit:.3g}s"
            ) from None
        except UpstreamError:
            deployment.on_failure()
            deployment.on_end()
            raise
        except BaseException:  # the client's own error, or cancelled: not the deployment's fault
            deployment.on_end()
            raise
        ttfb = self._now() - started
        deployment.on_success(ttfb)
        model.ttfb.record(ttfb)
        if not is_stream:
            deployment.on_end()  # a stream holds its deployment until it ends (_watched)
        return value

    # ---- after the first byte ---------------------------------------------------------------

    def _watched(
        self,
        first: Answer,
        chunks: AsyncIterator[Answer],
        deployment: DeploymentState,
        deadline: float | None,
    ) -> WatchedStream:
        ends_at = self._now() + deployment.timeouts.total_s
        if deadline is not None:
            ends_at = min(ends_at, deadline)
        return WatchedStream(first, chunks, deployment, ends_at, self._now)


class WatchedStream:
    """The rest of a stream after its first chunk: cut when it stalls or overruns its deadline,
    and the deployment and the upstream request are always released when it ends, fails or is
    closed — even if nobody ever iterated it (an async generator's ``finally`` would not run)."""

    def __init__(
        self,
        first: Answer,
        chunks: AsyncIterator[Answer],
        deployment: DeploymentState,
        ends_at: float,
        now: Clock,
    ):
        self._first: Answer | None = first
        self._chunks = chunks
        self._deployment = deployment
        self._ends_at = ends_at
        self._now = now
        self._is_closed = False

    def __aiter__(self) -> WatchedStream:
        return self

    async def __anext__(self) -> Answer:
        if self._is_closed:
            raise StopAsyncIteration
        if self._first is not None:
            first, self._first = self._first, None
            return first
        stall_s = self._deployment.timeouts.stall_s
        remaining = self._ends_at - self._now()
        try:
            async with asyncio.timeout(min(stall_s, max(0.0, remaining))):
                return await anext(self._chunks)
        except StopAsyncIteration:
            await self.aclose()
            raise
        except TimeoutError:
            self._deployment.on_failure()
            await self.aclose()
            what = "stalled" if remaining > stall_s else "ran past its deadline"
            raise UpstreamTimeoutError(f"The stream from {self._deployment.name} {what}.") from None
        except UpstreamError:
            self._deployment.on_failure()
            await self.aclose()
            raise
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        try:
            await close_stream(self._chunks)
        finally:
            self._deployment.on_end()
