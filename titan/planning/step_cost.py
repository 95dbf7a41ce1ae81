"""How long one engine step takes, as a function of what it computes: the simulator's clock.

A step computes some tokens for some sequences: prefill chunks and decodes alike (the engine's
one token-accounting rule). Two models implement ``StepCost``: ``LinearStepCost`` (fitted to a
real engine's steps, see calibration.py) and ``RooflineStepCost`` (from a GPU's data sheet, see
roofline.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol


def attention_pairs(start: int, num_tokens: int) -> int:
    """(query, key) pairs for tokens at positions start .. start + num_tokens − 1, causal."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


class StepCost(Protocol):
    def seconds(
        self, num_tokens: int, num_seqs: int, num_pairs: int, num_context_tokens: int
    ) -> float:
        """A step computing ``num_tokens`` tokens of ``num_seqs`` sequences, with
        ``num_pairs`` (query, key) attention pairs over ``num_context_tokens`` cached tokens."""
        ...


def max_chunk_by_search(
    cost: StepCost,
    start: int,
    num_decodes: int,
    num_decode_pairs: int,
    max_slowdown: float,
    limit: int,
) -> int:
    """The longest prefill chunk from position ``start`` (≤ ``limit``) whose step, with the
    running decodes, takes at most ``max_slowdown`` × the decodes alone (bisection; any
    monotonic cost)."""
    decodes_alone = cost.seconds(num_decodes, num_decodes, num_decode_pairs, num_decode_pairs)
    allowed = max_slowdown * decodes_alone

    def fits(n: int) -> bool:
        tokens, pairs = num_decodes + n, num_decode_pairs + attention_pairs(start, n)
        return cost.seconds(tokens, num_decodes + 1, pairs, num_decode_pairs + start + n) <= allowed

    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class LinearStepCost:
    """seconds = fixed + per_token · tokens + per_pair · attention pairs + per_seq · sequences.

    The embedded engine's own model (titan/engine/cost_model.py) is the same without the
    per-sequence term: fixed costs (weights read once per step, Python), matmuls per token,
    attention per (query, key) pair; sampling and bookkeeping per sequence."""

    fixed_s: float
    per_token_s: float
    per_pair_s: float = 0.0
    per_seq_s: float = 0.0
    # The engine's running ratio of actual to predicted time for mixed steps; its chunk rule
    # divides the allowed time by it.
    mixed_step_bias: float = 1.0

    def seconds(
        self, num_tokens: int, num_seqs: int, num_pairs: int, num_context_tokens: int
    ) -> float:
        return (
            self.fixed_s
            + self.per_token_s * num_tokens
            + self.per_pair_s * num_pairs
            + self.per_seq_s * num_seqs
        )

    def max_prefill_tokens(
        self, start: int, num_decodes: int, num_decode_pairs: int, max_slowdown: float
    ) -> int:
        """The engine's chunk rule (Scheduler._chunk via StepCostModel.max_prefill_tokens),
        solved in closed form: per_token · n + per_pair · (n · start + n(n+1)/2) ≤ budget."""
        decode_time = self.seconds(num_decodes, num_decodes, num_decode_pairs, num_decode_pairs)
        budget = max_slowdown * decode_time / self.mixed_step_bias - decode_time - self.per_seq_s
        if budget <= 0:
            return 0
        quadratic = self.per_pair_s / 2
        linear = self.per_token_s + self.per_pair_s * (start + 0.5)
        if quadratic <= 0:
            return int(budget / linear) if linear > 0 else 1 << 30
        root = (-linear + math.sqrt(linear * linear + 4 * quadratic * budget)) / (2 * quadratic)
        return max(0, int(root))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinearStepCost:
        """Raises ValueError on missing, unknown or negative coefficients."""
        fields = set(cls.__dataclass_fields__)
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"unknown cost model keys: {', '.join(sorted(unknown))}")
        try:
            values = {key: float(value) for key, value in data.items()}
            cost = cls(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid cost model: {exc}") from None
        if min(cost.fixed_s, cost.per_token_s, cost.per_pair_s, cost.per_seq_s) < 0:
            raise ValueError("cost model coefficients must be >= 0")
        return cost
