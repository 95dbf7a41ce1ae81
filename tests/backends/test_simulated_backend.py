"""The simulated backend in-process: answers, streams, refusals before the first chunk, stalls,
cancellation and probes (small real delays; outages follow an injected clock)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from titan.backends.base import Backend
from titan.backends.simulated import SimulatedBackend
from titan.config import Outage, SimulatedDeployment, SimulationProfile
from titan.config.simulation import ModelServerProfile, StepCostProfile
from titan.errors import ServiceUnavailableError, UpstreamConnectionError, UpstreamError
from titan.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ClientRequest,
    Completion,
    CompletionRequest,
)

USER = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
FAST = SimulationProfile(ttft_s=0.002, inter_token_s=0.001, output_tokens=5)


def chat(**fields: Any) -> ClientRequest:
    body = {"model": "sim", "messages": USER, **fields}
    return ClientRequest("chat", ChatCompletionRequest.model_validate(body), body, "req-1")


def completion(**fields: Any) -> ClientRequest:
    body = {"model": "sim", "prompt": "Once upon a time", **fields}
    return ClientRequest("completion", CompletionRequest.model_validate(body), body, "req-2")


async def started(profile: SimulationProfile = FAST, **kwargs: Any) -> SimulatedBackend:
    deployment = SimulatedDeployment(backend="simulated", profile=profile)
    backend = SimulatedBackend(deployment, "sim", "sim-0", **kwargs)
    await backend.start()
    return backend


async def collect(chunks: AsyncIterator[Any]) -> list[Any]:
    return [chunk async for chunk in chunks]


async def test_it_is_a_backend_with_a_model_card():
    backend = await started()
    assert isinstance(backend, Backend)
    assert (backend.name, backend.model_ids, backend.is_ready) == ("sim-0", ("sim",), True)
    assert backend.model_card("sim").id == "sim"
    await backend.shutdown()
    assert not backend.is_ready


async def test_chat_answer():
    backend = await started()
    answer = await backend.complete(chat(max_tokens=3))
    assert isinstance(answer, ChatCompletion) and answer.model == "sim"
    (choice,) = answer.choices
    assert len(choice.message.content.split(" ")) == 3 and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 3 and answer.usage.prompt_tokens > 0
    assert backend.stats()["completed"] == 1


async def test_completion_answer_takes_the_profile_length_without_max_tokens():
    answer = await (await started()).complete(completion())
    assert isinstance(answer, Completion) and answer.choices[0].finish_reason == "stop"
    assert len(answer.choices[0].text.split(" ")) == 5


async def test_chat_stream_with_usage():
    backend = await started()
    chunks = await collect(
        backend.stream(chat(stream=True, stream_options={"include_usage": True}))
    )
    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert len(text.split(" ")) == 5
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    stats = backend.stats()
    assert (stats["completed"], stats["active_streams"], stats["cancelled"]) == (1, 0, 0)


async def test_completion_stream():
    chunks = await collect((await started()).stream(completion(stream=True, max_tokens=2)))
    assert all(isinstance(chunk, Completion) for chunk in chunks)
    assert [chunk.choices[0].finish_reason for chunk in chunks] == [None, None, "length"]


@pytest.mark.parametrize(
    ("status", "retry_after", "is_retryable"),
    [(429, 2.0, True), (503, 2.0, True), (400, None, False)],
)
async def test_errors_are_raised_before_the_first_chunk(
    status: int, retry_after: float | None, is_retryable: bool
):
    profile = FAST.model_copy(
        update={"error_probability": 1.0, "error_status": status, "retry_after_s": 2.0}
    )
    backend = await started(profile)
    stream = backend.stream(chat(stream=True))
    with pytest.raises(UpstreamError) as caught:
        await anext(stream)
    error = caught.value
    assert (error.status_code, error.retry_after, error.is_retryable) == (
        status,
        retry_after,
        is_retryable,
    )
    with pytest.raises(UpstreamError):
        await backend.complete(chat())
    assert backend.stats()["errors"] == {str(status): 2}


async def test_a_reset_is_a_connection_error_before_the_first_chunk():
    backend = await started(FAST.model_copy(update={"reset_probability": 1.0}))
    with pytest.raises(UpstreamConnectionError):
        await anext(backend.stream(chat(stream=True)))
    with pytest.raises(UpstreamConnectionError):
        await backend.complete(chat())
    assert backend.stats()["resets"] == 2


async def test_not_started_is_refused():
    deployment = SimulatedDeployment(backend="simulated", profile=FAST)
    backend = SimulatedBackend(deployment, "sim", "sim-0")
    with pytest.raises(ServiceUnavailableError):
        await backend.complete(chat())


async def test_a_stall_silences_the_stream_after_its_first_chunk():
    backend = await started(FAST.model_copy(update={"stall_probability": 1.0, "stall_s": 0.2}))
    stream = backend.stream(chat(stream=True))
    await anext(stream)
    started_at = time.monotonic()
    await anext(stream)
    # The stall began as the first chunk went out, a little before ``started_at``, and asyncio
    # may fire its timer up to its clock resolution early (seen: 0.1995 s).
    assert time.monotonic() - started_at >= 0.19
    assert backend.stats()["stalls"] == 1
    await stream.aclose()


async def test_cancelling_a_stalled_stream_stops_it_at_once():
    backend = await started(FAST.model_copy(update={"stall_probability": 1.0, "stall_s": 30}))
    stream = backend.stream(chat(stream=True))
    await anext(stream)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.02)
    assert backend.stats()["active_streams"] == 1
    started_at = time.monotonic()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert time.monotonic() - started_at < 0.1
    stats = backend.stats()
    assert (stats["cancelled"], stats["active_streams"], stats["completed"]) == (1, 0, 0)


async def test_closing_a_stream_early_counts_as_cancelled():
    backend = await started(FAST.model_copy(update={"output_tokens": 50}))
    stream = backend.stream(chat(stream=True))
    await anext(stream)
    await stream.aclose()
    assert backend.stats()["cancelled"] == 1 and backend.stats()["active"] == 0


async def test_a_timed_out_answer_is_cancelled_at_once():
    backend = await started(FAST.model_copy(update={"ttft_s": 30}))
    started_at = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(backend.complete(chat()), timeout=0.05)
    assert time.monotonic() - started_at < 0.2
    assert backend.stats()["cancelled"] == 1 and backend.stats()["active"] == 0


async def test_probe_fails_during_an_outage_only():
    clock = [0.0]
    outages = [Outage(start_s=10, duration_s=5), Outage(start_s=20, duration_s=5, status=503)]
    backend = await started(FAST.model_copy(update={"outages": outages}), now=lambda: clock[0])
    await backend.probe()
    clock[0] = 12
    with pytest.raises(UpstreamConnectionError):
        await backend.probe()
    with pytest.raises(UpstreamConnectionError):
        await anext(backend.stream(chat(stream=True)))
    clock[0] = 21
    with pytest.raises(UpstreamError) as caught:
        await backend.probe()
    assert caught.value.status_code == 503
    clock[0] = 25
    await backend.probe()
    assert backend.stats()["requests"] == 1  # probes are not requests


async def test_an_outage_beginning_mid_stream_cuts_it_after_its_chunks():
    profile = SimulationProfile(
        ttft_s=0.01,
        inter_token_s=0.05,
        output_tokens=10,
        outages=[Outage(start_s=0.1, duration_s=1)],
    )
    backend = await started(profile, now=lambda: 0.0)
    received = []
    with pytest.raises(UpstreamConnectionError):
        async for chunk in backend.stream(chat(stream=True)):
            received.append(chunk)
    assert len(received) == 2  # the tokens due at 0.01 and 0.06
    stats = backend.stats()
    assert (stats["cuts"], stats["cancelled"], stats["active_streams"]) == (1, 0, 0)


# ---- model-server mode (profile.server) ----------------------------------------------------

SERVED = SimulationProfile(
    output_tokens=3,
    server=ModelServerProfile(
        kv_cache_tokens=4096, step_cost=StepCostProfile(fixed_s=0.002, per_token_s=0.0001)
    ),
)
SYSTEM = {"role": "system", "content": "Reply briefly and kindly. " * 300}  # ~1,900 tokens


async def test_model_server_mode_caches_a_shared_prefix_and_counts_real_prompt_tokens():
    backend = await started(SERVED)
    try:
        timings = []
        for question in ("Hi?", "Bye?"):
            began = time.monotonic()
            answer = await backend.complete(
                chat(messages=[SYSTEM, {"role": "user", "content": question}])
            )
            timings.append(time.monotonic() - began)
            assert answer.usage.prompt_tokens > 1900 and answer.usage.completion_tokens == 3
        assert timings[0] > 0.19  # the whole prompt's prefill at 0.1 ms a token
        assert timings[1] < timings[0] / 2  # its cached blocks are skipped
        chunks = await collect(backend.stream(chat(messages=[SYSTEM], stream=True)))
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 3
    finally:
        await backend.shutdown()


async def test_model_server_mode_refuses_a_prompt_the_kv_cache_cannot_hold():
    backend = await started(SERVED)
    try:
        with pytest.raises(UpstreamError) as caught:
            await backend.complete(completion(prompt="x" * 20_000))
        assert caught.value.status_code == 400 and not caught.value.is_retryable
    finally:
        await backend.shutdown()
