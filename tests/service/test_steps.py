"""The steps before the attempt runner (service/steps.py), each alone with fakes for its
collaborators: what it hands on, and what it notes on the request's record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from titan.observability.records import RequestRecord
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.router.registry import RequestTraits
from titan.service.authentication import Caller
from titan.service.degradation import Degraded
from titan.service.steps import admit, authenticate, deadline_at, guard_input, look_up_cache


def request(**body) -> ClientRequest:
    data = {"model": "m", "messages": [{"role": "user", "content": "call 555-0100"}], **body}
    return ClientRequest("chat", ChatCompletionRequest.model_validate(data), data, "req-1")


def record() -> RequestRecord:
    return RequestRecord("req-1", "chat")


CALLER = Caller(None, "127.0.0.1", "batch")


async def test_authenticate_notes_the_callers_tenant_and_class():
    class Auth:
        async def caller(self, asked):
            return CALLER

    noted = record()
    assert await authenticate(Auth(), request(), noted) is CALLER  # type: ignore[arg-type]
    assert (noted.tenant, noted.priority) == (None, "batch")


def test_a_deadline_is_the_header_else_the_default_else_none():
    assert deadline_at(100.0, 5.0, 30.0) == 105.0
    assert deadline_at(100.0, None, 30.0) == 130.0
    assert deadline_at(100.0, None, None) is None


class Guard:
    def __init__(self, redacts: bool):
        self.redacts = redacts

    def hits_for(self, asked):
        return "hits"

    async def check_input(self, asked, model, hits):
        if not self.redacts:
            return asked
        body = {**asked.body, "messages": [{"role": "user", "content": "call [number]"}]}
        return request(**body)


@pytest.mark.parametrize("logs_content", [True, False])
async def test_guard_input_hands_on_the_redacted_request(logs_content: bool):
    noted = record()
    checked, hits = await guard_input(
        Guard(redacts=True),
        request(),
        "m",
        noted,
        logs_content=logs_content,  # type: ignore[arg-type]
    )
    assert checked.body["messages"][0]["content"] == "call [number]" and hits == "hits"
    # The content log shows the prompt as redacted, never the original; only when it logs content.
    assert noted.redacted_prompt == ("call [number]" if logs_content else None)


async def test_guard_input_passes_an_untouched_request_on_as_it_is():
    asked, noted = request(), record()
    checked, _ = await guard_input(Guard(redacts=False), asked, "m", noted, logs_content=True)  # type: ignore[arg-type]
    assert checked is asked and noted.redacted_prompt is None


def plan(hit: str | None) -> SimpleNamespace:
    return SimpleNamespace(lookup=SimpleNamespace(hit=SimpleNamespace(kind=hit) if hit else None))


@pytest.mark.parametrize(("found", "noted_as"), [(None, "none"), (plan(None), "miss"),
                                                 (plan("exact"), "hit-exact")])  # fmt: skip
async def test_look_up_cache_notes_the_outcome_and_drops_titans_own_field(found, noted_as):
    class Cache:
        async def lookup(self, asked, tenant, model):
            assert "cache" in asked.body  # the lookup reads the client's directives
            return found

    noted = record()
    asked = request(cache="no-store", temperature=0)
    forwarded, got = await look_up_cache(Cache(), asked, "acme", "m", noted)  # type: ignore[arg-type]
    assert got is found and noted.cache == noted_as
    assert "cache" not in forwarded.body and forwarded.body["temperature"] == 0


async def test_admit_feeds_the_queue_wait_to_the_ladder_and_the_record():
    seen = {}

    class Admission:
        async def admit(self, caller, asked, model, prompt_chars, deadline, degradation):
            seen["admit"] = (caller, model, prompt_chars, deadline)
            return SimpleNamespace(model=model, admitted=SimpleNamespace(wait_s=0.25))

    class Ladders:
        def observe_queue_wait(self, model, seconds):
            seen["wait"] = (model, seconds)

    degraded = Degraded(request(), SimpleNamespace(name="small"), None)  # type: ignore[arg-type]
    noted = record()
    ticket = await admit(Admission(), Ladders(), CALLER, degraded, RequestTraits(prompt_chars=40),
                         123.0, noted)  # type: ignore[arg-type]  # fmt: skip
    assert seen == {"admit": (CALLER, "small", 40, 123.0), "wait": ("small", 0.25)}
    assert ticket.model == "small" and noted.queue_s == 0.25
