"""n, best_of and beam search through the official openai SDK against a real uvicorn Titan
serving the real embedded model: seeded n choices equal seeded single requests (seed + i),
best_of returns the most likely samples, beam search returns n distinct sequences (width 1 =
greedy), bad combinations are 400s naming the parameter, and the KV pool ends fully free."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

CONFIG = {
    "models": [
        {
            "deployments": [
                {"backend": "embedded", "engine": {"max_model_len": 1024, "dtype": "float32"}}
            ]
        }
    ],
    "probes": {"enabled": False},
    "cache": {"exact": False},  # every request reaches the model
}
ASK = [{"role": "user", "content": "Name a fruit and say why you like it."}]
PROMPT = "My favourite season is"


def test_seeded_n_equals_seeded_single_requests(
    titan: str, client: openai.OpenAI, model: str
) -> None:
    cached_before = engine_stats(titan, model)["num_cached_prompt_tokens"]
    both = client.chat.completions.create(
        model=model, messages=ASK, n=3, seed=7, max_tokens=8, temperature=1.0
    )
    # The two other choices forked the first one's prompt KV (all but the last token each).
    cached = engine_stats(titan, model)["num_cached_prompt_tokens"] - cached_before
    assert cached == 2 * (both.usage.prompt_tokens - 1)
    assert [c.index for c in both.choices] == [0, 1, 2]
    singles = [
        client.chat.completions.create(
            model=model, messages=ASK, seed=7 + i, max_tokens=8, temperature=1.0
        ).choices[0]
        for i in range(3)
    ]
    assert [c.message.content for c in both.choices] == [c.message.content for c in singles]
    assert all(c.finish_reason in ("stop", "length") for c in both.choices)
    # Streamed, the same group gives the same choices.
    stream = client.chat.completions.create(
        model=model, messages=ASK, n=3, seed=7, max_tokens=8, temperature=1.0, stream=True
    )
    streamed = ["", "", ""]
    reasons = [None, None, None]
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert streamed == [c.message.content for c in both.choices]
    assert reasons == [c.finish_reason for c in both.choices]
    single = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    # The prompt is counted once, whatever n.
    assert both.usage.prompt_tokens == single.usage.prompt_tokens


def test_best_of_returns_the_most_likely_samples(client: openai.OpenAI, model: str) -> None:
    best = client.completions.create(
        model=model, prompt=PROMPT, n=2, best_of=4, seed=3, max_tokens=6, logprobs=0
    )
    assert [c.index for c in best.choices] == [0, 1]
    samples = client.completions.create(
        model=model, prompt=PROMPT, n=4, seed=3, max_tokens=6, logprobs=0
    )
    ranked = sorted(samples.choices, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]


def test_beam_search_through_the_sdk(client: openai.OpenAI, model: str) -> None:
    beams = client.completions.create(
        model=model, prompt=PROMPT, n=3, max_tokens=6, temperature=0,
        extra_body={"use_beam_search": True},
    )  # fmt: skip
    texts = [c.text for c in beams.choices]
    assert [c.index for c in beams.choices] == [0, 1, 2]
    assert len(set(texts)) == 3
    greedy = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
    width_one = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0,
        extra_body={"use_beam_search": True},
    )  # fmt: skip
    assert width_one.choices[0].text == greedy.choices[0].text
    chat = client.chat.completions.create(
        model=model, messages=ASK, n=2, max_tokens=6, temperature=0,
        extra_body={"use_beam_search": True, "length_penalty": 0.5},
    )  # fmt: skip
    assert len({c.message.content for c in chat.choices}) == 2


def test_bad_combinations_are_400s_naming_the_parameter(client: openai.OpenAI, model: str):
    cases = [
        ({"use_beam_search": True, "temperature": 0.7}, "temperature"),
        ({"use_beam_search": True, "stream": True}, "stream"),
        ({"use_beam_search": True, "n": 2, "best_of": 1}, "best_of"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=2, extra_body=extra)
        assert error.value.body["param"] == param


def engine_stats(titan: str, model: str) -> dict:
    deployments = httpx.get(f"{titan}/stats").json()["models"][model]["deployments"]
    (deployment,) = deployments.values()
    return deployment["backend"]


def wait_for_idle_engine(titan: str, model: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        stats = engine_stats(titan, model)
        if stats["num_running"] == stats["num_waiting"] == stats["num_active_streams"] == 0:
            return stats
        assert time.monotonic() < deadline, f"the engine is still busy: {stats}"
        time.sleep(0.05)


def test_disconnects_abort_the_whole_group_and_free_every_block(titan: str, model: str):
    long = {"model": model, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    # A streamed n=3 group, left after a few chunks.
    body = {**long, "messages": ASK, "n": 3, "stream": True, "temperature": 1.0}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{titan}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        received = [line for line, _ in zip(response.iter_lines(), range(8), strict=False)]
        assert any(line.startswith("data: {") for line in received)
    # A beam search, left before its answer.
    beam = {**long, "prompt": PROMPT, "n": 3, "use_beam_search": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{titan}/v1/completions", json=beam, timeout=1.0)
    stats = wait_for_idle_engine(titan, model)
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
