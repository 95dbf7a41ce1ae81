"""A standalone OpenAI-compatible server that follows a SimulationProfile (``titan simulate``).

It is the upstream of integration tests, chaos runs and the gateway overhead benchmark, so its
hot path stays lean: requests are read with orjson, answers are built as dicts and stream chunks
from a pre-encoded template, never through pydantic.

How it fails, as a client sees it:
- an error (burst, or an outage with a status): that status with an OpenAI error body, and
  ``Retry-After`` (whole seconds, rounded up) plus ``retry-after-ms`` for 429 and 503;
- a reset (random, or an outage without a status): the status line and headers (200) go out,
  then the connection closes before any byte of the body. HTTP clients report a protocol error
  (httpx: ``RemoteProtocolError``, "peer closed connection"; the openai SDK:
  ``APIConnectionError``). ASGI cannot reset a connection before the status line: uvicorn only
  closes it when an app returns with its response unfinished (and logs an error line saying so);
- an outage without a status that begins while an answer is under way cuts it the same way, after
  the chunks already sent.

Two options of ``create_simulator_app`` serve chaos runs: ``max_concurrency`` (answers beyond it
wait their turn, first come first served, as in an engine at its batch limit; their plans start
when they get a slot) and ``allow_fault_control`` (``/simulation/faults``: faults injected from
now for a while, see ``titan.simulate.faults``). Both are off unless asked for.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from titan.config.simulation import SimulationProfile
from titan.simulate.behaviour import (
    Failure,
    FailureKind,
    RequestPlan,
    Simulation,
    Stopwatch,
    retry_after_header,
)
from titan.simulate.counters import SimulationCounters
from titan.simulate.driver import ServerDriver, ServerTimeline, queue_request
from titan.simulate.faults import RUNTIME_FAULT, FaultBoard
from titan.simulate.model_server import ModelServer, RequestTooLong
from titan.simulate.pacing import ConnectionCut, Pacer
from titan.simulate.server_metrics import CONTENT_TYPE, ServerMetrics
from titan.simulate.wire import (
    AnswerHead,
    SimulatedEndpoint,
    error_body,
    estimate_prompt_tokens,
    failure_body,
    finish_chunk,
    requested_max_tokens,
    token_chunk,
    usage_chunk,
    wants_stream,
    wants_usage,
    whole_answer,
)

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
DONE = b"data: [DONE]\n\n"
# Stands for a token's text in the pre-encoded chunk; no id or model name contains it.
_TEXT_SLOT = "\x00"


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _json(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None):
    return Response(orjson.dumps(payload), status, headers, media_type="application/json")


def _failure_response(failure: Failure) -> ASGIApp:
    if failure.kind is FailureKind.RESET:
        return _reset
    headers = None
    if failure.retry_after_s is not None:
        headers = {
            "retry-after": retry_after_header(failure.retry_after_s),
            "retry-after-ms": str(round(failure.retry_after_s * 1000)),
        }
    return _json(failure_body(failure), failure.status or 500, headers)


async def _reset(scope: Scope, receive: Receive, send: Send) -> None:
    """Starts a response and leaves it unfinished: uvicorn then closes the connection."""
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _ChunkTemplate:
    """A token's stream event, encoded once per answer: only the text changes between tokens."""

    def __init__(self, head: AnswerHead):
        encoded = orjson.dumps(token_chunk(head, _TEXT_SLOT, is_first=False))
        before, _, after = encoded.rpartition(orjson.dumps(_TEXT_SLOT))
        self._before = b"data: " + before
        self._after = after + b"\n\n"

    def event(self, text: str) -> bytes:
        return self._before + orjson.dumps(text) + self._after


@dataclass(frozen=True, slots=True)
class _Job:
    """One request's answer, planned and waiting to be sent."""

    pacer: Pacer | ServerTimeline
    plan: RequestPlan
    head: AnswerHead
    num_prompt_tokens: int
    include_usage: bool


@dataclass(frozen=True, slots=True)
class _Order:
    """A planned answer not yet started: its job (and the pacer's clock) begins when made."""

    plan: RequestPlan
    head: AnswerHead
    num_prompt_tokens: int
    include_usage: bool

    def start(self) -> _Job:
        pacer = Pacer(self.plan)  # the plan's times count from here
        return _Job(pacer, self.plan, self.head, self.num_prompt_tokens, self.include_usage)


