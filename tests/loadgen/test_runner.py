"""The load generator against real HTTP servers of known behaviour: the simulator (whose plans
are known in advance from its seed), a backend of fixed capacity, a closed port."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.loadgen.servers import CapacityBackend, serving, simulator
from titan.config import SimulationProfile
from titan.loadgen import (
    NOT_SENT,
    ClosedLoop,
    LoadTarget,
    OpenLoop,
    run_load,
    run_load_sync,
    summarize,
    workload_by_name,
)
from titan.loadgen.metrics import percentile
from titan.simulate.behaviour import Simulation

pytestmark = pytest.mark.slow  # real servers (each starts in ~10 ms)

NUM_REQUESTS = 40
# A fixed spread of latencies: a quarter of the requests (by the seed) are 4× slower.
SPIKY = SimulationProfile(seed=3, ttft_s=0.02, inter_token_s=0.005, output_tokens=5,
                          spike_probability=0.25, spike_multiplier=4.0)  # fmt: skip
# What the client adds on top of the server's plan: loopback, parsing, a thread's GIL.
SLACK_S = 0.012


def planned(profile: SimulationProfile, count: int) -> dict[str, list[float]]:
    """The simulator's own plans for its first ``count`` requests: what a perfect client sees."""
    simulation = Simulation(profile, now=lambda: 0.0)
    plans = [simulation.plan(64) for _ in range(count)]
    return {
        "ttft": [p.ttft_s for p in plans],
        "e2e": [p.finish_s for p in plans],
        "tpot": [p.inter_token_s for p in plans],
        "itl": [p.inter_token_s for p in plans for _ in range(p.num_output_tokens - 1)],
    }


def assert_close(measured: dict, expected: list[float], slack_s: float = SLACK_S) -> None:
    for q in (50, 90, 99):
        want = percentile(expected, q)
        got = measured[f"p{q}"]
        assert want - 0.002 <= got <= want + slack_s, f"p{q}: {got:.4f} vs {want:.4f}"


def test_stream_percentiles_match_the_simulators_plans():
    with simulator(SPIKY) as url:
        run = run_load_sync(
            LoadTarget(url, "sim-model"),
            ClosedLoop(8),
            workload_by_name("chat", max_tokens=64),
            num_requests=NUM_REQUESTS,
        )
    summary = summarize(run)
    assert summary["num_ok"] == NUM_REQUESTS
    assert all(s.output_tokens == 5 and len(s.itl_s) == 4 for s in run.samples)  # exact counts
    assert all(s.prompt_tokens > 0 for s in run.samples)
    expected = planned(SPIKY, NUM_REQUESTS)
    assert expected["ttft"] != sorted(expected["ttft"])[::-1]  # spikes and not: a real spread
    assert_close(summary["ttft_s"], expected["ttft"])
    assert_close(summary["e2e_s"], expected["e2e"])
    assert_close(summary["tpot_s"], expected["tpot"], slack_s=0.004)
    # Single gaps jitter with the event loops' millisecond timers; the median holds.
    assert summary["itl_s"]["p50"] == pytest.approx(percentile(expected["itl"], 50), abs=0.002)
    assert summary["output_throughput"] == pytest.approx(5 * summary["request_throughput"])


def test_whole_answers_time_to_the_answer():
    with simulator(SPIKY) as url:
        run = run_load_sync(
            LoadTarget(url + "/v1", "m"),
            ClosedLoop(4),
            workload_by_name("chat", stream=False).as_completions(),
            num_requests=NUM_REQUESTS,
        )
    summary = summarize(run)
    assert summary["num_ok"] == NUM_REQUESTS and summary["total_output_tokens"] == 5 * 40
    assert all(s.ttft_s == s.e2e_s and s.itl_s == () for s in run.samples)
    assert summary["tpot_s"]["p50"] is None and summary["itl_s"]["p50"] is None
    assert_close(summary["e2e_s"], planned(SPIKY, NUM_REQUESTS)["e2e"])


