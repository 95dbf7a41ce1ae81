"""Admission: who is asking, whether they may, and whether there is room.

Order per request: authenticate the key → check the key's policy (model allowed, budget) →
degrade if the model is overloaded → reserve the rate/token/concurrency limits → wait in the
model's admission queue. ``Ticket.finish`` gives everything back and records the usage.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from titan.config import TitanConfig
from titan.config.admission import PRIORITIES, Budget, Limits, Priority
from titan.errors import (
    InvalidRequestError,
    PermissionDeniedError,
    QuotaExceededError,
    StorageUnavailableError,
    TitanError,
)
from titan.limits.degradation import Degradation, DegradationController
from titan.limits.keys import ApiKey
from titan.limits.queue import AdmissionQueue, Admitted
from titan.limits.rates import RateLimiter, Reservation, Scope
from titan.limits.usage import Usage, UsageLedger, cost_usd
from titan.limits.usage_buffer import UsageBuffer
from titan.observability.metrics import TitanMetrics
from titan.protocol import ClientRequest
from titan.service.authentication import Authenticator
from titan.service.storage_health import StorageHealth
from titan.storage.base import Storage

logger = logging.getLogger("titan.admission")

# Prompt tokens are estimated before the call at this many characters a token (no tokenizer for
# upstream models); the settlement corrects the estimate with the actual count.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Caller:
    key: ApiKey | None
    client_host: str | None
    priority: Priority

    @property
    def tenant(self) -> str | None:
        return self.key.tenant if self.key is not None else None


@dataclass
class Ticket:
    """What an admitted request holds: its limits reservation and its queue slot."""

    caller: Caller
    model: str
    reservation: Reservation
    queue: AdmissionQueue
    admitted: Admitted
    degradation: Degradation
    headers: dict[str, str] = field(default_factory=dict)
    is_finished: bool = False


class Gatekeeper:
    def __init__(
        self,
        config: TitanConfig,
        storage: Storage,
        metrics: TitanMetrics,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.storage = storage
        self.metrics = metrics
        self._now = now
        self.storage_health = StorageHealth(storage, metrics, now=now)
        # Limits and budgets while the store is unreachable: admit without them, or refuse.
        self.is_fail_open = config.admission.on_storage_error == "fail_open"
        self.auth = Authenticator(config, storage, self.storage_health, now=now)
        self.usage = UsageLedger(storage.counters)
        self.pending_usage = UsageBuffer(
            self.usage,
            on_error=lambda exc: self.storage_health.failed(
                "usage", exc, action="keeps usage in memory and retries every second"
            ),
        )
        self.limiter = RateLimiter(storage.limits, lease_ttl_s=config.admission.lease_ttl_s)
        self.queues: dict[str, AdmissionQueue] = {}
        self._model_configs = {m.name: m for m in config.models if m.name is not None}
        self.controllers: dict[str, DegradationController] = {}

    async def start(self, models: dict[str, int | None]) -> None:
        """``models``: each served model's concurrency cap (None: no queue). Refuses to serve a
        non-loopback address without keys (``Authenticator.start``)."""
        admission = self.config.admission
        for name, capacity in models.items():
            self.queues[name] = AdmissionQueue(name, capacity, admission.max_queue, now=self._now)
        for model in self.config.models:
            if model.degradation is not None and model.name in models:
                self.controllers[model.name] = DegradationController(
                    model.degradation, now=self._now
                )
        self._watch_gauges()
        self.pending_usage.start()
        self.limiter.start()  # renews the concurrency leases of running requests
        await self.auth.start()

    def _watch_gauges(self) -> None:
        """Queue and ladder gauges read their live values when scraped: no per-request work."""
        for name, queue in self.queues.items():
            self.metrics.waiting.labels(name).set_function(lambda q=queue: q.num_waiting)
            self.metrics.running.labels(name).set_function(lambda q=queue: q.num_running)
        for name, controller in self.controllers.items():
            level = self.metrics.degradation_level.labels(name)
            level.set_function(lambda c=controller: c.level)

    async def close(self) -> None:
        await self.limiter.close()
        try:
            await self.pending_usage.close()  # the last usage reaches the store
        except StorageUnavailableError:
            logger.error(
                "storage unreachable at shutdown: usage of %d (key, model, hour) groups lost",
                self.pending_usage.num_pending,
            )

    async def authenticate(self, request: ClientRequest) -> Caller:
        key = await self.auth.key_of(request)
        return Caller(key, request.client_host, self._priority(request, key))

    def _priority(self, request: ClientRequest, key: ApiKey | None) -> Priority:
        asked = request.headers.get("x-titan-priority")
        own = key.policy.priority if key is not None else None
        if asked is None:
            return own or self.config.admission.default_priority
        allowed = own or "interactive"
        if asked not in PRIORITIES:
            raise InvalidRequestError(
                f"Invalid x-titan-priority header {asked!r}: use one of {', '.join(PRIORITIES)}."
            )
        # A key may lower its class, never raise it above its policy's.
        return max(asked, allowed, key=PRIORITIES.index)  # type: ignore[return-value]

    def deadline(self, request: ClientRequest) -> float:
        header = request.headers.get("x-titan-deadline")
        if header is None:
            return self._now() + self.config.admission.default_deadline_s
        try:
            seconds = float(header)
        except ValueError:
            seconds = -1.0
        if not (seconds > 0 and math.isfinite(seconds)):
            raise InvalidRequestError(
                f"Invalid x-titan-deadline header {header!r}: give the seconds within which the "
                "answer is still useful, e.g. 'x-titan-deadline: 20'."
            )
        return self._now() + seconds

    # ---- may they ------------------------------------------------------------------------

    async def check_policy(self, caller: Caller, model: str) -> None:
        key = caller.key
        if key is None:
            return
        if key.policy.models and model not in key.policy.models:
            raise PermissionDeniedError(
                f"This API key may not use the model '{model}'; it may use "
                f"{', '.join(key.policy.models)}.",
                code="model_not_allowed",
            )
        budgets: list[tuple[str, str, Budget]] = []
        if key.policy.budget is not None:
            budgets.append((f"key:{key.key_id}", f"key {key.key_id}", key.policy.budget))
        tenant = self.config.tenants.get(key.tenant)
        if tenant is not None and tenant.budget is not None:
            budgets.append((f"tenant:{key.tenant}", f"tenant '{key.tenant}'", tenant.budget))
        if not budgets:
            return
        try:
            if self.pending_usage.has_pending:
                await self.pending_usage.flush()  # this replica's spend, to the last request
            spent_by_scope = [await self.usage.spent_usd(s, b.period) for s, _, b in budgets]
        except StorageUnavailableError as exc:
            self._storage_failed("budget", exc)
            return
        self.storage_health.succeeded("budget")
        for (_, label, budget), spent in zip(budgets, spent_by_scope, strict=True):
            if spent >= budget.usd:
                period = "in all" if budget.period == "total" else f"this {budget.period}"
                raise QuotaExceededError(
                    f"The budget of the {label} is spent: ${spent:.4f} of ${budget.usd:.2f} "
                    f"{period}. Raise the budget or wait for the next period.",
                )

    def degradation(self, model: str, caller: Caller) -> Degradation:
        controller = self.controllers.get(model)
        if controller is None:
            return Degradation()
        degradation = controller.for_request(caller.priority)
        return degradation

    # ---- is there room -------------------------------------------------------------------

    def _scopes(self, caller: Caller, model: str) -> list[Scope]:
        scopes = []
        if caller.key is not None:
            policy = caller.key.policy
            limits = Limits(rpm=policy.rpm, tpm=policy.tpm, max_concurrency=policy.max_concurrency)
            scopes.append(Scope("key", caller.key.key_id, limits))
            tenant = self.config.tenants.get(caller.key.tenant)
            if tenant is not None:
                scopes.append(Scope("tenant", caller.key.tenant, tenant))
        elif caller.client_host is not None:
            scopes.append(Scope("client", caller.client_host, self.config.auth.anonymous))
        model_config = self._model_configs.get(model)
        if model_config is not None:
            scopes.append(Scope("model", model, model_config.limits))
        return scopes

    def estimate_tokens(self, request: ClientRequest, prompt_chars: int) -> int:
        output = request.max_output_tokens or self.config.admission.reserved_output_tokens
        return math.ceil(prompt_chars / CHARS_PER_TOKEN) + output * request.parsed.n

    async def admit(
        self,
        caller: Caller,
        request: ClientRequest,
        model: str,
        prompt_chars: int,
        deadline: float,
        degradation: Degradation,
    ) -> Ticket:
        reserved = self.estimate_tokens(request, prompt_chars)
        lease_id = uuid.uuid4().hex
        try:
            try:
                reservation = await self.limiter.reserve(
                    self._scopes(caller, model), reserved, lease_id
                )
            except StorageUnavailableError as exc:
                self._storage_failed("limits", exc)
                # Failing open: admitted with no limits drawn, so finishing asks the store nothing.
                reservation = Reservation(self.limiter.store, (), (), lease_id, reserved, {})
            else:
                self.storage_health.succeeded("limits")
        except TitanError as exc:
            self.refused(model, exc, caller)
            raise
        queue = self.queues.get(model) or AdmissionQueue(model, None, 0, now=self._now)
        try:
            admitted = await queue.enter(caller.priority, deadline)
        except BaseException as exc:
            await self._finish_reservation(reservation, 0)  # nothing served: refund, free slots
            if isinstance(exc, TitanError):
                self.refused(model, exc, caller)
            raise
        metrics = self.metrics
        metrics.inc(metrics.admitted, model, caller.priority)
        if admitted.wait_s > 0:
            metrics.inc(metrics.queued, model, caller.priority)
        controller = self.controllers.get(model)
        if controller is not None:
            controller.observe_queue_wait(admitted.wait_s)
        headers = dict(reservation.headers)
        if degradation.steps:
            headers["x-titan-degraded"] = ",".join(degradation.actions)
            for action in degradation.actions:
                metrics.inc(metrics.degraded, model, action)
        return Ticket(caller, model, reservation, queue, admitted, degradation, headers)

    def _storage_failed(self, component: str, exc: StorageUnavailableError) -> None:
        """Limits or budgets could not be checked: fail open (go on without them) or closed
        (re-raise: 503 storage_unavailable), as ``admission.on_storage_error`` says."""
        action = "admits requests without them" if self.is_fail_open else "refuses requests (503)"
        self.storage_health.failed(component, exc, action=action)
        if not self.is_fail_open:
            raise exc

    async def _finish_reservation(self, reservation: Reservation, actual: int | None) -> None:
        try:
            await reservation.finish(actual)
        except StorageUnavailableError as exc:  # the leases lapse within lease_ttl_s instead
            self.storage_health.failed("limits", exc, action="lets leases lapse")

    def refused(self, model: str, exc: TitanError, caller: Caller) -> None:
        """One log line and one metric per refusal."""
        self.metrics.inc(self.metrics.refused, model, exc.code or exc.error_type)
        logger.info(
            "refused",
            extra={
                "model": model,
                "reason": exc.code,
                "status": exc.status_code,
                "tenant": caller.tenant,
                "key_id": caller.key.key_id if caller.key else None,
                "priority": caller.priority,
            },
        )

    def snapshot(self, model: str) -> dict[str, object]:
        queue, controller = self.queues.get(model), self.controllers.get(model)
        return {
            "queue": queue.snapshot() if queue is not None else None,
            "degradation": controller.snapshot() if controller is not None else None,
        }

    def observe_first_token(self, ticket: Ticket, seconds: float) -> None:
        controller = self.controllers.get(ticket.model)
        if controller is not None:
            controller.observe_ttft(seconds)

    async def finish(
        self, ticket: Ticket, usage: tuple[int, int] | None, *, is_served: bool
    ) -> None:
        """Free the slot and the limits; settle the tokens with ``usage`` (prompt, completion)
        and record it (an unserved request costs no tokens)."""
        if ticket.is_finished:
            return
        ticket.is_finished = True
        ticket.queue.leave(ticket.admitted, measure=is_served)
        actual = sum(usage) if usage is not None else (None if is_served else 0)
        await self._finish_reservation(ticket.reservation, actual)
        if usage is None:
            return
        prompt_tokens, completion_tokens = usage
        model_config = self._model_configs.get(ticket.model)
        cost = cost_usd(model_config.price if model_config else None, *usage)
        key = ticket.caller.key
        self.pending_usage.add(
            Usage(
                key.key_id if key else None,
                ticket.caller.tenant,
                ticket.model,
                prompt_tokens,
                completion_tokens,
                cost,
            )
        )
        metrics = self.metrics
        tenant = metrics.tenant_label(ticket.caller.tenant)
        metrics.inc(metrics.prompt_tokens, ticket.model, tenant, amount=prompt_tokens)
        metrics.inc(metrics.generation_tokens, ticket.model, tenant, amount=completion_tokens)
        metrics.inc(metrics.cost_usd, ticket.model, tenant, amount=cost)


# The request fields that constrain the output's shape (OpenAI's and vLLM's).
STRUCTURED_OUTPUT_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def relax_structured_output(request: ClientRequest) -> ClientRequest:
    """The degradation step ``relax_structured_output``: the same request without its output
    constraint (response_format other than text, guided_*), so it runs unconstrained; the
    client sees ``x-titan-degraded: relax_structured_output`` and must validate the output."""
    body = request.body
    fields = [name for name in STRUCTURED_OUTPUT_FIELDS if body.get(name) is not None]
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        fields.append("response_format")
    if not fields:
        return request
    updates = {name: None for name in fields if name in type(request.parsed).model_fields}
    return dataclasses.replace(
        request,
        body={name: value for name, value in body.items() if name not in fields},
        parsed=request.parsed.model_copy(update=updates),
    )
