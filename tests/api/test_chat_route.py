"""POST /v1/chat/completions against the embedded backend over a fake engine."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from tests.api.fakes import REPLY, FakeEngine

USER = [{"role": "user", "content": "hi"}]


def sse_payloads(response: httpx.Response) -> list[Any]:
    """The decoded ``data:`` events of an SSE body; the last one must be [DONE]."""
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [orjson.loads(event) for event in events[:-1]]


async def post_chat(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json={"model": "fake-model", **fields})


async def test_chat_completion(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_chat(client, messages=USER, max_tokens=5)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "fake-model" and body["system_fingerprint"]
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": REPLY[:5]},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    prompt = "<user>hi\n<assistant>"
    assert engine.prompts_seen == [list(prompt.encode())]  # template, no extra special tokens
    assert body["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": 5,
        "total_tokens": len(prompt) + 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_defaults_reach_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_chat(client, messages=USER)
    assert response.json()["choices"][0]["finish_reason"] == "stop"  # the whole reply fitted
    params = engine.params_seen[0]
    prompt_len = len(engine.prompts_seen[0])
    assert params.max_tokens == engine.max_model_len - prompt_len  # vLLM's default
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.logprobs is None


async def test_priority_reaches_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    assert (await post_chat(client, messages=USER, max_tokens=2)).status_code == 200
    assert (
        await post_chat(client, messages=USER, max_tokens=2, n=2, priority=5)
    ).status_code == 200
    assert engine.priorities_seen == [0, 5, 5]
    bad = await post_chat(client, messages=USER, priority="urgent")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
    completion = await client.post(
        "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "priority": -1}
    )
    assert completion.status_code == 200 and engine.priorities_seen[-1] == -1


async def test_sampling_fields_reach_the_engine(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    await post_chat(
        client,
        messages=USER,
        max_completion_tokens=7,
        max_tokens=3,
        temperature=0.2,
        top_p=0.9,
        top_k=4,
        min_p=0.05,
        seed=11,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        min_tokens=1,
        stop=["\n\n"],
        stop_token_ids=[5],
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    params = engine.params_seen[0]
    assert params.max_tokens == 7 and params.temperature == 0.2 and params.top_p == 0.9
    assert params.top_k == 4 and params.min_p == 0.05 and params.seed == 11
    assert params.presence_penalty == 0.5 and params.frequency_penalty == -0.5
    assert params.repetition_penalty == 1.2 and params.min_tokens == 1
    assert params.stop == ("\n\n",) and params.stop_token_ids == (5,) and params.ignore_eos
    assert params.include_stop_str_in_output and not params.skip_special_tokens


async def test_developer_role_and_content_parts(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert (await post_chat(client, messages=messages, max_tokens=1)).status_code == 200
    assert bytes(engine.prompts_seen[0]).decode() == "<system>be brief\n<user>a\nb\n<assistant>"


async def test_model_may_be_omitted(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1})
    assert response.status_code == 200 and response.json()["model"] == "fake-model"


async def test_n_choices_with_seeds(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_chat(client, messages=USER, max_tokens=3, n=3, seed=100)
    body = response.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    assert sorted(params.seed for params in engine.params_seen) == [100, 101, 102]
    usage = body["usage"]
    assert usage["completion_tokens"] == 9
    assert usage["prompt_tokens"] == len(engine.prompts_seen[0])  # counted once, not n times


async def test_logprobs(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await post_chat(client, messages=USER, max_tokens=2, logprobs=True, top_logprobs=2)
    content = response.json()["choices"][0]["logprobs"]["content"]
    assert engine.params_seen[0].logprobs == 2
    assert content[0] == {
        "token": "H",
        "logprob": -0.5,
        "bytes": [72],
        "top_logprobs": [
            {"token": "a", "logprob": -1.0, "bytes": [97]},
            {"token": "b", "logprob": -2.0, "bytes": [98]},
        ],
    }
    assert len(content) == 2


async def test_cached_tokens_are_reported(client: httpx.AsyncClient) -> None:
    await post_chat(client, messages=USER, max_tokens=1)
    second = (await post_chat(client, messages=USER, max_tokens=1)).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


async def test_stream(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, messages=USER, max_tokens=4, stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    chunks = sse_payloads(response)
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert text == REPLY[:4]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-1] == "length"
    assert all(chunk["usage"] is None for chunk in chunks)


async def test_stream_include_usage(client: httpx.AsyncClient) -> None:
    response = await post_chat(
        client,
        messages=USER,
        max_tokens=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = sse_payloads(response)
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 6
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 6
    by_choice: dict[int, str] = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            by_choice[choice["index"]] += choice["delta"].get("content", "")
    assert by_choice == {0: REPLY[:3], 1: REPLY[:3]}


async def test_stream_logprobs(client: httpx.AsyncClient) -> None:
    response = await post_chat(client, messages=USER, max_tokens=2, stream=True, logprobs=True)
    chunks = sse_payloads(response)[1:]  # after the role chunk
    tokens = [entry["token"] for c in chunks for entry in c["choices"][0]["logprobs"]["content"]]
    assert tokens == ["H", "e"]
