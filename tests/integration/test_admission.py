"""Admission over real HTTP: keys made through the admin API, limits, budgets, usage and metrics,
seen by the official openai SDK against a real uvicorn server."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest

from tests.integration.harness import running_titan

MASTER = "master-secret-for-tests"
MESSAGES = [{"role": "user", "content": "hello"}]


def sim_model(name: str = "sim", **extra) -> dict:
    profile = extra.pop("profile", {"ttft_s": 0.001})
    return {
        "name": name,
        "deployments": [{"backend": "simulated", "profile": profile}],
        **extra,
    }


def admission_config(*models: dict, **sections) -> dict:
    return {
        "models": list(models) or [sim_model()],
        "probes": {"enabled": False},
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        **sections,
    }


def create_key(base_url: str, tenant: str = "acme", **policy) -> str:
    response = httpx.post(
        f"{base_url}/admin/keys",
        json={"tenant": tenant, **policy},
        headers={"Authorization": f"Bearer {MASTER}"},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert "secret_hash" not in body
    return body["key"]


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def chat(base_url: str, key: str, model: str = "sim", **headers) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "max_tokens": 4},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def test_keys_from_the_admin_api_authenticate_limit_and_revoke():
    config = admission_config(sim_model(), sim_model("other"))
    with running_titan(config) as titan:
        assert httpx.post(f"{titan}/admin/keys", json={"tenant": "a"}).status_code == 401
        key = create_key(titan, rpm=3, models=["sim"])

        with (
            client(titan, "sk-titan-000000000000-nope") as stranger,
            pytest.raises(openai.AuthenticationError),
        ):
            stranger.chat.completions.create(model="sim", messages=MESSAGES)
        missing = httpx.post(f"{titan}/v1/chat/completions", json={"messages": MESSAGES})
        assert missing.status_code == 401
        assert "You didn't provide an API key" in missing.json()["error"]["message"]

        with client(titan, key) as sdk:
            answer = sdk.chat.completions.with_raw_response.create(
                model="sim", messages=MESSAGES, max_tokens=4
            )
            assert answer.headers["x-ratelimit-limit-requests"] == "3"
            assert answer.headers["x-ratelimit-remaining-requests"] == "2"
            assert answer.parse().choices[0].message.content

            with pytest.raises(openai.PermissionDeniedError) as denied:
                sdk.chat.completions.create(model="other", messages=MESSAGES)
            assert "may not use the model 'other'" in denied.value.message

        assert chat(titan, key).status_code == 200
        assert chat(titan, key).status_code == 200
        refused = chat(titan, key)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"

        key_id = key.split("-")[2]
        listed = httpx.get(f"{titan}/admin/keys", headers={"Authorization": f"Bearer {MASTER}"})
        assert [k["key_id"] for k in listed.json()["data"]] == [key_id]
        revoked = httpx.delete(
            f"{titan}/admin/keys/{key_id}", headers={"Authorization": f"Bearer {MASTER}"}
        )
        assert revoked.status_code == 200
        after = chat(titan, key)
        assert after.status_code == 401
        assert "revoked" in after.json()["error"]["message"]


def test_token_limits_settle_with_actual_usage_and_usage_is_reported():
    # Each answer uses 16 output tokens of the 1000 reserved: settling gives the rest back, so
    # far more than tpm / 1000 requests fit in the minute.
    config = admission_config(
        sim_model(price={"prompt_per_1m": 1000.0, "completion_per_1m": 2000.0})
    )
    with running_titan(config) as titan:
        key = create_key(titan, tpm=3000)
        with client(titan, key) as sdk:
            for _ in range(6):
                sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=1000)
        huge = httpx.post(
            f"{titan}/v1/chat/completions",
            json={"model": "sim", "messages": MESSAGES, "max_tokens": 5000},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert huge.status_code == 429
        assert huge.json()["error"]["code"] == "tokens_exceeded"
        assert "Lower max_tokens" in huge.json()["error"]["message"]

        usage = httpx.get(
            f"{titan}/v1/usage?granularity=total", headers={"Authorization": f"Bearer {key}"}
        ).json()["data"]
        assert len(usage) == 1
        assert usage[0]["requests"] == 6
        assert usage[0]["completion_tokens"] == 6 * 16
        assert usage[0]["cost_usd"] > 0

        everything = httpx.get(
            f"{titan}/admin/usage?granularity=day&scope=tenant:acme",
            headers={"Authorization": f"Bearer {MASTER}"},
        ).json()["data"]
        assert sum(row["requests"] for row in everything) == 6


def test_a_spent_budget_refuses_with_insufficient_quota():
    config = admission_config(sim_model(price={"completion_per_1m": 1_000_000.0}))
    with running_titan(config) as titan:
        key = create_key(titan, budget={"usd": 20.0, "period": "day"})
        assert chat(titan, key).status_code == 200  # 4 tokens at $1 each: $4
        for _ in range(4):
            chat(titan, key)
        refused = chat(titan, key)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "insufficient_quota"
        assert "budget" in refused.json()["error"]["message"]


def test_anonymous_clients_are_limited_per_ip_and_refusals_are_counted_in_metrics():
    config = admission_config(auth={"anonymous": {"rpm": 2}})
    with running_titan(config) as titan:
        statuses = [chat(titan, "anything").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        metrics = httpx.get(f"{titan}/metrics").text
        assert 'titan_admission_refused_total{model="sim",reason="rate_limit_exceeded"} 1.0' in (
            metrics
        )
        assert 'titan_admission_admitted_total{model="sim",priority="normal"} 2.0' in metrics


def test_interactive_requests_overtake_queued_batch_work_and_hopeless_deadlines_are_refused():
    slow = sim_model(profile={"ttft_s": 0.3}, max_concurrency=1)
    with running_titan(admission_config(slow)) as titan:
        key = create_key(titan, priority="interactive")
        finished: list[str] = []

        def send(label: str, priority: str) -> None:
            response = chat(titan, key, **{"x-titan-priority": priority})
            assert response.status_code == 200, response.text
            finished.append(label)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            first = pool.submit(send, "first", "normal")
            time.sleep(0.1)  # it holds the only slot
            batch = pool.submit(send, "batch", "batch")
            time.sleep(0.05)
            interactive = pool.submit(send, "interactive", "interactive")
            for future in (first, batch, interactive):
                future.result()
        assert finished == ["first", "interactive", "batch"]

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            holder = pool.submit(chat, titan, key)
            time.sleep(0.05)
            hopeless = chat(titan, key, **{"x-titan-deadline": "0.2"})
            holder.result()
        assert hopeless.status_code == 503
        assert hopeless.json()["error"]["code"] == "deadline_unreachable"
        assert "retry-after" in hopeless.headers
        assert time.monotonic() - started < 1.0  # refused at once, not after waiting

        bad = chat(titan, key, **{"x-titan-deadline": "soon"})
        assert bad.status_code == 400
        assert "x-titan-deadline" in bad.json()["error"]["message"]


def test_sustained_queueing_degrades_with_a_header_and_recovers():
    degradation = {
        "queue_wait_p95_s": 0.05,
        "window_s": 1.0,
        "sustain_s": 0.2,
        "steps": [{"action": "cap_max_tokens", "max_tokens": 2, "priorities": ["normal"]}],
    }
    slow = sim_model(profile={"ttft_s": 0.1}, max_concurrency=1, degradation=degradation)
    with running_titan(admission_config(slow)) as titan:
        key = create_key(titan)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda _: chat(titan, key), range(18)))
        degraded = [r for r in responses if "x-titan-degraded" in r.headers]
        assert degraded, "queue waits of ~0.1-0.5s over a 0.05s SLO must degrade"
        assert {r.headers["x-titan-degraded"] for r in degraded} == {"cap_max_tokens"}
        assert all(r.json()["usage"]["completion_tokens"] <= 2 for r in degraded)
        assert all(r.status_code == 200 for r in responses)

        time.sleep(1.2)  # the window empties: the load is gone
        for _ in range(4):  # calm for longer than sustain_s: the step is undone
            last = chat(titan, key)
            time.sleep(0.25)
        assert "x-titan-degraded" not in last.headers
        assert last.json()["usage"]["completion_tokens"] == 4
        admission = httpx.get(f"{titan}/stats").json()["models"]["sim"]["admission"]
        assert admission["degradation"]["level"] == 0
        metrics = httpx.get(f"{titan}/metrics").text
        assert 'titan_degraded_total{action="cap_max_tokens",model="sim"}' in metrics
