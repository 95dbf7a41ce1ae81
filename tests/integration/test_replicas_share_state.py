"""Two Titan replicas on one Redis (``storage: redis://``) hold nothing the other needs: every kind
of state written through replica A is read and used through replica B with the official openai
SDK — keys and their limits, usage, conversations, files, vector stores, agent state, jobs and
batches, exact and semantic cache entries (the semantic ones within the documented lag).

Replica A runs no job worker, B runs two: a job submitted on A runs on B, and a cancel sent to A
reaches B's worker through the shared job document."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import redis.asyncio

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, create_key
from titan.cache import response_cache
from titan.cache.keys import request_keys
from titan.cache.response_cache import SYNC_INTERVAL_S, Lookup, ResponseCache
from titan.config.cache import CacheConfig
from titan.storage.redis_cache import RedisCache

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ADMIN = {"Authorization": f"Bearer {MASTER}"}
RPM = 3
# The semantic index follows other replicas' entries every SYNC_INTERVAL_S; this much more for
# the sync's own round trip and the polling, on two busy cores.
SEMANTIC_LAG_SLACK_S = 1.5
POLL_S = 0.05


def replica_config(storage: str, *, workers: int) -> dict:
    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.001, "output_tokens": 4}}
    slow = {"backend": "simulated", "profile": {"ttft_s": 30.0, "output_tokens": 4}}
    return {
        "models": [{"name": "sim", "deployments": [simulated]},
                   {"name": "slow", "deployments": [slow]}],
        "probes": {"enabled": False},
        "storage": storage,
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        "cache": {
            "exact": True,
            "semantic": {"enabled": True, "max_error_rate": None, "pair_verifier": False},
        },
        "jobs": {"workers": workers, "poll_s": POLL_S},
    }  # fmt: skip


def sdk(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def http(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def eventually(check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    """``check()``'s first truthy value, polled until ``timeout_s``; fails with the last one."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"not within {timeout_s} s: {value!r}"
            return value
        time.sleep(POLL_S)


def test_every_kind_of_state_written_on_one_replica_is_served_by_the_other(shared_redis: str):
    with (
        running_titan(replica_config(shared_redis, workers=0)) as a,
        running_titan(replica_config(shared_redis, workers=2)) as b,
    ):
        key = create_key(a)  # made on A: B knows it at once (lookups that miss are not cached)
        check_keys_and_limits(a, b)
        check_usage(a, b)
        check_conversations(a, b, key)
        check_files_and_vector_stores(a, b, key)
        check_agent_state(a, b, key)
        check_jobs(a, b, key)
        check_batches(a, b, key)
        check_exact_and_semantic_cache(a, b, key)


def check_keys_and_limits(a: str, b: str) -> None:
    limited = create_key(a, tenant="limited", rpm=RPM)
    statuses = []
    for index in range(RPM + 2):  # alternating: one bucket in Redis, not one per replica
        with sdk((a, b)[index % 2], limited) as client:
            try:
                client.chat.completions.create(
                    model="sim", messages=[{"role": "user", "content": f"limit {index}"}],
                    temperature=0.7,  # not cacheable: every request is a model call
                )  # fmt: skip
                statuses.append(200)
            except openai.RateLimitError as exc:
                assert "Rate limit reached for the key" in str(exc)
                statuses.append(429)
    # RPM/60 tokens a second refill the bucket: under a second of requests adds none.
    assert statuses == [200] * RPM + [429, 429]

    key_id = limited.split("-")[2]
    revoked = httpx.delete(f"{b}/admin/keys/{key_id}", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    with sdk(a, limited) as client, pytest.raises(openai.AuthenticationError, match="revoked"):
        client.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "after revocation"}]
        )


def check_usage(a: str, b: str) -> None:
    key = create_key(b, tenant="metered")
    with sdk(a, key) as client:
        for index in range(3):
            client.chat.completions.create(
                model="sim", messages=[{"role": "user", "content": f"metered {index}"}],
                temperature=0.7,
            )  # fmt: skip

    with http(b, key) as on_b:

        def requests_seen_on_b() -> bool:
            rows = on_b.get("/v1/usage", params={"granularity": "total"}).json()["data"]
            return sum(row["requests"] for row in rows) == 3

        # A writes its usage within a second (usage_buffer): B reads it from Redis.
        eventually(requests_seen_on_b, timeout_s=5)


