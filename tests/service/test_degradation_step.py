"""The degrade step (service/degradation.py) alone: each rung of a model's ladder applied to a
request of the classes it covers, and relax_structured_output."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from titan.config import config_from_mapping
from titan.errors import OverloadedError
from titan.observability.metrics import TitanMetrics
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.service.authentication import Caller
from titan.service.degradation import DegradationLadders, relax_structured_output

BIG, SMALL = SimpleNamespace(name="big"), SimpleNamespace(name="small")
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def ladders(*steps: dict, level: int | None = None) -> DegradationLadders:
    sim = [{"backend": "simulated"}]
    ladder = {"queue_wait_p95_s": 1.0, "steps": list(steps)}
    config = config_from_mapping(
        {"models": [{"name": "big", "deployments": sim, "degradation": ladder},
                    {"name": "small", "deployments": sim}]},
        "test",
    )  # fmt: skip
    made = DegradationLadders(config, TitanMetrics())
    made.start(["big", "small"])
    made.controllers["big"].level = len(steps) if level is None else level
    return made


def request(**body) -> ClientRequest:
    data = {"model": "big", "messages": [{"role": "user", "content": "hi"}], **body}
    return ClientRequest("chat", ChatCompletionRequest.model_validate(data), data, "req-1")


def caller(priority: str = "normal") -> Caller:
    return Caller(None, None, priority)  # type: ignore[arg-type]


def named(name: str | None) -> SimpleNamespace:
    return {"big": BIG, "small": SMALL}[name]  # type: ignore[index]


def test_a_model_without_a_climbed_ladder_runs_as_asked():
    asked = request(max_tokens=50)
    degraded = ladders({"action": "cap_max_tokens", "max_tokens": 3}, level=0).degrade(
        caller(),
        asked,
        BIG,
        named,  # type: ignore[arg-type]
    )
    assert degraded.request is asked and degraded.model is BIG and not degraded.degradation.steps


def test_fallback_and_cap_apply_to_their_classes_only():
    made = ladders(
        {"action": "fallback_model", "model": "small", "priorities": ["normal"]},
        {"action": "cap_max_tokens", "max_tokens": 3, "priorities": ["normal"]},
    )
    degraded = made.degrade(caller("normal"), request(max_tokens=50), BIG, named)  # type: ignore[arg-type]
    assert degraded.model is SMALL and degraded.request.max_output_tokens == 3
    assert degraded.degradation.actions == ["fallback_model", "cap_max_tokens"]
    kept = made.degrade(caller("interactive"), request(max_tokens=50), BIG, named)  # type: ignore[arg-type]
    assert kept.model is BIG and kept.request.max_output_tokens == 50


def test_cache_only_answers_with_the_reply_or_refuses():
    reply = ladders({"action": "cache_only", "reply": "Busy."})
    degraded = reply.degrade(caller(), request(), BIG, named)  # type: ignore[arg-type]
    assert degraded.answered is not None
    assert degraded.answered.value.choices[0].message.content == "Busy."
    assert degraded.answered.headers == {"x-titan-degraded": "cache_only"}

    with pytest.raises(OverloadedError) as refused:
        ladders({"action": "cache_only"}).degrade(caller(), request(), BIG, named)  # type: ignore[arg-type]
    assert refused.value.code == "degraded_cache_only"


def test_relax_structured_output_drops_the_constraint_and_keeps_the_rest():
    asked = request(response_format=SCHEMA, guided_regex="a+", temperature=0)
    relaxed = relax_structured_output(asked)
    assert "response_format" not in relaxed.body and "guided_regex" not in relaxed.body
    assert relaxed.parsed.response_format is None and relaxed.body["temperature"] == 0
    plain = request(response_format={"type": "text"})
    assert relax_structured_output(plain) is plain
