"""The ``openai`` backend against a real HTTP upstream (uvicorn on loopback) replaying the wire
formats of vLLM, SGLang, TGI, Ollama, llama.cpp's server and OpenAI."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from tests.backends.upstream_fakes import (
    EVENT_STREAM,
    STREAM_ERROR_EVENTS,
    VLLM,
    VLLM_COMPLETION_CHUNK,
    WIRE_FORMATS,
    Canned,
    FakeUpstream,
    WireFormat,
    sse,
)
from titan.backends.openai_compat import OpenAIBackend
from titan.config import OpenAIDeployment
from titan.errors import (
    InvalidRequestError,
    ServiceUnavailableError,
    UpstreamConnectionError,
    UpstreamError,
    UpstreamTimeoutError,
)
from titan.protocol import (
    ChatCompletionRequest,
    ClientRequest,
    CompletionRequest,
    ModelCard,
    RawJSON,
)

CHAT = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
FORMAT_IDS = [wire.server for wire in WIRE_FORMATS]


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture
def upstream(upstream_server: FakeUpstream) -> FakeUpstream:
    upstream_server.reset()
    return upstream_server


def deployment(base_url: str, **overrides: Any) -> OpenAIDeployment:
    settings: dict[str, Any] = {
        "backend": "openai",
        "base_url": base_url,
        "upstream_model": "served-model",
        "api_key": "sk-test",
        "headers": {"x-org": "titan"},
        **overrides,
    }
    return OpenAIDeployment.model_validate(settings)


@pytest.fixture
async def backend(upstream: FakeUpstream) -> AsyncIterator[OpenAIBackend]:
    backend = OpenAIBackend(deployment(upstream.base_url), model_name="llama", name="llama-0")
    await backend.start()
    yield backend
    await backend.shutdown()


def request(body: dict[str, Any], endpoint: str = "chat") -> ClientRequest:
    kind = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    parsed = kind.model_validate_json(orjson.dumps(body))
    return ClientRequest(endpoint, parsed, body, request_id="req-1")  # type: ignore[arg-type]


async def collect(stream: AsyncIterator[Any]) -> list[bytes]:
    chunks = []
    async for answer in stream:
        assert isinstance(answer, RawJSON)
        chunks.append(answer.data)
    return chunks


# ---- each upstream's wire format ------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRE_FORMATS, ids=FORMAT_IDS)
async def test_complete_returns_the_upstream_bytes(
    wire: WireFormat, upstream: FakeUpstream, backend: OpenAIBackend
):
    upstream.will_answer(Canned.json(wire.completion))
    answer = await backend.complete(request(CHAT))
    assert answer == RawJSON(wire.completion)
    [received] = upstream.received
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.json() == {**CHAT, "model": "served-model", "stream": False}
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.headers["x-org"] == "titan"
    assert received.headers["content-type"] == "application/json"


@pytest.mark.parametrize("split_every", [0, 7], ids=["whole", "split"])
@pytest.mark.parametrize("wire", WIRE_FORMATS, ids=FORMAT_IDS)
async def test_stream_yields_each_payload_as_sent(
    wire: WireFormat, split_every: int, upstream: FakeUpstream, backend: OpenAIBackend
):
    upstream.will_answer(Canned.sse(wire.stream, split_every=split_every))
    assert await collect(backend.stream(request({**CHAT, "stream": True}))) == list(wire.chunks)
    [received] = upstream.received
    assert received.json() == {**CHAT, "model": "served-model", "stream": True}
    assert received.headers["accept"] == "text/event-stream"


async def test_tool_call_deltas_come_back(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(Canned.sse(VLLM.stream))
    chunks = [orjson.loads(c) for c in await collect(backend.stream(request(CHAT)))]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:3]]
    assert calls[0]["function"]["name"] == "get_weather"
    assert orjson.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"}
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"


async def test_every_client_field_reaches_the_upstream(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    body = {
        **CHAT,
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        "logprobs": True,
        "top_logprobs": 2,
        "user": "user-7",
        "metadata": {"team": "search"},
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM, SGLang and TGI extras Titan does not know.
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
        "guided_json": {"type": "object"},
        "x_vendor": {"nested": [1, 2.5, None, "é"]},
    }
    upstream.will_answer(Canned.sse(VLLM.stream), Canned.json(VLLM.completion))
    await collect(backend.stream(request(body)))
    await backend.complete(request(body))
    streamed, completed = (r.json() for r in upstream.received)
    assert streamed == {**body, "model": "served-model"}
    # Forced non-streaming (a pipeline may complete a streaming request): no stream_options.
    without_options = {k: v for k, v in body.items() if k != "stream_options"}
    assert completed == {**without_options, "model": "served-model", "stream": False}


async def test_legacy_completions_go_to_their_endpoint(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    chunk = VLLM_COMPLETION_CHUNK
    upstream.will_answer(Canned.sse(sse(chunk)))
    body = {"model": "llama", "prompt": "Hello", "max_tokens": 4, "echo": False}
    assert await collect(backend.stream(request(body, endpoint="completion"))) == [chunk]
    assert upstream.received[0].path == "/v1/completions"


async def test_the_model_defaults_to_the_clients_name(upstream: FakeUpstream):
    backend = OpenAIBackend(
        deployment(upstream.base_url, upstream_model=None), model_name="llama", name="d"
    )
    await backend.start()
    try:
        upstream.will_answer(Canned.json(VLLM.completion))
        await backend.complete(request({**CHAT, "model": "llama"}))
    finally:
        await backend.shutdown()
    assert upstream.received[0].json()["model"] == "llama"


async def test_connections_are_kept_alive(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(
        Canned.sse(VLLM.stream), Canned.json(VLLM.completion), Canned.sse(VLLM.stream)
    )
    await collect(backend.stream(request(CHAT)))
    await backend.complete(request(CHAT))
    await collect(backend.stream(request(CHAT)))
    assert len({r.client_port for r in upstream.received}) == 1


# ---- fields a deployment cannot honour -------------------------------------------------------


async def test_unsupported_fields_are_refused_before_the_upstream(upstream: FakeUpstream):
    refusing = deployment(upstream.base_url, unsupported_fields=["tools", "logprobs"])
    backend = OpenAIBackend(refusing, model_name="llama", name="ollama-0")
    await backend.start()
    try:
        with pytest.raises(InvalidRequestError) as caught:
            await backend.complete(request({**CHAT, "tools": [{"type": "function"}]}))
        with pytest.raises(InvalidRequestError):
            await anext(backend.stream(request({**CHAT, "logprobs": True})))
        assert upstream.received == []
        upstream.will_answer(Canned.json(VLLM.completion))  # a null field asks for nothing
        await backend.complete(request({**CHAT, "tools": None}))
    finally:
        await backend.shutdown()
    assert caught.value.status_code == 400
    assert caught.value.param == "tools"
    assert "'tools'" in caught.value.message and "'ollama-0'" in caught.value.message


# ---- upstream errors -------------------------------------------------------------------------


async def test_429_carries_the_message_and_retry_after(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    body = {
        "error": {
            "message": "Rate limit reached for gpt-4o-mini on requests per min (RPM).",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    upstream.will_answer(Canned.json(body, status=429, headers={"retry-after": "7"}))
    with pytest.raises(UpstreamError) as caught:
        await backend.complete(request(CHAT))
    error = caught.value
    assert (error.status_code, error.is_retryable, error.retry_after) == (429, True, 7.0)
    assert error.message == body["error"]["message"]
    assert (error.error_type, error.code) == ("requests", "rate_limit_exceeded")


async def test_retry_after_as_an_http_date(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(
        Canned.json(b"{}", status=429, headers={"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    )
    with pytest.raises(UpstreamError) as caught:
        await backend.complete(request(CHAT))
    assert caught.value.retry_after == 0.0  # long past


async def test_503_plain_text_is_retryable(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(
        Canned(503, (b"upstream connect error or disconnect/reset before headers",), {})
    )
    with pytest.raises(UpstreamError) as caught:
        await anext(backend.stream(request(CHAT)))
    assert (caught.value.status_code, caught.value.is_retryable) == (503, True)
    assert "reset before headers" in caught.value.message
    assert caught.value.error_type == "upstream_error"


async def test_400_stays_an_informative_400(upstream: FakeUpstream, backend: OpenAIBackend):
    vllm_error = {
        "error": {
            "message": "'temperature' must be non-negative, got -1.0.",
            "type": "BadRequestError",
            "param": "temperature",
            "code": 400,
        }
    }
    upstream.will_answer(Canned.json(vllm_error, status=400))
    with pytest.raises(UpstreamError) as caught:
        await anext(backend.stream(request(CHAT)))
    error = caught.value
    assert (error.status_code, error.is_retryable) == (400, False)
    assert error.to_body()["error"] == {
        "message": "'temperature' must be non-negative, got -1.0.",
        "type": "BadRequestError",
        "param": "temperature",
        "code": "upstream_error",  # vLLM's numeric code only repeats the status
    }
    assert upstream.received[0].json()["stream"] is True  # it was the upstream's refusal


async def test_connection_refused(upstream: FakeUpstream):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    backend = OpenAIBackend(deployment(f"http://127.0.0.1:{port}/v1"), "llama", "gone-0")
    await backend.start()
    try:
        with pytest.raises(UpstreamConnectionError):
            await backend.complete(request(CHAT))
        with pytest.raises(UpstreamConnectionError):
            await anext(backend.stream(request(CHAT)))
        with pytest.raises(UpstreamConnectionError):
            await backend.probe()
        assert backend.stats()["num_connection_errors"] == 3
    finally:
        await backend.shutdown()


async def test_a_connection_dropped_mid_stream(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(Canned(200, (sse(*VLLM.chunks[:2], done=False),), EVENT_STREAM, "drop"))
    stream = backend.stream(request(CHAT))
    assert (await anext(stream)).data == VLLM.chunks[0]  # type: ignore[union-attr]
    assert (await anext(stream)).data == VLLM.chunks[1]  # type: ignore[union-attr]
    with pytest.raises(UpstreamConnectionError):
        await anext(stream)


async def test_a_non_streaming_call_past_its_total_timeout(upstream: FakeUpstream):
    slow = deployment(upstream.base_url, timeouts={"total_s": 0.2})
    backend = OpenAIBackend(slow, model_name="llama", name="slow-0")
    await backend.start()
    try:
        upstream.will_answer(Canned(200, (b"{",), then="hang"))
        with pytest.raises(UpstreamTimeoutError):
            await backend.complete(request(CHAT))
        assert backend.stats()["num_timeouts"] == 1
    finally:
        await backend.shutdown()


@pytest.mark.parametrize("server", STREAM_ERROR_EVENTS)
async def test_an_error_event_mid_stream(
    server: str, upstream: FakeUpstream, backend: OpenAIBackend
):
    event, status, words = STREAM_ERROR_EVENTS[server]
    upstream.will_answer(Canned.sse(sse(VLLM.chunks[0], done=False) + event))
    stream = backend.stream(request(CHAT))
    assert (await anext(stream)).data == VLLM.chunks[0]  # type: ignore[union-attr]
    with pytest.raises(UpstreamError) as caught:
        await anext(stream)
    assert caught.value.status_code == status
    assert words in caught.value.message
    assert backend.stats()["num_errors_by_status"] == {str(status): 1}


async def test_a_stream_that_ends_without_done(upstream: FakeUpstream, backend: OpenAIBackend):
    # Finished (a finish_reason came), then the body ends without [DONE] or a last blank line.
    upstream.will_answer(Canned.sse(sse(*VLLM.chunks, done=False)[:-1]))
    assert await collect(backend.stream(request(CHAT))) == list(VLLM.chunks)


async def test_a_streaming_request_answered_without_streaming(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    upstream.will_answer(Canned.json(VLLM.completion))
    with pytest.raises(UpstreamError) as caught:
        await anext(backend.stream(request(CHAT)))
    assert caught.value.status_code == 502 and "without streaming" in caught.value.message


# ---- cancellation ----------------------------------------------------------------------------


async def observed_disconnect(upstream: FakeUpstream) -> bool:
    return await asyncio.to_thread(upstream.received[0].disconnected.wait, 5)


async def test_closing_a_stream_disconnects_the_upstream(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    upstream.will_answer(Canned.sse(sse(VLLM.chunks[0], done=False), then="hang"))
    stream = backend.stream(request(CHAT))
    assert (await anext(stream)).data == VLLM.chunks[0]  # type: ignore[union-attr]
    await stream.aclose()  # type: ignore[attr-defined]
    assert await observed_disconnect(upstream)
    stats = backend.stats()
    assert (stats["num_in_flight"], stats["num_streams_abandoned"]) == (0, 1)


async def test_cancelling_a_waiting_consumer_disconnects_the_upstream(
    upstream: FakeUpstream, backend: OpenAIBackend
):
    upstream.will_answer(Canned.sse(b": waiting for a slot\n\n", then="hang"))
    consumer = asyncio.create_task(collect(backend.stream(request(CHAT))))
    await asyncio.to_thread(lambda: _wait_until(lambda: len(upstream.received) == 1))
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert await observed_disconnect(upstream)
    assert backend.stats()["num_streams_abandoned"] == 1


async def test_a_lost_hedge_leaves_the_winner_alone(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(
        Canned.sse(sse(VLLM.chunks[0], done=False), then="hang"), Canned.sse(VLLM.stream)
    )
    loser = backend.stream(request(CHAT))
    await anext(loser)
    winner = backend.stream(request(CHAT))
    first = await anext(winner)
    await loser.aclose()  # type: ignore[attr-defined]
    assert [first.data, *await collect(winner)] == list(VLLM.chunks)  # type: ignore[union-attr]
    assert await observed_disconnect(upstream)


def _wait_until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


# ---- health, discovery, identity ----------------------------------------------------------


VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "served-model",
            "object": "model",
            "created": 1752000000,
            "owned_by": "vllm",
            "root": "/models/llama",
            "parent": None,
            "max_model_len": 8192,
            "permission": [],
        },
        {"id": "llama-lora", "object": "model", "created": 1752000000, "owned_by": "vllm"},
    ],
}


async def test_probe_and_list_models(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(Canned.json(VLLM_MODELS), Canned.json(VLLM_MODELS))
    assert await backend.list_models() == ["served-model", "llama-lora"]
    await backend.probe()
    assert [(r.method, r.path) for r in upstream.received] == [("GET", "/v1/models")] * 2
    assert upstream.received[0].headers["authorization"] == "Bearer sk-test"
    card = backend.model_card("llama")
    assert isinstance(card, ModelCard)
    assert (card.id, card.owned_by, card.max_model_len) == ("llama", "127.0.0.1", 8192)


async def test_an_unhealthy_probe(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(
        Canned.json({"error": "Model is loading", "error_type": "overloaded"}, status=503),
        Canned.json(b"<html>not a model list</html>"),
    )
    with pytest.raises(UpstreamError) as caught:
        await backend.probe()
    assert (caught.value.status_code, caught.value.message) == (
        503,
        "Upstream HTTP 503: Model is loading",
    )
    with pytest.raises(UpstreamError):
        await backend.probe()


async def test_identity_lifecycle_and_stats(upstream: FakeUpstream):
    backend = OpenAIBackend(deployment(upstream.base_url), model_name="llama", name="llama-0")
    assert (backend.name, backend.model_ids, backend.is_ready) == ("llama-0", ("llama",), False)
    with pytest.raises(ServiceUnavailableError):
        await backend.complete(request(CHAT))
    await backend.start()
    assert backend.is_ready
    upstream.will_answer(Canned.json(VLLM.completion), Canned.json({"error": "bad"}, status=422))
    await backend.complete(request(CHAT))
    with pytest.raises(UpstreamError):
        await backend.complete(request(CHAT))
    await backend.shutdown()
    assert not backend.is_ready
    assert backend.stats() == {
        "num_requests": 2,
        "num_in_flight": 0,
        "num_streams_abandoned": 0,
        "num_connection_errors": 0,
        "num_timeouts": 0,
        "num_errors_by_status": {"422": 1},
    }


async def test_the_trace_context_goes_upstream(upstream: FakeUpstream, backend: OpenAIBackend):
    upstream.will_answer(Canned.json(VLLM.completion), Canned.json(VLLM.completion))
    traced = request(CHAT)
    traced = ClientRequest(traced.endpoint, traced.parsed, traced.body, request_id="req-2",
                           headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                    "00f067aa0ba902b7-01", "tracestate": "vendor=1",
                                    "x-titan-session": "s"})  # fmt: skip
    await backend.complete(traced)
    await backend.complete(request(CHAT))
    with_context, without = upstream.received
    assert with_context.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert with_context.headers["tracestate"] == "vendor=1"
    assert "x-titan-session" not in with_context.headers  # Titan's own headers stay here
    assert "traceparent" not in without.headers
