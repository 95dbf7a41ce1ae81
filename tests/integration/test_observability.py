"""Observability over a real server: per-request metrics with vLLM's names, goodput, one JSON
log line per request (content redacted when logged at all), ``x-titan-timings``, and /metrics
listing the live state of deployments."""

from __future__ import annotations

import logging

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import running_titan

SIM = {"name": "sim", "deployments": [{"backend": "simulated", "profile": {"ttft_s": 0.01}}]}


def config(**observability) -> dict:
    return {"models": [SIM], "probes": {"enabled": False}, "cache": {"exact": False},
            "observability": observability}  # fmt: skip


def samples(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{base_url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_requests_are_counted_timed_and_judged_against_the_slo():
    slo = {"ttft_s": 5.0, "e2e_s": 10.0, "inter_token_s": 1.0}
    with running_titan(config(slo=slo)) as titan:
        client = openai.OpenAI(base_url=f"{titan}/v1", api_key="none", max_retries=0)
        for n in range(3):
            hello = [{"role": "user", "content": f"hi {n}"}]
            client.chat.completions.create(model="sim", max_tokens=4, messages=hello)
        stream = client.chat.completions.create(
            model="sim", max_tokens=8, stream=True, messages=[{"role": "user", "content": "go"}]
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )
        found = samples(titan)
    assert value(found, "titan_requests_total", model="sim", status="200") == 4
    assert value(found, "titan_requests_total", model="unknown", status="404") == 1
    assert value(found, "titan_time_to_first_token_seconds_count", model="sim") == 4
    assert value(found, "titan_e2e_request_latency_seconds_count", model="sim") == 4
    assert value(found, "titan_request_queue_time_seconds_count", model="sim") == 4
    assert value(found, "titan_inter_token_latency_seconds_count", model="sim") >= 5
    assert value(found, "titan_goodput_requests_total", model="sim", tenant="none") == 4
    # Live state, read at the scrape.
    assert value(found, "titan_circuit_state", model="sim", deployment="sim-0") == 0
    assert value(found, "titan_attempts_total", model="sim", deployment="sim-0",
                 outcome="success") == 4  # fmt: skip


def test_a_tight_slo_counts_no_goodput():
    with running_titan(config(slo={"ttft_s": 0.001, "e2e_s": None, "inter_token_s": None})) as t:
        httpx.post(
            f"{t}/v1/chat/completions",
            json={"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        found = samples(t)
    assert value(found, "titan_request_success_total", model="sim") == 1
    assert value(found, "titan_goodput_requests_total", model="sim", tenant="none") == 0


def test_timings_on_demand_in_a_header_and_the_usage():
    body = {"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with running_titan(config()) as titan:
        timed = httpx.post(f"{titan}/v1/chat/completions", json=body,
                           headers={"x-titan-timings": "1"})  # fmt: skip
        plain = httpx.post(f"{titan}/v1/chat/completions", json=body)
        streamed = httpx.post(
            f"{titan}/v1/chat/completions", headers={"x-titan-timings": "1"},
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
        )  # fmt: skip
    parts = dict(part.split("=") for part in timed.headers["x-titan-timings"].split(";"))
    assert set(parts) == {"queue", "ttft", "total"}
    assert 0 <= float(parts["queue"]) <= float(parts["ttft"]) <= float(parts["total"])
    timings = timed.json()["usage"]["titan_timings"]
    assert timings["total_s"] == float(parts["total"]) and timings["ttft_s"] > 0
    assert "x-titan-timings" not in plain.headers and "titan_timings" not in plain.json()["usage"]
    assert "ttft=" in streamed.headers["x-titan-timings"]
    usage_events = [line for line in streamed.text.splitlines() if '"usage"' in line]
    assert usage_events and "titan_timings" in usage_events[-1]


def request_lines(text: str) -> list[dict]:
    entries = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [entry for entry in entries if entry.get("logger") == "titan.requests"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_content_log_shows_the_prompt_as_the_guardrails_redacted_it(caplog, capsys, stream):
    caplog.set_level(logging.INFO, logger="titan.requests")
    policy = {"name": "codename", "stages": ["input"], "action": "redact",
              "blocklist": ["project nightingale"]}  # fmt: skip
    guarded = {**config(log_content=True), "guardrails": {"policies": [policy]}}
    with running_titan(guarded) as titan:
        messages = [{"role": "user", "content": "status of Project Nightingale?"}]
        body = {"model": "sim", "max_tokens": 2, "stream": stream, "messages": messages}
        answered = httpx.post(f"{titan}/v1/chat/completions", json=body)
        assert answered.status_code == 200
    (line,) = request_lines(capsys.readouterr().err)
    assert line["content"]["prompt"] == "status of [REDACTED_BLOCKLIST]?"


def test_one_log_line_per_request_and_content_only_redacted(caplog, capsys):
    caplog.set_level(logging.INFO, logger="titan.requests")  # the lines follow its level
    secret = "Mail jane.doe@example.com or call +44 20 7946 0958, key sk-titan-abc123def456"
    with running_titan(config(log_content=True)) as titan:
        httpx.post(f"{titan}/v1/chat/completions", headers={"x-request-id": "req-observed"},
                   json={"model": "sim", "max_tokens": 4,
                         "messages": [{"role": "user", "content": secret}]})  # fmt: skip
    (line,) = [r for r in request_lines(capsys.readouterr().err)
               if r["request_id"] == "req-observed"]  # fmt: skip
    assert line["msg"] == "request" and line["level"] == "info" and line["ts"]
    assert line["status"] == 200 and line["model"] == "sim"
    assert line["deployment"] == "sim-0" and line["attempts"] == 1 and line["cache"] == "none"
    assert line["total_s"] > 0 and line["prompt_tokens"] > 0 and line["completion_tokens"] == 4
    logged = line["content"]["prompt"]
    assert "[email]" in logged and "[number]" in logged and "[key]" in logged
    assert "jane.doe" not in logged and "7946" not in logged and "abc123" not in logged
    with running_titan(config()) as titan:  # content is off by default
        httpx.post(
            f"{titan}/v1/chat/completions",
            json={
                "model": "sim",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": secret}],
            },
        )
    (line,) = request_lines(capsys.readouterr().err)
    assert "content" not in line and secret not in str(line)
    caplog.set_level(logging.WARNING, logger="titan.requests")
    with running_titan(config()) as titan:  # below the logger's level: no lines
        httpx.post(f"{titan}/v1/chat/completions", json={"model": "sim", "max_tokens": 2,
                   "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert request_lines(capsys.readouterr().err) == []
