"""Guardrails: policies that check what goes to a model (``input``) and what comes back
(``output``), and block, redact or flag what they find. No policies (the default): nothing is
checked and the request path does no extra work."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from titan.config.settings import Settings

GuardAction = Literal["block", "redact", "flag"]
GuardStage = Literal["input", "output"]
# The built-in detectors a policy can name under ``detect``.
BuiltinDetector = Literal["email", "phone", "card", "secret"]

# Policy names become a metric label and a response header value: keep them plain.
_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HOOK_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class GuardrailPolicy(Settings):
    """One policy: what it looks for (built-in ``detect``ors, a ``blocklist`` of words and
    phrases, regex ``patterns``, a custom ``hook``), where (``stages``, ``models``) and what it
    does with a match (``action``)."""

    name: str
    action: GuardAction = "block"
    stages: tuple[GuardStage, ...] = ("input", "output")
    # Models (the names clients send) the policy applies to; empty: every model.
    models: tuple[str, ...] = ()
    detect: tuple[BuiltinDetector, ...] = ()
    # Words and phrases, matched case-insensitively on word boundaries.
    blocklist: tuple[str, ...] = ()
    # Python regular expressions (matched case-sensitively unless they say (?i)).
    patterns: tuple[str, ...] = ()
    # "package.module:function", imported at startup; see docs/guardrails.md for its interface.
    hook: str | None = None
    # Streams: characters held back for ``patterns`` and ``hook`` (the longest match they must
    # still see whole when it arrives split across chunks). Built-in detectors and the
    # blocklist hold back only what could still become a match.
    hold_chars: int = Field(64, ge=0, le=4096)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _POLICY_NAME.match(value):
            raise ValueError(
                f"policy name {value!r} must be 1-64 letters, digits, '_', '.' or '-' "
                "(it is a metric label and a header value)"
            )
        return value

    @field_validator("stages")
    @classmethod
    def _some_stage(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("stages must name 'input', 'output' or both")
        return tuple(dict.fromkeys(value))

    @field_validator("blocklist")
    @classmethod
    def _no_blank_words(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not word.strip() for word in value):
            raise ValueError("blocklist entries must not be blank")
        return value

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a valid regex: {exc}") from None
            if compiled.match(""):
                raise ValueError(f"pattern {pattern!r} matches the empty string")
        return value

    @field_validator("hook")
    @classmethod
    def _hook_path(cls, value: str | None) -> str | None:
        if value is not None and not _HOOK_PATH.match(value):
            raise ValueError(
                f"hook {value!r} must be 'package.module:function' (a module path, a colon, "
                "a callable's name)"
            )
        return value

    @model_validator(mode="after")
    def _detects_something(self) -> GuardrailPolicy:
        if not (self.detect or self.blocklist or self.patterns or self.hook):
            raise ValueError(
                f"policy '{self.name}' checks nothing: give detect, blocklist, patterns or hook"
            )
        return self


class GuardrailsConfig(Settings):
    """Policies run in order on each stage; a ``block`` anywhere wins over redactions."""

    policies: tuple[GuardrailPolicy, ...] = ()

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, value: tuple[GuardrailPolicy, ...]) -> tuple[GuardrailPolicy, ...]:
        names = [policy.name for policy in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"policy names must be unique; repeated: {', '.join(repeated)}")
        return value
