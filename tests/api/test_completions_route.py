"""POST /v1/completions against the embedded backend over a fake engine."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.fakes import BOS, REPLY, FakeEngine
from tests.api.test_chat_route import sse_payloads


async def post_completion(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v1/completions", json={"model": "fake-model", **fields})


async def test_completion(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_completion(client, prompt="ab")
    body = response.json()
    assert response.status_code == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    # max_tokens defaults to 16 on this endpoint; the prompt gets the tokenizer's BOS.
    assert body["choices"] == [
        {"index": 0, "text": REPLY[:16], "logprobs": None, "finish_reason": "length"}
    ]
    assert engine.prompts_seen == [[BOS, ord("a"), ord("b")]]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 16


async def test_list_prompt_and_n(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_completion(client, prompt=["ab", "cde"], n=2, max_tokens=2)
    body = response.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3]
    assert all(choice["text"] == REPLY[:2] for choice in body["choices"])
    # Each prompt counted once (3 + 4 tokens with BOS); completion tokens over all 4 choices.
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["completion_tokens"] == 8


async def test_token_id_prompts(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_completion(client, prompt=[[104, 105], [106]], max_tokens=1, echo=True)
    assert [choice["text"] for choice in response.json()["choices"]] == ["hiH", "jH"]
    assert engine.prompts_seen == [[104, 105], [106]]  # taken as given, no BOS added
    single = await post_completion(client, prompt=[104, 105], max_tokens=1)
    assert len(single.json()["choices"]) == 1


async def test_echo(client: httpx.AsyncClient) -> None:
    response = await post_completion(client, prompt="Say: ", max_tokens=3, echo=True)
    assert response.json()["choices"][0]["text"] == "Say: " + REPLY[:3]


async def test_logprobs_legacy_shape(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_completion(client, prompt="x", max_tokens=3, logprobs=1)
    logprobs = response.json()["choices"][0]["logprobs"]
    assert engine.params_seen[0].logprobs == 1
    assert logprobs == {
        "tokens": ["H", "e", "l"],
        "token_logprobs": [-0.5, -0.5, -0.5],
        "top_logprobs": [{"a": -1.0, "H": -0.5}, {"a": -1.0, "e": -0.5}, {"a": -1.0, "l": -0.5}],
        "text_offset": [0, 1, 2],
    }


async def test_stream_with_echo_and_usage(client: httpx.AsyncClient) -> None:
    response = await post_completion(
        client,
        prompt=["p1 ", "p2 "],
        max_tokens=2,
        stream=True,
        echo=True,
        stream_options={"include_usage": True},
    )
    chunks = sse_payloads(response)
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: "p1 " + REPLY[:2], 1: "p2 " + REPLY[:2]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_stream_logprobs_offsets_continue(client: httpx.AsyncClient) -> None:
    response = await post_completion(client, prompt="x", max_tokens=3, stream=True, logprobs=0)
    offsets = [c["choices"][0]["logprobs"]["text_offset"][0] for c in sse_payloads(response)]
    assert offsets == [0, 1, 2]
