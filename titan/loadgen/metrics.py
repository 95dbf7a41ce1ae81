"""A run's summary, with the definitions of vLLM's ``bench serve``:

- TTFT: from sending a request to its first token-bearing chunk (non-streaming: the answer);
- TPOT: per request, (E2E − TTFT) / (output tokens − 1), for streams of at least two
  token-bearing chunks;
- ITL: every gap between consecutive token-bearing chunks of every stream, pooled;
- E2E: from sending to the answer's last byte;
- request throughput: successful requests / wall time (first send to last answer); output
  throughput: their output tokens / wall time;
- goodput: requests meeting every configured SLO / wall time; SLO attainment: their share of
  all requests (a failed or unsent request never meets it; an SLO on TPOT does not apply to a
  request without a TPOT). Without SLOs every successful request meets them.

Percentiles interpolate linearly between closest ranks (numpy's default, as vLLM).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from titan.loadgen.arrivals import ClosedLoop
from titan.loadgen.client import NOT_SENT, TRANSPORT_FAILURE, Sample
from titan.loadgen.runner import LoadRun

PERCENTILES = (50, 90, 95, 99)
MAX_ERROR_REASONS = 10


@dataclass(frozen=True)
class Slo:
    """Per-request service level objectives, in seconds; None: not part of the objective."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def is_met_by(self, sample: Sample) -> bool:
        if not sample.is_ok:
            return False
        if self.ttft_s is not None and (sample.ttft_s is None or sample.ttft_s > self.ttft_s):
            return False
        if self.e2e_s is not None and sample.e2e_s > self.e2e_s:
            return False
        tpot = tpot_of(sample)
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s

    @property
    def is_set(self) -> bool:
        return any(value is not None for value in asdict(self).values())


def tpot_of(sample: Sample) -> float | None:
    """(E2E − TTFT) / (output tokens − 1) of a successful stream with at least two token-bearing
    chunks; None otherwise (a whole answer has no time per output token)."""
    if not sample.is_ok or sample.ttft_s is None or not sample.itl_s:
        return None
    if sample.output_tokens < 2:
        return None
    return (sample.e2e_s - sample.ttft_s) / (sample.output_tokens - 1)


def stats(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 and max (None for each when there are no values)."""
    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "max": None}
    ordered = sorted(values)
    return {
        "mean": sum(ordered) / len(ordered),
        **{f"p{q}": percentile(ordered, q) for q in PERCENTILES},
        "max": ordered[-1],
    }


def _error_key(sample: Sample) -> str:
    if sample.status == TRANSPORT_FAILURE:
        return "transport"
    return str(sample.status) if not 200 <= sample.status < 300 else "stream"


def summarize(run: LoadRun, slo: Slo | None = None) -> dict[str, Any]:
    """The run's numbers, JSON-ready (latencies in seconds)."""
    slo = slo or Slo()
    samples = run.samples
    ok = [s for s in samples if s.is_ok]
    failures = [s for s in samples if not s.is_ok]

    def per_second(count: float) -> float:
        return count / run.wall_s if run.wall_s > 0 else 0.0

    num_good = sum(1 for s in ok if slo.is_met_by(s))
    output_tokens = sum(s.output_tokens for s in ok)
    prompt_tokens = sum(s.prompt_tokens for s in ok)
    tpots = [t for t in map(tpot_of, ok) if t is not None]
    reasons = Counter(s.error or f"status {s.status}" for s in failures)
    arrivals = run.arrivals
    return {
        "arrivals": {
            "kind": "closed" if isinstance(arrivals, ClosedLoop) else "open",
            **asdict(arrivals),
        },
        "load": arrivals.load,
        "num_requests": len(samples),
        "num_ok": len(ok),
        "num_failed": len(failures),
        "num_not_sent": sum(1 for s in failures if s.error == NOT_SENT),
        "errors": dict(Counter(map(_error_key, failures))),
        "error_reasons": dict(reasons.most_common(MAX_ERROR_REASONS)),
        "wall_s": run.wall_s,
        "request_throughput": per_second(len(ok)),
        "output_throughput": per_second(output_tokens),
        "total_token_throughput": per_second(output_tokens + prompt_tokens),
        "goodput": per_second(num_good),
        "slo_attainment": num_good / len(samples) if samples else None,
        "slo": asdict(slo),
        "total_output_tokens": output_tokens,
        "total_prompt_tokens": prompt_tokens,
        # Little's law: the requests in flight on average over the run.
        "mean_concurrency": per_second(sum(s.e2e_s for s in samples)),
        "max_concurrency": run.max_in_flight,
        "max_send_lag_s": run.max_send_lag_s,
        "num_connections": run.num_connections,
        "ttft_s": stats([s.ttft_s for s in ok if s.ttft_s is not None]),
        "tpot_s": stats(tpots),
        "itl_s": stats([gap for s in ok for gap in s.itl_s]),
        "e2e_s": stats([s.e2e_s for s in ok]),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
