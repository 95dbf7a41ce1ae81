"""OpenAI's Batch API through the official openai SDK: upload a JSONL file, create the batch, poll
it, read the output and error files; malformed lines land in the error file, one entry each,
and the rest of the batch runs; a cancelled batch ends cancelled with what it had."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.integration.harness import running_titan
from tests.integration.test_jobs_api import simulated


def line(custom_id: str, content: str, **extra) -> str:
    body = {"model": "sim", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": body, **extra})  # fmt: skip


def wait(client: openai.OpenAI, batch_id: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def storage(request) -> str:
    if request.param == "redis":
        return request.getfixturevalue("shared_redis")
    return "memory://"


def test_the_sdk_batch_flow_with_malformed_lines_reported_per_line(storage: str):
    lines = [line(f"req-{n}", f"Tell me about the number {n}") for n in range(20)]
    lines.insert(3, "{not json")
    lines.insert(7, json.dumps({"custom_id": "no-body", "method": "POST",
                                "url": "/v1/chat/completions"}))  # fmt: skip
    lines.insert(11, line("req-0", "a duplicate custom_id"))
    lines.insert(13, line("wrong-url", "x").replace("/v1/chat/completions", "/v1/embeddings"))
    lines.insert(
        15,
        json.dumps(
            {
                "custom_id": "bad-body",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "sim"},
            }
        ),
    )
    with running_titan({**simulated(), "storage": storage}) as titan:
        client = openai.OpenAI(base_url=f"{titan}/v1", api_key="none", max_retries=0)
        upload = client.files.create(file=("requests.jsonl", "\n".join(lines).encode()),
                                     purpose="batch")  # fmt: skip
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"run": "nightly"},
        )
        assert batch.status == "in_progress" and batch.request_counts.total == 25
        assert batch.metadata == {"run": "nightly"}
        done = wait(client, batch.id)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (20, 5)

        outputs = [
            json.loads(x) for x in client.files.content(done.output_file_id).text.split("\n") if x
        ]
        assert [o["custom_id"] for o in outputs] == [f"req-{n}" for n in range(20)]
        assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in outputs)
        assert outputs[0]["response"]["body"]["choices"][0]["message"]["content"]
        errors = [
            json.loads(x) for x in client.files.content(done.error_file_id).text.split("\n") if x
        ]
        assert sorted(e["error"]["line"] for e in errors) == [4, 8, 12, 14, 16]
        assert all(e["error"]["message"].startswith(f"Line {e['error']['line']}:") for e in errors)
        messages = " ".join(e["error"]["message"] for e in errors)
        for needle in ("JSON", "body", "twice", "url", "messages"):
            assert needle in messages
        assert client.batches.list().data[0].id == batch.id

        with pytest.raises(openai.BadRequestError):  # a file that is not batch input
            other = client.files.create(file=("notes.txt", b"hello"), purpose="assistants")
            client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_nope")


def test_a_cancelled_batch_ends_cancelled_with_the_answers_it_has():
    lines = [line(f"req-{n}", f"Question {n}") for n in range(40)]
    with running_titan(simulated(ttft_s=0.2, workers=2)) as titan:
        client = openai.OpenAI(base_url=f"{titan}/v1", api_key="none", max_retries=0)
        upload = client.files.create(file=("r.jsonl", "\n".join(lines).encode()), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")  # fmt: skip
        time.sleep(0.5)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = wait(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        assert 0 < done.request_counts.completed < 40
