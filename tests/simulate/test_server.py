"""The standalone simulator over real HTTP: uvicorn on a free port, the openai SDK and httpx."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from tests.simulate.harness import running_simulator, wait_for_stats
from titan.config import Outage, SimulationProfile

pytestmark = pytest.mark.slow  # a real server (still quick: ~10 ms to start)

USER = [{"role": "user", "content": "Say something, anything at all."}]
STEADY = SimulationProfile(ttft_s=0.005, inter_token_s=0.001, output_tokens=6)


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def steady() -> Iterator[str]:
    with running_simulator(STEADY, model="sim-model") as base_url:
        yield base_url


@pytest.fixture
def client(steady: str) -> Iterator[openai.OpenAI]:
    with sdk(steady) as client:
        yield client


# ---- answers -----------------------------------------------------------------------------


def test_chat_answer_with_usage(client: openai.OpenAI):
    answer = client.chat.completions.create(model="any-name", messages=USER)
    assert answer.object == "chat.completion" and answer.model == "any-name"
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert len(choice.message.content.split(" ")) == 6
    assert answer.usage.completion_tokens == 6 and answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 6


def test_max_tokens_shortens_the_answer(client: openai.OpenAI):
    answer = client.chat.completions.create(model="m", messages=USER, max_completion_tokens=2)
    assert answer.usage.completion_tokens == 2 and answer.choices[0].finish_reason == "length"
    legacy = client.completions.create(model="m", prompt="Once", max_tokens=3)
    assert legacy.usage.completion_tokens == 3 and legacy.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(client: openai.OpenAI):
    stream = client.chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split(" ")) == 6
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_stream_without_usage_ends_with_done(steady: str):
    body = {"model": "m", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{steady}/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    payloads = [orjson.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert len(payloads) == 6 + 1  # a chunk per token, then the finish
    assert all("usage" not in payload for payload in payloads)


def test_completions_whole_and_streamed(client: openai.OpenAI):
    whole = client.completions.create(model="m", prompt="Once upon a time")
    assert whole.object == "text_completion" and len(whole.choices[0].text.split(" ")) == 6
    chunks = list(
        client.completions.create(
            model="m", prompt=["a", "b"], stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 5
    assert chunks[-1].usage.completion_tokens == 6


def test_models_health_and_stats(client: openai.OpenAI, steady: str):
    assert [model.id for model in client.models.list()] == ["sim-model"]
    assert httpx.get(f"{steady}/health").json() == {"status": "ok"}
    stats = httpx.get(f"{steady}/stats").json()
    assert stats["requests"] >= 1 and stats["active"] == 0 and stats["errors"] == {}


def test_a_body_without_messages_or_prompt_is_a_400(steady: str):
    response = httpx.post(f"{steady}/v1/chat/completions", json={"model": "m"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(f"{steady}/v1/completions", content=b"{oops").status_code == 400


def test_ttft_is_slept():
    profile = SimulationProfile(ttft_s=0.15, output_tokens=1)
    with running_simulator(profile) as base_url, sdk(base_url) as client:
        started = time.monotonic()
        client.chat.completions.create(model="m", messages=USER)
        assert time.monotonic() - started >= 0.15


# ---- failures ----------------------------------------------------------------------------


def test_429_with_retry_after_is_a_rate_limit_error():
    profile = SimulationProfile(error_probability=1, error_status=429, retry_after_s=2)
    with running_simulator(profile) as base_url, sdk(base_url) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="m", messages=USER)
        assert caught.value.response.headers["retry-after"] == "2"
        assert caught.value.response.headers["retry-after-ms"] == "2000"
        assert caught.value.body["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):  # a stream is refused before it starts
            client.chat.completions.create(model="m", messages=USER, stream=True)
        assert httpx.get(f"{base_url}/stats").json()["errors"] == {"429": 2}


@pytest.mark.parametrize(("status", "has_retry_after"), [(503, True), (500, False)])
def test_server_errors_surface_as_api_status_errors(status: int, has_retry_after: bool):
    profile = SimulationProfile(error_probability=1, error_status=status, retry_after_s=0.2)
    with (
        running_simulator(profile) as base_url,
        sdk(base_url) as client,
        pytest.raises(openai.APIStatusError) as caught,
    ):
        client.completions.create(model="m", prompt="x")
    assert caught.value.status_code == status
    assert ("retry-after" in caught.value.response.headers) == has_retry_after


def test_a_reset_is_a_connection_error():
    with running_simulator(SimulationProfile(reset_probability=1)) as base_url:
        with sdk(base_url) as client, pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="m", messages=USER)
        body = {"messages": USER, "stream": True}
        with pytest.raises(httpx.RemoteProtocolError):  # headers, then the connection drops
            httpx.post(f"{base_url}/v1/chat/completions", json=body)
        stats = httpx.get(f"{base_url}/stats").json()
    assert stats["resets"] == 2 and stats["completed"] == 0


def test_an_outage_follows_the_clock():
    clock = [0.0]
    profile = SimulationProfile(
        ttft_s=0.001,
        outages=[Outage(start_s=10, duration_s=5), Outage(start_s=20, duration_s=5, status=503)],
    )
    with running_simulator(profile, now=lambda: clock[0]) as base_url, sdk(base_url) as client:
        client.chat.completions.create(model="m", messages=USER)
        clock[0] = 12
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{base_url}/health")
        clock[0] = 21
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=USER)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "simulated_outage"
        assert httpx.get(f"{base_url}/health").status_code == 503
        clock[0] = 30
        client.chat.completions.create(model="m", messages=USER)
        stats = httpx.get(f"{base_url}/stats").json()
    assert (stats["requests"], stats["resets"], stats["errors"]) == (4, 1, {"503": 1})


def test_an_outage_cuts_a_stream_under_way():
    profile = SimulationProfile(
        ttft_s=0.01,
        inter_token_s=0.05,
        output_tokens=10,
        outages=[Outage(start_s=0.1, duration_s=9)],
    )
    with running_simulator(profile, now=lambda: 0.0) as base_url:
        body = {"prompt": "x", "stream": True}
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body) as response:
            events = []
            with pytest.raises(httpx.RemoteProtocolError):
                events.extend(line for line in response.iter_lines() if line)
        assert response.status_code == 200 and len(events) == 2  # tokens at 0.01 and 0.06
        assert wait_for_stats(base_url, lambda s: s["cuts"] == 1)["cuts"] == 1


# ---- cancellation ------------------------------------------------------------------------


@pytest.mark.parametrize("is_stream", [True, False])
def test_a_client_that_leaves_is_counted_as_cancelled(is_stream: bool):
    # Streams stall after their first token; whole answers stall before they are sent.
    profile = SimulationProfile(ttft_s=0.001, stall_probability=1, stall_s=30)
    with running_simulator(profile) as base_url:
        body = {"messages": USER, "stream": is_stream}
        if is_stream:
            with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()  # kept: closing the iterator closes the response
                assert next(lines).startswith("data: ")
                assert httpx.get(f"{base_url}/stats").json()["active_streams"] == 1
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=0.1)
        stats = wait_for_stats(base_url, lambda s: s["cancelled"] == 1)
    assert stats["cancelled"] == 1 and stats["stalls"] == 1
    assert stats["active"] == 0 and stats["active_streams"] == 0 and stats["completed"] == 0
