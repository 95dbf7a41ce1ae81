"""How much of a server-side conversation the Responses API keeps: on a CPU the embedded engine's
conversations stop at 4,096 tokens unless the config says otherwise, on a GPU at the window; a
newest turn longer than that still runs, and ``truncation: disabled`` is held to the window."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from tests.api.conftest import make_app
from tests.api.fakes import FakeEngine
from titan.backends.embedded.engine_handle import CPU_CONVERSATION_WINDOW
from titan.config import TitanConfig

WINDOW, OUTPUT, RESERVE = 8192, 8, 16
TURN = "x" * 1000  # the fake tokenizer: a token a byte


@asynccontextmanager
async def served(device_type: str, **context: Any) -> AsyncIterator[httpx.AsyncClient]:
    engine = FakeEngine(max_model_len=WINDOW, device_type=device_type)
    app = make_app(engine, TitanConfig(context=context))
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://titan.test") as client:
            yield client


async def conversation(
    client: httpx.AsyncClient, inputs: list[str], **options: Any
) -> list[dict[str, Any]]:
    """Each turn's response body, chained by previous_response_id."""
    bodies, previous = [], None
    for text in inputs:
        answer = await client.post(
            "/v1/responses",
            json={"input": text, "max_output_tokens": OUTPUT, "previous_response_id": previous,
                  **options},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        bodies.append(answer.json())
        previous = bodies[-1]["id"]
    return bodies


async def test_on_a_cpu_a_conversation_keeps_at_most_4096_tokens():
    async with served("cpu") as client:
        bodies = await conversation(client, [TURN] * 8)
    assert CPU_CONVERSATION_WINDOW == 4096
    assert {body["context"]["prompt_budget"] for body in bodies} == {4096}
    assert all(body["usage"]["input_tokens"] <= 4096 for body in bodies)
    assert bodies[0]["context"]["dropped_turns"] == 0
    assert bodies[-1]["context"]["dropped_turns"] > 0


async def test_on_a_gpu_a_conversation_keeps_the_window():
    async with served("cuda") as client:
        bodies = await conversation(client, [TURN] * 7)
    assert {body["context"]["prompt_budget"] for body in bodies} == {WINDOW - OUTPUT - RESERVE}
    assert all(body["context"]["dropped_turns"] == 0 for body in bodies)
    assert bodies[-1]["usage"]["input_tokens"] > 7000


async def test_the_config_sets_the_conversation_window_anywhere():
    for device_type, window in (("cuda", 2048), ("cpu", 6000), ("cpu", 100_000)):
        async with served(device_type, conversation_window=window) as client:
            bodies = await conversation(client, [TURN] * 8)
        budget = min(window, WINDOW - OUTPUT - RESERVE)
        assert {body["context"]["prompt_budget"] for body in bodies} == {budget}
        assert max(body["usage"]["input_tokens"] for body in bodies) > budget - 1200
        assert all(body["usage"]["input_tokens"] <= budget for body in bodies)


async def test_a_newest_turn_longer_than_the_conversation_window_runs_alone():
    async with served("cpu") as client:
        bodies = await conversation(client, [TURN, "y" * 5000])
        too_long = await client.post("/v1/responses", json={"input": "z" * WINDOW})
    assert bodies[1]["context"]["dropped_turns"] == 1
    assert 5000 < bodies[1]["usage"]["input_tokens"] <= WINDOW
    assert too_long.status_code == 400
    assert f"the budget is {WINDOW - 256 - RESERVE}" in too_long.json()["error"]["message"]


async def test_truncation_disabled_is_held_to_the_model_window_alone():
    async with served("cpu") as client:
        bodies = await conversation(client, [TURN] * 6, truncation="disabled")
    assert all(body["context"]["dropped_turns"] == 0 for body in bodies)
    assert bodies[-1]["usage"]["input_tokens"] > 6000
