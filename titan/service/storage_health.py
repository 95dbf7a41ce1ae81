"""The shared storage's reachability as the request path sees it: which components are failing
(one log line when an outage starts and one when it ends, per component), a counter of the failed
calls, and a cached PING for /ready."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from titan.errors import StorageUnavailableError
from titan.observability.metrics import TitanMetrics
from titan.storage.base import Storage

logger = logging.getLogger("titan.storage")

# /ready pings the store at most this often: a load balancer's probes cost Redis nothing.
PING_INTERVAL_S = 1.0


class StorageHealth:
    def __init__(
        self,
        storage: Storage | None,
        metrics: TitanMetrics,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.storage = storage
        self.metrics = metrics
        self._now = now
        self.failing: set[str] = set()
        self._pinged_at = -float("inf")
        self._ping_error: str | None = None

    def failed(self, component: str, exc: BaseException, *, action: str) -> None:
        """A call of ``component`` found the store unreachable; ``action``: what it did instead."""
        self.metrics.inc(self.metrics.storage_errors, component)
        if component not in self.failing:
            self.failing.add(component)
            logger.warning(
                "storage unreachable: %s %s until it returns",
                component,
                action,
                extra={"component": component, "error": str(exc)},
            )

    def succeeded(self, component: str) -> None:
        if component in self.failing:
            self.failing.discard(component)
            logger.info("storage reachable again: %s", component, extra={"component": component})

    async def unreachable_reason(self) -> str | None:
        """Why the store cannot be reached (None: it can, or it is in this process), from a
        PING at most once per ``PING_INTERVAL_S``."""
        ping = self.storage.ping if self.storage is not None else None
        if ping is None:
            return None
        now = self._now()
        if now - self._pinged_at < PING_INTERVAL_S:
            return self._ping_error
        self._pinged_at = now
        try:
            await ping()
        except StorageUnavailableError as exc:
            if self._ping_error is None:
                self.failed("ready", exc, action="reported not ready")
            self._ping_error = exc.message
        else:
            if self._ping_error is not None:
                self.succeeded("ready")
            self._ping_error = None
        return self._ping_error


def fail_open_or_raise(
    health: StorageHealth, component: str, exc: StorageUnavailableError, *, is_fail_open: bool
) -> None:
    """Limits or budgets could not be checked: fail open (go on without them) or closed
    (re-raise: 503 storage_unavailable), as ``admission.on_storage_error`` says."""
    action = "admits requests without them" if is_fail_open else "refuses requests (503)"
    health.failed(component, exc, action=action)
    if not is_fail_open:
        raise exc
