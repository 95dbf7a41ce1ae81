"""Settings shared by every concern: the base class, byte sizes, the HTTP server, and the
embedded engine's settings. Engine fields left as None take the engine's own defaults
(``titan.engine.config.EngineConfig``), so each default lives in one place.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

from titan.errors import ConfigError

LogLevel = Literal["debug", "info", "warning", "error", "critical"]

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_byte_size(text: str) -> int:
    """``"2GiB"`` → 2147483648, ``"512MiB"``, ``"1.5GB"``, ``"4096"``. Raises ConfigError."""
    match = _BYTE_SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_UNITS:
        raise ConfigError(
            f"invalid byte size {text!r}: expected a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. '2GiB'"
        )
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def _byte_size(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse_byte_size(value)
    except ConfigError as exc:
        # A ValueError lets pydantic report it at the field's key path, with the other problems.
        raise ValueError(exc.message) from None


ByteSize = Annotated[int, BeforeValidator(_byte_size), Field(gt=0)]


class Settings(BaseModel):
    """Typed, frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class RequestLimits(Settings):
    """Bounds on what one request may carry; each breach is a clear 4xx, never a 5xx."""

    max_body_bytes: ByteSize = 32 * 1024**2  # 413 past it; "32MiB" accepted
    # The request line and headers must arrive within this of the connection opening (or of a
    # keep-alive request's first byte): slowloris clients get 408 and lose the connection.
    header_timeout_s: float = Field(10.0, gt=0)
    # The whole body must arrive within this (slow or stalled uploads get 408).
    body_timeout_s: float = Field(30.0, gt=0)
    max_json_depth: int = Field(64, ge=2, le=1000)  # nested arrays/objects; orjson stops at 1024
    max_messages: int = Field(2048, ge=1)  # chat messages (and completion prompts) per request
    max_message_chars: int = Field(1_000_000, ge=1)  # characters in one message or prompt
    # The protocol's own ceilings still apply above these: n 128, stop 16, top_logprobs 20.
    max_n: int = Field(16, ge=1, le=128)  # also bounds best_of
    max_stop_sequences: int = Field(16, ge=1, le=16)  # OpenAI allows 4; vLLM has no limit


class ServerConfig(Settings):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: LogLevel = "info"
    # A request's total deadline (retries, hedges and fallbacks included) unless its
    # x-titan-timeout header sets one; None: only the per-attempt timeouts bound it.
    request_timeout_s: float | None = Field(None, gt=0)
    limits: RequestLimits = RequestLimits()


class ClientConfig(Settings):
    """How Titan's client commands (``titan jobs``, ``titan bench URL``) reach a server."""

    # None: the server this same config describes, http://<server.host>:<server.port>.
    url: str | None = None
    api_key: SecretStr | None = None  # sent as "Authorization: Bearer"

    def base_url(self, server: ServerConfig) -> str:
        """The server's root URL (``/v1`` is the API's: a trailing one is dropped)."""
        if self.url is not None:
            url = self.url.rstrip("/")
            return url.removesuffix("/v1")
        # A server listening on every address is reached on loopback from its own machine.
        host = "127.0.0.1" if server.host in ("0.0.0.0", "", "::") else server.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{server.port}"

    def bearer(self) -> str | None:
        return None if self.api_key is None else self.api_key.get_secret_value()


class EmbeddedModelConfig(Settings):
    """What ``titan.backends.embedded`` turns into an EngineConfig; None: the engine's default."""

    model: str | None = None  # a .gguf file or an HF directory; None: the bundled SmolLM2
    served_model_name: str | None = None
    device: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    # auto: a GGUF file's own quantized blocks on the CPU kernels (dense weights when a dtype is
    # set); none: dense weights in torch; q8_0: every matmul quantized to Q8_0 (HF directories).
    quantization: Literal["auto", "none", "q8_0"] | None = None
    # The quantized path's attention: auto (bfloat16 tiles with AMX; int8 scores and values
    # where the CPU has AVX-512 VNNI and BF16, or AVX2 and FMA) or float32.
    attention_precision: Literal["auto", "float32"] | None = None
    kv_cache_bytes: ByteSize | None = None  # "2GiB" accepted
    num_kv_blocks: int | None = Field(None, ge=2)
    block_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    num_threads: int | None = Field(None, ge=1)
    cache_dir: str | None = None

    def explicit_settings(self) -> dict[str, Any]:
        """Only the fields that were set, for building the engine's own config."""
        return {name: value for name, value in self.model_dump().items() if value is not None}
