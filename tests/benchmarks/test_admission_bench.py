"""The admission benchmark: its pieces (the upstream's FIFO, per-point summaries, targets) and,
end to end, its quick variant. No timing thresholds: speed targets belong to the benchmark report,
not to tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from benchmarks import admission_load as load
from benchmarks.admission import (
    BENCHMARK,
    SECTION_END,
    SECTION_START,
    AdmissionSettings,
    targets,
)
from benchmarks.base import measure
from benchmarks.engine_report import SECTION_END as ENGINE_END
from benchmarks.engine_report import SECTION_START as ENGINE_START
from benchmarks.gateway_systems import Workspace
from tests.redis_server import redis_server  # noqa: F401

ENGINE_SECTION = (
    f"# Benchmark results\n\n{ENGINE_START}\n## Engine\n\nkept as it is\n{ENGINE_END}\n"
)
CHAT = {"type": "http", "path": "/v1/chat/completions"}


class _Client:
    """One ASGI request: its body, then a disconnect once ``leave`` is set."""

    def __init__(self, body: bytes):
        self.body, self.leave, self.sent = body, asyncio.Event(), []
        self._has_sent_body = False

    async def receive(self) -> dict:
        if not self._has_sent_body:
            self._has_sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)


async def test_fifo_slots_serve_in_arrival_order_and_let_a_leaving_client_go():
    started, finish = [], asyncio.Event()

    async def app(scope, receive, send):
        started.append((await receive())["body"])
        await finish.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    fifo = load.FifoSlots(app, slots=1)
    first, second, third = _Client(b"1"), _Client(b"2"), _Client(b"3")
    tasks = []
    for client in (first, second, third):
        tasks.append(asyncio.ensure_future(fifo(CHAT, client.receive, client.send)))
        await asyncio.sleep(0.01)
    assert started == [b"1"] and fifo.counts["waiting"] == 2
    second.leave.set()  # leaves while queued: never reaches the app
    await asyncio.sleep(0.01)
    assert fifo.counts["left"] == 1 and fifo.counts["waiting"] == 1 and tasks[1].done()
    finish.set()
    await asyncio.gather(*tasks)
    assert started == [b"1", b"3"]
    assert first.sent[0]["status"] == 200 and third.sent[0]["status"] == 200
    assert second.sent == []

    probe = _Client(b"")
    await fifo({"type": "http", "path": "/fifo"}, probe.receive, probe.send)
    counts = orjson.loads(probe.sent[1]["body"])
    assert counts == {"running": 0, "waiting": 0, "peak_waiting": 2, "served": 2, "left": 1}
    assert fifo.counts["peak_waiting"] == 0  # read: restarted


async def test_the_upstream_answers_after_its_latency_unless_the_client_left():
    app = load.FixedLatency(0.01, "sim")
    staying, leaving = _Client(b"{}"), _Client(b"{}")
    leaving.leave.set()
    await asyncio.gather(app(CHAT, staying.receive, staying.send),
                         app(CHAT, leaving.receive, leaving.send))  # fmt: skip
    assert staying.sent[0]["status"] == 200 and leaving.sent == []
    answer = orjson.loads(staying.sent[1]["body"])
    assert answer["object"] == "chat.completion" and answer["model"] == "sim"
    assert answer["usage"]["completion_tokens"] == 16
    health = _Client(b"")
    await app({"type": "http", "path": "/health"}, health.receive, health.send)
    assert health.sent[0]["status"] == 200


def test_poisson_arrivals_are_seeded_and_inside_the_window():
    arrivals = load.poisson_arrivals(100.0, 2.0, seed=3)
    assert arrivals == load.poisson_arrivals(100.0, 2.0, seed=3)
    assert arrivals != load.poisson_arrivals(100.0, 2.0, seed=4)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals[-1] < 2.0
    assert 120 < len(arrivals) < 280


def test_a_point_tells_goodput_refusals_drops_and_lateness_apart():
    records = [
        (0.0, 0.2, 200, None, 0.0),
        (0.9, 0.3, 200, None, 0.0),  # completes after the window: not in the goodput
        (0.1, 0.002, 503, "queue_full", 0.001),
        (0.2, 0.004, 429, "rate_limit_exceeded", 0.0),
        (0.3, 1.8, 503, "queue_timeout", 0.0),
        (0.4, 2.0, load.TIMED_OUT, None, 0.0),
        (0.5, 0.01, load.TRANSPORT_ERROR, None, 0.0),
        (0.6, 0.01, 500, "internal_error", 0.0),
    ]
    point = load.summarize_point(records, duration_s=1.0)
    assert point["num_requests"] == 8 and point["offered_rps"] == 8.0
    assert point["num_ok"] == 2 and point["num_ok_in_window"] == 1 and point["goodput_rps"] == 1
    assert point["num_refused"] == 2 and point["refusal_latencies_ms"] == pytest.approx([2, 4])
    assert point["num_dropped"] == 1 and point["num_late"] == 1 and point["num_errors"] == 2
    assert point["outcomes"] == {
        "503 queue_full": 1, "429 rate_limit_exceeded": 1, "503 queue_timeout": 1,
        "timeout": 1, "transport": 1, "500 internal_error": 1,
    }  # fmt: skip
    assert point["p50_ms"] == pytest.approx(250.0)
    assert load.summarize_point([], 1.0)["p99_ms"] is None
    assert load.error_code(b'{"error": {"code": "queue_full"}}') == "queue_full"
    assert load.error_code(b"not json") is None


def _point(admission: str, multiplier: float, goodput: float, refusals=()) -> dict:
    return {"admission": admission, "multiplier": multiplier, "goodput_rps": goodput,
            "refusal_latencies_ms": list(refusals)}  # fmt: skip


def test_targets_compare_overload_with_capacity_and_check_the_shared_limit():
    points = [
        _point("on", 1.0, 38.0), _point("on", 3.0, 39.0, [1.0] * 99 + [30.0]),
        _point("off", 1.0, 36.0), _point("off", 3.0, 3.0),
    ]  # fmt: skip
    checks = targets({"goodput": {"points": points}, "replicas": {"error_pct": -2.5}})
    assert [c["passed"] for c in checks] == [True, True, True, False]
    assert checks[0]["value"] == pytest.approx(39 / 38)
    assert checks[1]["value"] == pytest.approx(3 / 36)
    assert checks[2]["value"] < 20 and checks[3]["value"] == 2.5
    assert len(targets({"goodput": {"points": points}, "replicas": None})) == 3


def test_the_default_queue_holds_half_the_deadline_of_waiting():
    settings = AdmissionSettings()
    assert settings.capacity_rps == pytest.approx(40.0)
    assert settings.queue_size == 40  # 8 slots × 1 s / 0.2 s
    assert AdmissionSettings(max_queue=7).queue_size == 7


@pytest.mark.bench_smoke
@pytest.mark.slow
def test_quick_goodput_phase_writes_its_section(tmp_path: Path):
    output = tmp_path / "RESULTS.md"
    output.write_text(ENGINE_SECTION)
    settings = AdmissionSettings.quick(redis_url=None, duration_s=1.0)

    outcome = measure(BENCHMARK, settings, output, command="pytest quick admission bench")

    text = output.read_text()
    assert text.startswith(ENGINE_SECTION.rstrip("\n"))
    assert text.count(SECTION_START) == 1 and text.count(SECTION_END) == 1
    for heading in ("### Targets", "### Goodput under overload", "### Commands and configs"):
        assert heading in text
    assert "Quick variant" in text and "Two replicas" not in text
    assert "PASS" in text or "FAIL" in text

    results = orjson.loads(outcome.json_path.read_bytes())
    assert set(results) == {"meta", "goodput", "replicas", "targets"}
    assert results["meta"]["command"] == "pytest quick admission bench"
    assert results["replicas"] is None and len(results["targets"]) == 3
    points = results["goodput"]["points"]
    assert [(p["admission"], p["multiplier"]) for p in points] == [
        ("on", 1.0), ("on", 3.0), ("off", 1.0), ("off", 3.0)
    ]  # fmt: skip
    for point in points:
        assert point["num_requests"] > 0 and point["num_errors"] == 0
        assert point["num_ok"] > 0 and point["p50_ms"] <= point["p99_ms"]
    assert set(results["goodput"]["configs"]) == {"on", "off"}
    assert results["goodput"]["configs"]["on"]["models"][0]["max_concurrency"] == 8
    assert "max_concurrency" not in results["goodput"]["configs"]["off"]["models"][0]


@pytest.mark.slow
@pytest.mark.redis
def test_two_replicas_share_one_limit_in_a_database_of_their_own(
    tmp_path: Path,
    redis_server: str,  # noqa: F811
):
    import redis

    settings = AdmissionSettings.quick(redis_url=redis_server)
    replicas = load.run_replicas(settings, Workspace(tmp_path), lambda message: None)

    assert replicas["storage"].startswith(redis_server + "/")
    assert (
        replicas["num_admitted"] + replicas["num_refused"] + replicas["num_errors"]
        == (replicas["num_requests"])
    )
    assert replicas["num_admitted"] > 0 and replicas["num_refused"] > 0
    assert sum(replicas["admitted_by_replica"]) == replicas["num_admitted"]
    assert replicas["expected"] == pytest.approx(
        settings.rpm + settings.rpm / 60 * replicas["elapsed_s"]
    )
    assert len(replicas["commands"]) == 2 and replicas["num_keys_deleted"] > 0
    client = redis.Redis.from_url(replicas["storage"])
    try:
        assert client.dbsize() == 0  # its keys and its claim are gone
    finally:
        client.close()
