"""A real ``titan simulate`` process in model-server mode, through the openai SDK and /metrics:
prefix hits cut the second request's TTFT, a full KV cache queues requests, vLLM's names."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.simulate.harness import running_simulator
from titan.chaos.processes import free_port, start, stop, titan_argv
from titan.config import SimulationProfile

pytestmark = pytest.mark.slow  # a real server process

# 0.2 ms a prompt token: a 2,000-token prompt takes 0.4 s to prefill, a cached one ~10 ms.
PROFILE = {
    "output_tokens": 4,
    "server": {
        "kv_cache_tokens": 4096,
        "max_num_batched_tokens": 4096,
        "step_cost": {"fixed_s": 0.005, "per_token_s": 0.0002},
    },
}
VLLM_NAMES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("model-server")
    profile = directory / "server.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    base_url = f"http://127.0.0.1:{free_port()}"
    argv = titan_argv("simulate", "--port", base_url.rsplit(":", 1)[1], "--profile", str(profile))
    service = start(
        "simulate", argv, base_url, directory, ready_path="/health", timeout_s=30, cwd=Path.cwd()
    )
    try:
        yield base_url
    finally:
        stop(service)


def metrics(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics").text
    families = list(text_string_to_metric_families(text))
    assert {family.name for family in families} >= VLLM_NAMES
    return {
        sample.name: sample.value
        for family in families
        for sample in family.samples
        if "le" not in sample.labels
    }


def ttft_s(client: openai.OpenAI, messages: list[dict]) -> tuple[float, int]:
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - started
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    assert first is not None
    return first, prompt_tokens


def test_a_shared_prefix_hits_and_the_second_request_gets_its_first_token_sooner(simulator):
    system = {"role": "system", "content": "Answer in one short sentence, politely. " * 200}
    before = metrics(simulator)
    with openai.OpenAI(base_url=f"{simulator}/v1", api_key="unused", max_retries=0) as client:
        cold, prompt_tokens = ttft_s(client, [system, {"role": "user", "content": "Hi?"}])
        warm, _ = ttft_s(client, [system, {"role": "user", "content": "And you?"}])
    after = metrics(simulator)
    assert prompt_tokens > 2000 and cold > 0.4  # its whole prefill under the step cost
    assert warm < cold / 2
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits >= 1984  # the system prompt's whole blocks
    assert after["vllm:time_to_first_token_seconds_count"] >= 2
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8


def test_a_full_kv_cache_makes_requests_wait(simulator):
    def ask(index: int) -> None:
        body = {
            "model": "m",
            "prompt": chr(65 + index) * 6000,  # 1,500 tokens: two fit in the 4,096-token cache
            "max_tokens": 4,
        }
        assert httpx.post(f"{simulator}/v1/completions", json=body, timeout=30).status_code == 200

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    seen_waiting = 0.0
    while any(thread.is_alive() for thread in threads):
        seen_waiting = max(seen_waiting, metrics(simulator)["vllm:num_requests_waiting"])
        time.sleep(0.01)
    for thread in threads:
        thread.join()
    assert seen_waiting > 0
    final = metrics(simulator)
    assert final["vllm:num_requests_waiting"] == 0 and final["vllm:num_requests_running"] == 0


def test_a_request_longer_than_the_cache_is_a_400(simulator):
    body = {"model": "m", "prompt": "x" * 20_000}
    answer = httpx.post(f"{simulator}/v1/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"


def test_without_a_server_block_there_is_no_metrics_route():
    with running_simulator(SimulationProfile(ttft_s=0.001)) as base_url:
        assert httpx.get(f"{base_url}/metrics").status_code == 404
