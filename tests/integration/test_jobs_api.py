"""/v1/jobs over a real server: submit, poll, list, cancel, idempotency, tenancy, a thousand jobs
through the simulated backend, queued jobs surviving a restart, and a cancel that reaches the
embedded engine."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, create_key

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4}


def simulated(ttft_s: float = 0.0, **jobs) -> dict:
    return {
        "models": [{"name": "sim", "deployments": [
            {"backend": "simulated", "profile": {"ttft_s": ttft_s, "output_tokens": 4}}]}],
        "probes": {"enabled": False},
        "jobs": {"poll_s": 0.05, **jobs},
    }  # fmt: skip


def wait_for(client: httpx.Client, job_id: str, states: set[str], timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.02)


def test_submit_poll_list_cancel_and_resubmit():
    config = {**simulated(), "auth": {"master_key": MASTER, "key_cache_s": 0}}
    with running_titan(config) as titan:
        acme, globex = create_key(titan), create_key(titan, tenant="globex")
        client = httpx.Client(base_url=titan, headers={"Authorization": f"Bearer {acme}"})
        other = httpx.Client(base_url=titan, headers={"Authorization": f"Bearer {globex}"})
        with client, other:
            check_the_job_api(client, other)


def check_the_job_api(client: httpx.Client, other: httpx.Client) -> None:
    """Acme's client, and globex's (another tenant)."""
    submitted = client.post("/v1/jobs", json={
        "endpoint": "/v1/chat/completions", "body": CHAT, "priority": 7,
        "idempotency_key": "report-42", "metadata": {"owner": "me"}})  # fmt: skip
    assert submitted.status_code == 202
    job = submitted.json()
    assert job["object"] == "job" and job["status"] in ("queued", "running", "succeeded")
    done = wait_for(client, job["id"], {"succeeded"})
    assert done["status"] == "succeeded" and done["attempts"] == 1
    assert done["result"]["object"] == "chat.completion"
    assert done["result"]["choices"][0]["message"]["content"]
    assert done["priority"] == 7 and done["metadata"] == {"owner": "me"}

    again = client.post("/v1/jobs", json={"endpoint": "/v1/chat/completions", "body": CHAT,
                                          "idempotency_key": "report-42"})  # fmt: skip
    assert again.status_code == 200 and again.json()["id"] == job["id"]
    assert again.headers["x-titan-idempotent-replay"] == "true"

    assert other.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert other.delete(f"/v1/jobs/{job['id']}").status_code == 404
    assert other.get("/v1/jobs").json()["data"] == []
    listed = client.get("/v1/jobs", params={"status": "succeeded", "limit": 5}).json()
    assert [j["id"] for j in listed["data"]] == [job["id"]]
    assert client.get("/v1/jobs", params={"status": "nope"}).status_code == 400

    for bad, param in [
        ({"endpoint": "/v1/embeddings", "body": CHAT}, "endpoint"),
        ({"body": {**CHAT, "stream": True}}, "body.stream"),
        ({"body": {"model": "sim"}}, "body.messages"),
        ({"body": CHAT, "priority": 11}, "priority"),
        ({"body": CHAT, "deadline": "tomorrow"}, "deadline"),
        ({"body": CHAT, "colour": "red"}, "colour"),
    ]:
        refused = client.post("/v1/jobs", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["param"] == param
    # A finished job cannot be cancelled any more: the answer says what it is.
    assert client.delete(f"/v1/jobs/{job['id']}").json()["status"] == "succeeded"


def test_a_thousand_jobs_all_complete():
    with running_titan(simulated(workers=32)) as titan, httpx.Client(base_url=titan) as client:
        ids = [
            client.post("/v1/jobs", json={"body": {**CHAT, "messages": [
                {"role": "user", "content": f"Question number {n}"}]}}).json()["id"]
            for n in range(1000)
        ]  # fmt: skip
        assert len(set(ids)) == 1000
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until nothing is queued or running (cheap pages)
            pending = [client.get("/v1/jobs", params={"status": state, "limit": 1}).json()
                       for state in ("queued", "running")]  # fmt: skip
            if not any(page["data"] for page in pending):
                break
            time.sleep(0.2)
        page = client.get("/v1/jobs", params={"status": "succeeded", "limit": 1000}).json()
        assert {j["id"] for j in page["data"]} == set(ids)
        assert all(j["attempts"] == 1 and j["result"]["choices"] for j in page["data"])


def test_queued_jobs_survive_a_restart(tmp_path, monkeypatch):
    monkeypatch.delenv("TITAN_STORAGE", raising=False)
    storage = f"sqlite:///{tmp_path / 'titan.db'}"
    with running_titan({**simulated(workers=0), "storage": storage}) as titan:
        ids = [httpx.post(f"{titan}/v1/jobs", json={"body": CHAT}).json()["id"] for _ in range(5)]
        time.sleep(0.3)
        assert {httpx.get(f"{titan}/v1/jobs/{i}").json()["status"] for i in ids} == {"queued"}
    restarted = running_titan({**simulated(workers=4), "storage": storage})
    with restarted as titan, httpx.Client(base_url=titan) as client:
        assert {wait_for(client, i, {"succeeded"})["status"] for i in ids} == {"succeeded"}


@pytest.mark.slow
def test_cancelling_a_running_job_aborts_the_engine_request():
    config = {"probes": {"enabled": False}, "jobs": {"poll_s": 0.05}}
    with running_titan(config) as titan, httpx.Client(base_url=titan) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 4000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Count to a million."}]}  # fmt: skip
        job = client.post("/v1/jobs", json={"body": body}).json()
        assert wait_for(client, job["id"], {"running"})["status"] == "running"

        def engine() -> dict:
            deployments = client.get("/stats").json()["models"][model]["deployments"]
            return next(iter(deployments.values()))["backend"]

        deadline = time.monotonic() + 30
        while engine()["num_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine()["num_running"] == 1
        cancelled = client.delete(f"/v1/jobs/{job['id']}").json()
        assert cancelled["cancel_requested"] or cancelled["status"] == "cancelled"
        final = wait_for(client, job["id"], {"cancelled"}, timeout_s=10)
        assert final["status"] == "cancelled" and final["result"] is None
        deadline = time.monotonic() + 5
        while engine()["num_running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = engine()
        assert stats["num_running"] == 0 and stats["num_requests_aborted"] == 1
        assert stats["num_generated_tokens"] < 4000


def test_a_gateway_without_a_worker_exports_the_queue_depth():
    """What an autoscaler of `titan worker` reads: the queued jobs, from a gateway that runs
    none itself (jobs.workers: 0)."""
    with running_titan(simulated(workers=0)) as titan, httpx.Client(base_url=titan) as client:
        for index in range(3):
            body = {**CHAT, "messages": [{"role": "user", "content": f"job {index}"}]}
            assert client.post("/v1/jobs", json={"body": body}).status_code == 202
        deadline = time.monotonic() + 15
        while 'titan_jobs{state="queued"} 3.0' not in client.get("/metrics").text:
            assert time.monotonic() < deadline, client.get("/metrics").text[-2000:]
            time.sleep(0.2)
