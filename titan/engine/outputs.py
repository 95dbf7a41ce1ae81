"""What the engine hands back to callers: incremental outputs and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context window
    ABORT = "abort"  # cancelled by the caller (client disconnect) or shutdown


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str  # the token's own text; may be a partial UTF-8 character, see ``token_bytes``
    token_bytes: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log-probability (under the raw model distribution) and the top k."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class BeamOutput:
    """One sequence a beam search returns (scored as titan.engine.beam_scoring says)."""

    text: str
    token_ids: tuple[int, ...]
    cumulative_logprob: float
    score: float  # cumulative_logprob / num_output_tokens ** length_penalty
    finish_reason: FinishReason


@dataclass(frozen=True)
class RequestOutput:
    """One increment of a request: the text and tokens new since the previous output.

    Text can lag tokens: characters that might begin a stop string, or half of a UTF-8
    character, are held back until they are known to be output.
    """

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    is_finished: bool
    finish_reason: FinishReason | None
    # The stop string or token id that ended the request, if one did.
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_output_tokens: int  # cumulative
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    # Beam search only: the sequences returned, best first (``text`` is the best one's).
    beams: tuple[BeamOutput, ...] = ()


@dataclass
class EngineStats:
    """Counters since start; ``num_free_blocks == num_total_blocks`` at rest (no leaks)."""

    num_requests_added: int = 0
    num_requests_finished: int = 0
    num_requests_aborted: int = 0
    num_preemptions: int = 0
    num_prompt_tokens: int = 0
    num_computed_prompt_tokens: int = 0  # prompt tokens that went through the model
    num_cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    # Of those, copied from the request's conversation's last sequence (context shift).
    num_shifted_tokens: int = 0
    num_generated_tokens: int = 0
    num_steps: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    block_size: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def kv_cache_usage(self) -> float:
        if not self.num_total_blocks:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_total_blocks