def check_conversations(a: str, b: str, key: str) -> None:
    with sdk(a, key) as on_a, sdk(b, key) as on_b:
        first = on_a.responses.create(model="sim", input="Hi", instructions="Be brief.")
        second = on_b.responses.create(
            model="sim", input="And then?", previous_response_id=first.id
        )
        assert second.previous_response_id == first.id
        assert second.usage.input_tokens > first.usage.input_tokens  # A's turn came along
        assert on_a.responses.retrieve(second.id).output_text == second.output_text
        with on_a.responses.stream(
            model="sim", input="Stream it", previous_response_id=second.id
        ) as stream:
            streamed = next(e for e in stream if e.type == "response.completed").response
        # Stored before its last events: continued on B as soon as the client has them.
        third = on_b.responses.create(model="sim", input="Go on", previous_response_id=streamed.id)
        assert third.usage.input_tokens > streamed.usage.input_tokens
        on_b.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            on_a.responses.retrieve(first.id)


HANDBOOK = (
    "Parental leave: adoptive parents and birth parents alike get sixteen weeks of paid leave, "
    "to be taken within the first year after the child arrives."
)
SECURITY = (
    "Laptop security: every laptop must use full-disk encryption, and lost devices are reported "
    "to the IT help desk within one hour."
)


def check_files_and_vector_stores(a: str, b: str, key: str) -> None:
    with sdk(a, key) as on_a, sdk(b, key) as on_b:
        handbook = on_a.files.create(file=("handbook.txt", HANDBOOK.encode()), purpose="assistants")
        assert handbook.id in {f.id for f in on_b.files.list()}
        assert on_b.files.retrieve(handbook.id).filename == "handbook.txt"
        assert on_b.files.content(handbook.id).text == HANDBOOK

        store = on_b.vector_stores.create(name="policies", file_ids=[handbook.id])  # embedded on B
        assert store.file_counts.completed == 1
        found = on_a.vector_stores.search(store.id, query="How long is adoption leave?")
        assert "sixteen weeks" in found.data[0].content[0].text  # A's index loaded B's chunks

        security = on_b.files.create(file=("security.txt", SECURITY.encode()), purpose="assistants")
        added = on_a.vector_stores.files.create_and_poll(
            file_id=security.id, vector_store_id=store.id
        )
        assert added.status == "completed"
        # B's index already holds the store: it follows the store's revision, bumped by A.
        found = on_b.vector_stores.search(store.id, query="disk encryption on laptops")
        assert found.data[0].file_id == security.id
        assert on_b.vector_stores.retrieve(store.id).file_counts.completed == 2


def check_agent_state(a: str, b: str, key: str) -> None:
    url = f"/v1/agents/planner-{uuid.uuid4().hex[:6]}/state"
    with http(a, key) as on_a, http(b, key) as on_b:
        put = on_a.put(url, json={"step": 1, "notes": ["from A"]})
        assert put.status_code == 201, put.text
        got = on_b.get(url)
        assert got.json() == {"step": 1, "notes": ["from A"]}
        assert got.headers["etag"] == put.headers["etag"]
        patched = on_b.patch(url, json={"step": 2}, headers={"If-Match": put.headers["etag"]})
        assert patched.status_code == 200, patched.text
        stale = on_a.patch(url, json={"step": 3}, headers={"If-Match": put.headers["etag"]})
        assert stale.status_code == 412  # A sees B's write: its ETag is the current one
        assert patched.headers["etag"] in stale.json()["error"]["message"]


CHAT = {"model": "sim", "messages": [{"role": "user", "content": "A job"}], "max_tokens": 4}


def job_in(client: httpx.Client, job_id: str, status: str) -> dict | None:
    job = client.get(f"/v1/jobs/{job_id}").json()
    return job if job["status"] == status else None


def check_jobs(a: str, b: str, key: str) -> None:
    idempotency_key = f"report-{uuid.uuid4().hex[:8]}"
    with http(a, key) as on_a, http(b, key) as on_b:
        submitted = on_a.post("/v1/jobs", json={"body": CHAT, "idempotency_key": idempotency_key})
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        # A runs no worker: B's worker ran it, and either replica shows the result.
        done = eventually(lambda: job_in(on_b, job_id, "succeeded"))
        assert done["attempts"] == 1 and done["result"]["choices"][0]["message"]["content"]
        assert on_a.get(f"/v1/jobs/{job_id}").json()["result"] == done["result"]
        replay = on_b.post("/v1/jobs", json={"body": CHAT, "idempotency_key": idempotency_key})
        assert replay.status_code == 200 and replay.json()["id"] == job_id
        assert replay.headers["x-titan-idempotent-replay"] == "true"
        assert job_id in {j["id"] for j in on_a.get("/v1/jobs").json()["data"]}

        slow_id = on_a.post("/v1/jobs", json={"body": {**CHAT, "model": "slow"}}).json()["id"]
        assert eventually(lambda: job_in(on_b, slow_id, "running"))["worker"]
        # The cancel lands on A; B's worker sees the mark at its next lease renewal (<= 1 s).
        assert on_a.delete(f"/v1/jobs/{slow_id}").status_code == 200
        eventually(lambda: job_in(on_b, slow_id, "cancelled"), timeout_s=5)


