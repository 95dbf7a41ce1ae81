"""Degradation under sustained overload: each model's ladder (a limits.degradation controller
fed the queue waits and first-token times) and ``degrade``, the step that applies it to one
request — a smaller model, a max_tokens cap, no output constraint, or cache-only answers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from titan.config import TitanConfig
from titan.errors import OverloadedError
from titan.limits.degradation import Degradation, DegradationController
from titan.observability.metrics import TitanMetrics
from titan.protocol import ClientRequest
from titan.router.registry import RoutedModel
from titan.service.accounting import canned_answer, canned_stream
from titan.service.admission import log_refusal
from titan.service.attempts import Routed
from titan.service.authentication import Caller


@dataclass(frozen=True)
class Degraded:
    """A request after its model's ladder: what to run where, or its answer already
    (``answered``: cache-only with a configured reply)."""

    request: ClientRequest
    model: RoutedModel
    degradation: Degradation
    answered: Routed[Any] | None = None


class DegradationLadders:
    def __init__(
        self,
        config: TitanConfig,
        metrics: TitanMetrics,
        *,
        now: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self.metrics = metrics
        self._now = now
        self.controllers: dict[str, DegradationController] = {}
        # A cache-only refusal's Retry-After: a quarter of the default admission deadline.
        self.retry_after_s = config.admission.default_deadline_s / 4

    def start(self, models: Iterable[str]) -> None:
        """A controller for each served model that has a ladder; its level gauge reads it when
        scraped."""
        served = set(models)
        for model in self.config.models:
            if model.degradation is not None and model.name in served:
                controller = DegradationController(model.degradation, now=self._now)
                self.controllers[model.name] = controller
                level = self.metrics.degradation_level.labels(model.name)
                level.set_function(lambda c=controller: c.level)

    def for_request(self, model: str, caller: Caller) -> Degradation:
        controller = self.controllers.get(model)
        return controller.for_request(caller.priority) if controller is not None else Degradation()

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        controller = self.controllers.get(model)
        if controller is not None:
            controller.observe_queue_wait(seconds)

    def observe_first_token(self, model: str, seconds: float) -> None:
        controller = self.controllers.get(model)
        if controller is not None:
            controller.observe_ttft(seconds)

    def snapshot(self, model: str) -> dict[str, object] | None:
        controller = self.controllers.get(model)
        return controller.snapshot() if controller is not None else None

    def degrade(
        self,
        caller: Caller,
        request: ClientRequest,
        model: RoutedModel,
        model_named: Callable[[str | None], RoutedModel],
    ) -> Degraded:
        """The steps of the model's ladder that apply to the caller's priority class. Called
        after the cache lookup missed: cache-only answers with the configured reply, else
        refuses (503) saying why."""
        degradation = self.for_request(model.name, caller)
        if (step := degradation.step("fallback_model")) is not None:
            model = model_named(step.model)
        if (step := degradation.step("cap_max_tokens")) is not None:
            request = request.with_max_output_tokens(step.max_tokens)  # type: ignore[arg-type]
        if degradation.step("relax_structured_output") is not None:
            request = relax_structured_output(request)
        if (step := degradation.step("cache_only")) is None:
            return Degraded(request, model, degradation)
        self.metrics.inc(self.metrics.degraded, model.name, "cache_only")
        if step.reply is not None:
            return Degraded(request, model, degradation, _canned(request, model, step.reply))
        error = OverloadedError(
            f"Model '{model.name}' is overloaded and answers requests of the "
            f"{caller.priority} class from the cache only; nothing is cached for this one. "
            "Retry later.",
            retry_after=self.retry_after_s,
            code="degraded_cache_only",
        )
        log_refusal(self.metrics, model.name, error, caller)
        raise error


def _canned(request: ClientRequest, model: RoutedModel, reply: str) -> Routed[Any]:
    value: Any = (
        canned_stream(request, model.name, reply)
        if request.is_stream
        else canned_answer(request, model.name, reply)
    )
    return Routed(value, model.name, "degraded", 0, {"x-titan-degraded": "cache_only"})


# The request fields that constrain the output's shape (OpenAI's and vLLM's).
STRUCTURED_OUTPUT_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def relax_structured_output(request: ClientRequest) -> ClientRequest:
    """The degradation step ``relax_structured_output``: the same request without its output
    constraint (response_format other than text, guided_*), so it runs unconstrained; the
    client sees ``x-titan-degraded: relax_structured_output`` and must validate the output."""
    body = request.body
    fields = [name for name in STRUCTURED_OUTPUT_FIELDS if body.get(name) is not None]
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        fields.append("response_format")
    if not fields:
        return request
    updates = {name: None for name in fields if name in type(request.parsed).model_fields}
    return dataclasses.replace(
        request,
        body={name: value for name, value in body.items() if name not in fields},
        parsed=request.parsed.model_copy(update=updates),
    )
