"""Guardrail policies made runnable: their detectors built, their custom hooks imported.

A custom hook is ``hook(text, *, stage, model)`` (a plain or an ``async`` function) returning
what it found in ``text``: ``None``/``False``/``[]`` (nothing), ``True`` (the whole text), or an
iterable of ``(start, end)`` character spans. The policy's action applies to what it returns.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from titan.config.guardrails import GuardrailPolicy, GuardrailsConfig
from titan.errors import ConfigError, ServiceUnavailableError
from titan.service.guard_detectors import (
    BUILTIN_DETECTORS,
    BlocklistDetector,
    Finding,
    PatternDetector,
)

logger = logging.getLogger("titan.guardrails")

HOOK_KIND = "hook"


class HookDetector:
    """A user's callable as a detector; a stream holds back ``hold_chars`` for it."""

    kind = HOOK_KIND

    def __init__(self, function: Callable[..., Any], path: str, policy: str, hold_chars: int):
        self.function = function
        self.path = path
        self.policy = policy
        self._hold_chars = hold_chars

    async def find(self, text: str, stage: str, model: str) -> list[Finding]:
        try:
            result = self.function(text, stage=stage, model=model)
            if inspect.isawaitable(result):
                result = await result
            return _spans(result, len(text))
        except Exception as exc:
            # Fail closed: a check that could not run lets nothing through unchecked.
            logger.exception("guardrail hook failed", extra={"hook": self.path})
            raise ServiceUnavailableError(
                f"The guardrail policy '{self.policy}' could not run its check "
                f"({type(exc).__name__}); unchecked content is refused. Retry later.",
                code="guardrail_unavailable",
            ) from None

    def hold_from(self, text: str) -> int:
        return max(0, len(text) - self._hold_chars)


def _spans(result: Any, length: int) -> list[Finding]:
    if result is None or result is False:
        return []
    if result is True:
        return [Finding(0, length, HOOK_KIND)] if length else []
    found = []
    for start, end in result:
        start, end = max(0, int(start)), min(length, int(end))
        if start < end:
            found.append(Finding(start, end, HOOK_KIND))
    return found


@dataclass(frozen=True)
class Policy:
    config: GuardrailPolicy
    detectors: tuple[Any, ...]  # the built-in ones: sync find(text), hold_from(text)
    hook: HookDetector | None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def action(self) -> str:
        return self.config.action

    def applies(self, stage: str, models: tuple[str, ...]) -> bool:
        if stage not in self.config.stages:
            return False
        return not self.config.models or any(m in self.config.models for m in models)

    async def find(self, text: str, stage: str, model: str) -> list[Finding]:
        found = [finding for detector in self.detectors for finding in detector.find(text)]
        if self.hook is not None:
            found += await self.hook.find(text, stage, model)
        return found

    def hold_from(self, text: str) -> int:
        detectors = [*self.detectors, self.hook] if self.hook is not None else self.detectors
        return min((detector.hold_from(text) for detector in detectors), default=len(text))


def build_policies(config: GuardrailsConfig) -> tuple[Policy, ...]:
    """Every configured policy, hooks imported now (a missing one is a ConfigError at startup,
    not a failure on the first request)."""
    return tuple(_build(index, policy) for index, policy in enumerate(config.policies))


def _build(index: int, policy: GuardrailPolicy) -> Policy:
    detectors: list[Any] = [BUILTIN_DETECTORS[name]() for name in dict.fromkeys(policy.detect)]
    if policy.blocklist:
        detectors.append(BlocklistDetector(policy.blocklist))
    if policy.patterns:
        detectors.append(PatternDetector(policy.patterns, policy.hold_chars))
    hook = None
    if policy.hook is not None:
        function = import_hook(policy.hook, f"guardrails.policies[{index}].hook")
        hook = HookDetector(function, policy.hook, policy.name, policy.hold_chars)
    return Policy(policy, tuple(detectors), hook)


def import_hook(path: str, key: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import module '{module_name}': {exc}") from None
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigError(f"{key}: module '{module_name}' has no attribute '{attribute}'")
    if not callable(function):
        raise ConfigError(f"{key}: '{path}' is not callable")
    return function  # type: ignore[no-any-return]
