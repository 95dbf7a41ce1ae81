"""Tenant isolation over real HTTP: everything tenant A writes through the openai SDK — a cached
chat answer, a stored response, a file, a vector store, an agent-state document, a job — is
invisible to tenant B. B's reads, lists, searches, continuations, cancels and deletes of A's ids
answer 404 (never 403, which would confirm the id exists), B's lists are empty, and B's identical
chat request is not answered from A's cache entry."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_admission import MASTER, create_key

pytestmark = pytest.mark.slow

DOC = "Parental leave: birth and adoptive parents alike get sixteen weeks of paid leave."
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "A job"}], "max_tokens": 4}


def config() -> dict:
    simulated = {"backend": "simulated", "profile": {"ttft_s": 0.001, "output_tokens": 4}}
    return {
        "models": [{"name": "sim", "deployments": [simulated]}],
        "probes": {"enabled": False},
        "storage": "memory://",
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        "cache": {
            "exact": True,
            "semantic": {"enabled": True, "max_error_rate": None, "pair_verifier": False},
        },  # B must hit neither
        "jobs": {"workers": 0},  # A's job stays queued: B's cancel meets a live job
    }


def sdk(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def http(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def ask(client: openai.OpenAI, text: str, only_cached: bool = False):
    headers = {"x-titan-cache": "only-if-cached"} if only_cached else {}
    return client.chat.completions.with_raw_response.create(
        model="sim", messages=[{"role": "user", "content": text}], temperature=0,
        max_tokens=4, extra_headers=headers,
    )  # fmt: skip


def assert_404(response: httpx.Response, what: str) -> None:
    assert response.status_code == 404, f"{what}: {response.status_code} {response.text}"


def test_another_tenant_can_neither_see_nor_touch_nor_infer_a_tenants_state():
    with running_titan(config()) as titan:
        key_a = create_key(titan, tenant="tenant-a")
        key_b = create_key(titan, tenant="tenant-b")
        question = f"What is the secret plan {uuid.uuid4().hex[:8]}?"
        agent_url = f"/v1/agents/planner-{uuid.uuid4().hex[:6]}/state"

        # ---- A writes every kind of state -------------------------------------------------
        with sdk(titan, key_a) as a, http(titan, key_a) as a_http:
            assert ask(a, question).headers["x-titan-cache"] == "miss"
            deadline = time.monotonic() + 5  # the answer is stored in the background
            while True:
                try:
                    cached = ask(a, question, only_cached=True)
                    break
                except openai.APIStatusError as exc:
                    assert exc.status_code == 504 and time.monotonic() < deadline
                    time.sleep(0.05)
            assert cached.headers["x-titan-cache"] == "hit-exact"  # A's own entry is there

            response = a.responses.create(model="sim", input="Remember this", store=True)
            file = a.files.create(file=("handbook.txt", DOC.encode()), purpose="assistants")
            store = a.vector_stores.create(name="policies", file_ids=[file.id])
            assert store.file_counts.completed == 1
            assert a.vector_stores.search(store.id, query="adoption leave").data
            put = a_http.put(agent_url, json={"step": 1, "notes": ["from A"]})
            assert put.status_code == 201, put.text
            job = a_http.post("/v1/jobs", json={"body": CHAT})
            assert job.status_code == 202, job.text
            job_id = job.json()["id"]

        # ---- B tries to reach each of them --------------------------------------------------
        with sdk(titan, key_b) as b, http(titan, key_b) as b_http:
            # Cache: B's identical request is no hit on A's entry, exact or semantic.
            with pytest.raises(openai.APIStatusError) as not_cached:
                ask(b, question, only_cached=True)
            assert not_cached.value.status_code == 504
            assert ask(b, question).headers["x-titan-cache"] == "miss"

            # Stored responses: read, list its input, continue, delete.
            assert_404(b_http.get(f"/v1/responses/{response.id}"), "B reads A's response")
            assert_404(
                b_http.get(f"/v1/responses/{response.id}/input_items"),
                "B lists A's response's input items",
            )
            assert_404(
                b_http.post(
                    "/v1/responses",
                    json={"model": "sim", "input": "And?", "previous_response_id": response.id},
                ),
                "B continues A's response",
            )
            assert_404(b_http.delete(f"/v1/responses/{response.id}"), "B deletes A's response")

            # Files: read, read content, list, delete.
            assert_404(b_http.get(f"/v1/files/{file.id}"), "B reads A's file")
            assert_404(b_http.get(f"/v1/files/{file.id}/content"), "B reads A's file content")
            assert b_http.get("/v1/files").json()["data"] == []
            assert_404(b_http.delete(f"/v1/files/{file.id}"), "B deletes A's file")

            # Vector stores: read, list, list its files, search, delete.
            assert_404(b_http.get(f"/v1/vector_stores/{store.id}"), "B reads A's vector store")
            assert b_http.get("/v1/vector_stores").json()["data"] == []
            assert_404(
                b_http.get(f"/v1/vector_stores/{store.id}/files"), "B lists A's store's files"
            )
            assert_404(
                b_http.post(f"/v1/vector_stores/{store.id}/search", json={"query": "leave"}),
                "B searches A's vector store",
            )
            assert_404(b_http.delete(f"/v1/vector_stores/{store.id}"), "B deletes A's store")

            # Agent state: read, delete; a PATCH (an upsert) makes B's own document, A's fields
            # not merged into it (A's own is checked untouched below).
            assert_404(b_http.get(agent_url), "B reads A's agent state")
            assert_404(b_http.delete(agent_url), "B deletes A's agent state")
            patched = b_http.patch(agent_url, json={"step": 9})
            assert patched.status_code == 201, patched.text  # created, not updated
            assert patched.json() == {"step": 9}
            assert patched.headers["etag"] != put.headers["etag"]

            # Jobs: read, list, cancel.
            assert_404(b_http.get(f"/v1/jobs/{job_id}"), "B reads A's job")
            assert b_http.get("/v1/jobs").json()["data"] == []
            assert_404(b_http.delete(f"/v1/jobs/{job_id}"), "B cancels A's job")

        # ---- A's state is untouched by B's attempts -----------------------------------------
        with sdk(titan, key_a) as a, http(titan, key_a) as a_http:
            assert a.responses.retrieve(response.id).id == response.id
            assert a.files.content(file.id).text == DOC
            assert a.vector_stores.retrieve(store.id).file_counts.completed == 1
            assert a_http.get(agent_url).json() == {"step": 1, "notes": ["from A"]}
            assert a_http.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
