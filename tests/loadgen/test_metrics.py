"""A run's summary from hand-made samples, every number computed by hand."""

from __future__ import annotations

import orjson
import pytest

from titan.loadgen import NOT_SENT, ClosedLoop, LoadRun, OpenLoop, Sample, Slo, summarize
from titan.loadgen.metrics import tpot_of

STREAM_FAST = Sample(0.0, 200, 1.0, 0.2, 5, 10, (0.2, 0.2, 0.2, 0.2))  # TPOT 0.8 / 4 = 0.2
STREAM_SLOW = Sample(0.5, 200, 2.0, 0.5, 4, 10, (0.5, 0.5, 0.5))  # TPOT 1.5 / 3 = 0.5
WHOLE = Sample(1.0, 200, 0.4, 0.4, 3, 6, ())  # no TPOT
REFUSED = Sample(1.5, 503, 0.01, None, 0, 0, (), "503 Service Unavailable")
RESET = Sample(1.6, 0, 0.0, None, 0, 0, (), "ConnectionResetError")
UNSENT = Sample(2.0, 0, 0.0, None, 0, 0, (), NOT_SENT)
SAMPLES = (STREAM_FAST, STREAM_SLOW, WHOLE, REFUSED, RESET, UNSENT)


def run() -> LoadRun:
    return LoadRun(samples=SAMPLES, wall_s=4.0, arrivals=ClosedLoop(2), max_in_flight=2)


def test_counts_throughputs_and_errors():
    summary = summarize(run())
    assert (summary["num_requests"], summary["num_ok"], summary["num_failed"]) == (6, 3, 3)
    assert summary["num_not_sent"] == 1
    assert summary["errors"] == {"503": 1, "transport": 2}
    assert summary["error_reasons"] == {
        "503 Service Unavailable": 1,
        "ConnectionResetError": 1,
        NOT_SENT: 1,
    }
    assert summary["request_throughput"] == pytest.approx(3 / 4)
    assert summary["output_throughput"] == pytest.approx(12 / 4)  # 5 + 4 + 3, failures excluded
    assert summary["total_token_throughput"] == pytest.approx((12 + 26) / 4)
    assert summary["mean_concurrency"] == pytest.approx((1.0 + 2.0 + 0.4 + 0.01) / 4)
    assert (summary["arrivals"], summary["load"]) == ({"kind": "closed", "concurrency": 2}, 2.0)
    orjson.dumps(summary)  # JSON-ready


def test_latency_percentiles():
    summary = summarize(run())
    ttft = summary["ttft_s"]  # over the answered: 0.2, 0.4, 0.5
    assert ttft["mean"] == pytest.approx(1.1 / 3)
    assert ttft["p50"] == pytest.approx(0.4)
    assert ttft["p90"] == pytest.approx(0.4 + 0.8 * 0.1)  # rank 1.8 between 0.4 and 0.5
    assert ttft["max"] == pytest.approx(0.5)
    assert summary["tpot_s"]["mean"] == pytest.approx(0.35)
    assert summary["tpot_s"]["p50"] == pytest.approx(0.35)
    itl = summary["itl_s"]  # every gap pooled: four of 0.2, three of 0.5
    assert itl["mean"] == pytest.approx(2.3 / 7)
    assert itl["p50"] == pytest.approx(0.2)
    assert itl["p99"] == pytest.approx(0.5)
    assert summary["e2e_s"]["p50"] == pytest.approx(1.0)
    assert set(ttft) == {"mean", "p50", "p90", "p95", "p99", "max"}


def test_tpot_definition():
    assert tpot_of(STREAM_FAST) == pytest.approx(0.2)
    assert tpot_of(WHOLE) is None  # a whole answer has no time per output token
    assert tpot_of(REFUSED) is None
    assert tpot_of(Sample(0, 200, 1.0, 0.5, 1, 1, ())) is None  # a single token


@pytest.mark.parametrize(
    ("slo", "num_good"),
    [
        (None, 3),  # no SLO: every answer counts
        (Slo(ttft_s=0.3, tpot_s=0.3), 1),  # only the fast stream
        (Slo(tpot_s=0.3), 2),  # the fast stream, and the whole answer (no TPOT to judge)
        (Slo(e2e_s=1.0), 2),  # 1.0 and 0.4 (at the limit counts)
        (Slo(ttft_s=10, tpot_s=10, e2e_s=10), 3),  # failures never meet it
    ],
)
def test_goodput_and_attainment(slo: Slo | None, num_good: int):
    summary = summarize(run(), slo)
    assert summary["goodput"] == pytest.approx(num_good / 4)
    assert summary["slo_attainment"] == pytest.approx(num_good / 6)


def test_an_empty_run():
    summary = summarize(LoadRun((), 0.0, OpenLoop(5)))
    assert summary["num_requests"] == 0 and summary["slo_attainment"] is None
    assert summary["request_throughput"] == 0.0 and summary["ttft_s"]["p50"] is None
    assert summary["arrivals"] == {"kind": "open", "rate": 5, "burstiness": 1.0, "seed": 0}
