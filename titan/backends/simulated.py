"""The simulated backend in-process: a deployment that follows a SimulationProfile, no HTTP.

Tests, chaos runs and benchmarks use it to put latency spikes, error bursts, stalls, outages and
resets behind the router without running a server (``titan simulate`` is the same behaviour over
HTTP).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from titan.config import SimulatedDeployment
from titan.errors import (
    ServiceUnavailableError,
    UpstreamConnectionError,
    UpstreamError,
)
from titan.protocol import (
    Answer,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ClientRequest,
    Completion,
    ModelCard,
)
from titan.simulate import (
    ConnectionCut,
    Failure,
    FailureKind,
    Pacer,
    RequestPlan,
    Simulation,
    SimulationCounters,
    Stopwatch,
)
from titan.simulate.driver import ServerDriver, ServerTimeline, queue_request
from titan.simulate.model_server import ModelServer, RequestTooLong
from titan.simulate.wire import (
    AnswerHead,
    error_type,
    estimate_prompt_tokens,
    finish_chunk,
    token_chunk,
    usage_chunk,
    whole_answer,
)


def _max_tokens(request: ClientRequest) -> int | None:
    parsed = request.parsed
    if isinstance(parsed, ChatCompletionRequest):
        return parsed.max_output_tokens
    # The completions default (16) is the parser's, not the client's: as on the server, an
    # absent max_tokens means the profile's length.
    return parsed.max_tokens if "max_tokens" in parsed.model_fields_set else None


class SimulatedBackend:
    """See titan.backends.base.Backend. ``now``: seconds since the backend started (default: a
    monotonic clock restarted by ``start``); tests inject one to step through outage windows."""

    def __init__(
        self,
        deployment: SimulatedDeployment,
        model_name: str,
        name: str,
        *,
        now: Callable[[], float] | None = None,
    ):
        self._name = name
        self._model_name = model_name
        self._simulation = Simulation(deployment.profile, now)
        # Opt-in (profile.server): a model server's steps pace the answers, as over HTTP.
        server = deployment.profile.server
        self._driver = (
            None if server is None else ServerDriver(ModelServer(server), self._simulation.now)
        )
        self._counters = SimulationCounters()
        self._is_ready = False
        self._created = int(time.time())

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def model_ids(self) -> tuple[str, ...]:
        return (self._model_name,)

    @property
    def is_ready(self) -> bool:
        return self._is_ready

    async def start(self) -> None:
        # Outage windows count from the start.
        if isinstance(self._simulation.now, Stopwatch):
            self._simulation.now.restart()
        self._is_ready = True

    async def shutdown(self) -> None:
        self._is_ready = False
        if self._driver is not None:
            await self._driver.stop()

    def model_card(self, model_id: str) -> ModelCard:
        return ModelCard(id=model_id, created=self._created, owned_by="simulated")

    def stats(self) -> dict[str, Any]:
        return self._counters.as_dict()

    async def probe(self) -> None:
        if not self._is_ready:
            raise UpstreamConnectionError(f"{self._name}: the simulated backend is not started")
        failure = self._simulation.unavailability()
        if failure is not None:
            raise self._error(failure)

    # ---- requests ------------------------------------------------------------------------

    async def complete(self, request: ClientRequest) -> Answer:
        plan, head = self._begin(request)
        pacer, num_prompt_tokens = self._pacer(plan, request)
        counters = self._counters
        counters.num_active += 1
        try:
            await pacer.until_finish()
        except ConnectionCut:
            counters.num_cuts += 1
            raise self._cut_error() from None
        except asyncio.CancelledError:
            counters.num_cancelled += 1
            raise
        finally:
            counters.num_active -= 1
            self._release(pacer)
        counters.num_completed += 1
        answer = whole_answer(head, plan, num_prompt_tokens)
        model = ChatCompletion if head.endpoint == "chat" else Completion
        return model.model_validate(answer)

    async def stream(self, request: ClientRequest) -> AsyncIterator[Answer]:
        # Refusals raise here, at the first __anext__, before any chunk.
        plan, head = self._begin(request)
        pacer, num_prompt_tokens = self._pacer(plan, request)
        model = ChatCompletionChunk if head.endpoint == "chat" else Completion
        counters = self._counters
        counters.num_active += 1
        counters.num_active_streams += 1
        is_finished = False
        try:
            for index in range(plan.num_output_tokens):
                await pacer.until_token(index)
                text = plan.token_text(index)
                yield model.model_validate(token_chunk(head, text, is_first=index == 0))
            await pacer.until_finish()
            tail = [finish_chunk(head, plan.finish_reason)]
            if request.parsed.include_usage:
                tail.append(usage_chunk(head, num_prompt_tokens, plan))
            is_finished = True  # all that is left is made: a consumer leaving now loses nothing
            counters.num_completed += 1
            for chunk in tail:
                yield model.model_validate(chunk)
        except ConnectionCut:
            is_finished = True
            counters.num_cuts += 1
            raise self._cut_error() from None
        finally:
            counters.num_active -= 1
            counters.num_active_streams -= 1
            self._release(pacer)
            # Closed early (client gone, a hedge that lost) or cancelled mid-sleep.
            counters.num_cancelled += not is_finished

    def _begin(self, request: ClientRequest) -> tuple[RequestPlan, AnswerHead]:
        """Plans the request; raises its failure, if it has one, before any work."""
        if not self._is_ready:
            raise ServiceUnavailableError(f"{self._name}: the simulated backend is not started")
        plan = self._simulation.plan(_max_tokens(request))
        self._counters.record_plan(plan)
        if plan.failure is not None:
            raise self._error(plan.failure)
        return plan, AnswerHead.new(request.endpoint, self._model_name)

    def _pacer(
        self, plan: RequestPlan, request: ClientRequest
    ) -> tuple[Pacer | ServerTimeline, int]:
        """What paces the answer (the plan's times, or the model server's steps), and the
        prompt's tokens. Raises a 400 UpstreamError for a request the KV cache cannot hold."""
        if self._driver is None:
            return Pacer(plan), estimate_prompt_tokens(request.body)
        try:
            timeline = queue_request(self._driver, request.body, plan.num_output_tokens)
        except RequestTooLong as exc:
            raise UpstreamError(
                f"{self._name}: {exc}",
                status_code=400,
                is_retryable=False,
                error_type="invalid_request_error",
                code="context_length_exceeded",
            ) from None
        return timeline, timeline.num_prompt_tokens

    def _release(self, pacer: Pacer | ServerTimeline) -> None:
        if isinstance(pacer, ServerTimeline) and self._driver is not None:
            self._driver.release(pacer.sequence)

    def _error(self, failure: Failure) -> UpstreamError:
        message = f"{self._name}: {failure.message}"
        if failure.kind is FailureKind.RESET:
            return UpstreamConnectionError(message)
        status = failure.status or 500
        return UpstreamError(
            message,
            status_code=status,
            is_retryable=status == 429 or status >= 500,
            retry_after=failure.retry_after_s,
            error_type=error_type(status),
            code=f"simulated_{failure.cause}",
        )

    def _cut_error(self) -> UpstreamConnectionError:
        return UpstreamConnectionError(f"{self._name}: simulated connection drop (outage)")