def test_open_loop_keeps_its_schedule_and_counts_its_samples():
    seen = []
    with simulator(SimulationProfile(ttft_s=0.001, output_tokens=2)) as url:
        run = run_load_sync(
            LoadTarget(url, "m"),
            OpenLoop(200, seed=1),
            workload_by_name("chat"),
            duration_s=1.0,
            on_sample=seen.append,
        )
    assert len(seen) == len(run.samples) and set(seen) == set(run.samples)
    assert 150 <= len(run.samples) <= 250  # Poisson at 200/s for 1 s
    assert all(s.is_ok for s in run.samples)
    assert max(s.sent_s for s in run.samples) < 1.0 and run.max_send_lag_s < 0.05
    assert run.num_connections < 50  # keep-alive connections are reused


def test_a_closed_loop_sends_exactly_num_requests():
    with simulator(SimulationProfile(ttft_s=0.001, output_tokens=2)) as url:
        run = run_load_sync(
            LoadTarget(url, "m"),
            ClosedLoop(3),
            workload_by_name("chat"),
            num_requests=10,
            duration_s=30,
        )
    assert len(run.samples) == 10 and run.max_in_flight == 3 and run.wall_s < 5


def test_requests_beyond_the_in_flight_cap_are_not_sent():
    with serving(CapacityBackend(capacity=100, service_s=0.3), lifespan="off") as url:
        run = run_load_sync(
            LoadTarget(url, "m"),
            OpenLoop(500, seed=2),
            workload_by_name("chat", stream=False),
            duration_s=0.2,
            max_in_flight=5,
        )
    summary = summarize(run)
    assert run.max_in_flight == 5 and summary["num_ok"] == 5
    assert summary["num_not_sent"] == summary["num_requests"] - 5 > 50
    assert summary["error_reasons"] == {NOT_SENT: summary["num_not_sent"]}


def test_server_errors_refusals_and_timeouts_become_failed_samples():
    failing = SimulationProfile(error_probability=1.0, error_burst_s=60, error_status=503)
    with simulator(failing) as url:
        errors = run_load_sync(
            LoadTarget(url, "m"), ClosedLoop(2), workload_by_name("chat"), num_requests=6
        )
    assert summarize(errors)["errors"] == {"503": 6}
    assert all(s.ttft_s is None and s.error == "503 Service Unavailable" for s in errors.samples)

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = run_load_sync(
        LoadTarget(f"http://127.0.0.1:{port}", "m"),
        ClosedLoop(2),
        workload_by_name("chat"),
        num_requests=4,
    )
    assert {(s.status, s.error) for s in refused.samples} == {(0, "ConnectionRefusedError")}

    with serving(CapacityBackend(capacity=1, service_s=0.5), lifespan="off") as url:
        slow = run_load_sync(
            LoadTarget(url, "m"),
            ClosedLoop(2),
            workload_by_name("chat"),
            num_requests=2,
            timeout_s=0.1,
        )
    assert [s.error for s in slow.samples] == ["timeout", "timeout"]
    assert all(0.09 <= s.e2e_s < 0.4 for s in slow.samples)  # the loop's clock: ms


def test_an_on_sample_error_is_raised_after_the_run():
    def explode(sample: object) -> None:
        raise RuntimeError("progress bar broke")

    profile = SimulationProfile(ttft_s=0.001, output_tokens=2)
    with simulator(profile) as url, pytest.raises(RuntimeError, match="progress bar broke"):
        run_load_sync(
            LoadTarget(url, "m"),
            OpenLoop(100),
            workload_by_name("chat"),
            num_requests=5,
            on_sample=explode,
        )


def test_a_run_needs_a_stopping_rule():
    with pytest.raises(ValueError, match="duration_s or num_requests"):
        run_load_sync(
            LoadTarget("http://127.0.0.1:1", "m"), ClosedLoop(1), workload_by_name("chat")
        )
    with pytest.raises(ValueError, match="infinite rate"):
        run_load_sync(
            LoadTarget("http://127.0.0.1:1", "m"),
            OpenLoop(float("inf")),
            workload_by_name("chat"),
            duration_s=1,
        )


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    """A server that closes every connection after one answer without saying so (as an idle
    timeout does): the next request on it goes again on a fresh connection, and succeeds."""
    answer = b'{"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        run = await run_load(
            LoadTarget(f"http://127.0.0.1:{port}", "m"),
            ClosedLoop(1),
            workload_by_name("chat", stream=False),
            num_requests=4,
        )
    assert [s.status for s in run.samples] == [200] * 4
    assert run.num_connections >= 4  # each request after the first replaced a stale one