def check_batches(a: str, b: str, key: str) -> None:
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
        for i in range(3)
    ]
    data = b"\n".join(orjson.dumps(line) for line in lines)
    with sdk(a, key) as on_a, sdk(b, key) as on_b:
        batch_file = on_a.files.create(file=("requests.jsonl", data), purpose="batch")
        batch = on_b.batches.create(
            input_file_id=batch_file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # B's worker runs the jobs; whichever replica reads the batch last finalizes it.
        done = eventually(lambda: on_a.batches.retrieve(batch.id).status == "completed")
        done = on_b.batches.retrieve(batch.id)
        assert done.request_counts.completed == 3
        output = on_a.files.content(done.output_file_id).text.splitlines()
        answered = [orjson.loads(line)["custom_id"] for line in output]
        assert answered == [line["custom_id"] for line in lines]  # in input order


def check_exact_and_semantic_cache(a: str, b: str, key: str) -> None:
    question = f"How do I reset the password of account {uuid.uuid4().hex[:6]}?"
    reworded = question.replace("How do I reset", "How can I reset")

    def ask(base_url: str, text: str, only_cached: bool = False):
        headers = {"x-titan-cache": "only-if-cached"} if only_cached else {}
        with sdk(base_url, key) as client:
            try:
                return client.chat.completions.with_raw_response.create(
                    model="sim", messages=[{"role": "user", "content": text}], temperature=0,
                    extra_headers=headers,
                )  # fmt: skip
            except openai.APIStatusError as exc:
                assert exc.status_code == 504 and only_cached  # not cached (yet)
                return None

    answered = ask(a, question)
    assert answered.headers["x-titan-cache"] == "miss"
    # Stored in the background after the answer; then shared at once for exact hits.
    exact = eventually(lambda: ask(b, question, only_cached=True), timeout_s=5)
    assert exact.headers["x-titan-cache"] == "hit-exact"
    assert exact.parse().choices[0].message.content == answered.parse().choices[0].message.content
    stored_by = time.monotonic()
    semantic = eventually(
        lambda: ask(b, reworded, only_cached=True), timeout_s=SYNC_INTERVAL_S + SEMANTIC_LAG_SLACK_S
    )
    assert semantic.headers["x-titan-cache"] == "hit-semantic", semantic.headers
    assert time.monotonic() - stored_by <= SYNC_INTERVAL_S + SEMANTIC_LAG_SLACK_S


# ---- the semantic index's cursor, without HTTP --------------------------------------------------


async def test_a_replica_storing_many_answers_still_follows_the_others(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
):
    """A replica's own entries move its follow cursor too: a page of them must not hide what
    another replica stored after them (it did once: the cursor moved on others' entries only)."""
    monkeypatch.setattr(response_cache, "SYNC_PAGE", 4)
    config = CacheConfig(semantic={"enabled": True, "max_error_rate": None, "pair_verifier": False})
    client = redis.asyncio.Redis.from_url(redis_url)
    # Wall-clock seconds: Redis expires entries by its own clock.
    clock = [time.time()]
    try:
        replicas = [
            ResponseCache(RedisCache(client, prefix=redis_prefix), now=lambda: clock[0])
            for _ in range(2)
        ]
        busy, other = replicas
        rng = np.random.default_rng(0)

        async def store(cache: ResponseCache, question: str) -> str:
            keys = request_keys("acme", "m", "chat", {
                "messages": [{"role": "user", "content": question}], "temperature": 0})  # fmt: skip
            vector = rng.standard_normal(384).astype(np.float32)
            lookup = Lookup(keys, embedding=vector / np.linalg.norm(vector))
            await cache.store_answer(lookup, config, tenant="acme", model="m", value=b"{}")
            # Apart by more than a page over the look-back window (CLOCK_SKEW_S, 5 s).
            clock[0] += 2.0
            return keys.exact

        for index in range(10):  # more than a page of the busy replica's own entries
            await store(busy, f"busy question number {index}")
            await busy.sync()
        followed = await store(other, "a question another replica answered")
        await busy.sync()
        assert followed in busy._indexed
    finally:
        await client.aclose()
