"""What a request asks of the engine, validated on construction: sampling (OpenAI's parameters
plus vLLM's extras), structured output, beam search."""

from __future__ import annotations

import math
from dataclasses import dataclass

from titan.errors import InvalidRequestError

MAX_LOGPROBS = 20

# The kinds of constrained decoding (structured output) the engine understands.
STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output: the engine masks every token the grammar would not accept.

    kind: one of STRUCTURED_KINDS.
    spec: json_schema: the schema as JSON text; regex: the pattern; grammar: the grammar text
          (Lark-like EBNF); json_object: "" (any JSON object); choice: "" (see ``choices``).
    choices: the allowed strings for kind "choice".
    param: the request field it came from, named in a 400 when the spec does not compile.
    """

    kind: str
    spec: str = ""
    choices: tuple[str, ...] = ()
    param: str = "response_format"

    def __post_init__(self) -> None:
        _check(
            self.kind in STRUCTURED_KINDS,
            self.param,
            f"unknown structured output kind {self.kind!r}; expected one of {STRUCTURED_KINDS}",
        )
        if self.kind == "choice":
            _check(bool(self.choices), self.param, "choice needs at least one string")
            _check(all(self.choices), self.param, "choices must not be empty strings")
        elif self.kind != "json_object":
            _check(bool(self.spec), self.param, f"{self.kind} needs a non-empty spec")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; k >= 0: the chosen token's logprob plus the k most likely.
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Constrained decoding (response_format / guided_* / forced tool calls); None: unconstrained.
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 1, "max_tokens", f"must be >= 1, got {self.max_tokens}")
        _check(
            0.0 <= self.temperature <= 2.0,
            "temperature",
            f"must be between 0 and 2, got {self.temperature}",
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(
            self.top_k == -1 or self.top_k >= 0,
            "top_k",
            f"must be -1 (disabled), 0 (disabled) or a positive integer, got {self.top_k}",
        )
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be between -2 and 2, got {self.presence_penalty}",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be between -2 and 2, got {self.frequency_penalty}",
        )
        _check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _check(
            self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})",
        )
        _check(
            self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
            "top_logprobs",
            f"must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}",
        )
        _check(all(s for s in self.stop), "stop", "stop strings must not be empty")
        _check(
            all(t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "token ids must be >= 0",
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def effective_top_k(self) -> int:
        """0 when top-k filtering is off."""
        return 0 if self.top_k in (0, -1) else self.top_k

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


# Each beam asks the sampler for its 2 * width most likely next tokens (as vLLM does).
MAX_BEAM_WIDTH = MAX_LOGPROBS // 2


@dataclass(frozen=True)
class BeamSearchParams:
    width: int  # beams kept per round (OpenAI/vLLM: best_of, else n)
    num_results: int  # sequences returned, best first (n)
    length_penalty: float = 1.0  # score = cum_logprob / num_output_tokens ** length_penalty

    def __post_init__(self) -> None:
        _check(
            1 <= self.width <= MAX_BEAM_WIDTH,
            "n",
            f"beam search supports a beam width (best_of, else n) from 1 to {MAX_BEAM_WIDTH}, "
            f"got {self.width}",
        )
        _check(
            1 <= self.num_results <= self.width,
            "best_of",
            f"it must be >= n ({self.num_results}) for beam search, got {self.width}",
        )
        _check(
            math.isfinite(self.length_penalty),
            "length_penalty",
            "it must be a finite number",
        )


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"Invalid value for '{param}': {message}.", param=param)
