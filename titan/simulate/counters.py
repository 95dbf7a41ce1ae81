"""What a simulated backend did: the counters tests and chaos runs read (GET /stats, stats())."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from titan.simulate.behaviour import FailureKind, RequestPlan


@dataclass
class SimulationCounters:
    num_requests: int = 0
    num_errors_by_status: dict[int, int] = field(default_factory=dict)
    num_resets: int = 0  # connections dropped before any byte of the answer
    num_cuts: int = 0  # connections dropped mid-answer (an outage began)
    num_spikes: int = 0
    num_stalls: int = 0
    num_active: int = 0  # answers under way, streaming or not
    num_active_streams: int = 0
    num_queued: int = 0  # answers waiting for a slot (max_concurrency), counted in num_active
    num_cancelled: int = 0  # the client went away before the answer ended
    num_completed: int = 0

    def record_plan(self, plan: RequestPlan) -> None:
        self.num_requests += 1
        failure = plan.failure
        if failure is None:
            self.num_spikes += plan.is_spike
            self.num_stalls += plan.is_stall
        elif failure.kind is FailureKind.RESET:
            self.num_resets += 1
        else:
            status = failure.status or 0
            self.num_errors_by_status[status] = self.num_errors_by_status.get(status, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.num_requests,
            "errors": {str(status): n for status, n in sorted(self.num_errors_by_status.items())},
            "resets": self.num_resets,
            "cuts": self.num_cuts,
            "spikes": self.num_spikes,
            "stalls": self.num_stalls,
            "active": self.num_active,
            "active_streams": self.num_active_streams,
            "queued": self.num_queued,
            "cancelled": self.num_cancelled,
            "completed": self.num_completed,
        }
