"""What a simulation says: TTFT, TPOT and end-to-end percentiles, throughput, batch sizes, and
whether the queue kept growing (the rate is past what the replica can serve)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from titan.planning.simulator import SimResult

# The waiting queue may grow by this share of the requests over the trace before the rate
# counts as more than the replica serves: a stable queue's linear trend is near zero.
SATURATION_GROWTH = 0.05


@dataclass(frozen=True)
class SimSummary:
    num_requests: int  # counted (after the warm-up share)
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    queue_p99_s: float  # arrival to first admission
    requests_per_s: float  # completed, over the whole run
    output_tokens_per_s: float
    mean_seqs_per_step: float
    num_steps: int
    num_preemptions: int
    utilization: float  # busy time / run time
    is_saturated: bool

    def percentile(self, metric: str, q: float) -> float:
        """``metric`` ttft or tpot at q = 50, 90 (ttft only) or 99."""
        return float(getattr(self, f"{metric}_p{q:g}_s"))


def percentile(values: list[float] | np.ndarray, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    known = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    return float(np.percentile(known, q)) if known.size else math.nan


def queue_growth(waiting_at_arrival: list[int]) -> float:
    """The waiting queue's linear trend over the arrivals, in requests (slope × count)."""
    count = len(waiting_at_arrival)
    if count < 4:
        return 0.0
    x = np.arange(count, dtype=float)
    slope = np.polyfit(x, np.asarray(waiting_at_arrival, dtype=float), 1)[0]
    return float(slope * count)


def summarize(result: SimResult, warmup_fraction: float = 0.0) -> SimSummary:
    """Percentiles over the requests after the first ``warmup_fraction`` of arrivals (the
    simulation starts empty, a live replica does not)."""
    skip = int(len(result.ttft_s) * warmup_fraction)
    ttft, tpot, e2e = result.ttft_s[skip:], result.tpot_s[skip:], result.e2e_s[skip:]
    start = result.arrival_s[0] if result.arrival_s else 0.0
    wall = max(result.end_s - start, 1e-12)
    num_tokens = sum(result.num_output_tokens)
    growth = queue_growth(result.waiting_at_arrival)
    return SimSummary(
        num_requests=len(ttft),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p90_s=percentile(ttft, 90),
        ttft_p99_s=percentile(ttft, 99),
        ttft_mean_s=float(np.mean(ttft)) if ttft else math.nan,
        tpot_p50_s=percentile(tpot, 50),
        tpot_p99_s=percentile(tpot, 99),
        e2e_p50_s=percentile(e2e, 50),
        e2e_p99_s=percentile(e2e, 99),
        queue_p99_s=percentile(result.queue_s[skip:], 99),
        requests_per_s=len(result.ttft_s) / wall,
        output_tokens_per_s=num_tokens / wall,
        mean_seqs_per_step=float(np.mean(result.step_seqs)) if result.step_seqs else 0.0,
        num_steps=result.num_steps,
        num_preemptions=result.num_preemptions,
        utilization=result.busy_s / wall,
        is_saturated=growth > max(5.0, SATURATION_GROWTH * len(result.ttft_s)),
    )
