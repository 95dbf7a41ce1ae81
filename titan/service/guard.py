"""Guardrails in the request flow: the input check before the cache and the model (block with a
400, redact, flag), the output check of whole answers and of streams, the metric and the log.

With no policies configured ``is_active`` is False and the flow never calls in here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from titan.config.guardrails import GuardrailsConfig
from titan.errors import ContentPolicyError
from titan.observability.metrics import TitanMetrics
from titan.protocol import Answer, ClientRequest, RawJSON, answer_bytes
from titan.service.guard_policies import Policy, build_policies
from titan.service.guard_stream import CONTENT_FILTER, guard_stream
from titan.service.guard_text import Outcome, apply, scan

logger = logging.getLogger("titan.guardrails")

GUARDRAILS_HEADER = "x-titan-guardrails"


class GuardHits:
    """The policies that matched one request (each counted once per stage), for the metric,
    the log and the ``x-titan-guardrails`` header."""

    def __init__(self, metrics: TitanMetrics, request_id: str):
        self.metrics = metrics
        self.request_id = request_id
        self.names: dict[str, None] = {}  # ordered, unique
        self._counted: set[tuple[str, str]] = set()

    def record(self, outcome: Outcome, stage: str) -> None:
        for name, policy in outcome.hits.items():
            self.names[name] = None
            if (name, stage) in self._counted:
                continue
            self._counted.add((name, stage))
            self.metrics.inc(self.metrics.guardrail_hits, name, stage, policy.action)
            # What was found is never logged: only its kind.
            logger.warning(
                "guardrail policy matched",
                extra={
                    "policy": name,
                    "stage": stage,
                    "action": policy.action,
                    "kinds": sorted(outcome.kinds.get(name, ())),
                    "request_id": self.request_id,
                },
            )

    def headers(self) -> dict[str, str]:
        return {GUARDRAILS_HEADER: ",".join(self.names)} if self.names else {}


class Guardrails:
    def __init__(self, config: GuardrailsConfig, metrics: TitanMetrics):
        self.metrics = metrics
        self.policies = build_policies(config)
        self.is_active = bool(self.policies)

    def hits_for(self, request: ClientRequest) -> GuardHits:
        return GuardHits(self.metrics, request.request_id)

    def _policies(self, stage: str, request: ClientRequest, model: str) -> tuple[Policy, ...]:
        models = (model,) if request.model in (None, model) else (request.model, model)
        return tuple(p for p in self.policies if p.applies(stage, models))  # type: ignore[arg-type]

    # ---- input ---------------------------------------------------------------------------

    async def check_input(
        self, request: ClientRequest, model: str, hits: GuardHits
    ) -> ClientRequest:
        """The request as the model may see it (redacted), or ContentPolicyError (block)."""
        policies = self._policies("input", request, model)
        if not policies:
            return request
        texts = input_texts(request)
        outcomes = []
        for text in texts:
            outcome = apply(text, await scan(policies, text, "input", model))
            hits.record(outcome, "input")
            if outcome.blocked_by is not None:
                kinds = sorted(outcome.kinds.get(outcome.blocked_by.name, ()))
                param = "messages" if request.endpoint == "chat" else "prompt"
                raise ContentPolicyError(outcome.blocked_by.name, kinds, param=param)
            outcomes.append(outcome.text)
        if outcomes == texts:
            return request
        body = with_input_texts(request, iter(outcomes))
        parsed = type(request.parsed).model_validate(body)
        return dataclasses.replace(request, body=body, parsed=parsed)

    # ---- output --------------------------------------------------------------------------

    async def check_answer(
        self, answer: Answer, request: ClientRequest, model: str, hits: GuardHits
    ) -> tuple[Answer, bool]:
        """The whole answer with its choices checked, and whether a policy blocked any of them
        (the answer is then not to be cached)."""
        policies = self._policies("output", request, model)
        if not policies:
            return answer, False
        body = orjson.loads(answer_bytes(answer))
        is_changed = is_blocked = False
        for choice in body.get("choices") or []:
            holder, key = _text_slot(choice, request.endpoint, "message")
            text = holder.get(key)
            if not isinstance(text, str) or not text:
                continue
            outcome = apply(text, await scan(policies, text, "output", model))
            hits.record(outcome, "output")
            if outcome.text != text or outcome.blocked_by is not None:
                holder[key] = outcome.text
                choice["logprobs"] = None  # they would spell out what was removed
                is_changed = True
            if outcome.blocked_by is not None:
                choice["finish_reason"] = CONTENT_FILTER
                is_blocked = True
        return (RawJSON(orjson.dumps(body)) if is_changed else answer), is_blocked

    def stream(
        self,
        stream: AsyncIterator[Answer],
        request: ClientRequest,
        model: str,
        hits: GuardHits,
        on_block: Callable[[], None],
    ) -> AsyncIterator[Answer]:
        policies = self._policies("output", request, model)
        if not policies:
            return stream
        return guard_stream(stream, policies, request, model, record=hits.record, on_block=on_block)


def input_texts(request: ClientRequest) -> list[str]:
    """Every text the model would read: each message's content (text parts included), or the
    completion prompt(s). Token-id prompts carry no text to check."""
    texts: list[str] = []
    _walk_input(request, texts.append)
    return texts


def with_input_texts(request: ClientRequest, replacements: Any) -> dict[str, Any]:
    """A copy of the request body with its texts (in ``input_texts`` order) replaced."""
    body = orjson.loads(orjson.dumps(dict(request.body)))
    _walk_input(dataclasses.replace(request, body=body), None, replacements)
    return body  # type: ignore[no-any-return]


def _walk_input(
    request: ClientRequest, see: Callable[[str], None] | None, replacements: Any = None
) -> None:
    def visit(holder: Any, key: Any) -> None:
        if see is not None:
            see(holder[key])
        else:
            holder[key] = next(replacements)

    body = request.body
    if request.endpoint == "chat":
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                visit(message, "content")
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        visit(part, "text")
        return
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        visit(body, "prompt")
    elif isinstance(prompt, list):
        for index, item in enumerate(prompt):
            if isinstance(item, str):
                visit(prompt, index)


def _text_slot(choice: dict[str, Any], endpoint: str, part: str) -> tuple[dict[str, Any], str]:
    """Where a choice keeps its text: ``message``/``delta`` ``content`` (chat), ``text``."""
    if endpoint == "chat":
        holder = choice.get(part)
        if not isinstance(holder, dict):
            holder = choice[part] = {}
        return holder, "content"
    return choice, "text"
