"""The admission queue in front of one model on this replica.

At most ``capacity`` requests run at once; the rest wait, ordered by priority class (interactive,
normal, batch) and then arrival, up to ``max_queue`` of them. A request is refused at once when the
queue is full or when its predicted wait plus its predicted service time passes its deadline; a
queued request whose deadline can no longer be met is dropped before it costs backend work.

The prediction comes from the live service rate: with ``capacity`` slots and a mean service time
``S`` (an EWMA of the time requests held a slot), the queue drains ``capacity / S`` requests a
second, so a request with ``n`` requests ahead of it waits about ``(n + 1) · S / capacity``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from titan.config.admission import PRIORITIES, Priority
from titan.errors import OverloadedError

# Weight of the newest service time in the EWMA: ~20 requests of memory.
SERVICE_TIME_ALPHA = 0.1
# The queue aims to finish this share of a request's time budget early (at least MIN_HEADROOM_S):
# parsing, the network and the response itself happen outside the slot it measures.
HEADROOM_SHARE = 0.1
MIN_HEADROOM_S = 0.02


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    deadline: float = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


@dataclass
class Admitted:
    """A held slot (``wait_s``: how long the request queued); give it back with ``leave``."""

    started_at: float
    wait_s: float
    is_left: bool = False


class AdmissionQueue:
    def __init__(
        self,
        name: str,
        capacity: int | None,
        max_queue: int,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.capacity = capacity  # None: no cap, nothing ever waits
        self.max_queue = max_queue
        self._now = now
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self.num_running = 0
        self.num_waiting = 0  # live waiters (the heap may still hold abandoned ones)
        self.service_time_s: float | None = None

    # ---- prediction ----------------------------------------------------------------------

    def _ahead_of(self, rank: int) -> int:
        """Live waiters that would be served before a new arrival of this rank."""
        return sum(1 for w in self._waiters if w.rank <= rank and not w.granted.done())

    def num_waiting_before(self, priority: Priority) -> int:
        """Live waiters of a higher class than ``priority`` (interactive and normal ones, for
        batch): jobs hold back while any wait."""
        return self._ahead_of(PRIORITIES.index(priority) - 1)

    def predicted_wait_s(self, priority: Priority) -> float:
        """Seconds a request of this class arriving now would queue (0 with a free slot)."""
        if self.capacity is None or (self.num_running < self.capacity and not self.num_waiting):
            return 0.0
        if self.service_time_s is None:
            return 0.0  # nothing measured yet: no basis to refuse
        ahead = self._ahead_of(PRIORITIES.index(priority))
        return (ahead + 1) * self.service_time_s / self.capacity

    # ---- entering and leaving ------------------------------------------------------------

    async def enter(self, priority: Priority, deadline: float) -> Admitted:
        """Wait for a slot. Raises OverloadedError (503, Retry-After) when refused or dropped."""
        arrived = self._now()
        if self.capacity is None or (self.num_running < self.capacity and not self.num_waiting):
            self.num_running += 1
            return Admitted(arrived, 0.0)
        if self.num_waiting >= self.max_queue:
            raise OverloadedError(
                f"Model '{self.name}' is overloaded: {self.num_running} requests running and "
                f"{self.num_waiting} queued, the most it queues. Retry shortly.",
                retry_after=self._retry_after(),
                code="queue_full",
            )
        predicted = self.predicted_wait_s(priority)
        service = self.service_time_s or 0.0
        headroom = max(MIN_HEADROOM_S, HEADROOM_SHARE * (deadline - arrived))
        target = deadline - headroom  # when the answer should be done
        if arrived + predicted + service > target:
            raise OverloadedError(
                f"Model '{self.name}' cannot answer within this request's deadline "
                f"({deadline - arrived:.1f}s): the predicted queue wait is {predicted:.1f}s and "
                f"a request takes about {service:.1f}s. Retry later or give a longer "
                "x-titan-deadline.",
                retry_after=max(predicted, 1.0),
                code="deadline_unreachable",
            )
        waiter = _Waiter(
            PRIORITIES.index(priority),
            next(self._seq),
            deadline,
            asyncio.get_running_loop().create_future(),
        )
        heapq.heappush(self._waiters, waiter)
        self.num_waiting += 1
        try:
            # Dropped once the request can no longer finish in time: no backend work is wasted.
            await asyncio.wait_for(
                asyncio.shield(waiter.granted), max(0.0, target - arrived - service)
            )
        except TimeoutError:
            if waiter.granted.done():  # granted in the same instant: keep the slot
                return Admitted(self._now(), self._now() - arrived)
            waiter.granted.cancel()
            self.num_waiting -= 1
            raise OverloadedError(
                f"Model '{self.name}' is overloaded: this request waited "
                f"{self._now() - arrived:.1f}s in the queue and could no longer be answered "
                "within its deadline. Retry later or give a longer x-titan-deadline.",
                retry_after=self._retry_after(),
                code="queue_timeout",
            ) from None
        except asyncio.CancelledError:  # the client left while queued
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release_slot()  # it was handed a slot it will never use
            else:
                waiter.granted.cancel()
                self.num_waiting -= 1
            raise
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Python 3.11's wait_for can return the result of a future that was granted just as
            # the task was cancelled: hand the slot on instead of serving a departed client.
            self._release_slot()
            raise asyncio.CancelledError
        return Admitted(self._now(), self._now() - arrived)

    def leave(self, admitted: Admitted, *, measure: bool = True) -> None:
        """Give the slot back; ``measure``: count its hold time in the service rate (not for
        requests that failed at once)."""
        if admitted.is_left:
            return
        admitted.is_left = True
        if measure:
            held = self._now() - admitted.started_at
            if self.service_time_s is None:
                self.service_time_s = held
            else:
                self.service_time_s += SERVICE_TIME_ALPHA * (held - self.service_time_s)
        self._release_slot()

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = heapq.heappop(self._waiters)
            if not waiter.granted.done():
                self.num_waiting -= 1
                waiter.granted.set_result(None)  # the slot passes straight to it
                return
        self.num_running -= 1

    def _retry_after(self) -> float:
        if not self.capacity or self.service_time_s is None:
            return 1.0
        return max(1.0, (self.num_waiting + 1) * self.service_time_s / self.capacity)

    def snapshot(self) -> dict[str, float | int | None]:
        return {
            "capacity": self.capacity,
            "running": self.num_running,
            "waiting": self.num_waiting,
            "service_time_s": self.service_time_s,
        }
