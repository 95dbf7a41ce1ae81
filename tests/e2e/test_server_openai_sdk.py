"""End to end: `titan serve` in a subprocess with the real embedded model, the official openai
SDK as the client. The server starts once per session (--max-model-len 256 keeps the
context-window errors cheap)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 256
STARTUP_TIMEOUT_S = 300
USER = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, num_lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a running, ready `titan serve`."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    command = [
        sys.executable,
        "-m",
        "titan",
        "serve",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory",
        "64MiB",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"titan serve exited ({process.returncode}):\n{_tail(log_path)}")
            try:
                if httpx.get(f"{base_url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"titan serve not ready after {STARTUP_TIMEOUT_S}s:\n{_tail(log_path)}")
            time.sleep(0.5)
        yield base_url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # uvicorn re-raises the signal after a clean shutdown, so the exit code says "SIGINT".
    log_text = log_path.read_text(errors="replace")
    assert "Application shutdown complete" in log_text, _tail(log_path)
    assert '"level":"error"' not in log_text, _tail(log_path)


@pytest.fixture(scope="session")
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="session")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_health_and_models(server: str, client: openai.OpenAI, model: str) -> None:
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    models = client.models.list().data
    assert [card.id for card in models] == [model]
    assert client.models.retrieve(model).id == model


def test_chat_and_its_stream_agree(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model, messages=USER, max_tokens=12, temperature=0
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None and 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    stream = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, stream_usage, finish_reasons = "", None, []
    for chunk in stream:
        for streamed in chunk.choices:
            text += streamed.delta.content or ""
            if streamed.finish_reason:
                finish_reasons.append(streamed.finish_reason)
        stream_usage = chunk.usage or stream_usage
    assert text == choice.message.content  # greedy: the same answer either way
    assert finish_reasons == [choice.finish_reason]
    assert stream_usage is not None
    assert stream_usage.completion_tokens == usage.completion_tokens
    assert stream_usage.prompt_tokens == usage.prompt_tokens


def test_completions(client: openai.OpenAI, model: str) -> None:
    prompt = "The capital of France is"
    completion = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    text = completion.choices[0].text
    assert text and completion.usage is not None and completion.usage.completion_tokens <= 8

    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == text

    echoed = client.completions.create(
        model=model, prompt=[prompt, "One, two,"], max_tokens=4, temperature=0, echo=True
    )
    assert [choice.index for choice in echoed.choices] == [0, 1]
    assert echoed.choices[0].text.startswith(prompt)
    assert echoed.choices[1].text.startswith("One, two,")


def test_n_choices(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model, messages=USER, max_tokens=6, n=2, seed=7, temperature=1.0
    )
    assert sorted(choice.index for choice in completion.choices) == [0, 1]
    assert all(choice.message.content is not None for choice in completion.choices)


def test_logprobs(client: openai.OpenAI, model: str) -> None:
    chat = client.chat.completions.create(
        model=model, messages=USER, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    first = logprobs.content[0]
    assert first.logprob <= 0 and len(first.top_logprobs) == 2 and first.bytes is not None
    # Greedy: the chosen token is the most likely one.
    assert first.top_logprobs[0].logprob == pytest.approx(first.logprob, abs=1e-3)

    completion = client.completions.create(
        model=model, prompt="Hello", max_tokens=3, temperature=0, logprobs=2
    )
    legacy = completion.choices[0].logprobs
    assert legacy is not None and legacy.tokens and legacy.token_logprobs
    assert len(legacy.tokens) == len(legacy.token_logprobs) == len(legacy.text_offset or [])


def test_unknown_model_is_404(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=USER)
    assert exc.value.code == "model_not_found"
    assert model in exc.value.message


def test_prompt_longer_than_the_context_window_is_400(client: openai.OpenAI, model: str) -> None:
    long_messages = [{"role": "user", "content": "hello " * 400}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model, messages=long_messages, max_tokens=10)
    assert exc.value.code == "context_length_exceeded"
    message = exc.value.message
    assert f"{MAX_MODEL_LEN} tokens" in message
    counts = re.search(r"\((\d+) in the messages, 10 in the completion\)", message)
    assert counts is not None and int(counts.group(1)) > MAX_MODEL_LEN, message


@pytest.mark.parametrize(("param", "value"), [("temperature", 5), ("top_logprobs", 30), ("n", 0)])
def test_bad_parameters_are_400_naming_them(
    client: openai.OpenAI, model: str, param: str, value: int
) -> None:
    extra = {"logprobs": True} if param == "top_logprobs" else {}
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=model, messages=USER, max_tokens=2, **{param: value}, **extra
        )
    assert exc.value.param == param
    assert param in exc.value.message


def test_malformed_json_is_400(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_route_and_method(server: str) -> None:
    assert httpx.get(f"{server}/v1/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{server}/v1/chat/completions").status_code == 405


def test_disconnecting_stream_leaves_the_server_healthy(
    server: str, client: openai.OpenAI, model: str
) -> None:
    body = {
        "model": model,
        "messages": USER,
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{server}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received[0].startswith("data: {")
    # The client hung up mid-stream: the engine aborts the request and frees its blocks.
    stats = wait_for_idle_engine(server, model)
    assert stats["num_requests_aborted"] >= 1
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    after = client.chat.completions.create(model=model, messages=USER, max_tokens=4)
    assert after.choices[0].message.content is not None
    assert httpx.get(f"{server}/ready").status_code == 200


def test_disconnecting_before_a_json_answer_aborts_the_engine_request(
    server: str, model: str
) -> None:
    before = engine_stats(server, model)["num_requests_aborted"]
    body = {"model": model, "messages": USER, "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # 200 tokens take ~0.75 s at 270 tokens/s
        httpx.post(f"{server}/v1/chat/completions", json=body, timeout=0.2)
    stats = wait_for_idle_engine(server, model)
    assert stats["num_requests_aborted"] == before + 1
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def wait_for_idle_engine(server: str, model: str, timeout_s: float = 30.0) -> dict:
    """The engine's counters once nothing runs or waits (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine_stats(server, model)
        if stats["num_running"] == stats["num_waiting"] == stats["num_active_streams"] == 0:
            return stats
        assert time.monotonic() < deadline, f"the engine is still busy: {stats}"
        time.sleep(0.1)


def engine_stats(server: str, model: str) -> dict:
    """The embedded engine's counters, from the one deployment of ``model`` in /stats."""
    deployments = httpx.get(f"{server}/stats").json()["models"][model]["deployments"]
    (deployment,) = deployments.values()
    return deployment["backend"]
