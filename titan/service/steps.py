"""The steps that make a request ready for the attempt runner, each testable alone. RequestFlow
runs them in this order: authenticate → resolve the model → apply policy → guard the input →
look up the cache (a hit is answered) → degrade (DegradationLadders.degrade) → admit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from titan.observability.records import RequestRecord
from titan.protocol import ClientRequest
from titan.router.registry import RequestTraits, RoutedModel
from titan.service.admission import Admission, Ticket
from titan.service.attempts import Routed
from titan.service.authentication import Authenticator, Caller
from titan.service.caching import CachePlan, CacheStep
from titan.service.degradation import DegradationLadders, Degraded
from titan.service.guard import GuardHits, Guardrails
from titan.service.observing import prompt_text


@dataclass
class Prepared:
    """A request ready for the runner, or answered already (``answered``)."""

    request: ClientRequest
    model: RoutedModel
    traits: RequestTraits
    deadline: float | None
    ticket: Ticket | None = None
    cache: CachePlan | None = None
    answered: Routed[Any] | None = None
    guard_hits: GuardHits | None = None  # None: no guardrail policies configured


async def authenticate(
    auth: Authenticator, request: ClientRequest, record: RequestRecord
) -> Caller:
    caller = await auth.caller(request)
    record.tenant, record.priority = caller.tenant, caller.priority
    return caller


def deadline_at(now: float, seconds: float | None, default_s: float | None) -> float | None:
    """When a request's ``seconds`` (from its header, else ``default_s``) run out."""
    seconds = seconds if seconds is not None else default_s
    return None if seconds is None else now + seconds


async def guard_input(
    guard: Guardrails,
    request: ClientRequest,
    model: str,
    record: RequestRecord,
    *,
    logs_content: bool,
) -> tuple[ClientRequest, GuardHits]:
    """The request as the input policies leave it (redacted, or refused), and the policies'
    matches so far. Before the cache: a redacted prompt has its own cache key."""
    hits = guard.hits_for(request)
    checked = await guard.check_input(request, model, hits)
    if checked is not request and logs_content:
        record.redacted_prompt = prompt_text(checked)
    return checked, hits


async def look_up_cache(
    cache: CacheStep, request: ClientRequest, tenant: str | None, model: str, record: RequestRecord
) -> tuple[ClientRequest, CachePlan | None]:
    """The cache's plan for the request (its lookup's hit answers it), and the request without
    Titan's own ``cache`` field, which upstreams such as OpenAI refuse."""
    plan = await cache.lookup(request, tenant, model)
    if plan is not None:
        record.cache = f"hit-{plan.lookup.hit.kind}" if plan.lookup.hit else "miss"
    if "cache" in request.body:
        body = {name: value for name, value in request.body.items() if name != "cache"}
        request = dataclasses.replace(request, body=body)
    return request, plan


async def admit(
    admission: Admission,
    ladders: DegradationLadders,
    caller: Caller,
    degraded: Degraded,
    traits: RequestTraits,
    deadline: float,
    record: RequestRecord,
) -> Ticket:
    """Limits, then the model's queue; the wait feeds the model's degradation ladder."""
    model = degraded.model.name
    ticket = await admission.admit(
        caller, degraded.request, model, traits.prompt_chars, deadline, degraded.degradation
    )
    ladders.observe_queue_wait(model, ticket.admitted.wait_s)
    record.queue_s = ticket.admitted.wait_s
    return ticket
