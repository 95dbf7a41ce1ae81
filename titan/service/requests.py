"""One request's way through the pipeline:

authenticate → route (tiers, splits) → policy (model allowed, budget) → response cache (a hit is
answered here) → degradation → limits and the admission queue → the attempt runner → settle the
limits, record the usage, store the answer in the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from titan.errors import OverloadedError, TitanError
from titan.observability.records import TIMINGS_HEADER, RequestRecord
from titan.observability.tracing import set_attributes
from titan.protocol import Answer, ClientRequest
from titan.router.registry import RoutedModel
from titan.service.accounting import StreamMeter, canned_answer, canned_stream, usage_of
from titan.service.admission import (
    CHARS_PER_TOKEN,
    Gatekeeper,
    Ticket,
    relax_structured_output,
)
from titan.service.attempts import AttemptRunner, Routed
from titan.service.caching import CachePlan, CacheStep
from titan.service.guard import GuardHits, Guardrails
from titan.service.observing import RequestObserver, answer_text, prompt_text, timed_answer
from titan.service.streaming import close_stream

# nginx's code for "client closed request", as the HTTP layer logs it.
CLIENT_CLOSED_REQUEST = 499


@dataclass
class Prepared:
    """A request ready for the runner, or answered already (``answered``)."""

    request: ClientRequest
    model: RoutedModel
    traits: Any
    deadline: float | None
    ticket: Ticket | None = None
    cache: CachePlan | None = None
    answered: Routed[Any] | None = None
    guard_hits: GuardHits | None = None  # None: no guardrail policies configured


class RequestFlow:
    def __init__(
        self,
        gate: Gatekeeper,
        runner: AttemptRunner,
        cache: CacheStep,
        *,
        route: Callable[[ClientRequest], Any],
        model_named: Callable[[str | None], RoutedModel],
        now: Callable[[], float],
        retry_after_s: float,
        observer: RequestObserver,
        guard: Guardrails | None = None,
    ):
        self.observer = observer
        self.guard = guard if guard is not None and guard.is_active else None
        self.gate = gate
        self.runner = runner
        self.cache = cache
        self._route = route
        self._model_named = model_named
        self._now = now
        self._retry_after_s = retry_after_s

    async def _prepare(self, request: ClientRequest, record: RequestRecord) -> Prepared:
        gate, span = self.gate, self.observer.tracer.span
        with span("titan.authenticate"):
            caller = await gate.authenticate(request)
        record.tenant, record.priority = caller.tenant, caller.priority
        admission_deadline = gate.deadline(request)
        with span("titan.route"):
            model, traits, deadline = await self._route(request)
        record.model = model.name
        await gate.check_policy(caller, request.model or model.name)
        hits = None
        if self.guard is not None:  # before the cache: a redacted prompt has its own key
            hits = self.guard.hits_for(request)
            with span("titan.guardrails_input"):
                checked = await self.guard.check_input(request, model.name, hits)
            if checked is not request and self.observer.logs_content:
                record.redacted_prompt = prompt_text(checked)
            request = checked
        with span("titan.cache_lookup"):
            plan = await self.cache.lookup(request, caller.tenant, model.name)
        if plan is not None:
            record.cache = f"hit-{plan.lookup.hit.kind}" if plan.lookup.hit else "miss"
        if "cache" in request.body:  # Titan's own field: upstreams such as OpenAI refuse it
            body = {name: value for name, value in request.body.items() if name != "cache"}
            request = dataclasses.replace(request, body=body)
        if plan is not None and plan.lookup.hit is not None:
            return Prepared(
                request, model, traits, deadline, answered=self.cache.replay(plan, request),
                guard_hits=hits,
            )  # fmt: skip
        degradation = gate.degradation(model.name, caller)
        if (step := degradation.step("fallback_model")) is not None:
            model = self._model_named(step.model)
        if (step := degradation.step("cap_max_tokens")) is not None:
            request = request.with_max_output_tokens(step.max_tokens)  # type: ignore[arg-type]
        if degradation.step("relax_structured_output") is not None:
            request = relax_structured_output(request)
        if (step := degradation.step("cache_only")) is not None:
            # Nothing cached answers it (a hit returned above): the configured reply, else a
            # refusal that says why.
            gate.metrics.inc(gate.metrics.degraded, model.name, "cache_only")
            if step.reply is not None:
                return Prepared(
                    request, model, traits, deadline, guard_hits=hits,
                    answered=_canned(request, model, step.reply),
                )  # fmt: skip
            error = OverloadedError(
                f"Model '{model.name}' is overloaded and answers requests of the "
                f"{caller.priority} class from the cache only; nothing is cached for this one. "
                "Retry later.",
                retry_after=self._retry_after_s,
                code="degraded_cache_only",
            )
            gate.refused(model.name, error, caller)
            raise error
        with span("titan.admission", priority=caller.priority):
            ticket = await gate.admit(
                caller, request, model.name, traits.prompt_chars, admission_deadline, degradation
            )
        record.queue_s = ticket.admitted.wait_s
        return Prepared(request, model, traits, deadline, ticket, plan, guard_hits=hits)

    async def complete(self, request: ClientRequest) -> Routed[Answer]:
        record = self.observer.start(request)
        routed: Routed[Answer] | None = None
        try:
            with self.observer.request_span(request, record) as span:
                routed = await self._complete(request, record)
                set_attributes(span, model=record.model, deployment=routed.deployment,
                               attempts=routed.num_attempts)  # fmt: skip
            record.first_byte()
            record.deployment, record.num_attempts = routed.deployment, routed.num_attempts
            usage = usage_of(routed.value)
            if usage is not None:
                record.prompt_tokens, record.completion_tokens = usage
            if record.is_timed:
                record.total_s = record.elapsed()
                routed.headers[TIMINGS_HEADER] = record.timings_header()
                routed = dataclasses.replace(routed, value=timed_answer(routed.value, record))
            return routed
        except BaseException as exc:
            record.failed(*_status_of(exc))
            raise
        finally:
            content = None
            if self.observer.logs_content:
                answer = answer_text(routed.value) if routed is not None else ""
                content = {"prompt": _logged_prompt(request, record), "answer": answer}
            self.observer.report(record, content)

    async def _complete(self, request: ClientRequest, record: RequestRecord) -> Routed[Answer]:
        prepared = await self._prepare(request, record)
        if prepared.answered is not None:
            return await self._guarded_replay(prepared)
        ticket: Ticket = prepared.ticket  # type: ignore[assignment]
        started = self._now()
        try:
            routed = await self.runner.complete(
                prepared.request, prepared.model, prepared.traits, prepared.deadline
            )
        except BaseException:
            await self.gate.finish(ticket, None, is_served=False)
            raise
        self.gate.observe_first_token(ticket, self._now() - started)
        await self.gate.finish(ticket, usage_of(routed.value), is_served=True)
        is_blocked = False
        if self.guard is not None and prepared.guard_hits is not None:
            answer, is_blocked = await self.guard.check_answer(
                routed.value, prepared.request, prepared.model.name, prepared.guard_hits
            )
            routed = dataclasses.replace(routed, value=answer)
        if prepared.cache is not None:
            if not is_blocked:  # a blocked answer is never replayed
                self.cache.store_whole(prepared.cache, routed.value)
            routed.headers.update(prepared.cache.headers)
        routed.headers.update(ticket.headers)
        return _marked(routed, prepared.guard_hits)

    async def stream(self, request: ClientRequest) -> Routed[AsyncIterator[Answer]]:
        """A started stream: refusals (and retries) happen before the first chunk is handed out.
        Its record is reported when the stream ends (or the client leaves)."""
        record = self.observer.start(request)
        try:
            with self.observer.request_span(request, record) as span:  # up to the first token
                routed = await self._stream(request, record)
                set_attributes(span, model=record.model, deployment=routed.deployment,
                               attempts=routed.num_attempts)  # fmt: skip
        except BaseException as exc:
            record.failed(*_status_of(exc))
            self.observer.report(record)
            raise
        record.first_byte()  # the runner hands a stream over once its first chunk came
        record.deployment, record.num_attempts = routed.deployment, routed.num_attempts
        if record.is_timed:
            routed.headers[TIMINGS_HEADER] = record.timings_header()
        content = None
        if self.observer.logs_content:
            content = {"prompt": _logged_prompt(request, record)}
        observed = _observed(routed.value, record, self.observer, content)
        return dataclasses.replace(routed, value=observed)

    async def _stream(
        self, request: ClientRequest, record: RequestRecord
    ) -> Routed[AsyncIterator[Answer]]:
        prepared = await self._prepare(request, record)
        if prepared.answered is not None:
            return await self._guarded_replay(prepared)
        ticket: Ticket = prepared.ticket  # type: ignore[assignment]
        plan = prepared.cache
        forwarded = prepared.request
        if plan is not None and plan.is_storable:
            forwarded = forwarded.with_stream_usage()  # a replay carries the original usage
        started = self._now()
        try:
            routed = await self.runner.stream(
                forwarded, prepared.model, prepared.traits, prepared.deadline
            )
        except BaseException:
            await self.gate.finish(ticket, None, is_served=False)
            raise
        self.gate.observe_first_token(ticket, self._now() - started)
        meter = StreamMeter(-(-prepared.traits.prompt_chars // CHARS_PER_TOKEN))
        stream = _metered(routed.value, meter, self.gate, ticket)
        if self.guard is not None and prepared.guard_hits is not None:
            stream = self.guard.stream(
                stream, prepared.request, prepared.model.name, prepared.guard_hits,
                on_block=lambda: _not_storable(plan),
            )  # fmt: skip
        if plan is not None:
            stream = self.cache.recording(plan, prepared.request, stream)
            routed.headers.update(plan.headers)
        routed.headers.update(ticket.headers)
        return _marked(dataclasses.replace(routed, value=stream), prepared.guard_hits)

    async def _guarded_replay(self, prepared: Prepared) -> Routed[Any]:
        """A cached (or configured) answer passes the output policies too: it was stored under
        the policies of its day, which may have changed since."""
        routed: Routed[Any] = prepared.answered  # type: ignore[assignment]
        hits = prepared.guard_hits
        if self.guard is None or hits is None:
            return routed
        model = prepared.model.name
        if prepared.request.is_stream:
            value = self.guard.stream(routed.value, prepared.request, model, hits, lambda: None)
        else:
            value, _ = await self.guard.check_answer(routed.value, prepared.request, model, hits)
        return _marked(dataclasses.replace(routed, value=value), hits)


def _logged_prompt(request: ClientRequest, record: RequestRecord) -> str:
    """A content log shows the prompt as redacted by the guardrails, never the original."""
    return record.redacted_prompt if record.redacted_prompt is not None else prompt_text(request)


def _marked(routed: Routed[Any], hits: GuardHits | None) -> Routed[Any]:
    """The answer with the ``x-titan-guardrails`` header naming the policies that matched so
    far (a stream's own output matches come too late for a header: metric and log only)."""
    if hits is not None:
        routed.headers.update(hits.headers())
    return routed


def _not_storable(plan: CachePlan | None) -> None:
    """A blocked answer is neither stored nor compared with a cached one."""
    if plan is not None:
        plan.is_storable = False
        plan.lookup.verification = None


def _status_of(exc: BaseException) -> tuple[int, str | None]:
    if isinstance(exc, TitanError):
        return exc.status_code, exc.code or exc.error_type
    if isinstance(exc, asyncio.CancelledError):
        return CLIENT_CLOSED_REQUEST, "client_closed"
    return 500, "internal_error"


async def _observed(
    stream: AsyncIterator[Answer],
    record: RequestRecord,
    observer: RequestObserver,
    content: dict[str, str] | None,
) -> AsyncIterator[Answer]:
    """The stream, timing its chunks and reporting its record when it ends."""
    try:
        async for chunk in stream:
            usage = usage_of(chunk)
            if usage is not None:
                record.prompt_tokens, record.completion_tokens = usage
                if record.is_timed:
                    record.total_s = record.elapsed()
                    chunk = timed_answer(chunk, record)
            else:
                record.chunk()
            yield chunk
    except BaseException as exc:
        record.failed(*_status_of(exc))
        raise
    finally:
        await close_stream(stream)
        observer.report(record, content)


def _canned(request: ClientRequest, model: RoutedModel, reply: str) -> Routed[Any]:
    value: Any = (
        canned_stream(request, model.name, reply)
        if request.is_stream
        else canned_answer(request, model.name, reply)
    )
    return Routed(value, model.name, "degraded", 0, {"x-titan-degraded": "cache_only"})


async def _metered(
    stream: AsyncIterator[Answer], meter: StreamMeter, gate: Gatekeeper, ticket: Ticket
) -> AsyncIterator[Answer]:
    """The stream, finishing its admission ticket when it ends (or the client leaves)."""
    try:
        async for chunk in stream:
            meter.see(chunk)
            yield chunk
    finally:
        await close_stream(stream)
        await gate.finish(ticket, meter.result(), is_served=meter.num_chunks > 0)
