"""Render a model's chat template the way HF's ``apply_chat_template`` does (sandboxed jinja2)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from titan.errors import InvalidRequestError, ModelLoadError

# Used when a model ships no template: ChatML, the most common format among small chat models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TemplateRejected(Exception):
    """raise_exception() called by the template itself: the messages break its rules."""


def _raise_exception(message: str) -> None:
    raise TemplateRejected(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _compile(source: str):
    try:
        return _environment().from_string(source)
    except TemplateError as exc:
        raise ModelLoadError(f"the model's chat template does not compile: {exc}") from exc


def _free_variables(source: str) -> frozenset[str]:
    """The names the template reads from its context (``messages``, ``tools``, ...)."""
    try:
        return frozenset(meta.find_undeclared_variables(_environment().parse(source)))
    except TemplateError:
        return frozenset()


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str | None]):
        self.source = source
        self._template = _compile(source)
        self._special_tokens = special_tokens
        # HF's convention: a template that reads ``tools`` renders tool definitions itself
        # (apply_chat_template(messages, tools=...)); others get them in a system message.
        self.accepts_tools = "tools" in _free_variables(source)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        context = {**self._special_tokens, **template_kwargs}
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **context
            )
        except TemplateRejected as exc:
            raise InvalidRequestError(
                f"The model's chat template rejected the messages: {exc}", param="messages"
            ) from exc
        except (TemplateError, TypeError, KeyError, ValueError) as exc:
            raise InvalidRequestError(
                f"The messages could not be rendered with the model's chat template: {exc}",
                param="messages",
            ) from exc