class _Simulator:
    """The server's state: one simulation, its counters, the model it answers as."""

    def __init__(
        self,
        profile: SimulationProfile,
        model_name: str,
        now: Callable[[], float] | None,
        max_concurrency: int | None = None,
    ):
        self.simulation = Simulation(profile, now)
        self.counters = SimulationCounters()
        self.model_name = model_name
        # Injected faults reshape the plans; their own seed keeps the profile's draws intact.
        self.faults = FaultBoard(self.simulation.now, seed=profile.seed + 1)
        self.slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        # Opt-in (profile.server): a model server decides the timings and serves /metrics.
        self.driver: ServerDriver | None = None
        if profile.server is not None:
            self.metrics = ServerMetrics(model_name)
            model_server = ModelServer(profile.server, self.metrics)
            self.metrics.watch(model_server)
            self.driver = ServerDriver(model_server, self.simulation.now)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Outage windows count from when the server starts serving, not from when it was built.
        if isinstance(self.simulation.now, Stopwatch):
            self.simulation.now.restart()
        yield
        if self.driver is not None:
            await self.driver.stop()

    # ---- routes -------------------------------------------------------------------------

    async def chat(self, request: Request) -> ASGIApp:
        return await self._answer(request, "chat")

    async def completions(self, request: Request) -> ASGIApp:
        return await self._answer(request, "completion")

    async def models(self, request: Request) -> ASGIApp:
        failure = self._unavailability()
        if failure is not None:
            return _failure_response(failure)
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "simulated"}
        return _json({"object": "list", "data": [card]})

    async def health(self, request: Request) -> ASGIApp:
        failure = self._unavailability()
        return _json({"status": "ok"}) if failure is None else _failure_response(failure)

    def _unavailability(self) -> Failure | None:
        return self.simulation.unavailability() or self.faults.unavailability()

    # ---- fault control (only routed with allow_fault_control) ----------------------------

    async def inject_fault(self, request: Request) -> ASGIApp:
        try:
            fault = RUNTIME_FAULT.validate_json(await request.body())
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'the fault'}: {error['msg']}"
                for error in exc.errors(include_url=False)
            )
            return _json(error_body(f"Invalid fault: {problems}", 400), 400)
        return _json(self.faults.inject(fault).as_dict())

    async def list_faults(self, request: Request) -> ASGIApp:
        active = [fault.as_dict() for fault in self.faults.active()]
        return _json({"now_s": self.simulation.now(), "active": active})

    async def clear_faults(self, request: Request) -> ASGIApp:
        return _json({"cleared": self.faults.clear()})

    async def stats(self, request: Request) -> ASGIApp:
        return _json(self.counters.as_dict())

    async def prometheus(self, request: Request) -> ASGIApp:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    # ---- answering ----------------------------------------------------------------------

    async def _answer(self, request: Request, endpoint: SimulatedEndpoint) -> ASGIApp:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _json(error_body("The body is not valid JSON.", 400), 400)
        if not isinstance(body, dict) or ("messages" not in body and "prompt" not in body):
            message = "The body must be a JSON object with 'messages' or 'prompt'."
            return _json(error_body(message, 400), 400)
        plan = self.faults.shape(self.simulation.plan(requested_max_tokens(body)))
        self.counters.record_plan(plan)
        if plan.failure is not None:
            return _failure_response(plan.failure)
        model = body.get("model")
        order = _Order(
            plan=plan,
            head=AnswerHead.new(endpoint, model if isinstance(model, str) else self.model_name),
            num_prompt_tokens=estimate_prompt_tokens(body),
            include_usage=wants_usage(body),
        )
        answer = self._stream if wants_stream(body) else self._whole
        if self.driver is not None:
            return self._served(body, order, answer, self.driver)
        if self.slots is None:
            work = functools.partial(answer, job=order.start())  # times count from the arrival
        else:
            work = functools.partial(self._in_turn, order=order, answer=answer, slots=self.slots)
        return _UnlessDisconnected(work, self.counters)

    def _served(
        self, body: dict[str, Any], order: _Order, answer: Callable[..., Any], driver: ServerDriver
    ) -> ASGIApp:
        """Queued in the model server now: its steps pace the answer (max_num_seqs bounds it)."""
        try:
            timeline = queue_request(driver, body, order.plan.num_output_tokens)
        except RequestTooLong as exc:
            return _json(error_body(str(exc), 400, "context_length_exceeded"), 400)
        plan, head, usage = order.plan, order.head, order.include_usage
        job = _Job(timeline, plan, head, timeline.num_prompt_tokens, usage)
        return _UnlessDisconnected(
            lambda send: timeline.attend(answer(send, job=job)), self.counters
        )

    async def _in_turn(
        self,
        send: Send,
        order: _Order,
        answer: Callable[..., Coroutine[Any, Any, None]],
        slots: asyncio.Semaphore,
    ) -> None:
        """Waits for a slot (first come, first served), then answers; times count from then."""
        self.counters.num_queued += 1
        try:
            await slots.acquire()
        finally:
            self.counters.num_queued -= 1
        try:
            await answer(send, job=order.start())
        finally:
            slots.release()

    async def _whole(self, send: Send, job: _Job) -> None:
        plan = job.plan
        try:
            await job.pacer.until_finish()
        except ConnectionCut:
            self.counters.num_cuts += 1
            # Started and left unfinished: uvicorn drops the connection.
            await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
            return
        content = orjson.dumps(whole_answer(job.head, plan, job.num_prompt_tokens))
        headers = [*JSON_HEADERS, (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})
        self.counters.num_completed += 1

    async def _stream(self, send: Send, job: _Job) -> None:
        plan, head, pacer = job.plan, job.head, job.pacer
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        template = _ChunkTemplate(head)
        self.counters.num_active_streams += 1
        try:
            for index in range(plan.num_output_tokens):
                await pacer.until_token(index)
                text = plan.token_text(index)
                if index == 0:  # the first chunk also carries the role: not the template's shape
                    await _send_body(send, _event(token_chunk(head, text, is_first=True)))
                else:
                    await _send_body(send, template.event(text))
            await pacer.until_finish()
            tail = _event(finish_chunk(head, plan.finish_reason))
            if job.include_usage:
                tail += _event(usage_chunk(head, job.num_prompt_tokens, plan))
            await _send_body(send, tail + DONE, is_last=True)
            self.counters.num_completed += 1
        except ConnectionCut:
            self.counters.num_cuts += 1  # returning unfinished: uvicorn drops the connection
        finally:
            self.counters.num_active_streams -= 1


