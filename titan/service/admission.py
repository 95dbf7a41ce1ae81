"""Admission: whether there is room. Reserve the rate, token and concurrency limits, then wait in
the model's admission queue; ``finish`` gives everything back, settles the tokens and records the
usage. Who is asking is authentication.py's, whether they may policy.py's, and whether the model
is overloaded degradation.py's.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from titan.config import TitanConfig
from titan.config.admission import Limits
from titan.errors import StorageUnavailableError, TitanError
from titan.limits.degradation import Degradation
from titan.limits.queue import AdmissionQueue, Admitted
from titan.limits.rates import RateLimiter, Reservation, Scope
from titan.limits.usage import Usage, cost_usd
from titan.limits.usage_buffer import UsageBuffer
from titan.observability.metrics import TitanMetrics
from titan.protocol import ClientRequest
from titan.service.authentication import Caller
from titan.service.storage_health import StorageHealth, fail_open_or_raise
from titan.storage.base import LimitStore

logger = logging.getLogger("titan.admission")

# Prompt tokens are estimated before the call at this many characters a token (no tokenizer for
# upstream models); the settlement corrects the estimate with the actual count.
CHARS_PER_TOKEN = 4


@dataclass
class Ticket:
    """What an admitted request holds: its limits reservation and its queue slot."""

    caller: Caller
    model: str
    reservation: Reservation
    queue: AdmissionQueue
    admitted: Admitted
    headers: dict[str, str] = field(default_factory=dict)
    is_finished: bool = False


class Admission:
    def __init__(
        self,
        config: TitanConfig,
        limits: LimitStore,
        pending_usage: UsageBuffer,
        metrics: TitanMetrics,
        storage_health: StorageHealth,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.metrics = metrics
        self.storage_health = storage_health
        self._now = now
        # Limits while the store is unreachable: admit without them, or refuse.
        self.is_fail_open = config.admission.on_storage_error == "fail_open"
        self.pending_usage = pending_usage  # recorded here, flushed to the ledger every second
        self.limiter = RateLimiter(limits, lease_ttl_s=config.admission.lease_ttl_s)
        self.queues: dict[str, AdmissionQueue] = {}
        self._model_configs = {m.name: m for m in config.models if m.name is not None}

    def start(self, models: dict[str, int | None]) -> None:
        """``models``: each served model's concurrency cap (None: no queue)."""
        admission = self.config.admission
        for name, capacity in models.items():
            queue = AdmissionQueue(name, capacity, admission.max_queue, now=self._now)
            self.queues[name] = queue
            # Read when scraped: no per-request work.
            self.metrics.waiting.labels(name).set_function(lambda q=queue: q.num_waiting)
            self.metrics.running.labels(name).set_function(lambda q=queue: q.num_running)
        self.pending_usage.start()
        self.limiter.start()  # renews the concurrency leases of running requests

    async def close(self) -> None:
        await self.limiter.close()
        try:
            await self.pending_usage.close()  # the last usage reaches the store
        except StorageUnavailableError:
            logger.error(
                "storage unreachable at shutdown: usage of %d (key, model, hour) groups lost",
                self.pending_usage.num_pending,
            )

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
                fail_open_or_raise(
                    self.storage_health, "limits", exc, is_fail_open=self.is_fail_open
                )
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
        headers = dict(reservation.headers)
        if degradation.steps:
            headers["x-titan-degraded"] = ",".join(degradation.actions)
            for action in degradation.actions:
                metrics.inc(metrics.degraded, model, action)
        return Ticket(caller, model, reservation, queue, admitted, headers)

    async def _finish_reservation(self, reservation: Reservation, actual: int | None) -> None:
        try:
            await reservation.finish(actual)
        except StorageUnavailableError as exc:  # the leases lapse within lease_ttl_s instead
            self.storage_health.failed("limits", exc, action="lets leases lapse")

    def refused(self, model: str, exc: TitanError, caller: Caller) -> None:
        log_refusal(self.metrics, model, exc, caller)

    def queue_snapshot(self, model: str) -> dict[str, object] | None:
        queue = self.queues.get(model)
        return queue.snapshot() if queue is not None else None

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


def log_refusal(metrics: TitanMetrics, model: str, exc: TitanError, caller: Caller) -> None:
    """One log line and one metric per refusal (admission's, or a cache-only degradation's)."""
    metrics.inc(metrics.refused, model, exc.code or exc.error_type)
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
