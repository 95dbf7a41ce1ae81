"""Data at rest: the encryption keys tenant data is sealed with, and how long each kind is kept.

```yaml
data_at_rest:
  encryption_keys: ["${TITAN_DATA_KEY}", "${TITAN_DATA_KEY_OLD}"]  # the first encrypts
  retention: {conversations: 30d, files: 90d, agent_state: 7d}     # unset: kept for good
```

A key is 32 random bytes written as base64 (44 characters) or hex (64). Keys are secrets: they
are ``SecretStr`` (masked in repr, in config errors and in ``titan config check``) and a
message about a bad key names its position, never its text.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, SecretStr, field_validator

from titan.config.settings import Settings

KEY_BYTES = 32  # AES-256
CONFIG_KEY = "data_at_rest.encryption_keys"
# Retention kinds; "conversations" and "responses" are both the stored Responses (one document
# holds a response and the conversation up to it), so the shorter of the two applies to them.
RETENTION_KINDS = (
    "conversations",
    "responses",
    "files",
    "agent_state",
    "vector_stores",
    "batches",
)
# The document namespaces of each kind (the constants of titan.context and titan.jobs; a test
# checks they agree). Files and batches keep a second document under the same id.
RETENTION_NAMESPACES = {
    "conversations": ("responses",),
    "responses": ("responses",),
    "files": ("files", "file_contents"),
    "agent_state": ("agent_state",),
    "vector_stores": ("vector_stores",),
    "batches": ("batches", "batch_line_errors"),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}


def parse_duration(value: Any) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` or a number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '30d', '12h' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(
                f"invalid duration {value!r}: expected a number with a unit s, m, h, d or w "
                "(e.g. '30d', '12h')"
            )
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ValueError("a retention must be positive (leave it unset to keep data for good)")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def decode_key(text: str) -> bytes:
    """The 32 key bytes of a base64 or hex string; ValueError (without the text) otherwise."""
    stripped = text.strip()
    if re.fullmatch(r"[0-9a-fA-F]{64}", stripped):
        return bytes.fromhex(stripped)
    try:
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        try:
            raw = base64.urlsafe_b64decode(stripped)
        except (binascii.Error, ValueError):
            raw = b""
    if len(raw) != KEY_BYTES:
        raise ValueError(
            f"is not a {KEY_BYTES}-byte key in base64 (44 characters) or hex (64); make one with "
            '`python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"`'
        )
    return raw


class RetentionConfig(Settings):
    """How long each kind of tenant data is kept after its last write; None: for good."""

    conversations: Duration | None = None
    responses: Duration | None = None
    files: Duration | None = None
    agent_state: Duration | None = None
    vector_stores: Duration | None = None
    batches: Duration | None = None

    def seconds_by_kind(self) -> dict[str, float]:
        return {kind: s for kind in RETENTION_KINDS if (s := getattr(self, kind)) is not None}

    def seconds_by_namespace(self) -> dict[str, float]:
        """Each retained namespace's retention (the shortest, where two kinds share one)."""
        by_namespace: dict[str, float] = {}
        for kind, seconds in self.seconds_by_kind().items():
            for namespace in RETENTION_NAMESPACES[kind]:
                by_namespace[namespace] = min(seconds, by_namespace.get(namespace, seconds))
        return by_namespace


class DataAtRestConfig(Settings):
    # Empty: documents and cached answers are stored in clear (sealed ones then fail to read,
    # with a 503 naming this key, rather than being served as garbage).
    encryption_keys: list[SecretStr] = Field(default_factory=list)
    retention: RetentionConfig = RetentionConfig()
    # How often each replica purges expired data and drops the vectors of deleted stores.
    sweep_interval_s: float = Field(300.0, gt=0)

    @field_validator("encryption_keys")
    @classmethod
    def _valid_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        seen: set[bytes] = set()
        for index, key in enumerate(keys):
            try:
                raw = decode_key(key.get_secret_value())
            except ValueError as exc:
                # The position, never the value: config errors are printed and logged.
                raise ValueError(f"encryption_keys[{index}] {exc}") from None
            if raw in seen:
                raise ValueError(f"encryption_keys[{index}] repeats an earlier key")
            seen.add(raw)
        return keys

    def key_bytes(self) -> list[bytes]:
        """The keys, the encrypting one first."""
        return [decode_key(key.get_secret_value()) for key in self.encryption_keys]
