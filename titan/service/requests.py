"""One request's way through the service, one way only:

authenticate → resolve the model (tiers, splits) → apply the key's policy → guard the input →
look up the response cache (a hit is answered here) → degrade → admit (limits, queue) → the
attempt runner → settle the limits and record the usage, guard the output, store the answer.

The steps are steps.py's; complete and stream share ``_run`` and ``_served``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from titan.config import TitanConfig
from titan.observability.records import TIMINGS_HEADER, RequestRecord
from titan.observability.tracing import set_attributes
from titan.protocol import Answer, ClientRequest
from titan.service.accounting import StreamMeter, usage_of
from titan.service.admission import CHARS_PER_TOKEN, Admission, Ticket
from titan.service.attempts import AttemptRunner, Routed
from titan.service.authentication import Authenticator
from titan.service.caching import CachePlan, CacheStep
from titan.service.degradation import DegradationLadders
from titan.service.guard import GuardHits, Guardrails
from titan.service.observing import (
    RequestObserver,
    answer_text,
    logged_prompt,
    observed,
    status_of,
    timed_answer,
)
from titan.service.policy import PolicyCheck
from titan.service.served_models import ServedModels
from titan.service.steps import (
    Prepared,
    admit,
    authenticate,
    deadline_at,
    guard_input,
    look_up_cache,
)
from titan.service.streaming import close_stream


@dataclass(frozen=True)
class Gates:
    """Who may ask and whether there is room: the collaborators of the steps before the runner."""

    auth: Authenticator
    policy: PolicyCheck
    degradation: DegradationLadders
    admission: Admission


class RequestFlow:
    def __init__(
        self,
        config: TitanConfig,
        models: ServedModels,
        gates: Gates,
        cache: CacheStep,
        runner: AttemptRunner,
        observer: RequestObserver,
        *,
        guard: Guardrails | None = None,
        now: Callable[[], float] = time.monotonic,
    ):
        self.models = models
        self.gates = gates
        self.cache = cache
        self.runner = runner
        self.observer = observer
        self.guard = guard if guard is not None and guard.is_active else None
        self._now = now
        self._request_timeout_s = config.server.request_timeout_s
        self._default_deadline_s = config.admission.default_deadline_s

    async def complete(self, request: ClientRequest) -> Routed[Answer]:
        return await self._run(request, is_stream=False)  # type: ignore[no-any-return]

    async def stream(self, request: ClientRequest) -> Routed[AsyncIterator[Answer]]:
        """A started stream: refusals (and retries) happen before the first chunk is handed out.
        Its record is reported when the stream ends (or the client leaves)."""
        return await self._run(request, is_stream=True)  # type: ignore[no-any-return]

    async def _prepare(self, request: ClientRequest, record: RequestRecord) -> Prepared:
        gates, span = self.gates, self.observer.tracer.span
        with span("titan.authenticate"):
            caller = await authenticate(gates.auth, request, record)
        admission_deadline = deadline_at(self._now(), request.deadline_s, self._default_deadline_s)
        with span("titan.route"):
            model, traits = await self.models.resolve(request)
        deadline = deadline_at(self._now(), request.timeout_s, self._request_timeout_s)
        record.model = model.name
        await gates.policy.check(caller, request.model or model.name)
        hits = None
        if self.guard is not None:
            with span("titan.guardrails_input"):
                request, hits = await guard_input(
                    self.guard, request, model.name, record, logs_content=self.observer.logs_content
                )
        with span("titan.cache_lookup"):
            request, plan = await look_up_cache(
                self.cache, request, caller.tenant, model.name, record
            )
        if plan is not None and plan.lookup.hit is not None:
            replay = self.cache.replay(plan, request)
            return Prepared(request, model, traits, deadline, answered=replay, guard_hits=hits)
        degraded = gates.degradation.degrade(caller, request, model, self.models.named)
        request, model = degraded.request, degraded.model
        if degraded.answered is not None:
            return Prepared(request, model, traits, deadline, answered=degraded.answered,
                            guard_hits=hits)  # fmt: skip
        with span("titan.admission", priority=caller.priority):
            ticket = await admit(gates.admission, gates.degradation, caller, degraded, traits,
                                 admission_deadline, record)  # type: ignore[arg-type]  # fmt: skip
        return Prepared(request, model, traits, deadline, ticket, plan, guard_hits=hits)

    async def _run(self, request: ClientRequest, *, is_stream: bool) -> Routed[Any]:
        """Prepare, run and report one request; a stream's record is reported when it ends."""
        record = self.observer.start(request)
        routed: Routed[Any] | None = None
        try:
            with self.observer.request_span(request, record) as span:  # up to the first byte
                prepared = await self._prepare(request, record)
                if prepared.answered is not None:
                    routed = await self._guarded_replay(prepared)
                else:
                    routed = await self._served(prepared, is_stream)
                set_attributes(span, model=record.model, deployment=routed.deployment,
                               attempts=routed.num_attempts)  # fmt: skip
        except BaseException as exc:
            record.failed(*status_of(exc))
            content = None
            if self.observer.logs_content and not is_stream:
                content = {"prompt": logged_prompt(request, record), "answer": ""}
            self.observer.report(record, content)
            raise
        record.first_byte()  # the runner hands a stream over once its first chunk came
        record.deployment, record.num_attempts = routed.deployment, routed.num_attempts
        content = {"prompt": logged_prompt(request, record)} if self.observer.logs_content else None
        if is_stream:
            if record.is_timed:
                routed.headers[TIMINGS_HEADER] = record.timings_header()
            stream = observed(routed.value, record, self.observer, content)
            return dataclasses.replace(routed, value=stream)
        usage = usage_of(routed.value)
        if usage is not None:
            record.prompt_tokens, record.completion_tokens = usage
        if record.is_timed:
            record.total_s = record.elapsed()
            routed.headers[TIMINGS_HEADER] = record.timings_header()
            routed = dataclasses.replace(routed, value=timed_answer(routed.value, record))
        if content is not None:
            content["answer"] = answer_text(routed.value)
        self.observer.report(record, content)
        return routed

    async def _served(self, prepared: Prepared, is_stream: bool) -> Routed[Any]:
        """The runner's answer or started stream, with its admission ticket finished (a stream's
        when it ends), its output guarded and the cache storing it."""
        ticket: Ticket = prepared.ticket  # type: ignore[assignment]
        admission, plan = self.gates.admission, prepared.cache
        forwarded, run = prepared.request, self.runner.complete
        if is_stream:
            run = self.runner.stream  # type: ignore[assignment]
            if plan is not None and plan.is_storable:
                forwarded = forwarded.with_stream_usage()  # a replay carries the original usage
        started = self._now()
        try:
            routed = await run(forwarded, prepared.model, prepared.traits, prepared.deadline)
        except BaseException:
            await admission.finish(ticket, None, is_served=False)
            raise
        self.gates.degradation.observe_first_token(ticket.model, self._now() - started)
        if is_stream:
            routed = self._stream_served(prepared, routed, ticket)
        else:
            routed = await self._answer_served(prepared, routed, ticket)
        if plan is not None:
            routed.headers.update(plan.headers)
        routed.headers.update(ticket.headers)
        return _marked(routed, prepared.guard_hits)

    async def _answer_served(
        self, prepared: Prepared, routed: Routed[Answer], ticket: Ticket
    ) -> Routed[Answer]:
        await self.gates.admission.finish(ticket, usage_of(routed.value), is_served=True)
        is_blocked = False
        if self.guard is not None and prepared.guard_hits is not None:
            answer, is_blocked = await self.guard.check_answer(
                routed.value, prepared.request, prepared.model.name, prepared.guard_hits
            )
            routed = dataclasses.replace(routed, value=answer)
        if prepared.cache is not None and not is_blocked:  # a blocked answer is never replayed
            self.cache.store_whole(prepared.cache, routed.value)
        return routed

    def _stream_served(
        self, prepared: Prepared, routed: Routed[AsyncIterator[Answer]], ticket: Ticket
    ) -> Routed[AsyncIterator[Answer]]:
        plan = prepared.cache
        meter = StreamMeter(-(-prepared.traits.prompt_chars // CHARS_PER_TOKEN))
        stream = _metered(routed.value, meter, self.gates.admission, ticket)
        if self.guard is not None and prepared.guard_hits is not None:
            stream = self.guard.stream(
                stream, prepared.request, prepared.model.name, prepared.guard_hits,
                on_block=lambda: _not_storable(plan),
            )  # fmt: skip
        if plan is not None:
            stream = self.cache.recording(plan, prepared.request, stream)
        return dataclasses.replace(routed, value=stream)

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


async def _metered(
    stream: AsyncIterator[Answer], meter: StreamMeter, admission: Admission, ticket: Ticket
) -> AsyncIterator[Answer]:
    """The stream, finishing its admission ticket when it ends (or the client leaves)."""
    try:
        async for chunk in stream:
            meter.see(chunk)
            yield chunk
    finally:
        await close_stream(stream)
        await admission.finish(ticket, meter.result(), is_served=meter.num_chunks > 0)
