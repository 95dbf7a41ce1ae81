"""How long a step takes, learned from recent steps: it sizes prefill chunks while decodes run.

A step costs about ``a + b * tokens + c * attention_pairs`` seconds: a fixed part (weights read
once per step, Python), a part per token (the matmuls) and a part per (query, key) pair (the
attention over the cache). The three numbers are fitted by least squares to a window of recent
steps, so they follow the machine, the model and its load. Decode-only steps dominate that window
and a prefill chunk's tokens do not cost quite what decode tokens cost, so mixed steps (decodes
and a chunk) also keep a running ratio of actual to predicted time, which corrects the next
chunk's size: consecutive chunks of one prompt cost alike. Pure Python, no torch.
"""

from __future__ import annotations

import math
from collections import deque

_REFIT_EVERY = 16
_BIAS_WEIGHT = 0.5  # of the newest mixed step in the running actual/predicted ratio


def attention_pairs(start: int, num_tokens: int) -> int:
    """(query, key) pairs computed for tokens at positions start .. start + num_tokens - 1."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


class StepCostModel:
    def __init__(self, window: int = 256, min_samples: int = 24):
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._min_samples = min_samples
        self._since_fit = 0
        self.coefficients: tuple[float, float, float] | None = None
        self.mixed_step_bias = 1.0  # actual / predicted time of recent mixed steps

    def observe(
        self, num_tokens: int, num_pairs: int, seconds: float, is_mixed: bool = False
    ) -> None:
        """Record a step; ``is_mixed``: it ran decodes and a prefill chunk together."""
        predicted = self.predict(num_tokens, num_pairs)
        if is_mixed and predicted:
            ratio = seconds / predicted
            self.mixed_step_bias += _BIAS_WEIGHT * (ratio - self.mixed_step_bias)
        self._samples.append((float(num_tokens), float(num_pairs), seconds))
        self._since_fit += 1
        if len(self._samples) >= self._min_samples and self._since_fit >= _REFIT_EVERY:
            self._fit()

    def predict(self, num_tokens: int, num_pairs: int) -> float | None:
        if self.coefficients is None:
            return None
        fixed, per_token, per_pair = self.coefficients
        return fixed + per_token * num_tokens + per_pair * num_pairs

    def max_prefill_tokens(
        self, start: int, num_decode_tokens: int, num_decode_pairs: int, max_slowdown: float
    ) -> int | None:
        """The longest chunk starting at ``start`` that keeps the step within ``max_slowdown``
        times a step of the decodes alone; None until the model has been fitted."""
        decode_time = self.predict(num_decode_tokens, num_decode_pairs)
        if decode_time is None or self.coefficients is None:
            return None
        _, per_token, per_pair = self.coefficients
        # The mixed step's predicted time, corrected by the recent bias, within the bound.
        budget = max_slowdown * decode_time / self.mixed_step_bias - decode_time
        if budget <= 0:
            return 0
        # per_token * n + per_pair * (n * start + n^2 / 2 + n / 2) <= budget, solved for n.
        quadratic = per_pair / 2
        linear = per_token + per_pair * (start + 0.5)
        if quadratic <= 0:
            return int(budget / linear) if linear > 0 else None
        root = (-linear + math.sqrt(linear * linear + 4 * quadratic * budget)) / (2 * quadratic)
        return max(0, int(root))

    def _fit(self) -> None:
        self._since_fit = 0
        rows = list(self._samples)
        solution = _least_squares([(1.0, t, p) for t, p, _ in rows], [s for _, _, s in rows])
        if solution is None or solution[1] <= 0:
            return
        fixed, per_token, per_pair = solution
        if per_pair < 0:  # collinear window (e.g. only decodes of one length): drop the term
            reduced = _least_squares([(1.0, t) for t, _, _ in rows], [s for _, _, s in rows])
            if reduced is None or reduced[1] <= 0:
                return
            fixed, per_token, per_pair = reduced[0], reduced[1], 0.0
        self.coefficients = (max(fixed, 0.0), per_token, per_pair)


def _least_squares(rows: list[tuple[float, ...]], targets: list[float]) -> list[float] | None:
    """Solve the normal equations (a few columns: Gaussian elimination is plenty)."""
    size = len(rows[0])
    # Scale columns to comparable magnitudes so the elimination stays well conditioned.
    scales = [max(abs(row[j]) for row in rows) or 1.0 for j in range(size)]
    scaled = [[row[j] / scales[j] for j in range(size)] for row in rows]
    matrix = [
        [sum(r[i] * r[j] for r in scaled) for j in range(size)]
        + [sum(r[i] * y for r, y in zip(scaled, targets, strict=True))]
        for i in range(size)
    ]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(matrix[r][col]))
        if abs(matrix[pivot][col]) < 1e-12:
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for r in range(size):
            if r != col:
                factor = matrix[r][col] / matrix[col][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col], strict=True)]
    return [matrix[i][size] / matrix[i][i] / scales[i] for i in range(size)]