async def _send_body(send: Send, body: bytes, *, is_last: bool = False) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": not is_last})


class _UnlessDisconnected:
    """Runs an answer while watching for the client's disconnect, which cancels it at once
    (mid-sleep included) and counts as cancelled: tests use that to prove that a gateway's
    cancellation reached its upstream."""

    def __init__(
        self, work: Callable[[Send], Coroutine[Any, Any, None]], counters: SimulationCounters
    ):
        self._work = work
        self._counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        counters = self._counters
        counters.num_active += 1
        answering = asyncio.ensure_future(self._work(send))
        watching = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({answering, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            counters.num_active -= 1
            answering.cancel()
            watching.cancel()
            await asyncio.gather(answering, watching, return_exceptions=True)
        if answering.cancelled():
            counters.num_cancelled += 1
        elif answering.exception() is not None:
            raise answering.exception()  # type: ignore[misc]


def create_simulator_app(
    profile: SimulationProfile,
    model_name: str = "simulated",
    *,
    now: Callable[[], float] | None = None,
    max_concurrency: int | None = None,
    allow_fault_control: bool = False,
) -> Starlette:
    """The simulator as an ASGI app. ``now``: seconds since start (default: a monotonic clock
    restarted when the app starts); tests inject one to move through outage windows.
    ``max_concurrency``: answers at once (None: no limit); ``allow_fault_control``: serve
    ``/simulation/faults`` (anyone who can reach the port can then break the backend)."""
    simulator = _Simulator(profile, model_name, now, max_concurrency)
    routes = [
        Route("/v1/chat/completions", simulator.chat, methods=["POST"]),
        Route("/v1/completions", simulator.completions, methods=["POST"]),
        Route("/v1/models", simulator.models, methods=["GET"]),
        Route("/health", simulator.health, methods=["GET"]),
        Route("/stats", simulator.stats, methods=["GET"]),
    ]
    if allow_fault_control:
        routes += [
            Route("/simulation/faults", simulator.inject_fault, methods=["POST"]),
            Route("/simulation/faults", simulator.list_faults, methods=["GET"]),
            Route("/simulation/faults", simulator.clear_faults, methods=["DELETE"]),
        ]
    if profile.server is not None:
        routes.append(Route("/metrics", simulator.prometheus, methods=["GET"]))
    app = Starlette(routes=routes, lifespan=simulator.lifespan)
    app.state.simulator = simulator
    return app
