"""The workloads of the engine-against-llama.cpp benchmark, as one client sends them to any
OpenAI-compatible server: prompts as token ids (both servers read the same GGUF, so they see the
same tokens), greedy, ``ignore_eos``, streamed, and timed by Titan's load generator (one client
for every benchmark); conversations by a small SSE client, turn after turn.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from benchmarks.workload import BenchRequest, _sentence
from titan.loadgen import LoadTarget, OpenLoop, Sample, Workload, run_load_sync

REQUEST_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Server:
    name: str
    base_url: str  # without /v1
    model: str
    pid: int


class RefusedError(RuntimeError):
    """The server answered with an error status."""


def completion_body(request: BenchRequest) -> dict[str, Any]:
    return {
        "prompt": request.prompt_token_ids,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def run_at_once(server: Server, requests: list[BenchRequest]) -> dict[str, Any]:
    """Every request sent at t=0: aggregate generated tokens/s, TTFT percentiles, failures."""
    workload = Workload("at-once", tuple(completion_body(r) for r in requests))
    run = run_load_sync(
        LoadTarget(f"{server.base_url}/v1", server.model), OpenLoop(rate=math.inf), workload,
        num_requests=len(requests), timeout_s=REQUEST_TIMEOUT_S,
    )  # fmt: skip
    answered = [s for s in run.samples if s.is_ok]
    ttfts = sorted(s.ttft_s for s in answered if s.ttft_s is not None)
    generated = sum(s.output_tokens for s in answered)
    return {
        "num_requests": len(requests),
        "num_failed": len(run.samples) - len(answered),
        "errors": sorted({s.error or str(s.status) for s in run.samples if not s.is_ok}),
        "generated_tokens": generated,
        "wall_s": run.wall_s,
        "tokens_per_s": generated / run.wall_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
    }


def run_one(server: Server, request: BenchRequest) -> Sample:
    workload = Workload("one", (completion_body(request),))
    run = run_load_sync(
        LoadTarget(f"{server.base_url}/v1", server.model), OpenLoop(rate=math.inf), workload,
        num_requests=1, timeout_s=REQUEST_TIMEOUT_S,
    )  # fmt: skip
    (sample,) = run.samples
    if not sample.is_ok:
        raise RuntimeError(f"{server.name}: the request failed: {sample.status} {sample.error}")
    return sample


def decode_rate(sample: Sample) -> float:
    """Tokens/s from the first token to the last (the prefill excluded)."""
    return len(sample.itl_s) / sum(sample.itl_s)


def conversation_turns(seed: int, num_turns: int, tokens_per_turn: int) -> list[str]:
    """User turns of about ``tokens_per_turn`` tokens each (notes, then a question about them)."""
    rng = random.Random(seed)
    turns = []
    for index in range(num_turns):
        notes: list[str] = []
        while sum(len(n) for n in notes) < tokens_per_turn * 4.2:  # ~4.2 characters a token
            notes.append(_sentence(rng))
        turns.append(f"Notes, part {index + 1}:\n" + " ".join(notes) + "\nWhat changed most?")
    return turns


def titan_conversation(server: Server, turns: list[str], max_output_tokens: int) -> list[dict]:
    """The turns through Titan's /v1/responses, each continuing the previous response."""
    results, previous = [], None
    for text in turns:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:  # a connection a turn, as both
            body: dict[str, Any] = {
                "model": server.model, "input": text, "stream": True, "temperature": 0,
                "max_output_tokens": max_output_tokens, "instructions": "Answer in one sentence.",
            }  # fmt: skip
            if previous is not None:
                body["previous_response_id"] = previous
            ttft, events = _stream(client, f"{server.base_url}/v1/responses", body, "delta")
            finals = ("response.completed", "response.incomplete")  # max_output_tokens ends it
            completed = next(e for e in reversed(events) if e.get("type") in finals)
            response = completed["response"]
            previous = response["id"]
            usage = response.get("usage") or {}
            details = usage.get("input_tokens_details") or {}
            context = response.get("context") or {}
            results.append({
                "ttft_s": ttft,
                "prompt_tokens": usage.get("input_tokens"),
                "cached_tokens": details.get("cached_tokens"),
                "dropped_turns": context.get("dropped_turns", 0),
            })  # fmt: skip
    return results


def chat_conversation(server: Server, turns: list[str], max_output_tokens: int) -> list[dict]:
    """The turns through /v1/chat/completions with the whole history sent each time (what a
    client of llama-server does: it has no server-side conversations)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer in one sentence."}]
    results = []
    for text in turns:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:  # llama-server drops idle ones
            messages.append({"role": "user", "content": text})
            body = {
                "model": server.model, "messages": messages, "stream": True, "temperature": 0,
                "max_tokens": max_output_tokens, "stream_options": {"include_usage": True},
                "cache_prompt": True,
            }  # fmt: skip
            url = f"{server.base_url}/v1/chat/completions"
            try:
                ttft, events = _stream(client, url, body, "choices")
            except RefusedError as exc:  # past its context: a client would have to cut it
                results.append({"refused": str(exc)[:200]})
                break
            answer = "".join(
                (choice.get("delta") or {}).get("content") or ""
                for event in events
                for choice in event.get("choices") or []
            )
            messages.append({"role": "assistant", "content": answer})
            usage = next((e["usage"] for e in reversed(events) if e.get("usage")), {})
            details = usage.get("prompt_tokens_details") or {}
            results.append({
                "ttft_s": ttft,
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": details.get("cached_tokens"),
                "dropped_turns": 0,
            })  # fmt: skip
    return results


def _stream(client: httpx.Client, url: str, body: dict, marker: str) -> tuple[float, list[dict]]:
    """POST a streaming request; (time to the first event carrying text, every JSON event)."""
    started, first, events = time.perf_counter(), None, []
    with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise RefusedError(f"{url}: {response.status_code} {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = orjson.loads(line[5:])
            events.append(event)
            if first is None and _has_text(event, marker):
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url}: the stream carried no text")
    return first - started, events


def _has_text(event: dict, marker: str) -> bool:
    if marker == "delta":  # a Responses event
        return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    index = min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))
    return sorted(values)[index]


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM) so far."""
    for line in open(f"/proc/{pid}/status").read().splitlines():  # noqa: SIM115
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan
