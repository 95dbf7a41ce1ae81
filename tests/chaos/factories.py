"""Small scenarios and synthetic observations for the chaos tests."""

from __future__ import annotations

import copy
from typing import Any

from titan.chaos.records import RequestRecord


def scenario_data(**changes: Any) -> dict[str, Any]:
    """A valid scenario as a YAML document would give it; ``changes`` replace top-level keys."""
    data: dict[str, Any] = {
        "name": "tiny",
        "description": "two simulated backends behind one Titan",
        "duration_s": 10,
        "backends": [
            {"name": "a", "simulated": {"ttft_s": 0.01}},
            {"name": "b", "simulated": {"ttft_s": 0.01}},
        ],
        "titan": {
            "config": {"models": [{"name": "chat", "deployments": [{"upstream": "a"},
                                                                   {"upstream": "b"}]}]}
        },
        "load": {"model": "chat", "rate": 10},
        "faults": [
            {"id": "slow", "at_s": 2, "kind": "latency_spike", "target": "b", "duration_s": 3,
             "multiplier": 5},
        ],
        "assertions": ["p99_ttft_ms <= 500"],
    }  # fmt: skip
    data = copy.deepcopy(data)
    data.update(changes)
    return data


def request(
    sent_s: float,
    outcome: str = "ok",
    *,
    ttft_s: float | None = 0.1,
    e2e_s: float = 0.2,
    model: str = "chat",
    tpot_s: float | None = None,
) -> RequestRecord:
    return RequestRecord(
        sent_s=sent_s,
        outcome=outcome,
        e2e_s=e2e_s,
        ttft_s=ttft_s if outcome in ("ok", "stream") else None,
        tpot_s=tpot_s,
        itl_s=(0.01, 0.02) if outcome == "ok" else (),
        model=model,
        replica="titan-1",
    )
